//! How a replica's connections to PostgreSQL are made ([`Connector`]) and
//! what each must hold before the pool hands it out ([`pinned`]): the
//! half of "an answer is released only once its charge survives the loss
//! of any one database node" that lives below SQL.
//!
//! # Invariants
//! - Every connection runs with `synchronous_commit = on`, asked for in
//!   its start-up packet and read back before first use. A role's or
//!   database's default of `local` or `off` would otherwise make a COMMIT
//!   return before any standby has the step; a server or pooler that does
//!   not apply the setting is refused (the pool, and so start-up, fails
//!   with a message naming it).
//! - Every transaction that writes a charge, a principal or a revocation
//!   sets it again for itself (`SET LOCAL`, [`durable`]), so a pooler that
//!   shares server connections between clients cannot leak another
//!   client's setting into it.
//! - A connection on which the server sends a WARNING is closed before
//!   the reply that follows it is read. PostgreSQL reports a synchronous
//!   COMMIT whose wait for the standby was cancelled — by
//!   `statement_timeout`, `pg_cancel_backend`, a lock timeout — as a
//!   WARNING ("committed locally, but might not have been replicated")
//!   followed by success. Closing first makes that COMMIT fail on this
//!   side, which is what it is: unconfirmed ([`StoreError::Unconfirmed`]),
//!   so its answer is withheld and a retry must confirm it
//!   (`step::step_on`). Any other WARNING costs one failed statement
//!   (rolled back, nothing charged), never a release.
//!
//! [`StoreError::Unconfirmed`]: crate::StoreError::Unconfirmed

use deadpool_postgres::{Connect, Hook, HookError};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_postgres::error::Severity;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Client, Config, Error, Socket};

/// The value every connection's `synchronous_commit` must have: a COMMIT
/// returns once the synchronous standbys have flushed it.
pub(super) const SYNCHRONOUS_COMMIT: &str = "on";

/// Asks every connection for `synchronous_commit` and for the server-side
/// bound on an idle transaction (`timeout`; see the module documentation
/// of [`super`]), after any options the URL gives, and bounds every wait
/// on the server by `timeout`.
pub(super) fn session_options(config: &mut Config, timeout: Duration) {
    let ms = timeout.as_millis();
    let ours = format!("-c idle_in_transaction_session_timeout={ms} -c synchronous_commit={SYNCHRONOUS_COMMIT}");
    let options = match config.get_options() {
        Some(given) if !given.trim().is_empty() => format!("{given} {ours}"),
        _ => ours,
    };
    // A URL's own connect_timeout stands: with several hosts it bounds
    // each, and the pool's create timeout (`timeout`) bounds them all.
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(timeout);
    }
    config
        .options(options)
        .tcp_user_timeout(timeout)
        .keepalives(true)
        .keepalives_idle(timeout)
        .keepalives_interval((timeout / 4).max(Duration::from_secs(1)))
        .keepalives_retries(3);
}

/// Sets `synchronous_commit` for the transaction `tx` (`SET LOCAL`): the
/// connection's own setting ([`pinned`]) is not enough behind a pooler
/// that hands one server connection to many clients in turn (PgBouncer's
/// transaction pooling), where another client may have set it `off` on
/// the connection this transaction runs on. Every transaction that
/// charges, provisions or revokes runs it first.
///
/// # Errors
/// The server's.
pub(super) async fn durable(tx: &tokio_postgres::Transaction<'_>) -> Result<(), Error> {
    tx.batch_execute(SET_LOCAL).await
}

/// [`durable`]'s statement.
const SET_LOCAL: &str = "SET LOCAL synchronous_commit = on";

/// The pool's hook run on every new connection: refuses one whose
/// `synchronous_commit` is not [`SYNCHRONOUS_COMMIT`].
pub(super) fn pinned() -> Hook {
    Hook::async_fn(|client, _| {
        Box::pin(async move {
            let row = client.query_one("SHOW synchronous_commit", &[]).await.map_err(HookError::Backend)?;
            let value: String = row.get(0);
            if value == SYNCHRONOUS_COMMIT {
                Ok(())
            } else {
                Err(HookError::message(format!(
                    "the server runs pacpriv's connection with synchronous_commit = {value}, not the \
                     {SYNCHRONOUS_COMMIT} pacpriv asks for in its start-up options (a connection pooler that drops \
                     them?): a charge could then be acknowledged before a standby has it. Connect pacpriv to \
                     PostgreSQL directly, or have the pooler pass start-up options"
                )))
            }
        })
    })
}

/// Connects as the configuration says over `tls`, and drives each
/// connection on a task that closes it at the server's first WARNING
/// (module documentation).
pub(super) struct Connector<T>(pub(super) T);

type Connecting<'a> = Pin<Box<dyn Future<Output = Result<(Client, JoinHandle<()>), Error>> + Send + 'a>>;

impl<T> Connect for Connector<T>
where
    T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
    T::Stream: Sync + Send,
    T::TlsConnect: Sync + Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    fn connect(&self, config: &Config) -> Connecting<'_> {
        let (tls, config) = (self.0.clone(), config.clone());
        Box::pin(async move {
            let (client, mut connection) = config.connect(tls).await?;
            let task = tokio::spawn(async move {
                while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    match message {
                        Ok(AsyncMessage::Notice(notice)) if is_warning(&notice) => {
                            // Dropping the connection here fails the
                            // statement the warning belongs to.
                            tracing::warn!(
                                code = notice.code().code(),
                                "store: the server warned ({}: {}); closing the connection, so the statement it \
                                 concerns counts as failed",
                                notice.message(),
                                notice.detail().unwrap_or("")
                            );
                            return;
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!("store: connection error: {e}");
                            return;
                        }
                    }
                }
            });
            Ok((client, task))
        })
    }
}

/// Whether `notice` is a WARNING (or worse): the severity as sent before
/// translation where the server gives it (9.6 on), else the translated one.
fn is_warning(notice: &tokio_postgres::error::DbError) -> bool {
    match notice.parsed_severity() {
        Some(severity) => matches!(severity, Severity::Warning | Severity::Error | Severity::Fatal | Severity::Panic),
        // Only NOTICE, DEBUG, INFO and LOG are harmless; the rest, in any
        // language, is treated as a warning.
        None => !matches!(notice.severity(), "NOTICE" | "DEBUG" | "INFO" | "LOG"),
    }
}
