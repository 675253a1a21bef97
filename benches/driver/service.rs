//! `pacpriv-bench service`: the privatizer's throughput and latency beside
//! a plain fan-out proxy's, measured in one run against the same teachers.
//!
//! One process: the demo ensemble is trained once and served over loopback
//! gRPC on a runtime of its own (as a separate teacher server would be);
//! then each target in turn is started on a fresh runtime and a free
//! port, and is loaded by N closed-loop clients (`load`, on a
//! runtime of their own) for a fixed time or number of answers. The
//! targets are the real service ([`pacpriv_service::start::serve`], fresh embedded
//! store, N provisioned principals) and the baseline (`proxy`);
//! both build their fan-out from the same [`Settings`], so configuration
//! overrides (the process environment's `PACPRIV__…`, then the target's
//! own) apply to both alike. `report` writes the Markdown.
//!
//! Every answer is also checked (labels, majority votes, unanimity,
//! charges, per-principal answer counts against `GetBudget`), and any
//! violation fails the command after the report: a throughput earned by
//! wrong answers is no throughput. `--smoke` makes the run small enough
//! for CI; nothing here ever asserts on timing.

use super::load;
use super::observe::MetricsSource;
use super::plan::{Kind, Knobs, Measured, TARGETS, Target};
use super::proxy;
use super::report::{self, codes, machine};
use anyhow::{Context, bail};
use pacpriv_demo::Trained;
use pacpriv_privacy::Nats;
use pacpriv_privacy::ledger::Policy;
use pacpriv_service::metrics::Metrics;
use pacpriv_service::proto::pacpriv::privatizer_client::PrivatizerClient;
use pacpriv_service::proto::pacpriv::{Budget, GetBudgetRequest};
use pacpriv_service::session::{PrincipalConfig, Scope};
use pacpriv_service::settings::{Settings, StoreSettings, TeacherSource};
use pacpriv_service::start;
use pacpriv_service::teachers::Teachers;
use pacpriv_service::teachers::demo;
use pacpriv_service::teachers::demo::DemoServer;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `pacpriv-bench service`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Number of teachers m (even) [default: 128; 8 with --smoke].
    #[arg(long, value_name = "M")]
    pub models: Option<usize>,
    /// Seed of the demo split and subsets.
    #[arg(long, value_name = "S", default_value_t = 20261123)]
    pub seed: u64,
    /// Concurrent closed-loop clients, each its own principal
    /// [default: 32; 4 with --smoke].
    #[arg(long, value_name = "N")]
    pub principals: Option<usize>,
    /// Measured time per target [default: 10; 2 with --smoke].
    #[arg(long, value_name = "SECONDS")]
    pub seconds: Option<f64>,
    /// At most this many measured requests per target [default: no limit;
    /// 200 with --smoke].
    #[arg(long, value_name = "N")]
    pub queries: Option<u64>,
    /// Unmeasured warm-up per target [default: 1; 0.2 with --smoke].
    #[arg(long, value_name = "SECONDS")]
    pub warmup: Option<f64>,
    /// Run only these targets (comma-separated names from the report).
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub only: Vec<String>,
    /// Small and fast, for CI: m = 8, 4 principals, at most 200 answers per
    /// target; the correctness checks are the point.
    #[arg(long)]
    pub smoke: bool,
    /// Where each privatizer target's store is created (and removed after):
    /// fsync cost is part of what is measured, so this should be the disk
    /// a deployment would use, not a tmpfs.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub state_dir: PathBuf,
    /// Load an already-running privatizer at ADDR (HOST:PORT or http://
    /// URI, plaintext) instead of the in-process targets; all clients use
    /// --api-key.
    #[arg(long, value_name = "ADDR", requires = "api_key")]
    pub target: Option<String>,
    /// The API key for --target.
    #[arg(long, value_name = "KEY", requires = "target")]
    pub api_key: Option<String>,
    /// With --target: measure twice, alone and beside N closed-loop
    /// clients from the same address that send a fresh random API key
    /// with every call (a key scan), and report both rows and their ratio.
    #[arg(long, value_name = "N", requires = "target")]
    pub flood: Option<usize>,
}

