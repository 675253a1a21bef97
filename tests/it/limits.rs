//! Resource limits: the per-principal rate limit (and how its refusal
//! differs from an exhausted budget), concurrent streams per connection,
//! and client deadlines. The message size limit is in `service.rs`.

use crate::util::faulty::{FaultyTeachers, write_config};
use crate::util::{
    B, Process, budget, client, digit, health_becomes, image, key_hash, predict, sample, scrape, small_demo, with_key,
};
use pacpriv_service::proto::pacpriv::PredictRequest;
use std::time::Duration;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_types::StatusExt;

#[tokio::test(flavor = "multi_thread")]
async fn over_the_rate_a_query_is_refused_as_rate_limited_not_as_out_of_budget() {
    // 1 query a second, bursts of 3, per principal; demo's budget pays for
    // 5 answers and tiny's for none.
    let server = Process::serve(
        None,
        &small_demo(&[
            ("PACPRIV__SERVER__RATE_LIMIT_PER_SECOND", "1".into()),
            ("PACPRIV__SERVER__RATE_LIMIT_BURST", "3".into()),
            ("PACPRIV__PRINCIPALS__DEMO__BUDGET_MI", format!("{}", 5.0 * B)),
            ("PACPRIV__PRINCIPALS__TINY__KEY_SHA256", key_hash("tiny-key")),
            ("PACPRIV__PRINCIPALS__TINY__BUDGET_MI", format!("{}", B / 2.0)),
        ]),
    );
    let c = client(&server.addr).await;

    // Ten at once: the burst is answered, the rest refused (unless the ten
    // took seconds to arrive, each second adds at most one token).
    let started = std::time::Instant::now();
    let mut sent = tokio::task::JoinSet::new();
    for n in 0..10 {
        let mut c = c.clone();
        sent.spawn(async move { predict(&mut c, "demo-key", image(&format!("q{n}"), &digit(n))).await });
    }
    let results = sent.join_all().await;
    let seconds = started.elapsed().as_secs();
    let answered = results.iter().filter(|r| r.is_ok()).count();
    assert!(answered >= 3 && answered as u64 <= 3 + seconds + 1, "{answered} answered in {seconds} s");
    for e in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        let details = e.get_error_details();
        let info = details.error_info().expect("ErrorInfo detail");
        assert_eq!(info.reason, "RATE_LIMITED");
        assert_eq!(info.metadata.get("per_second").map(String::as_str), Some("1"));
        let retry = details.retry_info().and_then(|r| r.retry_delay).expect("RetryInfo detail");
        assert!(retry > Duration::ZERO && retry <= Duration::from_secs(1), "{retry:?}");
        assert!(e.message().contains("Nothing was charged: this is not the MI budget"), "{}", e.message());
    }
    let mut c1 = c.clone();
    let b = budget(&mut c1, "demo-key").await;
    assert_eq!((b.answered, b.spent), (answered as u64, answered as f64 * B), "refusals cost nothing");

    // Another principal has a bucket of its own; its budget refusal is
    // BUDGET_EXHAUSTED — a client can tell the two apart.
    let e = predict(&mut c1, "tiny-key", image("t", &digit(50))).await.expect_err("tiny cannot pay");
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert_eq!(e.get_error_details().error_info().map(|i| i.reason.clone()).as_deref(), Some("BUDGET_EXHAUSTED"));
    predict(&mut c1, "alice-key", image("a", &digit(51))).await.expect("alice's bucket is full");

    let metrics = scrape(&server.listener("metrics"));
    let refused = sample(&metrics, r#"pacpriv_queries_total{outcome="refused_rate"}"#);
    assert_eq!(refused, Some((10 - answered) as f64), "{metrics}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_gets_at_most_max_concurrent_streams_calls_at_once() {
    let server = Process::serve(None, &small_demo(&[("PACPRIV__SERVER__MAX_CONCURRENT_STREAMS", "2".into())]));
    let mut c = client(&server.addr).await;
    // Two streams held open on this connection (each has answered once).
    let mut open = Vec::new();
    for n in 0..2u32 {
        let (tx, rx) = tokio::sync::mpsc::channel::<PredictRequest>(4);
        tx.send(image(&format!("s{n}"), &digit(100 + n))).await.expect("queued");
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        let mut responses = c.predict_stream(with_key(stream, "alice-key")).await.expect("stream opens").into_inner();
        responses.message().await.expect("answered").expect("one response");
        open.push((tx, responses));
    }
    // A third call on the same connection waits for a free stream...
    let mut third = c.clone();
    let waiting = tokio::spawn(async move { predict(&mut third, "alice-key", image("third", &digit(102))).await });
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!waiting.is_finished(), "a third call ran beside two open streams");
    // ...and runs once one of them ends.
    let (tx, mut responses) = open.remove(0);
    drop(tx);
    assert!(responses.message().await.expect("ends cleanly").is_none());
    let third = waiting.await.expect("task").expect("answered once a stream was free");
    assert_eq!(third.budget.map(|b| b.answered), Some(3));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_query_past_its_deadline_is_abandoned_and_costs_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = dir.path().join("teachers.toml");
    let teachers = Process::teachers_at(16, 1, "127.0.0.1:0");
    let proxy = FaultyTeachers::start(&teachers.addr).await;
    write_config(&cfg, 16, |_| proxy.endpoint.clone());
    let env = [
        ("PACPRIV__TEACHERS__DEADLINE_MS", "5000".to_owned()),
        ("PACPRIV__PRIVACY__PER_QUERY_MI", "2^-8".to_owned()),
        ("PACPRIV__SERVER__REQUEST_TIMEOUT_MS", "1000".to_owned()),
    ];
    let server = Process::serve(Some(&cfg), &env);
    assert!(health_becomes(&server.addr, ServingStatus::Serving).await);
    let mut c = client(&server.addr).await;

    // Every teacher takes 1.5 s; the client allows 200 ms.
    for i in 0..16 {
        proxy.slow(&format!("digits-{i:03}"), Duration::from_millis(1500));
    }
    let mut req = with_key(image("late", &digit(7)), "demo-key");
    req.set_timeout(Duration::from_millis(200));
    let e = c.predict(req).await.expect_err("past its deadline");
    assert!(matches!(e.code(), Code::DeadlineExceeded | Code::Cancelled), "{e:?}");
    // Long after the teachers have answered, the abandoned query is still
    // neither answered nor charged.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let b = budget(&mut c, "demo-key").await;
    assert_eq!((b.answered, b.spent), (0, 0.0));

    // A client that sets no deadline meets the server's own
    // (server.request_timeout_ms, issue 40 §2): the same, nothing charged.
    let e = c.predict(with_key(image("no deadline", &digit(9)), "demo-key")).await.expect_err("server timeout");
    assert!(matches!(e.code(), Code::DeadlineExceeded | Code::Cancelled), "{e:?}");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let b = budget(&mut c, "demo-key").await;
    assert_eq!((b.answered, b.spent), (0, 0.0));

    for i in 0..16 {
        proxy.slow(&format!("digits-{i:03}"), Duration::ZERO);
    }
    let mut req = with_key(image("in time", &digit(8)), "demo-key");
    req.set_timeout(Duration::from_secs(10));
    let r = c.predict(req).await.expect("answered within its deadline").into_inner();
    assert_eq!(r.budget.map(|b| (b.answered, b.spent)), Some((1, B)));
}

