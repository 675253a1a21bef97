//! The ensemble: the m teachers, asked about a batch of examples at once —
//! one `ModelInfer` per teacher model (all in flight together), or one call
//! to a stacked model that answers for all m — and the replies turned into
//! one [`TeacherOutputs`] per example, in subset order.

use super::FanoutError;
use super::batcher::{AskBatch, Batcher, Batching};
use super::call::{self, CallPolicy, Model};
use super::connection::{self, ClientTls, Connection, Headers};
use crate::metrics::TeacherMetrics;
use ndarray::Array2;
use pacpriv_privacy::mechanism::TeacherOutputs;
use pacpriv_store::{Arrival, Arrivals};
use std::sync::Arc;
use tokio::task::JoinSet;
use tonic::transport::Channel;

/// One served model: where it is served and under which name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TeacherSpec {
    /// gRPC endpoint URI, e.g. `http://127.0.0.1:8001`.
    pub endpoint: String,
    /// Model name on that server.
    pub model: String,
    /// Model version; empty means the server's default.
    pub version: String,
    /// TLS and headers towards the endpoint.
    pub connection: Connection,
}

/// How the m teachers are served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Teachers {
    /// One model per teacher, in subset order: m calls per batch.
    PerTeacher(Vec<TeacherSpec>),
    /// One model that returns every teacher's output for each example
    /// (shape `[n, m]` labels, or `[n, m, d]` scores, teachers in subset
    /// order): one call per batch.
    Stacked {
        /// The ensemble model.
        spec: TeacherSpec,
        /// m.
        models: usize,
    },
}

/// How teacher outputs are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputMode {
    /// A label: a single integer, or the argmax of a score vector.
    Label {
        /// Number of classes d.
        classes: usize,
    },
    /// A score vector of length `dim`.
    Vector {
        /// Output dimension d.
        dim: usize,
    },
}

impl OutputMode {
    /// d: the number of classes, or the length of a score vector (the
    /// length of a release).
    pub fn dim(self) -> usize {
        match self {
            OutputMode::Label { classes } => classes,
            OutputMode::Vector { dim } => dim,
        }
    }

    /// Numbers per (example, teacher) once read: 1 label or d scores.
    fn width(self) -> usize {
        match self {
            OutputMode::Label { .. } => 1,
            OutputMode::Vector { dim } => dim,
        }
    }
}

/// The models and how to read them; shared by the ensemble and its
/// batcher.
pub(super) struct Core {
    /// The m per-teacher models, or the one stacked model.
    models: Vec<Arc<Model>>,
    /// Whether `models` is one stacked model.
    stacked: bool,
    /// m.
    m: usize,
    policy: Arc<CallPolicy>,
    mode: OutputMode,
    metrics: TeacherMetrics,
}

/// The m teachers, in subset order.
pub struct Ensemble {
    core: Arc<Core>,
    /// `None`: every query is asked on its own.
    batcher: Option<Batcher>,
    /// Where an answer is counted on its way to the store.
    arrivals: Arc<Arrivals>,
}

impl Ensemble {
    /// Prepares lazy, persistent channels (one per distinct endpoint; no
    /// connection is made until the first query) and, when `batching` is
    /// enabled, starts the batcher on the current tokio runtime.
    ///
    /// # Errors
    /// [`FanoutError::Endpoint`] for an unparsable endpoint.
    pub fn new(
        teachers: Teachers,
        policy: CallPolicy,
        mode: OutputMode,
        batching: Batching,
        metrics: &TeacherMetrics,
        arrivals: Arc<Arrivals>,
    ) -> Result<Self, FanoutError> {
        let (specs, m, stacked) = match teachers {
            Teachers::PerTeacher(specs) => {
                let m = specs.len();
                (specs, m, false)
            }
            Teachers::Stacked { spec, models } => (vec![spec], models, true),
        };
        let mut channels: Vec<((String, Option<ClientTls>), Channel)> = Vec::new();
        let mut models = Vec::with_capacity(specs.len());
        for spec in specs {
            let key = (spec.endpoint.clone(), spec.connection.tls.clone());
            let channel = match channels.iter().find(|(k, _)| *k == key) {
                Some((_, c)) => c.clone(),
                None => {
                    let c = connection::endpoint(&spec.endpoint, &spec.connection, policy.deadline)?.connect_lazy();
                    channels.push((key, c.clone()));
                    c
                }
            };
            let headers = Headers::new(&spec.endpoint, &spec.connection.headers)?;
            let series = metrics.teacher(&spec.model);
            models.push(Arc::new(Model::new(spec, channel, headers, series)));
        }
        let core = Arc::new(Core { models, stacked, m, policy: Arc::new(policy), mode, metrics: metrics.clone() });
        let batcher = batching.enabled().then(|| Batcher::start(Arc::clone(&core), batching, Arc::clone(&arrivals)));
        Ok(Ensemble { core, batcher, arrivals })
    }

    /// Dials every TLS endpoint once: a certificate that does not verify is
    /// an error naming the endpoint's settings; an endpoint that is merely
    /// down is not (see [`connection::check`]).
    ///
    /// # Errors
    /// [`FanoutError::Connection`].
    pub async fn check_tls(&self) -> Result<(), FanoutError> {
        let mut checked: Vec<(&str, &Connection)> = Vec::new();
        for model in &self.core.models {
            let spec = &model.spec;
            if !checked.iter().any(|(e, c)| *e == spec.endpoint && c.tls == spec.connection.tls) {
                connection::check(&spec.endpoint, &spec.connection, self.core.policy.deadline).await?;
                checked.push((&spec.endpoint, &spec.connection));
            }
        }
        Ok(())
    }

