//! Graceful drain on SIGTERM, as Kubernetes stops a pod: readiness turns
//! NOT_SERVING at once, queries are still answered through the grace
//! period, then the server stops accepting, finishes what it accepted,
//! flushes the store and exits 0 — and every answer a client received is
//! charged after a restart.

use crate::util::{B, Process, budget, client, digit, distinct, health_becomes, image, predict, small_demo};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tonic_health::pb::health_check_response::ServingStatus;

const CLIENTS: u32 = 32;

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_under_load_fails_no_accepted_request_and_loses_no_charge() {
    let dir = tempfile::tempdir().expect("temp dir");
    let env = small_demo(&[
        ("PACPRIV__STORE__PATH", dir.path().join("state.redb").display().to_string()),
        ("PACPRIV__PRINCIPALS__ALICE__BUDGET_MI", "1000".into()),
        ("PACPRIV__SERVER__DRAIN_GRACE_MS", "1500".into()),
        ("PACPRIV__SERVER__DRAIN_DEADLINE_MS", "10000".into()),
    ]);
    let mut server = Process::serve(None, &env);
    let addr = server.addr.clone();
    let http = server.listener("http");

    // 32 clients, each on its own connection, each asking distinct queries
    // back to back until the server stops answering (or 2000 each).
    let signalled = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for k in 0..CLIENTS {
        let (addr, signalled) = (addr.clone(), Arc::clone(&signalled));
        clients.push(tokio::spawn(async move {
            let mut c = client(&addr).await;
            let mut log = Vec::new();
            for i in 0..2000u32 {
                let before_signal = !signalled.load(Ordering::SeqCst);
                let q = image(&format!("c{k}-{i}"), &distinct(digit(0), k * 10_000 + i + 1));
                let result = predict(&mut c, "alice-key", q).await;
                let ok = result.is_ok();
                log.push((before_signal, result.map(|r| r.mi_charged).map_err(|e| e.to_string())));
                if !ok {
                    break;
                }
            }
            log
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    signalled.store(true, Ordering::SeqCst);
    let sent = Instant::now();
    server.signal("TERM");
    // Not ready at once (well within the grace period), while still serving.
    assert!(health_becomes(&addr, ServingStatus::NotServing).await, "health turns NOT_SERVING on SIGTERM");
    let ready = std::process::Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", &format!("http://{http}/v2/health/ready")])
        .output()
        .expect("curl runs");
    assert_eq!(String::from_utf8_lossy(&ready.stdout), "503", "REST readiness too");
    assert!(sent.elapsed() < Duration::from_millis(1500), "both seen within the grace period");

    let mut answered = 0u64;
    let mut after_signal = 0u64;
    for c in clients {
        for (before_signal, result) in c.await.expect("client task") {
            match result {
                Ok(charge) => {
                    assert_eq!(charge, B);
                    answered += 1;
                    after_signal += u64::from(!before_signal);
                }
                Err(e) => assert!(!before_signal, "a request sent before SIGTERM failed: {e}"),
            }
        }
    }
    let status = server.wait(Duration::from_secs(30)).expect("the server exits after the drain");
    assert!(status.success(), "exit status {status:?}\n{}", server.logs());
    assert!(after_signal > 0, "queries sent during the grace period were answered");
    assert!(server.logs().contains("drain grace over"), "{}", server.logs());
    // The last line before the exit: the logs were written out.
    assert!(server.logs().contains("shut down"), "{}", server.logs());

    // Every answer received is charged, and nothing else.
    let restarted = Process::serve(None, &env);
    let account = budget(&mut client(&restarted.addr).await, "alice-key").await;
    assert_eq!((account.answered, account.spent), (answered, answered as f64 * B));
}
