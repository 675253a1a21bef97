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

    // At rest: every key only as its digest.
    server.kill();
    let bytes = std::fs::read(&store_path).expect("store file");
    let contains = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    for key in ["alice-key", bob_key.as_str()] {
        assert!(!contains(key.as_bytes()), "the key {key} is stored in plain text");
        let digest: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(key.as_bytes()).into();
        assert!(contains(&digest), "the digest of {key} is stored");
    }
    assert!(!server.logs().contains(bob_key.as_str()), "a key was logged");
}
