//! The embedded store's principals: provisioned, configured, rotated and
//! revoked in single transactions, every key held by one principal.

use super::{EmbeddedStore, backend};
use crate::error::StoreError;
use crate::principal::{Configured, Origin, PrincipalRecord};
use crate::record::encode_principal;
use redb::{ReadableTable, TableDefinition};
use std::collections::HashMap;

const PRINCIPALS: TableDefinition<&str, &[u8]> = TableDefinition::new("principals");

impl EmbeddedStore {
    /// Every principal, by name.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub fn principals(&self) -> Result<Vec<PrincipalRecord>, StoreError> {
        let Some(table) = self.read_table(PRINCIPALS)? else { return Ok(Vec::new()) };
        table
            .iter()
            .map_err(backend)?
            .map(|item| {
                let (k, v) = item.map_err(backend)?;
                decode_principal(k.value(), v.value())
            })
            .collect()
    }

    /// The principal called `name`.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub fn principal(&self, name: &str) -> Result<Option<PrincipalRecord>, StoreError> {
        let Some(table) = self.read_table(PRINCIPALS)? else { return Ok(None) };
        let value = table.get(name).map_err(backend)?;
        value.map(|v| decode_principal(name, v.value())).transpose()
    }

    /// The principal whose key hashes to `key_sha256` (a scan: the
    /// service looks keys up in its in-memory registry, not here).
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub fn principal_by_key(&self, key_sha256: &[u8; 32]) -> Result<Option<PrincipalRecord>, StoreError> {
        Ok(self.principals()?.into_iter().find(|p| &p.key_sha256 == key_sha256))
    }

    /// See [`super::Store::provision_all`]: every record in one write
    /// transaction (one fsync), keys checked against a digest map built
    /// once, so n principals cost O(n) rather than a table scan each.
    ///
    /// # Errors
    /// As [`super::Store::provision_all`].
    pub fn provision_all(&self, records: &[PrincipalRecord]) -> Result<Vec<PrincipalRecord>, StoreError> {
        Ok(self.provisioned(records, None)?.stored)
    }

    /// See [`super::Store::configure`]: [`EmbeddedStore::provision_all`]'s
    /// transaction, with the revocations in it.
    ///
    /// # Errors
    /// As [`super::Store::configure`].
    pub fn configure(&self, records: &[PrincipalRecord], at_unix: i64) -> Result<Configured, StoreError> {
        self.provisioned(records, Some(at_unix))
    }

    /// `records` provisioned in one write transaction and, with
    /// `revoke_unlisted_at`, every active config-origin principal they do
    /// not name revoked then. An error drops the transaction uncommitted:
    /// all or nothing.
    fn provisioned(
        &self,
        records: &[PrincipalRecord],
        revoke_unlisted_at: Option<i64>,
    ) -> Result<Configured, StoreError> {
        let txn = self.db.begin_write()?;
        let configured = {
            let mut table = txn.open_table(PRINCIPALS).map_err(backend)?;
            let mut keys = Keys::of(&table)?;
            let stored =
                records.iter().map(|r| provision_in(&mut table, &mut keys, r)).collect::<Result<Vec<_>, _>>()?;
            let mut revoked = Vec::new();
            if let Some(at_unix) = revoke_unlisted_at {
                let listed: std::collections::HashSet<&str> = records.iter().map(|r| r.name.as_str()).collect();
                for item in table.iter().map_err(backend)? {
                    let (name, bytes) = item.map_err(backend)?;
                    let record = decode_principal(name.value(), bytes.value())?;
                    if record.origin == Origin::Config && record.active() && !listed.contains(record.name.as_str()) {
                        revoked.push(PrincipalRecord { revoked_unix: Some(at_unix), ..record });
                    }
                }
                for record in &revoked {
                    table.insert(record.name.as_str(), encode_principal(record).as_slice()).map_err(backend)?;
                }
            }
            Configured { stored, revoked }
        };
        txn.commit().map_err(backend)?;
        Ok(configured)
    }

    /// See [`super::Store::rotate_key`].
    ///
    /// # Errors
    /// As [`super::Store::rotate_key`].
    pub fn rotate_key(&self, name: &str, key_sha256: &[u8; 32]) -> Result<Option<PrincipalRecord>, StoreError> {
        self.update_principal(name, |record, table| {
            if record.origin != Origin::Admin || !record.active() {
                return Ok(false);
            }
            if Keys::of(table)?.0.get(key_sha256).is_some_and(|holder| holder != name) {
                return Err(StoreError::KeyInUse { name: name.to_owned() });
            }
            record.key_sha256 = *key_sha256;
            Ok(true)
        })
    }

    /// See [`super::Store::revoke`].
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub fn revoke(&self, name: &str, at_unix: i64) -> Result<Option<PrincipalRecord>, StoreError> {
        self.update_principal(name, |record, _| {
            let revoking = record.active();
            record.revoked_unix = record.revoked_unix.or(Some(at_unix));
            Ok(revoking)
        })
    }

    /// `change` applied to the stored record of `name` in one write
    /// transaction, which writes it back when `change` says so; the record
    /// as stored afterwards, `None` if there is no such principal.
    fn update_principal(
        &self,
        name: &str,
        change: impl FnOnce(&mut PrincipalRecord, &redb::Table<'_, &str, &[u8]>) -> Result<bool, StoreError>,
    ) -> Result<Option<PrincipalRecord>, StoreError> {
        let txn = self.db.begin_write()?;
        let stored = {
            let mut table = txn.open_table(PRINCIPALS).map_err(backend)?;
            let existing = table.get(name).map_err(backend)?.map(|v| v.value().to_vec());
            let Some(bytes) = existing else { return Ok(None) };
            let mut record = decode_principal(name, &bytes)?;
            if change(&mut record, &table)? {
                table.insert(name, encode_principal(&record).as_slice()).map_err(backend)?;
            }
            record
        };
        txn.commit().map_err(backend)?;
        Ok(Some(stored))
    }

    /// Holds the file's write lock until the transaction is dropped: the
    /// writer's next commit waits for it (a stalled disk, for the
    /// service's tests; public because they are another crate's).
    ///
    /// # Errors
    /// The transaction cannot begin.
    #[doc(hidden)]
    pub fn stall(&self) -> Result<redb::WriteTransaction, StoreError> {
        self.db.begin_write()
    }
}

