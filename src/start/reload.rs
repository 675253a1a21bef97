//! Reload without restart (SIGHUP): the configuration is read and
//! validated again, and what can change on a running server changes —
//! principals, their API keys and budgets, the rate limit, the TLS
//! certificates. A configuration that does not validate (or that a
//! running server cannot take) is rejected whole: the running one stays,
//! the error is logged and counted (`pacpriv_config_reloads{outcome}`).
//! Everything else (teachers, store, privacy parameters, listeners) takes
//! effect at the next restart.
//!
//! # Invariants
//! - Nothing is applied until every part has been checked; the principals'
//!   provisioning is one transaction.
//! - A key taken away or a principal removed is refused from the next
//!   request on; spending is never reset by a reload.

use crate::net::tls::ServerTls;
use crate::server::App;
use crate::settings::{Settings, SettingsError};
use std::sync::Arc;

/// Applies reloaded configurations to a running server.
pub struct Reloader {
    app: Arc<App>,
    tls: Option<Arc<ServerTls>>,
}

impl Reloader {
    pub(super) fn new(app: Arc<App>, tls: Option<Arc<ServerTls>>) -> Self {
        Reloader { app, tls }
    }

    /// Applies `loaded` (or rejects it, keeping the running configuration);
    /// whether it was applied.
    pub async fn apply(&self, loaded: Result<Settings, SettingsError>) -> bool {
        let outcome = match loaded {
            Ok(settings) => self.try_apply(&settings).await,
            Err(e) => Err(e.to_string()),
        };
        self.app.metrics.service.reload(outcome.is_ok());
        match outcome {
            Ok(revoked) => {
                tracing::info!(revoked = ?revoked, "configuration reloaded: principals, keys, budgets, rate limit, TLS");
                true
            }
            Err(error) => {
                tracing::error!(%error, "configuration reload rejected; the running configuration stays");
                false
            }
        }
    }

    async fn try_apply(&self, settings: &Settings) -> Result<Vec<String>, String> {
        let fresh_tls = match (&self.tls, &settings.tls) {
            (Some(_), Some(t)) => Some(ServerTls::load(&t.files()).map_err(|e| e.to_string())?),
            (None, None) => None,
            _ => return Err("tls: turning TLS on or off needs a restart".into()),
        };
        let revoked = self.app.sessions.reconfigure(&settings.principals).await.map_err(|e| e.to_string())?;
        if let (Some(tls), Some(fresh)) = (&self.tls, fresh_tls) {
            tls.install(fresh);
        }
        self.app.rate.reconfigure(settings.rate_limit);
        if let Ok(active) = self.app.sessions.active_count().await {
            self.app.metrics.service.principals(active);
        }
        Ok(revoked)
    }
}
