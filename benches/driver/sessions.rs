//! `pacpriv-bench sessions`: resident memory per idle session. N
//! principals are bulk-provisioned in a temporary embedded store (and,
//! with `--resumed`, each session answers once so it has a durable record
//! to read back, as after a restart); then this process opens the store
//! and measures its resident set before and after [`Sessions::new`], which
//! holds one in-memory session per stored principal.
//!
//! The store is prepared by a child process (this binary with the hidden
//! `--setup PATH`), so that memory the allocator keeps after the
//! preparation cannot be reused by the sessions and hide their cost.

use super::footprint::Footprint;
use super::report::machine;
use super::scratch::scratch;
use super::store::{BUDGET, PER_QUERY, admin_principals, key, principals, seal_secret};
use anyhow::{Context, bail, ensure};
use pacpriv_privacy::Nats;
use pacpriv_privacy::ledger::Policy;
use pacpriv_privacy::mechanism::TeacherOutputs;
use pacpriv_service::session::{Credential, DatasetTerms, Scope, SessionParams, Sessions};
use pacpriv_store::embedded::DEFAULT_CACHE_BYTES;
use pacpriv_store::{EmbeddedStore, Store};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// The fingerprint the bench store's secret index is sealed with.
const TEACHERS: &str = "pacpriv bench sessions";

/// Arguments of `pacpriv-bench sessions`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Number of principals N (one session each).
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub count: usize,
    /// Number of teachers m (the posterior's length).
    #[arg(long, default_value_t = 128, value_name = "M")]
    pub teachers: usize,
    /// Datasets D: every principal has a session in each (the default
    /// one and D − 1 more, fresh), so N·D sessions are measured.
    #[arg(long, default_value_t = 1, value_name = "D")]
    pub datasets: usize,
    /// Give every session one answered query first, so each resumes from a
    /// durable record (read through redb's page cache) instead of the prior.
    #[arg(long)]
    pub resumed: bool,
    /// redb page cache, MiB (default: the store's).
    #[arg(long, value_name = "MIB")]
    pub cache_mib: Option<usize>,
    /// Where to create the temporary store directory (default: the current
    /// directory); it must not be RAM-backed.
    #[arg(long, value_name = "PATH")]
    pub dir: Option<std::path::PathBuf>,
    /// Internal: only prepare the store at PATH, then exit.
    #[arg(long, hide = true, value_name = "PATH")]
    pub setup: Option<std::path::PathBuf>,
}

/// Prepares the store (in a child process), measures, prints the report.
///
/// # Errors
/// Bad arguments, a failed preparation, a store or session failure, or a
/// registry that does not hold N sessions.
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    ensure!(args.count >= 1, "--count must be at least 1");
    ensure!(args.teachers >= 2 && args.teachers.is_multiple_of(2), "--teachers must be even and at least 2");
    ensure!((1..=16).contains(&args.datasets), "--datasets must be 1 to 16 (the default dataset and up to 15 more)");
    if let Some(path) = &args.setup {
        return setup(&args, path, out);
    }
    let (scratch, fs) = scratch(args.dir.as_deref())?;
    let path = scratch.path().join("sessions.redb");
    let prepared = prepare(&args, &path)?;

    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let (before, after, footprint, opened) = runtime.block_on(async {
        let store = Store::Embedded(open(&args, &path)?);
        let params = params(&args, &store).await?;
        let before = Rss::now()?;
        let opening = Instant::now();
        let sessions = Sessions::new(&[], datasets(args.datasets, params)?, &store).await?;
        let opened = opening.elapsed().as_secs_f64();
        let after = Rss::now()?;
        let active = sessions.active_count().await?;
        ensure!(active == args.count, "{active} sessions open, {} expected", args.count);
        // The last principal's session is what the store says it is.
        let last = sessions.authenticate(Credential::ApiKey(&key(args.count - 1))).await?.on(0)?.clone();
        let answered = last.budget().await?.answered;
        ensure!(answered == u64::from(args.resumed), "the last session resumed with {answered} answers");
        let names: Vec<String> = principals(args.count)?.into_iter().map(|p| p.name).collect();
        let footprint = Footprint::of(&names, args.teachers, args.datasets);
        anyhow::Ok((before, after, footprint, opened))
    })?;

    // Per (principal, dataset) session.
    let n = (args.count * args.datasets) as f64;
    let per = |bytes: f64| bytes / n;
    writeln!(out, "pacpriv-bench sessions")?;
    writeln!(out, "machine: {}", machine())?;
    writeln!(
        out,
        "store: {} ({fs}), redb cache {}",
        scratch.path().display(),
        args.cache_mib.map_or_else(|| format!("{} MiB (default)", DEFAULT_CACHE_BYTES >> 20), |m| format!("{m} MiB"))
    )?;
    writeln!(
        out,
        "sessions: {} principals × {} dataset(s) (m={}), {}",
        args.count,
        args.datasets,
        args.teachers,
        if args.resumed { "each resumed from its record after 1 answer" } else { "fresh (uniform prior, no record)" }
    )?;
    out.write_all(prepared.as_bytes())?;
    writeln!(out)?;
    writeln!(out, "{:<8} {:>10} {:>10} {:>10}", "rss_kib", "total", "anon", "file")?;
    for (what, rss) in [("before", &before), ("after", &after)] {
        writeln!(out, "{what:<8} {:>10} {:>10} {:>10}", rss.total, rss.anon, rss.file)?;
    }
    let delta = 1024.0 * after.total.saturating_sub(before.total) as f64;
    writeln!(out)?;
    writeln!(out, "sessions_open {}", footprint.principals * args.datasets)?;
    writeln!(out, "open_seconds {opened:.2} (Sessions::new: every stored session resumed, as at start-up)")?;
    writeln!(out, "bytes_per_session {:.0}", per(delta))?;
    writeln!(out, "estimated heap per session (benches/driver/footprint.rs):")?;
    for (part, bytes) in [
        ("log_weights", footprint.log_weights),
        ("session_objects", footprint.session_objects),
        ("maps", footprint.maps),
        ("names", footprint.names),
        ("total", footprint.total()),
    ] {
        writeln!(out, "  {part:<16} {:>6.0}", per(bytes as f64))?;
    }
    writeln!(out, "unaccounted (redb page cache, allocator) {:.0}", per(delta - footprint.total() as f64))?;
    Ok(())
}

