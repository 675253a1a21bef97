//! Which PostgreSQL failures mean "no node accepts this now" — a
//! failover's gap, a node starting or stopping, a standby reached, a
//! network that drops the connection — as opposed to failures no retry
//! cures (authentication, a missing database, permissions, SQL, a server
//! that ignores `synchronous_commit`, a certificate that does not verify).
//! The first are [`StoreError::Unreachable`]; start-up waits them out
//! (`start::store`), and every other caller treats both alike (nothing
//! was charged: UNAVAILABLE).
//!
//! # Invariants
//! - A failure is [`StoreError::Unreachable`] only when its SQLSTATE is a
//!   connection exception (class 08, but for a pooler refusing pacpriv's
//!   start-up options: "unsupported startup parameter"), an operator intervention that ends
//!   or refuses sessions (57P01–57P03), insufficient resources (class 53),
//!   or a write refused by a read-only server (25006); or when it has no
//!   SQLSTATE and is a dropped connection or a socket error other than
//!   malformed data (TLS verification failures arrive as `InvalidData`).
//!   A pool whose every connection is busy is not unreachable. Anything
//!   else is [`StoreError::Backend`]: a start-up fails at once on it,
//!   naming it.
//! - So an unresolvable host name is waited out (a Service's DNS record
//!   may lag the pod), and with several hosts the failure judged is the
//!   last host's (tokio-postgres reports only that one): a wrong password
//!   on one node while another is down is waited out too — each attempt's
//!   failure is logged while waiting.

use super::super::error::StoreError;
use deadpool_postgres::{HookError, PoolError, TimeoutType};
use std::error::Error as _;
use std::io::ErrorKind;
use tokio_postgres::error::SqlState;

/// `e` as a [`StoreError`], [`StoreError::Unreachable`] when it says no
/// node accepted the connection or the statement just now.
pub(super) fn pg(e: tokio_postgres::Error) -> StoreError {
    classify(unreachable(&e), e.to_string())
}

/// A failure to get a connection from the pool, described by `what` (the
/// message names the database and the whole error chain).
pub(super) fn pool(e: &PoolError, what: String) -> StoreError {
    let unreachable = match e {
        // Connecting (or checking a pooled connection) took longer than
        // the timeout: nothing answered.
        PoolError::Timeout(TimeoutType::Create | TimeoutType::Recycle) => true,
        // Every connection busy: this replica's load, not the database's.
        PoolError::Timeout(TimeoutType::Wait) => false,
        PoolError::Backend(e) | PoolError::PostCreateHook(HookError::Backend(e)) => unreachable(e),
        // The hook refused the server (synchronous_commit ignored), or the
        // pool was closed or misbuilt: no retry helps.
        PoolError::PostCreateHook(HookError::Message(_)) | PoolError::Closed | PoolError::NoRuntimeSpecified => false,
    };
    classify(unreachable, what)
}

fn classify(unreachable: bool, message: String) -> StoreError {
    if unreachable { StoreError::Unreachable(message) } else { StoreError::Backend(message) }
}

fn unreachable(e: &tokio_postgres::Error) -> bool {
    if let Some(db) = e.as_db_error() {
        return transient_state(db.code(), db.message());
    }
    if e.is_closed() {
        return true;
    }
    // A socket error (refused, reset, timed out, unresolvable host; a
    // read-write session asked of a read-only server is PermissionDenied),
    // unless the bytes themselves were wrong: a certificate that does not
    // verify, a protocol violation.
    let io = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
    io.is_some_and(|io| transient_io(io.kind()))
}

/// Whether a server's SQLSTATE (and message) means "not now" rather than
/// "never".
fn transient_state(state: &SqlState, message: &str) -> bool {
    let code = state.code();
    // PgBouncer reports most of its own failures as 08P01, a failover's
    // ("server login has been failing") among them; only its refusal of
    // pacpriv's start-up options is for ever.
    (code.starts_with("08") && !message.contains("unsupported startup parameter"))
        || code.starts_with("53")
        || [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::READ_ONLY_SQL_TRANSACTION,
        ]
        .contains(state)
}

fn transient_io(kind: ErrorKind) -> bool {
    !matches!(kind, ErrorKind::InvalidData | ErrorKind::InvalidInput | ErrorKind::Unsupported)
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn a_failover_gap_is_transient_and_a_wrong_setup_is_not() {
        for state in [
            SqlState::CONNECTION_FAILURE,
            SqlState::SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::READ_ONLY_SQL_TRANSACTION,
            SqlState::TOO_MANY_CONNECTIONS,
        ] {
            assert!(transient_state(&state, "the server is starting up"), "{state:?} should be waited out");
        }
        for state in [
            SqlState::INVALID_PASSWORD,
            SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
            SqlState::INVALID_CATALOG_NAME,
            SqlState::INSUFFICIENT_PRIVILEGE,
            SqlState::SYNTAX_ERROR,
            SqlState::UNDEFINED_TABLE,
            SqlState::DATABASE_DROPPED,
            SqlState::QUERY_CANCELED,
        ] {
            assert!(!transient_state(&state, "refused"), "{state:?} should fail the start at once");
        }
        // PgBouncer's 08P01: its backend down is a failover, its refusal
        // of the start-up options is a configuration to fix.
        let pooler = SqlState::PROTOCOL_VIOLATION;
        assert!(transient_state(&pooler, "server login has been failing, try again later (server_login_retry)"));
        assert!(!transient_state(&pooler, "unsupported startup parameter: options"));
        for kind in [ErrorKind::ConnectionRefused, ErrorKind::TimedOut, ErrorKind::PermissionDenied, ErrorKind::Other] {
            assert!(transient_io(kind), "{kind:?}");
        }
        assert!(!transient_io(ErrorKind::InvalidData), "a certificate that does not verify is not waited out");
    }
}
