//! Issue 53 §2: a failed commit of the embedded store stops new charges
//! before they draw, loses nothing of the batch that failed, and resumes
//! by itself once a commit succeeds. The disk fills as far as the server
//! can tell: its file-size limit (`RLIMIT_FSIZE`, set on the running
//! process with prlimit(1)) is put to 0, below every offset of the store
//! file and its log, so every write to them fails (EFBIG), as on a full
//! disk; lifting the limit is freeing the disk. The server's log goes
//! through a pipe, which the limit does not apply to.

use crate::util::{
    ADMIN_TOKEN, Process, budget, client, digit, image, key_hash, pacpriv_verify, predict, refusal, small_demo,
};
use std::time::{Duration, Instant};
use tonic::Code;

/// Sets the soft file-size limit of process `pid` (`None`: unlimited).
fn file_size_limit(pid: u32, bytes: Option<u64>) {
    let soft = bytes.map_or("unlimited".to_owned(), |b| b.to_string());
    let out = std::process::Command::new("prlimit")
        .args(["--pid", &pid.to_string(), &format!("--fsize={soft}:unlimited")])
        .output()
        .expect("prlimit (util-linux) runs");
    assert!(out.status.success(), "prlimit: {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_commit_stops_new_charges_and_loses_nothing() {
    let server = Process::serve_logging_through_a_pipe(
        None,
        &small_demo(&[
            ("PACPRIV__STORE__JOURNAL", "true".to_owned()),
            ("PACPRIV__ADMIN__KEY_SHA256", key_hash(ADMIN_TOKEN)),
        ]),
    );
    let mut c = client(&server.addr).await;
    predict(&mut c, "alice-key", image("q0", &digit(0))).await.expect("answered");

    file_size_limit(server.pid(), Some(0));
    // The step is taken and charged in memory, its commit fails: withheld.
    let q1 = predict(&mut c, "alice-key", image("q1", &digit(1))).await.expect_err("its commit failed");
    assert_eq!(refusal(&q1), (Code::Unavailable, "STORE_UNAVAILABLE".into(), Some("true".into())), "{q1:?}");
    // From then on, nothing is drawn or charged.
    for n in 2..5 {
        let refused = predict(&mut c, "alice-key", image(&format!("q{n}"), &digit(n))).await.expect_err("refused");
        assert_eq!(refusal(&refused), (Code::Unavailable, "STORE_UNAVAILABLE".into(), Some("false".into())));
        assert!(refused.message().contains("last commit failed"), "{}", refused.message());
    }
    assert_eq!(budget(&mut c, "alice-key").await.charged, 2, "q0 and q1, nothing since");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !server.logs().contains("store commit failed") {
        assert!(Instant::now() < deadline, "the failure is logged: {}", server.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The disk is freed: the writer commits the kept batch by itself, and
    // steps are taken again; q1's retry gets the answer its charge paid for.
    file_size_limit(server.pid(), None);
    let deadline = Instant::now() + Duration::from_secs(30);
    let again = loop {
        match predict(&mut c, "alice-key", image("q1", &digit(1))).await {
            Ok(answer) => break answer,
            Err(e) if Instant::now() < deadline && refusal(&e).0 == Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("not answered again after the disk was freed: {e:?}\n{}", server.logs()),
        }
    };
    assert!(again.cached && again.mi_charged == 0.0, "q1's answer, kept: {again:?}");
    let q2 = predict(&mut c, "alice-key", image("q2", &digit(2))).await.expect("answered");
    assert!(!q2.cached && q2.mi_charged > 0.0, "{q2:?}");
    assert_eq!(budget(&mut c, "alice-key").await.charged, 3);

    // Nothing of the failed batch was lost: the journal has every step,
    // and verify passes it.
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("journal.jsonl");
    let o = server.admin_cli(&["export", "--out", &file.display().to_string()]);
    assert!(o.status.success(), "export: {}", String::from_utf8_lossy(&o.stderr));
    let o = pacpriv_verify(&[&file.display().to_string()]);
    assert!(o.status.success(), "verify: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
}
