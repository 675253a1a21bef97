//! `pacpriv-bench store`: durable charges per second through the real
//! session path — [`Sessions`] over an embedded store in a temporary
//! directory, C concurrent tasks in a closed loop on S sessions, each
//! returned answer one charge made durable by a group commit.
//!
//! Two baselines run in the same process, so the result reads as ratios:
//! the same loop with the privacy math only (no store: the ceiling the
//! durable path can reach on these cores), and one session asked
//! sequentially (one fsync per charge: what group commit buys).
//!
//! Also owns what the store-backed bench subcommands share: the bench
//! principals and keys (the scratch directory is [`super::scratch`], the
//! machine's description [`super::report::machine`]).

use super::scratch::scratch;
use anyhow::{Context, bail, ensure};
use pacpriv_privacy::Nats;
use pacpriv_privacy::ledger::{Ledger, Policy};
use pacpriv_privacy::mechanism::{self, SecretIndex, SessionState, TeacherOutputs};
use pacpriv_privacy::posterior::Posterior;
use pacpriv_service::metrics::Metrics;
use pacpriv_service::session::cache::{CacheSettings, OnEvicted, QueryDigest};
use pacpriv_service::session::{
    Asking, Credential, DatasetTerms, Handle, PrincipalConfig, Scope, SessionError, SessionParams, Sessions, secret,
};
use pacpriv_store::embedded::DEFAULT_CACHE_BYTES;
use pacpriv_store::principal::now_unix;
use pacpriv_store::{
    DEFAULT_DATASET, EmbeddedStore, Meta, Origin, PgLink, PgStore, PrincipalRecord, SessionRecord, Store,
};
use rand::RngExt;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// b of every bench session: the default configuration's 2⁻²⁴ nats.
pub(super) const PER_QUERY: f64 = 1.0 / 16_777_216.0;

/// Each bench principal's budget: 2²⁴ answers, more than any run asks.
pub(super) const BUDGET: f64 = 1.0;

/// Arguments of `pacpriv-bench store`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Principals S, each with its own session.
    #[arg(long, default_value_t = 256, value_name = "S")]
    pub principals: usize,
    /// Concurrent tasks C in the closed loop; task t's n-th answer goes to
    /// principal (t + n·C) mod S.
    #[arg(long, default_value_t = 256, value_name = "C")]
    pub concurrency: usize,
    /// How long each of the three runs lasts.
    #[arg(long, default_value_t = 5.0, value_name = "SECONDS")]
    pub seconds: f64,
    /// Also stop each run after this many answers.
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Number of teachers m.
    #[arg(long, default_value_t = 128, value_name = "M")]
    pub teachers: usize,
    /// Number of classes d.
    #[arg(long, default_value_t = 10, value_name = "D")]
    pub classes: usize,
    /// Teachers that disagree with the others: every answer is contested,
    /// so every answer is charged and changes the posterior.
    #[arg(long, default_value_t = 8, value_name = "K")]
    pub dissent: usize,
    /// Journal every step too (as `store.journal = true`).
    #[arg(long)]
    pub journal: bool,
    /// Keep every answer in its session's answer cache of this many
    /// entries (as `privacy.answer_cache_entries`, evicted repeats
    /// charged): each query is new, so once a session has answered this
    /// many, every step rewrites a record carrying a full cache.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub cached: usize,
    /// Before the timed window, every session answers `--cached` fresh
    /// queries of its own (untimed), so that every measured step finds
    /// its session's cache full: it inserts one answer and evicts one.
    #[arg(long, requires = "cached")]
    pub fill: bool,
    /// redb page cache, MiB (default: the store's).
    #[arg(long, value_name = "MIB")]
    pub cache_mib: Option<usize>,
    /// Where to create the temporary store directory (default: the current
    /// directory); it must not be RAM-backed.
    #[arg(long, value_name = "PATH")]
    pub dir: Option<PathBuf>,
    /// Run the two durable loops on the PostgreSQL database at this URL (a
    /// fresh one the bench may fill) instead of embedded stores: every
    /// step is then its own transaction (no group commit).
    #[arg(long, value_name = "URL")]
    pub postgres_url: Option<String>,
}

