//! Durable session state: what must survive a crash for the privacy
//! guarantee to survive it (`docs/accounting.md` §5: an answer released
//! before its record is durable could be charged to nobody).
//!
//! Holds, per session, the posterior log-weights and the ledger with a
//! version; once per deployment, the sealed secret index and a fingerprint
//! of the teacher set it belongs to; optionally a journal of every step
//! (charge and the log-likelihood vector applied) and, in the same hash
//! chain, every cache hit and refusal (events), so a transcript can be
//! replayed and audited (`docs/accounting.md` §9).
//!
//! # Invariants
//! - A record is handed to the store *before* its answer is released, and
//!   the answer waits until that record — and so every earlier record of
//!   the same session — is durable ([`Ticket::durable`]).
//! - Versions of a session only grow by one per answered query.
//! - The secret index is written once and never changes under an existing
//!   posterior; a start with another teacher set or another index refuses.
//! - The secret index never appears in an error or a log line.

pub mod answers;
pub mod cell;
pub mod embedded;
pub mod pg_tls;
pub mod postgres;
pub mod principal;
pub mod record;

pub use answers::{CacheProbe, CacheRows, CacheWrite};
pub use embedded::EmbeddedStore;
pub use pg_tls::{PgTls, SslMode};
pub use postgres::{PgLink, PgStore};
pub use principal::{Origin, PrincipalRecord};
pub use record::{JournalEntry, JournalEvent, Journaled, SessionRecord};

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
    /// What a client may be told of this failure: its kind, never the
    /// database's host or name, a path, or the backend's own message (the
    /// log has those).
    pub fn public(&self) -> &'static str {
        match self {
            StoreError::Backend(_) => "the database could not be reached or refused the transaction",
            StoreError::Corrupt { .. } => "a stored record could not be read",
            StoreError::TeacherSetChanged { .. } | StoreError::SecretConflict { .. } => {
                "the store does not match this server's configuration"
            }
            StoreError::PrincipalExists { .. } => "that principal name is taken",
            StoreError::KeyInUse { .. } => "that key is taken",
            StoreError::WriterGone => "the store's writer is not running",
            StoreError::Unconfirmed(_) => "the commit could not be confirmed",
        }
    }

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

/// The configured store. The backend is chosen once, at start-up; what
/// differs between the two is answered in two places only: `dispatch!`
/// below (the same operation on either) and [`cell`] (where a session's
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

    /// The deployment record, if one was written.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn meta(&self) -> Result<Option<Meta>, StoreError> {
        dispatch!(self, meta())
    }

    /// Writes `meta` durably unless one is already stored; returns the
    /// stored one (with several replicas, the first writer's).
    ///
    /// # Errors
    /// Backend.
    pub async fn init_meta(&self, meta: &Meta) -> Result<Meta, StoreError> {
        dispatch!(self, init_meta(meta))
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

    /// Marks `name` revoked (durably) unless it already is; returns the
    /// stored record, `None` if there is no such principal.
    ///
    /// # Errors
    /// Backend.
    pub async fn revoke(&self, name: &str, at_unix: i64) -> Result<Option<PrincipalRecord>, StoreError> {
        dispatch!(self, revoke(name, at_unix))
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

/// `session`'s stored record, decoded (both backends; corrupt bytes are
/// reported as such, naming the session).
fn session_record(session: &str, bytes: &[u8]) -> Result<SessionRecord, StoreError> {
    SessionRecord::decode(bytes)
        .ok_or_else(|| StoreError::Corrupt { session: session.into(), reason: "undecodable record".into() })
}

/// One of `session`'s stored journal entries, decoded (both backends).
fn journal_entry(session: &str, bytes: &[u8]) -> Result<JournalEntry, StoreError> {
    JournalEntry::decode(bytes)
        .ok_or_else(|| StoreError::Corrupt { session: session.into(), reason: "undecodable journal entry".into() })
}

/// One of `session`'s stored journal events, decoded (both backends).
fn journal_event(session: &str, bytes: &[u8]) -> Result<JournalEvent, StoreError> {
    JournalEvent::decode_sealed(bytes)
        .ok_or_else(|| StoreError::Corrupt { session: session.into(), reason: "undecodable journal event".into() })
}

/// One of `session`'s stored cached answers, decoded (both backends).
fn cached_answer(session: &str, bytes: &[u8]) -> Result<record::CachedAnswerRecord, StoreError> {
    <record::CachedAnswerRecord as prost::Message>::decode(bytes)
        .map_err(|_| StoreError::Corrupt { session: session.into(), reason: "undecodable cached answer".into() })
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
