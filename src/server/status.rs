//! Every way a request can fail, and the one place each becomes a gRPC
//! status. Messages say what to do; none contains the secret index or
//! noise (the types that could carry them have no `Display`).

use crate::metrics::Outcome;
use crate::privacy::PrivacyError;
use crate::session::SessionError;
use crate::store::StoreError;
use crate::teachers::FanoutError;
use std::collections::HashMap;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// `google.rpc.ErrorInfo` reason of a RESOURCE_EXHAUSTED refusal: the MI
/// budget cannot pay for the answer.
pub const BUDGET_EXHAUSTED: &str = "BUDGET_EXHAUSTED";
/// `google.rpc.ErrorInfo` reason of a RESOURCE_EXHAUSTED refusal: the
/// principal's query rate is over its limit (retry later).
pub const RATE_LIMITED: &str = "RATE_LIMITED";

/// A failed request. Whatever the variant, nothing was released and
/// nothing was charged.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// Malformed input, rejected before any teacher was asked.
    #[error("{0}")]
    InvalidInput(String),
    /// A valid request for something this server is configured not to
    /// release; rejected before any teacher was asked.
    #[error("{0}")]
    NotReleased(String),
    /// An Open Inference Protocol request named a model this server does
    /// not serve; rejected before any teacher was asked.
    #[error("{0}")]
    UnknownModel(String),
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
    /// A bug or an unexpected runtime failure.
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<ServiceError> for Status {
    fn from(e: ServiceError) -> Status {
        match e {
            ServiceError::InvalidInput(msg) => Status::invalid_argument(msg),
            ServiceError::NotReleased(msg) => Status::failed_precondition(msg),
            ServiceError::UnknownModel(msg) => Status::not_found(msg),
            ServiceError::Session(SessionError::Unauthenticated) => Status::unauthenticated(
                "missing or unknown API key: send the key your operator provisioned as `x-api-key: <key>` \
                 (or `authorization: Bearer <key>`) request metadata",
            ),
            ServiceError::Session(SessionError::Exhausted { spent, limit, charge }) => {
                let metadata = HashMap::from([
                    ("spent".to_owned(), spent.to_string()),
                    ("limit".to_owned(), limit.to_string()),
                    ("charge".to_owned(), charge.to_string()),
                ]);
                Status::with_error_details(
                    Code::ResourceExhausted,
                    format!(
                        "MI budget exhausted: spent {spent} of {limit} nats and an answer costs {charge}; \
                         no API call raises a budget (an operator can raise a configured principal's budget_mi at a restart, or provision a new principal)"
                    ),
                    ErrorDetails::with_error_info(BUDGET_EXHAUSTED, "pacpriv", metadata),
                )
            }
            ServiceError::RateLimited { retry_after, per_second, burst } => {
                let ms = retry_after.as_millis().max(1);
                let metadata = HashMap::from([
                    ("retry_after_ms".to_owned(), ms.to_string()),
                    ("per_second".to_owned(), per_second.to_string()),
                    ("burst".to_owned(), burst.to_string()),
                ]);
                let mut details = ErrorDetails::with_error_info(RATE_LIMITED, "pacpriv", metadata);
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
            ServiceError::Session(SessionError::Privacy(p)) => privacy_status(p),
            ServiceError::Session(e @ SessionError::Poisoned) => Status::internal(e.to_string()),
            // The one failure after which a charge stands without an answer:
            // the step ran, but could not be made durable, so it is withheld.
            ServiceError::Session(e @ SessionError::Store(_)) => Status::unavailable(e.to_string()),
            ServiceError::Session(SessionError::Registry(
                e @ (StoreError::PrincipalExists { .. } | StoreError::KeyInUse { .. }),
            )) => Status::already_exists(e.to_string()),
            ServiceError::Session(e @ SessionError::Registry(_)) => {
                Status::unavailable(format!("{e}; nothing was answered or charged"))
            }
            ServiceError::Session(e @ (SessionError::EvictedRepeat | SessionError::NoisyNotKept)) => {
                Status::failed_precondition(e.to_string())
            }
            ServiceError::Session(e @ SessionError::CacheMoved) => Status::unavailable(e.to_string()),
            ServiceError::Session(e @ SessionError::UnknownPrincipal(_)) => Status::not_found(e.to_string()),
            ServiceError::Session(e @ SessionError::InvalidPrincipal(_)) => Status::invalid_argument(e.to_string()),
            ServiceError::Teachers(e) => teacher_status(e),
            ServiceError::Internal(msg) => Status::internal(format!("{msg}; nothing was charged")),
        }
    }
}

/// The metrics outcome of a failed query.
pub fn outcome(e: &ServiceError) -> Outcome {
    match e {
        ServiceError::InvalidInput(_) | ServiceError::NotReleased(_) | ServiceError::UnknownModel(_) => {
            Outcome::Invalid
        }
        ServiceError::Session(SessionError::Unauthenticated) => Outcome::Unauthenticated,
        ServiceError::Session(SessionError::Exhausted { .. }) => Outcome::RefusedBudget,
        ServiceError::RateLimited { .. } => Outcome::RefusedRate,
        ServiceError::Session(SessionError::EvictedRepeat | SessionError::NoisyNotKept) => Outcome::Invalid,
        ServiceError::Session(SessionError::Privacy(PrivacyError::Domain(_))) => Outcome::Invalid,
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
    match e {
        FanoutError::Unreachable { attempts, reason, .. } => Status::unavailable(format!(
            "a teacher did not answer after {attempts} attempt(s) ({reason}); nothing was charged, the query can be \
             retried"
        )),
        // Not transient: a teacher that answers with the wrong shape,
        // datatype or classes does not match this server's [model]
        // configuration, and retrying will not help.
        FanoutError::BadOutput { reason, .. } => Status::internal(format!(
            "a teacher returned an unusable output ({reason}); nothing was charged; the operator should check \
             that the teachers match the [model] configuration"
        )),
        e @ (FanoutError::Stopped | FanoutError::Endpoint { .. }) => {
            Status::unavailable(format!("{e}; nothing was charged, the query can be retried"))
        }
    }
}

/// The core refused after the teachers answered: their outputs did not fit
/// the configuration, or calibration could not be certified.
fn privacy_status(e: PrivacyError) -> Status {
    match e {
        PrivacyError::Shape(_) | PrivacyError::NonFinite(_) | PrivacyError::TeacherCount { .. } => {
            Status::internal(format!("teacher outputs do not match the configuration ({e}); nothing was charged"))
        }
        PrivacyError::Domain(_) => Status::invalid_argument(e.to_string()),
        other => Status::internal(format!("{other}; nothing was released or charged")),
    }
}
