//! Issue 54: several models over the same data. `[models.ridge]` is a
//! second demo ensemble on the same 16 subsets (the same seed, a stronger
//! L2 penalty): its answers and the default model's step one session —
//! one posterior, one ledger — per principal. `[datasets.other]` is
//! another secret space (the demo data split by another seed), whose
//! sessions are its own.

use crate::util::{
    ADMIN_TOKEN, B, Process, bearer, budget, client, curl, digit, image, key_hash, predict, refusal, replay, request,
    small_demo, with_key,
};
use pacpriv_service::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use pacpriv_service::proto::inference::model_repository_parameter::ParameterChoice;
use pacpriv_service::proto::inference::{
    ModelMetadataRequest, ModelReadyRequest, ModelRepositoryParameter, RepositoryIndexRequest,
    RepositoryModelUnloadRequest,
};
use pacpriv_service::proto::pacpriv::{GetBudgetRequest, PredictRequest, PredictResponse};
use pacpriv_store::EmbeddedStore;
use tonic::Code;

const M: usize = 16;

fn two_models(store: &std::path::Path) -> Vec<(&'static str, String)> {
    small_demo(&[
        ("PACPRIV__MODELS__RIDGE__DEMO__REGULARISATION", "1".to_owned()),
        ("PACPRIV__STORE__JOURNAL", "true".to_owned()),
        ("PACPRIV__STORE__PATH", store.display().to_string()),
        ("PACPRIV__PRINCIPALS__CAROL__KEY_SHA256", key_hash("carol-key")),
        ("PACPRIV__PRINCIPALS__CAROL__BUDGET_MI", format!("{}", 3.0 * B)),
    ])
}

fn of(model: &str, id: &str, seed: u32) -> PredictRequest {
    PredictRequest { model: model.to_owned(), ..image(id, &digit(seed)) }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_models_of_one_dataset_step_one_session_and_drain_one_budget() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("state.redb");
    let mut server = Process::serve(None, &two_models(&store));
    let mut c = client(&server.addr).await;

    // Alternating models: every fresh question to either is charged b to
    // the same account; a repeat is a repeat of the same model's question
    // only (the cache keys the model too).
    let mut charges = Vec::new();
    for (k, (model, seed)) in [("", 3), ("ridge", 3), ("private", 8), ("ridge", 5), ("", 5)].into_iter().enumerate() {
        let r = predict(&mut c, "alice-key", of(model, &format!("q{k}"), seed)).await.expect("answered");
        assert!(!r.cached, "{model:?} on digit {seed} is that model's first answer to it");
        charges.push(r.mi_charged);
    }
    assert_eq!(charges, [B; 5], "every model's answer costs b (policy paper)");
    for (model, seed) in [("ridge", 3), ("private", 3), ("", 8)] {
        let r = predict(&mut c, "alice-key", of(model, "again", seed)).await.expect("answered");
        assert!(r.cached && r.mi_charged == 0.0, "{model:?} asked digit {seed} again: from the cache, free");
    }
    let account = budget(&mut c, "alice-key").await;
    assert_eq!(
        (account.answered, account.spent),
        (5, 5.0 * B),
        "one account for both models (cache hits are not steps)"
    );

    // An unknown model is refused before anything is asked or charged.
    let e = predict(&mut c, "alice-key", of("nope", "x", 9)).await.expect_err("no such model");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("\"private\"") && e.message().contains("\"ridge\""), "{}", e.message());
    assert_eq!(budget(&mut c, "alice-key").await.spent, 5.0 * B, "nothing charged");

    // Carol's budget buys three answers, whichever models give them.
    for (k, model) in ["ridge", "", "ridge"].into_iter().enumerate() {
        predict(&mut c, "carol-key", of(model, &format!("c{k}"), 20 + k as u32)).await.expect("within budget");
    }
    for model in ["", "ridge"] {
        let e = predict(&mut c, "carol-key", of(model, "c-over", 30)).await.expect_err("spent");
        assert_eq!(e.code(), Code::ResourceExhausted, "{model:?}: {e:?}");
    }

    // Both models on the Open Inference Protocol, gRPC and HTTP.
    let mut oip = GrpcInferenceServiceClient::connect(format!("http://{}", server.addr)).await.expect("OIP client");
    for name in ["private", "ridge"] {
        let meta = oip
            .model_metadata(ModelMetadataRequest { name: name.into(), version: String::new() })
            .await
            .expect("metadata")
            .into_inner();
        assert_eq!((meta.name.as_str(), meta.versions.as_slice()), (name, ["1".to_owned()].as_slice()));
    }
    let http = format!("http://{}/v2/models/ridge/infer", server.listener("http"));
    let reply = curl("POST", &http, &["x-api-key: alice-key"], Some(&request(&[digit(40)], &["label"])));
    assert_eq!(reply.code, 200, "{:?}", reply.body);
    assert_eq!(reply.body["model_name"], "ridge", "{:?}", reply.body);
    assert_eq!(budget(&mut c, "alice-key").await.spent, 6.0 * B);

    // The session's posterior is exactly its journal replayed, steps of
    // both models in the order they were taken.
    server.kill();
    each_posterior_is_its_journal_replayed(&store, &[("alice", 6), ("carol", 3)]);
}

