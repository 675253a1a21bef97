//! The `pacpriv` binary: parse arguments, run (each command installs its
//! own logging, since `serve` takes the format from its configuration).

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    pacpriv::cli::blas::use_best_kernels();
    let cli = pacpriv::cli::Cli::parse();
    let stdout = std::io::stdout();
    match pacpriv::cli::run(cli, &mut stdout.lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(pacpriv::cli::exit_status(&e))
        }
    }
}
