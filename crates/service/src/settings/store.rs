//! `[store]`: where sessions live — the embedded store's file, or
//! PostgreSQL (URL, TLS, timeouts) — and how a URL is shown in logs.

use super::parse::{SettingsError, choice, err, optional_file};
use pacpriv_store::{PgLink, PgTls, SslMode};
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSettings::Embedded { path } => f.debug_struct("Embedded").field("path", path).finish(),
            StoreSettings::Postgres { url, link, start_wait } => f
                .debug_struct("Postgres")
                .field("url", &redacted_url(url))
                .field("link", link)
                .field("start_wait", start_wait)
                .finish(),
        }
    }
}

/// A PostgreSQL URL with its password replaced by `***`, for `Debug`:
/// the user-info's password (up to the last `@`, since a password may hold
/// `/` or `?`), every query parameter whose key mentions "pass" or is
/// percent-encoded, and in libpq's key/value form everything from the
/// first `password` on.
pub fn redacted_url(url: &str) -> String {
    let Some(rest) = url.strip_prefix("postgres://").or_else(|| url.strip_prefix("postgresql://")) else {
        return match url.find("password") {
            Some(i) => format!("{}password=***", &url[..i]),
            None => url.to_owned(),
        };
    };
    let scheme = &url[..url.len() - rest.len()];
    let (user, host) = match rest.rsplit_once('@') {
        Some((user, host)) => match user.split_once(':') {
            Some((name, _)) => (format!("{name}:***@"), host),
            None => (format!("{user}@"), host),
        },
        None => (String::new(), rest),
    };
    let host = match host.split_once('?') {
        Some((path, query)) => {
            let hidden = |key: &str| key.to_ascii_lowercase().contains("pass") || key.contains('%');
            let params: Vec<String> = query
                .split('&')
                .map(|p| match p.split_once('=') {
                    Some((k, _)) if hidden(k) => format!("{k}=***"),
                    _ => p.to_owned(),
                })
                .collect();
            format!("{path}?{}", params.join("&"))
        }
        None => host.to_owned(),
    };
    format!("{scheme}{user}{host}")
}

/// Which store keeps the sessions. `Debug` hides the URL's password.
#[derive(Clone, PartialEq)]
pub enum StoreSettings {
    /// A redb file on this node.
    Embedded {
        /// Its path.
        path: PathBuf,
    },
    /// A PostgreSQL database shared by replicas.
    Postgres {
        /// Connection URL (`postgres://user@host/db`).
        url: String,
        /// Pool, TLS and timeout.
        link: PgLink,
        /// How long a start waits for a node that accepts writes
        /// (`store.start_wait_ms`).
        start_wait: Duration,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    #[serde(deserialize_with = "choice")]
    pub(super) backend: Backend,
    pub(super) path: String,
    pub(super) postgres_url: String,
    #[serde(deserialize_with = "choice")]
    pub(super) postgres_sslmode: SslMode,
    pub(super) postgres_sslrootcert: String,
    pub(super) postgres_timeout_ms: u64,
    pub(super) max_connections: usize,
    pub(super) start_wait_ms: u64,
    pub(super) journal: bool,
}

/// The longest `store.start_wait_ms`: a replica still waiting after a day
/// is better restarted by its orchestrator, where someone sees it.
const MAX_START_WAIT_MS: u64 = 86_400_000;

/// `store.backend`.
#[derive(Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum Backend {
    Embedded,
    Postgres,
}

impl RawStore {
    pub(super) fn validate(self) -> Result<StoreSettings, SettingsError> {
        match self.backend {
            Backend::Embedded if self.path.trim().is_empty() => {
                Err(err("store.path", "must name the store file, e.g. /var/lib/pacpriv/state.redb"))
            }
            Backend::Embedded => Ok(StoreSettings::Embedded { path: PathBuf::from(&self.path) }),
            Backend::Postgres if self.postgres_url.trim().is_empty() => {
                Err(err("store.postgres_url", "backend = \"postgres\" needs a URL, e.g. postgres://pacpriv@db/pacpriv"))
            }
            Backend::Postgres if self.max_connections == 0 => Err(err("store.max_connections", "must be at least 1")),
            Backend::Postgres if self.postgres_timeout_ms < 1000 => Err(err(
                "store.postgres_timeout_ms",
                "must be at least 1000 (milliseconds): shorter would cut off transactions that are merely slow",
            )),
            Backend::Postgres if self.start_wait_ms > MAX_START_WAIT_MS => Err(err(
                "store.start_wait_ms",
                format!("must be at most {MAX_START_WAIT_MS} (one day, in milliseconds); 0 does not wait"),
            )),
            Backend::Postgres => {
                let root_cert = optional_file("store.postgres_sslrootcert", &self.postgres_sslrootcert)?;
                if root_cert.is_none() && matches!(self.postgres_sslmode, SslMode::VerifyCa | SslMode::VerifyFull) {
                    return Err(err(
                        "store.postgres_sslrootcert",
                        format!(
                            "store.postgres_sslmode = {} verifies the server's certificate: give the CA file it chains to",
                            self.postgres_sslmode.as_str()
                        ),
                    ));
                }
                let tls = PgTls { mode: self.postgres_sslmode, root_cert };
                tls.url_for(&self.postgres_url).map_err(|e| err("store.postgres_url", e))?;
                let link = PgLink {
                    max_connections: self.max_connections,
                    tls,
                    timeout: Duration::from_millis(self.postgres_timeout_ms),
                };
                let start_wait = Duration::from_millis(self.start_wait_ms);
                Ok(StoreSettings::Postgres { url: self.postgres_url, link, start_wait })
            }
        }
    }
}
