//! Reload without restart (SIGHUP): the configuration is read and
//! validated again, and what can change on a running server changes —
//! principals, their API keys and budgets, the rate limit, the TLS
//! certificate files, and the models and versions (`[models.NAME]`,
//! `[versions.NAME.V]`). A configuration that does not validate, or that
//! changes anything a running server cannot take (listeners, the default
//! model's teachers, a dataset's first model, the store, privacy
//! parameters, the admin token, `tls.principal_from_cert`, …:
//! [`needs_restart`], [`first_models`]), is rejected whole, naming those
//! keys: the running one stays, the error is logged and counted
//! (`pacpriv_config_reloads{outcome}`). Nothing is silently left for the
//! next restart.
//!
//! The configuration is the model repository: a replica serves what its
//! file names, and every replica reloading the same file serves the same
//! models and versions (`docs/concepts/models-and-datasets.md`). A new
//! version is built and its teachers probed before it is served, so
//! requests naming no version move to it only once it is ready; requests
//! already answering on a removed version finish on it.
//!
//! # Invariants
//! - Nothing is applied until every part has been checked and built: the
//!   restart-only keys, the TLS files, the new models' teachers; the
//!   store's changes (the principals' provisioning and the revocations,
//!   one transaction: all or nothing) come last, and after them only what
//!   cannot fail.
//! - A key taken away or a principal removed is refused from the next
//!   request on — on an open stream too, at its next query
//!   ([`crate::session::Sessions::recheck`]); spending is never reset.
//! - A model version whose settings did not change is kept as it runs:
//!   its teachers' connections, readiness and load state.
//! - A version the reload builds has its identity claimed in the store
//!   once every version is built and checked ([`super::identity`]): one
//!   whose number the store knows as other teachers rejects the reload.

use super::descriptors;
use super::identity;
use super::models::Builder;
use crate::net::tls::ServerTls;
use crate::server::App;
use crate::server::models::{Model, Models, Served};
use crate::settings::{ModelSettings, Settings, SettingsError};
use std::sync::Arc;

/// Applies reloaded configurations to a running server.
pub struct Reloader {
    app: Arc<App>,
    tls: Option<Arc<ServerTls>>,
    /// Builds the teachers of a model or version a reload adds.
    builder: Builder,
    /// What the server runs: it started with it, and an applied reload's
    /// models and versions replace its own. Held through a reload, so
    /// reloads apply one at a time.
    running: tokio::sync::Mutex<Settings>,
}

impl Reloader {
    pub(super) fn new(app: Arc<App>, tls: Option<Arc<ServerTls>>, builder: Builder, running: Settings) -> Self {
        Reloader { app, tls, builder, running: running.into() }
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
            Ok((revoked, models)) => {
                tracing::info!(revoked = ?revoked, models = ?models,
                    "configuration reloaded: principals, keys, budgets, rate limit, TLS, models");
                true
            }
            Err(error) => {
                tracing::error!(%error, "configuration reload rejected; the running configuration stays");
                false
            }
        }
    }

    /// The principals revoked and the model versions served afterwards.
    async fn try_apply(&self, settings: &Settings) -> Result<(Vec<String>, Vec<String>), String> {
        let mut running = self.running.lock().await;
        let mut restart: Vec<String> = needs_restart(&running, settings).into_iter().map(str::to_owned).collect();
        restart.extend(first_models(&running, settings));
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
        let models = self.models(&running, settings).await?;
        let revoked = self.app.sessions.reconfigure(&settings.principals).await.map_err(|e| e.to_string())?;
        if let (Some(tls), Some(fresh)) = (&self.tls, fresh_tls) {
            tls.install(fresh);
        }
        self.app.rate.reconfigure(settings.rate_limit);
        if let Some(models) = models {
            let before = self.app.models();
            self.app.replace_models(Arc::new(models));
            // A version the reload removed takes its series with it (one
            // changed in place keeps its labels, now the new teachers').
            let after = self.app.models();
            for gone in before.iter().filter(|m| after.version(&m.name, m.version()).is_none()) {
                gone.ensemble.forget_series();
                self.app.metrics.service.forget_model(&gone.name, gone.version());
            }
            running.more_models = settings.more_models.clone();
        }
        if let Ok(active) = self.app.sessions.active_count().await {
            self.app.metrics.service.principals(active);
        }
        let served = self.app.models().iter().map(|m| format!("{}@{}", m.name, m.version())).collect();
        Ok((revoked, served))
    }

    /// The models and versions `new` names, or `None` if they are those
    /// `running` names: each whose settings did not change is kept as it
    /// runs; the others are built, their identities claimed once every
    /// one of them is built and checked ([`identity`]), and their
    /// teachers probed.
    ///
    /// # Errors
    /// A model's teachers that cannot be started or checked, more file
    /// descriptors than the process may hold, or a version number the
    /// store knows as other teachers, naming the model and version.
    async fn models(&self, running: &Settings, new: &Settings) -> Result<Option<Models>, String> {
        if running.more_models == new.more_models {
            return Ok(None);
        }
        let serving = self.app.models();
        let mut versions = Vec::with_capacity(1 + new.more_models.len());
        for model in new.models() {
            let unchanged = running.models().any(|r| r == model);
            match serving.version(&model.name, &model.version) {
                Some(kept) if unchanged => versions.push(Version::Kept(Arc::clone(kept))),
                _ => {
                    let served = self
                        .builder
                        .served(new, model)
                        .await
                        .map_err(|e| format!("model {:?} version {:?}: {e}", model.name, model.version))?;
                    versions.push(Version::Built(model, served));
                }
            }
        }
        let teachers = versions.iter().map(Version::teachers).sum();
        descriptors::provide(descriptors::need(new, teachers)).map_err(|e| e.to_string())?;
        // Every dataset is keyed by identity once this release has started
        // on it, and a reload adds none: no claim keeps a legacy key.
        let store = self.app.sessions.store();
        let mut all = Vec::with_capacity(versions.len());
        for version in versions {
            all.push(match version {
                Version::Kept(kept) => kept,
                Version::Built(model, served) => {
                    let keying =
                        identity::claim(store, model, false, &new.model.name).await.map_err(|e| e.to_string())?;
                    let built = Model::new(served, keying);
                    built.set_teachers_ready(built.ensemble.not_ready().await == 0);
                    tracing::info!(model = %model.name, version = %model.version, ready = built.teachers_ready(),
                        "model version built by a reload");
                    built
                }
            });
        }
        Ok(Some(Models::new(new.model.name.clone(), all)))
    }
}