/// Every stored principal's name by key digest (revoked ones too: a key
/// is never handed to a second principal), kept in step with the table
/// while a provisioning transaction writes to it.
struct Keys(HashMap<[u8; 32], String>);

impl Keys {
    fn of(table: &redb::Table<'_, &str, &[u8]>) -> Result<Self, StoreError> {
        let mut keys = HashMap::new();
        for item in table.iter().map_err(backend)? {
            let (k, v) = item.map_err(backend)?;
            let p = decode_principal(k.value(), v.value())?;
            keys.insert(p.key_sha256, p.name);
        }
        Ok(Keys(keys))
    }
}

/// Provisions one record inside an open write transaction (the semantics
/// of [`super::Store::provision`]), updating `keys` to match.
fn provision_in(
    table: &mut redb::Table<'_, &str, &[u8]>,
    keys: &mut Keys,
    record: &PrincipalRecord,
) -> Result<PrincipalRecord, StoreError> {
    let existing = table.get(record.name.as_str()).map_err(backend)?.map(|v| v.value().to_vec());
    let (stored, old_key) = match existing {
        None => (record.clone(), None),
        Some(bytes) => {
            let old = decode_principal(&record.name, &bytes)?;
            if old.origin == Origin::Admin || record.origin == Origin::Admin {
                return Err(StoreError::PrincipalExists { name: record.name.clone(), origin: old.origin.as_str() });
            }
            let old_key = old.key_sha256;
            (
                PrincipalRecord {
                    key_sha256: record.key_sha256,
                    budget: record.budget,
                    dataset_budgets: record.dataset_budgets.clone(),
                    ..old
                },
                Some(old_key),
            )
        }
    };
    if keys.0.get(&stored.key_sha256).is_some_and(|holder| *holder != stored.name) {
        return Err(StoreError::KeyInUse { name: stored.name });
    }
    table.insert(stored.name.as_str(), encode_principal(&stored).as_slice()).map_err(backend)?;
    if let Some(old_key) = old_key.filter(|k| *k != stored.key_sha256)
        && keys.0.get(&old_key).is_some_and(|holder| *holder == stored.name)
    {
        keys.0.remove(&old_key);
    }
    keys.0.insert(stored.key_sha256, stored.name.clone());
    Ok(stored)
}

fn decode_principal(name: &str, bytes: &[u8]) -> Result<PrincipalRecord, StoreError> {
    crate::record::decode_principal(name, bytes)
        .ok_or_else(|| StoreError::Corrupt { session: format!("(principal {name})"), reason: "undecodable".into() })
}
