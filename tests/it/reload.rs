//! Reload without restart: SIGHUP re-reads the configuration and puts new
//! principals, rotated keys, changed budgets, a rate limit, new TLS
//! certificates and new model versions in force, while established connections keep working; a
//! configuration that does not validate is rejected, counted, and the
//! running one stays.

use crate::ops::certificates;
use crate::util::{B, Process, digit, image, key_hash, sample, scrape, with_key};
use pacpriv_service::proto::pacpriv::PredictRequest;
use pacpriv_service::proto::pacpriv::privatizer_client::PrivatizerClient;
use std::path::Path;
use std::time::Duration;
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// The configuration file: TLS from `certs`, and `principals` as (name,
/// key, budget).
fn config(certs: &Path, principals: &[(&str, &str, f64)], rate: u32) -> String {
    let mut s = format!(
        "[server]\nrate_limit_per_second = {rate}\n\n[tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n\n",
        certs.join("server.pem").display(),
        certs.join("server.key").display()
    );
    for (name, key, budget) in principals {
        s.push_str(&format!("[principals.{name}]\nkey_sha256 = \"{}\"\nbudget_mi = {budget}\n\n", key_hash(key)));
    }
    s
}

async fn connect(addr: &str, ca: &Certificate) -> Result<Channel, tonic::transport::Error> {
    let tls = ClientTlsConfig::new().ca_certificate(ca.clone()).domain_name("localhost");
    Endpoint::from_shared(format!("https://{addr}")).expect("uri").tls_config(tls).expect("tls").connect().await
}

async fn ask(c: &mut PrivatizerClient<Channel>, key: &str, n: u32) -> Result<f64, Code> {
    c.predict(with_key(image(&format!("q{n}"), &digit(n)), key))
        .await
        .map(|r| r.into_inner().mi_charged)
        .map_err(|e| e.code())
}

