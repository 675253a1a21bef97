//! `pacpriv utility`: the accuracy-vs-budget report on the demo ensemble,
//! run as a real process with few trials, checked against what holds on
//! every run whatever the noise, secret and order: unanimous answers are
//! exact, `paper` answers exactly ⌊B/b⌋ times, and `contested` answers land
//! between the bounds its unanimous share fixes.

use crate::util::{pacpriv, pacpriv_ok};

/// Budget B = 2^B_EXP and per-query budgets b = 2^e.
const B_EXP: i32 = -8;
const B_EXPS: [i32; 5] = [-4, -8, -16, -20, -24];
/// Reached by `paper` at 2^-24 (⌊B/b⌋ = 65,536), not below.
const CAP: u64 = 30_000;

/// The numbers of the first line: n held-out, unanimous, unanimous and
/// correct.
fn split_counts(report: &str) -> (u64, u64, u64) {
    let line = report.lines().find(|l| l.contains("held-out split:")).expect("a held-out split line");
    let after = |needle: &str| -> u64 {
        let (head, _) = line.split_once(needle).unwrap_or_else(|| panic!("{needle:?} in {line}"));
        head.rsplit(|c: char| !c.is_ascii_digit()).find(|w| !w.is_empty()).expect("a number").parse().expect("a count")
    };
    (after(" examples"), after(" unanimous (all"), after(" unanimous and correct"))
}

/// The cells of the Markdown table row starting with `| first |`.
fn row<'a>(report: &'a str, first: &str) -> Vec<&'a str> {
    let prefix = format!("| {first} |");
    let line = report.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no row {first}:\n{report}"));
    line.trim_matches('|').split('|').map(str::trim).collect()
}

/// `1,234` → 1234.
fn count(cell: &str) -> u64 {
    cell.replace(',', "").parse().unwrap_or_else(|_| panic!("a count: {cell:?}"))
}

/// A count cell: `256`, `1,172.3 [1,157–1,205]` (→ min, max) or `≥ N`
/// (→ None).
fn range(cell: &str) -> Option<(u64, u64)> {
    if cell.starts_with('≥') {
        return None;
    }
    match cell.split_once('[') {
        Some((_, r)) => {
            let (lo, hi) = r.trim_end_matches(']').split_once('–').expect("min–max");
            Some((count(lo), count(hi)))
        }
        None => Some((count(cell), count(cell))),
    }
}

/// `87.95 ± 0.21` → 87.95.
fn mean(cell: &str) -> f64 {
    cell.split('±').next().and_then(|m| m.trim().parse().ok()).unwrap_or_else(|| panic!("a percentage: {cell:?}"))
}

