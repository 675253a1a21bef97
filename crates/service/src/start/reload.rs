//! Reload without restart (SIGHUP): the configuration is read and
//! validated again, and what can change on a running server changes —
//! principals, their API keys and budgets, the rate limit, the TLS
//! certificate files. A configuration that does not validate, or that
//! changes anything a running server cannot take (listeners, teachers,
//! store, privacy parameters, the admin token, `tls.principal_from_cert`,
//! …: [`needs_restart`]), is rejected whole, naming those keys: the running
//! one stays, the error is logged and counted
//! (`pacpriv_config_reloads{outcome}`). Nothing is silently left for the
//! next restart.
//!
//! # Invariants
//! - Nothing is applied until every part has been checked: the
//!   restart-only keys, the TLS files; the store's changes (the
//!   principals' provisioning and the revocations, one transaction: all
//!   or nothing) come last, and after them only what cannot fail.
//! - A key taken away or a principal removed is refused from the next
//!   request on — on an open stream too, at its next query
//!   ([`crate::session::Sessions::recheck`]); spending is never reset.

use crate::net::tls::ServerTls;
use crate::server::App;
use crate::settings::{Settings, SettingsError};
use std::sync::Arc;

/// Applies reloaded configurations to a running server.
pub struct Reloader {
    app: Arc<App>,
    tls: Option<Arc<ServerTls>>,
    /// What the server started with: a reload may change only what
    /// [`needs_restart`] leaves out.
    running: Settings,
}

impl Reloader {
    pub(super) fn new(app: Arc<App>, tls: Option<Arc<ServerTls>>, running: Settings) -> Self {
        Reloader { app, tls, running }
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
        let restart = needs_restart(&self.running, settings);
        if !restart.is_empty() {
            return Err(format!(
                "changed keys a running server cannot take (restart to apply them, or change them back): {}",
                restart.join(", ")
            ));
        }
        let fresh_tls = match &settings.tls {
            Some(t) => Some(ServerTls::load(&t.files()).map_err(|e| e.to_string())?),
            None => None,
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

/// The keys whose values differ between `running` and `new` and which a
/// running server cannot take. Every field of [`Settings`] is named here
/// (no `..`): a new setting is either listed or marked reloadable.
pub fn needs_restart(running: &Settings, new: &Settings) -> Vec<&'static str> {
    let Settings {
        calibration,
        listen,
        max_message_bytes,
        max_batch_rows,
        limits,
        rate_limit: _,
        inference_model,
        http_listen,
        drain_grace,
        drain_deadline,
        log_json,
        dataset,
        more_datasets,
        store,
        journal,
        model,
        more_models,
        health_interval,
        principals: _,
        health_listen,
        tls,
        admin,
        metrics,
        telemetry,
    } = running;
    let mut changed = Vec::new();
    macro_rules! compare {
        ($($field:ident => $key:literal),* $(,)?) => {
            $(if *$field != new.$field { changed.push($key); })*
        };
    }
    compare!(
        calibration => "calibration",
        listen => "server.listen",
        max_message_bytes => "server.max_message_bytes",
        max_batch_rows => "server.max_batch_rows",
        limits => "server (max_concurrent_streams, max_connections, timeouts, keep-alive)",
        inference_model => "server.inference_model",
        http_listen => "server.http_listen",
        drain_grace => "server.drain_grace_ms",
        drain_deadline => "server.drain_deadline_ms",
        log_json => "server.log_format",
        dataset => "privacy",
        more_datasets => "datasets",
        store => "store",
        journal => "store.journal",
        model => "model / teachers / demo",
        more_models => "models",
        health_interval => "teachers.health_interval_ms",
        health_listen => "server.health_listen",
        admin => "admin (key_sha256, listen)",
        metrics => "metrics",
        telemetry => "telemetry",
    );
    // TLS: its files are reloaded; turning it on or off, and what a
    // certificate is taken to mean, are not.
    match (tls, &new.tls) {
        (Some(a), Some(b)) if a.principal_from_cert != b.principal_from_cert => changed.push("tls.principal_from_cert"),
        (Some(_), None) | (None, Some(_)) => changed.push("tls (turning TLS on or off)"),
        _ => {}
    }
    changed
}
