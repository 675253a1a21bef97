//! The `pacpriv` binary: parse arguments, run (each command installs its
//! own logging, since `serve` takes the format from its configuration).

use clap::{CommandFactory, FromArgMatches};
use pacpriv::cli::Cli;
use std::process::ExitCode;

fn main() -> ExitCode {
    pacpriv::cli::startup::tune_process();
    // `--version` names the formats too (`-V`: the release alone); built
    // once, for the life of the process.
    let long_version: &'static str = pacpriv::cli::long_version().leak();
    let matches = Cli::command().long_version(long_version).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let stdout = std::io::stdout();
    match pacpriv::cli::run(cli, &mut stdout.lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(pacpriv::cli::exit_status(&e))
        }
    }
}
