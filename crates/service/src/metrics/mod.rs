//! Prometheus metrics: every series the service exports, defined in one
//! place and registered into one registry, and the HTTP endpoint that
//! serves them ([`http`]).
//!
//! Recording is split by who records: [`ServiceMetrics`] (the RPC layer),
//! [`TeacherMetrics`] (the fan-out), [`CommitMetrics`] (the stores' commits). Each is
//! cheap to clone (the metric types are shared handles) and works
//! unregistered, so tests and tools can build components without a
//! registry.
//!
//! # Invariants
//! - No series, label or value depends on the secret index: every query
//!   asks every teacher, so per-teacher latency and error series are the
//!   same whatever s* is; budget gauges show what each principal is already
//!   told in its responses; a step's calibration time depends on the
//!   posterior and the outputs, never on which teacher's output the noise
//!   is centred on (`docs/assurance/accounting.md` §1.5).
//! - Label values come from closed sets (outcomes, RPCs, stages, error
//!   kinds), from the m configured teacher names, or from principal names — at most
//!   `metrics.max_principal_series` of them; the rest are only counted.
//!   Never session ids, query ids or API keys.
//! - A request records without building a label: the series of closed
//!   label sets are resolved when the metrics are built, a model
//!   version's on its first answer and kept by the version
//!   ([`ServiceMetrics::model_answers`]), and a principal's budget gauges
//!   on its first answer, found again by name under one lock (issue 70:
//!   label strings and hashing were a few µs of every answer).

pub mod http;

use pacpriv_store::{CommitObserver, StoreMetrics};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

/// Declares a closed label set from one list: the enum, `ALL` (every
/// variant in declaration order, so `x as usize` indexes an array of its
/// series) and `as_str` (its label), so that the three cannot drift apart.
macro_rules! closed_set {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $($(#[$doc:meta])* $variant:ident => $label:literal,)+
        }
    ) => {
        $(#[$meta])*
        pub enum $name {
            $($(#[$doc])* $variant,)+
        }

        impl $name {
            /// Every one, in declaration order (`x as usize` is its place).
            const ALL: [$name; [$($label),+].len()] = [$($name::$variant),+];

            /// Its metric label (and span field).
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)+
                }
            }
        }
    };
}

closed_set! {
    /// What became of a query (one per Predict, or per request of a stream).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Outcome {
        /// Released (and charged as the policy says).
        Answered => "answered",
        /// Refused: the budget cannot pay.
        RefusedBudget => "refused_budget",
        /// Refused: the principal's rate limit.
        RefusedRate => "refused_rate",
        /// Refused: the teachers disagree (policy `unanimous_only`).
        RefusedContested => "refused_contested",
        /// Malformed input or a bad argument.
        Invalid => "invalid",
        /// No or unknown credential.
        Unauthenticated => "unauthenticated",
        /// A teacher did not answer.
        TeacherUnavailable => "teacher_unavailable",
        /// Anything else (store, internal).
        Internal => "internal",
    }
}

closed_set! {
    /// The RPCs whose latency is recorded.
    #[derive(Clone, Copy, Debug)]
    pub enum Rpc {
        /// `Predict`.
        Predict => "predict",
        /// One request of `PredictStream`.
        PredictStream => "predict_stream",
        /// `GetBudget`.
        GetBudget => "get_budget",
        /// Open Inference Protocol `ModelInfer` on the private model.
        ModelInfer => "model_infer",
        /// The same over HTTP/REST (`POST /v2/models/{model}/infer`).
        HttpInfer => "http_infer",
    }
}

closed_set! {
    /// The stages of an answer whose latency is recorded apart, so an
    /// operator sees where a request's time goes.
    #[derive(Clone, Copy, Debug)]
    pub enum Stage {
        /// From arrival until admitted: decoding and validation, the rate
        /// limit (including pacing a stream), and the session's preflight read.
        Admission => "admission",
        /// Asking all m teachers (only requests with a row the session has not
        /// answered before).
        Fanout => "fanout",
        /// The step of Algorithm 1: waiting for the session, calibration, the
        /// draw, the charge, the record queued.
        Calibration => "calibration",
        /// Waiting until the step's record is durable.
        DurableCharge => "durable_charge",
    }
}