/// Issue 40 §3: nothing is charged that cannot be delivered. A
/// configuration whose largest batch would evict its own rows from the
/// answer cache, or whose largest response would not fit the encode limit,
/// is refused at start naming the keys; and under the shipped limits a
/// batch as large as the cache repeats its first row in its last for free,
/// even after the cache was filled by earlier answers.
#[tokio::test(flavor = "multi_thread")]
async fn what_could_be_charged_and_not_delivered_is_refused_at_start() {
    let check = |env: &[(&'static str, String)]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_pacpriv"))
            .args(["serve", "--check"])
            .envs(small_demo(env))
            .output()
            .expect("pacpriv runs");
        (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (code, said) = check(&[
        ("PACPRIV__SERVER__MAX_BATCH_ROWS", "65".into()),
        ("PACPRIV__PRIVACY__ANSWER_CACHE_ENTRIES", "64".into()),
    ]);
    assert_eq!(code, Some(64), "{said}");
    assert!(said.contains("server.max_batch_rows") && said.contains("privacy.answer_cache_entries"), "{said}");
    let (code, said) = check(&[
        ("PACPRIV__SERVER__MAX_BATCH_ROWS", "4096".into()),
        ("PACPRIV__PRIVACY__ANSWER_CACHE_ENTRIES", "4096".into()),
        ("PACPRIV__PRIVACY__RELEASE_NOISY_VECTOR", "true".into()),
    ]);
    assert_eq!(code, Some(64), "{said}");
    assert!(said.contains("server.max_message_bytes") && said.contains("privacy.release_noisy_vector"), "{said}");
    assert_eq!(
        check(&[("PACPRIV__PRIVACY__RELEASE_NOISY_VECTOR", "true".into())]).0,
        Some(0),
        "the shipped limits fit"
    );

    let server = Process::serve(None, &small_demo(&[("PACPRIV__PRINCIPALS__ALICE__BUDGET_MI", "100".into())]));
    let mut c = client(&server.addr).await;
    for n in 0..64 {
        predict(&mut c, "alice-key", image(&format!("fill{n}"), &digit(1000 + n))).await.expect("answered");
    }
    let before = budget(&mut c, "alice-key").await;
    // 64 rows, new examples but the last, which repeats the first.
    let mut pixels: Vec<f32> = (0..63).flat_map(|n| digit(2000 + n)).collect();
    pixels.extend(digit(2000));
    let mut batch = image("batch", &pixels);
    batch.input.as_mut().expect("input").shape = vec![64, 64];
    let r = predict(&mut c, "alice-key", batch).await.expect("answered");
    assert_eq!(r.rows.len(), 64);
    assert!(r.rows[63].cached && r.rows[63].mi_charged == 0.0, "{:?}", r.rows[63]);
    assert_eq!(r.rows[63].label, r.rows[0].label);
    let after = budget(&mut c, "alice-key").await;
    assert_eq!(after.charged - before.charged, 63, "the repeated row was free");
}

/// Issue 67 §5: one principal holds at most
/// `server.max_calls_in_flight_per_principal` calls at once — each open
/// `PredictStream` holds one — and a call past the cap is refused
/// RESOURCE_EXHAUSTED (HTTP 429) with reason TOO_MANY_IN_FLIGHT, nothing
/// charged; another principal is not held back, and the place comes
/// back when a call ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_principal_past_its_calls_in_flight_is_refused_and_charged_nothing() {
    let server = Process::serve(
        None,
        &small_demo(&[
            ("PACPRIV__SERVER__MAX_CALLS_IN_FLIGHT_PER_PRINCIPAL", "2".into()),
            ("PACPRIV__PRINCIPALS__BOB__KEY_SHA256", key_hash("bob-key")),
            ("PACPRIV__PRINCIPALS__BOB__BUDGET_MI", "1".into()),
        ]),
    );
    let mut c = client(&server.addr).await;
    let mut open = Vec::new();
    for n in 0..2 {
        let (tx, rx) = tokio::sync::mpsc::channel::<PredictRequest>(1);
        tx.send(image(&format!("s{n}"), &digit(110 + n))).await.expect("queued");
        let stream = with_key(tokio_stream::wrappers::ReceiverStream::new(rx), "alice-key");
        let mut responses = c.predict_stream(stream).await.expect("opens").into_inner();
        responses.message().await.expect("ok").expect("its first answer");
        open.push((tx, responses));
    }
    let e = predict(&mut c, "alice-key", image("third", &digit(120))).await.expect_err("past the cap");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    let details = e.get_error_details();
    let info = details.error_info().expect("ErrorInfo detail");
    assert_eq!(
        (info.reason.as_str(), info.metadata.get("charged").map(String::as_str)),
        ("TOO_MANY_IN_FLIGHT", Some("false"))
    );
    assert!(e.message().contains("server.max_calls_in_flight_per_principal"), "{}", e.message());
    let (tx, rx) = tokio::sync::mpsc::channel::<PredictRequest>(1);
    tx.send(image("third-stream", &digit(121))).await.expect("queued");
    let e = c.predict_stream(with_key(tokio_stream::wrappers::ReceiverStream::new(rx), "alice-key")).await;
    assert_eq!(e.expect_err("a third stream is past the cap").code(), Code::ResourceExhausted);
    let http = crate::util::curl(
        "POST",
        &format!("http://{}/v2/models/private/infer", server.listener("http")),
        &["x-api-key: alice-key"],
        Some(&crate::util::request(&[digit(122)], &["label"])),
    );
    assert_eq!((http.code, &http.body["reason"]), (429, &serde_json::json!("TOO_MANY_IN_FLIGHT")), "{}", http.body);
    predict(&mut c, "bob-key", image("bob", &digit(123))).await.expect("another principal has its own places");
    assert_eq!(budget(&mut c, "alice-key").await.answered, 2, "the refused calls cost nothing");

    let (tx, mut responses) = open.remove(0);
    drop(tx);
    assert!(responses.message().await.expect("ends cleanly").is_none());
    predict(&mut c, "alice-key", image("after", &digit(124))).await.expect("a place came back");
}

/// Issue 67 §5: a call authenticates when it arrives and is charged after
/// the teachers answer; a key revoked meanwhile is refused at the charge,
/// UNAUTHENTICATED, nothing charged — on both stores.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_revoked_while_its_call_is_in_flight_is_refused_before_the_charge() {
    revoked_in_flight(None).await;
    let pg = crate::util::Postgres::start();
    revoked_in_flight(Some(&pg.url)).await;
}

async fn revoked_in_flight(postgres: Option<&str>) {
    use crate::util::{ADMIN_TOKEN, admin_client, bearer};
    use pacpriv_service::proto::pacpriv::{CreatePrincipalRequest, InspectPrincipalRequest, RevokePrincipalRequest};
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = dir.path().join("teachers.toml");
    let teachers = Process::teachers_at(16, 1, "127.0.0.1:0");
    let proxy = FaultyTeachers::start(&teachers.addr).await;
    write_config(&cfg, 16, |_| proxy.endpoint.clone());
    let mut env = vec![
        ("PACPRIV__PRIVACY__PER_QUERY_MI", "2^-8".to_owned()),
        ("PACPRIV__ADMIN__KEY_SHA256", key_hash(ADMIN_TOKEN)),
    ];
    if let Some(url) = postgres {
        env.push(("PACPRIV__STORE__BACKEND", "postgres".to_owned()));
        env.push(("PACPRIV__STORE__POSTGRES_URL", url.to_owned()));
    }
    let server = Process::serve(Some(&cfg), &env);
    assert!(health_becomes(&server.addr, ServingStatus::Serving).await);
    let mut admin = admin_client(&server.listener("admin")).await;
    let create = CreatePrincipalRequest { name: "bob".into(), budget_mi: "1".into(), ..Default::default() };
    let key = admin.create_principal(bearer(create, ADMIN_TOKEN)).await.expect("created").into_inner().api_key;

    for i in 0..16 {
        proxy.slow(&format!("digits-{i:03}"), Duration::from_millis(1500));
    }
    let mut c = client(&server.addr).await;
    let asking = {
        let key = key.clone();
        tokio::spawn(async move { predict(&mut c, &key, image("in-flight", &digit(130))).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    admin.revoke_principal(bearer(RevokePrincipalRequest { name: "bob".into() }, ADMIN_TOKEN)).await.expect("revoked");
    let e = asking.await.expect("task").expect_err("revoked while in flight");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?} ({postgres:?})");
    let inspect = admin.inspect_principal(bearer(InspectPrincipalRequest { name: "bob".into() }, ADMIN_TOKEN)).await;
    let account = inspect.expect("inspect").into_inner().account.expect("account");
    assert_eq!((account.answered, account.spent), (0, 0.0), "nothing charged");
}
