//! The embedded store's dataset records: each dataset's secret, teacher
//! set, noise key and identity mark (one [`META`] table, keyed as the
//! releases before datasets wrote the default one's), and every model
//! version's identity ([`VERSIONS`]).

use super::{EmbeddedStore, backend};
use crate::error::StoreError;
use crate::meta::{DEFAULT_DATASET, LegacyKey, Meta, VersionIdentity, session_key};
use redb::{ReadableTable, TableDefinition};

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// The [`META`] keys of `dataset`'s secret and teacher set: `secret` and
/// `teachers` for the default dataset (where releases before datasets
/// wrote them), `DATASET/secret` and `DATASET/teachers` for another.
fn meta_keys(dataset: &str) -> (String, String) {
    (session_key(dataset, "secret"), session_key(dataset, "teachers"))
}

/// The [`META`] key marking `dataset`'s versions keyed by their identities
/// (`identity_keyed` or `DATASET/identity_keyed`).
fn identity_keyed_key(dataset: &str) -> String {
    session_key(dataset, "identity_keyed")
}

/// Each model version's identity by (dataset, model, version): a byte
/// naming its cache key ([`encode_identity`]), then its teachers' digest.
const VERSIONS: TableDefinition<(&str, &str, &str), &[u8]> = TableDefinition::new("model_versions");

/// A [`VERSIONS`] value: 0 keyed by identity, 1 by name and version, 2 by
/// the input alone; then the digest.
fn encode_identity(identity: &VersionIdentity) -> Vec<u8> {
    let flag = match identity.legacy {
        None => 0,
        Some(LegacyKey::NameAndVersion) => 1,
        Some(LegacyKey::InputOnly) => 2,
    };
    let mut value = vec![flag];
    value.extend_from_slice(identity.teachers.as_bytes());
    value
}

/// [`encode_identity`]'s inverse; `key` names the row in errors.
fn decode_identity(key: (&str, &str, &str), bytes: &[u8]) -> Result<VersionIdentity, StoreError> {
    let corrupt = || StoreError::Corrupt {
        session: format!("(model versions: dataset {:?}, model {:?}, version {})", key.0, key.1, key.2),
        reason: "unreadable identity".into(),
    };
    let (&flag, teachers) = bytes.split_first().ok_or_else(corrupt)?;
    let legacy = match flag {
        0 => None,
        1 => Some(LegacyKey::NameAndVersion),
        2 => Some(LegacyKey::InputOnly),
        _ => return Err(corrupt()),
    };
    let teachers = String::from_utf8(teachers.to_vec()).map_err(|_| corrupt())?;
    Ok(VersionIdentity { teachers, legacy })
}