/// How a teacher call failed.
#[derive(Clone, Copy, Debug)]
pub enum TeacherError {
    /// No answer within the deadline.
    Timeout,
    /// An error status or a broken connection.
    Unavailable,
    /// An answer that is not a usable label or score vector.
    Malformed,
}

/// Every kind, each a series from a teacher's first call on.
const ERROR_KINDS: [TeacherError; 3] = [TeacherError::Timeout, TeacherError::Unavailable, TeacherError::Malformed];

impl TeacherError {
    fn as_str(self) -> &'static str {
        match self {
            TeacherError::Timeout => "timeout",
            TeacherError::Unavailable => "unavailable",
            TeacherError::Malformed => "malformed",
        }
    }
}

/// A private model version (configured names: at most 16 models and 15
/// more versions, so the series are bounded).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabel {
    model: String,
    version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabel {
    rpc: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PrincipalLabel {
    principal: String,
    dataset: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TeacherLabel {
    model: String,
    version: String,
    teacher: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TeacherErrorLabels {
    model: String,
    version: String,
    teacher: String,
    kind: &'static str,
}

type FloatGauge = Gauge<f64, AtomicU64>;
type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Latency buckets from 0.1 ms to ~26 s.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(1e-4, 4.0, 10))
}

/// Stage latency buckets from 10 µs (a step's calibration) to ~42 s.
fn stage_latency() -> Histogram {
    Histogram::new(exponential_buckets(1e-5, 4.0, 12))
}

/// Batch-size buckets 1 … 4096.
fn batch_sizes() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 13))
}

/// Recorded by the RPC layer.
#[derive(Clone)]
pub struct ServiceMetrics {
    queries: Family<OutcomeLabel, Counter>,
    /// `queries`' series, by `Outcome as usize`.
    outcomes: [Counter; Outcome::ALL.len()],
    by_model: Family<ModelLabel, Counter>,
    unanimous: Counter,
    cache_hits: Counter,
    cache_misses: Counter,
    mi_charged: Counter<f64, AtomicU64>,
    duration: Histograms<RpcLabel>,
    /// `duration`'s series, by `Rpc as usize`.
    rpcs: [Histogram; Rpc::ALL.len()],
    stages: Histograms<StageLabel>,
    /// `stages`' series, by `Stage as usize`.
    stage_series: [Histogram; Stage::ALL.len()],
    spent: Family<PrincipalLabel, FloatGauge>,
    limit: Family<PrincipalLabel, FloatGauge>,
    mia: Family<PrincipalLabel, FloatGauge>,
    principals: Gauge,
    dropped: Gauge,
    reloads: Family<OutcomeLabel, Counter>,
    budgets: Arc<Mutex<Budgets>>,
}

/// Which principals have budget series (their gauges), and which were
/// turned away.
struct Budgets {
    max: usize,
    /// By dataset, then principal: its gauges, or `None` when it came
    /// beyond `max` (counted in `dropped`).
    series: HashMap<String, HashMap<String, Option<BudgetGauges>>>,
    with: usize,
    without: usize,
}

/// One principal's budget series in one dataset.
struct BudgetGauges {
    spent: FloatGauge,
    limit: FloatGauge,
    mia: FloatGauge,
}

impl BudgetGauges {
    fn set(&self, spent: f64, limit: f64, mia_bound: f64) {
        self.spent.set(spent);
        self.limit.set(limit);
        self.mia.set(mia_bound);
    }
}