impl Knobs {
    fn from_args(args: &Args) -> anyhow::Result<Self> {
        let pick = |given: Option<f64>, smoke: f64, full: f64| given.unwrap_or(if args.smoke { smoke } else { full });
        let seconds = |what: &str, s: f64| {
            Duration::try_from_secs_f64(s).with_context(|| format!("--{what} must be a non-negative number of seconds"))
        };
        let knobs = Knobs {
            models: args.models.unwrap_or(if args.smoke { 8 } else { 128 }),
            seed: args.seed,
            principals: args.principals.unwrap_or(if args.smoke { 4 } else { 32 }),
            warmup: seconds("warmup", pick(args.warmup, 0.2, 1.0))?,
            measure: seconds("seconds", pick(args.seconds, 2.0, 10.0))?,
            queries: args.queries.or(args.smoke.then_some(200)),
        };
        if knobs.principals == 0 {
            bail!("--principals must be at least 1");
        }
        if knobs.models < 2 || !knobs.models.is_multiple_of(2) {
            bail!("--models must be even and at least 2");
        }
        Ok(knobs)
    }
}

/// Runs the benchmark and prints its report; fails after the report if any
/// answer was wrong or any request failed.
///
/// # Errors
/// Bad arguments, a target that did not start, or a correctness violation.
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let knobs = Knobs::from_args(&args)?;
    if let (Some(addr), Some(key)) = (&args.target, &args.api_key) {
        if let Some(flooders) = args.flood {
            return flooded(addr, key, flooders, &knobs, out);
        }
        return external(addr, key, &knobs, "", out).map(drop);
    }
    let targets: Vec<&Target> =
        TARGETS.iter().filter(|t| args.only.is_empty() || args.only.iter().any(|o| o == t.name)).collect();
    if targets.is_empty() {
        let names: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
        bail!("--only {:?} names no target; targets are {}", args.only, names.join(", "));
    }
    std::fs::create_dir_all(&args.state_dir)
        .with_context(|| format!("creating --state-dir {}", args.state_dir.display()))?;

    eprintln!("training {} demo teachers ...", knobs.models);
    let ensemble = Trained::train(knobs.models, knobs.seed).map_err(anyhow::Error::msg)?;
    let images: Arc<[Vec<f32>]> = ensemble.split.test.iter().map(|e| e.pixels.to_vec()).collect();
    // What every teacher answers for each image, for the checks.
    let teacher_labels = ensemble.labels(&ensemble.split.test);

    // The teachers get a runtime of their own, as a separate server would
    // have.
    let teachers_runtime = runtime("bench-teachers")?;
    let listener = teachers_runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .context("binding the teachers' listener")?;
    let teachers = listener.local_addr()?;
    let (stop_teachers, stopped) = tokio::sync::oneshot::channel::<()>();
    teachers_runtime.spawn(DemoServer::new(ensemble.teachers).serve(listener, async {
        let _ = stopped.await;
    }));

    let mut results = Vec::new();
    for target in targets {
        eprintln!(
            "{}: {:.1} s warm-up, then {:.1} s ...",
            target.name,
            knobs.warmup.as_secs_f64(),
            knobs.measure.as_secs_f64()
        );
        let measured = run_target(target, teachers, &knobs, &images, &args.state_dir)
            .with_context(|| format!("target {}", target.name))?;
        results.push((target, measured));
    }
    let _ = stop_teachers.send(());
    teachers_runtime.shutdown_timeout(Duration::from_secs(5));

    report::service(&results, &knobs, images.len(), &args.state_dir, out)?;
    let mut violations = Vec::new();
    for (target, measured) in &results {
        violations
            .extend(check(target, measured, &teacher_labels).into_iter().map(|v| format!("{}: {v}", target.name)));
    }
    let answers: usize = results.iter().flat_map(|(_, m)| &m.run.clients).map(|c| c.answers.len()).sum();
    if !violations.is_empty() {
        let shown = violations.iter().take(20).map(|v| format!("\n  - {v}")).collect::<String>();
        let more = violations.len().saturating_sub(20);
        let more = if more > 0 { format!("\n  … and {more} more") } else { String::new() };
        bail!("{} correctness violation(s) in {answers} answers:{shown}{more}", violations.len());
    }
    writeln!(
        out,
        "\nChecks passed on all {answers} answers (warm-up included): no failed request, labels in range, the \
         proxy's labels are the teachers' majority votes, the privatizer's `unanimous` flags and charges match \
         the teachers' labels and its policy, and every principal's `GetBudget` counts exactly the answers it \
         received."
    )?;
    Ok(())
}

