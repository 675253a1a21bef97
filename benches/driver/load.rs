//! The closed-loop load generator: N clients, each on its own HTTP/2
//! connection with its own API key (or none), each sending one unary
//! `Predict` at a time and the next as soon as the answer is in. A warm-up
//! (connections, teacher channels, caches) comes first and is not
//! measured; then the clients run until a deadline or until the measured
//! requests reach a cap, and every response is kept for the caller's
//! correctness checks. What the process and the target did over the
//! measured window is observed too ([`super::observe`]).

use super::observe::{MetricsSource, Snapshot, Window};
use anyhow::Context;
use pacpriv_service::proto::pacpriv::privatizer_client::PrivatizerClient;
use pacpriv_service::proto::pacpriv::{PredictRequest, Tensor};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};

/// What to send, to whom, and for how long.
pub struct Plan {
    /// The server's URI (`http://127.0.0.1:PORT`).
    pub uri: String,
    /// One entry per client: the API key it sends, if any.
    pub keys: Vec<Option<String>>,
    /// The images sent (64 raw pixel counts each), cycled; client i
    /// starts at its own offset so the clients do not ask in lockstep.
    pub images: Arc<[Vec<f32>]>,
    /// Unmeasured time first.
    pub warmup: Duration,
    /// Measured time after it.
    pub measure: Duration,
    /// At most this many measured requests in all.
    pub max_requests: Option<u64>,
    /// Where the target's metrics are read at the start and end of the
    /// measured phase.
    pub metrics: MetricsSource,
    /// Query ids are `{ids}-{client}-{n}`: runs against one session need
    /// their own, or a later run's queries are the earlier run's repeats.
    pub ids: String,
}

/// One answer a client received (warm-up included).
#[derive(Clone, Debug)]
pub struct Answer {
    /// Index into [`Plan::images`].
    pub image: usize,
    /// The label released.
    pub label: u32,
    /// Whether the server said the teachers were unanimous.
    pub unanimous: bool,
    /// MI the server says it charged, nats.
    pub mi_charged: f64,
}

/// What one client saw.
#[derive(Debug, Default)]
pub struct ClientRun {
    /// Every answer, warm-up included, in order.
    pub answers: Vec<Answer>,
    /// Latency of each answer of the measured phase.
    pub latencies: Vec<Duration>,
    /// Failed requests of the measured phase, by gRPC code.
    pub errors: BTreeMap<String, u64>,
    /// Failed requests of the warm-up.
    pub warmup_errors: u64,
    /// When its last measured request finished.
    last_done: Option<Instant>,
}

/// A whole run: per client, and the measured phase's length.
#[derive(Debug)]
pub struct Run {
    /// In the order of [`Plan::keys`].
    pub clients: Vec<ClientRun>,
    /// From the start of the measured phase to the last measured answer
    /// (or error).
    pub elapsed: Duration,
    /// CPU use and the target's batch sizes over the measured phase.
    pub observed: Window,
}

impl Run {
    /// Measured answers.
    pub fn answered(&self) -> u64 {
        self.clients.iter().map(|c| c.latencies.len() as u64).sum()
    }

    /// Measured failures, by gRPC code.
    pub fn errors(&self) -> BTreeMap<String, u64> {
        let mut all = BTreeMap::new();
        for (code, n) in self.clients.iter().flat_map(|c| &c.errors) {
            *all.entry(code.clone()).or_insert(0) += n;
        }
        all
    }

    /// Measured answers per second.
    pub fn throughput(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 { self.answered() as f64 / secs } else { 0.0 }
    }

    /// Latency percentiles (nearest rank) of the measured answers, for
    /// each `p` in (0, 1]; `None` without answers.
    pub fn percentiles(&self, ps: &[f64]) -> Option<Vec<Duration>> {
        let mut all: Vec<Duration> = self.clients.iter().flat_map(|c| c.latencies.iter().copied()).collect();
        if all.is_empty() {
            return None;
        }
        all.sort_unstable();
        let n = all.len();
        Some(ps.iter().map(|p| all[((p * n as f64).ceil() as usize).clamp(1, n) - 1]).collect())
    }
}

