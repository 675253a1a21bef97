//! `pacpriv-bench history`: what a step costs as one session's history
//! grows (issue 27). For each P of `--prior`, one session that has
//! answered P queries before (its answer cache full, every evicted query
//! remembered under `refuse`), then `--steps` fresh queries through the
//! session path; durable charges per second and bytes written per step,
//! beside the same session with the cache off, in the same run.
//!
//! Bytes per step: on the embedded store, what the process handed the
//! kernel to write (`wchar` of `/proc/self/io`: the record, the cache rows
//! and the B-tree pages redb rewrites for them); on PostgreSQL, the WAL
//! the cluster wrote (`pg_current_wal_lsn`), which every change passes
//! through.
//!
//! The P prior answers are real steps on the embedded store. On
//! PostgreSQL, where one session's steps are serialised by its row lock
//! (about a millisecond each), the first `min(P, 1 000)` are real steps
//! and the rest are inserted as the evicted-query rows those steps would
//! have left (random digests): the session's rows are then those of a
//! session with P prior answers, only the span numbers are smaller.
//!
//! `record_bytes` is the session's stored record at the end of the run:
//! on the embedded store with the cache tail it carries then (0–4 KiB,
//! depending on where the run stopped).

use super::report::machine;
use super::scratch::scratch;
use super::store::{BUDGET, PER_QUERY, key, principals, seal_secret};
use anyhow::{Context, bail, ensure};
use pacpriv_privacy::Nats;
use pacpriv_privacy::ledger::Policy;
use pacpriv_privacy::mechanism::TeacherOutputs;
use pacpriv_service::session::cache::{CacheSettings, OnEvicted, QueryDigest};
use pacpriv_service::session::{
    Asking, Credential, DatasetTerms, Handle, Scope, SessionError, SessionParams, Sessions,
};
use pacpriv_store::{EmbeddedStore, PgLink, PgStore, Store};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use tokio::task::JoinSet;

/// Arguments of `pacpriv-bench history`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Prior answers in the session before each measurement.
    #[arg(long, value_delimiter = ',', default_values_t = [0u64, 1_000, 100_000, 1_000_000], value_name = "P,…")]
    pub prior: Vec<u64>,
    /// Fresh queries measured at each point.
    #[arg(long, default_value_t = 5_000, value_name = "N")]
    pub steps: u64,
    /// Concurrent tasks asking the one session (the embedded store folds
    /// their steps into group commits; PostgreSQL's row lock takes them one
    /// at a time).
    #[arg(long, default_value_t = 16, value_name = "C")]
    pub concurrency: usize,
    /// Answer cache entries (`privacy.answer_cache_entries`).
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub cached: usize,
    /// Number of teachers m.
    #[arg(long, default_value_t = 128, value_name = "M")]
    pub teachers: usize,
    /// Measure on the PostgreSQL database at this URL (one the bench may
    /// fill; a fresh one) instead of an embedded store.
    #[arg(long, value_name = "URL")]
    pub postgres_url: Option<String>,
    /// Where to create the embedded stores (default: the current
    /// directory); it must not be RAM-backed.
    #[arg(long, value_name = "PATH")]
    pub dir: Option<PathBuf>,
}

/// One measured point.
struct Point {
    name: String,
    prior: u64,
    /// Of the prior answers, how many were real steps.
    stepped: u64,
    charges: u64,
    seconds: f64,
    bytes: u64,
    record: usize,
}

impl Point {
    fn rate(&self) -> f64 {
        self.charges as f64 / self.seconds
    }

    fn bytes_per_step(&self) -> f64 {
        self.bytes as f64 / self.charges as f64
    }
}

