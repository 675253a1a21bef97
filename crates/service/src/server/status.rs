//! Every way a request can fail, and the one place each becomes a gRPC
//! status. Messages say what to do; none contains the secret index or
//! noise (the types that could carry them have no `Display`).

use crate::metrics::Outcome;
use crate::session::SessionError;
use crate::teachers::FanoutError;
use pacpriv_privacy::PrivacyError;
use pacpriv_store::StoreError;
use std::collections::HashMap;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// The stable `google.rpc.ErrorInfo` reasons every error status carries
/// (domain [`DOMAIN`]), with metadata `charged` = `"true"` / `"false"`.
/// Listed in `proto/pacpriv/v1/privatizer.proto` and docs/clients/grpc.md; a client
/// may switch on them. `charged = "true"` only ever means "this query may
/// have been charged": retry the same query (same principal, input and
/// options) to receive its answer without a second charge.
pub mod reason {
    /// The MI budget cannot pay for the answer (RESOURCE_EXHAUSTED).
    pub const BUDGET_EXHAUSTED: &str = "BUDGET_EXHAUSTED";
    /// The principal's query rate is over its limit (RESOURCE_EXHAUSTED).
    pub const RATE_LIMITED: &str = "RATE_LIMITED";
    /// The principal has its cap of calls in flight (RESOURCE_EXHAUSTED).
    pub const TOO_MANY_IN_FLIGHT: &str = "TOO_MANY_IN_FLIGHT";
    /// Keys not known lately are not looked up for this peer for a moment
    /// (RESOURCE_EXHAUSTED).
    pub const KEY_LOOKUPS_LIMITED: &str = "KEY_LOOKUPS_LIMITED";
    /// Malformed input or argument (INVALID_ARGUMENT).
    pub const INVALID_INPUT: &str = "INVALID_INPUT";
    /// Missing or unknown credential (UNAUTHENTICATED).
    pub const UNAUTHENTICATED: &str = "UNAUTHENTICATED";
    /// Something this server is configured not to release (FAILED_PRECONDITION).
    pub const NOT_RELEASED: &str = "NOT_RELEASED";
    /// A model, or principal, this server does not have (NOT_FOUND).
    pub const NOT_FOUND: &str = "NOT_FOUND";
    /// A model version this server has but has unloaded (UNAVAILABLE).
    pub const MODEL_UNLOADED: &str = "MODEL_UNLOADED";
    /// Load or unload asked of the client listener: the admin listener's
    /// (UNIMPLEMENTED; HTTP 403).
    pub const ADMIN_ONLY: &str = "ADMIN_ONLY";
    /// A teacher did not answer in time (UNAVAILABLE).
    pub const TEACHERS_UNAVAILABLE: &str = "TEACHERS_UNAVAILABLE";
    /// A teacher answered with an output that does not fit the configuration (INTERNAL).
    pub const TEACHER_OUTPUT_INVALID: &str = "TEACHER_OUTPUT_INVALID";
    /// The session store could not be read or written (UNAVAILABLE); with
    /// `charged = "true"` the step ran and its answer is withheld until
    /// its record is durable.
    pub const STORE_UNAVAILABLE: &str = "STORE_UNAVAILABLE";
    /// The session's answer cache changed while the query was in flight (UNAVAILABLE, retry).
    pub const CACHE_MOVED: &str = "CACHE_MOVED";
    /// A repeat of a query whose cached answer was evicted (FAILED_PRECONDITION).
    pub const EVICTED_REPEAT: &str = "EVICTED_REPEAT";
    /// A repeat asking for a noisy vector that was not kept (FAILED_PRECONDITION).
    pub const NOISY_NOT_KEPT: &str = "NOISY_NOT_KEPT";
    /// A principal of that name or key exists (ALREADY_EXISTS).
    pub const ALREADY_EXISTS: &str = "ALREADY_EXISTS";
    /// Calibration could not be certified, or another internal failure (INTERNAL).
    pub const INTERNAL: &str = "INTERNAL";
    /// The teachers disagree and privacy.policy = "unanimous_only".
    pub const CONTESTED: &str = "CONTESTED";
    /// A key the admin API does not rotate: a configured or revoked
    /// principal's (FAILED_PRECONDITION).
    pub const NOT_ROTATABLE: &str = "NOT_ROTATABLE";
    /// The stored session under the caller's key belongs to another
    /// dataset's secret (FAILED_PRECONDITION; the operator's to fix).
    pub const OTHER_DATASET: &str = "OTHER_DATASET";
}