/// Two datasets: carol's budget spent in one leaves the other answering,
/// each account its own (GetBudget by dataset) with its own limit (her
/// `dataset_budget_mi.other`), each session its own record and journal
/// under its own key, kept across a restart. An admin-created principal
/// gets its own budget per dataset too, and one for an unknown dataset is
/// refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_spent_dataset_leaves_another_answering() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("state.redb");
    let mut env = two_models(&store);
    env.extend([
        ("PACPRIV__DATASETS__OTHER__POLICY", "paper".to_owned()),
        ("PACPRIV__MODELS__SPLIT7__DATASET", "other".to_owned()),
        ("PACPRIV__MODELS__SPLIT7__DEMO__SEED", "7".to_owned()),
        ("PACPRIV__PRINCIPALS__CAROL__DATASET_BUDGET_MI__OTHER", format!("{}", 4.0 * B)),
        ("PACPRIV__ADMIN__KEY_SHA256", key_hash(ADMIN_TOKEN)),
    ]);
    let mut server = Process::serve(None, &env);
    let mut c = client(&server.addr).await;
    let of_dataset = |dataset: &str| GetBudgetRequest { dataset: dataset.to_owned(), ..Default::default() };

    for (k, model) in ["ridge", "", "ridge"].into_iter().enumerate() {
        predict(&mut c, "carol-key", of(model, &format!("c{k}"), 20 + k as u32)).await.expect("within budget");
    }
    let e = predict(&mut c, "carol-key", of("", "c-over", 30)).await.expect_err("spent in the default dataset");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    for k in 0..2 {
        let r = predict(&mut c, "carol-key", of("split7", &format!("o{k}"), 30 + k)).await.expect("the other answers");
        assert_eq!(r.budget.as_ref().map(|b| (b.dataset.as_str(), b.answered)), Some(("other", k as u64 + 1)));
    }
    let other = c.get_budget(with_key(of_dataset("other"), "carol-key")).await.expect("GetBudget").into_inner();
    assert_eq!((other.dataset.as_str(), other.answered, other.spent, other.limit), ("other", 2, 2.0 * B, 4.0 * B));
    // A client may name the model instead: its answers' account.
    let of_model = GetBudgetRequest { model: "split7".into(), ..Default::default() };
    let by_model = c.get_budget(with_key(of_model, "carol-key")).await.expect("GetBudget").into_inner();
    assert_eq!((by_model.dataset.as_str(), by_model.answered), ("other", 2));
    let both = GetBudgetRequest { model: "split7".into(), dataset: "default".into() };
    let e = c.get_budget(with_key(both, "carol-key")).await.expect_err("a model of another dataset");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let default = budget(&mut c, "carol-key").await;
    assert_eq!(
        (default.dataset.as_str(), default.answered, default.spent, default.limit),
        ("default", 3, 3.0 * B, 3.0 * B)
    );
    let e = c.get_budget(with_key(of_dataset("nope"), "carol-key")).await.expect_err("no such dataset");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("\"default\"") && e.message().contains("\"other\""), "{}", e.message());

    // A restart keeps each dataset's secret and sessions.
    server.kill();
    let mut server = Process::serve(None, &env);
    let mut c = client(&server.addr).await;
    let other = c.get_budget(with_key(of_dataset("other"), "carol-key")).await.expect("GetBudget").into_inner();
    assert_eq!((other.answered, other.spent), (2, 2.0 * B));
    for k in 2..4 {
        predict(&mut c, "carol-key", of("split7", &format!("o{k}"), 40 + k)).await.expect("the other still answers");
    }
    let e = predict(&mut c, "carol-key", of("split7", "o-over", 50)).await.expect_err("her limit in the other");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");

    // `pacpriv admin create --dataset-budget-mi`: a limit of its own in
    // the other dataset; the default dataset, or one the server does not
    // have, is refused, naming it.
    let created = server.admin_cli(&["create", "dan", "--budget-mi", "2^-6", "--dataset-budget-mi", "other=0"]);
    let out = String::from_utf8_lossy(&created.stdout);
    assert!(created.status.success(), "{out}{}", String::from_utf8_lossy(&created.stderr));
    let dan_key = out.lines().find_map(|l| l.strip_prefix("api_key=")).expect("the key is printed").to_owned();
    let e = predict(&mut c, &dan_key, of("split7", "d0", 60)).await.expect_err("a zero limit in the other");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    predict(&mut c, &dan_key, of("", "d1", 61)).await.expect("the default dataset: his budget_mi");
    for (dataset, refused) in [("default", "other than the default one"), ("nope", "nope")] {
        let arg = format!("{dataset}=1");
        let o = server.admin_cli(&["create", "eve", "--budget-mi", "1", "--dataset-budget-mi", &arg]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(refused) && err.contains("this server has"), "{dataset}: {err}");
    }
    server.kill();

    each_posterior_is_its_journal_replayed(&store, &[("carol", 3), ("other/carol", 4), ("dan", 1)]);
}

