//! `pacpriv bench service --smoke`: the load generator's CI run. The
//! command itself checks every answer (it exits non-zero on any failed
//! request, wrong majority vote, wrong charge or budget count); this test
//! checks that it succeeds and that its report has the shape BENCHMARKS.md
//! quotes — proxy and privatizer, batched, unbatched and stacked, so the
//! batching paths are exercised under concurrent load too. Never anything
//! about timing.

use crate::util::bench_ok;

/// The cells of the Markdown table row starting with `| first |`.
fn row<'a>(report: &'a str, first: &str) -> Vec<&'a str> {
    let prefix = format!("| {first} |");
    let line = report.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no row {first}:\n{report}"));
    line.trim_matches('|').split('|').map(str::trim).collect()
}

#[test]
fn smoke_run_answers_everything_correctly_and_reports_every_target() {
    let dir = tempfile::tempdir().expect("temp dir");
    let state = dir.path().display().to_string();
    let report = bench_ok(&["service", "--smoke", "--state-dir", &state]);
    let header = row(&report, "target");
    assert_eq!(header, ["target", "fan-out", "answered", "errors", "answers/s", "p50 ms", "p90 ms", "p99 ms"]);
    let targets =
        ["proxy", "privatizer", "proxy-unbatched", "privatizer-unbatched", "proxy-stacked", "privatizer-stacked"];
    for target in targets {
        let cells = row(&report, target);
        assert_eq!(cells.len(), header.len(), "{target}: {cells:?}");
        let answered: u64 = cells[2].parse().expect("an answer count");
        assert!((1..=200).contains(&answered), "{target}: {answered} answers, smoke caps at 200");
        assert_eq!(cells[3], "0", "{target}: errors");
        for cell in &cells[4..] {
            let v: f64 = cell.parse().unwrap_or_else(|_| panic!("{target}: a number, got {cell:?}"));
            assert!(v.is_finite() && v >= 0.0, "{target}: {cell}");
        }
    }
    for what in ["privatizer vs proxy, default batching", "privatizer batched vs unbatched"] {
        let ratio = row(&report, what);
        assert!(ratio[2].ends_with('×'), "a ratio: {ratio:?}");
    }
    // The where-the-time-went table: a row per target, batch sizes read
    // from the targets' own metrics.
    let cpu = row(&report, "target | teachers");
    assert_eq!(cpu.last(), Some(&"commits/s"), "{cpu:?}");
    let privatizer = report
        .lines()
        .filter(|l| l.starts_with("| privatizer |"))
        .nth(1)
        .unwrap_or_else(|| panic!("a second privatizer row (where the time went):\n{report}"));
    let cells: Vec<&str> = privatizer.trim_matches('|').split('|').map(str::trim).collect();
    let per_fanout: f64 = cells[cells.len() - 3].parse().expect("queries per fan-out");
    assert!(per_fanout >= 1.0, "{privatizer}");
    assert!(report.contains("Checks passed on all"), "{report}");
    // The stores were removed with their targets.
    assert_eq!(std::fs::read_dir(dir.path()).expect("state dir").count(), 0, "store directories left behind");
}

/// `pacpriv-bench verify` (issue 25): a short real journal verifies, and
/// the report has the rows BENCHMARKS.md quotes.
#[test]
fn verify_bench_verifies_a_real_journal() {
    let report = bench_ok(&["verify", "--steps", "500", "--teachers", "16"]);
    assert!(report.contains("on 500 journaled steps (m = 16"), "{report}");
    let answering = row(&report, "answering (the mechanism, baseline)");
    assert_eq!(answering[3], "1.00×", "{report}");
    for verifying in [
        "verifying (read, parse, chain, replay, statistical noise audit)",
        "verifying (read, parse, chain, replay, and the key audit (`--noise-key`))",
    ] {
        assert!(row(&report, verifying)[3].ends_with('×'), "{verifying}: {report}");
    }
}

/// `pacpriv-bench math` (issue 26 §1): the Rust mechanism and the paper's
/// numpy path (run in the interoperability venv, which has numpy) both
/// report every case, with their ratio and a verdict against the goal.
#[test]
fn math_bench_reports_the_ratio_to_the_numpy_path_for_every_case() {
    let python = crate::util::interop_python();
    let python = python.to_str().expect("a UTF-8 path");
    let report = bench_ok(&[
        "math",
        "--queries",
        "50",
        "--numpy-queries",
        "10",
        "--vector",
        "5",
        "--d",
        "10,100",
        "--python",
        python,
    ]);
    for d in ["10", "100"] {
        for pattern in ["k2_120v8", "k3_110v12v6", "k8_spread", "vector_jittered"] {
            let line = report
                .lines()
                .find(|l| l.starts_with(&format!("| {d} | {pattern} |")))
                .unwrap_or_else(|| panic!("no row for d={d} {pattern}: {report}"));
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let rust: f64 = cells[3].parse().expect("Rust µs");
            let numpy: f64 = cells[4].parse().expect("numpy µs");
            assert!(rust > 0.0 && numpy > 0.0, "{line}");
            let verdict = cells[6].rsplit(' ').next().unwrap_or_default();
            assert!(cells[5].ends_with('×') && ["met", "missed"].contains(&verdict), "{line}");
            // And the keyed generator's cost beside a CSPRNG's (issue 66 §5).
            let keyed = report
                .lines()
                .skip_while(|l| !l.starts_with("The draw:"))
                .find(|l| l.starts_with(&format!("| {d} | {pattern} |")))
                .unwrap_or_else(|| panic!("no keyed row for d={d} {pattern}: {report}"));
            let cells: Vec<&str> = keyed.split('|').map(str::trim).collect();
            let (csprng, keyed_us): (f64, f64) = (cells[3].parse().expect("µs"), cells[4].parse().expect("µs"));
            assert!(csprng > 0.0 && keyed_us > 0.0 && cells[5].ends_with('×'), "{keyed}");
        }
    }
}