/// Runs the three loops and prints one table row each, the ratios, and
/// the consistency check (every session's ledger adds up to the charges
/// counted).
///
/// # Errors
/// Bad arguments, a RAM-backed directory, a store or session failure, or
/// ledgers that disagree with the count.
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    ensure!(args.principals >= 1 && args.concurrency >= 1, "--principals and --concurrency must be at least 1");
    ensure!(args.teachers >= 2 && args.teachers.is_multiple_of(2), "--teachers must be even and at least 2");
    ensure!(args.classes >= 2, "--classes must be at least 2");
    ensure!(args.cached <= 4096, "--cached must be at most 4096 (privacy.answer_cache_entries' limit)");
    ensure!(
        (1..args.teachers).contains(&args.dissent),
        "--dissent must be between 1 and {} (a contested answer)",
        args.teachers - 1
    );
    let limit = Duration::try_from_secs_f64(args.seconds).context("--seconds")?;
    ensure!(!limit.is_zero(), "--seconds must be positive");
    let (scratch, fs) = scratch(args.dir.as_deref())?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let runs = runtime.block_on(async {
        let (sessions, tasks) = (args.principals, args.concurrency);
        let group = durable(&args, "group_commit", &scratch.path().join("group.redb"), sessions, tasks, limit)
            .await
            .context("group commit run")?;
        let sequential = durable(&args, "sequential", &scratch.path().join("sequential.redb"), 1, 1, limit)
            .await
            .context("sequential run")?;
        let math = math_only(&args, limit).await.context("math-only run")?;
        anyhow::Ok([group, sequential, math])
    })?;
    let [group, sequential, math] = &runs;

    writeln!(out, "pacpriv-bench store")?;
    writeln!(out, "machine: {}", super::report::machine())?;
    let place = match &args.postgres_url {
        Some(_) => "postgres (a transaction per step)".to_owned(),
        None => format!(
            "{} ({fs}), redb cache {}",
            scratch.path().display(),
            args.cache_mib
                .map_or_else(|| format!("{} MiB (default)", DEFAULT_CACHE_BYTES >> 20), |m| format!("{m} MiB"))
        ),
    };
    writeln!(
        out,
        "store: {place}, journal {}, answer cache {} entries",
        if args.journal { "on" } else { "off" },
        args.cached
    )?;
    writeln!(
        out,
        "outputs: m={} d={} {} vs {} (every answer contested and charged), b=2^-24 nats, policy paper",
        args.teachers,
        args.classes,
        args.teachers - args.dissent,
        args.dissent
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<14} {:>8} {:>6} {:>9} {:>8} {:>10} {:>8} {:>14} {:>10}",
        "run", "sessions", "tasks", "charges", "seconds", "charges/s", "commits", "records/commit", "commit_ms"
    )?;
    for r in &runs {
        let (commits, records, ms) = match r.commits {
            Some(c) => (format!("{:.0}", c.count), format!("{:.1}", c.records), format!("{:.2}", c.seconds * 1e3)),
            None => ("-".to_owned(), "-".to_owned(), "-".to_owned()),
        };
        writeln!(
            out,
            "{:<14} {:>8} {:>6} {:>9} {:>8.2} {:>10.0} {commits:>8} {records:>14} {ms:>10}",
            r.name,
            r.sessions,
            r.tasks,
            r.charges,
            r.seconds,
            r.rate(),
        )?;
    }
    writeln!(out)?;
    writeln!(out, "ratio group_commit/sequential {:.1}", group.rate() / sequential.rate())?;
    writeln!(out, "ratio group_commit/math_only {:.3}", group.rate() / math.rate())?;
    for r in [group, sequential] {
        let answered = r.answered.unwrap_or_default();
        if answered != r.charges {
            bail!("{}: the sessions' ledgers answered {answered}, but {} answers returned", r.name, r.charges);
        }
        writeln!(out, "ledgers {} answered {answered} = charges {}", r.name, r.charges)?;
    }
    Ok(())
}

/// One closed-loop run.
struct Run {
    name: &'static str,
    sessions: usize,
    tasks: usize,
    /// Answers returned (each one charge, durable for the store runs).
    charges: u64,
    seconds: f64,
    /// The store's group commits (store runs).
    commits: Option<Commits>,
    /// Sum of the sessions' `answered` afterwards (store runs).
    answered: Option<u64>,
}

