//! `pacpriv label` end to end: the real binary against a real server over
//! loopback, on held-out demo digits.

use crate::util::{B, Process, budget, client, held_out, pacpriv, sample, scrape, small_demo, write_csv};
use pacpriv_demo::digits::Example;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

/// JSON lines, alternating bare arrays and objects with an `input` field.
fn write_jsonl(path: &Path, examples: &[Example]) {
    let lines: Vec<String> = examples
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let pixels: Vec<f64> = e.pixels.iter().map(|&p| f64::from(p)).collect();
            if i % 2 == 0 {
                serde_json::to_string(&pixels).expect("json")
            } else {
                serde_json::json!({ "id": format!("img-{i}"), "input": pixels }).to_string()
            }
        })
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").expect("write JSONL");
}

/// Runs `pacpriv label INPUT --out OUT EXTRA…` against `server` (plaintext
/// unless EXTRA has an `--addr`) as the demo principal (unless EXTRA has an
/// `--api-key`).
fn label(server: &Process, input: &Path, out: &Path, extra: &[&str]) -> Output {
    let addr = format!("http://{}", server.addr);
    let (input, out) = (input.display().to_string(), out.display().to_string());
    let mut args = vec!["label", &input, "--out", &out];
    if !extra.contains(&"--addr") {
        args.extend(["--addr", &addr]);
    }
    if !extra.contains(&"--api-key") {
        args.extend(["--api-key", "demo-key"]);
    }
    args.extend_from_slice(extra);
    pacpriv(&args)
}

/// Runs it expecting failure with exit status `code`; returns stderr.
fn label_fails(server: &Process, input: &Path, out: &Path, extra: &[&str], code: i32) -> String {
    let o = label(server, input, out, extra);
    assert_eq!(o.status.code(), Some(code), "label should fail with {code}:\n{}{}", stdout(&o), stderr(&o));
    stderr(&o)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn succeeded(o: &Output) -> String {
    assert!(o.status.success(), "label failed ({}):\n{}{}", o.status, stdout(o), stderr(o));
    stdout(o)
}

/// The value after `key` on the report line that starts with it.
fn field<'a>(report: &'a str, key: &str) -> &'a str {
    report
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {key:?} line in:\n{report}"))
}

/// The number right after `word` in `text`.
fn number_after(text: &str, word: &str) -> f64 {
    let rest = text.split_once(word).unwrap_or_else(|| panic!("no {word:?} in {text:?}")).1;
    let token = rest.split_whitespace().next().unwrap_or_default();
    token.parse().unwrap_or_else(|_| panic!("{token:?} after {word:?} in {text:?} is not a number"))
}

fn journal_path(out: &Path) -> PathBuf {
    PathBuf::from(format!("{}.answers", out.display()))
}

/// The journal's header and answers.
fn journal(out: &Path) -> (Value, Vec<Value>) {
    let text = std::fs::read_to_string(journal_path(out)).expect("journal exists");
    let mut lines = text.lines().map(|l| serde_json::from_str::<Value>(l).expect("journal lines are JSON"));
    let header = lines.next().expect("a header");
    (header, lines.collect())
}

/// (row, label) of every confident answer in the journal.
fn confident(answers: &[Value]) -> Vec<(u64, u64)> {
    answers
        .iter()
        .filter(|a| a["confident"] == true)
        .map(|a| (a["row"].as_u64().expect("row"), a["label"].as_u64().expect("label")))
        .collect()
}

/// The kept file's (row, label) pairs.
fn kept(out: &Path) -> Vec<(u64, u64)> {
    let text = std::fs::read_to_string(out).expect("kept file exists");
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("row,label"));
    lines
        .map(|l| {
            let (r, y) = l.split_once(',').expect("row,label");
            (r.parse().expect("row"), y.parse().expect("label"))
        })
        .collect()
}

fn demo_with_budget(budget_mi: &str, extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut env = small_demo(&[("PACPRIV__PRINCIPALS__DEMO__BUDGET_MI", budget_mi.to_owned())]);
    env.extend_from_slice(extra);
    env
}

