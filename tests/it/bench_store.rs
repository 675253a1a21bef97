//! `pacpriv bench store` and `pacpriv bench sessions` with tiny
//! parameters: they run, and their reports parse and add up. Never a
//! timing assertion.

use crate::util::bench_ok;

/// A directory on the build's disk (not a possibly RAM-backed /tmp, which
/// the store bench refuses).
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir")
}

/// The whitespace-separated fields of the line starting with `first`.
fn row<'a>(report: &'a str, first: &str) -> Vec<&'a str> {
    let fields = report.lines().map(|l| l.split_whitespace().collect::<Vec<_>>()).find(|f| f.first() == Some(&first));
    fields.unwrap_or_else(|| panic!("no {first:?} line in\n{report}"))
}

fn number(field: &str) -> f64 {
    field.parse().unwrap_or_else(|_| panic!("{field:?} is not a number"))
}

#[test]
fn bench_store_reports_durable_charges_that_the_ledgers_confirm() {
    let dir = scratch();
    let args = ["--seconds", "1", "--count", "400", "--principals", "4", "--concurrency", "8"];
    let more = ["--teachers", "16", "--classes", "3", "--dissent", "2", "--dir"];
    let dir_arg = dir.path().display().to_string();
    let report = bench_ok(&[&["store"][..], &args, &more, &[dir_arg.as_str()]].concat());

    // run sessions tasks charges seconds charges/s commits records/commit commit_ms
    for (name, sessions, tasks) in [("group_commit", 4.0, 8.0), ("sequential", 1.0, 1.0), ("math_only", 4.0, 8.0)] {
        let r = row(&report, name);
        assert_eq!(r.len(), 9, "{report}");
        let (charges, seconds, rate) = (number(r[3]), number(r[4]), number(r[5]));
        // (Rounded as printed, so only their signs are compared.)
        assert_eq!((number(r[1]), number(r[2])), (sessions, tasks), "{report}");
        assert!(charges > 0.0 && charges <= 400.0, "{name}: --count bounds the answers\n{report}");
        assert!(seconds >= 0.0 && rate > 0.0, "{report}");
        if name != "math_only" {
            let (commits, per_commit) = (number(r[6]), number(r[7]));
            assert!(commits >= 1.0 && per_commit >= 1.0, "{report}");
            assert!((commits * per_commit - charges).abs() < 0.5 + 0.05 * commits, "{report}");
            // "ledgers NAME answered N = charges N": the sessions' own count.
            let line = report.lines().find(|l| l.starts_with(&format!("ledgers {name} "))).expect("ledger line");
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(fields.len(), 7, "{report}");
            assert_eq!((number(fields[3]), number(fields[6])), (charges, charges), "{report}");
        }
    }
    assert_eq!(number(row(&report, "outputs:")[1].trim_start_matches("m=")), 16.0, "{report}");
    assert!(std::fs::read_dir(dir.path()).expect("dir").next().is_none(), "the bench removes its store");
}

#[test]
fn bench_sessions_opens_every_provisioned_session_and_itemises_them() {
    let dir = scratch();
    let dir_arg = dir.path().display().to_string();
    let report = bench_ok(&[
        "sessions",
        "--count",
        "2000",
        "--teachers",
        "16",
        "--resumed",
        "--cache-mib",
        "1",
        "--datasets",
        "2",
        "--dir",
        &dir_arg,
    ]);
    assert!(report.contains("provisioned 2000 principals in one transaction"), "{report}");
    assert!(report.contains("answered once on each"), "{report}");
    // A session per principal in each of the two datasets.
    assert_eq!(number(row(&report, "sessions_open")[1]), 4000.0, "{report}");
    let rss = |what: &str| number(row(&report, what)[1]);
    assert!(rss("before") > 0.0 && rss("after") > 0.0, "{report}");
    number(row(&report, "bytes_per_session")[1]);
    let part = |name: &str| number(row(&report, name)[1]);
    // 16 f64 in a malloc chunk: 128 bytes + the header, rounded to 16.
    assert_eq!(part("log_weights"), 144.0, "{report}");
    let parts = part("log_weights") + part("session_objects") + part("maps") + part("names");
    assert!((parts - part("total")).abs() <= 2.0, "{report}");
    assert!(std::fs::read_dir(dir.path()).expect("dir").next().is_none(), "the bench removes its store");
}