/// A model version a reload serves: kept as it runs, or built from its
/// settings and not yet claimed.
enum Version<'a> {
    Kept(Arc<Model>),
    Built(&'a ModelSettings, Served),
}

impl Version<'_> {
    /// Its teachers' number.
    fn teachers(&self) -> usize {
        match self {
            Version::Kept(model) => model.ensemble.len(),
            Version::Built(_, served) => served.ensemble.len(),
        }
    }
}

/// The datasets whose first model (the default model for the default
/// dataset, else the first by name) differs between `running` and `new`:
/// its teachers name the dataset's secret in the store, which start-up
/// checks, so it changes only with a restart (and a restart refuses
/// teachers the store does not know for it).
pub fn first_models(running: &Settings, new: &Settings) -> Vec<String> {
    new.datasets()
        .filter(|d| {
            let first = |s: &Settings| s.models().find(|m| m.dataset == d.name).cloned();
            first(running) != first(new)
        })
        .map(|d| format!("dataset {:?}'s first model (its teachers name its secret in the store)", d.name))
        .collect()
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
        max_calls_in_flight,
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
        // Reloadable (`Reloader::models`), but for a dataset's first
        // model (`first_models`).
        more_models: _,
        health_interval,
        principals: _,
        // Follows server.listen and server.http_listen, compared above.
        refused_key: _,
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
        max_calls_in_flight => "server.max_calls_in_flight_per_principal",
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

#[cfg(test)]
mod test {
    use super::{first_models, needs_restart};
    use crate::settings::{Settings, SettingsError};

    fn load(env: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        let base = [
            ("PACPRIV__DEMO__MODELS", "16"),
            ("PACPRIV__DATASETS__OTHER__POLICY", "paper"),
            ("PACPRIV__MODELS__SPLIT7__DATASET", "other"),
            ("PACPRIV__MODELS__SPLIT7__DEMO__SEED", "7"),
        ];
        let all = base.iter().chain(env).map(|(k, v)| (k.to_string(), v.to_string()));
        Settings::load_with_env(None, all)
    }

    /// Models and versions reload, but not a dataset's first model: its
    /// teachers name the dataset's secret in the store.
    #[test]
    fn a_reload_changes_models_and_versions_but_no_datasets_first_model() -> Result<(), SettingsError> {
        let running = load(&[])?;
        for reloadable in [
            load(&[("PACPRIV__VERSIONS__PRIVATE__2__DEMO__REGULARISATION", "0.5")])?,
            load(&[("PACPRIV__VERSIONS__SPLIT7__2__DEMO__REGULARISATION", "0.5")])?,
            load(&[
                ("PACPRIV__MODELS__ZZ__DATASET", "other"),
                ("PACPRIV__MODELS__ZZ__DEMO__SEED", "7"),
                ("PACPRIV__MODELS__ZZ__DEMO__REGULARISATION", "2"),
            ])?,
            load(&[("PACPRIV__MODELS__RIDGE__DEMO__REGULARISATION", "2")])?,
            load(&[("PACPRIV__DEMO__NAIVE_BAYES_MODEL", "")])?,
        ] {
            assert!(needs_restart(&running, &reloadable).is_empty() && first_models(&running, &reloadable).is_empty());
        }
        let other_first = load(&[("PACPRIV__MODELS__SPLIT7__DEMO__REGULARISATION", "0.5")])?;
        assert_eq!(first_models(&running, &other_first).len(), 1, "split7 is dataset other's first model");
        let earlier_name = load(&[
            ("PACPRIV__MODELS__AA__DATASET", "other"),
            ("PACPRIV__MODELS__AA__DEMO__SEED", "7"),
            ("PACPRIV__MODELS__AA__DEMO__REGULARISATION", "2"),
        ])?;
        assert_eq!(first_models(&running, &earlier_name).len(), 1, "aa would become its first model");
        let default_teachers = load(&[("PACPRIV__DEMO__REGULARISATION", "0.5")])?;
        assert_eq!(needs_restart(&running, &default_teachers), ["model / teachers / demo"]);
        Ok(())
    }
}