#[tokio::test(flavor = "multi_thread")]
async fn labels_held_out_digits_keeping_mostly_correct_confident_answers() {
    let server = Process::serve(None, &demo_with_budget("1", &[]));
    let dir = tempfile::tempdir().expect("temp dir");
    let (input, out) = (dir.path().join("digits.csv"), dir.path().join("labels.csv"));
    let examples = held_out(60);
    write_csv(&input, &examples);

    let report = succeeded(&label(&server, &input, &out, &[]));
    let (header, answers) = journal(&out);
    assert_eq!((header["rows"].as_u64(), header["features"].as_u64()), (Some(60), Some(64)), "{header}");
    let rows: Vec<u64> = answers.iter().map(|a| a["row"].as_u64().expect("row")).collect();
    assert_eq!(rows, (0..60).collect::<Vec<_>>(), "one journal line per row, in order");
    assert!(answers.iter().all(|a| a["mi_charged"].as_f64() == Some(B)), "paper policy: b each");

    let kept = kept(&out);
    assert_eq!(kept, confident(&answers), "the kept file is the journal's confident answers");
    let unanimous = answers.iter().filter(|a| a["unanimous"] == true).count();
    let correct = kept.iter().filter(|&&(r, y)| examples[r as usize].digit as u64 == y).count();
    eprintln!("kept {} of 60, {unanimous} unanimous, {correct} kept correct", kept.len());
    // Unanimous answers are exact, hence always confident.
    assert!(answers.iter().all(|a| a["unanimous"] == false || a["confident"] == true));
    assert!(unanimous > 0);
    assert_eq!(field(&report, "answered"), "60 this run, 60 of 60 rows in total");
    // Compared in percent, as printed: dividing by 100 first would differ
    // from the rounded fraction in the last bit for some counts (10 of 60).
    let percent = number_after(field(&report, "kept"), "(");
    assert!(percent > 0.0 && percent <= 100.0, "{report}");
    assert_eq!(percent, (kept.len() as f64 / 60.0 * 1e4).round() / 1e2, "{report}");
    assert!(10 * correct >= 9 * kept.len(), "{correct} of {} kept labels are right", kept.len());

    let mut c = client(&server.addr).await;
    let b = budget(&mut c, "demo-key").await;
    assert_eq!((b.answered, b.spent), (60, 60.0 * B));
    let session = field(&report, "session");
    assert_eq!(number_after(session, "spent"), b.spent, "{report}");
    assert_eq!(number_after(session, "of"), b.limit, "{report}");
    assert_eq!(number_after(field(&report, "MI charged"), ""), 60.0 * B, "{report}");
    let mia = number_after(field(&report, "MIA bound"), "");
    assert!((mia - 100.0 * b.mia_bound).abs() < 1e-4, "{report}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_stopped_by_the_budget_resumes_without_paying_twice() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = ("PACPRIV__STORE__PATH", dir.path().join("state.redb").display().to_string());
    let (input, out) = (dir.path().join("digits.csv"), dir.path().join("labels.csv"));
    write_csv(&input, &held_out(60));

    // 20 answers' worth of budget.
    let mut server = Process::serve(None, &demo_with_budget("0.078125", std::slice::from_ref(&store)));
    let o = label(&server, &input, &out, &[]);
    assert_eq!(o.status.code(), Some(75), "stopped, resumable:\n{}{}", stdout(&o), stderr(&o));
    assert!(stderr(&o).contains("the budget ran out"), "{}", stderr(&o));
    assert!(stderr(&o).contains("rerun this same command"), "{}", stderr(&o));
    assert_eq!(field(&stdout(&o), "answered"), "20 this run, 20 of 60 rows in total", "{}", stdout(&o));
    let (_, answers) = journal(&out);
    assert_eq!(answers.len(), 20);
    assert_eq!(kept(&out), confident(&answers), "kept file written on the way out");
    assert_eq!(budget(&mut client(&server.addr).await, "demo-key").await.answered, 20);
    server.kill();

    // More budget (the configuration wins at restart), same store; the
    // key from the environment this time.
    let server = Process::serve(None, &demo_with_budget("1", &[store]));
    let addr = format!("http://{}", server.addr);
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_pacpriv"))
        .args(["label", &input.display().to_string(), "--out", &out.display().to_string(), "--addr", &addr])
        .env("PACPRIV_API_KEY", "demo-key")
        .output()
        .expect("pacpriv runs");
    let report = succeeded(&o);
    assert_eq!(field(&report, "answered"), "40 this run, 60 of 60 rows in total");
    let mut c = client(&server.addr).await;
    let b = budget(&mut c, "demo-key").await;
    assert_eq!((b.answered, b.spent), (60, 60.0 * B), "no row was charged twice");
    let (_, all) = journal(&out);
    let rows: Vec<u64> = all.iter().map(|a| a["row"].as_u64().expect("row")).collect();
    assert_eq!(rows, (0..60).collect::<Vec<_>>());
    assert_eq!(all[..20], answers[..], "the first run's answers are kept as they were");
    assert_eq!(kept(&out), confident(&all));

    // Finished: a third run sends nothing and rebuilds the kept file.
    std::fs::remove_file(&out).expect("remove kept file");
    let report = succeeded(&label(&server, &input, &out, &[]));
    assert_eq!(field(&report, "answered"), "0 this run, 60 of 60 rows in total");
    assert_eq!(number_after(field(&report, "session"), "spent"), 60.0 * B, "{report}");
    assert_eq!(budget(&mut c, "demo-key").await.answered, 60);
    assert_eq!(kept(&out), confident(&all));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rate_limited_job_is_paced_to_the_end_not_stopped() {
    // 20 rows a second, bursts of 2: the 30-row stream outruns the bucket
    // at once, and must be slowed down, not refused.
    let server = Process::serve(
        None,
        &demo_with_budget(
            "1",
            &[
                ("PACPRIV__SERVER__RATE_LIMIT_PER_SECOND", "20".into()),
                ("PACPRIV__SERVER__RATE_LIMIT_BURST", "2".into()),
            ],
        ),
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let (input, out) = (dir.path().join("digits.csv"), dir.path().join("labels.csv"));
    write_csv(&input, &held_out(30));

    let started = std::time::Instant::now();
    let report = succeeded(&label(&server, &input, &out, &[]));
    assert_eq!(field(&report, "answered"), "30 this run, 30 of 30 rows in total");
    // 28 rows beyond the burst at 20 a second: the rate held.
    assert!(started.elapsed() >= std::time::Duration::from_millis(1400), "{:?}", started.elapsed());
    let b = budget(&mut client(&server.addr).await, "demo-key").await;
    assert_eq!((b.answered, b.spent), (30, 30.0 * B));
    let metrics = scrape(&server.listener("metrics"));
    assert_eq!(sample(&metrics, r#"pacpriv_queries_total{outcome="refused_rate"}"#), Some(0.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn json_lines_give_the_same_rows_as_csv() {
    let server = Process::serve(None, &demo_with_budget("1", &[]));
    let dir = tempfile::tempdir().expect("temp dir");
    let examples = held_out(30);
    let (csv, jsonl) = (dir.path().join("digits.csv"), dir.path().join("digits.ndjson"));
    write_csv(&csv, &examples);
    write_jsonl(&jsonl, &examples);
    let (from_csv, from_json) = (dir.path().join("a.csv"), dir.path().join("b.csv"));
    succeeded(&label(&server, &csv, &from_csv, &[]));
    succeeded(&label(&server, &jsonl, &from_json, &[]));
    let ((h1, a1), (h2, a2)) = (journal(&from_csv), journal(&from_json));
    for key in ["rows", "features", "sha256"] {
        assert_eq!(h1[key], h2[key], "{key}: {h1} vs {h2}");
    }
    assert_eq!(h1["rows"], 30);
    // The same rows are the same queries: the second run is answered from
    // the session's answer cache — every label identical, nothing charged.
    let labels =
        |a: &[Value]| -> Vec<(Value, Value)> { a.iter().map(|x| (x["row"].clone(), x["label"].clone())).collect() };
    assert_eq!(labels(&a1), labels(&a2));
    let mut c = client(&server.addr).await;
    let account = budget(&mut c, "demo-key").await;
    assert_eq!(account.answered, 30);

    // Same rows, so the JSON file may even continue the CSV job: nothing is left to send.
    let report = succeeded(&label(&server, &jsonl, &from_csv, &["--format", "jsonl"]));
    assert_eq!(field(&report, "answered"), "0 this run, 30 of 30 rows in total");
    assert_eq!(budget(&mut c, "demo-key").await, account);
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_rows_are_refused_before_anything_is_charged() {
    let server = Process::serve(None, &demo_with_budget("1", &[]));
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("labels.csv");

    let short = dir.path().join("short.csv");
    let mut examples = held_out(40);
    write_csv(&short, &examples);
    let text = std::fs::read_to_string(&short).expect("read");
    let mut lines: Vec<&str> = text.lines().collect();
    let cut = lines[26].rsplit_once(',').expect("a comma").0.to_owned();
    lines[26] = &cut; // row 25 (line 27, after the header) loses a value
    std::fs::write(&short, lines.join("\n")).expect("write");
    let err = label_fails(&server, &short, &out, &[], 64);
    assert!(err.contains("short.csv: line 27 (row 25): 63 values, but row 0 has 64"), "{err}");

    let bad = dir.path().join("bad.jsonl");
    examples.truncate(12);
    write_jsonl(&bad, &examples);
    let text = std::fs::read_to_string(&bad).expect("read").replacen("[0.0,", "[\"zero\",", 1);
    std::fs::write(&bad, text).expect("write");
    let err = label_fails(&server, &bad, &out, &[], 64);
    assert!(err.contains("bad.jsonl: line 1 (row 0): value 1 (\"zero\") is not a number"), "{err}");

    let parquet = dir.path().join("digits.parquet");
    std::fs::write(&parquet, b"PAR1").expect("write");
    let err = label_fails(&server, &parquet, &out, &[], 64);
    assert!(err.contains("Parquet input is not supported"), "{err}");

    assert_eq!(budget(&mut client(&server.addr).await, "demo-key").await.answered, 0, "nothing was sent");
    assert!(!out.exists() && !journal_path(&out).exists(), "nothing was written");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_journal_is_not_continued_with_another_input_or_level() {
    let server = Process::serve(None, &demo_with_budget("1", &[]));
    let dir = tempfile::tempdir().expect("temp dir");
    let examples = held_out(20);
    let (first, second) = (dir.path().join("first.csv"), dir.path().join("second.csv"));
    write_csv(&first, &examples[..10]);
    write_csv(&second, &examples[10..]);
    let out = dir.path().join("labels.csv");
    succeeded(&label(&server, &first, &out, &[]));
    let (journal_before, kept_before) =
        (std::fs::read(journal_path(&out)).expect("journal"), std::fs::read(&out).expect("kept"));

    let err = label_fails(&server, &second, &out, &[], 64);
    assert!(err.contains("labels.csv.answers: it belongs to another input"), "{err}");
    assert!(err.contains("first.csv: 10 rows of 64 values"), "{err}");
    let err = label_fails(&server, &first, &out, &["--alpha", "0.05"], 64);
    assert!(err.contains("it was written with --alpha 0.01"), "{err}");
    let err = label_fails(&server, &first, &out, &["--model", "bayes"], 64);
    assert!(err.contains("it was written asking model \"\""), "{err}");
    // A kept file without its journal is not ours to overwrite.
    let err = label_fails(&server, &first, &second, &[], 64);
    assert!(err.contains("second.csv exists but its journal"), "{err}");

    assert_eq!(budget(&mut client(&server.addr).await, "demo-key").await.answered, 10);
    assert_eq!(std::fs::read(journal_path(&out)).expect("journal"), journal_before);
    assert_eq!(std::fs::read(&out).expect("kept"), kept_before);
}

#[tokio::test(flavor = "multi_thread")]
async fn labels_over_mutual_tls() {
    let dir = tempfile::tempdir().expect("temp dir");
    crate::ops::certificates(dir.path(), "alice");
    let path = |f: &str| dir.path().join(f).display().to_string();
    let server = Process::serve(
        None,
        &demo_with_budget(
            "1",
            &[
                ("PACPRIV__TLS__CERT_FILE", path("server.pem")),
                ("PACPRIV__TLS__KEY_FILE", path("server.key")),
                ("PACPRIV__TLS__CLIENT_CA_FILE", path("ca.pem")),
            ],
        ),
    );
    let (input, out) = (dir.path().join("digits.csv"), dir.path().join("labels.csv"));
    write_csv(&input, &held_out(5));
    let (ca, cert, key) = (path("ca.pem"), path("client.pem"), path("client.key"));
    // HOST:PORT with --ca means https.
    let tls = ["--ca", &ca, "--domain", "localhost"];
    let addr = ["--addr", &server.addr];

    let err = label_fails(&server, &input, &out, &[&tls[..], &addr[..]].concat(), 64);
    let refused = |err: &str| err.contains("connecting to the pacpriv server") || err.contains("GetBudget failed");
    assert!(refused(&err), "no client certificate: {err}");
    let err = label_fails(&server, &input, &out, &[], 64);
    assert!(refused(&err), "plaintext to a TLS port: {err}");
    let mtls = [&tls[..], &addr[..], &["--cert", &cert, "--key", &key][..]].concat();
    let err = label_fails(&server, &input, &out, &[&mtls[..], &["--api-key", "nobody"][..]].concat(), 64);
    assert!(err.contains("does not accept this API key"), "{err}");
    assert_eq!(budget_over_tls(&server, &ca, &cert, &key).await.answered, 0, "nothing charged so far");

    let report = succeeded(&label(&server, &input, &out, &mtls));
    assert_eq!(field(&report, "answered"), "5 this run, 5 of 5 rows in total");
    assert_eq!(field(&report, "session").split_whitespace().next(), Some("demo"), "the API key names the principal");
    assert_eq!(budget_over_tls(&server, &ca, &cert, &key).await.answered, 5);
}

/// The demo principal's budget from a TLS server, with a client certificate.
async fn budget_over_tls(server: &Process, ca: &str, cert: &str, key: &str) -> pacpriv_service::proto::pacpriv::Budget {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let read = |p: &str| std::fs::read(p).expect("PEM");
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(ca)))
        .identity(Identity::from_pem(read(cert), read(key)))
        .domain_name("localhost");
    let channel = Endpoint::from_shared(format!("https://{}", server.addr))
        .expect("uri")
        .tls_config(tls)
        .expect("tls")
        .connect()
        .await
        .expect("mTLS");
    let mut c = pacpriv_service::proto::pacpriv::privatizer_client::PrivatizerClient::new(channel);
    budget(&mut c, "demo-key").await
}

/// `--model`: the demo's second model labels the rows, charged to the one
/// account both models share (the summary reports it).
#[tokio::test(flavor = "multi_thread")]
async fn labels_with_another_model_of_the_dataset() {
    let server = Process::serve(None, &demo_with_budget("1", &[]));
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("digits.csv");
    write_csv(&input, &held_out(12));
    let out = dir.path().join("labels.csv");
    let report = succeeded(&label(&server, &input, &out, &["--model", "bayes"]));
    let mut c = client(&server.addr).await;
    let account = budget(&mut c, "demo-key").await;
    assert_eq!(account.answered, 12, "{report}");
    let (header, answers) = journal(&out);
    assert_eq!((header["model"].as_str(), answers.len()), (Some("bayes"), 12));
    let err = label_fails(&server, &input, &dir.path().join("nope.csv"), &["--model", "forest"], 64);
    assert!(err.contains("\"forest\"") && err.contains("--model names a model this server does not serve"), "{err}");
    assert_eq!(budget(&mut c, "demo-key").await.answered, 12, "an unknown model is asked nothing");
}
