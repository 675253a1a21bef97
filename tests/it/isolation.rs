//! Isolation between principals and the credentials that separate them:
//! one principal can neither spend, read nor reset another's budget through
//! any RPC of either listener; a revoked key stops working at once, even on
//! a stream that was already open; a client credential opens nothing on
//! the admin listener; keys are kept only as SHA-256 digests.

use crate::util::{
    ADMIN_TOKEN, B, Process, admin_client, bearer, budget, client, digit, image, key_hash, predict, small_demo,
    with_key,
};
use pacpriv_service::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use pacpriv_service::proto::inference::infer_parameter::ParameterChoice;
use pacpriv_service::proto::inference::model_infer_request::InferInputTensor;
use pacpriv_service::proto::inference::{InferParameter, InferTensorContents, ModelInferRequest};
use pacpriv_service::proto::pacpriv::{
    CreatePrincipalRequest, InspectPrincipalRequest, ListPrincipalsRequest, PredictRequest, RevokePrincipalRequest,
};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;
use tonic::Code;

#[tokio::test(flavor = "multi_thread")]
async fn principals_are_isolated_and_revocation_is_immediate() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store_path = dir.path().join("state.redb");
    let env = small_demo(&[
        ("PACPRIV__ADMIN__KEY_SHA256", key_hash(ADMIN_TOKEN)),
        ("PACPRIV__STORE__PATH", store_path.display().to_string()),
    ]);
    let mut server = Process::serve(None, &env);
    let mut admin = admin_client(&server.listener("admin")).await;
    let create = CreatePrincipalRequest { name: "bob".into(), budget_mi: "1".into(), ..Default::default() };
    let bob_key = admin.create_principal(bearer(create, ADMIN_TOKEN)).await.expect("bob created").into_inner().api_key;
    let mut c = client(&server.addr).await;

    // Alice spends through every query RPC; whatever she names in the
    // request, only her own account moves and only her own is shown.
    predict(&mut c, "alice-key", image("a1", &digit(1))).await.expect("alice answered");
    let (tx, rx) = tokio::sync::mpsc::channel::<PredictRequest>(4);
    tx.send(image("a2", &digit(2))).await.expect("queued");
    let mut stream = c
        .predict_stream(with_key(tokio_stream::wrappers::ReceiverStream::new(rx), "alice-key"))
        .await
        .expect("stream")
        .into_inner();
    assert_eq!(
        stream.message().await.expect("ok").expect("answer").budget.map(|b| b.principal).as_deref(),
        Some("alice")
    );
    drop(tx);
    let mut inference = GrpcInferenceServiceClient::connect(format!("http://{}", server.addr)).await.expect("OIP");
    let infer = ModelInferRequest {
        model_name: "private".into(),
        // Parameters that name someone else are not credentials.
        parameters: HashMap::from([(
            "principal".to_owned(),
            InferParameter { parameter_choice: Some(ParameterChoice::StringParam("bob".into())) },
        )]),
        inputs: vec![InferInputTensor {
            name: "input-0".into(),
            datatype: "FP32".into(),
            shape: vec![1, 64],
            contents: Some(InferTensorContents { fp32_contents: digit(3), ..Default::default() }),
            ..Default::default()
        }],
        ..Default::default()
    };
    inference.model_infer(with_key(infer, "alice-key")).await.expect("alice's infer answered");
    let alice = budget(&mut c, "alice-key").await;
    assert_eq!((alice.principal.as_str(), alice.answered, alice.spent), ("alice", 3, 3.0 * B));
    let bob = budget(&mut c, &bob_key).await;
    assert_eq!((bob.principal.as_str(), bob.answered, bob.spent), ("bob", 0, 0.0), "alice's queries are not bob's");

    // A client credential opens nothing on the admin listener, and the
    // client listener has no admin service (no create, no revoke, no reset).
    for key in ["alice-key", bob_key.as_str()] {
        let codes = [
            admin.list_principals(bearer(ListPrincipalsRequest {}, key)).await.map(drop),
            admin.inspect_principal(bearer(InspectPrincipalRequest { name: "bob".into() }, key)).await.map(drop),
            admin.revoke_principal(bearer(RevokePrincipalRequest { name: "bob".into() }, key)).await.map(drop),
            admin
                .create_principal(bearer(
                    CreatePrincipalRequest { name: "mallory".into(), budget_mi: "9".into(), ..Default::default() },
                    key,
                ))
                .await
                .map(drop),
        ]
        .map(|r| r.expect_err("a client key is not the admin token").code());
        assert_eq!(codes, [Code::Unauthenticated; 4]);
    }
    let mut on_client_port = admin_client(&server.addr).await;
    let e = on_client_port
        .revoke_principal(bearer(RevokePrincipalRequest { name: "bob".into() }, ADMIN_TOKEN))
        .await
        .expect_err("no admin service on the client listener");
    assert_eq!(e.code(), Code::Unimplemented);

    // Bob opens a stream; revoking him stops it at its next query, and his
    // key at once for every RPC.
    let (tx, rx) = tokio::sync::mpsc::channel::<PredictRequest>(4);
    tx.send(image("b1", &digit(4))).await.expect("queued");
    let mut bobs = c
        .predict_stream(with_key(tokio_stream::wrappers::ReceiverStream::new(rx), &bob_key))
        .await
        .expect("stream")
        .into_inner();
    bobs.message().await.expect("ok").expect("bob's first answer");
    admin.revoke_principal(bearer(RevokePrincipalRequest { name: "bob".into() }, ADMIN_TOKEN)).await.expect("revoked");
    tx.send(image("b2", &digit(5))).await.expect("queued");
    let e = bobs.message().await.expect_err("the open stream stops");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let e = predict(&mut c, &bob_key, image("b3", &digit(6))).await.expect_err("revoked");
    assert_eq!(e.code(), Code::Unauthenticated);
    let bob = admin.inspect_principal(bearer(InspectPrincipalRequest { name: "bob".into() }, ADMIN_TOKEN)).await;
    let account = bob.expect("inspect").into_inner().account.expect("account");
    assert_eq!((account.answered, account.spent), (1, B), "charged for the one answer, kept after revocation");

    // Read while it runs: a kill loses the lines of its last moments.
    let logs = server.logs();
    // At rest: every key only as its digest.
    server.kill();
    let bytes = std::fs::read(&store_path).expect("store file");
    let contains = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    for key in ["alice-key", bob_key.as_str()] {
        assert!(!contains(key.as_bytes()), "the key {key} is stored in plain text");
        let digest: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(key.as_bytes()).into();
        assert!(contains(&digest), "the digest of {key} is stored");
    }
    assert!(!logs.contains(bob_key.as_str()), "a key was logged");
}

