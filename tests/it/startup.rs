//! What the binaries set in their own environment at start-up
//! (`pacpriv::cli::startup`): OpenBLAS's widest kernels for the CPU, as
//! OpenBLAS itself reports them at load (`OPENBLAS_VERBOSE=2` prints
//! `Core: …`), and glibc's allocator thresholds, as the running server's
//! environment shows them.

use crate::util::Process;
use pacpriv::cli::blas::{CORETYPE, best_core};
use pacpriv::cli::malloc::{TUNABLES, tunables};
use std::process::Command;

/// The core OpenBLAS last reported loading with, and the command's stdout.
fn kernels_of(program: &str, args: &[&str], coretype: Option<&str>) -> (String, String) {
    let mut command = Command::new(program);
    command.args(args).env("OPENBLAS_VERBOSE", "2").env_remove(CORETYPE);
    if let Some(core) = coretype {
        command.env(CORETYPE, core);
    }
    let out = command.output().expect("the binary runs");
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let core = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("Core: "))
        .next_back()
        .unwrap_or_else(|| panic!("OpenBLAS reported no core (is it built with DYNAMIC_ARCH?): {stderr}"))
        .trim()
        .to_owned();
    (core, String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn binaries_run_on_the_widest_kernels_their_cpu_allows_unless_the_operator_chose() {
    let args = ["budget", "--per-query-mi", "2^-32", "--queries", "1000"];
    let (core, report) = kernels_of(env!("CARGO_BIN_EXE_pacpriv"), &args, None);
    if let Some(best) = best_core() {
        assert_eq!(core, best, "pacpriv should have re-executed itself with {CORETYPE}={best}");
    }
    // The operator's choice stands, and the command's output is the same.
    let (chosen, same) = kernels_of(env!("CARGO_BIN_EXE_pacpriv"), &args, Some("Prescott"));
    assert_eq!((chosen.as_str(), same), ("Prescott", report));

    let (bench_core, _) = kernels_of(env!("CARGO_BIN_EXE_pacpriv-bench"), &["--help"], None);
    if let Some(best) = best_core() {
        assert_eq!(bench_core, best);
    }
}

/// The server runs with the allocator thresholds that keep vector-mode
/// arrays between answers (`pacpriv::cli::malloc`), read from its own
/// `/proc/PID/environ` after the re-execution. (An operator's own
/// `GLIBC_TUNABLES` is kept: `malloc`'s unit test.)
#[test]
fn the_server_runs_with_the_allocator_thresholds() {
    assert!(std::env::var_os(TUNABLES).is_none(), "run the tests without {TUNABLES} in the environment");
    let server = Process::serve(None, &[]);
    let environ = std::fs::read(format!("/proc/{}/environ", server.pid())).expect("the server's environment");
    // glibc parses GLIBC_TUNABLES in place at load, leaving a NUL where
    // each ':' was, so look for each setting rather than the whole value.
    let environ = String::from_utf8_lossy(&environ);
    assert!(environ.contains(&format!("{TUNABLES}=")), "no {TUNABLES} in the server's environment");
    for setting in tunables().split(':') {
        assert!(environ.contains(setting), "{setting} not in the server's environment: {environ:?}");
    }
}
