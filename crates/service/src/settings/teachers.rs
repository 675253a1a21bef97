//! `[model]` and `[teachers]` (with its `remote` list, `stacked`, or
//! `[demo]`): what the model answers, where the m teachers are, how their
//! outputs are read, and how each is called and batched.

use super::parse::{SettingsError, addr, choice, err};
use super::server::{MAX_BATCH, MAX_FEATURES};
use crate::teachers::connection::{ClientTls, Connection, Header};
use crate::teachers::{Batching, CallPolicy, OutputMode, TeacherSpec, Teachers};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Why `teachers.source = "demo"` is refused by a build without the demo.
pub const NO_DEMO: &str = "\"demo\" needs the demo teachers, and this binary was built without them \
    (cargo feature `demo`, on by default): name your teachers in teachers.remote or teachers.stacked \
    with teachers.source = \"remote\", or build with default features";

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
        /// What each teacher is.
        learner: DemoLearner,
        /// L2 penalty of each teacher's fit (the logistic learner's).
        regularisation: f64,
        /// Canaries planted in the training split (audits only; 0: none).
        canaries: usize,
    },
    /// Already-running Open Inference Protocol models.
    Remote(Teachers),
}

impl TeacherSource {
    /// m: how many teachers, one per subset.
    pub fn m(&self) -> usize {
        match self {
            TeacherSource::Demo { models, .. } => *models,
            TeacherSource::Remote(Teachers::PerTeacher(specs)) => specs.len(),
            TeacherSource::Remote(Teachers::Stacked { models, .. }) => *models,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModel {
    #[serde(deserialize_with = "choice")]
    pub(super) mode: Mode,
    pub(super) classes: usize,
    pub(super) input_shape: Vec<usize>,
}

/// `model.mode`.
#[derive(Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum Mode {
    Label,
    Vector,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTeachers {
    #[serde(deserialize_with = "choice")]
    pub(super) source: Source,
    pub(super) deadline_ms: u64,
    pub(super) retries: u32,
    pub(super) input_name: String,
    #[serde(deserialize_with = "choice")]
    pub(super) input_datatype: Datatype,
    pub(super) output_name: String,
    pub(super) health_interval_ms: u64,
    pub(super) batch_window_ms: u64,
    pub(super) max_batch: usize,
    #[serde(deserialize_with = "choice")]
    pub(super) layout: Layout,
    pub(super) remote: Vec<RawRemote>,
    pub(super) stacked: RawStacked,
    pub(super) allow_plaintext_credentials: bool,
}

/// One entry of `teachers.remote`: a model, and how to reach its endpoint
/// (TLS and headers, all optional; the same fields as [`RawStacked`]'s —
/// listed in each, because serde cannot refuse unknown fields through a
/// flattened struct).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRemote {
    pub(super) endpoint: String,
    pub(super) model: String,
    #[serde(default)]
    pub(super) version: String,
    #[serde(default)]
    pub(super) ca_file: String,
    #[serde(default)]
    pub(super) cert_file: String,
    #[serde(default)]
    pub(super) key_file: String,
    #[serde(default)]
    pub(super) server_name: String,
    #[serde(default)]
    pub(super) headers: Vec<RawHeader>,
}

/// TLS and headers towards a teacher endpoint.
pub(super) struct RawConnection {
    /// `teachers.allow_plaintext_credentials`.
    pub(super) plaintext_ok: bool,
    pub(super) ca_file: String,
    pub(super) cert_file: String,
    pub(super) key_file: String,
    pub(super) server_name: String,
    pub(super) headers: Vec<RawHeader>,
}

/// A request header; its value from a file or an environment variable.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHeader {
    pub(super) name: String,
    #[serde(default)]
    pub(super) value_file: String,
    #[serde(default)]
    pub(super) value_env: String,
    /// Put before the secret, e.g. `"Bearer "` (not secret itself).
    #[serde(default)]
    pub(super) prefix: String,
    /// Refused: only so that the error can say why.
    #[serde(default)]
    pub(super) value: Option<String>,
}

impl RawConnection {
    /// The connection of the endpoint at `key` (`teachers.remote[i]`):
    /// files read, secrets fetched, combinations checked.
    pub(super) fn validate(self, key: &str, endpoint: &str) -> Result<Connection, SettingsError> {
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
pub(super) enum Source {
    Demo,
    Remote,
}

/// `teachers.layout`.
#[derive(Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum Layout {
    PerTeacher,
    Stacked,
}

/// `teachers.input_datatype`: what the teachers are sent.
#[derive(Clone, Copy, Deserialize, PartialEq, Eq)]
pub(super) enum Datatype {
    #[serde(rename = "FP32")]
    Fp32,
    #[serde(rename = "FP64")]
    Fp64,
}

impl Datatype {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Datatype::Fp32 => "FP32",
            Datatype::Fp64 => "FP64",
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStacked {
    pub(super) endpoint: String,
    pub(super) model: String,
    // Defaulted here too: a model's `teachers.stacked` replaces
    // `[teachers]`'s table whole, without the shipped default's keys.
    #[serde(default)]
    pub(super) version: String,
    pub(super) models: usize,
    #[serde(default)]
    pub(super) ca_file: String,
    #[serde(default)]
    pub(super) cert_file: String,
    #[serde(default)]
    pub(super) key_file: String,
    #[serde(default)]
    pub(super) server_name: String,
    #[serde(default)]
    pub(super) headers: Vec<RawHeader>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDemo {
    pub(super) models: usize,
    pub(super) seed: u64,
    pub(super) listen: String,
    #[serde(deserialize_with = "choice")]
    pub(super) learner: DemoLearner,
    pub(super) regularisation: f64,
    pub(super) canaries: usize,
    pub(super) naive_bayes_model: String,
}

/// `demo.learner`: what each demo teacher is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DemoLearner {
    /// Multinomial logistic regression (`demo.regularisation` its L2
    /// penalty).
    Logistic,
    /// Gaussian naive Bayes: trains in milliseconds, less accurate.
    NaiveBayes,
}

#[cfg(feature = "demo")]
impl DemoLearner {
    /// The demo crate's learner, a logistic one with the L2 penalty
    /// `regularisation` (`demo.regularisation`): what the server trains,
    /// and what a tool rebuilding its teachers trains.
    pub fn with(self, regularisation: f64) -> pacpriv_demo::Learner {
        match self {
            DemoLearner::Logistic => pacpriv_demo::Learner::Logistic { regularisation },
            DemoLearner::NaiveBayes => pacpriv_demo::Learner::NaiveBayes,
        }
    }
}

/// m teachers, one per half of the data split into pairs: even, at least 2.
pub(super) fn teacher_count(key: &str, m: usize) -> Result<(), SettingsError> {
    if m < 2 || !m.is_multiple_of(2) {
        return Err(err(key, "must be m, the number of teachers: even and at least 2"));
    }
    Ok(())
}

impl RawModel {
    pub(super) fn validate(self) -> Result<(OutputMode, Vec<usize>), SettingsError> {
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
    pub(super) fn validate(self, demo: RawDemo) -> Result<Fanout, SettingsError> {
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
            Source::Demo if !cfg!(feature = "demo") => return Err(err("teachers.source", NO_DEMO)),
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
                    learner: demo.learner,
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
pub(super) struct Fanout {
    pub(super) teachers: TeacherSource,
    pub(super) call: CallPolicy,
    pub(super) batching: Batching,
    pub(super) health_interval: Duration,
}
