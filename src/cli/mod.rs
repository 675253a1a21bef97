//! The `pacpriv` command line: the subcommands, and which crate runs each.
//! The servers are here ([`serve`], [`teachers`]); the tools and clients
//! are `pacpriv_tools`, one module per subcommand, each with `Args`
//! (parsed and validated by clap) and `run` (applies them).
//!
//! `anyhow` is allowed here and in the tools only; the libraries below
//! return typed errors.

use clap::{Parser, Subcommand};
use pacpriv_tools::{Resumable, admin, budget, health, label, subsets, verify};
#[cfg(feature = "demo")]
use pacpriv_tools::{audit, tune, utility};

pub mod blas;
pub mod malloc;
pub mod serve;
pub mod startup;
#[cfg(feature = "demo")]
pub mod teachers;

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
    #[cfg(feature = "demo")]
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
    #[cfg(feature = "demo")]
    Audit(audit::Args),
    /// Held-out accuracy at several per-query budgets under both charging
    /// policies, and how many answers a budget buys (paper Table 3).
    #[cfg(feature = "demo")]
    Utility(utility::Args),
    /// Check an exported journal (`pacpriv admin export`) from its records
    /// alone: hash chain, every charge, certificate and posterior update,
    /// each session's stored account, and a statistical audit that the
    /// releases carry the calibrated noise. Exits 65 naming the records
    /// (up to 20) and sessions that do not pass.
    #[command(after_long_help = verify::EXAMPLES)]
    Verify(verify::Args),
    /// Choose the per-query budget b and the demo teachers' regularisation
    /// for a target total budget, by simulated privatized accuracy on
    /// held-out data; prints the table searched and the config lines.
    #[cfg(feature = "demo")]
    Tune(tune::Args),
}

impl Command {
    /// The servers and the admin/health clients set up logging from their
    /// configuration; the tools log to standard error at `RUST_LOG`.
    fn logs_itself(&self) -> bool {
        match self {
            Command::Serve(_) | Command::Health(_) | Command::Admin(_) => true,
            #[cfg(feature = "demo")]
            Command::Teachers(_) => true,
            _ => false,
        }
    }
}

/// Runs one parsed command, writing its report to `out`.
///
/// # Errors
/// Whatever the subcommand reports (bad arguments, I/O).
pub fn run(cli: Cli, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    if !cli.command.logs_itself() {
        init_tracing(false);
    }
    match cli.command {
        Command::Serve(args) => serve::run(args, out),
        #[cfg(feature = "demo")]
        Command::Teachers(args) => teachers::run(args, out),
        Command::Health(args) => health::run(args, out),
        Command::Admin(args) => admin::run(args, out),
        Command::Budget(args) => budget::run(args, out),
        Command::Subsets(args) => subsets::run(args, out),
        Command::Label(args) => label::run(args, out),
        #[cfg(feature = "demo")]
        Command::Audit(args) => audit::run(args, out),
        #[cfg(feature = "demo")]
        Command::Utility(args) => utility::run(args, out),
        Command::Verify(args) => verify::run(args, out),
        #[cfg(feature = "demo")]
        Command::Tune(args) => tune::run(args, out),
    }
}

/// What `pacpriv --version` prints: the release, and every format it
/// writes (and the oldest it still reads), so that an operator can tell
/// whether two releases can share a store or read each other's exports.
pub fn long_version() -> String {
    use pacpriv_store::{postgres, record};
    format!(
        "{version}\n\
         store records: sessions format {session} ({tail} with a cache tail), \
         journal entries, events and principals format {format} ({budgets} for a principal with \
         per-dataset budgets); reads every format from 1\n\
         PostgreSQL schema: migration {schema}\n\
         journal export: {export}",
        version = env!("CARGO_PKG_VERSION"),
        session = record::SESSION_FORMAT,
        tail = record::TAIL_FORMAT,
        format = record::FORMAT,
        budgets = record::PRINCIPAL_BUDGETS_FORMAT,
        schema = postgres::SCHEMA_VERSION,
        export = verify::format::FORMAT,
    )
}

/// The exit status for an error returned by [`run`]: 75 for [`Resumable`],
/// 65 (`EX_DATAERR`) for a journal that does not verify, 64 (`EX_USAGE`)
/// for everything else — bad arguments or configuration, unwritable paths,
/// unbindable addresses: things the operator can fix.
pub fn exit_status(error: &anyhow::Error) -> u8 {
    if error.downcast_ref::<Resumable>().is_some() {
        75
    } else if error.downcast_ref::<verify::Failed>().is_some() {
        65
    } else {
        64
    }
}

/// Logs to standard error (standard output is for results), filtered by
/// `RUST_LOG` (default `info`), as JSON lines when `json`; colours only
/// when standard error is a terminal.
pub fn init_tracing(json: bool) {
    // A second initialisation (tests calling run twice) keeps the first.
    pacpriv_service::trace::install_direct(json);
}