impl ServiceMetrics {
    fn new(max_principal_series: usize) -> Self {
        // Every series of a closed label set exists from the start (at 0),
        // so rates and alerts work before the first event of each kind.
        let queries: Family<OutcomeLabel, Counter> = Family::default();
        let outcomes = Outcome::ALL.map(|o| queries.get_or_create(&OutcomeLabel { outcome: o.as_str() }).clone());
        let duration: Histograms<RpcLabel> = Family::new_with_constructor(latency);
        let rpcs = Rpc::ALL.map(|r| duration.get_or_create(&RpcLabel { rpc: r.as_str() }).clone());
        let stages: Histograms<StageLabel> = Family::new_with_constructor(stage_latency);
        let stage_series = Stage::ALL.map(|s| stages.get_or_create(&StageLabel { stage: s.as_str() }).clone());
        let m = ServiceMetrics {
            queries,
            outcomes,
            by_model: Family::default(),
            unanimous: Counter::default(),
            cache_hits: Counter::default(),
            cache_misses: Counter::default(),
            mi_charged: Counter::default(),
            duration,
            rpcs,
            stages,
            stage_series,
            spent: Family::default(),
            limit: Family::default(),
            mia: Family::default(),
            principals: Gauge::default(),
            dropped: Gauge::default(),
            reloads: Family::default(),
            budgets: Arc::new(Mutex::new(Budgets {
                max: max_principal_series,
                series: HashMap::new(),
                with: 0,
                without: 0,
            })),
        };
        for outcome in ["applied", "rejected"] {
            drop(m.reloads.get_or_create(&OutcomeLabel { outcome }));
        }
        m
    }

    fn register(&self, r: &mut Registry) {
        r.register("pacpriv_queries", "Queries by outcome", self.queries.clone());
        r.register(
            "pacpriv_model_answers",
            "Answers released, by the model and version that gave them (fresh or from the cache)",
            self.by_model.clone(),
        );
        r.register("pacpriv_answers_unanimous", "Answers on which all teachers agreed", self.unanimous.clone());
        r.register(
            "pacpriv_answer_cache_hits",
            "Answers returned again from the session's cache (no charge, no new noise)",
            self.cache_hits.clone(),
        );
        r.register("pacpriv_answer_cache_misses", "Answers computed afresh", self.cache_misses.clone());
        r.register("pacpriv_mi_charged_nats", "Mutual information charged, nats", self.mi_charged.clone());
        r.register_with_unit(
            "pacpriv_request_duration",
            "Time from request to response, by RPC",
            Unit::Seconds,
            self.duration.clone(),
        );
        r.register_with_unit(
            "pacpriv_stage_duration",
            "Time an answer spent in each stage: admission, fanout (teachers), calibration (the step), \
             durable_charge (the store)",
            Unit::Seconds,
            self.stages.clone(),
        );
        r.register("pacpriv_budget_spent_nats", "MI spent by a principal's session, nats", self.spent.clone());
        r.register("pacpriv_budget_limit_nats", "MI limit of a principal's session, nats", self.limit.clone());
        r.register("pacpriv_mia_bound", "Membership-inference success bound at the MI spent", self.mia.clone());
        r.register("pacpriv_principals", "Active (not revoked) principals", self.principals.clone());
        r.register(
            "pacpriv_config_reloads",
            "Configuration reloads (SIGHUP): applied, or rejected with the running configuration kept",
            self.reloads.clone(),
        );
        r.register(
            "pacpriv_principal_series_dropped",
            "Principals without budget series (beyond metrics.max_principal_series)",
            self.dropped.clone(),
        );
    }

    /// Counts one query's outcome.
    pub fn query(&self, outcome: Outcome) {
        self.outcomes[outcome as usize].inc();
    }

    /// Counts one released answer.
    pub fn answered(&self, unanimous: bool, charge: f64, cached: bool) {
        self.query(Outcome::Answered);
        if cached {
            self.cache_hits.inc();
            return;
        }
        self.cache_misses.inc();
        if unanimous {
            self.unanimous.inc();
        }
        self.mi_charged.inc_by(charge);
    }

    /// The counter of answers released by `version` of `model`, for the
    /// version to keep (it counts by `inc_by`).
    pub fn model_answers(&self, model: &str, version: &str) -> Counter {
        let label = ModelLabel { model: model.to_owned(), version: version.to_owned() };
        self.by_model.get_or_create(&label).clone()
    }

    /// Drops the series of `version` of `model` (a reload removed it).
    pub fn forget_model(&self, model: &str, version: &str) {
        self.by_model.remove(&ModelLabel { model: model.to_owned(), version: version.to_owned() });
    }

    /// Records an RPC's latency.
    pub fn duration(&self, rpc: Rpc, seconds: f64) {
        self.rpcs[rpc as usize].observe(seconds);
    }

