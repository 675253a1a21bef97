//! `pacpriv-bench cluster-load`: the clients of the cluster test
//! (`tests/cluster`), run in a container of their own beside the replicas.
//!
//! Each client sends fresh queries (a unique id and a unique image each) at
//! a steady pace, spread over the replicas, and sees every query through to
//! an outcome the way a careful application would: a retryable status
//! (UNAVAILABLE, DEADLINE_EXCEEDED, a broken connection, RATE_LIMITED) is
//! retried with the *same* query on the next replica — which is what makes
//! a charge whose answer was lost retrievable (the answer cache) — until it
//! is answered, refused for budget, failed for another reason, or the
//! settle time runs out. One JSON line per query goes to standard output
//! (what the client received, from which replica, when), a summary to
//! standard error; the test compares the lines with the database.

use anyhow::Context;
use pacpriv_service::proto::pacpriv::privatizer_client::PrivatizerClient;
use pacpriv_service::proto::pacpriv::{PredictRequest, Tensor};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic_types::StatusExt;

/// Arguments of `cluster-load`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The replicas, `host:port`, comma-separated; query n of client i
    /// goes to replica i + n (round robin), and a retry to the next one.
    #[arg(long, value_delimiter = ',', required = true)]
    pub targets: Vec<String>,
    /// API keys, comma-separated; client i sends key i mod (number of keys).
    #[arg(long, value_delimiter = ',', required = true)]
    pub keys: Vec<String>,
    /// Concurrent clients.
    #[arg(long, default_value_t = 6)]
    pub clients: usize,
    /// New queries are started for this long.
    #[arg(long, default_value_t = 20.0)]
    pub seconds: f64,
    /// Each client starts at most this many new queries a second.
    #[arg(long, default_value_t = 20.0)]
    pub rate: f64,
    /// Query ids start with this (unique per run: the test checks the
    /// journal by id).
    #[arg(long)]
    pub prefix: String,
    /// Retrying a query stops this long after new queries stop; a query
    /// still without an outcome is reported `unresolved`.
    #[arg(long, default_value_t = 60.0)]
    pub settle_seconds: f64,
    /// Each attempt's deadline (grpc-timeout), in milliseconds.
    #[arg(long, default_value_t = 3000)]
    pub timeout_ms: u64,
    /// A client stops at its key's first BUDGET_EXHAUSTED (the race for
    /// the last unit of budget) rather than only at `seconds`.
    #[arg(long)]
    pub until_exhausted: bool,
    /// The CA that signed the replicas' certificates (PEM): the replicas
    /// speak TLS. Absent: plaintext.
    #[arg(long)]
    pub ca: Option<std::path::PathBuf>,
    /// The models asked, comma-separated (no version: each replica's
    /// newest); query n of client i asks model i + n (round robin).
    /// Absent: the default model.
    #[arg(long, value_delimiter = ',')]
    pub models: Vec<String>,
}

/// What one query came to, as one JSON line.
#[derive(Debug, Serialize)]
struct Outcome {
    query_id: String,
    key: String,
    /// "answered", "refused" (BUDGET_EXHAUSTED), "failed" (any other
    /// status a retry does not cure) or "unresolved" (still retrying when
    /// the settle time ran out).
    outcome: &'static str,
    /// The replica that answered (answered) or last refused/failed.
    target: String,
    /// The model asked ("": the default).
    model: String,
    /// The version that answered (answered only).
    model_version: Option<String>,
    label: Option<u32>,
    charged: Option<f64>,
    cached: Option<bool>,
    attempts: u32,
    /// Retryable failures on the way, by "CODE/REASON".
    retried: BTreeMap<String, u32>,
    /// The final status, when not answered.
    status: Option<String>,
    /// Unix milliseconds: first attempt sent, outcome received.
    sent_ms: u64,
    done_ms: u64,
}

/// Runs the clients and writes their outcomes to `out`.
///
/// # Errors
/// Bad arguments (no targets, an unreadable CA).
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    anyhow::ensure!(args.clients > 0 && args.rate > 0.0, "--clients and --rate must be positive");
    anyhow::ensure!(!args.keys.is_empty(), "--keys must name at least one API key");
    let tls = match &args.ca {
        Some(path) => {
            let pem = std::fs::read(path).with_context(|| format!("reading --ca {}", path.display()))?;
            Some(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))
        }
        None => None,
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let lines = runtime.block_on(drive(&args, tls))?;
    let mut totals = BTreeMap::<&str, usize>::new();
    for line in &lines {
        *totals.entry(line.outcome).or_default() += 1;
        serde_json::to_writer(&mut *out, line)?;
        writeln!(out)?;
    }
    out.flush()?;
    eprintln!("cluster-load {}: {} queries {totals:?}", args.prefix, lines.len());
    Ok(())
}

async fn drive(args: &Args, tls: Option<ClientTlsConfig>) -> anyhow::Result<Vec<Outcome>> {
    let mut channels = Vec::new();
    for target in &args.targets {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{target}"))?
            .connect_timeout(Duration::from_secs(1))
            // A replica that vanished (killed, its address gone) is noticed
            // by keepalive instead of a connection hanging.
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(2))
            .keep_alive_while_idle(true);
        if let Some(tls) = &tls {
            let host = target.rsplit_once(':').map_or(target.as_str(), |(h, _)| h);
            endpoint = endpoint.tls_config(tls.clone().domain_name(host))?;
        }
        channels.push((target.clone(), endpoint.connect_lazy()));
    }
    let channels: Arc<[(String, Channel)]> = channels.into();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let stop_new = start + Duration::from_secs_f64(args.seconds);
    let give_up = stop_new + Duration::from_secs_f64(args.settle_seconds);
    let mut clients = tokio::task::JoinSet::new();
    for client in 0..args.clients {
        let ctx = Client {
            id: client,
            key: args.keys[client % args.keys.len()].clone(),
            prefix: args.prefix.clone(),
            models: if args.models.is_empty() { vec![String::new()].into() } else { args.models.clone().into() },
            channels: channels.clone(),
            timeout: Duration::from_millis(args.timeout_ms),
            interval: Duration::from_secs_f64(1.0 / args.rate),
            until_exhausted: args.until_exhausted,
            stop_new,
            give_up,
            lines: lines.clone(),
        };
        clients.spawn(ctx.run(start));
    }
    while let Some(done) = clients.join_next().await {
        done.context("a client task panicked")?;
    }
    let lines = std::mem::take(&mut *lines.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    Ok(lines)
}