/// Runs this binary with `--setup PATH` and returns what it printed.
fn prepare(args: &Args, path: &Path) -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("locating the pacpriv-bench binary")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["sessions", "--count", &args.count.to_string(), "--teachers", &args.teachers.to_string()]);
    if args.resumed {
        cmd.arg("--resumed");
    }
    if let Some(mib) = args.cache_mib {
        cmd.args(["--cache-mib", &mib.to_string()]);
    }
    let output = cmd.arg("--setup").arg(path).output().context("running the store preparation")?;
    if !output.status.success() {
        bail!("preparing the store failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    String::from_utf8(output.stdout).context("the preparation's output")
}

/// The child's work: seal a secret index, provision N principals in one
/// transaction, and with `--resumed` answer once on every session.
fn setup(args: &Args, path: &Path, out: &mut dyn Write) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        let store = Store::Embedded(open(args, path)?);
        let params = params(args, &store).await?;
        let records = admin_principals(args.count)?;
        let started = Instant::now();
        let stored = store.provision_all(&records).await?;
        ensure!(stored.len() == args.count, "{} principals stored", stored.len());
        writeln!(
            out,
            "provisioned {} principals in one transaction: {:.2} s",
            args.count,
            started.elapsed().as_secs_f64()
        )?;
        if args.resumed {
            let started = Instant::now();
            let sessions = Arc::new(
                Sessions::new(
                    &[],
                    vec![DatasetTerms::default_dataset(Scope::PerPrincipal, Nats::new(BUDGET)?, params)],
                    &store,
                )
                .await?,
            );
            let opened = started.elapsed().as_secs_f64();
            let outputs = TeacherOutputs::Labels {
                labels: (0..args.teachers).map(|i| usize::from(i >= args.teachers - args.teachers / 16)).collect(),
                classes: 10,
            };
            let next = Arc::new(AtomicUsize::new(0));
            let mut set = tokio::task::JoinSet::new();
            for _ in 0..256 {
                let (sessions, outputs, next, count) =
                    (Arc::clone(&sessions), outputs.clone(), Arc::clone(&next), args.count);
                set.spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= count {
                            return anyhow::Ok(());
                        }
                        let handle = sessions.authenticate(Credential::ApiKey(&key(i))).await?.on(0)?.clone();
                        handle.answer(outputs.clone(), None, String::new()).await?;
                    }
                });
            }
            while let Some(done) = set.join_next().await {
                done.context("a preparation task panicked")??;
            }
            writeln!(
                out,
                "opened {} sessions in {opened:.2} s; answered once on each: {:.2} s",
                args.count,
                started.elapsed().as_secs_f64() - opened
            )?;
        }
        anyhow::Ok(())
    })
}

fn open(args: &Args, path: &Path) -> anyhow::Result<Arc<EmbeddedStore>> {
    let metrics = pacpriv_store::StoreMetrics::default();
    Ok(Arc::new(match args.cache_mib {
        Some(mib) => EmbeddedStore::open_with_cache(path, metrics, Arc::default(), mib << 20)?,
        None => EmbeddedStore::open_with(path, metrics, Arc::default())?,
    }))
}

/// The default dataset and `count` − 1 more (`d1`, `d2`, …), all with
/// `params`: only the number of sessions per principal matters here.
fn datasets(count: usize, params: SessionParams) -> anyhow::Result<Vec<DatasetTerms>> {
    let budget = Nats::new(BUDGET)?;
    let mut all = vec![DatasetTerms::default_dataset(Scope::PerPrincipal, budget, params)];
    all.extend((1..count).map(|i| DatasetTerms {
        name: format!("d{i}").into(),
        scope: Scope::PerPrincipal,
        global_budget: budget,
        params: std::sync::Arc::new(params),
    }));
    Ok(all)
}

/// The bench sessions' parameters, with the store's sealed secret index.
async fn params(args: &Args, store: &Store) -> anyhow::Result<SessionParams> {
    let secret = seal_secret(store, args.teachers, TEACHERS).await?;
    Ok(SessionParams {
        per_query: Nats::new(PER_QUERY)?,
        policy: Policy::Paper,
        m: args.teachers,
        secret,
        noise: pacpriv_service::session::secret::establish_noise_key(store, pacpriv_store::DEFAULT_DATASET).await?,
        journal: false,
        cache: pacpriv_service::session::cache::CacheSettings::OFF,
        calibration: Default::default(),
    })
}

/// A process's resident set, KiB (/proc/PID/status).
pub struct Rss {
    pub total: u64,
    anon: u64,
    file: u64,
}

impl Rss {
    /// This process's.
    fn now() -> anyhow::Result<Self> {
        Rss::of("self")
    }

    /// Process `pid`'s (a number, or "self").
    pub fn of(pid: &str) -> anyhow::Result<Self> {
        let path = format!("/proc/{pid}/status");
        let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        let field = |name: &str| -> anyhow::Result<u64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse().ok())
                .with_context(|| format!("no {name} in {path}"))
        };
        Ok(Rss { total: field("VmRSS:")?, anon: field("RssAnon:")?, file: field("RssFile:")? })
    }
}
