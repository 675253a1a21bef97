//! pacpriv between real third-party inference software (issue 8), from
//! `tests/interop_venv.sh`'s venv (PyPI: Seldon MLServer + scikit-learn
//! runtime, NVIDIA tritonclient):
//!
//! - behind: m teachers trained by `examples/mlserver/teachers.py` on the
//!   subsets `pacpriv subsets` wrote, served by one MLServer process; pacpriv
//!   fans out to them over the Open Inference Protocol;
//! - in front: an unchanged tritonclient program (`tests/triton_client.py`)
//!   calls pacpriv's private model over the same protocol.

use crate::util::{ADMIN_TOKEN, key_hash, sample, scrape, small_demo};
use crate::util::{B, Peer, Process, budget, client, digit, free_port, image, interop_python, pacpriv_ok, predict};
use pacpriv_service::proto::inference::ModelReadyRequest;
use pacpriv_service::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use pacpriv_service::proto::pacpriv::PredictResponse;
use pacpriv_service::server::inference::metadata;
use serde_json::Value;
use std::time::{Duration, Instant};
use tonic::Code;

const TEACHERS: usize = 8;

/// Waits (at most 180 s) until MLServer at `port` reports every teacher
/// model ready.
async fn wait_ready(mlserver: &mut Peer, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        assert!(!mlserver.exited(), "MLServer exited:\n{}", mlserver.logs());
        assert!(Instant::now() < deadline, "MLServer not ready after 180 s:\n{}", mlserver.logs());
        if let Ok(mut c) = GrpcInferenceServiceClient::connect(format!("http://127.0.0.1:{port}")).await {
            let mut ready = 0;
            for i in 0..TEACHERS {
                let request = ModelReadyRequest { name: format!("teacher-{i}"), version: "1".into() };
                ready += usize::from(c.model_ready(request).await.is_ok_and(|r| r.into_inner().ready));
            }
            if ready == TEACHERS {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn mlserver_teachers_answer_private_predictions() {
    let python = interop_python();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = |name: &str| dir.path().join(name).display().to_string();
    let m = TEACHERS.to_string();
    pacpriv_ok(&["subsets", "--n", "1500", "--m", &m, "--seed", "7", "--out", &path("subsets.json")]);
    let port = free_port();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/mlserver/teachers.py");
    let (grpc, http, metrics) = (port.to_string(), free_port().to_string(), free_port().to_string());
    let mut mlserver = Peer::start(
        &python,
        &[
            script,
            "--subsets",
            &path("subsets.json"),
            "--repository",
            &path("repository"),
            "--grpc-port",
            &grpc,
            "--http-port",
            &http,
            "--metrics-port",
            &metrics,
            "--config",
            &path("teachers.toml"),
            "--holdout",
            &path("holdout.json"),
        ],
    );
    wait_ready(&mut mlserver, port).await;

    let config = std::path::PathBuf::from(path("teachers.toml"));
    // A wide batching window, so that concurrent queries reach MLServer as
    // one [n, 64] input per model.
    let server = Process::serve(Some(&config), &small_demo(&[("PACPRIV__TEACHERS__BATCH_WINDOW_MS", "100".into())]));
    let holdout: Value =
        serde_json::from_str(&std::fs::read_to_string(path("holdout.json")).expect("holdout written")).expect("JSON");
    let features = holdout["features"].as_array().expect("features");
    let teacher_labels = holdout["teacher_labels"].as_array().expect("teacher labels");
    let row = |k: usize| -> (Vec<f32>, Vec<u64>) {
        let pixels = features[k].as_array().expect("row").iter().map(|v| v.as_f64().expect("number") as f32);
        let votes = teacher_labels[k].as_array().expect("votes").iter().filter_map(Value::as_u64);
        (pixels.collect(), votes.collect())
    };
    // What MLServer's models said, read back through our client, is exactly
    // what scikit-learn predicted in the script.
    let check = |k: usize, votes: &[u64], a: &PredictResponse| {
        assert!(votes.contains(&u64::from(a.label)), "row {k}: label {} is no teacher's vote {votes:?}", a.label);
        let all_agree = votes.iter().all(|&v| v == votes[0]);
        assert_eq!(a.unanimous, all_agree, "row {k}: votes {votes:?}");
        if all_agree {
            assert_eq!(u64::from(a.label), votes[0], "row {k}: unanimous teachers give their answer");
        }
        usize::from(all_agree)
    };
    let mut c = client(&server.addr).await;
    let sequential = 12;
    let mut unanimous = 0;
    for k in 0..sequential {
        let (pixels, votes) = row(k);
        let a = predict(&mut c, "alice-key", image(&format!("h{k}"), &pixels)).await.expect("answered");
        unanimous += check(k, &votes, &a);
    }
    // Concurrent queries: each row gets its own teachers' votes back out of
    // the batched replies.
    let concurrent = 16;
    let mut tasks = tokio::task::JoinSet::new();
    for k in sequential..sequential + concurrent {
        let (pixels, votes) = row(k);
        let mut c = c.clone();
        tasks.spawn(async move { (k, votes, predict(&mut c, "alice-key", image(&format!("h{k}"), &pixels)).await) });
    }
    for (k, votes, answer) in tasks.join_all().await {
        unanimous += check(k, &votes, &answer.expect("answered"));
    }
    let queries = sequential + concurrent;
    assert!(unanimous > 0, "the held-out rows include unanimous ones");
    let account = budget(&mut c, "alice-key").await;
    assert_eq!(account.answered, queries as u64);
    assert_eq!(account.spent, queries as f64 * B, "the paper policy charges b per answer");
    // Every MLServer model was called once per sequential query and fewer
    // times than there were concurrent ones: batches of [n, 64].
    let scraped = scrape(&server.listener("metrics"));
    for i in 0..TEACHERS {
        let prefix = format!(
            r#"pacpriv_teacher_call_duration_seconds_count{{model="private",version="1",teacher="teacher-{i}"}}"#
        );
        let calls = scraped.lines().find(|l| l.starts_with(&prefix)).and_then(|l| l.rsplit(' ').next()?.parse().ok());
        assert!(calls.is_some_and(|n: f64| n > sequential as f64 && n < queries as f64), "teacher-{i}:\n{scraped}");
    }
    assert_eq!(sample(&scraped, "pacpriv_teacher_batch_size_sum"), Some(queries as f64));

    // Vector mode on the same models: their `predict_proba` scores ([n, 10]
    // FP64 from MLServer) are privatised instead of their labels.
    let scores = Process::serve(
        Some(&config),
        &small_demo(&[
            ("PACPRIV__MODEL__MODE", "vector".into()),
            ("PACPRIV__TEACHERS__OUTPUT_NAME", "predict_proba".into()),
        ]),
    );
    let mut v = client(&scores.addr).await;
    for k in 0..3 {
        let a = predict(&mut v, "alice-key", image(&format!("v{k}"), &row(k).0)).await.expect("answered");
        assert!(a.label < 10 && !a.unanimous, "row {k}: {a:?}");
    }
    assert_eq!(budget(&mut v, "alice-key").await.answered, 3);

    // MLServer gone: the query is refused as retryable and costs nothing.
    mlserver.kill();
    let refused = predict(&mut c, "alice-key", image("down", &digit(1))).await.expect_err("teachers are down");
    assert_eq!(refused.code(), Code::Unavailable, "{}", refused.message());
    assert_eq!(budget(&mut c, "alice-key").await.spent, account.spent, "nothing charged");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unchanged_tritonclient_grpc_program_gets_private_labels_one_by_one_and_in_batches() {
    tritonclient_program("grpc");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unchanged_tritonclient_http_program_gets_private_labels_one_by_one_and_in_batches() {
    tritonclient_program("http");
}

/// `tests/triton_client.py` over `protocol` ("grpc" or "http") against a
/// demo deployment that releases noisy vectors; asserts on its report.
fn tritonclient_program(protocol: &str) {
    let python = interop_python();
    let server = Process::serve(
        None,
        &small_demo(&[
            ("PACPRIV__PRIVACY__RELEASE_NOISY_VECTOR", "true".into()),
            ("PACPRIV__PRIVACY__POLICY", "paper".into()),
            ("PACPRIV__PRINCIPALS__SMALL__KEY_SHA256", key_hash("small-key")),
            ("PACPRIV__PRINCIPALS__SMALL__BUDGET_MI", format!("{}", 3.0 * B)),
            ("PACPRIV__MODELS__RIDGE__DEMO__REGULARISATION", "1".into()),
            ("PACPRIV__ADMIN__KEY_SHA256", key_hash(ADMIN_TOKEN)),
        ]),
    );
    let admin = server.listener("admin");
    let addr = if protocol == "grpc" { server.addr.clone() } else { server.listener("http") };
    let dir = tempfile::tempdir().expect("temp dir");
    let images_path = dir.path().join("images.json");
    let images: Vec<Vec<f32>> = (0..18).map(digit).collect();
    std::fs::write(&images_path, serde_json::to_string(&images).expect("JSON")).expect("images written");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/triton_client.py");
    let out = std::process::Command::new(&python)
        .args([
            script,
            protocol,
            &addr,
            "alice-key",
            "private",
            &images_path.display().to_string(),
            "small-key",
            "ridge",
            &admin,
            ADMIN_TOKEN,
        ])
        .output()
        .expect("python runs");
    assert!(out.status.success(), "tritonclient program failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");

    assert_eq!(report["live"], true);
    assert_eq!(report["ready"], true);
    assert_eq!(report["model_ready"], true);
    assert_eq!(report["other_model_ready"], false);
    let meta = &report["metadata"];
    let shape: Vec<i64> = meta["inputs"][0]["shape"]
        .as_array()
        .expect("a shape")
        .iter()
        .map(|d| d.as_i64().or_else(|| d.as_str().and_then(|s| s.parse().ok())).expect("a dimension"))
        .collect();
    assert_eq!(meta["inputs"][0]["datatype"], "FP32");
    assert_eq!(shape, [-1, 64], "a batch dimension, then the example");
    let outputs: Vec<&str> =
        meta["outputs"].as_array().expect("outputs").iter().filter_map(|o| o["name"].as_str()).collect();
    assert_eq!(outputs, ["label", "mi_charged", "noisy"]);

    let answers = report["answers"].as_array().expect("answers");
    assert_eq!(answers.len(), 5);
    let mut charged = 0.0;
    for (k, a) in answers.iter().enumerate() {
        assert_eq!(a["id"], format!("img-{k}"), "the request id is echoed");
        let label = a["label"][0].as_u64().expect("an INT64 label");
        assert!(label < 10);
        let noisy: Vec<f64> = a["noisy"][0].as_array().expect("noisy").iter().filter_map(Value::as_f64).collect();
        assert_eq!(a["shapes"]["noisy"], serde_json::json!([1, 10]));
        assert_eq!(noisy.len(), 10);
        let argmax = (0..10).max_by(|&i, &j| noisy[i].total_cmp(&noisy[j])).expect("ten classes");
        assert_eq!(argmax as u64, label, "the label is the argmax of the published release");
        let p = &a["parameters"];
        assert_eq!(p["principal"], "alice");
        assert!(p["confident"].is_boolean() && p["unanimous"].is_boolean(), "{p}");
        charged += p["mi_charged"].as_f64().expect("mi_charged");
        assert_eq!(p["budget_spent"].as_f64(), Some(charged), "the account after each answer");
        assert_eq!(p["budget_answered"].as_i64(), Some(k as i64 + 1));
        assert_eq!(p["budget_limit"].as_f64(), Some(1.0));
    }
    assert_eq!(charged, 5.0 * B);
    // The first image again (label only) is the session's cached answer:
    // the same label, charged nothing.
    let again = &report["label_only"];
    assert_eq!(again["outputs"], serde_json::json!(["label"]));
    assert_eq!(again["label"], answers[0]["label"]);
    let p = &again["parameters"];
    assert_eq!((p["cached"].as_bool(), p["mi_charged"].as_f64()), (Some(true), Some(0.0)));

    // Eight rows in one request: rows 0 and 1 were answered above (cached,
    // free, the same labels), rows 2, 3, 4, 6, 7 are new (b each), row 5
    // repeats row 2 (its answer, free). One account update for the lot.
    let batch = &report["batch"];
    assert_eq!(batch["shapes"]["label"], serde_json::json!([8]));
    assert_eq!(batch["shapes"]["noisy"], serde_json::json!([8, 10]));
    let charges: Vec<f64> = batch["mi_charged"].as_array().expect("charges").iter().filter_map(Value::as_f64).collect();
    assert_eq!(charges, [0.0, 0.0, B, B, B, 0.0, B, B]);
    let labels = batch["label"].as_array().expect("labels");
    assert_eq!((&labels[0], &labels[1]), (&answers[0]["label"][0], &answers[1]["label"][0]));
    assert_eq!(labels[5], labels[2], "a row repeated in the batch gets the same answer");
    let p = &batch["parameters"];
    assert_eq!(p["mi_charged"].as_f64(), Some(5.0 * B), "the request's total");
    assert_eq!(p["budget_spent"].as_f64(), Some(10.0 * B));
    assert_eq!(p["budget_answered"].as_i64(), Some(10));
    assert_eq!(p["cached"].as_bool(), Some(false), "not every row was cached");

    // A budget of 3b: eight new rows are refused whole, nothing charged;
    // three are answered.
    let refused = &report["small_refused"];
    let code = if protocol == "grpc" { "StatusCode.RESOURCE_EXHAUSTED" } else { "429" };
    assert_eq!(refused["status"], code, "{refused}");
    assert!(refused["message"].as_str().unwrap_or_default().contains("answered whole or not at all"), "{refused}");
    let paid = &report["small_paid"];
    assert_eq!(paid["mi_charged"], serde_json::json!([B, B, B]));
    assert_eq!(paid["parameters"]["budget_spent"].as_f64(), Some(3.0 * B), "only the paid batch was charged");

    // The repository index lists both models (names, versions, states:
    // nothing about any session); the second model's answer to an image
    // the first model answered is its own, charged to the same account.
    let index: Vec<(&str, &str, &str)> = report["index"]
        .as_array()
        .expect("an index")
        .iter()
        .map(|m| {
            (m["name"].as_str().unwrap_or(""), m["version"].as_str().unwrap_or(""), m["state"].as_str().unwrap_or(""))
        })
        .collect();
    assert_eq!(index, [("private", "1", "READY"), ("bayes", "1", "READY"), ("ridge", "1", "READY")]);
    let other = &report["other"];
    assert_eq!(other["mi_charged"], serde_json::json!([B]), "another model's first answer to that image: charged");
    assert_eq!(other["parameters"]["cached"].as_bool(), Some(false));
    assert_eq!(other["parameters"]["budget_spent"].as_f64(), Some(11.0 * B), "alice's one account");
    if protocol == "grpc" {
        // tritonclient's unload_model and load_model, on the admin
        // listener with the admin token only: while unloaded, the model
        // is UNAVAILABLE in the index and its queries are refused, nothing
        // charged; loaded again, it answers that query for b.
        let refused = |case: &str| report[case]["status"].as_str().unwrap_or("answered").to_owned();
        assert_eq!(refused("unload_on_client_listener"), "StatusCode.UNIMPLEMENTED");
        assert_eq!(refused("unload_without_token"), "StatusCode.UNAUTHENTICATED");
        let after = &report["after_unload"];
        assert_eq!(after["index"][0]["state"], "UNAVAILABLE", "{after}");
        assert_eq!(after["index"][0]["reason"], "unloaded", "{after}");
        assert_eq!(after["ready"], false);
        assert_eq!(after["infer"]["status"], "StatusCode.UNAVAILABLE", "{after}");
        assert_eq!(report["after_load_ready"], true);
        let answered = &report["after_load"]["parameters"]["budget_spent"];
        assert_eq!(answered.as_f64(), Some(12.0 * B), "the refused query was not charged");
    }

    let errors = &report["errors"];
    let status = |case: &str| errors[case]["status"].as_str().unwrap_or("answered").to_owned();
    let expect =
        |grpc: &str, http: &str| if protocol == "grpc" { format!("StatusCode.{grpc}") } else { http.to_owned() };

    // Triton's statistics extension through get_inference_statistics():
    // the default model's five single answers, the cached repeat, the
    // batch of eight and the three paid rows are 8 executions of 17 rows
    // (7 asked the teachers: the repeat did not), and the small principal's
    // refused batch is its one failure. Every model is listed; a model by
    // name lists its versions; a stranger is refused.
    let stats = &report["statistics"];
    assert_eq!(report["server_metadata"]["extensions"], serde_json::json!(metadata::EXTENSIONS), "{report}");
    let number = |v: &Value| v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())).unwrap_or(0);
    let names: Vec<&str> =
        stats["all"].as_array().expect("every model").iter().filter_map(|m| m["name"].as_str()).collect();
    assert_eq!(names, ["private", "bayes", "ridge"]);
    assert_eq!(stats["model"], stats["version"], "the default model has one version");
    let private = &stats["version"][0];
    assert_eq!((private["name"].as_str(), private["version"].as_str()), (Some("private"), Some("1")));
    assert_eq!((number(&private["execution_count"]), number(&private["inference_count"])), (8, 17), "{private}");
    assert!(number(&private["last_inference"]) > 0);
    let phase = |name: &str| {
        let d = &private["inference_stats"][name];
        (number(&d["count"]), number(&d["ns"]))
    };
    let counts: Vec<u64> = ["success", "fail", "queue", "compute_input", "compute_infer", "compute_output"]
        .iter()
        .map(|p| phase(p).0)
        .collect();
    assert_eq!(counts, [8, 1, 8, 7, 8, 8], "{private}");
    let within = phase("queue").1 + phase("compute_input").1 + phase("compute_infer").1 + phase("compute_output").1;
    assert!(phase("success").1 >= within, "a request's phases are within its whole: {private}");
    let bayes = &stats["all"][1];
    assert_eq!(number(&bayes["execution_count"]), 0, "a model nobody asked: {bayes}");
    assert_eq!(stats["stranger"]["status"], expect("UNAUTHENTICATED", "401"), "{stats}");
    assert_eq!(stats["unknown"]["status"], expect("NOT_FOUND", "404"), "{stats}");

    assert_eq!(status("unknown_key"), expect("UNAUTHENTICATED", "401"));
    assert_eq!(status("no_key"), expect("UNAUTHENTICATED", "401"));
    assert_eq!(status("wrong_shape"), expect("INVALID_ARGUMENT", "400"));
    assert_eq!(status("nan"), expect("INVALID_ARGUMENT", "400"));
    assert_eq!(status("unknown_model"), expect("NOT_FOUND", "404"));
    let msg = errors["unknown_model"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("\"private\"") && msg.contains("\"ridge\""), "the error names the served models: {msg}");
}
