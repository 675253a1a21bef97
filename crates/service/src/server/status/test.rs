use super::*;
use std::time::Duration;

/// The ErrorInfo of a status: (reason, charged).
fn info(status: &Status) -> (String, String) {
    let info = status.get_error_details().error_info().cloned().expect("every error status carries an ErrorInfo");
    assert_eq!(info.domain, DOMAIN);
    (info.reason, info.metadata.get("charged").cloned().expect("metadata `charged`"))
}

/// Issue 21 §5: every error a client can receive carries a stable reason and
/// says whether it was charged — `true` only where the step ran and its
/// answer was withheld.
#[test]
fn every_error_status_names_its_reason_and_whether_it_was_charged() {
    let unreachable =
        || FanoutError::Unreachable { model: "m".into(), endpoint: "e".into(), attempts: 2, reason: "deadline".into() };
    let cases: Vec<(ServiceError, Code, &str, &str)> = vec![
        (ServiceError::InvalidInput("bad shape".into()), Code::InvalidArgument, reason::INVALID_INPUT, "false"),
        (ServiceError::NotReleased("noisy".into()), Code::FailedPrecondition, reason::NOT_RELEASED, "false"),
        (ServiceError::NotFound("x".into()), Code::NotFound, reason::NOT_FOUND, "false"),
        (ServiceError::Unloaded("x".into()), Code::Unavailable, reason::MODEL_UNLOADED, "false"),
        (SessionError::Unauthenticated.into(), Code::Unauthenticated, reason::UNAUTHENTICATED, "false"),
        (
            SessionError::Exhausted { spent: 1.0, limit: 1.0, charge: 0.1 }.into(),
            Code::ResourceExhausted,
            reason::BUDGET_EXHAUSTED,
            "false",
        ),
        (
            ServiceError::RateLimited { retry_after: Duration::from_millis(50), per_second: 10, burst: 5 },
            Code::ResourceExhausted,
            reason::RATE_LIMITED,
            "false",
        ),
        (ServiceError::Teachers(unreachable()), Code::Unavailable, reason::TEACHERS_UNAVAILABLE, "false"),
        (
            ServiceError::Teachers(FanoutError::BadOutput {
                model: "m".into(),
                endpoint: "e".into(),
                reason: "r".into(),
            }),
            Code::Internal,
            reason::TEACHER_OUTPUT_INVALID,
            "false",
        ),
        (
            SessionError::from(StoreError::Unconfirmed("connection reset".into())).into(),
            Code::Unavailable,
            reason::STORE_UNAVAILABLE,
            "true",
        ),
        (SessionError::from(StoreError::WriterGone).into(), Code::Unavailable, reason::STORE_UNAVAILABLE, "true"),
        (
            SessionError::from(StoreError::Backend("refused".into())).into(),
            Code::Unavailable,
            reason::STORE_UNAVAILABLE,
            "false",
        ),
        (SessionError::CacheMoved.into(), Code::Unavailable, reason::CACHE_MOVED, "false"),
        (SessionError::EvictedRepeat.into(), Code::FailedPrecondition, reason::EVICTED_REPEAT, "false"),
        (SessionError::NoisyNotKept.into(), Code::FailedPrecondition, reason::NOISY_NOT_KEPT, "false"),
        (SessionError::Poisoned.into(), Code::Internal, reason::INTERNAL, "false"),
        (SessionError::RowFailed { row: 3, drew: 2 }.into(), Code::Internal, reason::INTERNAL, "true"),
        (
            SessionError::from(PrivacyError::Domain("α".into())).into(),
            Code::InvalidArgument,
            reason::INVALID_INPUT,
            "false",
        ),
        (SessionError::from(PrivacyError::Uncertified("x".into())).into(), Code::Internal, reason::INTERNAL, "false"),
        (SessionError::from(PrivacyError::Contested).into(), Code::FailedPrecondition, reason::CONTESTED, "false"),
        (
            SessionError::Registry(StoreError::KeyInUse { name: "a".into() }).into(),
            Code::AlreadyExists,
            reason::ALREADY_EXISTS,
            "false",
        ),
        (SessionError::UnknownPrincipal("a".into()).into(), Code::NotFound, reason::NOT_FOUND, "false"),
        (ServiceError::Internal("bug".into()), Code::Internal, reason::INTERNAL, "false"),
    ];
    for (error, code, want_reason, charged) in cases {
        let shown = format!("{error:?}");
        let status = Status::from(error);
        assert_eq!(status.code(), code, "{shown}");
        assert_eq!(info(&status), (want_reason.to_owned(), charged.to_owned()), "{shown}");
        if charged == "true" {
            assert!(status.message().contains("retry the same query"), "{}", status.message());
        } else {
            assert!(!status.message().contains("may have been charged"), "{}", status.message());
        }
    }
}