    /// Drops its teachers' metric series (a reload removed its version).
    pub fn forget_series(&self) {
        self.core.metrics.forget(self.core.models.iter().map(|m| m.spec.model.as_str()));
    }

    /// m.
    pub fn len(&self) -> usize {
        self.core.m
    }

    /// How each teacher's output is read.
    pub fn mode(&self) -> OutputMode {
        self.core.mode
    }

    /// Whether there are no teachers (never, once configured).
    pub fn is_empty(&self) -> bool {
        self.core.m == 0
    }

    /// How many teachers do not report their model ready (Open Inference
    /// Protocol `ModelReady`, one attempt each within the deadline); all m
    /// when a stacked model is not ready.
    pub async fn not_ready(&self) -> usize {
        let mut probes = JoinSet::new();
        for model in &self.core.models {
            let (model, deadline) = (Arc::clone(model), self.core.policy.deadline);
            probes.spawn(async move { model.ready(deadline).await });
        }
        let missing = probes.join_all().await.into_iter().filter(|ready| !ready).count();
        if self.core.stacked && missing > 0 { self.core.m } else { missing }
    }

    /// Counts one answer on its way to the store ([`Arrivals`]).
    pub fn arrive(&self) -> Arrival {
        self.arrivals.arrive()
    }

    /// Every teacher's output for one example (`features`, already
    /// validated), in subset order — batched with concurrent queries when
    /// batching is on — and its count on the way to the store, to drop
    /// once its step has queued its record ([`Arrivals`]).
    ///
    /// # Errors
    /// The first teacher that failed all its attempts or answered with an
    /// unusable output (for the whole batch); the remaining calls are
    /// cancelled.
    pub async fn query(&self, features: &[f64]) -> Result<(TeacherOutputs, Arrival), FanoutError> {
        let features: Arc<[f64]> = features.into();
        match &self.batcher {
            Some(batcher) => batcher.query(features).await,
            None => {
                let outputs = self.core.ask(&[features]).await?.pop().ok_or(FanoutError::Stopped)?;
                Ok((outputs, self.arrivals.arrive()))
            }
        }
    }
}

impl AskBatch for Core {
    /// Every teacher's outputs for each of `rows` (all of the service's
    /// input length), one [`TeacherOutputs`] per row, in order.
    async fn ask(&self, rows: &[Arc<[f64]>]) -> Result<Vec<TeacherOutputs>, FanoutError> {
        self.metrics.batch(rows.len());
        let n = rows.len();
        let features: Vec<f64> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        let input = Arc::new(call::input(&features, n, &self.policy));
        let cells = if self.stacked { n * self.m } else { n };
        let mut calls = JoinSet::new();
        for (i, model) in self.models.iter().enumerate() {
            let (model, policy, input) = (Arc::clone(model), Arc::clone(&self.policy), Arc::clone(&input));
            let mode = self.mode;
            let span = tracing::info_span!(crate::trace::TEACHER_CALL, model = %model.spec.model);
            let call = async move { (i, model.ask(&input, cells, &policy, mode).await) };
            calls.spawn(tracing::Instrument::instrument(call, span));
        }
        let mut replies: Vec<Vec<f64>> = vec![Vec::new(); self.models.len()];
        while let Some(joined) = calls.join_next().await {
            // A panicked call task is a teacher that did not answer.
            let (i, reply) = joined.map_err(|e| FanoutError::Unreachable {
                model: "?".into(),
                endpoint: "?".into(),
                attempts: 0,
                reason: e.to_string(),
            })?;
            replies[i] = reply?;
        }
        (0..n).map(|row| self.outputs_of(&replies, row)).collect()
    }
}

impl Core {
    /// Example `row`'s outputs from the replies (each checked by
    /// [`super::call::read_output`] to hold n × per-row cells, so a cell
    /// is never missing unless that check is broken).
    fn outputs_of(&self, replies: &[Vec<f64>], row: usize) -> Result<TeacherOutputs, FanoutError> {
        let width = self.mode.width();
        // Teacher t's cell for `row`: in its own reply (per teacher), or
        // at position t of the row's m cells (stacked).
        let mut flat = Vec::with_capacity(self.m * width);
        for t in 0..self.m {
            let (reply, at) = if self.stacked { (replies.first(), row * self.m + t) } else { (replies.get(t), row) };
            let cell =
                reply.and_then(|r| r.get(at * width..(at + 1) * width)).ok_or_else(|| FanoutError::BadOutput {
                    model: "ensemble".into(),
                    endpoint: String::new(),
                    reason: format!("no output for example {row}, teacher {t}"),
                })?;
            flat.extend_from_slice(cell);
        }
        Ok(match self.mode {
            OutputMode::Label { classes } => {
                TeacherOutputs::Labels { labels: flat.into_iter().map(|l| l as usize).collect(), classes }
            }
            OutputMode::Vector { dim } => {
                TeacherOutputs::Vectors(Array2::from_shape_vec((self.m, dim), flat).map_err(|e| {
                    FanoutError::BadOutput { model: "ensemble".into(), endpoint: String::new(), reason: e.to_string() }
                })?)
            }
        })
    }
}
