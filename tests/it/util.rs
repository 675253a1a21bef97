//! Helpers shared by the integration tests.

use std::process::{Command, Output};

/// Runs the `pacpriv` binary built for this test run with `args`.
pub fn pacpriv(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pacpriv"))
        .args(args)
        .output()
        .expect("the pacpriv binary runs")
}

/// Runs `pacpriv` and returns stdout, failing the test with stderr if the
/// command did not succeed.
pub fn pacpriv_ok(args: &[&str]) -> String {
    let out = pacpriv(args);
    assert!(
        out.status.success(),
        "pacpriv {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}