/// The settings a target runs with: built-in defaults, the process
/// environment's `PACPRIV__…`, then the target's own overrides (which
/// define the target, so they win); then the bench's
/// own teachers, free loopback port, no extra listeners, a fresh store at
/// `store`, and `principals` principals `bench-I` with key `bench-key-I`.
fn settings(target: &Target, teachers: SocketAddr, knobs: &Knobs, store: &Path) -> anyhow::Result<Settings> {
    // Later entries replace earlier ones.
    let env = std::env::vars()
        .filter(|(k, _)| k.starts_with("PACPRIV__"))
        .chain(target.env.iter().map(|&(k, v)| (k.to_owned(), v.to_owned())));
    let mut s = Settings::load_with_env(None, env)?;
    // The layout (`teachers.layout`) chooses between the demo server's m
    // models and its stacked one.
    let stacked = match &s.model.teachers {
        TeacherSource::Demo { stacked, .. } => *stacked,
        TeacherSource::Remote(t) => matches!(t, Teachers::Stacked { .. }),
    };
    s.model.teachers = TeacherSource::Remote(if stacked {
        Teachers::Stacked { spec: demo::stacked_spec(teachers), models: knobs.models }
    } else {
        Teachers::PerTeacher(demo::specs(teachers, knobs.models))
    });
    s.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    s.health_listen = None;
    // Metrics on a free port: the report reads the batch-size histograms
    // (the service records them whether or not they are served).
    s.metrics.listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    s.admin = None;
    s.tls = None;
    s.store = StoreSettings::Embedded { path: store.join("state.redb") };
    // Every answer computed: the clients cycle through the test images, and
    // a cached repeat would skip the fan-out and the math measured here.
    s.dataset.cache = pacpriv_service::session::cache::CacheSettings::OFF;
    // Room for 2^30 answers of b: no run comes near it, so no request is
    // refused for budget.
    let budget = Nats::new(s.dataset.per_query.get() * f64::from(1u32 << 30))?;
    s.dataset.global_budget = budget;
    s.principals = (0..knobs.principals)
        .map(|i| PrincipalConfig {
            name: format!("bench-{i}"),
            key_sha256: Sha256::digest(api_key(i).as_bytes()).into(),
            budget,
            dataset_budgets: Default::default(),
        })
        .collect();
    Ok(s)
}

/// Client i's API key.
fn api_key(i: usize) -> String {
    format!("bench-key-{i}")
}

