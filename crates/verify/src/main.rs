//! `pacpriv-verify FILE`: the verifier alone, for an auditor's own machine.
//! The same arguments, report and exit statuses as `pacpriv verify`: 0
//! when the export verifies, 65 (`EX_DATAERR`) when it does not, 64 for
//! anything else (an unreadable file or key file), 2 for bad arguments.

use clap::{CommandFactory, FromArgMatches};
use pacpriv_verify::{Args, EXAMPLES, Failed, format, run};
use std::process::ExitCode;

/// Checks an exported journal (`pacpriv admin export`) from its records
/// alone: the hash chain, every step re-derived, the noise audit, and with
/// `--noise-key` every keyed step exactly. Links no server.
#[derive(clap::Parser)]
#[command(name = "pacpriv-verify", version, after_long_help = EXAMPLES)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

fn main() -> ExitCode {
    // `--version` names the export format it reads, as `pacpriv --version`
    // names the one it writes.
    let long_version = format!("{}\njournal export: {}", env!("CARGO_PKG_VERSION"), format::FORMAT).leak();
    let matches = Cli::command().long_version(&*long_version).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match run(cli.args, &mut std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(if e.downcast_ref::<Failed>().is_some() { 65 } else { 64 })
        }
    }
}
