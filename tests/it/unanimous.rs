//! Issue 25 §3: `privacy.policy = "unanimous_only"` over real gRPC, on
//! held-out demo digits: every query is either answered exactly by all 16
//! teachers agreeing (charged nothing) or refused FAILED_PRECONDITION with
//! reason CONTESTED, `charged = "false"`; the budget never moves, and
//! the journal's export verifies with every refusal in it. And
//! `pacpriv label --unanimous-only` labels a dataset through it, keeping
//! exactly the unanimous rows and spending nothing.

use crate::util::{
    ADMIN_TOKEN, Process, budget, client, held_out, image, key_hash, pacpriv, pacpriv_verify, predict, small_demo,
    write_csv,
};
use tonic_types::StatusExt;

#[tokio::test(flavor = "multi_thread")]
async fn unanimous_only_answers_agreement_for_free_and_refuses_the_rest_uncharged() {
    let env = small_demo(&[
        ("PACPRIV__PRIVACY__POLICY", "unanimous_only".to_owned()),
        ("PACPRIV__STORE__JOURNAL", "true".to_owned()),
        ("PACPRIV__ADMIN__KEY_SHA256", key_hash(ADMIN_TOKEN)),
    ]);
    let server = Process::serve(None, &env);
    let mut c = client(&server.addr).await;
    let (mut answered, mut correct, mut refused) = (0, 0, 0);
    for (i, example) in held_out(150).iter().enumerate() {
        match predict(&mut c, "alice-key", image(&format!("q{i}"), &example.pixels)).await {
            Ok(r) => {
                assert!(r.unanimous && r.mi_charged == 0.0, "q{i}: only unanimous, free answers: {r:?}");
                answered += 1;
                correct += usize::from(r.label as usize == example.digit);
            }
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::FailedPrecondition, "q{i}: {status:?}");
                let info = status.get_error_details().error_info().cloned().expect("ErrorInfo detail");
                assert_eq!(info.reason, "CONTESTED", "q{i}");
                assert_eq!(info.metadata.get("charged").map(String::as_str), Some("false"), "q{i}");
                assert!(status.message().contains("unanimous_only"), "actionable: {}", status.message());
                refused += 1;
            }
        }
    }
    assert!(answered > 0 && refused > 0, "held-out digits give both kinds: {answered} answered, {refused} refused");
    assert!(correct * 10 >= answered * 9, "unanimous answers are mostly right: {correct}/{answered}");
    let account = budget(&mut c, "alice-key").await;
    assert_eq!((account.spent, account.answered as usize, account.charged), (0.0, answered, 0));
    assert_eq!(account.policy, "unanimous_only");

    // Each refusal is journaled and re-checked: under unanimous_only, on
    // outputs that disagree.
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("journal.jsonl").display().to_string();
    let o = server.admin_cli(&["export", "--out", &file]);
    assert!(o.status.success(), "export: {}", String::from_utf8_lossy(&o.stderr));
    let o = pacpriv_verify(&[&file]);
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "verify: {report}{}", String::from_utf8_lossy(&o.stderr));
    let alice = format!("alice\t{answered}\t0\t{refused}\t0\t");
    assert!(report.lines().any(|l| l.starts_with(&alice)), "{alice:?} in {report}");
}

/// `pacpriv label --unanimous-only` on 80 held-out digits: every row is
/// answered or journaled as contested, the kept labels are the unanimous
/// answers (mostly right), nothing is spent; a rerun sends nothing; a
/// server under another policy is refused before anything is sent.
#[tokio::test(flavor = "multi_thread")]
async fn label_unanimous_only_keeps_the_unanimous_rows_for_free() {
    let server = Process::serve(None, &small_demo(&[("PACPRIV__PRIVACY__POLICY", "unanimous_only".to_owned())]));
    let dir = tempfile::tempdir().expect("temp dir");
    let (input, out) = (dir.path().join("digits.csv"), dir.path().join("labels.csv"));
    let examples = held_out(80);
    write_csv(&input, &examples);
    let addr = format!("http://{}", server.addr);
    let (input_s, out_s) = (input.display().to_string(), out.display().to_string());
    let args = ["label", &input_s, "--out", &out_s, "--addr", &addr, "--api-key", "alice-key", "--unanimous-only"];
    let o = pacpriv(&args);
    let report = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{report}{}", String::from_utf8_lossy(&o.stderr));

    let journal = std::fs::read_to_string(dir.path().join("labels.csv.answers")).expect("journal");
    let answers: Vec<serde_json::Value> =
        journal.lines().skip(1).map(|l| serde_json::from_str(l).expect("json")).collect();
    assert_eq!(answers.len(), 80, "every row journaled");
    let contested: Vec<u64> =
        answers.iter().filter(|a| a["contested"] == true).map(|a| a["row"].as_u64().expect("row")).collect();
    assert!(!contested.is_empty() && contested.len() < 80, "{contested:?}");
    assert!(answers.iter().all(|a| a["mi_charged"].as_f64() == Some(0.0)));
    assert!(answers.iter().all(|a| (a["contested"] == true) != (a["unanimous"] == true)), "one or the other");

    let kept: Vec<(usize, usize)> = std::fs::read_to_string(&out)
        .expect("kept")
        .lines()
        .skip(1)
        .map(|l| {
            let (r, y) = l.split_once(',').expect("row,label");
            (r.parse().expect("row"), y.parse().expect("label"))
        })
        .collect();
    assert_eq!(kept.len(), 80 - contested.len(), "kept = the unanimous rows");
    let correct = kept.iter().filter(|&&(r, y)| examples[r].digit == y).count();
    assert!(correct * 10 >= kept.len() * 9, "{correct}/{}", kept.len());
    assert!(
        report.contains(&format!(
            "contested    {} this run, {} rows in total refused",
            contested.len(),
            contested.len()
        )),
        "{report}"
    );
    let mut c = client(&server.addr).await;
    let account = budget(&mut c, "alice-key").await;
    assert_eq!((account.spent, account.answered as usize), (0.0, kept.len()));
    assert!(report.contains(&format!("spent 0e0 of 1e0 nats, {} answers", kept.len())), "{report}");

    // A rerun finds every row journaled and sends nothing.
    let again = pacpriv(&args);
    assert!(String::from_utf8_lossy(&again.stdout).contains("answered     0 this run"), "{again:?}");
    assert_eq!(budget(&mut c, "alice-key").await.answered as usize, kept.len());

    // Under another policy contested rows would be charged: refused up front.
    let paper = Process::serve(None, &small_demo(&[]));
    let addr = format!("http://{}", paper.addr);
    let other = dir.path().join("other.csv").display().to_string();
    let o =
        pacpriv(&["label", &input_s, "--out", &other, "--addr", &addr, "--api-key", "alice-key", "--unanimous-only"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("privacy.policy is \"unanimous_only\""), "{err}");
    let mut c = client(&paper.addr).await;
    assert_eq!(budget(&mut c, "alice-key").await.answered, 0, "nothing sent");
}