/// When the phases start and end, and the cap shared by all clients.
struct Schedule {
    measure_from: Instant,
    end: Instant,
    tickets: AtomicU64,
    max_requests: Option<u64>,
}

impl Schedule {
    /// Whether a request may start now, and whether it is measured.
    fn admit(&self, now: Instant) -> Option<bool> {
        if now >= self.end {
            return None;
        }
        if now < self.measure_from {
            return Some(false);
        }
        match self.max_requests {
            Some(max) if self.tickets.fetch_add(1, Ordering::Relaxed) >= max => None,
            _ => Some(true),
        }
    }
}

/// Connects every client, then runs the plan.
///
/// # Errors
/// A client could not connect or a key is not valid metadata; failed
/// requests are counted, not returned.
pub async fn run(plan: Plan) -> anyhow::Result<Run> {
    let mut clients = Vec::with_capacity(plan.keys.len());
    for key in &plan.keys {
        let channel = Endpoint::from_shared(plan.uri.clone())
            .with_context(|| format!("{} is not a valid URI", plan.uri))?
            .tcp_nodelay(true)
            .connect()
            .await
            .with_context(|| format!("connecting to {}", plan.uri))?;
        let key = key.as_deref().map(MetadataValue::try_from).transpose().context("an API key is not ASCII")?;
        clients.push((PrivatizerClient::new(channel), key));
    }
    let start = Instant::now();
    let schedule = Arc::new(Schedule {
        measure_from: start + plan.warmup,
        end: start + plan.warmup + plan.measure,
        tickets: AtomicU64::new(0),
        max_requests: plan.max_requests,
    });
    let n = clients.len().max(1);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (client, key)) in clients.into_iter().enumerate() {
        let (images, schedule) = (Arc::clone(&plan.images), Arc::clone(&schedule));
        let offset = i * images.len() / n;
        let ids = format!("{}-{i}", plan.ids);
        tasks.spawn(async move { (i, closed_loop(&ids, client, key, images, offset, &schedule).await) });
    }
    tokio::time::sleep_until(schedule.measure_from.into()).await;
    let before = Snapshot::take(&plan.metrics).await;
    let mut runs: Vec<Option<ClientRun>> = (0..n).map(|_| None).collect();
    while let Some(joined) = tasks.join_next().await {
        let (i, run) = joined.context("a load client panicked")?;
        runs[i] = Some(run);
    }
    let observed = Window::between(&before, &Snapshot::take(&plan.metrics).await);
    let clients: Vec<ClientRun> = runs.into_iter().flatten().collect();
    let last = clients.iter().filter_map(|c| c.last_done).max().unwrap_or(schedule.measure_from);
    Ok(Run { clients, elapsed: last.saturating_duration_since(schedule.measure_from), observed })
}

/// One client: a request, its answer, the next request.
async fn closed_loop(
    ids: &str,
    mut client: PrivatizerClient<Channel>,
    key: Option<MetadataValue<Ascii>>,
    images: Arc<[Vec<f32>]>,
    offset: usize,
    schedule: &Schedule,
) -> ClientRun {
    let mut run = ClientRun::default();
    for k in 0.. {
        let started = Instant::now();
        let Some(measured) = schedule.admit(started) else { break };
        let image = (offset + k) % images.len().max(1);
        let mut request = tonic::Request::new(PredictRequest {
            query_id: format!("{ids}-{k}"),
            input: Some(Tensor {
                datatype: "FP32".into(),
                shape: vec![images.get(image).map_or(0, Vec::len) as i64],
                fp32_contents: images.get(image).cloned().unwrap_or_default(),
                ..Default::default()
            }),
            ..Default::default()
        });
        if let Some(key) = &key {
            request.metadata_mut().insert("x-api-key", key.clone());
        }
        let result = client.predict(request).await;
        let done = Instant::now();
        match result {
            Ok(response) => {
                let r = response.into_inner();
                run.answers.push(Answer { image, label: r.label, unanimous: r.unanimous, mi_charged: r.mi_charged });
                if measured {
                    run.latencies.push(done - started);
                }
            }
            Err(status) if measured => *run.errors.entry(format!("{:?}", status.code())).or_insert(0) += 1,
            Err(_) => run.warmup_errors += 1,
        }
        if measured {
            run.last_done = Some(done);
        }
    }
    run
}
