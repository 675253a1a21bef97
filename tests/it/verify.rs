//! Issue 25 §1: a real labelling run's journal, exported through the admin
//! API (`pacpriv admin export`) and checked by `pacpriv verify` from the
//! file alone — on the embedded store and on PostgreSQL; and one flipped
//! label, one changed charge or one dropped record makes it fail naming
//! that record's line.

use crate::util::{
    ADMIN_TOKEN, Postgres, Process, client, digit, held_out, image, key_hash, pacpriv, predict, small_demo, write_csv,
};
use pacpriv::cli::verify::format::{self, EntryLine, Line};
use pacpriv::store::JournalEntry;
use serde_json::Value;
use std::path::Path;
use std::process::Output;

/// Labels 40 held-out digits as the demo principal and asks alice three
/// queries (one repeated: a cache hit, no step); exports the journal to
/// `file`.
async fn label_and_export(server: &Process, dir: &Path, file: &Path) {
    let (input, out) = (dir.join("digits.csv"), dir.join("labels.csv"));
    write_csv(&input, &held_out(40));
    let addr = format!("http://{}", server.addr);
    let o = pacpriv(&[
        "label",
        &input.display().to_string(),
        "--out",
        &out.display().to_string(),
        "--addr",
        &addr,
        "--api-key",
        "demo-key",
    ]);
    assert!(o.status.success(), "label: {}", String::from_utf8_lossy(&o.stderr));
    let mut c = client(&server.addr).await;
    for (id, d) in [("a1", 3), ("a2", 8), ("a1-again", 3)] {
        predict(&mut c, "alice-key", image(id, &digit(d))).await.expect("alice answered");
    }
    let o = admin(server, &["export", "--out", &file.display().to_string()]);
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "export: {}", String::from_utf8_lossy(&o.stderr));
    assert!(said.contains("exported 42 journal entries of 2 sessions"), "{said}");
}

fn admin(server: &Process, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_pacpriv"))
        .args(["admin", "--addr", &server.listener("admin")])
        .args(args)
        .env("PACPRIV_ADMIN_TOKEN", ADMIN_TOKEN)
        .output()
        .expect("pacpriv admin runs")
}

fn verify(file: &Path) -> Output {
    pacpriv(&["verify", &file.display().to_string()])
}

fn lines(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file).expect("export").lines().map(str::to_owned).collect()
}

fn write(file: &Path, lines: &[String]) {
    std::fs::write(file, lines.join("\n") + "\n").expect("write");
}

/// Asserts `file` fails verification at `line` (from 1) with `why`.
fn fails_at(file: &Path, line: usize, why: &str) {
    let o = verify(file);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(65), "{err}");
    assert!(err.contains(&format!("{}:{line}: ", file.display())) && err.contains(why), "line {line}, {why}: {err}");
}

/// The index of the first contested step of the demo session (a line
/// whose charge is b).
fn first_charged(lines: &[String]) -> usize {
    lines.iter().position(|l| l.contains("\"session\":\"demo\"") && !l.contains("\"charge\":0.0,")).expect("a charge")
}