/// What the store's metrics say about a run's commits.
#[derive(Clone, Copy)]
struct Commits {
    count: f64,
    /// Mean session records per commit.
    records: f64,
    /// Mean time from the start of a commit to its fsync's return.
    seconds: f64,
}

impl Run {
    fn rate(&self) -> f64 {
        self.charges as f64 / self.seconds
    }
}

/// When a closed loop stops: at the deadline, or once `count` answers were
/// started. Every task checks before each answer, so a run overshoots
/// the deadline by at most one answer per task (and the elapsed time
/// includes it).
struct Stop {
    deadline: Instant,
    started: AtomicU64,
    count: u64,
}

impl Stop {
    fn new(limit: Duration, count: Option<u64>) -> Self {
        Stop { deadline: Instant::now() + limit, started: AtomicU64::new(0), count: count.unwrap_or(u64::MAX) }
    }

    fn go(&self) -> bool {
        Instant::now() < self.deadline && self.started.fetch_add(1, Ordering::Relaxed) < self.count
    }
}

/// `S` sessions over a fresh embedded store at `path`, asked by `tasks`
/// concurrent closed loops through [`Handle::answer`].
async fn durable(
    args: &Args,
    name: &'static str,
    path: &Path,
    sessions: usize,
    tasks: usize,
    limit: Duration,
) -> anyhow::Result<Run> {
    let metrics = Metrics::new(0);
    let store = match (&args.postgres_url, args.cache_mib) {
        (Some(url), _) => {
            let link = PgLink::plain(tasks.clamp(2, 64));
            Store::Postgres(Arc::new(PgStore::connect(url, &link).await?.observed(metrics.store.clone())))
        }
        (None, Some(mib)) => Store::Embedded(Arc::new(EmbeddedStore::open_with_cache(
            path,
            metrics.store.clone(),
            Arc::default(),
            mib << 20,
        )?)),
        (None, None) => {
            Store::Embedded(Arc::new(EmbeddedStore::open_with(path, metrics.store.clone(), Arc::default())?))
        }
    };
    let secret = seal_secret(&store, args.teachers, "pacpriv bench store").await?;
    let params = SessionParams {
        per_query: Nats::new(PER_QUERY)?,
        policy: Policy::Paper,
        m: args.teachers,
        secret,
        noise: pacpriv_service::session::secret::establish_noise_key(&store, pacpriv_store::DEFAULT_DATASET).await?,
        journal: args.journal,
        cache: CacheSettings { capacity: args.cached, on_evicted: OnEvicted::Charge },
        calibration: Default::default(),
    };
    let registry = match &args.postgres_url {
        None => {
            Sessions::new(
                &principals(sessions)?,
                vec![DatasetTerms::default_dataset(Scope::PerPrincipal, Nats::new(BUDGET)?, params)],
                &store,
            )
            .await?
        }
        Some(_) => {
            // Provisioned once per database, through the admin path: a
            // configuration listing them would be re-applied by every run
            // (and revoke, in the one-session run, everyone not listed).
            provision_admin(&store, sessions).await?;
            let opening = Instant::now();
            let registry = Sessions::new(
                &[],
                vec![DatasetTerms::default_dataset(Scope::PerPrincipal, Nats::new(BUDGET)?, params)],
                &store,
            )
            .await?;
            eprintln!("{name}: started on {sessions} principals in {:.2} s", opening.elapsed().as_secs_f64());
            registry
        }
    };
    let mut handles = Vec::with_capacity(sessions);
    for i in 0..sessions {
        handles.push(registry.authenticate(Credential::ApiKey(&key(i))).await?.on(0)?.clone());
    }
    let outputs = contested(args);
    // Every key of this run is new to the store, even in a database that
    // earlier runs (or this invocation's other run) left answers in.
    let salt: f64 = rand::rng().random_range(0.0..1.0);
    if args.fill {
        fill(&handles, &outputs, args.cached, salt).await?;
    }
    // What the sessions had answered before (a database shared by the
    // runs, the fill).
    let mut before = 0;
    for handle in &handles {
        before += handle.budget().await?.answered;
    }
    let stop = Arc::new(Stop::new(limit, args.count));
    let started = Instant::now();
    let mut set = JoinSet::new();
    let handles: Arc<[Handle]> = handles.into();
    let cached = args.cached;
    for task in 0..tasks {
        let (handles, outputs, stop) = (Arc::clone(&handles), outputs.clone(), Arc::clone(&stop));
        set.spawn(async move {
            let mut n = 0u64;
            while stop.go() {
                let handle = &handles[session_of(task, n, tasks, handles.len())];
                let key = (cached > 0).then(|| QueryDigest::of(&[task as f64, n as f64, salt]).into());
                let asking = Asking { key, ..Asking::uncached(None, String::new()) };
                handle.begin(vec![(Some(outputs.clone()), asking)], Vec::new()).await?.release().await?;
                n += 1;
            }
            Ok::<u64, SessionError>(n)
        });
    }
    let mut charges = 0;
    while let Some(done) = set.join_next().await {
        charges += done.context("a bench task panicked")??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut answered = 0;
    for h in handles.iter() {
        answered += h.budget().await?.answered;
    }
    let answered = Some(answered - before);
    Ok(Run { name, sessions, tasks, charges, seconds, commits: Some(commits(&metrics)?), answered })
}

/// Fills every session's answer cache: `cached` fresh queries each, one
/// task per session, with keys the timed loops never use (negative).
/// `salt`: the run's, as in the timed loops' keys.
async fn fill(handles: &[Handle], outputs: &TeacherOutputs, cached: usize, salt: f64) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut set = JoinSet::new();
    for (i, handle) in handles.iter().enumerate() {
        let (handle, outputs) = (handle.clone(), outputs.clone());
        set.spawn(async move {
            for j in 0..cached {
                let key = Some(QueryDigest::of(&[-1.0 - i as f64, j as f64, salt]).into());
                let asking = Asking { key, ..Asking::uncached(None, String::new()) };
                handle.begin(vec![(Some(outputs.clone()), asking)], Vec::new()).await?.release().await?;
            }
            Ok::<(), SessionError>(())
        });
    }
    while let Some(done) = set.join_next().await {
        done.context("a fill task panicked")??;
    }
    eprintln!("filled {} caches of {cached} in {:.1} s", handles.len(), started.elapsed().as_secs_f64());
    Ok(())
}