/// Starts `target` on a runtime of its own, loads it, reads the budgets
/// back, and stops it.
fn run_target(
    target: &Target,
    teachers: SocketAddr,
    knobs: &Knobs,
    images: &Arc<[Vec<f32>]>,
    state_dir: &Path,
) -> anyhow::Result<Measured> {
    let state = StateDir::create(state_dir, target.name)?;
    let settings = settings(target, teachers, knobs, &state.0)?;
    let classes = settings.model.mode.dim();
    let (policy, per_query, scope) =
        (settings.dataset.policy, settings.dataset.per_query.get(), settings.dataset.scope);
    let fanout = fanout(&settings);
    // The service and the load clients each get a runtime of their own (as
    // separate processes would), named so the CPU table can tell them apart.
    let service = runtime("bench-service")?;
    let clients = runtime("bench-clients")?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async {
        let _ = stopped.await;
    };
    // Started inside the service runtime: every task the server or its
    // fan-out spawns lands there.
    let (addr, serving, metrics) = service.block_on(async {
        let started: (SocketAddr, tokio::task::JoinHandle<anyhow::Result<()>>, MetricsSource) = match target.kind {
            Kind::Proxy => {
                let metrics = Arc::new(Metrics::new(settings.metrics.max_principal_series));
                let (addr, serve) = proxy::start(&settings, &metrics, shutdown).await?;
                (addr, tokio::spawn(async move { Ok(serve.await?) }), MetricsSource::Local(metrics))
            }
            Kind::Privatizer => {
                let started = start::serve(settings, shutdown).await?;
                let metrics = started.metrics.map_or(MetricsSource::None, MetricsSource::Http);
                (started.addr, tokio::spawn(async move { Ok(started.server.await?) }), metrics)
            }
        };
        anyhow::Ok(started)
    })?;
    let uri = format!("http://{addr}");
    let keys = (0..knobs.principals).map(|i| (target.kind == Kind::Privatizer).then(|| api_key(i))).collect();
    let plan = load::Plan {
        uri: uri.clone(),
        keys,
        images: Arc::clone(images),
        warmup: knobs.warmup,
        measure: knobs.measure,
        max_requests: knobs.queries,
        metrics,
        ids: "bench".into(),
    };
    let measured = clients.block_on(async {
        let run = load::run(plan).await?;
        let budgets = match target.kind {
            Kind::Proxy => Vec::new(),
            Kind::Privatizer => budgets(&uri, knobs.principals).await?,
        };
        anyhow::Ok(Measured { run, budgets, classes, policy, per_query, scope, fanout })
    });
    let _ = stop.send(());
    // The clients' connections are closed by now; a server that does not
    // stop in time is dropped with its runtime, and with it every task it
    // started (teacher health probes included), so nothing of this target
    // runs during the next.
    if let Ok(joined) = service.block_on(async { tokio::time::timeout(Duration::from_secs(10), serving).await }) {
        joined.context("the server task panicked")?.context("serving")?;
    }
    clients.shutdown_timeout(Duration::from_secs(5));
    service.shutdown_timeout(Duration::from_secs(5));
    measured
}

/// A multi-threaded runtime whose threads are called `name` (worker and
/// blocking threads alike, so the CPU table counts both).
fn runtime(name: &str) -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .thread_name(name)
        .enable_all()
        .build()
        .with_context(|| format!("starting the {name} runtime"))
}

/// `batched ≤ 2 ms × 64, per-teacher`: the effective fan-out settings.
fn fanout(s: &Settings) -> String {
    let batching = if s.model.batching.enabled() {
        format!("batched ≤ {} ms × {}", s.model.batching.window.as_millis(), s.model.batching.max_batch)
    } else {
        "unbatched".into()
    };
    let layout = match &s.model.teachers {
        TeacherSource::Remote(Teachers::Stacked { .. }) | TeacherSource::Demo { stacked: true, .. } => "stacked",
        TeacherSource::Remote(Teachers::PerTeacher(_)) | TeacherSource::Demo { stacked: false, .. } => "per-teacher",
    };
    format!("{batching}, {layout}")
}

/// `GetBudget` of every bench principal.
async fn budgets(uri: &str, principals: usize) -> anyhow::Result<Vec<Budget>> {
    let mut client = PrivatizerClient::connect(uri.to_owned()).await.context("connecting for GetBudget")?;
    let mut out = Vec::with_capacity(principals);
    for i in 0..principals {
        let mut request = tonic::Request::new(GetBudgetRequest::default());
        request.metadata_mut().insert("x-api-key", api_key(i).parse()?);
        out.push(client.get_budget(request).await.with_context(|| format!("GetBudget of bench-{i}"))?.into_inner());
    }
    Ok(out)
}