struct Client {
    id: usize,
    key: String,
    prefix: String,
    models: Arc<[String]>,
    channels: Arc<[(String, Channel)]>,
    timeout: Duration,
    interval: Duration,
    until_exhausted: bool,
    stop_new: Instant,
    give_up: Instant,
    lines: Arc<Mutex<Vec<Outcome>>>,
}

impl Client {
    async fn run(self, start: Instant) {
        let mut n = 0u64;
        loop {
            let due = start + self.interval.mul_f64(n as f64);
            // A client behind its schedule (answers slower than `rate`)
            // still stops starting queries at `seconds`: it sends as fast
            // as it is answered, never piling up a backlog to burst.
            if due >= self.stop_new || Instant::now() >= self.stop_new {
                return;
            }
            tokio::time::sleep_until(due.into()).await;
            let outcome = self.ask(n).await;
            let exhausted = outcome.outcome == "refused";
            if let Ok(mut lines) = self.lines.lock() {
                lines.push(outcome);
            }
            if exhausted && self.until_exhausted {
                return;
            }
            n += 1;
        }
    }

    /// Query `n` of this client, retried until it has an outcome.
    async fn ask(&self, n: u64) -> Outcome {
        let replicas = self.channels.len();
        let turn = self.id + usize::try_from(n).unwrap_or(0);
        let mut target = turn % replicas;
        let model = self.models[turn % self.models.len()].clone();
        let query_id = format!("{}-c{}-q{n}", self.prefix, self.id);
        let pixels = image(&query_id);
        let mut outcome = Outcome {
            query_id,
            key: self.key.clone(),
            outcome: "unresolved",
            target: String::new(),
            model,
            model_version: None,
            label: None,
            charged: None,
            cached: None,
            attempts: 0,
            retried: BTreeMap::new(),
            status: None,
            sent_ms: unix_ms(),
            done_ms: 0,
        };
        while Instant::now() < self.give_up {
            let (name, channel) = &self.channels[target];
            outcome.attempts += 1;
            outcome.target.clone_from(name);
            let mut request = tonic::Request::new(PredictRequest {
                query_id: outcome.query_id.clone(),
                model: outcome.model.clone(),
                input: Some(Tensor {
                    datatype: "FP32".into(),
                    shape: vec![64],
                    fp32_contents: pixels.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            });
            request.set_timeout(self.timeout);
            if let Ok(key) = self.key.parse() {
                request.metadata_mut().insert("x-api-key", key);
            }
            let mut client = PrivatizerClient::new(channel.clone());
            // grpc-timeout bounds the server; this bounds a connection that
            // never answers at all.
            let reply = tokio::time::timeout(self.timeout + Duration::from_secs(1), client.predict(request)).await;
            let status = match reply {
                Ok(Ok(answer)) => {
                    let answer = answer.into_inner();
                    outcome.outcome = "answered";
                    outcome.label = Some(answer.label);
                    outcome.charged = Some(answer.mi_charged);
                    outcome.cached = Some(answer.cached);
                    outcome.model_version = Some(answer.model_version);
                    break;
                }
                Ok(Err(status)) => status,
                Err(_) => tonic::Status::deadline_exceeded("no reply within the client's own deadline"),
            };
            let reason = status.get_error_details().error_info().map(|i| i.reason.clone()).unwrap_or_default();
            let label = format!("{:?}/{reason}", status.code());
            if reason == "BUDGET_EXHAUSTED" {
                outcome.outcome = "refused";
                outcome.status = Some(label);
                break;
            }
            if !retryable(status.code(), &reason) {
                outcome.outcome = "failed";
                outcome.status = Some(format!("{label}: {}", status.message()));
                break;
            }
            *outcome.retried.entry(label).or_default() += 1;
            target = (target + 1) % replicas;
            let backoff = Duration::from_millis(50 * u64::from(outcome.attempts.min(10)));
            tokio::time::sleep(backoff).await;
        }
        outcome.done_ms = unix_ms();
        outcome
    }
}

/// What a client retries: the server's UNAVAILABLE (teachers or store
/// down, a charge not yet confirmed) and RATE_LIMITED, and whatever a
/// broken connection or a passed deadline looks like from this side (no
/// pacpriv reason: tonic's own statuses).
fn retryable(code: Code, reason: &str) -> bool {
    match code {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => true,
        Code::ResourceExhausted => reason == "RATE_LIMITED",
        Code::Unknown | Code::Internal => reason.is_empty(),
        _ => false,
    }
}

/// 64 pixel counts in 0..=16, a function of the query id: distinct ids
/// give distinct images (so each is a fresh query, never a cached repeat),
/// and a retry sends the same one.
fn image(query_id: &str) -> Vec<f32> {
    let mut state =
        query_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    (0..64)
        .map(|_| {
            // splitmix64
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) % 17) as f32
        })
        .collect()
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