    /// Records how long an answer spent in `stage`.
    pub fn stage(&self, stage: Stage, seconds: f64) {
        self.stage_series[stage as usize].observe(seconds);
    }

    /// Sets the budget gauges of `principal`'s session in `dataset` (or
    /// of the shared one, `principal` = `*global*`) — MI `spent` of
    /// `limit` nats, and the MIA bound at `spent` — or counts it as
    /// dropped when the series limit is reached.
    pub fn budget(&self, principal: &str, dataset: &str, spent: f64, limit: f64, mia_bound: f64) {
        let Ok(mut budgets) = self.budgets.lock() else { return };
        let b = &mut *budgets;
        if let Some(known) = b.series.get(dataset).and_then(|d| d.get(principal)) {
            if let Some(gauges) = known {
                gauges.set(spent, limit, mia_bound);
            }
            return;
        }
        let gauges = (b.with < b.max).then(|| {
            let label = PrincipalLabel { principal: principal.to_owned(), dataset: dataset.to_owned() };
            BudgetGauges {
                spent: self.spent.get_or_create(&label).clone(),
                limit: self.limit.get_or_create(&label).clone(),
                mia: self.mia.get_or_create(&label).clone(),
            }
        });
        match &gauges {
            Some(gauges) => {
                b.with += 1;
                gauges.set(spent, limit, mia_bound);
            }
            None => {
                b.without += 1;
                self.dropped.set(i64::try_from(b.without).unwrap_or(i64::MAX));
            }
        }
        b.series.entry(dataset.to_owned()).or_default().insert(principal.to_owned(), gauges);
    }

    /// Counts one configuration reload, applied or rejected.
    pub fn reload(&self, applied: bool) {
        let outcome = if applied { "applied" } else { "rejected" };
        self.reloads.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    /// Sets the number of active principals.
    pub fn principals(&self, active: usize) {
        self.principals.set(i64::try_from(active).unwrap_or(i64::MAX));
    }
}

/// Recorded by the fan-out, per teacher (of the model
/// [`TeacherMetrics::of_model`] names: two models' teachers may have the
/// same names at different endpoints, as the demo's have).
#[derive(Clone)]
pub struct TeacherMetrics {
    /// The model version whose teachers these series are.
    model: Arc<str>,
    version: Arc<str>,
    duration: Histograms<TeacherLabel>,
    batch: Histogram,
    errors: Family<TeacherErrorLabels, Counter>,
    ready: Gauge,
    total: Gauge,
}

impl Default for TeacherMetrics {
    fn default() -> Self {
        TeacherMetrics {
            model: "".into(),
            version: "".into(),
            duration: Family::new_with_constructor(latency),
            batch: batch_sizes(),
            errors: Family::default(),
            ready: Gauge::default(),
            total: Gauge::default(),
        }
    }
}

/// One teacher's series, resolved once so a call records without a map
/// lookup.
#[derive(Clone)]
pub struct TeacherSeries {
    model: String,
    version: String,
    name: String,
    duration: Histogram,
    errors: Family<TeacherErrorLabels, Counter>,
}

impl TeacherSeries {
    /// Records one successful call's latency.
    pub fn call(&self, seconds: f64) {
        self.duration.observe(seconds);
    }

    /// Counts one failed attempt.
    pub fn error(&self, kind: TeacherError) {
        let (model, version, teacher) = (self.model.clone(), self.version.clone(), self.name.clone());
        let labels = TeacherErrorLabels { model, version, teacher, kind: kind.as_str() };
        self.errors.get_or_create(&labels).inc();
    }
}

impl TeacherMetrics {
    fn register(&self, r: &mut Registry) {
        r.register_with_unit(
            "pacpriv_teacher_call_duration",
            "Latency of successful teacher calls (ModelInfer), by teacher model",
            Unit::Seconds,
            self.duration.clone(),
        );
        r.register(
            "pacpriv_teacher_batch_size",
            "Queries asked together in one fan-out (dynamic batching; 1 when off)",
            self.batch.clone(),
        );
        r.register("pacpriv_teacher_errors", "Failed teacher call attempts, by teacher and kind", self.errors.clone());
        r.register(
            "pacpriv_teachers_ready",
            "Teachers whose model reported ready at the last probe",
            self.ready.clone(),
        );
        r.register("pacpriv_teachers", "Configured teachers (every model's m)", self.total.clone());
    }