/// Runs the points and prints one row each and the ratios.
///
/// # Errors
/// Bad arguments, a RAM-backed directory, a store or session failure, or
/// ledgers that disagree with the count.
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    ensure!(args.concurrency >= 1 && args.steps >= 1, "--concurrency and --steps must be at least 1");
    ensure!((1..=4096).contains(&args.cached), "--cached must be between 1 and 4096");
    ensure!(args.teachers >= 2 && args.teachers.is_multiple_of(2), "--teachers must be even and at least 2");
    let (scratch, fs) = scratch(args.dir.as_deref())?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let on = CacheSettings { capacity: args.cached, on_evicted: OnEvicted::Refuse };
    let plan: Vec<(String, u64, CacheSettings)> = std::iter::once(("cache_off".to_owned(), 0, CacheSettings::OFF))
        .chain(args.prior.iter().map(|&p| (format!("prior_{p}"), p, on)))
        .collect();
    let mut points = Vec::new();
    runtime.block_on(async {
        for (index, (name, prior, cache)) in plan.into_iter().enumerate() {
            let target = match &args.postgres_url {
                Some(url) => Target::Postgres(url.clone()),
                None => Target::Embedded(scratch.path().join(format!("{name}.redb"))),
            };
            points.push(point(&args, target, index, &name, prior, cache).await.with_context(|| name.clone())?);
        }
        anyhow::Ok(())
    })?;

    writeln!(out, "pacpriv-bench history")?;
    writeln!(out, "machine: {}", machine())?;
    match &args.postgres_url {
        Some(_) => writeln!(out, "store: postgres (bytes: WAL written)")?,
        None => writeln!(out, "store: embedded, {} ({fs}) (bytes: wchar of /proc/self/io)", scratch.path().display())?,
    }
    writeln!(
        out,
        "one session, {} tasks; answer cache {} entries, refuse; m={} d=10, every answer contested and charged",
        args.concurrency, args.cached, args.teachers
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<16} {:>9} {:>9} {:>8} {:>8} {:>10} {:>14} {:>12}",
        "run", "prior", "stepped", "charges", "seconds", "charges/s", "bytes/step", "record_bytes"
    )?;
    for p in &points {
        writeln!(
            out,
            "{:<16} {:>9} {:>9} {:>8} {:>8.2} {:>10.0} {:>14.0} {:>12}",
            p.name,
            p.prior,
            p.stepped,
            p.charges,
            p.seconds,
            p.rate(),
            p.bytes_per_step(),
            p.record
        )?;
    }
    writeln!(out)?;
    let (off, first) = (&points[0], &points[1]);
    for p in &points[1..] {
        writeln!(
            out,
            "ratio {}: charges/s vs cache_off {:.3}, vs {} {:.3}; bytes/step vs {} {:.3}",
            p.name,
            p.rate() / off.rate(),
            first.name,
            p.rate() / first.rate(),
            first.name,
            p.bytes_per_step() / first.bytes_per_step()
        )?;
    }
    Ok(())
}

/// Where a point's session lives.
enum Target {
    Embedded(PathBuf),
    Postgres(String),
}

