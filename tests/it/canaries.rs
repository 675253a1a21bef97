//! Issue 25 §2: `pacpriv audit --canaries` against live servers whose demo
//! teachers were trained with 32 planted canaries. Against the real server
//! every lower bound it reports stays below what the session was charged;
//! against a deliberately under-noised build (`examples/undernoised.rs`:
//! Σ calibrated to 2¹⁶·b, b charged) its guesses are right and the
//! information they imply exceeds the charge, so it fails, saying so.

use crate::util::Process;
use std::path::Path;
use std::process::Output;

const CANARIES: usize = 32;

/// The deployment both servers and the auditor share (through the
/// environment: the broken server takes no `--config`).
fn env(dir: &Path) -> Vec<(&'static str, String)> {
    std::fs::write(dir.join("secret"), "11\n").expect("secret");
    vec![
        ("PACPRIV__DEMO__MODELS", "16".to_owned()),
        ("PACPRIV__DEMO__CANARIES", CANARIES.to_string()),
        ("PACPRIV__PRIVACY__PER_QUERY_MI", "2^-10".to_owned()),
        ("PACPRIV__PRIVACY__RELEASE_NOISY_VECTOR", "true".to_owned()),
        ("PACPRIV__PRIVACY__SECRET_INDEX_FILE", dir.join("secret").display().to_string()),
        ("PACPRIV__PRINCIPALS__DEMO__BUDGET_MI", "10".to_owned()),
    ]
}

fn audit(server: &Process, dir: &Path, env: &[(&str, String)]) -> Output {
    let path = |name: &str| dir.join(name).display().to_string();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_pacpriv"));
    cmd.args(["audit", "--canaries", "--addr", &server.addr, "--api-key", "demo-key", "--checkpoints", "4"])
        .args(["--secret-index-file", &path("secret"), "--csv", &path("canaries.csv"), "--plot", &path("canaries.svg")])
        .env("OPENBLAS_NUM_THREADS", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("pacpriv audit runs")
}

/// The cells of the report's last table row.
fn last_row(report: &str) -> Vec<String> {
    let line = report.lines().rfind(|l| l.starts_with(&format!("| {CANARIES} |"))).expect("the last checkpoint");
    line.trim_matches('|').split('|').map(|c| c.trim().to_owned()).collect()
}

fn nats(cell: &str) -> f64 {
    cell.trim_end_matches(" **above B**").parse().unwrap_or_else(|_| panic!("a number: {cell:?}"))
}

#[test]
fn lower_bounds_stay_below_the_charge_and_an_under_noised_build_is_caught() {
    let dir = tempfile::tempdir().expect("temp dir");
    let env = env(dir.path());

    let honest = Process::serve(None, &env);
    let o = audit(&honest, dir.path(), &env);
    let report = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{report}{}", String::from_utf8_lossy(&o.stderr));
    let row = last_row(&report);
    // canaries | answers | B | Table-1 | right | CP accuracy | leaked ≥ | direct
    let (charged, leaked) = (nats(&row[2]), nats(&row[6]));
    assert_eq!(row[1], (5 * CANARIES).to_string(), "each canary once as itself and 4 times perturbed: {report}");
    assert_eq!(charged, 5.0 * CANARIES as f64 / 1024.0, "{report}");
    assert!(leaked <= charged, "the lower bound stays below what was charged: {report}");
    let table_1: f64 = row[3].trim_end_matches(" %").parse().expect("percent");
    let accuracy_lower: f64 = row[5].trim_end_matches(" %").parse().expect("percent");
    assert!(accuracy_lower <= table_1, "{report}");
    let svg = std::fs::read_to_string(dir.path().join("canaries.svg")).expect("plot written");
    assert!(svg.contains("<svg") && svg.contains("leaked"), "an SVG with its legend");
    drop(honest);

    let broken = Process::serve_program(Path::new(env!("CARGO_BIN_EXE_pacpriv-undernoised")), None, &env);
    assert!(broken.logs().contains("UNDER-NOISED ON PURPOSE"), "{}", broken.logs());
    let o = audit(&broken, dir.path(), &env);
    let (report, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(!o.status.success(), "the harness must catch it:\n{report}");
    assert!(err.contains("released more than its accounting says"), "{err}");
    let row = last_row(&report);
    assert!(nats(&row[6]) > nats(&row[2]), "{report}");
    let right: u64 = row[4].split(" / ").next().and_then(|x| x.parse().ok()).expect("guesses right");
    assert!(right >= 28, "near-noiseless answers give the canaries away: {report}");
}