/// Versions: `[versions.private.2]` is the default model retrained on
/// the same 16 subsets. A request naming no version gets the newest ready
/// one; both versions step one session; unloading a version (the admin
/// listener only, with the admin token) refuses its new requests before
/// anything is charged, and loading it back serves it again.
#[tokio::test(flavor = "multi_thread")]
async fn versions_step_one_session_and_unload_without_a_charge() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = dir.path().join("state.redb");
    let env = small_demo(&[
        ("PACPRIV__VERSIONS__PRIVATE__2__DEMO__REGULARISATION", "1".to_owned()),
        ("PACPRIV__ADMIN__KEY_SHA256", key_hash(ADMIN_TOKEN)),
        ("PACPRIV__STORE__JOURNAL", "true".to_owned()),
        ("PACPRIV__STORE__PATH", store.display().to_string()),
    ]);
    let mut server = Process::serve(None, &env);
    let mut c = client(&server.addr).await;
    let versioned = |version: &str, id: &str, seed: u32| PredictRequest {
        model_version: version.to_owned(),
        ..image(id, &digit(seed))
    };
    let answered_by = |r: &PredictResponse| (r.model.clone(), r.model_version.clone());

    // The newest ready version answers a request naming none; version 1
    // when named; one account, and each version's own cache entry.
    let r = predict(&mut c, "alice-key", versioned("", "q1", 3)).await.expect("answered");
    assert_eq!((answered_by(&r), r.mi_charged), (("private".into(), "2".into()), B));
    let r = predict(&mut c, "alice-key", versioned("1", "q2", 3)).await.expect("answered");
    assert_eq!((answered_by(&r), r.cached, r.mi_charged), (("private".into(), "1".into()), false, B));
    let r = predict(&mut c, "alice-key", versioned("", "q1b", 7)).await.expect("answered");
    assert_eq!(answered_by(&r), ("private".into(), "2".into()));
    assert_eq!(budget(&mut c, "alice-key").await.spent, 3.0 * B, "one account for both versions");
    let mut oip = GrpcInferenceServiceClient::connect(format!("http://{}", server.addr)).await.expect("OIP client");
    let meta = oip.model_metadata(ModelMetadataRequest { name: "private".into(), version: String::new() }).await;
    assert_eq!(meta.expect("metadata").into_inner().versions, ["1", "2"]);

    // Load and unload are not the client listener's, nor anyone's without
    // the admin token.
    let unload = |version: &str| RepositoryModelUnloadRequest {
        model_name: "private".into(),
        parameters: [(
            "version".to_owned(),
            ModelRepositoryParameter { parameter_choice: Some(ParameterChoice::StringParam(version.to_owned())) },
        )]
        .into(),
        ..Default::default()
    };
    let e = oip.repository_model_unload(unload("2")).await.expect_err("not on the client listener");
    assert_eq!(e.code(), Code::Unimplemented, "{e:?}");
    let rest = format!("http://{}/v2/repository/models/private/unload", server.listener("http"));
    assert_eq!(curl("POST", &rest, &["authorization: Bearer alice-key"], Some("{}")).code, 403);
    let admin_addr = format!("http://{}", server.listener("admin"));
    let mut repository = GrpcInferenceServiceClient::connect(admin_addr).await.expect("admin listener");
    let e = repository.repository_model_unload(bearer(unload("2"), "alice-key")).await.expect_err("no admin token");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let e = repository.repository_model_unload(bearer(unload("9"), ADMIN_TOKEN)).await.expect_err("no version 9");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");

    // Unloaded: refused before anything is asked or charged; the index
    // says why; a request naming no version gets version 1.
    repository.repository_model_unload(bearer(unload("2"), ADMIN_TOKEN)).await.expect("unloaded");
    let e = predict(&mut c, "alice-key", versioned("2", "q3", 4)).await.expect_err("unloaded");
    assert_eq!(refusal(&e), (Code::Unavailable, "MODEL_UNLOADED".into(), Some("false".into())), "{e:?}");
    assert!(e.message().contains("pacpriv admin load private"), "{}", e.message());
    assert_eq!(budget(&mut c, "alice-key").await.spent, 3.0 * B, "nothing charged");
    // What version 2 answered it still gives again, free (a retry, a
    // repeat): named, or as the version that answered a request naming
    // none — no teacher is asked.
    for (version, seed) in [("2", 3), ("", 7)] {
        let r = predict(&mut c, "alice-key", versioned(version, "again", seed)).await.expect("from the cache");
        assert_eq!((answered_by(&r), r.cached, r.mi_charged), (("private".into(), "2".into()), true, 0.0));
    }
    let index = oip.repository_index(RepositoryIndexRequest::default()).await.expect("index").into_inner().models;
    let state = |v: &str| {
        index.iter().find(|m| m.name == "private" && m.version == v).map(|m| (m.state.clone(), m.reason.clone()))
    };
    assert_eq!(state("2"), Some(("UNAVAILABLE".into(), "unloaded".into())));
    assert_eq!(state("1"), Some(("READY".into(), String::new())));
    let ready = oip.model_ready(ModelReadyRequest { name: "private".into(), version: "2".into() }).await;
    assert!(!ready.expect("readiness").into_inner().ready);
    let r = predict(&mut c, "alice-key", versioned("", "q4", 4)).await.expect("version 1 answers");
    assert_eq!(answered_by(&r), ("private".into(), "1".into()));

    // `pacpriv admin load` serves it again; `admin models` lists it.
    let loaded = server.admin_cli(&["load", "private", "--version", "2"]);
    assert!(loaded.status.success(), "{}", String::from_utf8_lossy(&loaded.stderr));
    let listed = server.admin_cli(&["models"]);
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(listed.contains("private\tversion=2\tstate=READY"), "{listed}");
    let r = predict(&mut c, "alice-key", versioned("", "q5", 5)).await.expect("answered");
    assert_eq!(answered_by(&r), ("private".into(), "2".into()));
    let http = format!("http://{}/v2/models/private/versions/1/infer", server.listener("http"));
    let reply = curl("POST", &http, &["x-api-key: alice-key"], Some(&request(&[digit(6)], &["label"])));
    assert_eq!((reply.code, &reply.body["model_version"]), (200, &serde_json::json!("1")), "{:?}", reply.body);

    // Every answer counted by the version that gave it.
    let metrics = crate::util::scrape(&server.listener("metrics"));
    let answers = |v: &str| {
        crate::util::sample(&metrics, &format!("pacpriv_model_answers_total{{model=\"private\",version=\"{v}\"}}"))
    };
    assert_eq!((answers("1"), answers("2")), (Some(3.0), Some(5.0)), "{metrics}");

    // Six answers of two versions, one session: its posterior is its
    // journal replayed.
    assert_eq!(budget(&mut c, "alice-key").await.spent, 6.0 * B);
    server.kill();
    each_posterior_is_its_journal_replayed(&store, &[("alice", 6)]);
}