/// Bench principal `index`'s session with `prior` answers before, then
/// `args.steps` fresh queries measured (`name`: the row's).
async fn point(
    args: &Args,
    target: Target,
    index: usize,
    name: &str,
    prior: u64,
    cache: CacheSettings,
) -> anyhow::Result<Point> {
    let (store, wal) = match &target {
        Target::Embedded(path) => (Store::Embedded(Arc::new(EmbeddedStore::open(path)?)), None),
        Target::Postgres(url) => {
            let link = PgLink::plain(args.concurrency + 2);
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
            tokio::spawn(connection);
            (Store::Postgres(Arc::new(PgStore::connect(url, &link).await?)), Some(client))
        }
    };
    let secret = seal_secret(&store, args.teachers, "pacpriv bench history").await?;
    let params = SessionParams {
        per_query: Nats::new(PER_QUERY)?,
        policy: Policy::Paper,
        m: args.teachers,
        secret,
        noise: pacpriv_service::session::secret::establish_noise_key(&store, pacpriv_store::DEFAULT_DATASET).await?,
        journal: false,
        cache,
        calibration: Default::default(),
    };
    // A principal per point, so points sharing a database have their own session.
    let mut all = principals(index + 1)?;
    let principal = all.swap_remove(index);
    let session = principal.name.clone();
    let registry = Arc::new(
        Sessions::new(
            &[principal],
            vec![DatasetTerms::default_dataset(Scope::PerPrincipal, Nats::new(BUDGET)?, params)],
            &store,
        )
        .await?,
    );
    let handle = registry.authenticate(Credential::ApiKey(&key(index))).await?.on(0)?.clone();
    let outputs = TeacherOutputs::Labels {
        labels: (0..args.teachers).map(|i| usize::from(i >= args.teachers - 8)).collect(),
        classes: 10,
    };
    let next = Arc::new(AtomicU64::new(0));
    let stepped = match &wal {
        Some(client) if prior > 1_000 => {
            closed_loop(&handle, &outputs, &next, 1_000, args.concurrency).await?;
            let rows = i64::try_from(prior - 1_000)?;
            client
                .execute(
                    "INSERT INTO pacpriv_answer_cache_evicted (session, owner, prefix) \
                     SELECT $1, 0, substring(decode(md5(random()::text || i::text), 'hex') FROM 1 FOR 8) \
                     FROM generate_series(1, $2::bigint) i ON CONFLICT DO NOTHING",
                    &[&session, &rows],
                )
                .await
                .context("inserting the evicted-query rows of the prior answers")?;
            client.batch_execute("VACUUM ANALYZE pacpriv_answer_cache_evicted").await?;
            1_000
        }
        _ => {
            closed_loop(&handle, &outputs, &next, prior, args.concurrency).await?;
            prior
        }
    };
    let written = async || -> anyhow::Result<u64> {
        match &wal {
            Some(client) => {
                let row = client.query_one("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint", &[]).await?;
                Ok(u64::try_from(row.get::<_, i64>(0))?)
            }
            None => wchar(),
        }
    };
    let before = written().await?;
    let started = Instant::now();
    closed_loop(&handle, &outputs, &next, args.steps, args.concurrency).await?;
    let seconds = started.elapsed().as_secs_f64();
    let bytes = written().await? - before;
    let answered = handle.budget().await?.answered;
    if answered != stepped + args.steps {
        bail!("{name}: the session's ledger answered {answered}, but {} answers returned", stepped + args.steps);
    }
    let record = match &store {
        Store::Embedded(e) => e.stored_len(&session)?.unwrap_or(0),
        Store::Postgres(_) => store.load(&session).await?.map_or(0, |r| r.encode().len()),
    };
    Ok(Point { name: name.to_owned(), prior, stepped, charges: args.steps, seconds, bytes, record })
}

/// `count` fresh queries (numbered from `next` on) by `tasks` concurrent
/// closed loops on one session, each returned once durable.
async fn closed_loop(
    handle: &Handle,
    outputs: &TeacherOutputs,
    next: &Arc<AtomicU64>,
    count: u64,
    tasks: usize,
) -> anyhow::Result<()> {
    let end = next.load(Ordering::Relaxed) + count;
    let mut set = JoinSet::new();
    for _ in 0..tasks {
        let (handle, outputs, next) = (handle.clone(), outputs.clone(), Arc::clone(next));
        set.spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= end {
                    // Leave the counter at `end` for the next loop.
                    next.fetch_min(end, Ordering::Relaxed);
                    return Ok::<(), SessionError>(());
                }
                let asking = Asking {
                    key: Some(handle.cache_key(QueryDigest::of(&[n as f64]))),
                    ..Asking::uncached(None, String::new())
                };
                handle.begin(vec![(Some(outputs.clone()), asking)], Vec::new()).await?.release().await?;
            }
        });
    }
    while let Some(done) = set.join_next().await {
        done.context("a bench task panicked")??;
    }
    Ok(())
}

/// Bytes this process has handed the kernel to write so far.
fn wchar() -> anyhow::Result<u64> {
    let io = std::fs::read_to_string("/proc/self/io").context("reading /proc/self/io")?;
    io.lines().find_map(|l| l.strip_prefix("wchar:")?.trim().parse().ok()).context("no wchar in /proc/self/io")
}
