//! Durable session state: what must survive a crash for the privacy
//! guarantee to survive it (DESIGN §2 "Durability = privacy").
//!
//! Holds, per session, the posterior log-weights and the ledger with a
//! version; once per deployment, the sealed secret index and a fingerprint
//! of the teacher set it belongs to; optionally a journal of every step
//! (charge and the log-likelihood vector applied), so a transcript can be
//! replayed and audited.
//!
//! # Invariants
//! - A record is handed to the store *before* its answer is released, and
//!   the answer waits until that record — and so every earlier record of
//!   the same session — is durable ([`Ticket::durable`]).
//! - Versions of a session only grow by one per answered query.
//! - The secret index is written once and never changes under an existing
//!   posterior; a start with another teacher set or another index refuses.
//! - The secret index never appears in an error or a log line.

pub mod embedded;
pub mod postgres;
pub mod principal;
pub mod record;

pub use embedded::EmbeddedStore;
pub use postgres::PgStore;
pub use principal::{Origin, PrincipalRecord};
pub use record::{JournalEntry, SessionRecord};

/// What can go wrong persisting or loading state. None of these carries
/// the secret index.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database reported an error (I/O, corruption, lock).
    #[error("store: {0}")]
    Backend(String),
    /// A stored record could not be decoded.
    #[error("store record for session {session:?} is corrupt: {reason}")]
    Corrupt {
        /// Session key.
        session: String,
        /// What was wrong.
        reason: String,
    },
    /// The deployment's stored teacher set differs from the configured one.
    #[error(
        "the store at {path} belongs to a different teacher set ({stored}); this configuration has {configured}. \
         Sessions there were charged against those teachers: point store.path at a new file for a new teacher set"
    )]
    TeacherSetChanged {
        /// Store location.
        path: String,
        /// Stored fingerprint.
        stored: String,
        /// Configured fingerprint.
        configured: String,
    },
    /// The operator-provided secret index differs from the stored one.
    #[error(
        "the secret index provided in privacy.secret_index_file differs from the one stored at {path}; \
         changing it under existing sessions would break their guarantee"
    )]
    SecretConflict {
        /// Store location.
        path: String,
    },
    /// A principal of that name already exists (names are never reused).
    #[error("a principal named {name:?} already exists ({origin}); names are never reused")]
    PrincipalExists {
        /// The name.
        name: String,
        /// Who provisioned the existing one.
        origin: &'static str,
    },
    /// Another principal already has this key.
    #[error("principal {name:?}: another principal already has this key; every principal needs its own")]
    KeyInUse {
        /// The principal being provisioned.
        name: String,
    },
    /// The writer has stopped (after a failed commit or at shutdown).
    #[error("store writer is not running; answers are withheld")]
    WriterGone,
    /// A step's record was handed to the store but its commit could not be
    /// confirmed (the commit failed, or the connection broke during it): it
    /// may or may not be durable.
    #[error("the commit of this step could not be confirmed ({0})")]
    Unconfirmed(String),
}

impl StoreError {
    /// Whether a step whose write failed this way may have been charged:
    /// its record reached the store (or the in-memory session) and may be,
    /// or become after a restart, durable.
    pub fn may_have_charged(&self) -> bool {
        matches!(self, StoreError::WriterGone | StoreError::Unconfirmed(_))
    }
}

/// The deployment-wide record.
#[derive(Clone, PartialEq, Eq)]
pub struct Meta {
    /// s*, sealed: only [`crate::session`] turns it into a `SecretIndex`.
    pub secret: usize,
    /// Describes the teacher set s* indexes into (m and model names).
    pub teachers: String,
}

impl std::fmt::Debug for Meta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meta").field("secret", &"<redacted>").field("teachers", &self.teachers).finish()
    }
}

/// The configured store.
#[derive(Clone)]
pub enum Store {
    /// One file, one node.
    Embedded(std::sync::Arc<EmbeddedStore>),
    /// PostgreSQL, any number of replicas.
    Postgres(std::sync::Arc<PgStore>),
}

impl Store {
    /// Where the data is, for messages.
    pub fn location(&self) -> String {
        match self {
            // Absolute, so a log line says which file a relative store.path meant.
            Store::Embedded(e) => {
                std::path::absolute(e.path()).unwrap_or_else(|_| e.path().to_owned()).display().to_string()
            }
            Store::Postgres(p) => p.location().to_owned(),
        }
    }

