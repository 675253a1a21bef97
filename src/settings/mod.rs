//! Service configuration: `config/default.toml` (compiled in), an optional
//! operator file layered over it, then `PACPRIV__SECTION__KEY` environment
//! variables; parsed into typed values and validated once at start-up.
//!
//! # Invariants
//! - Every error names the key to fix (`privacy.per_query_mi: …`).
//! - Unknown keys are errors, so a typo cannot silently keep a default
//!   (the most dangerous being a budget that was meant to be smaller).

use crate::privacy::Nats;
use crate::privacy::ledger::Policy;
use crate::privacy::mechanism::Calibration;
use crate::privacy::noise::MIN_PER_QUERY;
use crate::session::cache::{CacheSettings, OnEvicted};
use crate::session::{PrincipalConfig, Scope};
use crate::store::{PgLink, PgTls, SslMode};
use crate::teachers::connection::{ClientTls, Connection, Header};
use crate::teachers::{Batching, CallPolicy, OutputMode, TeacherSpec, Teachers};
use config::{Config, Environment, File, FileFormat};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The shipped defaults, compiled into the binary so `pacpriv serve` works
/// from any directory.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

/// Largest number of input features accepted (input_shape product).
pub const MAX_FEATURES: usize = 1 << 20;

/// Largest `teachers.max_batch`: a batch of this many 64-feature examples
/// is 256 KiB of FP32 per teacher request, well inside gRPC's default
/// 4 MiB message limit of most inference servers.
pub const MAX_BATCH: usize = 1024;

/// An upper bound on the encoded size of a response to `rows` rows of
/// `d`-class releases, with the noisy vectors when `noisy`, in either
/// protocol (`PredictResponse`, `ModelInferResponse` in contents or raw
/// form): per row, its fixed fields (≤ 64 bytes) and d doubles with their
/// framing; once more for a response's top-level copy of its first row;
/// and 2 KiB for the rest (ids ≤ 128 bytes, the model name, the budget,
/// the OIP parameters). `server::inference::test` checks it against
/// encoded worst cases.
pub fn largest_response(rows: usize, d: usize, noisy: bool) -> usize {
    let row = 64 + if noisy { 8 * d + 16 } else { 0 };
    2048 + (rows + 1) * row
}

/// A configuration problem, naming the key.
#[derive(Debug, thiserror::Error)]
#[error("config key `{key}`: {message}")]
pub struct SettingsError {
    /// Dotted key, e.g. `privacy.per_query_mi`.
    pub key: String,
    /// What is wrong and what is expected.
    pub message: String,
}

fn err(key: &str, message: impl Into<String>) -> SettingsError {
    SettingsError { key: key.to_owned(), message: message.into() }
}

impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSettings::Embedded { path } => f.debug_struct("Embedded").field("path", path).finish(),
            StoreSettings::Postgres { url, link } => {
                f.debug_struct("Postgres").field("url", &redacted_url(url)).field("link", link).finish()
            }
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

/// Where the teachers come from.
#[derive(Clone, Debug, PartialEq)]
pub enum TeacherSource {
    /// Train the demo ensemble and serve it in-process on loopback.
    Demo {
        /// m.
        models: usize,
        /// Split and subset seed.
        seed: u64,
        /// Listen address of the in-process teacher server.
        listen: SocketAddr,
        /// Ask the demo server's stacked model (all m in one call) instead
        /// of its m per-teacher models.
        stacked: bool,
        /// L2 penalty of each teacher's fit.
        regularisation: f64,
        /// Canaries planted in the training split (audits only; 0: none).
        canaries: usize,
    },
    /// Already-running Open Inference Protocol models.
    Remote(Teachers),
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
    },
}

