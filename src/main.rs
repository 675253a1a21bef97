//! The `pacpriv` binary: parse arguments, install tracing, run.

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = pacpriv::cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let stdout = std::io::stdout();
    match pacpriv::cli::run(cli, &mut stdout.lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            // EX_USAGE: every failure of these commands is a bad argument or
            // an unwritable output path the operator can fix.
            ExitCode::from(64)
        }
    }
}
