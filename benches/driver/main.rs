//! `pacpriv-bench`: measurements of the running system, each a subcommand
//! with its own `Args` and `run`, reporting Markdown for BENCHMARKS.md.
//! A driver over the library, not part of it (its own binary target, so
//! `cargo build --release` builds it beside `pacpriv`):
//! `target/release/pacpriv-bench service|store|sessions …`.
//!
//! - `service` ([`service`]): closed-loop load (`load`) on the privatizer
//!   and, in the same run against the same teachers, on a plain fan-out
//!   proxy (`proxy`) — the throughput and latency ratios of issue 7,
//!   with where the time went (`observe`), as Markdown (`report`);
//! - `store` ([`store`]): durable charges per second through the session
//!   path and the embedded store's group commit;
//! - `sessions` ([`sessions`]): resident memory per idle session (per
//!   principal and dataset with `--datasets`);
//! - `models` ([`models`]): the server's resident memory per further model;
//! - `history` ([`history`]): a step's cost and bytes written as one
//!   session's history grows, on either store;
//! - `cluster-load` ([`cluster`]): the cluster test's clients
//!   (`tests/cluster`), one JSON line per query;
//! - `verify` ([`verify`]): `pacpriv verify` on a real journal of N steps,
//!   against the mechanism's time for the same steps;
//! - `math` ([`math`]): privacy math per query (label mode; vector mode
//!   with `--vector`) against the paper's numpy path
//!   (`benches/numpy/paper_path.py`), in one run.
//!
//! Benchmarks log only warnings by default (`RUST_LOG` overrides): the
//! service logs every answer at `info`, which would measure the terminal.

use clap::{Parser, Subcommand};
use std::io::Write;
use std::process::ExitCode;

mod cluster;
mod footprint;
mod history;
mod load;
mod math;
mod models;
mod observe;
mod plan;
mod proxy;
mod report;
mod scratch;
mod service;
mod sessions;
mod store;
mod verify;

/// Arguments of `pacpriv-bench`.
#[derive(Debug, Parser)]
#[command(name = "pacpriv-bench", version, about = "Benchmarks of pacpriv, reported as Markdown for BENCHMARKS.md")]
pub struct Args {
    /// What to measure.
    #[command(subcommand)]
    pub command: Command,
}

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Closed-loop load (N principals, unary Predict) on the privatizer and
    /// on a plain fan-out proxy over the same teachers, in one run:
    /// throughput, latency percentiles and their ratios.
    Service(service::Args),
    /// Durable charges per second through the session path with the
    /// embedded store's group commit, against a math-only loop and a
    /// sequential one-fsync-per-charge session in the same run.
    Store(store::Args),
    /// Resident memory per idle session: provisions N principals, then
    /// measures the process's RSS before and after opening their sessions.
    Sessions(sessions::Args),
    /// The server's resident memory with k more models of one dataset,
    /// each with remote teachers of its own: the cost of one more model.
    Models(models::Args),
    /// What a step costs as one session's history grows: durable charges/s
    /// and bytes written per step with P prior answers (cache full, refuse),
    /// beside the cache off, on the embedded store or PostgreSQL.
    History(history::Args),
    /// The cluster test's clients: fresh queries spread over replicas, each
    /// retried on retryable statuses until it has an outcome; one JSON line
    /// per query on standard output.
    ClusterLoad(cluster::Args),
    /// `pacpriv verify` on a journal of N real steps (100 000 by default),
    /// against the time the mechanism took to answer them.
    Verify(verify::Args),
    /// Privacy math per query (label mode; vector mode with `--vector`)
    /// against the paper's numpy path (`benches/numpy/paper_path.py`) on
    /// the same inputs, in one run.
    Math(math::Args),
}

fn main() -> ExitCode {
    pacpriv::cli::startup::tune_process();
    let args = Args::parse();
    let mut out = std::io::stdout().lock();
    match run(args, &mut out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs one benchmark, writing its report to `out`.
///
/// # Errors
/// Whatever the benchmark reports (bad arguments, a failed start, a
/// correctness violation).
fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let _logs = init_quiet_tracing();
    match args.command {
        Command::Service(args) => service::run(args, out),
        Command::Store(args) => store::run(args, out),
        Command::Sessions(args) => sessions::run(args, out),
        Command::Models(args) => models::run(args, out),
        Command::History(args) => history::run(args, out),
        Command::ClusterLoad(args) => cluster::run(args, out),
        Command::Verify(args) => verify::run(args, out),
        Command::Math(args) => math::run(args, out),
    }
}

/// Logs to standard error at `RUST_LOG`, by default warnings only — and not
/// the warning every fresh store's first start gives about its new secret
/// (each privatizer target starts on an empty store on purpose) — through
/// the server's writer (`trace::Lines`), so that `RUST_LOG=info` measures
/// the logs as `pacpriv serve` writes them. Keep the result while
/// measuring: dropped, it writes out what waits.
fn init_quiet_tracing() -> pacpriv_service::trace::Lines {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "warn,pacpriv_service::session::secret=error".into());
    let lines = pacpriv_service::trace::Lines::to_stderr();
    // A second initialisation (tests calling run twice) keeps the first.
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(lines.writer()).try_init();
    lines
}
