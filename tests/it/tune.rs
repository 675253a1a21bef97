//! `pacpriv tune` (issue 25 §4) on the demo ensemble: its choice beats the
//! shipped default on the half of the held-out data the choice never saw,
//! and the configuration lines it prints start a server that answers.

use crate::util::{Process, client, digit, image, pacpriv_ok, predict, small_demo};

/// The privatized accuracy (%) on the line starting with `name`.
fn evaluated(report: &str, name: &str) -> f64 {
    let line = report.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} line:\n{report}"));
    let (_, after) = line.split_once(": ").expect("a figure");
    after.split(' ').next().expect("a number").parse().expect("a percentage")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_choice_beats_the_default_on_unseen_data_and_its_config_serves() {
    let report =
        pacpriv_ok(&["tune", "--per-query-mi", "2^-16,2^-24,2^-32", "--regularisation", "0.01,1", "--trials", "5"]);
    let rows: Vec<&str> = report.lines().filter(|l| l.starts_with("| 0.01 |") || l.starts_with("| 1 |")).collect();
    assert_eq!(rows.len(), 6, "two penalties × three b:\n{report}");
    // B = 2^-8 over 65 536 paper-charged answers: b ≤ 2^-24 pays for them.
    assert!(rows.iter().all(|r| r.contains("2^-16") == r.contains("| no |")), "{report}");
    let (chosen, default) = (evaluated(&report, "chosen"), evaluated(&report, "default"));
    assert!(chosen > default, "the choice ({chosen} %) must beat the default ({default} %):\n{report}");

    let lines = report.split_once("[privacy]").map(|(_, rest)| format!("[privacy]{rest}")).expect("config lines");
    assert!(lines.contains("per_query_mi = \"2^-") && lines.contains("regularisation = "), "{lines}");
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("tuned.toml");
    std::fs::write(&config, &lines).expect("write");
    // The file's b, not the small demo's.
    let env: Vec<_> = small_demo(&[]).into_iter().filter(|(k, _)| *k != "PACPRIV__PRIVACY__PER_QUERY_MI").collect();
    let server = Process::serve(Some(&config), &env);
    let mut c = client(&server.addr).await;
    let answer = predict(&mut c, "alice-key", image("t1", &digit(4))).await.expect("the tuned server answers");
    let b = answer.budget.expect("budget").per_query;
    assert!(lines.contains(&format!("\"2^{}\"", b.log2())), "serving at the tuned b = {b}: {lines}");
}