/// Everything wrong with a target's answers (empty: all correct).
/// `teacher_labels[image][i]` is teacher i's label for image `image`.
fn check(target: &Target, m: &Measured, teacher_labels: &[Vec<usize>]) -> Vec<String> {
    let mut v = Vec::new();
    let failed: u64 = m.run.clients.iter().map(|c| c.warmup_errors + c.errors.values().sum::<u64>()).sum();
    if failed > 0 {
        v.push(format!("{failed} request(s) failed (measured: {})", codes(&m.run)));
    }
    if m.run.clients.iter().all(|c| c.answers.is_empty()) {
        v.push("no request was answered".into());
    }
    for (client, a) in m.run.clients.iter().enumerate().flat_map(|(i, c)| c.answers.iter().map(move |a| (i, a))) {
        let Some(labels) = teacher_labels.get(a.image) else {
            v.push(format!("client {client}: answer for unknown image {}", a.image));
            continue;
        };
        let unanimous = labels.iter().all(|&l| Some(&l) == labels.first());
        let at = || format!("client {client}, image {}", a.image);
        if a.label as usize >= m.classes {
            v.push(format!("{}: label {} is not below {} classes", at(), a.label, m.classes));
        }
        if a.unanimous != unanimous {
            v.push(format!("{}: unanimous = {} but the teachers' labels say {unanimous}", at(), a.unanimous));
        }
        match target.kind {
            Kind::Proxy => {
                let want = proxy::majority(labels, m.classes);
                if a.label as usize != want {
                    v.push(format!("{}: label {} but the teachers' majority vote is {want}", at(), a.label));
                }
            }
            Kind::Privatizer => {
                if unanimous && Some(&(a.label as usize)) != labels.first() {
                    v.push(format!(
                        "{}: unanimous teachers say {:?} but the answer is {}",
                        at(),
                        labels.first(),
                        a.label
                    ));
                }
                let charge = match m.policy {
                    Policy::Contested | Policy::UnanimousOnly if unanimous => 0.0,
                    Policy::Paper | Policy::Contested | Policy::UnanimousOnly => m.per_query,
                };
                if a.mi_charged != charge {
                    v.push(format!(
                        "{}: charged {:e} nats, expected {charge:e} ({} policy)",
                        at(),
                        a.mi_charged,
                        m.policy
                    ));
                }
            }
        }
    }
    if target.kind == Kind::Privatizer {
        let total: u64 = m.run.clients.iter().map(|c| c.answers.len() as u64).sum();
        for (i, (client, budget)) in m.run.clients.iter().zip(&m.budgets).enumerate() {
            // Under global scope every principal reads the one shared session.
            let want = match m.scope {
                Scope::PerPrincipal => client.answers.len() as u64,
                Scope::Global => total,
            };
            if budget.answered != want {
                v.push(format!("bench-{i}: GetBudget counts {} answers, the bench received {want}", budget.answered));
            }
        }
        if m.budgets.len() != m.run.clients.len() {
            v.push(format!("{} budgets read for {} principals", m.budgets.len(), m.run.clients.len()));
        }
    }
    v
}

/// A privatizer target's store directory, removed when dropped.
struct StateDir(PathBuf);