/// Each of `sessions` (store key, charged steps) in the embedded store at
/// `path` has one journal entry per charged answer of its dataset's
/// models, and its posterior is exactly that journal replayed.
fn each_posterior_is_its_journal_replayed(path: &std::path::Path, sessions: &[(&str, usize)]) {
    let store = EmbeddedStore::open(path).expect("store opens");
    for &(session, steps) in sessions {
        let record = store.load(session).expect("readable").expect("answered");
        let journal = store.journal(session).expect("journal");
        assert_eq!(journal.len(), steps, "{session}: one entry per charged answer of its dataset's models");
        assert_eq!(replay(M, &journal), record.posterior, "{session}: posterior = its journal replayed");
    }
}

#[test]
fn a_model_of_other_data_is_refused_at_start_naming_the_key() {
    for (key, value, names) in [
        ("PACPRIV__MODELS__RIDGE__DEMO__MODELS", "8", "models.ridge.demo.models"),
        ("PACPRIV__MODELS__RIDGE__DEMO__SEED", "7", "models.ridge.demo"),
        ("PACPRIV__MODELS__PRIVATE__DEMO__REGULARISATION", "1", "models.private"),
    ] {
        let env = small_demo(&[(key, value.to_owned())]);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_pacpriv"))
            .args(["serve", "--check"])
            .envs(env)
            .output()
            .expect("pacpriv runs");
        let said = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(64), "{key}={value}: {said}");
        assert!(said.contains(names), "{key}={value} should name {names}: {said}");
    }
}

