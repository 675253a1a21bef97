//! The `pacpriv` command line: one file per subcommand, each with `Args`
//! (parsed and validated by clap) and `run` (applies them).
//!
//! `anyhow` is allowed here and in `main.rs` only; everything below returns
//! typed errors.

use clap::{Parser, Subcommand};

pub mod admin;
pub mod audit;
pub mod budget;
pub mod connect;
pub mod health;
pub mod label;
pub mod serve;
pub mod subsets;
pub mod teachers;
pub mod utility;

/// PAC-private predictions over gRPC, and the tools around them.
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
    /// Serve private predictions (pacpriv.v1.Privatizer over gRPC). With
    /// the built-in default configuration it trains and serves the demo
    /// teachers in-process.
    Serve(serve::Args),
    /// Create, list, inspect or revoke principals on a running server
    /// (pacpriv.v1.Admin; token from PACPRIV_ADMIN_TOKEN).
    Admin(admin::Args),
    /// Ask a running server's gRPC health service; exit 0 only if SERVING
    /// (for container health checks).
    Health(health::Args),
    /// Train the demo teacher ensemble (optical digits) and serve it over
    /// the Open Inference Protocol.
    Teachers(teachers::Args),
    /// MIA bound and ε-equivalent for T queries at b nats each, or the
    /// largest T for a target (reproduces the paper's Table 1).
    Budget(budget::Args),
    /// Write the secret-space assignment: each of N points in exactly M/2 of
    /// M subsets, chosen uniformly (paper §4.2.1).
    Subsets(subsets::Args),
    /// Label an unlabeled dataset (CSV or JSON lines) through a running
    /// server, keeping only answers that pass the confidence test (paper
    /// §5, Prop. 5.1); resumable without re-spending budget.
    Label(label::Args),
    /// Play the optimal membership-inference adversary (paper Prop. 6.1)
    /// against a running server and compare its accuracy with the bound.
    Audit(audit::Args),
    /// Held-out accuracy at several per-query budgets under both charging
    /// policies, and how many answers a budget buys (paper Table 3).
    Utility(utility::Args),
}

/// Runs one parsed command, writing its report to `out`.
///
/// # Errors
/// Whatever the subcommand reports (bad arguments, I/O).
pub fn run(cli: Cli, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve::run(args, out),
        Command::Teachers(args) => teachers::run(args, out),
        Command::Health(args) => health::run(args, out),
        Command::Admin(args) => admin::run(args, out),
        Command::Budget(args) => {
            init_tracing(false);
            budget::run(args, out)
        }
        Command::Subsets(args) => {
            init_tracing(false);
            subsets::run(args, out)
        }
        Command::Label(args) => {
            init_tracing(false);
            label::run(args, out)
        }
        Command::Audit(args) => {
            init_tracing(false);
            audit::run(args, out)
        }
        Command::Utility(args) => {
            init_tracing(false);
            utility::run(args, out)
        }
    }
}

/// Logs to standard error (standard output is for results), filtered by
/// `RUST_LOG` (default `info`), as JSON lines when `json`.
pub fn init_tracing(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // A second initialisation (tests calling run twice) is harmless.
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}
