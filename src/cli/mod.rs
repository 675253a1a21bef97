//! The `pacpriv` command line: one file per subcommand, each with `Args`
//! (parsed and validated by clap) and `run` (applies them).
//!
//! `anyhow` is allowed here and in `main.rs` only; everything below returns
//! typed errors.

use clap::{Parser, Subcommand};

pub mod budget;
pub mod subsets;

/// PAC-private predictions: privacy budget planning and secret-space tools.
#[derive(Debug, Parser)]
#[command(name = "pacpriv", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// MIA bound and ε-equivalent for T queries at b nats each, or the
    /// largest T for a target (reproduces the paper's Table 1).
    Budget(budget::Args),
    /// Write the secret-space assignment: each of N points in exactly M/2 of
    /// M subsets, chosen uniformly (paper §4.2.1).
    Subsets(subsets::Args),
}

/// Runs one parsed command, writing its report to `out`.
///
/// # Errors
/// Whatever the subcommand reports (bad arguments, I/O).
pub fn run(cli: Cli, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    match cli.command {
        Command::Budget(args) => budget::run(args, out),
        Command::Subsets(args) => subsets::run(args, out),
    }
}
