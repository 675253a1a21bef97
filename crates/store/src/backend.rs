//! The configured store ([`Store`]): the same operations on either
//! backend, chosen once at start-up.

use super::embedded::EmbeddedStore;
use super::error::StoreError;
use super::meta::{Meta, VersionIdentity};
use super::postgres::PgStore;
use super::principal::{Configured, PrincipalRecord};
use super::record::{JournalEntry, Journaled, SessionRecord};

/// The configured store. The backend is chosen once, at start-up; what
/// differs between the two is answered in two places only: `dispatch!`
/// below (the same operation on either) and [`cell`](super::cell) (where a session's
/// state lives).
#[derive(Clone)]
pub enum Store {
    /// One file, one node.
    Embedded(std::sync::Arc<EmbeddedStore>),
    /// PostgreSQL, any number of replicas.
    Postgres(std::sync::Arc<PgStore>),
}

/// Calls the operation of that name on whichever backend `store` is (the
/// embedded store's run on the calling thread: redb reads take
/// microseconds, and its writes here are start-up and admin operations).
macro_rules! dispatch {
    ($store:expr, $op:ident($($arg:expr),*)) => {
        match $store {
            Store::Embedded(e) => e.$op($($arg),*),
            Store::Postgres(p) => p.$op($($arg),*).await,
        }
    };
}

impl Store {
    /// Where the data is, for messages.
    pub fn location(&self) -> String {
        match self {
            Store::Embedded(e) => e.location(),
            Store::Postgres(p) => p.location().to_owned(),
        }
    }

    /// Whether this process is the store's only writer (embedded): then
    /// what it holds in memory is authoritative. With PostgreSQL other
    /// replicas write too, so every read goes to the database.
    pub fn single_writer(&self) -> bool {
        matches!(self, Store::Embedded(_))
    }

