//! Issue 53 §7: a replica started while no PostgreSQL node accepts writes
//! (a failover under way, only a standby reachable, the database not up
//! yet) waits — its health listener answering liveness SERVING and
//! readiness NOT_SERVING — and serves once a node does; it gives up at
//! `store.start_wait_ms`, naming it; SIGTERM during the wait exits 0; and a
//! failure no retry cures (here a missing database) ends the start at once.

use crate::util::{Postgres, Process, budget, client, digit, free_port, image, predict, small_demo};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// What start-up logs each time it finds no node that accepts writes.
const WAITING: &str = "no database node accepts writes yet";

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_started_while_no_node_accepts_writes_is_alive_not_ready_then_serves() {
    let pg = Postgres::start();
    let admin = connect(&pg.url).await;
    // Every new session read-only, as on a standby: a read-write session
    // (target_session_attrs) is refused, as during a failover.
    admin.batch_execute("SET default_transaction_read_only = off").await.expect("SET");
    read_only(&admin, true).await;

    let health_at = format!("127.0.0.1:{}", free_port());
    let env = small_demo(&[
        ("PACPRIV__STORE__BACKEND", "postgres".to_owned()),
        ("PACPRIV__STORE__POSTGRES_URL", format!("{}?target_session_attrs=read-write", pg.url)),
        ("PACPRIV__STORE__START_WAIT_MS", "120000".to_owned()),
        ("PACPRIV__SERVER__HEALTH_LISTEN", health_at.clone()),
    ]);
    let mut server = Process::serve_unready(std::path::Path::new(env!("CARGO_BIN_EXE_pacpriv")), None, &env);

    let mut health = health_client(&health_at).await;
    let status = |service: &str| {
        let mut health = health.clone();
        let service = service.to_owned();
        async move { health.check(HealthCheckRequest { service }).await.map(|r| r.into_inner().status) }
    };
    // Alive, not ready, while it waits — and seen waiting more than once.
    let waited_twice = Instant::now() + Duration::from_secs(60);
    while server.logs().matches(WAITING).count() < 2 {
        if let Some(status) = server.wait(Duration::ZERO) {
            panic!("the replica exited ({status}) while no node accepted writes:\n{}", server.logs());
        }
        assert!(Instant::now() < waited_twice, "the replica did not retry:\n{}", server.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (service, want) in [
        ("liveness", ServingStatus::Serving),
        ("", ServingStatus::NotServing),
        ("pacpriv.v1.Privatizer", ServingStatus::NotServing),
    ] {
        assert_eq!(status(service).await.ok(), Some(want as i32), "health of {service:?} while waiting");
    }
    assert!(!server.logs().contains("pacpriv serving"), "it served without a store");

    // A node accepts writes: the replica serves, without a restart.
    read_only(&admin, false).await;
    let server = tokio::task::spawn_blocking(move || {
        server.wait_ready();
        server
    })
    .await
    .expect("the replica started");
    let logs = server.logs();
    assert!(logs.contains(WAITING) && logs.contains("the database accepts writes"), "{logs}");
    let ready = Instant::now() + Duration::from_secs(20);
    while status("").await.ok() != Some(ServingStatus::Serving as i32) {
        assert!(Instant::now() < ready, "readiness did not turn SERVING:\n{}", server.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    health.check(HealthCheckRequest::default()).await.expect("the same health listener still answers");
    let mut c = client(&server.addr).await;
    predict(&mut c, "alice-key", image("q1", &digit(1))).await.expect("answered");
    assert_eq!(budget(&mut c, "alice-key").await.charged, 1);
}

#[test]
fn a_replica_gives_up_at_its_start_wait_naming_it() {
    // Nothing listens on this port: every attempt is refused.
    let url = format!("postgres://pacpriv@127.0.0.1:{}/pacpriv", free_port());
    let (status, stderr) = exit_of(&url, "1500");
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains(WAITING), "it did not wait:\n{stderr}");
    let (_, rest) = stderr
        .split_once("no database node accepted writes within store.start_wait_ms = 1500 (")
        .unwrap_or_else(|| panic!("the exit does not name the setting:\n{stderr}"));
    let attempts: u32 = rest.split(' ').next().and_then(|n| n.parse().ok()).expect("the attempts made");
    assert!(attempts >= 2, "it gave up after {attempts} attempt(s):\n{stderr}");
}

/// SIGTERM (Kubernetes deleting the pod) during the wait is an orderly
/// stop: exit 0 at once, not after the wait.
#[test]
fn a_signal_during_the_wait_stops_the_replica_cleanly() {
    let url = format!("postgres://pacpriv@127.0.0.1:{}/pacpriv", free_port());
    let env = small_demo(&[
        ("PACPRIV__STORE__BACKEND", "postgres".to_owned()),
        ("PACPRIV__STORE__POSTGRES_URL", url),
        ("PACPRIV__STORE__START_WAIT_MS", "600000".to_owned()),
    ]);
    let mut server = Process::serve_unready(std::path::Path::new(env!("CARGO_BIN_EXE_pacpriv")), None, &env);
    let waiting = Instant::now() + Duration::from_secs(60);
    while !server.logs().contains(WAITING) {
        assert!(Instant::now() < waiting, "the replica did not wait:\n{}", server.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    server.signal("TERM");
    let status = server.wait(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "exit {status:?} on SIGTERM during the wait:\n{}", server.logs());
}

#[test]
fn a_failure_no_retry_cures_ends_the_start_at_once() {
    let pg = Postgres::start();
    let url = pg.url.replace("/postgres", "/no_such_database");
    let (status, stderr) = exit_of(&url, "600000");
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("no_such_database") && stderr.contains("does not exist"), "{stderr}");
    assert!(!stderr.contains(WAITING), "a missing database was waited for:\n{stderr}");
}

/// `pacpriv serve` on PostgreSQL at `url` with `store.start_wait_ms =
/// wait_ms`: its exit status and what it logged (killed, failing the
/// test, if it has not exited within two minutes).
fn exit_of(url: &str, wait_ms: &str) -> (ExitStatus, String) {
    let log = tempfile::NamedTempFile::new().expect("temp file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pacpriv"))
        .arg("serve")
        .envs(small_demo(&[
            ("PACPRIV__STORE__BACKEND", "postgres".to_owned()),
            ("PACPRIV__STORE__POSTGRES_URL", url.to_owned()),
            ("PACPRIV__STORE__START_WAIT_MS", wait_ms.to_owned()),
            ("PACPRIV__SERVER__LISTEN", "127.0.0.1:0".to_owned()),
        ]))
        .env("OPENBLAS_NUM_THREADS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log.reopen().expect("log file"))
        .spawn()
        .expect("pacpriv starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("pacpriv serve did not exit:\n{}", std::fs::read_to_string(log.path()).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    (status, std::fs::read_to_string(log.path()).unwrap_or_default())
}

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connects");
    tokio::spawn(connection);
    client
}

/// Makes every new session of the server read-only (`on`) or not.
async fn read_only(admin: &tokio_postgres::Client, on: bool) {
    let sql = if on {
        "ALTER SYSTEM SET default_transaction_read_only = on"
    } else {
        "ALTER SYSTEM RESET default_transaction_read_only"
    };
    admin.batch_execute(sql).await.expect("ALTER SYSTEM");
    admin.batch_execute("SELECT pg_reload_conf()").await.expect("reload");
}

async fn health_client(addr: &str) -> HealthClient<tonic::transport::Channel> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).expect("uri");
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        match endpoint.connect().await {
            Ok(channel) => return HealthClient::new(channel),
            Err(e) => assert!(Instant::now() < until, "the health listener never answered: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
