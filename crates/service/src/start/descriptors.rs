//! File descriptors: how many a server with these settings may need
//! ([`need`]), and making sure the process may open that many
//! ([`provide`]).
//!
//! Every listener may hold `server.max_connections` connections, TLS
//! handshakes included; the PostgreSQL pools (steps and lookups), the teachers' channels and the
//! process itself (the store file, the runtime, in-process demo teachers)
//! need a few more. With a lower limit a flood the caps are meant to
//! absorb would instead make `accept` fail with EMFILE — for every client.
//! So start-up raises the soft `RLIMIT_NOFILE` to the need, and refuses to
//! start when the hard limit is below it, naming the setting that drives it.

use super::StartError;
use crate::settings::{Settings, StoreSettings};
use pacpriv_store::postgres::LOOKUP_CONNECTIONS;
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// Descriptors beyond the listeners, the pool and the teachers: the
/// process's own (the store file, the runtime, logs, TLS files) and the
/// in-process demo teachers' sockets.
pub const BASE: u64 = 256;

/// The descriptors a server with `settings` and `teachers` teachers may
/// hold at once.
pub fn need(settings: &Settings, teachers: usize) -> u64 {
    let optional = [
        settings.http_listen.is_some(),
        settings.admin.is_some(),
        settings.health_listen.is_some(),
        settings.metrics.listen.is_some(),
    ];
    let listeners = 1 + optional.iter().filter(|&&on| on).count() as u64;
    let pool = match &settings.store {
        StoreSettings::Postgres { link, .. } => (link.max_connections + LOOKUP_CONNECTIONS) as u64,
        StoreSettings::Embedded { .. } => 0,
    };
    // A channel to each teacher, and (demo teachers) its server's end.
    listeners * settings.limits.max_connections as u64 + pool + 2 * teachers as u64 + BASE
}

/// Raises the soft `RLIMIT_NOFILE` to `need` if it is lower; returns the
/// soft limit in force.
///
/// # Errors
/// [`StartError::Descriptors`] when the hard limit is below `need`.
pub fn provide(need: u64) -> Result<u64, StartError> {
    let Rlimit { current, maximum } = getrlimit(Resource::Nofile);
    if current.is_none_or(|soft| soft >= need) {
        return Ok(current.unwrap_or(u64::MAX));
    }
    if maximum.is_some_and(|hard| hard < need) {
        return Err(StartError::Descriptors(format!(
            "this configuration may hold {need} file descriptors at once (server.max_connections per listener, \
             store.max_connections, the teachers and {BASE} for the process), but the process may open at most \
             {} (hard RLIMIT_NOFILE): lower server.max_connections, or raise the limit (ulimit -Hn; in Docker \
             --ulimit nofile={need}:{need}; in Kubernetes, the container runtime's default)",
            maximum.unwrap_or(0)
        )));
    }
    setrlimit(Resource::Nofile, Rlimit { current: Some(need), maximum })
        .map_err(|e| StartError::Descriptors(format!("raising the file-descriptor limit to {need}: {e}")))?;
    tracing::info!(need, "file-descriptor limit raised to what the configuration may hold");
    Ok(need)
}