/// A token bucket per principal: `per_second` queries a second on
/// average, up to `burst` at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateQuota {
    /// Sustained rate.
    pub per_second: std::num::NonZeroU32,
    /// Bucket size.
    pub burst: std::num::NonZeroU32,
}

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
    /// b.
    pub per_query: Nats,
    /// Charging policy.
    pub policy: Policy,
    /// Session scope.
    pub scope: Scope,
    /// Limit of the shared session when scope is global.
    pub global_budget: Nats,
    /// Operator-provided secret index file, if any.
    pub secret_index_file: Option<PathBuf>,
    /// Clients may ask for the (rounded) noisy release, not just its argmax.
    pub release_noisy_vector: bool,
    /// The per-session answer cache.
    pub cache: CacheSettings,
    /// Where sessions are kept.
    pub store: StoreSettings,
    /// Journal every step.
    pub journal: bool,
    /// How teacher outputs are read (label or vector, d).
    pub mode: OutputMode,
    /// Shape of one example.
    pub input_shape: Vec<usize>,
    /// Teachers.
    pub teachers: TeacherSource,
    /// Per-teacher call policy.
    pub call: CallPolicy,
    /// Dynamic batching of the fan-out.
    pub batching: Batching,
    /// How often teacher readiness is probed for the health service.
    pub health_interval: Duration,
    /// Principals provisioned in the configuration (the admin API adds
    /// more at run time).
    pub principals: Vec<PrincipalConfig>,
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

/// `[telemetry]`: OpenTelemetry traces over OTLP, off by default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TelemetrySettings {
    /// The collector's OTLP/gRPC endpoint (`http://…:4317`, plaintext: an
    /// agent or sidecar); `None`: off.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` resource attribute.
    pub service_name: String,
}

/// TLS files (PEM) for the client and admin listeners.
#[derive(Clone, Debug, PartialEq)]
pub struct TlsSettings {
    /// Certificate chain.
    pub cert_file: PathBuf,
    /// Private key.
    pub key_file: PathBuf,
    /// CA whose certificates clients must present (mTLS); `None`: no
    /// client certificates asked for.
    pub client_ca_file: Option<PathBuf>,
    /// A verified client certificate's subject CN names the principal when
    /// the request carries no API key.
    pub principal_from_cert: bool,
}

impl TlsSettings {
    /// The listener's PEM files.
    pub fn files(&self) -> crate::net::tls::TlsFiles {
        crate::net::tls::TlsFiles {
            cert: self.cert_file.clone(),
            key: self.key_file.clone(),
            client_ca: self.client_ca_file.clone(),
        }
    }
}

/// The `pacpriv.v1.Admin` listener.
#[derive(Clone, Debug, PartialEq)]
pub struct AdminSettings {
    /// Where it listens.
    pub listen: SocketAddr,
    /// SHA-256 of the admin token.
    pub key_sha256: [u8; 32],
}

/// The Prometheus `/metrics` endpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsSettings {
    /// HTTP listen address; `None`: no endpoint.
    pub listen: Option<SocketAddr>,
    /// Principals with their own budget series at most (bounds the
    /// cardinality a scrape can reach).
    pub max_principal_series: usize,
}

impl Settings {
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
        let raw: Raw =
            builder.build().and_then(Config::try_deserialize).map_err(|e| err(&key_of(&e), e.to_string()))?;
        raw.validate()
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
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: String,
    health_listen: String,
    max_message_bytes: usize,
    max_batch_rows: usize,
    max_concurrent_streams: u32,
    max_connections: usize,
    header_read_timeout_ms: u64,
    request_timeout_ms: u64,
    keepalive_interval_ms: u64,
    keepalive_timeout_ms: u64,
    rate_limit_per_second: u32,
    rate_limit_burst: u32,
    #[serde(deserialize_with = "choice")]
    log_format: LogFormat,
    inference_model: String,
    http_listen: String,
    drain_grace_ms: u64,
    drain_deadline_ms: u64,
}

/// `server.log_format`.
#[derive(Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum LogFormat {
    Text,
    Json,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrivacy {
    per_query_mi: String,
    #[serde(deserialize_with = "choice")]
    policy: Policy,
    #[serde(deserialize_with = "choice")]
    scope: Scope,
    global_budget_mi: String,
    secret_index_file: String,
    release_noisy_vector: bool,
    answer_cache_entries: usize,
    #[serde(deserialize_with = "choice")]
    answer_cache_evicted: OnEvicted,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    #[serde(deserialize_with = "choice")]
    backend: Backend,
    path: String,
    postgres_url: String,
    #[serde(deserialize_with = "choice")]
    postgres_sslmode: SslMode,
    postgres_sslrootcert: String,
    postgres_timeout_ms: u64,
    max_connections: usize,
    journal: bool,
}

/// `store.backend`.
#[derive(Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Backend {
    Embedded,
    Postgres,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    #[serde(deserialize_with = "choice")]
    mode: Mode,
    classes: usize,
    input_shape: Vec<usize>,
}