#[test]
fn report_holds_what_every_run_must() {
    let dir = tempfile::tempdir().expect("temp dir");
    let csv = dir.path().join("utility.csv");
    let per_query = B_EXPS.map(|e| format!("2^{e}")).join(",");
    let (budget, cap) = (format!("2^{B_EXP}"), CAP.to_string());
    let report = pacpriv_ok(&[
        "utility",
        "--per-query-mi",
        &per_query,
        "--budget-mi",
        &budget,
        "--trials",
        "3",
        "--max-queries",
        &cap,
        "--csv",
        &csv.display().to_string(),
    ]);
    let (n, unanimous, unanimous_correct) = split_counts(&report);
    assert!(n > 300 && unanimous_correct <= unanimous && unanimous < n, "{report}");
    let floor = 100.0 * unanimous_correct as f64 / n as f64 - 0.005;

    // Accuracy: unanimous answers are exact, so no b (nor b = ∞, the mean
    // of teachers that all get those right) goes below the
    // unanimous-and-correct share; nothing goes above 100 %.
    let acc = row(&report, "Optical digits (m = 128)");
    assert_eq!(acc.len(), 1 + 2 + B_EXPS.len() + 1, "{acc:?}");
    let non_private = mean(acc[1]);
    assert!(non_private > 0.0 && non_private <= 100.0, "{report}");
    for cell in &acc[2..acc.len() - 1] {
        let pct = mean(cell);
        assert!((floor..=100.0).contains(&pct), "{cell} outside [{floor}, 100]:\n{report}");
    }
    let shown_unanimous = mean(acc[acc.len() - 1]);
    assert!((shown_unanimous - 100.0 * unanimous as f64 / n as f64).abs() <= 0.005, "{report}");

    // Unanimous only: exactly the unanimous examples answered, the
    // unanimous-and-correct ones right, the rest refused, nothing spent.
    let only = row(&report, "unanimous_only");
    assert_eq!((count(only[1]), count(only[4])), (unanimous, n - unanimous), "{report}");
    let accuracy = 100.0 * unanimous_correct as f64 / unanimous as f64;
    assert!((mean(only[3]) - accuracy).abs() <= 0.005 && only[5] == "0", "{report}");

    for e in B_EXPS {
        let cells = row(&report, &format!("2^{e}"));
        let planned = if e > B_EXP { 0 } else { 1u64 << (B_EXP - e) };
        assert_eq!(count(cells[3]), planned, "⌊B/b⌋ at 2^{e}:\n{report}");
        // paper: exactly ⌊B/b⌋ answers, or the cap if that comes first.
        match range(cells[1]) {
            Some(paper) => assert_eq!(paper, (planned, planned), "paper at 2^{e}:\n{report}"),
            None => assert!(planned >= CAP, "paper capped at 2^{e} but ⌊B/b⌋ = {planned}:\n{report}"),
        }
        // contested: ⌊B/b⌋ = q·c + r charged answers among passes of c
        // contested and u free queries stop between q·n + r and q·n + r + u.
        let c = n - unanimous;
        let low = planned / c * n + planned % c;
        let high = low + unanimous;
        match range(cells[2]) {
            Some((min, max)) => {
                assert!(min >= planned, "contested < paper at 2^{e}:\n{report}");
                assert!(low <= min && max <= high, "contested at 2^{e} outside [{low}, {high}]:\n{report}");
            }
            None => assert!(high >= CAP, "contested capped at 2^{e} though it must stop by {high}:\n{report}"),
        }
        let expected: f64 = cells[4].replace(',', "").parse().expect("an expected count");
        assert!((low as f64..=high as f64).contains(&expected), "expected at 2^{e}:\n{report}");
    }

    let csv = std::fs::read_to_string(&csv).expect("the CSV was written");
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 1 + 2 + B_EXPS.len(), "{csv}");
    assert!(lines[0].starts_with("b,b_nats,accuracy_pct,"), "{csv}");
    assert!(lines[1].starts_with("non-private,") && lines[2].starts_with("inf,"), "{csv}");
    let at_16 = lines.iter().find(|l| l.starts_with("2^-16,")).expect("a 2^-16 row");
    let header: Vec<&str> = lines[0].split(',').collect();
    let field = |name: &str| at_16.split(',').nth(header.iter().position(|h| *h == name).expect(name)).expect(name);
    assert_eq!(
        (field("planned_answers"), field("paper_answers_min"), field("paper_answers_max")),
        ("256", "256", "256")
    );
}

#[test]
fn remote_teachers_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = dir.path().join("remote.toml");
    std::fs::write(
        &cfg,
        "[teachers]\nsource = \"remote\"\nremote = [\n  { endpoint = \"http://127.0.0.1:9\", model = \"a\", version = \"\" },\n  \
         { endpoint = \"http://127.0.0.1:9\", model = \"b\", version = \"\" },\n]\n",
    )
    .expect("write config");
    let out = pacpriv(&["utility", "--config", &cfg.display().to_string()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("teachers.source is \"remote\"") && err.contains("demo ensemble"), "{err}");
    assert!(out.stdout.is_empty(), "nothing is reported");
}
