//! `pacpriv bench`: measurements for `BENCHMARKS.md`, each with its
//! baselines taken in the same run so results are read as ratios. One
//! subcommand per file.

pub mod sessions;
pub mod store;

use clap::Subcommand;

/// Arguments of `pacpriv bench`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// What to measure.
    #[command(subcommand)]
    pub command: Command,
}

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Durable charges per second through the session path with the
    /// embedded store's group commit, against a math-only loop and a
    /// sequential one-fsync-per-charge session in the same run.
    Store(store::Args),
    /// Resident memory per idle session: provisions N principals, then
    /// measures the process's RSS before and after opening their sessions.
    Sessions(sessions::Args),
}

/// Runs one benchmark, writing its report to `out`.
///
/// # Errors
/// Bad arguments, or whatever the benchmark hit (store, I/O).
pub fn run(args: Args, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    match args.command {
        Command::Store(args) => store::run(args, out),
        Command::Sessions(args) => sessions::run(args, out),
    }
}