/// Issue 67 §2 through the binary, on both stores: the sequence that let
/// one principal's session be resumed under another secret. A principal
/// named `fashion/alice` is refused, configured or created; a session an
/// earlier release left under `fashion/alice` makes a later dataset
/// `fashion` refuse its first start, naming it; and the dataset under
/// another name gives alice a session of its own (her first answer there
/// is her first, not her eleventh).
async fn names_cannot_cross_secrets(postgres: Option<&str>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store_path = dir.path().join("state.redb");
    let mut env = small_demo(&[
        ("PACPRIV__ADMIN__KEY_SHA256", key_hash(ADMIN_TOKEN)),
        ("PACPRIV__STORE__PATH", store_path.display().to_string()),
    ]);
    if let Some(url) = postgres {
        env.push(("PACPRIV__STORE__BACKEND", "postgres".to_owned()));
        env.push(("PACPRIV__STORE__POSTGRES_URL", url.to_owned()));
    }
    let with_dataset = |name: &str| {
        let mut env = env.clone();
        let upper = name.to_uppercase();
        env.extend([
            (leak(format!("PACPRIV__DATASETS__{upper}__POLICY")), "paper".to_owned()),
            ("PACPRIV__MODELS__CLOTHES__DATASET", name.to_owned()),
            ("PACPRIV__MODELS__CLOTHES__DEMO__SEED", "7".to_owned()),
        ]);
        env
    };

    // Configured: refused at start, naming the key.
    let file = dir.path().join("named.toml");
    let toml = format!("[principals.\"fashion/alice\"]\nkey_sha256 = \"{}\"\nbudget_mi = \"1\"\n", key_hash("fa-key"));
    std::fs::write(&file, toml).expect("written");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_pacpriv"))
        .args(["serve", "--check", "--config", &file.display().to_string()])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .expect("pacpriv runs");
    let said = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(64), "{said}");
    assert!(said.contains("principals.fashion/alice") && said.contains("letters, digits"), "{said}");

    // Created through the admin API: refused, and nothing is created.
    let mut server = Process::serve(None, &env);
    let mut admin = admin_client(&server.listener("admin")).await;
    for name in ["fashion/alice", "*global*", "fashion\u{2215}alice"] {
        let create = CreatePrincipalRequest { name: name.into(), budget_mi: "1".into(), ..Default::default() };
        let e = admin.create_principal(bearer(create, ADMIN_TOKEN)).await.expect_err("not a principal name");
        assert_eq!(e.code(), Code::InvalidArgument, "{name}: {e:?}");
        assert!(e.message().contains("letters, digits"), "{name}: {}", e.message());
    }
    let listed = admin.list_principals(bearer(ListPrincipalsRequest {}, ADMIN_TOKEN)).await.expect("listed");
    let names: Vec<String> = listed.into_inner().principals.into_iter().map(|p| p.name).collect();
    assert!(names.iter().all(|n| n == "alice" || n == "demo"), "{names:?}");
    let mut c = client(&server.addr).await;
    for k in 0..10 {
        predict(&mut c, "alice-key", image(&format!("d{k}"), &digit(k))).await.expect("alice answered");
    }
    server.kill();

    // An earlier release's session under `fashion/alice` (its name rule
    // let such a principal be): dataset `fashion` refuses its first start.
    match postgres {
        Some(url) => {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("connects");
            tokio::spawn(connection);
            client
                .execute("INSERT INTO pacpriv_sessions (session, version, record) VALUES ('fashion/alice', 0, '')", &[])
                .await
                .expect("an earlier release's session");
        }
        None => {
            use pacpriv_store::{Change, EmbeddedStore, SessionRecord};
            let store = EmbeddedStore::open(&store_path).expect("opens");
            let record = SessionRecord {
                version: 10,
                posterior: pacpriv_privacy::posterior::Form::Log(vec![0.0; 16]),
                spent: 10.0 * B,
                limit: 1.0,
                answered: 10,
                charged: 10,
                cache: None,
                cache_owners: Vec::new(),
                journal_head: None,
                journal_events: 0,
                dataset: None,
            };
            store
                .enqueue("fashion/alice", record, Change::default())
                .expect("queued")
                .durable()
                .await
                .expect("durable");
        }
    }
    let mut refused = Process::serve_unready(Path::new(env!("CARGO_BIN_EXE_pacpriv")), None, &with_dataset("fashion"));
    let status = refused.wait(Duration::from_secs(60)).expect("refuses to start");
    let said = refused.logs();
    assert!(!status.success(), "{said}");
    assert!(said.contains("\"fashion/alice\"") && said.contains("name the dataset otherwise"), "{said}");

    // Under another name the dataset starts, and alice's session in it is
    // her own: one answer, one step of its own ledger.
    let server = Process::serve(None, &with_dataset("garden"));
    let mut c = client(&server.addr).await;
    let request = PredictRequest { model: "clothes".into(), ..image("g0", &digit(3)) };
    let answer = predict(&mut c, "alice-key", request).await.expect("alice answered in garden");
    let ledger = answer.budget.map(|b| (b.dataset, b.answered));
    assert_eq!(ledger, Some(("garden".to_owned(), 1)), "a session of her own in the new dataset");
    let default = budget(&mut c, "alice-key").await;
    assert_eq!((default.dataset.as_str(), default.answered), ("default", 10), "her default session, unchanged");
}

/// Environment keys built at run time live as long as the test.
fn leak(key: String) -> &'static str {
    Box::leak(key.into_boxed_str())
}

#[tokio::test(flavor = "multi_thread")]
async fn names_cannot_cross_secrets_embedded() {
    names_cannot_cross_secrets(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn names_cannot_cross_secrets_postgres() {
    let pg = crate::util::Postgres::start();
    names_cannot_cross_secrets(Some(&pg.url)).await;
}