/// `pacpriv-bench history` on both stores, tiny: every point's session
/// answered its prior and measured queries (the driver checks the ledger
/// and fails otherwise), each step wrote something, the record stays the
/// same size whatever the history (on the embedded store: within its
/// bounded cache tail).
#[tokio::test(flavor = "multi_thread")]
async fn bench_history_measures_every_point_on_both_stores() {
    let pg = crate::util::Postgres::start();
    let dir = scratch();
    let dir_arg = dir.path().display().to_string();
    let common = ["history", "--prior", "0,150", "--steps", "100", "--teachers", "16", "--cached", "8", "--dir"];
    for extra in [vec![], vec!["--postgres-url", pg.url.as_str()]] {
        let report = bench_ok(&[&common[..], &[dir_arg.as_str()], &extra].concat());
        // run prior stepped charges seconds charges/s bytes/step record_bytes
        let rows: Vec<Vec<&str>> = ["cache_off", "prior_0", "prior_150"].iter().map(|n| row(&report, n)).collect();
        for r in &rows {
            assert_eq!(r.len(), 8, "{report}");
            assert_eq!(number(r[3]), 100.0, "{report}");
            assert!(number(r[5]) > 0.0 && number(r[6]) > 0.0, "{report}");
        }
        assert_eq!((number(rows[2][1]), number(rows[2][2])), (150.0, 150.0), "{report}");
        if extra.is_empty() {
            // The embedded record carries at most a 4 KiB tail of cache
            // changes, whatever the history.
            let bound = number(rows[0][7]) + 4096.0 + 64.0;
            assert!(rows[1..].iter().all(|r| number(r[7]) <= bound), "the record stays bounded\n{report}");
        } else {
            // (A few bytes apart: varint-encoded counters.)
            let grown = number(rows[2][7]) - number(rows[1][7]);
            assert!(grown.abs() <= 16.0, "the record does not grow with history\n{report}");
        }
        assert!(report.contains("ratio prior_150: charges/s vs cache_off"), "{report}");
    }
}

/// `pacpriv-bench store --postgres-url`, tiny, run twice on one database
/// (the second run finds its principals provisioned and its sessions with
/// history): every run's charges are what the sessions' ledgers added.
#[tokio::test(flavor = "multi_thread")]
async fn bench_store_on_postgres_reports_charges_the_ledgers_confirm() {
    let pg = crate::util::Postgres::start();
    let dir = scratch();
    let dir_arg = dir.path().display().to_string();
    for _ in 0..2 {
        let report = bench_ok(&[
            "store",
            "--seconds",
            "1",
            "--count",
            "100",
            "--principals",
            "4",
            "--concurrency",
            "8",
            "--teachers",
            "16",
            "--classes",
            "3",
            "--dissent",
            "2",
            "--dir",
            &dir_arg,
            "--postgres-url",
            &pg.url,
        ]);
        assert!(report.contains("store: postgres"), "{report}");
        for name in ["group_commit", "sequential"] {
            let charges = number(row(&report, name)[3]);
            assert!(charges > 0.0, "{report}");
            let line = report.lines().find(|l| l.starts_with(&format!("ledgers {name} "))).expect("ledger line");
            assert!(line.ends_with(&format!("= charges {charges}")), "{report}");
        }
    }
}

/// `pacpriv-bench models`, tiny: the server with one more model (its own
/// teacher process) answers on both and its resident set is reported.
#[test]
fn bench_models_measures_the_server_with_more_models() {
    let report = bench_ok(&["models", "--more", "0,1", "--teachers", "16"]);
    for k in ["0", "1"] {
        let line = report.lines().find(|l| l.starts_with(&format!("| {k} |"))).unwrap_or_else(|| panic!("{report}"));
        let kib: f64 = line.split('|').nth(2).and_then(|c| c.trim().parse().ok()).unwrap_or_else(|| panic!("{line}"));
        assert!(kib > 1000.0, "{line}");
    }
}