/// `model.mode`.
#[derive(Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Mode {
    Label,
    Vector,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTeachers {
    #[serde(deserialize_with = "choice")]
    source: Source,
    deadline_ms: u64,
    retries: u32,
    input_name: String,
    #[serde(deserialize_with = "choice")]
    input_datatype: Datatype,
    output_name: String,
    health_interval_ms: u64,
    batch_window_ms: u64,
    max_batch: usize,
    #[serde(deserialize_with = "choice")]
    layout: Layout,
    remote: Vec<RawRemote>,
    stacked: RawStacked,
    allow_plaintext_credentials: bool,
}

/// One entry of `teachers.remote`: a model, and how to reach its endpoint
/// (TLS and headers, all optional; the same fields as [`RawStacked`]'s —
/// listed in each, because serde cannot refuse unknown fields through a
/// flattened struct).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRemote {
    endpoint: String,
    model: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    ca_file: String,
    #[serde(default)]
    cert_file: String,
    #[serde(default)]
    key_file: String,
    #[serde(default)]
    server_name: String,
    #[serde(default)]
    headers: Vec<RawHeader>,
}

/// TLS and headers towards a teacher endpoint.
struct RawConnection {
    /// `teachers.allow_plaintext_credentials`.
    plaintext_ok: bool,
    ca_file: String,
    cert_file: String,
    key_file: String,
    server_name: String,
    headers: Vec<RawHeader>,
}

/// A request header; its value from a file or an environment variable.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHeader {
    name: String,
    #[serde(default)]
    value_file: String,
    #[serde(default)]
    value_env: String,
    /// Put before the secret, e.g. `"Bearer "` (not secret itself).
    #[serde(default)]
    prefix: String,
    /// Refused: only so that the error can say why.
    #[serde(default)]
    value: Option<String>,
}

impl RawConnection {
    /// The connection of the endpoint at `key` (`teachers.remote[i]`):
    /// files read, secrets fetched, combinations checked.
    fn validate(self, key: &str, endpoint: &str) -> Result<Connection, SettingsError> {
        let read = |field: &str, path: &str| -> Result<Option<(PathBuf, Vec<u8>)>, SettingsError> {
            if path.trim().is_empty() {
                return Ok(None);
            }
            let bytes = std::fs::read(path).map_err(|e| err(&format!("{key}.{field}"), format!("{path}: {e}")))?;
            Ok(Some((PathBuf::from(path), bytes)))
        };
        let ca = read("ca_file", &self.ca_file)?;
        let cert = read("cert_file", &self.cert_file)?;
        let private = read("key_file", &self.key_file)?;
        let https = endpoint.starts_with("https://");
        let tls = match (ca, https) {
            (Some((ca_file, ca_pem)), true) => {
                let identity = match (cert, private) {
                    (Some((_, c)), Some((_, k))) => Some((c, k)),
                    (None, None) => None,
                    _ => return Err(err(&format!("{key}.cert_file"), "cert_file and key_file go together")),
                };
                let name = self.server_name.trim();
                Some(ClientTls { ca_file, ca_pem, identity, server_name: (!name.is_empty()).then(|| name.to_owned()) })
            }
            (None, true) => {
                return Err(err(
                    &format!("{key}.ca_file"),
                    format!("endpoint {endpoint} speaks TLS: give the CA its certificate chains to (PEM)"),
                ));
            }
            (Some(_), false) => {
                return Err(err(&format!("{key}.endpoint"), "TLS settings are given: the endpoint must be https://"));
            }
            (None, false) => {
                if cert.is_some() || private.is_some() || !self.server_name.trim().is_empty() {
                    return Err(err(
                        &format!("{key}.endpoint"),
                        "TLS settings are given: the endpoint must be https://",
                    ));
                }
                None
            }
        };
        let mut headers = Vec::with_capacity(self.headers.len());
        for (j, h) in self.headers.into_iter().enumerate() {
            let hkey = format!("{key}.headers[{j}]");
            if h.value.is_some() {
                return Err(err(
                    &format!("{hkey}.value"),
                    "a header's value is a secret and never sits in the configuration: give value_file or value_env",
                ));
            }
            let (secret, source) = match (h.value_file.trim(), h.value_env.trim()) {
                (file, "") if !file.is_empty() => {
                    let v = std::fs::read_to_string(file)
                        .map_err(|e| err(&format!("{hkey}.value_file"), format!("{file}: {e}")))?;
                    (v.trim_end_matches(['\n', '\r']).to_owned(), format!("file {file}"))
                }
                ("", var) if !var.is_empty() => {
                    let v = std::env::var(var).map_err(|_| {
                        err(&format!("{hkey}.value_env"), format!("environment variable {var} is not set"))
                    })?;
                    (v, format!("env {var}"))
                }
                _ => return Err(err(&hkey, "give exactly one of value_file and value_env")),
            };
            let name = h.name.trim().to_ascii_lowercase();
            if name.is_empty() {
                return Err(err(&format!("{hkey}.name"), "must not be empty"));
            }
            headers.push(Header { name, value: format!("{}{secret}", h.prefix), source });
        }
        if tls.is_none() && !headers.is_empty() && !self.plaintext_ok {
            return Err(err(
                &format!("{key}.headers"),
                format!(
                    "endpoint {endpoint} is plaintext http://: its headers (credentials) would cross the network \
                     unencrypted; use https:// with ca_file, or set teachers.allow_plaintext_credentials = true where \
                     the network itself is private (loopback, an encrypting mesh)"
                ),
            ));
        }
        Ok(Connection { tls, headers })
    }
}