impl StateDir {
    fn create(parent: &Path, target: &str) -> anyhow::Result<Self> {
        let dir = parent.join(format!(".pacpriv-bench-{}-{target}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(StateDir(dir))
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `--target --flood N`: the clients of [`external`] alone, then beside N
/// clients sending random keys; both rows, the ratios, and how many calls
/// the flood made (all must be refused UNAUTHENTICATED).
fn flooded(addr: &str, key: &str, flooders: usize, knobs: &Knobs, out: &mut dyn Write) -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let uri = pacpriv_tools::connect::uri(addr, false)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    writeln!(out, "Alone:\n")?;
    let alone = external(addr, key, knobs, "-alone", out)?;
    let (stop, sent, refused) =
        (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..flooders {
        let channel = runtime.block_on(tonic::transport::Endpoint::from_shared(uri.clone())?.connect())?;
        let (stop, sent, refused) = (Arc::clone(&stop), Arc::clone(&sent), Arc::clone(&refused));
        flood.spawn_on(
            async move {
                let mut client = PrivatizerClient::new(channel);
                for k in 0u64.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let mut request = tonic::Request::new(GetBudgetRequest::default());
                    let random = format!("scan-{i}-{k}-{:016x}", rand::random::<u64>());
                    if let Ok(v) = random.parse() {
                        request.metadata_mut().insert("x-api-key", v);
                    }
                    let result = client.get_budget(request).await;
                    sent.fetch_add(1, Ordering::Relaxed);
                    let refusal = [tonic::Code::Unauthenticated, tonic::Code::ResourceExhausted];
                    if result.is_err_and(|e| refusal.contains(&e.code())) {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            },
            runtime.handle(),
        );
    }
    writeln!(out, "\nBeside {flooders} clients sending a fresh random key with every call (`GetBudget`):\n")?;
    let beside = external(addr, key, knobs, "-flooded", out);
    stop.store(true, Ordering::Relaxed);
    runtime.block_on(async { while flood.join_next().await.is_some() {} });
    let beside = beside?;
    let (sent, refused) = (sent.load(Ordering::Relaxed), refused.load(Ordering::Relaxed));
    let ratio = |a: f64, b: f64| if b > 0.0 { format!("{:.2}×", a / b) } else { "–".into() };
    writeln!(
        out,
        "\nThe flood made {sent} calls ({refused} refused UNAUTHENTICATED or KEY_LOOKUPS_LIMITED). With it, \
         throughput is {} of alone's, \
         p99 {} of alone's.",
        ratio(beside.throughput, alone.throughput),
        ratio(beside.p99, alone.p99),
    )?;
    if refused != sent {
        bail!("{} flood calls were not refused", sent - refused);
    }
    Ok(())
}

/// What [`external`] measured, for ratios: answers a second, p99 seconds.
struct Headline {
    throughput: f64,
    p99: f64,
}

/// How many shifted copies of the held-out images `--target` sends (359
/// each): more distinct inputs than a 10 s run asks.
const EXTERNAL_PASSES: usize = 100;

/// `--target`: N clients on one key against a running privatizer; reports
/// one row and fails only if nothing was answered.
fn external(addr: &str, key: &str, knobs: &Knobs, phase: &str, out: &mut dyn Write) -> anyhow::Result<Headline> {
    let split = pacpriv_demo::digits::split(knobs.seed).map_err(anyhow::Error::msg)?;
    // Every request a distinct input: a repeat is answered from the
    // session's cache (or refused EVICTED_REPEAT once evicted), which would
    // measure the cache. The held-out images, shifted a little per pass,
    // and by half a count in the flooded phase (not the alone phase's).
    let offset = if phase == "-flooded" { 0.5 } else { 0.0 };
    let images: Arc<[Vec<f32>]> = (0..EXTERNAL_PASSES)
        .flat_map(|pass| {
            let shift = offset + pass as f32 * 1e-3;
            split.test.iter().map(move |e| e.pixels.iter().map(|p| p + shift).collect())
        })
        .collect();
    let uri = pacpriv_tools::connect::uri(addr, false)?;
    let plan = load::Plan {
        uri,
        keys: vec![Some(key.to_owned()); knobs.principals],
        images: Arc::clone(&images),
        warmup: knobs.warmup,
        measure: knobs.measure,
        max_requests: knobs.queries,
        metrics: MetricsSource::None,
        ids: format!("bench-{}", std::process::id()) + phase,
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let run = runtime.block_on(load::run(plan))?;
    let cap = knobs.queries.map(|q| format!(" or {q} answers, whichever comes first")).unwrap_or_default();
    writeln!(
        out,
        "External privatizer at {addr}; {} closed-loop clients on one API key (one session); {:.1} s warm-up, then \
         {:.1} s{cap}; {} distinct inputs (held-out images of seed {}, shifted). Machine (load side): {}.\n",
        knobs.principals,
        knobs.warmup.as_secs_f64(),
        knobs.measure.as_secs_f64(),
        images.len(),
        knobs.seed,
        machine()
    )?;
    writeln!(out, "| target | answered | errors | answers/s | p50 ms | p90 ms | p99 ms |")?;
    writeln!(out, "|---|---:|---:|---:|---:|---:|---:|")?;
    let latency = match run.percentiles(&[0.5, 0.9, 0.99]) {
        Some(p) => p.iter().map(|d| format!("{:.2}", d.as_secs_f64() * 1e3)).collect::<Vec<_>>().join(" | "),
        None => "– | – | –".into(),
    };
    let errors: u64 = run.errors().values().sum();
    writeln!(out, "| {addr} | {} | {errors} | {:.1} | {latency} |", run.answered(), run.throughput())?;
    if errors > 0 {
        writeln!(out, "\nErrors: {}.", codes(&run))?;
    }
    if run.answered() == 0 {
        bail!("the privatizer at {addr} answered no measured request ({})", codes(&run));
    }
    let p99 = run.percentiles(&[0.99]).and_then(|p| p.first().copied()).unwrap_or_default();
    Ok(Headline { throughput: run.throughput(), p99: p99.as_secs_f64() })
}
