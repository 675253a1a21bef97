//! Issue 68 §3: every model version's identity is stored per dataset. A
//! version number keeps the teachers it was first served with — across
//! reloads (under load), removal and re-adding, and restarts, on either
//! store — so its cached answers are never another teacher set's; a
//! store from the release before identities keeps its caches.

use crate::reload::reload;
use crate::util::{Postgres, Process, budget, client, digit, image, key_hash, predict};
use pacpriv_service::proto::pacpriv::PredictRequest;
use pacpriv_service::proto::pacpriv::privatizer_client::PrivatizerClient;
use std::path::Path;
use tonic::transport::Channel;

/// Alice (key `ka`), bob (key `kb`, the load: its answers fill its own
/// session's cache), and the versions `versions` of the default model:
/// (number, demo regularisation).
fn config(versions: &[(u32, &str)]) -> String {
    let mut toml = String::new();
    for (name, key) in [("alice", "ka"), ("bob", "kb")] {
        toml.push_str(&format!("[principals.{name}]\nkey_sha256 = \"{}\"\nbudget_mi = 1\n\n", key_hash(key)));
    }
    for (number, regularisation) in versions {
        toml.push_str(&format!("\n[versions.private.{number}]\ndemo = {{ regularisation = {regularisation} }}\n"));
    }
    toml
}

/// Query `n` asked of `version`: (cached, charged).
async fn ask(c: &mut PrivatizerClient<Channel>, version: &str, n: u32) -> (bool, f64) {
    let request = PredictRequest { model_version: version.to_owned(), ..image(&format!("v{version}-{n}"), &digit(n)) };
    let r = predict(c, "ka", request).await.unwrap_or_else(|e| panic!("version {version}, query {n}: {e:?}"));
    assert_eq!(r.model_version, version);
    (r.cached, r.mi_charged)
}