/// `teachers.source`.
#[derive(Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Source {
    Demo,
    Remote,
}

/// `teachers.layout`.
#[derive(Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
enum Layout {
    PerTeacher,
    Stacked,
}

/// `teachers.input_datatype`: what the teachers are sent.
#[derive(Clone, Copy, Deserialize, PartialEq, Eq)]
enum Datatype {
    #[serde(rename = "FP32")]
    Fp32,
    #[serde(rename = "FP64")]
    Fp64,
}

impl Datatype {
    fn as_str(self) -> &'static str {
        match self {
            Datatype::Fp32 => "FP32",
            Datatype::Fp64 => "FP64",
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStacked {
    endpoint: String,
    model: String,
    version: String,
    models: usize,
    #[serde(default)]
    ca_file: String,
    #[serde(default)]
    cert_file: String,
    #[serde(default)]
    key_file: String,
    #[serde(default)]
    server_name: String,
    #[serde(default)]
    headers: Vec<RawHeader>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDemo {
    models: usize,
    seed: u64,
    listen: String,
    regularisation: f64,
    canaries: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTelemetry {
    otlp_endpoint: String,
    service_name: String,
}

impl RawTelemetry {
    fn validate(self) -> Result<TelemetrySettings, SettingsError> {
        let endpoint = self.otlp_endpoint.trim();
        if !endpoint.is_empty() && !endpoint.starts_with("http://") {
            return Err(err(
                "telemetry.otlp_endpoint",
                "an http:// URL of an OTLP/gRPC collector (a local agent or sidecar; TLS to the collector is not built in)",
            ));
        }
        if self.service_name.trim().is_empty() {
            return Err(err("telemetry.service_name", "must not be empty"));
        }
        Ok(TelemetrySettings {
            otlp_endpoint: (!endpoint.is_empty()).then(|| endpoint.to_owned()),
            service_name: self.service_name.trim().to_owned(),
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert_file: String,
    key_file: String,
    client_ca_file: String,
    principal_from_cert: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    listen: String,
    key_sha256: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: String,
    max_principal_series: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrincipal {
    key_sha256: String,
    budget_mi: String,
}

/// An enumerated key: read as a string, then parsed into its enum, so a
/// value outside the choices is refused with serde's message, which names
/// the value and every choice (the `config` crate's own enum reading
/// names neither).
fn choice<'de, D: serde::Deserializer<'de>, T: serde::de::DeserializeOwned>(d: D) -> Result<T, D::Error> {
    use serde::de::{Error, IntoDeserializer};
    let value = String::deserialize(d)?;
    T::deserialize(value.as_str().into_deserializer()).map_err(|e: serde::de::value::Error| D::Error::custom(e))
}

fn nats(key: &str, s: &str) -> Result<Nats, SettingsError> {
    s.parse::<Nats>().map_err(|e| err(key, e.to_string()))
}

/// Largest `privacy.answer_cache_entries`.
const MAX_CACHE_ENTRIES: usize = 4096;

/// m teachers, one per half of the data split into pairs: even, at least 2.
fn teacher_count(key: &str, m: usize) -> Result<(), SettingsError> {
    if m < 2 || !m.is_multiple_of(2) {
        return Err(err(key, "must be m, the number of teachers: even and at least 2"));
    }
    Ok(())
}

fn addr(key: &str, s: &str) -> Result<SocketAddr, SettingsError> {
    s.parse().map_err(|_| err(key, format!("{s:?} is not an IP:port address such as 127.0.0.1:50051")))
}

/// An address, or `None` for the empty string (listener disabled).
fn optional_addr(key: &str, s: &str) -> Result<Option<SocketAddr>, SettingsError> {
    if s.trim().is_empty() { Ok(None) } else { addr(key, s).map(Some) }
}

/// A file that must exist now (so a typo fails at start-up, not at the
/// first handshake); `None` for the empty string.
fn optional_file(key: &str, s: &str) -> Result<Option<PathBuf>, SettingsError> {
    if s.trim().is_empty() {
        return Ok(None);
    }
    let path = PathBuf::from(s);
    if !path.is_file() {
        return Err(err(key, format!("{s:?} is not a readable file")));
    }
    Ok(Some(path))
}

impl RawTls {
    fn validate(self) -> Result<Option<TlsSettings>, SettingsError> {
        let cert = optional_file("tls.cert_file", &self.cert_file)?;
        let key = optional_file("tls.key_file", &self.key_file)?;
        let client_ca = optional_file("tls.client_ca_file", &self.client_ca_file)?;
        match (cert, key) {
            (Some(cert_file), Some(key_file)) => {
                if self.principal_from_cert && client_ca.is_none() {
                    return Err(err(
                        "tls.principal_from_cert",
                        "needs tls.client_ca_file: only a certificate the server verified can name a principal",
                    ));
                }
                Ok(Some(TlsSettings {
                    cert_file,
                    key_file,
                    client_ca_file: client_ca,
                    principal_from_cert: self.principal_from_cert,
                }))
            }
            (None, None) if client_ca.is_none() && !self.principal_from_cert => Ok(None),
            (None, None) => {
                Err(err("tls.cert_file", "client certificates need server TLS: set cert_file and key_file"))
            }
            (Some(_), None) => Err(err("tls.key_file", "tls.cert_file is set: set the matching private key too")),
            (None, Some(_)) => Err(err("tls.cert_file", "tls.key_file is set: set the matching certificate too")),
        }
    }
}

impl RawPrivacy {
    fn validate(self) -> Result<Privacy, SettingsError> {
        let per_query = nats("privacy.per_query_mi", &self.per_query_mi)?;
        if per_query.get() < MIN_PER_QUERY {
            return Err(err("privacy.per_query_mi", format!("must be at least {MIN_PER_QUERY:e} nats")));
        }
        if self.answer_cache_entries > MAX_CACHE_ENTRIES {
            return Err(err(
                "privacy.answer_cache_entries",
                format!("at most {MAX_CACHE_ENTRIES}: the cache is part of every step's durable record"),
            ));
        }
        if self.answer_cache_entries == 0 {
            return Err(err(
                "privacy.answer_cache_entries",
                "at least 1: the cache keeps each answer with the session, which is what lets a client retry a \
                 query whose answer was withheld without being charged twice",
            ));
        }
        let secret = self.secret_index_file;
        Ok(Privacy {
            per_query,
            policy: self.policy,
            scope: self.scope,
            global_budget: nats("privacy.global_budget_mi", &self.global_budget_mi)?,
            secret_index_file: (!secret.is_empty()).then(|| PathBuf::from(secret)),
            release_noisy_vector: self.release_noisy_vector,
            cache: CacheSettings { capacity: self.answer_cache_entries, on_evicted: self.answer_cache_evicted },
        })
    }
}

/// The `[privacy]` section, validated.
struct Privacy {
    per_query: Nats,
    policy: Policy,
    scope: Scope,
    global_budget: Nats,
    secret_index_file: Option<PathBuf>,
    release_noisy_vector: bool,
    cache: CacheSettings,
}

impl RawServer {
    fn validate(self) -> Result<Server, SettingsError> {
        let inference_model = self.inference_model.trim().to_owned();
        if inference_model.len() > 128 || inference_model.contains(['/', ' ']) {
            return Err(err("server.inference_model", "at most 128 bytes, no '/' or spaces (it is a model name)"));
        }
        if self.max_message_bytes < 1024 {
            return Err(err("server.max_message_bytes", "must be at least 1024"));
        }
        if !(1..=4096).contains(&self.max_batch_rows) {
            return Err(err("server.max_batch_rows", "must be between 1 and 4096"));
        }
        if self.max_concurrent_streams == 0 {
            return Err(err("server.max_concurrent_streams", "must be at least 1"));
        }
        if self.max_connections == 0 {
            return Err(err("server.max_connections", "must be at least 1"));
        }
        let ms = std::time::Duration::from_millis;
        let within = |key: &str, value: u64, min: u64, max: u64| {
            if (min..=max).contains(&value) {
                Ok(ms(value))
            } else {
                Err(err(key, format!("must be between {min} and {max} (milliseconds)")))
            }
        };
        let limits = crate::net::Limits {
            max_concurrent_streams: self.max_concurrent_streams,
            max_connections: self.max_connections,
            header_read: within("server.header_read_timeout_ms", self.header_read_timeout_ms, 100, 600_000)?,
            request: within("server.request_timeout_ms", self.request_timeout_ms, 1000, 3_600_000)?,
            keepalive_interval: within("server.keepalive_interval_ms", self.keepalive_interval_ms, 1000, 3_600_000)?,
            keepalive_timeout: within("server.keepalive_timeout_ms", self.keepalive_timeout_ms, 100, 600_000)?,
        };
        if self.drain_grace_ms > 600_000 {
            return Err(err("server.drain_grace_ms", "at most 600000 (ten minutes)"));
        }
        if !(1..=3_600_000).contains(&self.drain_deadline_ms) {
            return Err(err("server.drain_deadline_ms", "between 1 and 3600000 (an hour)"));
        }
        let rate_limit = match (std::num::NonZeroU32::new(self.rate_limit_per_second), self.rate_limit_burst) {
            (None, 0) => None,
            (None, _) => {
                return Err(err(
                    "server.rate_limit_burst",
                    "is set but server.rate_limit_per_second is 0 (off); set a rate too",
                ));
            }
            (Some(per_second), burst) => {
                Some(RateQuota { per_second, burst: std::num::NonZeroU32::new(burst).unwrap_or(per_second) })
            }
        };
        Ok(Server {
            listen: addr("server.listen", &self.listen)?,
            health_listen: optional_addr("server.health_listen", &self.health_listen)?,
            max_message_bytes: self.max_message_bytes,
            max_batch_rows: self.max_batch_rows,
            limits,
            rate_limit,
            http_listen: optional_addr("server.http_listen", &self.http_listen)?,
            drain_grace: std::time::Duration::from_millis(self.drain_grace_ms),
            drain_deadline: std::time::Duration::from_millis(self.drain_deadline_ms),
            inference_model: (!inference_model.is_empty()).then_some(inference_model),
            log_json: self.log_format == LogFormat::Json,
        })
    }
}

/// The `[server]` section, validated.
struct Server {
    listen: SocketAddr,
    health_listen: Option<SocketAddr>,
    max_message_bytes: usize,
    max_batch_rows: usize,
    limits: crate::net::Limits,
    rate_limit: Option<RateQuota>,
    inference_model: Option<String>,
    http_listen: Option<SocketAddr>,
    drain_grace: std::time::Duration,
    drain_deadline: std::time::Duration,
    log_json: bool,
}

impl RawModel {
    fn validate(self) -> Result<(OutputMode, Vec<usize>), SettingsError> {
        if self.classes < 2 {
            return Err(err("model.classes", "must be at least 2"));
        }
        let mode = match self.mode {
            Mode::Label => OutputMode::Label { classes: self.classes },
            Mode::Vector => OutputMode::Vector { dim: self.classes },
        };
        let features = self.input_shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        match features {
            Some(n) if (1..=MAX_FEATURES).contains(&n) && !self.input_shape.is_empty() => {}
            _ => {
                return Err(err(
                    "model.input_shape",
                    format!("must be non-empty with 1 to {MAX_FEATURES} elements in all"),
                ));
            }
        }
        Ok((mode, self.input_shape))
    }
}

impl RawTeachers {
    /// The `[teachers]` section (with `[demo]` when the demo serves them).
    fn validate(self, demo: RawDemo) -> Result<Fanout, SettingsError> {
        if self.deadline_ms == 0 {
            return Err(err("teachers.deadline_ms", "must be positive"));
        }
        if self.health_interval_ms < 100 {
            return Err(err("teachers.health_interval_ms", "must be at least 100"));
        }
        if self.retries > 10 {
            return Err(err("teachers.retries", "at most 10: a dead teacher should fail the query, not stall it"));
        }
        if self.max_batch == 0 || self.max_batch > MAX_BATCH {
            return Err(err("teachers.max_batch", format!("must be 1 to {MAX_BATCH}")));
        }
        if self.batch_window_ms > 1000 {
            return Err(err(
                "teachers.batch_window_ms",
                "at most 1000: a window adds its length to every query's latency",
            ));
        }
        let stacked = self.layout == Layout::Stacked;
        let teachers = match self.source {
            Source::Demo => {
                teacher_count("demo.models", demo.models)?;
                if !(demo.regularisation.is_finite() && demo.regularisation > 0.0) {
                    return Err(err(
                        "demo.regularisation",
                        "a positive number (the L2 penalty of each teacher's fit; `pacpriv tune` suggests one)",
                    ));
                }
                TeacherSource::Demo {
                    models: demo.models,
                    seed: demo.seed,
                    listen: addr("demo.listen", &demo.listen)?,
                    stacked,
                    regularisation: demo.regularisation,
                    canaries: demo.canaries,
                }
            }
            Source::Remote if stacked => {
                let st = self.stacked;
                if st.endpoint.is_empty() || st.model.is_empty() {
                    return Err(err("teachers.stacked", "layout = \"stacked\" needs its endpoint and model"));
                }
                teacher_count("teachers.stacked.models", st.models)?;
                let connection = RawConnection {
                    plaintext_ok: self.allow_plaintext_credentials,
                    ca_file: st.ca_file,
                    cert_file: st.cert_file,
                    key_file: st.key_file,
                    server_name: st.server_name,
                    headers: st.headers,
                }
                .validate("teachers.stacked", &st.endpoint)?;
                let spec = TeacherSpec { endpoint: st.endpoint, model: st.model, version: st.version, connection };
                TeacherSource::Remote(Teachers::Stacked { spec, models: st.models })
            }
            Source::Remote => {
                if self.remote.len() < 2 {
                    return Err(err("teachers.remote", "source = \"remote\" needs at least 2 teachers"));
                }
                let mut specs = Vec::with_capacity(self.remote.len());
                for (i, r) in self.remote.into_iter().enumerate() {
                    let connection = RawConnection {
                        plaintext_ok: self.allow_plaintext_credentials,
                        ca_file: r.ca_file,
                        cert_file: r.cert_file,
                        key_file: r.key_file,
                        server_name: r.server_name,
                        headers: r.headers,
                    }
                    .validate(&format!("teachers.remote[{i}]"), &r.endpoint)?;
                    specs.push(TeacherSpec { endpoint: r.endpoint, model: r.model, version: r.version, connection });
                }
                TeacherSource::Remote(Teachers::PerTeacher(specs))
            }
        };
        Ok(Fanout {
            teachers,
            call: CallPolicy {
                deadline: Duration::from_millis(self.deadline_ms),
                retries: self.retries,
                input_name: self.input_name,
                input_datatype: self.input_datatype.as_str().to_owned(),
                output_name: (!self.output_name.is_empty()).then_some(self.output_name),
            },
            batching: Batching { window: Duration::from_millis(self.batch_window_ms), max_batch: self.max_batch },
            health_interval: Duration::from_millis(self.health_interval_ms),
        })
    }
}

/// The `[teachers]` section, validated.
struct Fanout {
    teachers: TeacherSource,
    call: CallPolicy,
    batching: Batching,
    health_interval: Duration,
}

impl RawStore {
    fn validate(self) -> Result<StoreSettings, SettingsError> {
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
                Ok(StoreSettings::Postgres { url: self.postgres_url, link })
            }
        }
    }
}

impl RawAdmin {
    fn validate(self) -> Result<Option<AdminSettings>, SettingsError> {
        match self.key_sha256.trim() {
            "" => Ok(None),
            hex => Ok(Some(AdminSettings {
                listen: addr("admin.listen", &self.listen)?,
                key_sha256: parse_sha256(hex).ok_or_else(|| {
                    err("admin.key_sha256", "must be 64 hex digits: the SHA-256 of the admin token (or empty)")
                })?,
            })),
        }
    }
}

impl RawMetrics {
    fn validate(self) -> Result<MetricsSettings, SettingsError> {
        if self.max_principal_series == 0 {
            return Err(err("metrics.max_principal_series", "must be at least 1"));
        }
        Ok(MetricsSettings {
            listen: optional_addr("metrics.listen", &self.listen)?,
            max_principal_series: self.max_principal_series,
        })
    }
}

impl Raw {
    /// Each section on its own, then what spans sections.
    fn validate(self) -> Result<Settings, SettingsError> {
        let privacy = self.privacy.validate()?;
        let server = self.server.validate()?;
        let (mode, input_shape) = self.model.validate()?;
        let fanout = self.teachers.validate(self.demo)?;
        let admin = self.admin.validate()?;
        // Nothing is charged that cannot be delivered (issue 40 §3): the
        // rows of one request all stay in the answer cache, so a retry
        // after a withheld answer, or a repeat within the batch, finds
        // them; and the largest response fits the encode limit.
        if server.max_batch_rows > privacy.cache.capacity {
            return Err(err(
                "server.max_batch_rows",
                format!(
                    "{} rows per request, but privacy.answer_cache_entries keeps {} answers: a larger batch would \
                     evict its own rows, so a retry after a withheld answer would be refused or charged again; raise \
                     privacy.answer_cache_entries or lower server.max_batch_rows",
                    server.max_batch_rows, privacy.cache.capacity
                ),
            ));
        }
        let largest = largest_response(server.max_batch_rows, mode.dim(), privacy.release_noisy_vector);
        if largest > server.max_message_bytes {
            return Err(err(
                "server.max_message_bytes",
                format!(
                    "{} bytes, but a response to {} rows (server.max_batch_rows) of d = {} classes{} can take up to \
                     {largest} bytes: it would be charged and then not delivered; raise server.max_message_bytes or \
                     lower server.max_batch_rows{}",
                    server.max_message_bytes,
                    server.max_batch_rows,
                    mode.dim(),
                    if privacy.release_noisy_vector { " with their noisy vectors" } else { "" },
                    if privacy.release_noisy_vector { " (or turn privacy.release_noisy_vector off)" } else { "" },
                ),
            ));
        }
        if self.principals.is_empty() && admin.is_none() {
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
            http_listen: server.http_listen.filter(|_| server.inference_model.is_some()),
            drain_grace: server.drain_grace,
            drain_deadline: server.drain_deadline,
            inference_model: server.inference_model,
            log_json: server.log_json,
            per_query: privacy.per_query,
            policy: privacy.policy,
            scope: privacy.scope,
            global_budget: privacy.global_budget,
            secret_index_file: privacy.secret_index_file,
            release_noisy_vector: privacy.release_noisy_vector,
            cache: privacy.cache,
            journal: self.store.journal,
            store: self.store.validate()?,
            mode,
            input_shape,
            teachers: fanout.teachers,
            call: fanout.call,
            batching: fanout.batching,
            health_interval: fanout.health_interval,
            principals: principals(self.principals)?,
            health_listen: server.health_listen,
            tls: self.tls.validate()?,
            admin,
            metrics: self.metrics.validate()?,
            telemetry: self.telemetry.validate()?,
        })
    }
}

fn principals(raw: BTreeMap<String, RawPrincipal>) -> Result<Vec<PrincipalConfig>, SettingsError> {
    let mut out: Vec<PrincipalConfig> = Vec::with_capacity(raw.len());
    for (name, p) in raw {
        let key = format!("principals.{name}.key_sha256");
        let hash = parse_sha256(&p.key_sha256)
            .ok_or_else(|| err(&key, "must be 64 hex digits: the SHA-256 of the API key (echo -n KEY | sha256sum)"))?;
        if let Some(other) = out.iter().find(|o| o.key_sha256 == hash) {
            return Err(err(&key, format!("same key as principals.{}; every principal needs its own key", other.name)));
        }
        let budget = nats(&format!("principals.{name}.budget_mi"), &p.budget_mi)?;
        out.push(PrincipalConfig { name, key_sha256: hash, budget });
    }
    Ok(out)
}

fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod test;