    /// The deployment record, if one was written.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn meta(&self) -> Result<Option<Meta>, StoreError> {
        match self {
            Store::Embedded(e) => e.meta(),
            Store::Postgres(p) => p.meta().await,
        }
    }

    /// Writes `meta` durably unless one is already stored; returns the
    /// stored one (with several replicas, the first writer's).
    ///
    /// # Errors
    /// Backend.
    pub async fn init_meta(&self, meta: &Meta) -> Result<Meta, StoreError> {
        match self {
            Store::Embedded(e) => e.init_meta(meta),
            Store::Postgres(p) => p.init_meta(meta).await,
        }
    }

    /// A session's latest durable record.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn load(&self, session: &str) -> Result<Option<SessionRecord>, StoreError> {
        match self {
            Store::Embedded(e) => e.load(session),
            Store::Postgres(p) => p.load(session).await,
        }
    }

    /// Every provisioned principal, revoked ones included, by name.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn principals(&self) -> Result<Vec<PrincipalRecord>, StoreError> {
        match self {
            Store::Embedded(e) => e.principals(),
            Store::Postgres(p) => p.principals().await,
        }
    }

    /// The principal whose key hashes to `key_sha256`, revoked or not.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn principal_by_key(&self, key_sha256: &[u8; 32]) -> Result<Option<PrincipalRecord>, StoreError> {
        match self {
            Store::Embedded(e) => Ok(e.principals()?.into_iter().find(|p| &p.key_sha256 == key_sha256)),
            Store::Postgres(p) => p.principal_by_key(key_sha256).await,
        }
    }

    /// The principal called `name`, revoked or not.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn principal(&self, name: &str) -> Result<Option<PrincipalRecord>, StoreError> {
        match self {
            Store::Embedded(e) => e.principal(name),
            Store::Postgres(p) => p.principal(name).await,
        }
    }

    /// Provisions `record` durably and returns what is stored. An
    /// admin-origin record needs a free name; a config-origin one is
    /// inserted, or replaces the key and budget of the config-origin record
    /// of that name (keeping its creation and revocation).
    ///
    /// # Errors
    /// [`StoreError::PrincipalExists`], [`StoreError::KeyInUse`], backend.
    pub async fn provision(&self, record: &PrincipalRecord) -> Result<PrincipalRecord, StoreError> {
        match self {
            Store::Embedded(e) => e.provision(record),
            Store::Postgres(p) => p.provision(record).await,
        }
    }

    /// Provisions every record of `records` in order, as [`Store::provision`]
    /// would one after the other, but in one transaction (one fsync): the
    /// start-up path for the configured principals. All or nothing: on an
    /// error none of them is stored. Returns what is stored, in order.
    ///
    /// # Errors
    /// As [`Store::provision`], naming the first principal that failed.
    pub async fn provision_all(&self, records: &[PrincipalRecord]) -> Result<Vec<PrincipalRecord>, StoreError> {
        match self {
            Store::Embedded(e) => e.provision_all(records),
            Store::Postgres(p) => p.provision_all(records).await,
        }
    }

    /// Marks `name` revoked (durably) unless it already is; returns the
    /// stored record, `None` if there is no such principal.
    ///
    /// # Errors
    /// Backend.
    pub async fn revoke(&self, name: &str, at_unix: i64) -> Result<Option<PrincipalRecord>, StoreError> {
        match self {
            Store::Embedded(e) => e.revoke(name, at_unix),
            Store::Postgres(p) => p.revoke(name, at_unix).await,
        }
    }

    /// A session's journal in version order.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn journal(&self, session: &str) -> Result<Vec<JournalEntry>, StoreError> {
        match self {
            Store::Embedded(e) => e.journal(session),
            Store::Postgres(p) => p.journal(session).await,
        }
    }
}

/// Waits for one record to become durable.
pub struct Ticket(tokio::sync::oneshot::Receiver<Result<(), String>>);

impl Ticket {
    /// Resolves once the record and every earlier record are durable.
    ///
    /// # Errors
    /// The commit failed or the writer stopped: the answer must not be
    /// released (its charge may or may not be on disk; it stays charged in
    /// memory either way).
    pub async fn durable(self) -> Result<(), StoreError> {
        Self::outcome(self.0.await)
    }

    /// As [`Ticket::durable`], blocking the thread (the store's own tests).
    ///
    /// # Errors
    /// As [`Ticket::durable`].
    #[cfg(test)]
    pub fn wait(self) -> Result<(), StoreError> {
        Self::outcome(self.0.blocking_recv())
    }

    fn outcome(received: Result<Result<(), String>, tokio::sync::oneshot::error::RecvError>) -> Result<(), StoreError> {
        match received {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(StoreError::Unconfirmed(e)),
            Err(_) => Err(StoreError::WriterGone),
        }
    }
}

#[cfg(test)]
mod test;