/// Provisions bench principals `0..n` through the admin path, those not
/// stored yet, 10 000 per transaction; reports the time on stderr.
async fn provision_admin(store: &Store, n: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    let stored: std::collections::HashSet<String> = store.principals().await?.into_iter().map(|p| p.name).collect();
    let missing: Vec<_> = admin_principals(n)?.into_iter().filter(|p| !stored.contains(&p.name)).collect();
    for chunk in missing.chunks(10_000) {
        store.provision_all(chunk).await?;
    }
    if !missing.is_empty() {
        eprintln!("provisioned {} principals in {:.1} s", missing.len(), started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// The same closed loop on in-memory session states: the step of
/// Algorithm 1 and the record snapshot the store would be handed, no
/// store. Tasks yield after each answer so all of them take turns, as
/// the durable loop's do while they wait.
async fn math_only(args: &Args, limit: Duration) -> anyhow::Result<Run> {
    let m = args.teachers;
    let secret = SecretIndex::new(rand::rng().random_range(0..m), m)?;
    let mut states = Vec::with_capacity(args.principals);
    for _ in 0..args.principals {
        let state = SessionState {
            posterior: Posterior::uniform(m)?,
            ledger: Ledger::new(Nats::new(PER_QUERY)?, Nats::new(BUDGET)?, Policy::Paper)?,
        };
        states.push(Mutex::new((state, 0u64)));
    }
    let outputs = contested(args);
    let stop = Arc::new(Stop::new(limit, args.count));
    let started = Instant::now();
    let mut set = JoinSet::new();
    let states: Arc<[_]> = states.into();
    let tasks = args.concurrency;
    for task in 0..tasks {
        let (states, outputs, stop) = (Arc::clone(&states), outputs.clone(), Arc::clone(&stop));
        set.spawn(async move {
            let mut n = 0u64;
            while stop.go() {
                {
                    let state: &Mutex<_> = &states[session_of(task, n, tasks, states.len())];
                    let mut guard = state.lock().map_err(|_| anyhow::anyhow!("a bench session lock was poisoned"))?;
                    let (state, version) = &mut *guard;
                    let answer = mechanism::answer(state, &outputs, secret, None, &mut rand::rng())?;
                    *version += 1;
                    std::hint::black_box((answer, SessionRecord::of(state, Vec::new(), *version)));
                }
                n += 1;
                tokio::task::yield_now().await;
            }
            anyhow::Ok(n)
        });
    }
    let mut charges = 0;
    while let Some(done) = set.join_next().await {
        charges += done.context("a bench task panicked")??;
    }
    Ok(Run {
        name: "math_only",
        sessions: args.principals,
        tasks: args.concurrency,
        charges,
        seconds: started.elapsed().as_secs_f64(),
        commits: None,
        answered: None,
    })
}

/// The session a task asks for its `n`-th answer: task t starts on
/// session t mod S and steps by C, so C tasks over S sessions keep every
/// session busy (C ≥ S) or visit all of them in turn (C < S).
fn session_of(task: usize, n: u64, tasks: usize, sessions: usize) -> usize {
    let n = usize::try_from(n % sessions as u64).unwrap_or(0);
    (task % sessions + n * (tasks % sessions)) % sessions
}

/// Label-mode outputs where the last `dissent` teachers say 1 and the
/// others 0.
fn contested(args: &Args) -> TeacherOutputs {
    let split = args.teachers - args.dissent;
    TeacherOutputs::Labels {
        labels: (0..args.teachers).map(|i| usize::from(i >= split)).collect(),
        classes: args.classes,
    }
}

/// Mean records per commit and mean commit time (seconds) from the store's
/// histograms.
fn commits(metrics: &Metrics) -> anyhow::Result<Commits> {
    let text = metrics.encode()?;
    let sample = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok()).unwrap_or(0.0)
    };
    let count = sample("pacpriv_store_commit_batch_size_count");
    let mean = |sum: f64| if count > 0.0 { sum / count } else { 0.0 };
    Ok(Commits {
        count,
        records: mean(sample("pacpriv_store_commit_batch_size_sum")),
        seconds: mean(sample("pacpriv_store_commit_duration_seconds_sum")),
    })
}

/// Seals a random s* in a fresh bench store and reads it back through the
/// service's own path ([`secret::establish`]). Sealing it here first
/// keeps `establish`'s first-start warning, meant for operators, out of
/// the bench output. The index is never shown.
pub(super) async fn seal_secret(store: &Store, m: usize, teachers: &str) -> anyhow::Result<SecretIndex> {
    let drawn = rand::rng().random_range(0..m);
    store.init_meta(DEFAULT_DATASET, &Meta { secret: drawn, teachers: teachers.to_owned() }).await?;
    Ok(secret::establish(store, DEFAULT_DATASET, None, m, teachers, None).await?)
}

/// The API key of bench principal `i` (a bench store is thrown away; the
/// keys protect nothing).
pub(super) fn key(i: usize) -> String {
    format!("bench-key-{i}")
}

/// Bench principals 0..n: `bench-000000`, … with [`key`] and [`BUDGET`].
pub(super) fn principals(n: usize) -> anyhow::Result<Vec<PrincipalConfig>> {
    let budget = Nats::new(BUDGET)?;
    Ok((0..n)
        .map(|i| PrincipalConfig {
            name: format!("bench-{i:06}"),
            key_sha256: Sha256::digest(key(i).as_bytes()).into(),
            budget,
            dataset_budgets: Default::default(),
        })
        .collect())
}

/// Bench principals 0..n as the admin API provisions them (listed in no
/// configuration, so no start-up revokes them).
pub(super) fn admin_principals(n: usize) -> anyhow::Result<Vec<PrincipalRecord>> {
    let now = now_unix();
    Ok(principals(n)?.iter().map(|p| PrincipalRecord { origin: Origin::Admin, ..p.record(now) }).collect())
}