/// `google.rpc.ErrorInfo` domain of every pacpriv error.
pub const DOMAIN: &str = "pacpriv";

/// A status with its `ErrorInfo`: `reason`, `charged`, and `extra` metadata.
pub fn with_reason(code: Code, message: String, reason: &str, charged: bool, extra: &[(&str, String)]) -> Status {
    let mut metadata: HashMap<String, String> = extra.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect();
    metadata.insert("charged".to_owned(), charged.to_string());
    Status::with_error_details(code, message, ErrorDetails::with_error_info(reason, DOMAIN, metadata))
}

/// A failed request. Whatever the variant, nothing was released; nothing
/// was charged either, except for [`SessionError::Withheld`] (the status
/// says `charged = "true"`).
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// Malformed input, rejected before any teacher was asked.
    #[error("{0}")]
    InvalidInput(String),
    /// A valid request for something this server is configured not to
    /// release; rejected before any teacher was asked.
    #[error("{0}")]
    NotReleased(String),
    /// A request named a model or dataset this server does not serve;
    /// rejected before any teacher was asked.
    #[error("{0}")]
    NotFound(String),
    /// A request named a model version this server has unloaded (or a
    /// model whose every version it has); rejected before any teacher
    /// was asked.
    #[error("{0}")]
    Unloaded(String),
    /// Authentication or the session refused.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// A teacher did not answer.
    #[error(transparent)]
    Teachers(#[from] FanoutError),
    /// The principal's query rate is over `server.rate_limit_per_second`;
    /// refused before anything else.
    #[error("rate limited: retry in {} ms", retry_after.as_millis())]
    RateLimited {
        /// Until the principal's next token.
        retry_after: std::time::Duration,
        /// The configured rate.
        per_second: u32,
        /// The configured burst.
        burst: u32,
    },
    /// The principal has `max` calls in flight already
    /// ([`super::in_flight`]); refused before anything else.
    #[error("too many calls in flight: at most {max} per principal")]
    TooManyInFlight {
        /// `server.max_calls_in_flight_per_principal`.
        max: usize,
    },
    /// A bug or an unexpected runtime failure.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<ServiceError> for Status {
    fn from(e: ServiceError) -> Status {
        use reason::*;
        let plain = |code, reason, e: &dyn std::fmt::Display| with_reason(code, e.to_string(), reason, false, &[]);
        match e {
            ServiceError::InvalidInput(msg) => with_reason(Code::InvalidArgument, msg, INVALID_INPUT, false, &[]),
            ServiceError::NotReleased(msg) => with_reason(Code::FailedPrecondition, msg, NOT_RELEASED, false, &[]),
            ServiceError::NotFound(msg) => with_reason(Code::NotFound, msg, NOT_FOUND, false, &[]),
            ServiceError::Unloaded(msg) => with_reason(Code::Unavailable, msg, MODEL_UNLOADED, false, &[]),
            ServiceError::Session(SessionError::Unauthenticated) => with_reason(
                Code::Unauthenticated,
                "missing or unknown API key: send the key your operator provisioned as `x-api-key: <key>` \
                 (or `authorization: Bearer <key>`) request metadata"
                    .into(),
                UNAUTHENTICATED,
                false,
                &[],
            ),
            ServiceError::Session(SessionError::LookupsLimited) => with_reason(
                Code::ResourceExhausted,
                "this address has sent many API keys that name no principal of late: \
                 keys not seen here lately are not looked up for a moment. Retry in a second; a key that \
                 worked lately still works. Nothing was charged"
                    .into(),
                KEY_LOOKUPS_LIMITED,
                false,
                &[("retry_after_ms", "1000".into())],
            ),
            ServiceError::Session(SessionError::Exhausted { spent, limit, charge }) => with_reason(
                Code::ResourceExhausted,
                format!(
                    "MI budget exhausted: spent {spent} of {limit} nats and this request's answers cost {charge} \
                     (a batch is answered whole or not at all; nothing was charged); \
                     no API call raises a budget (an operator can raise a configured principal's budget_mi at a restart, or provision a new principal)"
                ),
                BUDGET_EXHAUSTED,
                false,
                &[("spent", spent.to_string()), ("limit", limit.to_string()), ("charge", charge.to_string())],
            ),
            ServiceError::RateLimited { retry_after, per_second, burst } => {
                let ms = retry_after.as_millis().max(1);
                let metadata = HashMap::from([
                    ("retry_after_ms".to_owned(), ms.to_string()),
                    ("per_second".to_owned(), per_second.to_string()),
                    ("burst".to_owned(), burst.to_string()),
                    ("charged".to_owned(), false.to_string()),
                ]);
                let mut details = ErrorDetails::with_error_info(RATE_LIMITED, DOMAIN, metadata);
                details.set_retry_info(Some(retry_after));
                Status::with_error_details(
                    Code::ResourceExhausted,
                    format!(
                        "rate limited: this principal may send {per_second} queries a second (bursts of {burst}); \
                         retry in {ms} ms. Nothing was charged: this is not the MI budget"
                    ),
                    details,
                )
            }
            ServiceError::TooManyInFlight { max } => Status::with_error_details(
                Code::ResourceExhausted,
                format!(
                    "this principal has {max} calls in flight already \
                     (server.max_calls_in_flight_per_principal): wait for one to end, or send fewer at once. \
                     Nothing was charged"
                ),
                ErrorDetails::with_error_info(
                    TOO_MANY_IN_FLIGHT,
                    DOMAIN,
                    HashMap::from([("max".to_owned(), max.to_string()), ("charged".to_owned(), false.to_string())]),
                ),
            ),
            ServiceError::Session(SessionError::Privacy(p)) => privacy_status(p),
            ServiceError::Session(e @ SessionError::Poisoned) => plain(Code::Internal, INTERNAL, &e),
            // The one failure after which a charge may stand without an
            // answer: the step ran, but could not be confirmed durable, so
            // it is withheld. Its record keeps the answer: a retry of the
            // same query receives it once durable, charged nothing more.
            // A store failure tells the client its kind only: the detail
            // (host, database, the backend's message) is in the log.
            ServiceError::Session(SessionError::Withheld(e)) => with_reason(
                Code::Unavailable,
                format!(
                    "the answer could not be confirmed durable and was withheld ({}); it may have been charged — \
                     retry the same query (same input and options) to receive this answer without a second charge",
                    e.public()
                ),
                STORE_UNAVAILABLE,
                true,
                &[],
            ),
            ServiceError::Session(SessionError::Store(e)) => with_reason(
                Code::Unavailable,
                format!(
                    "the session store is unavailable ({}); nothing was answered or charged, the query can be retried",
                    e.public()
                ),
                STORE_UNAVAILABLE,
                false,
                &[],
            ),
            ServiceError::Session(SessionError::Registry(
                e @ (StoreError::PrincipalExists { .. } | StoreError::KeyInUse { .. }),
            )) => plain(Code::AlreadyExists, ALREADY_EXISTS, &e),
            ServiceError::Session(SessionError::Registry(e)) => with_reason(
                Code::Unavailable,
                format!("the principal registry is unavailable ({}); nothing was answered or charged", e.public()),
                STORE_UNAVAILABLE,
                false,
                &[],
            ),
            ServiceError::Session(e @ SessionError::EvictedRepeat) => {
                plain(Code::FailedPrecondition, EVICTED_REPEAT, &e)
            }
            ServiceError::Session(e @ SessionError::NoisyNotKept) => {
                plain(Code::FailedPrecondition, NOISY_NOT_KEPT, &e)
            }
            ServiceError::Session(e @ SessionError::CacheMoved) => plain(Code::Unavailable, CACHE_MOVED, &e),
            ServiceError::Session(e @ SessionError::RowFailed { .. }) => {
                with_reason(Code::Internal, e.to_string(), INTERNAL, true, &[])
            }
            ServiceError::Session(e @ SessionError::UnknownPrincipal(_)) => plain(Code::NotFound, NOT_FOUND, &e),
            ServiceError::Session(e @ SessionError::OtherDataset { .. }) => {
                plain(Code::FailedPrecondition, OTHER_DATASET, &e)
            }
            ServiceError::Session(e @ SessionError::NotRotatable { .. }) => {
                plain(Code::FailedPrecondition, NOT_ROTATABLE, &e)
            }
            ServiceError::Session(e @ SessionError::InvalidPrincipal(_)) => {
                plain(Code::InvalidArgument, INVALID_INPUT, &e)
            }
            ServiceError::Teachers(e) => teacher_status(e),
            ServiceError::Internal(msg) => {
                with_reason(Code::Internal, format!("{msg}; nothing was charged"), INTERNAL, false, &[])
            }
        }
    }
}