/// One model's teachers down: that model is UNAVAILABLE (index,
/// ModelReady, its queries refused with nothing charged) while the server
/// stays ready and the default model answers.
#[tokio::test(flavor = "multi_thread")]
async fn one_models_teachers_down_leaves_the_others_serving() {
    use pacpriv_service::proto::inference::{ModelReadyRequest, RepositoryIndexRequest, ServerReadyRequest};
    let dir = tempfile::tempdir().expect("temp dir");
    let (default_cfg, other_cfg, cfg) =
        (dir.path().join("default.toml"), dir.path().join("other.toml"), dir.path().join("serve.toml"));
    let _default_teachers = Process::teachers(8, 7, &default_cfg);
    let mut other_teachers = Process::teachers(8, 7, &other_cfg);
    // The same teachers served twice: another endpoint, so another model.
    let other = std::fs::read_to_string(&other_cfg).expect("other teachers' config");
    let other = other.replace("[teachers]", "[models.other.teachers]");
    std::fs::write(&cfg, std::fs::read_to_string(&default_cfg).expect("default teachers' config") + "\n" + &other)
        .expect("config written");
    let server = Process::serve(Some(&cfg), &small_demo(&[("PACPRIV__TEACHERS__HEALTH_INTERVAL_MS", "100".into())]));
    let mut c = client(&server.addr).await;
    predict(&mut c, "alice-key", of("other", "o1", 1)).await.expect("the other model answers");

    other_teachers.kill();
    let mut oip = GrpcInferenceServiceClient::connect(format!("http://{}", server.addr)).await.expect("OIP client");
    let mut states = Vec::new();
    for _ in 0..100 {
        let index = oip.repository_index(RepositoryIndexRequest::default()).await.expect("index").into_inner();
        states = index.models.into_iter().map(|m| (m.name, m.state)).collect();
        if states.iter().any(|(_, state)| state == "UNAVAILABLE") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(states, [("private".to_owned(), "READY".to_owned()), ("other".to_owned(), "UNAVAILABLE".to_owned())]);
    assert!(oip.server_ready(ServerReadyRequest {}).await.expect("ServerReady").into_inner().ready);
    let ready = |name: &str| ModelReadyRequest { name: name.into(), version: String::new() };
    assert!(oip.model_ready(ready("private")).await.expect("ModelReady").into_inner().ready);
    assert!(!oip.model_ready(ready("other")).await.expect("ModelReady").into_inner().ready);

    let spent = budget(&mut c, "alice-key").await.spent;
    let e = predict(&mut c, "alice-key", of("other", "o2", 2)).await.expect_err("its teachers are gone");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert_eq!(budget(&mut c, "alice-key").await.spent, spent, "nothing charged");
    predict(&mut c, "alice-key", of("", "d1", 3)).await.expect("the default model still answers");
}