impl EmbeddedStore {
    /// `dataset`'s record, if one was written.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub fn meta(&self, dataset: &str) -> Result<Option<Meta>, StoreError> {
        let Some(table) = self.read_table(META)? else { return Ok(None) };
        let (secret, teachers) = meta_keys(dataset);
        let secret = table.get(secret.as_str()).map_err(backend)?.map(|v| v.value().to_vec());
        let teachers = table.get(teachers.as_str()).map_err(backend)?.map(|v| v.value().to_vec());
        match (secret, teachers) {
            (Some(s), Some(t)) => {
                let corrupt = || StoreError::Corrupt { session: "(meta)".into(), reason: "unreadable".into() };
                let secret = <[u8; 8]>::try_from(s.as_slice()).map(u64::from_le_bytes).map_err(|_| corrupt())?;
                Ok(Some(Meta {
                    secret: usize::try_from(secret).map_err(|_| corrupt())?,
                    teachers: String::from_utf8(t).map_err(|_| corrupt())?,
                }))
            }
            _ => Ok(None),
        }
    }

    /// Every dataset's record, by dataset name.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub fn metas(&self) -> Result<Vec<(String, Meta)>, StoreError> {
        let Some(table) = self.read_table(META)? else { return Ok(Vec::new()) };
        let mut names = Vec::new();
        for entry in table.iter().map_err(backend)? {
            let (key, _) = entry.map_err(backend)?;
            let key = key.value();
            if key == "secret" {
                names.push(DEFAULT_DATASET.to_owned());
            } else if let Some(dataset) = key.strip_suffix("/secret") {
                names.push(dataset.to_owned());
            }
        }
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            if let Some(meta) = self.meta(&name)? {
                out.push((name, meta));
            }
        }
        Ok(out)
    }

    /// Writes `dataset`'s record durably unless one exists, marked keyed by
    /// identities in the same transaction; returns the stored record.
    ///
    /// # Errors
    /// Backend.
    pub fn init_meta(&self, dataset: &str, meta: &Meta) -> Result<Meta, StoreError> {
        if let Some(existing) = self.meta(dataset)? {
            return Ok(existing);
        }
        let (secret, teachers) = meta_keys(dataset);
        let txn = self.db.begin_write()?;
        {
            let mut table = txn.open_table(META).map_err(backend)?;
            table.insert(secret.as_str(), (meta.secret as u64).to_le_bytes().as_slice()).map_err(backend)?;
            table.insert(teachers.as_str(), meta.teachers.as_bytes()).map_err(backend)?;
            table.insert(identity_keyed_key(dataset).as_str(), [1u8].as_slice()).map_err(backend)?;
        }
        txn.commit().map_err(backend)?;
        Ok(meta.clone())
    }

    /// Whether `dataset`'s versions are keyed by their identities.
    ///
    /// # Errors
    /// Backend.
    pub fn identity_keyed(&self, dataset: &str) -> Result<bool, StoreError> {
        let Some(table) = self.read_table(META)? else { return Ok(false) };
        Ok(table.get(identity_keyed_key(dataset).as_str()).map_err(backend)?.is_some())
    }

    /// Marks `dataset`'s versions keyed by their identities, durably.
    ///
    /// # Errors
    /// Backend.
    pub fn mark_identity_keyed(&self, dataset: &str) -> Result<(), StoreError> {
        let txn = self.db.begin_write()?;
        {
            let mut table = txn.open_table(META).map_err(backend)?;
            table.insert(identity_keyed_key(dataset).as_str(), [1u8].as_slice()).map_err(backend)?;
        }
        txn.commit().map_err(backend)
    }

    /// `candidate` as `model` at `version`'s identity in `dataset`, written
    /// durably unless one is stored; returns the stored one.
    ///
    /// # Errors
    /// Backend, or a stored identity that does not decode.
    pub fn claim_version(
        &self,
        dataset: &str,
        model: &str,
        version: &str,
        candidate: &VersionIdentity,
    ) -> Result<VersionIdentity, StoreError> {
        let key = (dataset, model, version);
        let txn = self.db.begin_write()?;
        {
            let mut table = txn.open_table(VERSIONS).map_err(backend)?;
            if let Some(stored) = table.get(key).map_err(backend)?.map(|v| v.value().to_vec()) {
                // Written before: the transaction ends unwritten.
                return decode_identity(key, &stored);
            }
            table.insert(key, encode_identity(candidate).as_slice()).map_err(backend)?;
        }
        txn.commit().map_err(backend)?;
        Ok(candidate.clone())
    }

    /// `dataset`'s noise key (the [`META`] key `noise_key`, or
    /// `DATASET/noise_key`): `candidate`, written durably, unless one is
    /// stored.
    ///
    /// # Errors
    /// Backend, or a stored key that is not 32 bytes.
    pub fn init_noise_key(&self, dataset: &str, candidate: &[u8; 32]) -> Result<[u8; 32], StoreError> {
        let name = session_key(dataset, "noise_key");
        let stored = |bytes: &[u8]| {
            <[u8; 32]>::try_from(bytes)
                .map_err(|_| StoreError::Corrupt { session: "(meta)".into(), reason: "noise key unreadable".into() })
        };
        if let Some(table) = self.read_table(META)?
            && let Some(v) = table.get(name.as_str()).map_err(backend)?
        {
            return stored(v.value());
        }
        let txn = self.db.begin_write()?;
        {
            let mut table = txn.open_table(META).map_err(backend)?;
            table.insert(name.as_str(), candidate.as_slice()).map_err(backend)?;
        }
        txn.commit().map_err(backend)?;
        Ok(*candidate)
    }
}