    /// The same series, for the teachers of `version` of the private
    /// model `model`.
    pub fn of_model(&self, model: &str, version: &str) -> TeacherMetrics {
        TeacherMetrics { model: model.into(), version: version.into(), ..self.clone() }
    }

    /// The series of the teacher serving `teacher` (its error counters
    /// start at 0).
    pub fn teacher(&self, teacher: &str) -> TeacherSeries {
        let duration = self.duration.get_or_create(&self.label(teacher)).clone();
        for kind in ERROR_KINDS {
            drop(self.errors.get_or_create(&self.error_labels(teacher, kind)));
        }
        let (model, version) = (self.model.to_string(), self.version.to_string());
        TeacherSeries { model, version, name: teacher.to_owned(), duration, errors: self.errors.clone() }
    }

    /// Drops the series of `teachers`, the teachers of this model version
    /// (a reload removed it).
    pub fn forget<'a>(&self, teachers: impl IntoIterator<Item = &'a str>) {
        for teacher in teachers {
            self.duration.remove(&self.label(teacher));
            for kind in ERROR_KINDS {
                self.errors.remove(&self.error_labels(teacher, kind));
            }
        }
    }

    fn label(&self, teacher: &str) -> TeacherLabel {
        TeacherLabel { model: self.model.to_string(), version: self.version.to_string(), teacher: teacher.to_owned() }
    }

    fn error_labels(&self, teacher: &str, kind: TeacherError) -> TeacherErrorLabels {
        let (model, version) = (self.model.to_string(), self.version.to_string());
        TeacherErrorLabels { model, version, teacher: teacher.to_owned(), kind: kind.as_str() }
    }

    /// Records one fan-out of `queries` queries.
    pub fn batch(&self, queries: usize) {
        self.batch.observe(queries as f64);
    }

    /// Records a readiness probe: `ready` of `total` teachers.
    pub fn readiness(&self, ready: usize, total: usize) {
        self.ready.set(i64::try_from(ready).unwrap_or(i64::MAX));
        self.total.set(i64::try_from(total).unwrap_or(i64::MAX));
    }
}

/// Recorded by the stores, per commit (what [`StoreMetrics`], the store's
/// handle, reports to).
#[derive(Clone)]
pub struct CommitMetrics {
    duration: Histogram,
    batch: Histogram,
}

impl Default for CommitMetrics {
    fn default() -> Self {
        CommitMetrics { duration: latency(), batch: batch_sizes() }
    }
}

impl CommitMetrics {
    fn register(&self, r: &mut Registry) {
        r.register_with_unit(
            "pacpriv_store_commit_duration",
            "Time to make a commit durable (embedded: one group commit; PostgreSQL: one step's transaction)",
            Unit::Seconds,
            self.duration.clone(),
        );
        r.register("pacpriv_store_commit_batch_size", "Session records per commit", self.batch.clone());
    }
}

impl CommitObserver for CommitMetrics {
    fn commit(&self, seconds: f64, records: usize) {
        self.duration.observe(seconds);
        self.batch.observe(records as f64);
    }
}

/// Every metric of the service, registered.
pub struct Metrics {
    /// RPC layer.
    pub service: ServiceMetrics,
    /// Fan-out.
    pub teachers: TeacherMetrics,
    /// Stores: a handle to [`CommitMetrics`], for the backends.
    pub store: StoreMetrics,
    registry: Registry,
}

impl Metrics {
    /// Creates and registers every series.
    pub fn new(max_principal_series: usize) -> Self {
        let (service, teachers, commits) =
            (ServiceMetrics::new(max_principal_series), TeacherMetrics::default(), CommitMetrics::default());
        let mut registry = Registry::default();
        service.register(&mut registry);
        teachers.register(&mut registry);
        commits.register(&mut registry);
        Metrics { service, teachers, store: StoreMetrics::new(Arc::new(commits)), registry }
    }

    /// The Prometheus text exposition of every series.
    ///
    /// # Errors
    /// Formatting failed (never for these types, but the encoder says so).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod test;
