//! `pacpriv serve` end to end over loopback gRPC: budgets, scopes, errors,
//! teacher failures, streaming, vector mode.

use crate::util::{B, Process, budget, client, digit, health_becomes, image, key_hash, predict, small_demo, with_key};
use pacpriv_service::proto::pacpriv::PredictRequest;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_types::StatusExt;

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_queries_of_one_session_are_each_charged_once() {
    let server = Process::serve(None, &small_demo(&[]));
    let c = client(&server.addr).await;
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..40u32 {
        let mut c = c.clone();
        calls.spawn(async move { predict(&mut c, "alice-key", image(&format!("q{i}"), &digit(i))).await });
    }
    let mut labels = 0;
    while let Some(r) = calls.join_next().await {
        let r = r.expect("task").expect("answered");
        assert!(r.label < 10);
        assert_eq!(r.mi_charged, B);
        labels += 1;
    }
    let mut c = c.clone();
    let b = budget(&mut c, "alice-key").await;
    assert_eq!((labels, b.answered, b.charged), (40, 40, 40));
    assert_eq!(b.spent, 40.0 * B, "every answer charged exactly once");
    assert_eq!((b.principal.as_str(), b.scope.as_str(), b.policy.as_str()), ("alice", "per_principal", "paper"));
    assert!(b.mia_bound > 0.5 && b.mia_bound < 1.0);
    // The demo principal's session is separate.
    assert_eq!(budget(&mut c, "demo-key").await.answered, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn global_scope_shares_one_budget_and_refuses_with_details() {
    let env = small_demo(&[
        ("PACPRIV__PRIVACY__SCOPE", "global".into()),
        ("PACPRIV__PRIVACY__GLOBAL_BUDGET_MI", format!("{}", 3.0 * B)),
    ]);
    let server = Process::serve(None, &env);
    let mut c = client(&server.addr).await;
    predict(&mut c, "alice-key", image("a1", &digit(1))).await.expect("answer 1");
    predict(&mut c, "demo-key", image("d1", &digit(2))).await.expect("answer 2");
    let third = predict(&mut c, "alice-key", image("a2", &digit(3))).await.expect("answer 3");
    assert_eq!(third.budget.as_ref().map(|b| (b.answered, b.scope.as_str())), Some((3, "global")));
    let refused = predict(&mut c, "demo-key", image("d2", &digit(4))).await.expect_err("budget is spent");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("spent 0.01171875 of 0.01171875 nats"), "{}", refused.message());
    let info = refused.get_error_details().error_info().cloned().expect("ErrorInfo detail");
    assert_eq!(info.reason, "BUDGET_EXHAUSTED");
    assert_eq!(info.metadata.get("charge").map(String::as_str), Some("0.00390625"));
    // The refusal charged nothing, for either principal.
    assert_eq!(budget(&mut c, "alice-key").await.answered, 3);
    assert_eq!(budget(&mut c, "demo-key").await.spent, 3.0 * B);
}

#[tokio::test(flavor = "multi_thread")]
async fn dead_teachers_mean_unavailable_and_nothing_charged_until_they_return() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = dir.path().join("teachers.toml");
    let mut teachers = Process::teachers(8, 1, &cfg);
    let env = vec![
        ("PACPRIV__TEACHERS__DEADLINE_MS", "300".to_owned()),
        ("PACPRIV__TEACHERS__RETRIES", "1".to_owned()),
        ("PACPRIV__TEACHERS__HEALTH_INTERVAL_MS", "100".to_owned()),
        ("PACPRIV__PRIVACY__PER_QUERY_MI", "2^-8".to_owned()),
        ("PACPRIV__PRINCIPALS__DEMO__BUDGET_MI", "1".to_owned()),
    ];
    let server = Process::serve(Some(&cfg), &env);
    let mut c = client(&server.addr).await;
    assert!(health_becomes(&server.addr, ServingStatus::Serving).await);
    predict(&mut c, "demo-key", image("up", &digit(1))).await.expect("teachers up");

    teachers.kill();
    assert!(health_becomes(&server.addr, ServingStatus::NotServing).await, "readiness follows the teachers");
    let down = predict(&mut c, "demo-key", image("down", &digit(2))).await.expect_err("teachers down");
    assert_eq!(down.code(), Code::Unavailable, "{down:?}");
    assert!(down.message().contains("did not answer after 2 attempt(s)"), "{}", down.message());
    assert!(down.message().contains("nothing was charged"), "{}", down.message());
    let b = budget(&mut c, "demo-key").await;
    assert_eq!((b.answered, b.spent), (1, B));

    // Same port again: the persistent channels reconnect on their own.
    let addr = teachers.addr.clone();
    let _back = Process::teachers_at(8, 1, &addr);
    assert!(health_becomes(&server.addr, ServingStatus::Serving).await);
    let again = predict(&mut c, "demo-key", image("again", &digit(3))).await.expect("teachers back");
    assert_eq!(again.budget.map(|b| b.answered), Some(2));
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_and_spent_budgets_are_refused_before_any_teacher_is_asked() {
    // Teachers that do not exist: any request reaching the fan-out would
    // come back UNAVAILABLE, so other codes prove the order of checks.
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = dir.path().join("nowhere.toml");
    let remote: Vec<String> =
        (0..4).map(|i| format!("{{ endpoint = \"http://127.0.0.1:9\", model = \"m{i}\" }}")).collect();
    let stacked = "stacked = { endpoint = \"http://127.0.0.1:9\", model = \"all\", version = \"\", models = 4 }";
    std::fs::write(&cfg, format!("[teachers]\nsource = \"remote\"\nremote = [{}]\n{stacked}\n", remote.join(", ")))
        .expect("write");
    let env = vec![
        ("PACPRIV__TEACHERS__DEADLINE_MS", "200".to_owned()),
        ("PACPRIV__PRINCIPALS__BROKE__KEY_SHA256", key_hash("broke-key")),
        ("PACPRIV__PRINCIPALS__BROKE__BUDGET_MI", "0".to_owned()),
    ];
    let server = Process::serve(Some(&cfg), &env);
    let mut c = client(&server.addr).await;

    let tensor = |datatype: &str, shape: Vec<i64>, fp32: Vec<f32>, fp64: Vec<f64>| PredictRequest {
        query_id: String::new(),
        input: Some(pacpriv_service::proto::pacpriv::Tensor {
            datatype: datatype.into(),
            shape,
            fp32_contents: fp32,
            fp64_contents: fp64,
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut nan = vec![1.0f32; 64];
    nan[9] = f32::NAN;
    let bad = [
        (tensor("FP32", vec![63], vec![0.0; 63], vec![]), "shape [63] is not accepted"),
        (tensor("FP32", vec![2, 63], vec![0.0; 126], vec![]), "shape [2, 63] is not accepted"),
        (tensor("FP32", vec![0, 64], vec![], vec![]), "input has no rows"),
        (tensor("FP32", vec![65, 64], vec![0.0; 65 * 64], vec![]), "at most 64 in one request (server.max_batch_rows)"),
        (tensor("INT64", vec![64], vec![], vec![]), "datatype \"INT64\" is not supported"),
        (tensor("FP32", vec![64], nan, vec![]), "flat index 9 is NaN"),
        (tensor("FP32", vec![64], vec![], vec![0.0; 64]), "expects its values in fp32_contents"),
        (tensor("FP64", vec![64], vec![], vec![0.0; 60]), "holds 64 values but 60 were sent"),
        (PredictRequest { input: None, ..image("x", &digit(0)) }, "input is missing"),
        (PredictRequest { confidence_alpha: Some(1.5), ..image("x", &digit(0)) }, "confidence_alpha must be in (0, 1)"),
    ];
    for (req, expected) in bad {
        let e = predict(&mut c, "demo-key", req).await.expect_err("rejected");
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(expected), "{:?} does not say {expected:?}", e.message());
    }
    // The noisy vector is opt-in for the operator: refused up front.
    let noisy = PredictRequest { return_noisy: true, ..image("n", &digit(0)) };
    let e = predict(&mut c, "demo-key", noisy).await.expect_err("not released");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("privacy.release_noisy_vector"), "{:?}", e.message());
    // Oversized: gRPC refuses it before our code sees it.
    let huge = tensor("FP32", vec![64], vec![0.0; 40_000], vec![]);
    let e = predict(&mut c, "demo-key", huge).await.expect_err("too large");
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");

    let broke = predict(&mut c, "broke-key", image("b", &digit(0))).await.expect_err("no budget");
    assert_eq!(broke.code(), Code::ResourceExhausted, "{broke:?}");
    for key in ["wrong-key", ""] {
        let req = if key.is_empty() {
            tonic::Request::new(image("k", &digit(0)))
        } else {
            with_key(image("k", &digit(0)), key)
        };
        let e = c.predict(req).await.expect_err("unauthenticated");
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    }
    // A good request does reach the (absent) teachers.
    let e = predict(&mut c, "demo-key", image("ok", &digit(0))).await.expect_err("no teachers");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert_eq!(budget(&mut c, "demo-key").await.answered, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn stream_answers_in_order_and_stops_at_the_first_failure() {
    // Long enough that the pipeline has many queries in flight at once.
    const GOOD: usize = 40;
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("state.redb");
    let env = small_demo(&[
        ("PACPRIV__STORE__PATH", store.display().to_string()),
        ("PACPRIV__STORE__JOURNAL", "true".into()),
    ]);
    let mut server = Process::serve(None, &env);
    let mut c = client(&server.addr).await;
    let mut reqs: Vec<PredictRequest> = (0..GOOD + 5).map(|i| image(&format!("s{i}"), &digit(i as u32))).collect();
    reqs.insert(GOOD, PredictRequest { input: None, ..image("broken", &digit(0)) });
    let stream = tokio_stream::iter(reqs);
    let mut responses = c.predict_stream(with_key(stream, "alice-key")).await.expect("stream opens").into_inner();
    let mut ids = Vec::new();
    let mut end = None;
    loop {
        match responses.message().await {
            Ok(Some(r)) => ids.push((r.query_id, r.budget.map(|b| b.answered).unwrap_or_default())),
            Ok(None) => break,
            Err(e) => {
                end = Some(e.code());
                break;
            }
        }
    }
    let want: Vec<(String, u64)> = (0..GOOD).map(|i| (format!("s{i}"), i as u64 + 1)).collect();
    assert_eq!(ids, want);
    assert_eq!(end, Some(Code::InvalidArgument));
    assert_eq!(budget(&mut c, "alice-key").await.answered, GOOD as u64);
    // The session's steps were taken in request order, not in the order
    // the (batched, concurrent) fan-outs came back.
    server.kill();
    let journal = pacpriv_store::EmbeddedStore::open(&store).expect("store").journal("alice").expect("journal");
    let stepped: Vec<String> = journal.into_iter().map(|j| j.query_id).collect();
    assert_eq!(stepped, (0..GOOD).map(|i| format!("s{i}")).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread")]
async fn opted_in_noisy_vectors_are_the_release_on_a_grid() {
    let server = Process::serve(None, &small_demo(&[("PACPRIV__PRIVACY__RELEASE_NOISY_VECTOR", "true".into())]));
    let mut c = client(&server.addr).await;
    let (mut contested, mut unanimous) = (0, 0);
    for i in 0..40 {
        let req = PredictRequest { return_noisy: true, ..image(&format!("n{i}"), &digit(i)) };
        let r = predict(&mut c, "alice-key", req).await.expect("answered");
        assert_eq!(r.noisy.len(), 10, "one value per class");
        let top = r.noisy.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(i, _)| i);
        assert_eq!(top, Some(r.label as usize), "the label is the argmax of the published r");
        assert!(r.noisy.iter().all(|v| (v * 2f64.powi(32)).fract() == 0.0), "on the 2^-32 grid: {:?}", r.noisy);
        // Label mode: noise lives in the active classes' sum-zero subspace.
        assert!((r.noisy.iter().sum::<f64>() - 1.0).abs() < 1e-6, "sums to 1: {:?}", r.noisy);
        if r.unanimous {
            unanimous += 1;
            let onehot: Vec<f64> = (0..10).map(|c| if c == r.label as usize { 1.0 } else { 0.0 }).collect();
            assert_eq!(r.noisy, onehot, "a unanimous answer is exact");
        } else {
            contested += 1;
        }
    }
    assert!(contested > 0 && unanimous > 0, "both kinds seen: {contested} contested, {unanimous} unanimous");
    let plain = predict(&mut c, "alice-key", image("plain", &digit(41))).await.expect("answered");
    assert!(plain.noisy.is_empty(), "only on request");
    // Released vectors cost what the label costs: b per answer, nothing more.
    assert_eq!(budget(&mut c, "alice-key").await.spent, 41.0 * B);
}

#[tokio::test(flavor = "multi_thread")]
async fn vector_mode_privatises_score_vectors() {
    let env = small_demo(&[
        ("PACPRIV__MODEL__MODE", "vector".into()),
        ("PACPRIV__TEACHERS__OUTPUT_NAME", "probabilities".into()),
    ]);
    let server = Process::serve(None, &env);
    let mut c = client(&server.addr).await;
    for i in 0..5 {
        let r = predict(&mut c, "alice-key", image(&format!("v{i}"), &digit(i))).await.expect("answered");
        assert!(r.label < 10);
        assert!(!r.unanimous, "probability vectors of different models differ");
        assert_eq!(r.mi_charged, B);
    }
    assert_eq!(budget(&mut c, "alice-key").await.spent, 5.0 * B);
}

#[tokio::test(flavor = "multi_thread")]
async fn reflection_lists_the_served_apis_and_json_logs_carry_principal_and_query_id() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let server = Process::serve(
        None,
        &small_demo(&[
            ("PACPRIV__SERVER__LOG_FORMAT", "json".into()),
            ("PACPRIV__ADMIN__KEY_SHA256", crate::util::key_hash(crate::util::ADMIN_TOKEN)),
        ]),
    );
    let mut c = client(&server.addr).await;
    predict(&mut c, "alice-key", image("logged-query", &digit(1))).await.expect("answered");

    // Each listener lists what it serves: the client listener the client
    // API and the inference protocol; the admin listener the admin API and
    // the inference protocol's load and unload.
    let services = async |addr: &str| {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("uri")
            .connect()
            .await
            .expect("connects");
        let mut reflection = ServerReflectionClient::new(channel);
        let ask = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut replies =
            reflection.server_reflection_info(tokio_stream::iter([ask])).await.expect("reflection").into_inner();
        let reply = replies.message().await.expect("reply").expect("one reply");
        let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
            panic!("unexpected {reply:?}")
        };
        let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
        names.sort();
        names
    };
    let common = ["grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "inference.GRPCInferenceService"];
    assert_eq!(services(&server.addr).await, [&common[..], &["pacpriv.v1.Privatizer"]].concat());
    assert_eq!(services(&server.listener("admin")).await, [&common[..], &["pacpriv.v1.Admin"]].concat());

    let logs = server.logs();
    let lines: Vec<serde_json::Value> =
        logs.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    let answered = lines
        .iter()
        .find(|l| l["fields"]["message"] == "answered")
        .unwrap_or_else(|| panic!("no answered event in {logs}"));
    assert_eq!(answered["span"]["principal"], "alice");
    assert_eq!(answered["span"]["query_id"], "logged-query");
}

/// Issue 10: the same query N times is one release — the identical answer,
/// one charge, one journaled step — whatever its encoding, in a pipelined
/// stream, and after a restart.
#[tokio::test(flavor = "multi_thread")]
async fn a_repeated_query_costs_nothing_and_moves_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("state.redb");
    let env = small_demo(&[
        ("PACPRIV__PRIVACY__RELEASE_NOISY_VECTOR", "true".into()),
        ("PACPRIV__STORE__PATH", store.display().to_string()),
        ("PACPRIV__STORE__JOURNAL", "true".into()),
    ]);
    let mut server = Process::serve(None, &env);
    let mut c = client(&server.addr).await;
    let ask = |id: &str, pixels: &[f32]| PredictRequest {
        return_noisy: true,
        confidence_alpha: Some(0.05),
        ..image(id, pixels)
    };
    // A contested query: the one whose noise an attacker would average.
    let (mut first, mut pixels) = (None, Vec::new());
    for i in 0..40 {
        let r = predict(&mut c, "alice-key", ask(&format!("try{i}"), &digit(i))).await.expect("answered");
        if !r.unanimous {
            (first, pixels) = (Some(r), digit(i));
            break;
        }
    }
    let first = first.expect("a contested query among 40");
    let spent = budget(&mut c, "alice-key").await;
    let same = |r: &pacpriv_service::proto::pacpriv::PredictResponse| {
        assert!(r.cached && r.mi_charged == 0.0, "{r:?}");
        assert_eq!((r.label, r.unanimous, r.confident, &r.noisy), (first.label, false, first.confident, &first.noisy));
    };
    for n in 0..10 {
        same(&predict(&mut c, "alice-key", ask(&format!("again{n}"), &pixels)).await.expect("answered"));
    }
    // Another encoding of the same values: FP64 raw bytes, shape [1, 64].
    let raw: Vec<u8> = pixels.iter().flat_map(|&v| f64::from(v).to_le_bytes()).collect();
    let fp64 = PredictRequest {
        input: Some(pacpriv_service::proto::pacpriv::Tensor {
            datatype: "FP64".into(),
            shape: vec![1, 64],
            raw_contents: raw,
            ..Default::default()
        }),
        ..ask("fp64", &pixels)
    };
    same(&predict(&mut c, "alice-key", fp64).await.expect("answered"));
    let after = budget(&mut c, "alice-key").await;
    assert_eq!((after.answered, after.spent), (spent.answered, spent.spent), "11 repeats, nothing charged");
    // A stream asking a new query twice back to back: the second is the
    // first's answer, though both were in flight together.
    let fresh = digit(100);
    let reqs = vec![ask("s1", &fresh), ask("s2", &fresh)];
    let mut responses =
        c.predict_stream(with_key(tokio_stream::iter(reqs), "alice-key")).await.expect("stream opens").into_inner();
    let s1 = responses.message().await.expect("s1").expect("s1");
    let s2 = responses.message().await.expect("s2").expect("s2");
    assert!(!s1.cached && s2.cached && s2.mi_charged == 0.0 && (s1.label, &s1.noisy) == (s2.label, &s2.noisy));
    let metrics = crate::util::scrape(&server.listener("metrics"));
    assert_eq!(crate::util::sample(&metrics, "pacpriv_answer_cache_hits_total"), Some(12.0), "{metrics}");

    // After a restart the cache is still there.
    server.kill();
    let server = Process::serve(None, &env);
    let mut c = client(&server.addr).await;
    same(&predict(&mut c, "alice-key", ask("after-restart", &pixels)).await.expect("answered"));
    assert_eq!(budget(&mut c, "alice-key").await.answered, spent.answered + 1, "only the stream's s1 was new");
    drop((c, server));

    // One journaled step per fresh answer; no repeat ever reached the posterior.
    let journal = pacpriv_store::EmbeddedStore::open(&store).expect("store").journal("alice").expect("journal");
    let ids: Vec<&str> = journal.iter().map(|j| j.query_id.as_str()).collect();
    assert_eq!(journal.len() as u64, spent.answered + 1, "{ids:?}");
    assert!(ids.iter().all(|id| id.starts_with("try") || *id == "s1"), "{ids:?}");
}
