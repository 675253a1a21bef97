//! Service configuration: `config/default.toml` (compiled in), an optional
//! operator file layered over it, then `PACPRIV__SECTION__KEY` environment
//! variables; parsed into typed values and validated once at start-up.
//!
//! # Invariants
//! - Every error names the key to fix (`privacy.per_query_mi: …`).
//! - Unknown keys are errors, so a typo cannot silently keep a default
//!   (the most dangerous being a budget that was meant to be smaller).
//!
//! # Files, from the bottom up
//! - `parse`: the error type and the value parsers every section uses;
//! - one file per section, each its raw (serde) form and its check:
//!   `admin` (admin and metrics), `telemetry`, `privacy`, `principals`,
//!   `server` (server and tls), `store`; `teachers` (model, teachers and
//!   demo: it reads the server's message limits); `models` (more models,
//!   each over a dataset, each the sections above with its own keys over
//!   them); `versions` (more versions of a model, each its teachers and
//!   demo keys over the model's); `datasets` (more secret spaces, each
//!   `privacy` with its own keys over it);
//! - this file: [`Settings`], every section together, and the checks
//!   that span sections.
use crate::session::PrincipalConfig;
use config::{Config, Environment, File, FileFormat};
use pacpriv_privacy::mechanism::Calibration;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

mod admin;
mod datasets;
mod models;
mod parse;
mod principals;
mod privacy;
mod server;
mod store;
mod teachers;
mod telemetry;
mod versions;

pub use admin::{AdminSettings, MetricsSettings};
use admin::{RawAdmin, RawMetrics};
use datasets::{RawDataset, distinct_secrets, more_datasets, section_of};
use models::{Base, RawMoreModel, demo_naive_bayes, more_models};
pub use models::{DEFAULT_MODEL, FIRST_VERSION, ModelSettings};
use pacpriv_store::DEFAULT_DATASET;
pub use parse::SettingsError;
use parse::err;
use principals::{RawPrincipal, principals};
pub use privacy::DatasetSettings;
use privacy::RawPrivacy;
pub use server::{MAX_BATCH, MAX_FEATURES, RateQuota, TlsSettings, largest_response};
use server::{RawServer, RawTls};
use store::RawStore;
pub use store::{StoreSettings, redacted_url};
pub use teachers::{DemoLearner, NO_DEMO, TeacherSource};
use teachers::{RawDemo, RawModel, RawTeachers};
use telemetry::RawTelemetry;
pub use telemetry::TelemetrySettings;
use versions::{Bases, RawVersion, versions};

/// The shipped defaults, compiled into the binary so `pacpriv serve` works
/// from any directory.
pub const DEFAULT_TOML: &str = include_str!("../../../../config/default.toml");

/// Validated settings of `pacpriv serve`.
#[derive(Clone, Debug)]
pub struct Settings {
    /// What Σ is calibrated to. Not a configuration key: always
    /// [`Calibration::Certified`] when loaded; only the canary audit's
    /// deliberately broken test server (`examples/undernoised.rs`) sets
    /// anything else.
    pub calibration: Calibration,
    /// Client API listen address.
    pub listen: SocketAddr,
    /// Largest accepted request, bytes.
    pub max_message_bytes: usize,
    /// Most rows (examples) in one request.
    pub max_batch_rows: usize,
    /// What one client may hold of a listener: streams per connection,
    /// connections, timeouts, keep-alive.
    pub limits: crate::net::Limits,
    /// Per-principal query rate limit; `None`: unlimited.
    pub rate_limit: Option<RateQuota>,
    /// Most calls one principal may have in flight at once.
    pub max_calls_in_flight: usize,
    /// The private predictor's model name on the Open Inference Protocol;
    /// `None`: that protocol is not served.
    pub inference_model: Option<String>,
    /// The Open Inference Protocol's HTTP/REST listener; `None`: off.
    pub http_listen: Option<SocketAddr>,
    /// On SIGTERM: how long to keep answering while reporting NOT_SERVING.
    pub drain_grace: std::time::Duration,
    /// Then: how long in-flight requests may take to finish.
    pub drain_deadline: std::time::Duration,
    /// JSON logs (production) instead of text.
    pub log_json: bool,
    /// The default dataset (`[privacy]`): its b, policy, scope, budgets,
    /// secret index file, noisy-vector release and answer cache.
    pub dataset: DatasetSettings,
    /// `[datasets.<name>]`, in name order: more secret spaces, each with
    /// its own s* and sessions.
    pub more_datasets: Vec<DatasetSettings>,
    /// Where sessions are kept.
    pub store: StoreSettings,
    /// Journal every step.
    pub journal: bool,
    /// The default model (`[model]`, `[teachers]`, `[demo]`): what a
    /// request that names no model is answered by.
    pub model: ModelSettings,
    /// `[models.<name>]`, in name order, then `[versions.<name>.<V>]`:
    /// more models and versions, each stepping the sessions of its
    /// dataset. A dataset's first model is version 1 of one of them.
    pub more_models: Vec<ModelSettings>,
    /// How often every model's teachers' readiness is probed for the
    /// health service.
    pub health_interval: Duration,
    /// Principals provisioned in the configuration (the admin API adds
    /// more at run time).
    pub principals: Vec<PrincipalConfig>,
    /// The published demo key's digest when a client listener is off
    /// loopback: refused whoever stored a principal with it (issue 67 §1).
    pub refused_key: Option<[u8; 32]>,
    /// A plaintext listener serving only `grpc.health.v1`, for probes that
    /// cannot speak TLS (Kubernetes `grpc:` probes).
    pub health_listen: Option<SocketAddr>,
    /// TLS for the client and admin listeners; `None`: plaintext.
    pub tls: Option<TlsSettings>,
    /// The admin API; `None` when no admin token is configured.
    pub admin: Option<AdminSettings>,
    /// The Prometheus endpoint.
    pub metrics: MetricsSettings,
    /// OpenTelemetry trace export.
    pub telemetry: TelemetrySettings,
}

