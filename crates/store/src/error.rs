//! What can go wrong persisting or loading state ([`StoreError`]), and
//! whether a failed write may still have landed.

/// What can go wrong persisting or loading state. None of these carries
/// the secret index.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database reported an error (I/O, corruption, lock).
    #[error("store: {0}")]
    Backend(String),
    /// No database node accepted the connection or the statement just now
    /// — refused, timed out, starting or shutting down, read-only (a
    /// standby) — as during a failover: a retry later may succeed, unlike
    /// [`StoreError::Backend`]'s authentication, permission or SQL errors.
    #[error("store unreachable: {0}")]
    Unreachable(String),
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
    /// The embedded store's last commit failed: no step is taken (nothing
    /// drawn or charged) until a commit succeeds.
    #[error("the store's last commit failed; no step is taken until one succeeds (this one was not)")]
    CommitsFailing,
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
            StoreError::Unreachable(_) => "no database node accepted the connection or the write",
            StoreError::Corrupt { .. } => "a stored record could not be read",
            StoreError::TeacherSetChanged { .. } | StoreError::SecretConflict { .. } => {
                "the store does not match this server's configuration"
            }
            StoreError::PrincipalExists { .. } => "that principal name is taken",
            StoreError::KeyInUse { .. } => "that key is taken",
            StoreError::WriterGone => "the store's writer is not running",
            StoreError::CommitsFailing => "the store's last commit failed",
            StoreError::Unconfirmed(_) => "the commit could not be confirmed",
        }
    }

    /// This error, its message prefixed by `what` (where it happened) when
    /// it carries the database's own message; the kind is kept.
    pub(super) fn within(self, what: impl std::fmt::Display) -> Self {
        match self {
            StoreError::Backend(m) => StoreError::Backend(format!("{what}: {m}")),
            StoreError::Unreachable(m) => StoreError::Unreachable(format!("{what}: {m}")),
            e => e,
        }
    }

    /// Whether a step whose write failed this way may have been charged:
    /// its record reached the store (or the in-memory session) and may be,
    /// or become after a restart, durable.
    pub fn may_have_charged(&self) -> bool {
        matches!(self, StoreError::WriterGone | StoreError::Unconfirmed(_))
    }
}

/// A [`StoreError::Backend`] carrying the database's own message (both
/// backends).
pub(super) fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}
