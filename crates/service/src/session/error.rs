//! Why a session did not answer: [`SessionError`], one variant per cause,
//! each saying whether the query was charged (the server maps them to a
//! status in one place, `server::status`).

use pacpriv_privacy::PrivacyError;
use pacpriv_store::StoreError;

/// Why a session refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// No key, or one that names no principal.
    #[error("unknown or missing API key")]
    Unauthenticated,
    /// A key not seen naming a principal lately, from a peer (or from all
    /// peers together) past its lookups of such keys: not looked up now.
    #[error("too many unknown keys from this address: new keys are not looked up for a moment")]
    LookupsLimited,
    /// The budget cannot pay for this request's answers (all of them:
    /// none was given).
    #[error("MI budget exhausted: spent {spent} of {limit} nats; this request's answers cost {charge} nats")]
    Exhausted {
        /// MI spent.
        spent: f64,
        /// The limit.
        limit: f64,
        /// What the request's answers cost together.
        charge: f64,
    },
    /// The privacy core refused (shapes, calibration); nothing released.
    #[error(transparent)]
    Privacy(PrivacyError),
    /// An earlier panic left the session lock poisoned; the session refuses
    /// to answer rather than risk a half-applied step.
    #[error("session state unavailable after an internal failure; refusing to answer")]
    Poisoned,
    /// The step ran but could not be confirmed durable, so its answer is
    /// withheld. Its charge may stand (it may be on disk, and later steps
    /// build on it); its answer is kept with the session's cached answers,
    /// so a retry of the same query receives it, once durable, without a
    /// second charge.
    #[error(
        "the answer could not be confirmed durable and was withheld; it may have been charged — retry the same \
         query (same input and options) to receive this answer without a second charge ({0})"
    )]
    Withheld(StoreError),
    /// The session store could not be read, or the step's transaction
    /// failed before it committed: nothing was answered or charged.
    #[error("the session store is unavailable ({0}); nothing was answered or charged, the query can be retried")]
    Store(StoreError),
    /// The principal registry could not be read or written (nothing was
    /// answered or charged).
    #[error("principal registry: {0}")]
    Registry(StoreError),
    /// A repeat of a query whose cached answer was evicted, under
    /// `on_evicted = refuse`: answering it would release fresh noise for a
    /// query already answered. Nothing changed.
    #[error(
        "this session answered this exact query before and its cached answer has since been evicted \
         (privacy.answer_cache_entries); answering it again would release fresh noise, so it is refused — nothing \
         was charged"
    )]
    EvictedRepeat,
    /// A repeat asking for the noisy vector of a query first answered
    /// without it: the vector was not kept, and a fresh one would be a new
    /// release. Nothing changed.
    #[error(
        "this session answered this exact query before without return_noisy, and its noisy vector was not kept; \
         repeat it without return_noisy to get the same answer (nothing was charged)"
    )]
    NoisyNotKept,
    /// The query's cached answer disappeared between the check before the
    /// fan-out and the step (evicted meanwhile, or another replica's step).
    /// Nothing changed; a retry is answered correctly.
    #[error("the session's answer cache changed while this query was in flight; nothing was charged, retry it")]
    CacheMoved,
    /// A row of a multi-row request failed after earlier rows had drawn
    /// their noise: no answer is released, the rows that drew stay charged
    /// with their answers kept (a retry receives them free), and the
    /// cause is not shown (it was computed on a posterior those draws had
    /// moved; the log names its kind).
    #[error(
        "row {row} of this request could not be answered, so no answer was released; the {drew} row(s) before it \
         that drew noise were charged, their answers kept in the session's answer cache where it has room — retry \
         the same query (same rows and options) to receive those without a second charge"
    )]
    RowFailed {
        /// The row, from 0.
        row: usize,
        /// How many earlier rows drew (and were charged).
        drew: u64,
    },
    /// No principal of that name.
    #[error("no principal named {0:?}")]
    UnknownPrincipal(String),
    /// The stored session under this key belongs to another dataset's
    /// secret (written under a name an earlier release let cross datasets).
    #[error(
        "session {session:?} in the store belongs to another dataset's secret (its record commits to another \
         dataset's noise key), so it is not resumed here; nothing was answered or charged. An earlier release let a \
         principal named DATASET/NAME share its key: the operator must rename that principal or this dataset"
    )]
    OtherDataset {
        /// The session's store key.
        session: String,
    },
    /// A principal could not be provisioned as asked.
    #[error("{0}")]
    InvalidPrincipal(String),
    /// A principal whose key the admin API does not rotate: configured
    /// (its key is the configuration's) or revoked (for good).
    #[error("principal {name:?} is {why}: its key is not the admin API's to rotate")]
    NotRotatable {
        /// The principal.
        name: String,
        /// "configured" or "revoked".
        why: &'static str,
    },
}

impl From<StoreError> for SessionError {
    /// [`SessionError::Withheld`] for a write that may have landed, else
    /// [`SessionError::Store`]: the classification errs toward "charged".
    fn from(e: StoreError) -> Self {
        if e.may_have_charged() { SessionError::Withheld(e) } else { SessionError::Store(e) }
    }
}

impl From<PrivacyError> for SessionError {
    fn from(e: PrivacyError) -> Self {
        match e {
            PrivacyError::BudgetExhausted { spent, budget, charge } => {
                SessionError::Exhausted { spent: spent.get(), limit: budget.get(), charge: charge.get() }
            }
            other => SessionError::Privacy(other),
        }
    }
}

impl SessionError {
    /// The variant's name, for logs that must not carry its details.
    pub fn kind(&self) -> &'static str {
        match self {
            SessionError::Privacy(_) => "privacy",
            SessionError::Store(_) | SessionError::Withheld(_) | SessionError::Registry(_) => "store",
            _ => "session",
        }
    }
}
