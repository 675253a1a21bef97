//! `pacpriv budget`: the Table 1 calculator, run as a real process.

use crate::util::{pacpriv, pacpriv_ok};

/// The line of `report` that contains `needle`, failing with the report.
fn line_with<'a>(report: &'a str, needle: &str) -> &'a str {
    report.lines().find(|line| line.contains(needle)).unwrap_or_else(|| panic!("no line with {needle:?} in:\n{report}"))
}

/// Runs `pacpriv budget args` expecting failure; returns stderr.
fn budget_fails(args: &[&str]) -> String {
    let mut all = vec!["budget"];
    all.extend_from_slice(args);
    let out = pacpriv(&all);
    assert!(!out.status.success(), "pacpriv {all:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn one_million_queries_at_2_pow_minus_32() {
    let report = pacpriv_ok(&["budget", "--per-query-mi", "2^-32", "--queries", "1000000"]);
    assert!(line_with(&report, "MIA").contains("51.08 %"), "{report}");
    assert!(line_with(&report, "ε-equivalent (δ = 1e-5)").contains("0.0431"), "{report}");
    assert!(line_with(&report, "per-query MI").contains("2^-32"), "{report}");
    assert!(line_with(&report, "queries").contains("1000000"), "{report}");
}

#[test]
fn one_query_at_2_pow_minus_8() {
    let report = pacpriv_ok(&["budget", "--per-query-mi", "2^-8", "--queries", "1"]);
    assert!(line_with(&report, "MIA").contains("54.4"), "{report}");
    assert!(line_with(&report, "MIA").ends_with(" %"), "{report}");
    // T defaults to 1.
    assert_eq!(pacpriv_ok(&["budget", "--per-query-mi", "2^-8"]), report);
    // The Python spelling of the power is accepted too.
    let python = pacpriv_ok(&["budget", "--per-query-mi", "2**-8"]);
    assert_eq!(line_with(&python, "MIA"), line_with(&report, "MIA"));
}

#[test]
fn saturated_bound() {
    let report = pacpriv_ok(&["budget", "--per-query-mi", "2^-4", "--queries", "100"]);
    assert!(line_with(&report, "MIA").contains("100.00 %"), "{report}");
    assert!(line_with(&report, "ε-equivalent").contains('∞'), "{report}");
}

#[test]
fn target_epsilon_plans_table_1_row() {
    let report = pacpriv_ok(&["budget", "--target-epsilon", "1", "--per-query-mi", "2^-32"]);
    assert!(line_with(&report, "largest T").contains("476512710 (477M)"), "{report}");
    let report = pacpriv_ok(&["budget", "--per-query-mi", "2^-4", "--target-epsilon", "8"]);
    assert!(line_with(&report, "largest T").contains("11 (11)"), "{report}");
}

#[test]
fn target_mia_in_percent() {
    // 10⁶ queries at 2⁻³² give 51.079 %, so a 51.08 % target allows at least 10⁶.
    let report = pacpriv_ok(&["budget", "--per-query-mi", "2^-32", "--target-mia", "51.08"]);
    let line = line_with(&report, "largest T");
    let t: u64 = line
        .split_whitespace()
        .find_map(|word| word.parse().ok().filter(|&t: &u64| t >= 1000))
        .unwrap_or_else(|| panic!("no count in {line:?}"));
    assert!((1_000_000..1_010_000).contains(&t), "{line}");
}

#[test]
fn decimal_budget_accepted() {
    let report = pacpriv_ok(&["budget", "--per-query-mi", "0.0039", "--queries", "10"]);
    assert!(line_with(&report, "per-query MI").contains("0.0039"), "{report}");
    assert!(line_with(&report, "total MI").contains("3.9e-2"), "{report}");
    assert!(line_with(&report, "MIA").contains(" %"), "{report}");
}

#[test]
fn bad_per_query_mi_is_rejected_with_the_flag_and_value() {
    for value in ["-1", "abc"] {
        let stderr = budget_fails(&["--per-query-mi", value]);
        assert!(stderr.contains("--per-query-mi"), "{value}: {stderr}");
        assert!(stderr.contains(value), "{value}: {stderr}");
    }
    assert!(budget_fails(&["--per-query-mi", "-1"]).contains("non-negative"));
    assert!(budget_fails(&[]).contains("--per-query-mi"), "the flag is required");
}

#[test]
fn bad_targets_are_rejected() {
    let stderr = budget_fails(&["--per-query-mi", "2^-32", "--target-mia", "120"]);
    assert!(stderr.contains("--target-mia 120"), "{stderr}");
    let stderr = budget_fails(&["--per-query-mi", "2^-32", "--target-epsilon", "-1"]);
    assert!(stderr.contains("--target-epsilon -1"), "{stderr}");
    let stderr = budget_fails(&["--per-query-mi", "2^-32", "--target-mia", "60", "--target-epsilon", "1"]);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}