/// The metrics outcome of a failed query.
pub fn outcome(e: &ServiceError) -> Outcome {
    match e {
        ServiceError::InvalidInput(_)
        | ServiceError::NotReleased(_)
        | ServiceError::NotFound(_)
        | ServiceError::Unloaded(_) => Outcome::Invalid,
        ServiceError::Session(SessionError::Unauthenticated | SessionError::LookupsLimited) => Outcome::Unauthenticated,
        ServiceError::Session(SessionError::Exhausted { .. }) => Outcome::RefusedBudget,
        ServiceError::RateLimited { .. } | ServiceError::TooManyInFlight { .. } => Outcome::RefusedRate,
        ServiceError::Session(SessionError::EvictedRepeat | SessionError::NoisyNotKept) => Outcome::Invalid,
        ServiceError::Session(SessionError::Privacy(PrivacyError::Domain(_))) => Outcome::Invalid,
        ServiceError::Session(SessionError::Privacy(PrivacyError::Contested)) => Outcome::RefusedContested,
        ServiceError::Teachers(FanoutError::BadOutput { .. }) => Outcome::Internal,
        ServiceError::Teachers(_) => Outcome::TeacherUnavailable,
        _ => Outcome::Internal,
    }
}

/// A fan-out failure as the client sees it: what went wrong, but not
/// which teacher (the log and the per-teacher metrics name it for the
/// operator). Which teacher failed never depends on the secret index, but
/// keeping teacher identities out of every response makes that easy to
/// check (tests/it/hygiene.rs).
fn teacher_status(e: FanoutError) -> Status {
    use reason::{TEACHER_OUTPUT_INVALID, TEACHERS_UNAVAILABLE};
    match e {
        // Not the teacher's own message: what a teacher says is the
        // operator's to read (the log, pacpriv_teacher_errors_total).
        FanoutError::Unreachable { attempts, .. } => with_reason(
            Code::Unavailable,
            format!(
                "a teacher did not answer after {attempts} attempt(s); nothing was charged, the query can be retried"
            ),
            TEACHERS_UNAVAILABLE,
            false,
            &[],
        ),
        // Not transient: a teacher that answers with the wrong shape,
        // datatype or classes does not match this server's [model]
        // configuration, and retrying will not help.
        FanoutError::BadOutput { reason, .. } => with_reason(
            Code::Internal,
            format!(
                "a teacher returned an unusable output ({reason}); nothing was charged; the operator should check \
                 that the teachers match the [model] configuration"
            ),
            TEACHER_OUTPUT_INVALID,
            false,
            &[],
        ),
        e @ FanoutError::Stopped => with_reason(
            Code::Unavailable,
            format!("{e}; nothing was charged, the query can be retried"),
            TEACHERS_UNAVAILABLE,
            false,
            &[],
        ),
        FanoutError::Endpoint { .. } | FanoutError::Connection { .. } => with_reason(
            Code::Unavailable,
            "a teacher endpoint could not be used; nothing was charged, the query can be retried".into(),
            TEACHERS_UNAVAILABLE,
            false,
            &[],
        ),
    }
}

/// The core refused after the teachers answered: their outputs did not fit
/// the configuration, or calibration could not be certified.
fn privacy_status(e: PrivacyError) -> Status {
    use reason::{CONTESTED, INTERNAL, INVALID_INPUT, TEACHER_OUTPUT_INVALID};
    match e {
        PrivacyError::Contested => with_reason(Code::FailedPrecondition, e.to_string(), CONTESTED, false, &[]),
        PrivacyError::Shape(_) | PrivacyError::NonFinite(_) | PrivacyError::TeacherCount { .. } => with_reason(
            Code::Internal,
            format!("teacher outputs do not match the configuration ({e}); nothing was charged"),
            TEACHER_OUTPUT_INVALID,
            false,
            &[],
        ),
        PrivacyError::Domain(_) => with_reason(Code::InvalidArgument, e.to_string(), INVALID_INPUT, false, &[]),
        other => with_reason(Code::Internal, format!("{other}; nothing was released or charged"), INTERNAL, false, &[]),
    }
}

#[cfg(test)]
mod test;