impl Settings {
    /// Every dataset, the default one (`[privacy]`) first.
    pub fn datasets(&self) -> impl Iterator<Item = &DatasetSettings> {
        std::iter::once(&self.dataset).chain(&self.more_datasets)
    }

    /// Every model, the default one first.
    pub fn models(&self) -> impl Iterator<Item = &ModelSettings> {
        std::iter::once(&self.model).chain(&self.more_models)
    }

    /// The position of `model`'s dataset in [`Settings::datasets`]
    /// (validated at load: every model's dataset is one of them).
    pub fn dataset_of(&self, model: &ModelSettings) -> Option<usize> {
        self.datasets().position(|d| d.name == model.dataset)
    }

    /// Defaults, then `file` (if any), then the process environment.
    ///
    /// # Errors
    /// A missing or malformed file, an unknown key, or a value outside its
    /// domain — each naming the key.
    pub fn load(file: Option<&Path>) -> Result<Self, SettingsError> {
        Self::load_with_env(file, std::env::vars())
    }

    /// As [`Settings::load`] with an explicit environment (tests).
    ///
    /// # Errors
    /// As [`Settings::load`].
    pub fn load_with_env(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, SettingsError> {
        let mut builder = Config::builder().add_source(File::from_str(DEFAULT_TOML, FileFormat::Toml));
        if let Some(path) = file {
            if !path.is_file() {
                return Err(err("--config", format!("{} is not a readable file", path.display())));
            }
            builder = builder.add_source(File::from(path).format(FileFormat::Toml));
        }
        let env: config::Map<String, String> = env.into_iter().filter(|(k, _)| k.starts_with("PACPRIV__")).collect();
        builder = builder.add_source(
            Environment::with_prefix("PACPRIV")
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true)
                .source(Some(env)),
        );
        let config = builder.build().map_err(|e| err(&key_of(&e), e.to_string()))?;
        let raw: Raw = config.clone().try_deserialize().map_err(|e| err(&key_of(&e), e.to_string()))?;
        raw.validate(&config)
    }
}