/// Sends SIGHUP and waits until the reload counter `outcome` reaches `n`.
pub(crate) async fn reload(server: &Process, metrics: &str, outcome: &str, n: f64) {
    server.signal("HUP");
    let series = format!("pacpriv_config_reloads_total{{outcome=\"{outcome}\"}}");
    for _ in 0..100 {
        if sample(&scrape(metrics), &series) == Some(n) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no {outcome} reload counted:\n{}", server.logs());
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads_principals_keys_budgets_rate_limits_and_certificates() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (old_certs, new_certs) = (dir.path().join("old"), dir.path().join("new"));
    std::fs::create_dir_all(&old_certs).expect("dir");
    std::fs::create_dir_all(&new_certs).expect("dir");
    let (old_ca, _) = certificates(&old_certs, "unused");
    let (new_ca, _) = certificates(&new_certs, "unused");
    let file = dir.path().join("pacpriv.toml");
    std::fs::write(&file, config(&old_certs, &[("alice", "ka", 1.0), ("bob", "kb", 1.0)], 0)).expect("config");
    let env = [("PACPRIV__DEMO__MODELS", "16".to_owned()), ("PACPRIV__PRIVACY__PER_QUERY_MI", "2^-8".to_owned())];
    let server = Process::serve(Some(&file), &env);
    let metrics = server.listener("metrics");

    let mut established = PrivatizerClient::new(connect(&server.addr, &old_ca).await.expect("TLS with the old CA"));
    assert_eq!(ask(&mut established, "ka", 1).await, Ok(B));
    assert_eq!(ask(&mut established, "kb", 2).await, Ok(B));

    // Alice's key rotated and her budget cut to what she has spent, bob
    // removed, carol added, a rate limit, new certificates.
    let next = [("alice", "ka-2", B), ("carol", "kc", 1.0)];
    std::fs::write(&file, config(&new_certs, &next, 1)).expect("config");
    reload(&server, &metrics, "applied", 1.0).await;

    // The connection made before keeps working, under the new rules.
    assert_eq!(ask(&mut established, "ka", 3).await, Err(Code::Unauthenticated), "the old key is refused");
    assert_eq!(ask(&mut established, "kb", 4).await, Err(Code::Unauthenticated), "a removed principal is revoked");
    assert_eq!(
        ask(&mut established, "ka-2", 5).await,
        Err(Code::ResourceExhausted),
        "alice's spending stays, checked against her new budget"
    );
    assert_eq!(ask(&mut established, "kc", 6).await, Ok(B), "a new principal answers");
    // The rate limit: one query a second, for every principal.
    assert_eq!(ask(&mut established, "kc", 7).await, Err(Code::ResourceExhausted));

    // A client that reconnects sees the new certificate.
    assert!(connect(&server.addr, &old_ca).await.is_err(), "the old CA no longer verifies the server");
    let mut fresh = PrivatizerClient::new(connect(&server.addr, &new_ca).await.expect("TLS with the new CA"));
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(ask(&mut fresh, "kc", 8).await, Ok(B));

    // A configuration that does not validate: rejected, counted, logged;
    // the running one stays.
    std::fs::write(&file, "[privacy]\nper_query_mi = \"lots\"\n").expect("config");
    reload(&server, &metrics, "rejected", 1.0).await;
    assert!(server.logs().contains("configuration reload rejected"), "{}", server.logs());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(ask(&mut fresh, "kc", 9).await, Ok(B), "carol still answers");
    assert_eq!(ask(&mut fresh, "kb", 10).await, Err(Code::Unauthenticated), "bob is still revoked");
    assert_eq!(sample(&scrape(&metrics), "pacpriv_config_reloads_total{outcome=\"applied\"}"), Some(1.0));

    // What a certificate is taken to mean is read at start: changing it is
    // refused, not logged as applied and ignored (issue 40 §5).
    let mtls =
        format!("[tls]\nprincipal_from_cert = true\nclient_ca_file = \"{}\"\n", new_certs.join("ca.pem").display());
    std::fs::write(&file, config(&new_certs, &next, 1).replace("[tls]\n", &mtls)).expect("config");
    reload(&server, &metrics, "rejected", 2.0).await;
    let logs = server.logs();
    assert!(logs.contains("a running server cannot take") && logs.contains("tls.principal_from_cert"), "{logs}");
}

/// A stream's next query, and whether it was answered (the error code if not).
async fn next_on(
    tx: &tokio::sync::mpsc::Sender<pacpriv_service::proto::pacpriv::PredictRequest>,
    responses: &mut tonic::Streaming<pacpriv_service::proto::pacpriv::PredictResponse>,
    n: u32,
) -> Result<f64, Code> {
    tx.send(image(&format!("s{n}"), &digit(200 + n))).await.expect("queued");
    match responses.message().await {
        Ok(Some(r)) => Ok(r.mi_charged),
        Ok(None) => Err(Code::Ok),
        Err(e) => Err(e.code()),
    }
}

/// Opens a stream with `key` on `addr`.
async fn open_stream(
    addr: &str,
    key: &str,
) -> (
    tokio::sync::mpsc::Sender<pacpriv_service::proto::pacpriv::PredictRequest>,
    tonic::Streaming<pacpriv_service::proto::pacpriv::PredictResponse>,
) {
    let mut c = crate::util::client(addr).await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let responses = c.predict_stream(with_key(stream, key)).await.expect("stream opens").into_inner();
    (tx, responses)
}

/// Issue 40 §5: what a reload changes reaches streams already open — a
/// rotated key stops one at its next query, a budget cut applies from its
/// next query — on either store; and a reload that changes what needs a
/// restart (the admin token, `tls.principal_from_cert`, a listener) is
/// rejected whole, naming the keys, before anything (a new principal) is
/// provisioned.
async fn a_reload_reaches_open_streams_and_refuses_what_needs_a_restart(store: &[(&'static str, String)]) {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("pacpriv.toml");
    let principals = |list: &[(&str, &str, f64)], extra: &str| {
        let mut s = format!("[admin]\nkey_sha256 = \"{}\"\n\n{extra}", key_hash(crate::util::ADMIN_TOKEN));
        for (name, key, budget) in list {
            s.push_str(&format!("[principals.{name}]\nkey_sha256 = \"{}\"\nbudget_mi = {budget}\n\n", key_hash(key)));
        }
        s
    };
    std::fs::write(&file, principals(&[("alice", "ka", 1.0), ("bob", "kb", 1.0)], "")).expect("config");
    let mut env =
        vec![("PACPRIV__DEMO__MODELS", "16".to_owned()), ("PACPRIV__PRIVACY__PER_QUERY_MI", "2^-8".to_owned())];
    env.extend_from_slice(store);
    let server = Process::serve(Some(&file), &env);
    let metrics = server.listener("metrics");

    let (alice, mut alice_answers) = open_stream(&server.addr, "ka").await;
    let (bob, mut bob_answers) = open_stream(&server.addr, "kb").await;
    assert_eq!(next_on(&alice, &mut alice_answers, 1).await, Ok(B));
    assert_eq!(next_on(&bob, &mut bob_answers, 2).await, Ok(B));

    // Alice's key rotated; bob's budget cut to what he has spent.
    std::fs::write(&file, principals(&[("alice", "ka-2", 1.0), ("bob", "kb", B)], "")).expect("config");
    reload(&server, &metrics, "applied", 1.0).await;
    assert_eq!(next_on(&alice, &mut alice_answers, 3).await, Err(Code::Unauthenticated), "the rotated key, mid-stream");
    assert_eq!(next_on(&bob, &mut bob_answers, 4).await, Err(Code::ResourceExhausted), "the cut budget, mid-stream");
    let mut c = crate::util::client(&server.addr).await;
    assert_eq!(crate::util::budget(&mut c, "kb").await.answered, 1, "nothing past the cut was charged");
    assert_eq!(ask(&mut c, "ka-2", 5).await, Ok(B), "the new key works");

    // Restart-only changes, with a new principal beside them: rejected
    // whole, naming each key; the new principal was never provisioned.
    let mut changed = principals(&[("alice", "ka-2", 1.0), ("bob", "kb", B), ("dave", "kd", 1.0)], "");
    changed = changed.replace(&key_hash(crate::util::ADMIN_TOKEN), &key_hash("another-admin-token"));
    changed.push_str("[server]\ndrain_grace_ms = 1\n");
    std::fs::write(&file, changed).expect("config");
    reload(&server, &metrics, "rejected", 1.0).await;
    let logs = server.logs();
    assert!(logs.contains("admin (key_sha256, listen)") && logs.contains("server.drain_grace_ms"), "{logs}");
    assert_eq!(ask(&mut c, "kd", 6).await, Err(Code::Unauthenticated), "dave was not provisioned");
    assert!(server.admin_cli(&["list"]).status.success(), "the running admin token still works");
    assert_eq!(sample(&scrape(&metrics), "pacpriv_config_reloads_total{outcome=\"applied\"}"), Some(1.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reload_reaches_open_streams_on_the_embedded_store() {
    a_reload_reaches_open_streams_and_refuses_what_needs_a_restart(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reload_reaches_open_streams_on_postgres() {
    let pg = crate::util::Postgres::start();
    a_reload_reaches_open_streams_and_refuses_what_needs_a_restart(&[
        ("PACPRIV__STORE__BACKEND", "postgres".into()),
        ("PACPRIV__STORE__POSTGRES_URL", pg.url.clone()),
    ])
    .await;
}

/// Issue 53 §5: a reload is one transaction in the store. When the store
/// fails midway — here a PostgreSQL trigger refuses the revocation of the
/// principal the new configuration drops, after the one it adds was
/// provisioned — nothing of it is applied: the added principal does not
/// answer, the dropped one still does, and the reload counts as rejected.
/// Once the store takes it, the same reload applies whole.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_the_store_fails_midway_applies_nothing() {
    let pg = crate::util::Postgres::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs).expect("dir");
    let (ca, _) = certificates(&certs, "unused");
    let file = dir.path().join("pacpriv.toml");
    std::fs::write(&file, config(&certs, &[("alice", "ka", 1.0), ("bob", "kb", 1.0)], 0)).expect("config");
    let env = [
        ("PACPRIV__DEMO__MODELS", "16".to_owned()),
        ("PACPRIV__PRIVACY__PER_QUERY_MI", "2^-8".to_owned()),
        ("PACPRIV__STORE__BACKEND", "postgres".to_owned()),
        ("PACPRIV__STORE__POSTGRES_URL", pg.url.clone()),
    ];
    let server = Process::serve(Some(&file), &env);
    let metrics = server.listener("metrics");
    let mut c = PrivatizerClient::new(connect(&server.addr, &ca).await.expect("TLS"));
    assert_eq!(ask(&mut c, "kb", 1).await, Ok(B));

    let (admin, connection) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls).await.expect("psql");
    tokio::spawn(connection);
    admin
        .batch_execute(
            "CREATE FUNCTION refuse_revocation() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'revocations refused for this test'; END $$; \
             CREATE TRIGGER refuse_revocation BEFORE UPDATE OF revoked_unix ON pacpriv_principals \
             FOR EACH ROW WHEN (NEW.revoked_unix IS NOT NULL) EXECUTE FUNCTION refuse_revocation();",
        )
        .await
        .expect("trigger");
    std::fs::write(&file, config(&certs, &[("alice", "ka", 1.0), ("carol", "kc", 1.0)], 0)).expect("config");
    reload(&server, &metrics, "rejected", 1.0).await;
    assert_eq!(ask(&mut c, "kc", 2).await, Err(Code::Unauthenticated), "carol was not provisioned");
    assert_eq!(ask(&mut c, "kb", 3).await, Ok(B), "bob was not revoked");

    admin.batch_execute("DROP TRIGGER refuse_revocation ON pacpriv_principals").await.expect("drop trigger");
    reload(&server, &metrics, "applied", 1.0).await;
    assert_eq!(ask(&mut c, "kc", 4).await, Ok(B), "carol answers");
    assert_eq!(ask(&mut c, "kb", 5).await, Err(Code::Unauthenticated), "bob is revoked");
}

/// Issue 53 §8: `pacpriv admin rotate NAME` gives an admin-created
/// principal a new key, printed once. The old key is refused at once — on
/// a stream opened with it too, at its next query — and the principal
/// keeps its session and spending. A configured principal's key is the
/// configuration's: not rotated. On either store.
async fn a_rotated_key_replaces_the_old_one_and_keeps_the_spending(store: &[(&'static str, String)]) {
    let mut env = crate::util::small_demo(&[("PACPRIV__ADMIN__KEY_SHA256", key_hash(crate::util::ADMIN_TOKEN))]);
    env.extend_from_slice(store);
    let server = Process::serve(None, &env);
    let admin = |args: &[&str]| server.admin_cli(args);
    let created = admin(&["create", "grace", "--budget-mi", "2^-6"]);
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let printed = String::from_utf8_lossy(&created.stdout).into_owned();
    let old_key = printed.lines().find_map(|l| l.strip_prefix("api_key=")).expect("key printed").to_owned();
    let mut c = crate::util::client(&server.addr).await;
    assert_eq!(ask(&mut c, &old_key, 1).await, Ok(B));
    let (tx, mut responses) = open_stream(&server.addr, &old_key).await;
    assert_eq!(next_on(&tx, &mut responses, 1).await, Ok(B));

    let rotated = admin(&["rotate", "grace"]);
    let said = String::from_utf8_lossy(&rotated.stdout).into_owned();
    assert!(rotated.status.success(), "{}", String::from_utf8_lossy(&rotated.stderr));
    assert!(said.contains("spent=7.8125e-3"), "the spending stays: {said}");
    let new_key = said.lines().find_map(|l| l.strip_prefix("api_key=")).expect("new key printed").to_owned();
    assert_ne!(new_key, old_key);

    assert_eq!(ask(&mut c, &old_key, 2).await, Err(Code::Unauthenticated), "the old key is refused at once");
    assert_eq!(next_on(&tx, &mut responses, 2).await, Err(Code::Unauthenticated), "on the open stream too");
    assert_eq!(ask(&mut c, &new_key, 3).await, Ok(B), "the new key answers");
    let account = crate::util::budget(&mut c, &new_key).await;
    assert_eq!((account.answered, account.spent), (3, 3.0 * B), "one session: the old key's answers count");

    let refused = admin(&["rotate", "alice"]);
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && why.contains("configured"), "a configured key is not rotated: {why}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_key_replaces_the_old_one_on_the_embedded_store() {
    a_rotated_key_replaces_the_old_one_and_keeps_the_spending(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_key_replaces_the_old_one_on_postgres() {
    let pg = crate::util::Postgres::start();
    a_rotated_key_replaces_the_old_one_and_keeps_the_spending(&[
        ("PACPRIV__STORE__BACKEND", "postgres".into()),
        ("PACPRIV__STORE__POSTGRES_URL", pg.url.clone()),
    ])
    .await;
}

/// Issue 54 §5: the configuration is the model repository. A reload adds
/// `[versions.private.2]` while four clients query: no request fails,
/// requests naming no version move to version 2 once it is built and its
/// teachers ready, and every answer of either version is charged to the
/// one session (the charges add up to its spending). A reload removing it
/// leaves version 1 serving and drops version 2's metric series; a request
/// naming version 2 is then NOT_FOUND, nothing charged. The default model's teachers still need a restart.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_adds_and_removes_a_version_under_load() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("pacpriv.toml");
    let base = format!("[principals.alice]\nkey_sha256 = \"{}\"\nbudget_mi = 1\n\n", key_hash("ka"));
    let version_2 = "[versions.private.2]\ndemo = { regularisation = 1.0 }\n";
    std::fs::write(&file, &base).expect("config");
    let env = [
        ("PACPRIV__DEMO__MODELS", "16".to_owned()),
        ("PACPRIV__DEMO__NAIVE_BAYES_MODEL", String::new()),
        ("PACPRIV__PRIVACY__PER_QUERY_MI", "2^-8".to_owned()),
    ];
    let server = Process::serve(Some(&file), &env);
    let metrics = server.listener("metrics");

    // Four clients, each at most 40 fresh queries, until told to stop.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for task in 0..4u32 {
        let (addr, stop) = (server.addr.clone(), std::sync::Arc::clone(&stop));
        load.push(tokio::spawn(async move {
            let mut c = crate::util::client(&addr).await;
            let mut answers = Vec::new();
            for i in 0..40u32 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                let seed = 1000 + task * 100 + i;
                let r = crate::util::predict(&mut c, "ka", image(&format!("{task}-{i}"), &digit(seed))).await;
                answers.push(r.map(|r| (r.model_version, r.mi_charged)).map_err(|e| e.code()));
            }
            answers
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(&file, format!("{base}{version_2}")).expect("config");
    reload(&server, &metrics, "applied", 1.0).await;
    let mut c = crate::util::client(&server.addr).await;
    let r = crate::util::predict(&mut c, "ka", image("after", &digit(1))).await.expect("answered");
    assert_eq!(r.model_version, "2", "the new version, built and ready, answers requests naming none");
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut charged = r.mi_charged;
    let mut versions = std::collections::BTreeSet::new();
    for task in load {
        for answer in task.await.expect("a client") {
            let (version, charge) = answer.expect("no request fails across the reload");
            versions.insert(version);
            charged += charge;
        }
    }
    assert!(versions.contains("1"), "answers before the reload came from version 1: {versions:?}");
    let spent = crate::util::budget(&mut c, "ka").await.spent;
    assert!((spent - charged).abs() < 1e-12, "one session: spent {spent}, the answers' charges {charged}");

    // Version 2's series, labelled {model, version} like every per-model
    // series, go with the reload that removes it.
    let series_of = |version: &str| {
        let scraped = crate::util::scrape(&metrics);
        let label = format!("model=\"private\",version=\"{version}\"");
        scraped.lines().filter(|l| !l.starts_with('#') && l.contains(&label)).count()
    };
    assert!(series_of("2") > 16, "version 2's answers and its 16 teachers' series");

    // Version 2 removed: version 1 answers; version 2 is not found, free.
    std::fs::write(&file, &base).expect("config");
    reload(&server, &metrics, "applied", 2.0).await;
    assert_eq!(series_of("2"), 0, "version 2's series are dropped");
    assert!(series_of("1") > 16, "version 1's are kept");
    let named = |version: &str, seed: u32| PredictRequest {
        model_version: version.to_owned(),
        ..image(&format!("v{version}-{seed}"), &digit(seed))
    };
    let e = crate::util::predict(&mut c, "ka", named("2", 2)).await.expect_err("version 2 is gone");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert_eq!(crate::util::budget(&mut c, "ka").await.spent, spent, "nothing charged");
    let r = crate::util::predict(&mut c, "ka", named("", 3)).await.expect("version 1 answers");
    assert_eq!(r.model_version, "1");

    // The default model's own teachers are the default dataset's: a restart.
    std::fs::write(&file, format!("{base}[demo]\nregularisation = 0.5\n")).expect("config");
    reload(&server, &metrics, "rejected", 1.0).await;
    assert!(server.logs().contains("model / teachers / demo"), "{}", server.logs());
}
