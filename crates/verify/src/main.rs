//! `pacpriv-verify FILE`: the verifier alone, for an auditor's own machine.
//! The same arguments, report and exit statuses as `pacpriv verify`: 0
//! when the export verifies, 65 (`EX_DATAERR`) when it does not, 64 for
//! anything else (an unreadable file or key file), 2 for bad arguments.

use clap::Parser;
use pacpriv_verify::{Args, EXAMPLES, Failed, run};
use std::process::ExitCode;

/// Checks an exported journal (`pacpriv admin export`) from its records
/// alone: the hash chain, every step re-derived, the noise audit, and with
/// `--noise-key` every keyed step exactly. Links no server.
#[derive(Parser)]
#[command(name = "pacpriv-verify", version, after_long_help = EXAMPLES)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.args, &mut std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(if e.downcast_ref::<Failed>().is_some() { 65 } else { 64 })
        }
    }
}