fn the_export_verifies_and_tampering_is_named(file: &Path) {
    let o = verify(file);
    let report = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "verify: {}{report}", String::from_utf8_lossy(&o.stderr));
    assert!(report.contains("verified: 42 steps of 2 sessions"), "{report}");
    let demo = report.lines().find(|l| l.starts_with("demo\t")).expect("demo's row");
    assert!(demo.starts_with("demo\t40\t"), "{demo}");
    assert!(report.lines().any(|l| l.starts_with("alice\t2\t")), "the repeat took no step: {report}");

    let honest = lines(file);
    let dir = file.parent().expect("dir");
    let k = first_charged(&honest);
    let edit = |name: &str, f: &dyn Fn(&mut Vec<String>)| {
        let mut l = honest.clone();
        f(&mut l);
        let path = dir.join(name);
        write(&path, &l);
        path
    };
    let mut entry: Value = serde_json::from_str(&honest[k]).expect("json");

    // One released label flipped.
    let label = entry["step"]["label"].as_u64().expect("label");
    entry["step"]["label"] = ((label + 1) % 10).into();
    let flipped = entry.to_string();
    fails_at(&edit("label.jsonl", &|l| l[k] = flipped.clone()), k + 1, "chain hash does not match");

    // One charge changed.
    let mut entry: Value = serde_json::from_str(&honest[k]).expect("json");
    entry["charge"] = 0.0.into();
    let free = entry.to_string();
    fails_at(&edit("charge.jsonl", &|l| l[k] = free.clone()), k + 1, "chain hash does not match");

    // One record dropped: the next one is out of order; the first one:
    // the session's account has no beginning.
    fails_at(&edit("dropped.jsonl", &|l| drop(l.remove(k + 2))), k + 3, "expected version 3 next");
    fails_at(&edit("first.jsonl", &|l| drop(l.remove(k))), k + 1, "the steps before it are missing");

    // A forger who recomputes every hash after a change is caught by the
    // mechanism itself: a flipped label is not the release's argmax, a
    // waived charge is not the policy's.
    fails_at(&rechained(dir, &honest, k, |e| e.step.label = (e.step.label + 1) % 10), k + 1, "argmax");
    fails_at(&rechained(dir, &honest, k, |e| e.charge = 0.0), k + 1, "charges");
}

/// `lines` with entry `k` changed by `change` and every later hash of its
/// session (and its record's head) recomputed.
fn rechained(dir: &Path, lines: &[String], k: usize, change: impl Fn(&mut EntryLine)) -> std::path::PathBuf {
    let mut out = lines.to_vec();
    let mut head = None;
    for (i, text) in lines.iter().enumerate().skip(1) {
        match Line::parse(text).expect("line") {
            Line::Entry(mut e) => {
                let prev = match (head, e.version) {
                    (_, 1) => JournalEntry::genesis(&e.session),
                    (Some(h), _) => h,
                    (None, _) => continue,
                };
                if i == k {
                    change(&mut e);
                }
                if i >= k {
                    let chain = e.entry().expect("entry").chained(&prev);
                    e.chain = format::hex(&chain);
                    out[i] = serde_json::to_string(&e).expect("json");
                }
                head = Some(format::unhex(&e.chain).expect("hex").try_into().expect("32 bytes"));
            }
            Line::Session(mut s) if i > k => {
                s.record.journal_head = format::hex(&head.expect("a head"));
                out[i] = serde_json::to_string(&s).expect("json");
                head = None;
            }
            _ => head = None,
        }
    }
    let path = dir.join("rechained.jsonl");
    write(&path, &out);
    path
}

fn journaled(extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut env = small_demo(&[
        ("PACPRIV__STORE__JOURNAL", "true".to_owned()),
        ("PACPRIV__ADMIN__KEY_SHA256", key_hash(ADMIN_TOKEN)),
        ("PACPRIV__PRINCIPALS__DEMO__BUDGET_MI", "1".to_owned()),
    ]);
    env.extend_from_slice(extra);
    env
}

#[tokio::test(flavor = "multi_thread")]
async fn a_labelling_run_on_the_embedded_store_verifies_and_tampering_is_named() {
    let server = Process::serve(None, &journaled(&[]));
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("journal.jsonl");
    label_and_export(&server, dir.path(), &file).await;
    the_export_verifies_and_tampering_is_named(&file);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_labelling_run_on_postgres_verifies() {
    let pg = Postgres::start();
    let server = Process::serve(
        None,
        &journaled(&[
            ("PACPRIV__STORE__BACKEND", "postgres".to_owned()),
            ("PACPRIV__STORE__POSTGRES_URL", pg.url.clone()),
        ]),
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("journal.jsonl");
    label_and_export(&server, dir.path(), &file).await;
    the_export_verifies_and_tampering_is_named(&file);
}

#[tokio::test(flavor = "multi_thread")]
async fn export_says_when_the_journal_is_off() {
    let server = Process::serve(None, &small_demo(&[("PACPRIV__ADMIN__KEY_SHA256", key_hash(ADMIN_TOKEN))]));
    let o = admin(&server, &["export"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("store.journal = true"), "{err}");
}