    /// `dataset`'s record, if one was written.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn meta(&self, dataset: &str) -> Result<Option<Meta>, StoreError> {
        dispatch!(self, meta(dataset))
    }

    /// Every dataset's record, by dataset name.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn metas(&self) -> Result<Vec<(String, Meta)>, StoreError> {
        dispatch!(self, metas())
    }

    /// Writes `dataset`'s record `meta` durably unless one is already
    /// stored, marked keyed by identities ([`Store::identity_keyed`]) in
    /// the same write; returns the stored one (with several replicas, the
    /// first writer's).
    ///
    /// # Errors
    /// Backend.
    pub async fn init_meta(&self, dataset: &str, meta: &Meta) -> Result<Meta, StoreError> {
        dispatch!(self, init_meta(dataset, meta))
    }

    /// Whether `dataset`'s versions are keyed by their identities: its
    /// record was written by a release with stored identities (which marks
    /// it in the same write), or [`Store::mark_identity_keyed`] has been
    /// called. A dataset an earlier release created is not, until its
    /// first start under this release has claimed its versions.
    ///
    /// # Errors
    /// Backend.
    pub async fn identity_keyed(&self, dataset: &str) -> Result<bool, StoreError> {
        dispatch!(self, identity_keyed(dataset))
    }

    /// Marks `dataset`'s versions keyed by their identities from now on,
    /// durably.
    ///
    /// # Errors
    /// Backend.
    pub async fn mark_identity_keyed(&self, dataset: &str) -> Result<(), StoreError> {
        dispatch!(self, mark_identity_keyed(dataset))
    }

    /// Writes `candidate` durably as the identity of `model` at `version`
    /// in `dataset` unless one is already stored; returns the stored one
    /// (with several replicas, the first writer's).
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn claim_version(
        &self,
        dataset: &str,
        model: &str,
        version: &str,
        candidate: &VersionIdentity,
    ) -> Result<VersionIdentity, StoreError> {
        dispatch!(self, claim_version(dataset, model, version, candidate))
    }

    /// `dataset`'s noise key: `candidate`, written durably, unless one is
    /// already stored; returns the stored one (with several replicas, the
    /// first writer's). Kept as s* is: never logged, never in an error.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn init_noise_key(&self, dataset: &str, candidate: &[u8; 32]) -> Result<[u8; 32], StoreError> {
        dispatch!(self, init_noise_key(dataset, candidate))
    }

    /// A session's latest durable record.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn load(&self, session: &str) -> Result<Option<SessionRecord>, StoreError> {
        dispatch!(self, load(session))
    }

    /// Every provisioned principal, revoked ones included, by name.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn principals(&self) -> Result<Vec<PrincipalRecord>, StoreError> {
        dispatch!(self, principals())
    }

    /// The principal whose key hashes to `key_sha256`, revoked or not.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn principal_by_key(&self, key_sha256: &[u8; 32]) -> Result<Option<PrincipalRecord>, StoreError> {
        dispatch!(self, principal_by_key(key_sha256))
    }

    /// [`Store::principal_by_key`] for a key not seen naming a principal
    /// lately: on PostgreSQL, on connections of its own
    /// (`PgStore::principal_by_unfamiliar_key`).
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn principal_by_unfamiliar_key(
        &self,
        key_sha256: &[u8; 32],
    ) -> Result<Option<PrincipalRecord>, StoreError> {
        match self {
            Store::Embedded(e) => e.principal_by_key(key_sha256),
            Store::Postgres(p) => p.principal_by_unfamiliar_key(key_sha256).await,
        }
    }

    /// The principal called `name`, revoked or not.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn principal(&self, name: &str) -> Result<Option<PrincipalRecord>, StoreError> {
        dispatch!(self, principal(name))
    }

    /// Provisions `record` durably and returns what is stored. An
    /// admin-origin record needs a free name; a config-origin one is
    /// inserted, or replaces the key and budget of the config-origin record
    /// of that name (keeping its creation and revocation).
    ///
    /// # Errors
    /// [`StoreError::PrincipalExists`], [`StoreError::KeyInUse`], backend.
    pub async fn provision(&self, record: &PrincipalRecord) -> Result<PrincipalRecord, StoreError> {
        let mut stored = self.provision_all(std::slice::from_ref(record)).await?;
        stored.pop().ok_or_else(|| StoreError::Backend("provisioning one principal stored none".into()))
    }

    /// Provisions every record of `records` in order, as [`Store::provision`]
    /// would one after the other, but in one transaction (one fsync): the
    /// start-up path for the configured principals. All or nothing: on an
    /// error none of them is stored. Returns what is stored, in order.
    ///
    /// # Errors
    /// As [`Store::provision`], naming the first principal that failed.
    pub async fn provision_all(&self, records: &[PrincipalRecord]) -> Result<Vec<PrincipalRecord>, StoreError> {
        dispatch!(self, provision_all(records))
    }

    /// The configured principals, applied as one transaction: every record
    /// of `records` (all config-origin) provisioned as [`Store::provision_all`]
    /// does, and every active config-origin principal `records` does not
    /// name revoked at `at_unix`. All or nothing: on any error — a
    /// conflict, or the store failing midway — none of it is stored.
    /// Returns what is stored for `records`, in order, and the principals
    /// revoked.
    ///
    /// # Errors
    /// As [`Store::provision_all`].
    pub async fn configure(&self, records: &[PrincipalRecord], at_unix: i64) -> Result<Configured, StoreError> {
        dispatch!(self, configure(records, at_unix))
    }

    /// Marks `name` revoked (durably) unless it already is; returns the
    /// stored record, `None` if there is no such principal.
    ///
    /// # Errors
    /// Backend.
    pub async fn revoke(&self, name: &str, at_unix: i64) -> Result<Option<PrincipalRecord>, StoreError> {
        dispatch!(self, revoke(name, at_unix))
    }

    /// Gives `name` the key hashing to `key_sha256` if it is an active
    /// admin-origin principal (a configured one's key is the
    /// configuration's); returns the stored record, rotated or not, `None`
    /// if there is no such principal.
    ///
    /// # Errors
    /// [`StoreError::KeyInUse`], backend.
    pub async fn rotate_key(&self, name: &str, key_sha256: &[u8; 32]) -> Result<Option<PrincipalRecord>, StoreError> {
        dispatch!(self, rotate_key(name, key_sha256))
    }

    /// Every session key with a record, in order.
    ///
    /// # Errors
    /// Backend.
    pub async fn sessions(&self) -> Result<Vec<String>, StoreError> {
        dispatch!(self, sessions())
    }

    /// A session's record and its journal (entries and events, in chain
    /// order), from one snapshot of the store: what `pacpriv admin export`
    /// writes.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn journal_snapshot(&self, session: &str) -> Result<(Option<SessionRecord>, Vec<Journaled>), StoreError> {
        dispatch!(self, journal_snapshot(session))
    }

    /// A session's journal in version order.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn journal(&self, session: &str) -> Result<Vec<JournalEntry>, StoreError> {
        dispatch!(self, journal(session))
    }
}