/// `pacpriv serve` that must refuse to start: what it said on stderr.
fn refused(config: &Path, env: &[(&'static str, String)]) -> String {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_pacpriv"))
        .args(["serve", "--config", &config.display().to_string()])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("PACPRIV__SERVER__LISTEN", "127.0.0.1:0")
        .env("PACPRIV__SERVER__HTTP_LISTEN", "127.0.0.1:0")
        .env("PACPRIV__METRICS__LISTEN", "127.0.0.1:0")
        .env("OPENBLAS_NUM_THREADS", "1")
        .output()
        .expect("pacpriv runs");
    let said = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(64), "{said}");
    said
}

/// The sequence on one store (`store`: its environment).
async fn a_version_number_keeps_its_teachers(store: &[(&'static str, String)]) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("pacpriv.toml");
    let mut env = vec![
        ("PACPRIV__DEMO__MODELS", "16".to_owned()),
        ("PACPRIV__DEMO__NAIVE_BAYES_MODEL", String::new()),
        ("PACPRIV__PRIVACY__PER_QUERY_MI", "2^-8".to_owned()),
    ];
    env.extend_from_slice(store);
    std::fs::write(&file, config(&[(2, "1.0")])).expect("config");
    let mut server = Process::serve(Some(&file), &env);
    let metrics = server.listener("metrics");
    let mut c = client(&server.addr).await;
    let first = ask(&mut c, "2", 1).await;
    assert!(!first.0, "a fresh query");
    assert!(ask(&mut c, "2", 1).await.0, "its repeat is cached");

    // Under load, a reload giving version 2 other teachers is rejected,
    // naming it; every request is answered by the running versions.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for task in 0..3u32 {
        let (addr, stop) = (server.addr.clone(), std::sync::Arc::clone(&stop));
        load.push(tokio::spawn(async move {
            let mut c = client(&addr).await;
            let mut answered = 0;
            for i in 0..40u32 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let request = image(&format!("load-{task}-{i}"), &digit(2000 + task * 100 + i));
                predict(&mut c, "kb", request).await.expect("no request fails across the reloads");
                answered += 1;
            }
            answered
        }));
    }
    std::fs::write(&file, config(&[(2, "0.5")])).expect("config");
    reload(&server, &metrics, "rejected", 1.0).await;
    let logs = server.logs();
    assert!(logs.contains("version 2 (dataset") && logs.contains("not used before in this store"), "{logs}");
    assert!(ask(&mut c, "2", 1).await.0, "version 2 is still its first teachers, its cache theirs");

    // The new teachers under a new number: built, and asked afresh.
    std::fs::write(&file, config(&[(3, "0.5")])).expect("config");
    reload(&server, &metrics, "applied", 1.0).await;
    let (cached, _) = ask(&mut c, "3", 1).await;
    assert!(!cached, "version 3 never meets version 2's answers");
    // Removed, version 2 keeps its claim: added back with other teachers
    // it is rejected, with its own it is served and its cache is its own.
    std::fs::write(&file, config(&[(2, "2.0"), (3, "0.5")])).expect("config");
    reload(&server, &metrics, "rejected", 2.0).await;
    std::fs::write(&file, config(&[(2, "1.0"), (3, "0.5")])).expect("config");
    reload(&server, &metrics, "applied", 2.0).await;
    assert!(ask(&mut c, "2", 1).await.0, "version 2 back with its teachers: its answers are still cached");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut answered = 0;
    for task in load {
        answered += task.await.expect("a client");
    }
    assert!(answered > 0, "the load ran");
    let spent = budget(&mut c, "ka").await.spent;
    server.kill();
    drop(server);

    // A restart giving version 2 other teachers, or the default model's
    // version 1 another fit, is refused, naming the version; nothing was
    // charged.
    std::fs::write(&file, config(&[(2, "2.0"), (3, "0.5")])).expect("config");
    let said = refused(&file, &env);
    assert!(said.contains("model \"private\" version 2") && said.contains("not used before"), "{said}");
    std::fs::write(&file, config(&[(2, "1.0"), (3, "0.5")]) + "\n[demo]\nregularisation = 0.25\n").expect("config");
    let said = refused(&file, &env);
    assert!(said.contains("model \"private\" version 1") && said.contains("model's own tables"), "{said}");
    std::fs::write(&file, config(&[(2, "1.0"), (3, "0.5")])).expect("config");
    let server = Process::serve(Some(&file), &env);
    let mut c = client(&server.addr).await;
    assert_eq!(budget(&mut c, "ka").await.spent, spent, "the refused starts charged nothing");
    assert!(ask(&mut c, "3", 1).await.0, "version 3's answers survive the restart");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_version_number_keeps_its_teachers_on_the_embedded_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("state.redb").display().to_string();
    a_version_number_keeps_its_teachers(&[("PACPRIV__STORE__PATH", path)]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_version_number_keeps_its_teachers_on_postgres() {
    let pg = Postgres::start();
    let store = [("PACPRIV__STORE__BACKEND", "postgres".to_owned()), ("PACPRIV__STORE__POSTGRES_URL", pg.url.clone())];
    a_version_number_keeps_its_teachers(&store).await;
}

/// A store from the release before identities
/// (`tests/fixtures/store-before-identities/`) upgrades in place: the
/// versions it served are claimed with the teachers configured at the
/// upgrade and keep that release's cache keys, so alice's three answers
/// come back cached, free and as released; from then on version 2's
/// number is its teachers'.
#[tokio::test(flavor = "multi_thread")]
async fn a_store_from_before_identities_keeps_its_cached_answers() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-before-identities");
    let dir = tempfile::tempdir().expect("temp dir");
    let (store, file) = (dir.path().join("state.redb"), dir.path().join("pacpriv.toml"));
    std::fs::copy(fixtures.join("state.redb"), &store).expect("copy");
    std::fs::copy(fixtures.join("pacpriv.toml"), &file).expect("copy");
    let env = [
        ("PACPRIV__DEMO__MODELS", "16".to_owned()),
        ("PACPRIV__DEMO__NAIVE_BAYES_MODEL", String::new()),
        ("PACPRIV__PRIVACY__PER_QUERY_MI", "2^-8".to_owned()),
        ("PACPRIV__STORE__PATH", store.display().to_string()),
    ];
    let spent = 3.0 * 2f64.powi(-8);
    let mut server = Process::serve(Some(&file), &env);
    let mut c = client(&server.addr).await;
    assert_eq!(budget(&mut c, "ka").await.spent, spent);
    let row = |n: f32| std::iter::once(n).chain(std::iter::repeat_n(0.0, 63)).collect::<Vec<f32>>();
    for (version, n, label) in [("1", 1.0, 8), ("2", 1.0, 4), ("2", 5.0, 7)] {
        let request = PredictRequest { model_version: version.to_owned(), ..image(&format!("again-{n}"), &row(n)) };
        let r = predict(&mut c, "ka", request).await.expect("answered");
        assert!(r.cached && r.mi_charged == 0.0, "version {version}, [{n}, 0, …]: {r:?}");
        assert_eq!(r.label, label, "version {version}, [{n}, 0, …]: the label the old release released");
    }
    assert_eq!(budget(&mut c, "ka").await.spent, spent, "nothing charged");
    server.kill();
    drop(server);

    // The upgrade claimed version 2 with its teachers.
    std::fs::write(&file, std::fs::read_to_string(fixtures.join("pacpriv.toml")).expect("read").replace("1.0", "0.5"))
        .expect("config");
    let said = refused(&file, &env);
    assert!(said.contains("model \"private\" version 2"), "{said}");
}