/// Best-effort key extraction from a `config` error (it names the key in
/// its message for type errors; "unknown field" errors name the field).
fn key_of(e: &config::ConfigError) -> String {
    match e {
        config::ConfigError::Type { key: Some(k), .. } => k.clone(),
        config::ConfigError::At { key: Some(k), .. } => k.clone(),
        _ => "(configuration)".into(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    server: RawServer,
    privacy: RawPrivacy,
    store: RawStore,
    model: RawModel,
    teachers: RawTeachers,
    demo: RawDemo,
    tls: RawTls,
    admin: RawAdmin,
    metrics: RawMetrics,
    telemetry: RawTelemetry,
    #[serde(default)]
    principals: BTreeMap<String, RawPrincipal>,
    #[serde(default)]
    models: BTreeMap<String, RawMoreModel>,
    #[serde(default)]
    datasets: BTreeMap<String, RawDataset>,
    #[serde(default)]
    versions: BTreeMap<String, BTreeMap<String, RawVersion>>,
}

impl Raw {
    /// Each section on its own, then what spans sections; `config` is
    /// what `self` was read from (each of `models` is read from it again,
    /// its own keys over the top-level sections).
    fn validate(self, config: &Config) -> Result<Settings, SettingsError> {
        let privacy = self.privacy.validate(DEFAULT_DATASET, "privacy")?;
        let mut datasets = vec![privacy];
        datasets.extend(more_datasets(config, self.datasets)?);
        distinct_secrets(&datasets)?;
        let server = self.server.validate()?;
        let (mode, input_shape) = self.model.validate()?;
        let naive_bayes_model = self.demo.naive_bayes_model.clone();
        let fanout = self.teachers.validate(self.demo)?;
        let admin = self.admin.validate()?;
        let model = ModelSettings {
            name: server.inference_model.clone().unwrap_or_else(|| DEFAULT_MODEL.to_owned()),
            version: FIRST_VERSION.to_owned(),
            dataset: DEFAULT_DATASET.to_owned(),
            mode,
            input_shape,
            teachers: fanout.teachers,
            call: fanout.call,
            batching: fanout.batching,
        };
        let base = Base { model: &model, health_interval: fanout.health_interval, datasets: &datasets };
        let mut more_models = more_models(config, &self.models, base)?;
        demo_naive_bayes(&naive_bayes_model, &model, &mut more_models)?;
        let bases = Bases { default: &model, tables: &self.models, health_interval: fanout.health_interval };
        let versions = versions(config, self.versions, bases, &more_models)?;
        more_models.extend(versions);
        // Nothing is charged that cannot be delivered (issue 40 §3): the
        // rows of one request all stay in the answer cache, so a retry
        // after a withheld answer, or a repeat within the batch, finds
        // them; and the largest response fits the encode limit.
        for dataset in &datasets {
            if server.max_batch_rows > dataset.cache.capacity {
                let key = section_of(&dataset.name);
                return Err(err(
                    "server.max_batch_rows",
                    format!(
                        "{} rows per request, but {key}.answer_cache_entries keeps {} answers: a larger batch would \
                         evict its own rows, so a retry after a withheld answer would be refused or charged again; \
                         raise {key}.answer_cache_entries or lower server.max_batch_rows",
                        server.max_batch_rows, dataset.cache.capacity
                    ),
                ));
            }
        }
        for model in std::iter::once(&model).chain(&more_models) {
            let d = model.mode.dim();
            let noisy = datasets.iter().any(|s| s.name == model.dataset && s.release_noisy_vector);
            let largest = largest_response(server.max_batch_rows, d, noisy);
            if largest > server.max_message_bytes {
                return Err(err(
                    "server.max_message_bytes",
                    format!(
                        "{} bytes, but a response of model {:?} to {} rows (server.max_batch_rows) of d = {d} \
                         classes{} can take up to {largest} bytes: it would be charged and then not delivered; raise \
                         server.max_message_bytes or lower server.max_batch_rows{}",
                        server.max_message_bytes,
                        model.name,
                        server.max_batch_rows,
                        if noisy { " with their noisy vectors" } else { "" },
                        if noisy {
                            format!(" (or turn {}.release_noisy_vector off)", section_of(&model.dataset))
                        } else {
                            String::new()
                        },
                    ),
                ));
            }
        }
        let principals = principals(self.principals, datasets.iter().skip(1))?;
        // One rule for configured and admin-created names: none can be a
        // session key of another dataset's (DATASET/NAME) or the shared
        // session's, whatever datasets are added later.
        if let Some((p, e)) =
            principals.iter().find_map(|p| crate::session::registry::check_name(&p.name).err().map(|e| (p, e)))
        {
            return Err(err(
                &format!("principals.{}", p.name),
                format!("{e}: a name is part of its sessions' store keys, so it cannot hold '/' or '*'"),
            ));
        }
        // A published credential is for a server only its own machine can
        // reach.
        let listeners: Vec<(&str, std::net::SocketAddr)> = [("server.listen", Some(server.listen))]
            .into_iter()
            .chain([("server.http_listen", server.http_listen)])
            .filter_map(|(key, addr)| addr.map(|a| (key, a)))
            .collect();
        let refused_key = principals::published_key_off_loopback(&principals, &listeners)?;
        if principals.is_empty() && admin.is_none() {
            return Err(err(
                "principals",
                "no principal is configured and the admin API is off (admin.key_sha256), so no client could \
                 authenticate",
            ));
        }
        Ok(Settings {
            calibration: Calibration::Certified,
            listen: server.listen,
            max_message_bytes: server.max_message_bytes,
            max_batch_rows: server.max_batch_rows,
            limits: server.limits,
            rate_limit: server.rate_limit,
            max_calls_in_flight: server.max_calls_in_flight,
            http_listen: server.http_listen.filter(|_| server.inference_model.is_some()),
            drain_grace: server.drain_grace,
            drain_deadline: server.drain_deadline,
            inference_model: server.inference_model,
            log_json: server.log_json,
            dataset: datasets.remove(0),
            more_datasets: datasets,
            journal: self.store.journal,
            store: self.store.validate()?,
            model,
            more_models,
            health_interval: fanout.health_interval,
            principals,
            refused_key,
            health_listen: server.health_listen,
            tls: self.tls.validate()?,
            admin,
            metrics: self.metrics.validate()?,
            telemetry: self.telemetry.validate()?,
        })
    }
}

#[cfg(test)]
mod test;
