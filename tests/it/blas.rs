//! The binaries pick OpenBLAS's widest kernels for the CPU they run on
//! (`pacpriv::cli::blas`): a real process, its kernels as OpenBLAS itself
//! reports them at load (`OPENBLAS_VERBOSE=2` prints `Core: …`).

use pacpriv::cli::blas::{CORETYPE, best_core};
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
