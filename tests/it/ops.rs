//! Operating a live `pacpriv serve`: Prometheus metrics that follow the
//! answers, the admin API's create → use → inspect → revoke cycle, TLS and
//! mTLS (a client certificate naming the principal), and the plaintext
//! health listener `pacpriv health` probes.

use crate::util::{
    ADMIN_TOKEN, B, Process, admin_client, bearer, budget, client, digit, image, key_hash, predict, sample, scrape,
    small_demo, with_key,
};
use pacpriv_service::proto::pacpriv::privatizer_client::PrivatizerClient;
use pacpriv_service::proto::pacpriv::{
    CreatePrincipalRequest, GetBudgetRequest, InspectPrincipalRequest, ListPrincipalsRequest, RevokePrincipalRequest,
};
use tonic::Code;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

#[tokio::test(flavor = "multi_thread")]
async fn budget_gauges_and_query_counters_move_with_answers() {
    let server = Process::serve(None, &small_demo(&[]));
    let metrics = server.listener("metrics");
    let before = scrape(&metrics);
    assert_eq!(sample(&before, r#"pacpriv_budget_spent_nats{principal="alice",dataset="default"}"#), Some(0.0));
    assert_eq!(sample(&before, r#"pacpriv_budget_limit_nats{principal="alice",dataset="default"}"#), Some(1.0));
    assert_eq!(sample(&before, "pacpriv_principals"), Some(2.0));
    // Every model's teachers: the logistic ensemble's 16 and the demo's
    // naive Bayes model's 16.
    assert_eq!(sample(&before, "pacpriv_teachers"), Some(32.0));
    assert_eq!(sample(&before, "pacpriv_teachers_ready"), Some(32.0));

    let mut c = client(&server.addr).await;
    for i in 0..3 {
        predict(&mut c, "alice-key", image(&format!("m{i}"), &digit(i))).await.expect("answered");
    }
    let again = predict(&mut c, "alice-key", image("m0-again", &digit(0))).await.expect("answered");
    assert!(again.cached, "{again:?}");
    let mut bad = image("bad", &digit(9));
    bad.input.as_mut().expect("input").fp32_contents[3] = f32::NAN;
    assert_eq!(predict(&mut c, "alice-key", bad).await.expect_err("NaN").code(), Code::InvalidArgument);
    assert_eq!(predict(&mut c, "nobody", image("u", &digit(1))).await.expect_err("key").code(), Code::Unauthenticated);

    let after = scrape(&metrics);
    let b = budget(&mut c, "alice-key").await;
    assert_eq!(sample(&after, r#"pacpriv_budget_spent_nats{principal="alice",dataset="default"}"#), Some(3.0 * B));
    assert_eq!(sample(&after, r#"pacpriv_budget_spent_nats{principal="alice",dataset="default"}"#), Some(b.spent));
    assert_eq!(sample(&after, r#"pacpriv_mia_bound{principal="alice",dataset="default"}"#), Some(b.mia_bound));
    assert_eq!(sample(&after, r#"pacpriv_queries_total{outcome="answered"}"#), Some(4.0));
    assert_eq!(sample(&after, r#"pacpriv_queries_total{outcome="invalid"}"#), Some(1.0));
    assert_eq!(sample(&after, r#"pacpriv_queries_total{outcome="unauthenticated"}"#), Some(1.0));
    assert_eq!(sample(&after, "pacpriv_mi_charged_nats_total"), Some(3.0 * B));
    // Latency covers authenticated requests (4 answers + the invalid one);
    // each stage counts the answers that went through it: the repeat
    // needed no teacher.
    assert_eq!(sample(&after, r#"pacpriv_request_duration_seconds_count{rpc="predict"}"#), Some(5.0));
    for (stage, n) in [("admission", 4.0), ("fanout", 3.0), ("calibration", 4.0), ("durable_charge", 4.0)] {
        let series = format!("pacpriv_stage_duration_seconds_count{{stage=\"{stage}\"}}");
        assert_eq!(sample(&after, &series), Some(n), "{series}");
    }
    // Every teacher of the model asked was asked for every new query, each
    // once: every teacher model (16, or the one stacked model) of
    // `private` was called 3 times (`bayes`, not asked, has its own series).
    let calls: Vec<f64> = after
        .lines()
        .filter(|l| l.starts_with("pacpriv_teacher_call_duration_seconds_count{model=\"private\",version=\"1\","))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .collect();
    assert!(calls.len() == 16 || calls.len() == 1, "{calls:?}");
    assert!(calls.iter().all(|&n| n == 3.0), "{calls:?}");
    assert_eq!(sample(&after, "pacpriv_teacher_batch_size_sum"), Some(3.0));
    assert!(sample(&after, "pacpriv_store_commit_duration_seconds_count").is_some_and(|n| n >= 1.0));
    // Nothing in the exposition is keyed by anything but the documented labels.
    for line in after.lines().filter(|l| !l.starts_with('#')) {
        let labels = line.split_once('{').map(|(_, rest)| rest.split('}').next().unwrap_or_default());
        for pair in labels.into_iter().flat_map(|l| l.split(',')).filter(|p| !p.is_empty()) {
            let key = pair.split('=').next().unwrap_or_default();
            assert!(
                ["outcome", "rpc", "stage", "principal", "dataset", "model", "version", "teacher", "kind", "le"]
                    .contains(&key),
                "label {key} in {line}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_creates_a_principal_that_answers_until_revoked_and_stays_revoked() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = ("PACPRIV__STORE__PATH", dir.path().join("state.redb").display().to_string());
    let env = small_demo(&[("PACPRIV__ADMIN__KEY_SHA256", key_hash(ADMIN_TOKEN)), store.clone()]);
    let server = Process::serve(None, &env);
    let admin_addr = server.listener("admin");
    let mut admin = admin_client(&admin_addr).await;
    // A first start says loudly that it created a store, and where.
    let logs = server.logs();
    assert!(logs.contains("new store") && logs.contains(&store.1), "{logs}");

    // Only the admin token opens the admin API; the client port has no admin API.
    let create = || CreatePrincipalRequest { name: "dave".into(), budget_mi: "2^-6".into(), ..Default::default() };
    for token in ["wrong", "alice-key"] {
        let e = admin.create_principal(bearer(create(), token)).await.expect_err("refused");
        assert_eq!(e.code(), Code::Unauthenticated, "{token}");
    }
    let e = admin.create_principal(create()).await.expect_err("no token");
    assert_eq!(e.code(), Code::Unauthenticated);
    let mut on_client_port = admin_client(&server.addr).await;
    let e = on_client_port.create_principal(bearer(create(), ADMIN_TOKEN)).await.expect_err("not served there");
    assert_eq!(e.code(), Code::Unimplemented);

    // Create: the key comes back once; it works at once.
    let created = admin.create_principal(bearer(create(), ADMIN_TOKEN)).await.expect("created").into_inner();
    let key = created.api_key.clone();
    let p = created.principal.expect("principal");
    assert_eq!((p.name.as_str(), p.origin.as_str(), p.budget_mi, p.revoked), ("dave", "admin", 1.0 / 64.0, false));
    assert!(key.starts_with("ppk_"));
    assert!(
        !format!("{:?}", admin.list_principals(bearer(ListPrincipalsRequest {}, ADMIN_TOKEN)).await).contains(&key)
    );

    let mut c = client(&server.addr).await;
    let r = predict(&mut c, &key, image("d1", &digit(4))).await.expect("dave answered");
    assert_eq!(r.budget.expect("budget").principal, "dave");

    // Inspect: spent, remaining, MIA bound, ε-equivalent.
    let inspect = |name: &str| bearer(InspectPrincipalRequest { name: name.into() }, ADMIN_TOKEN);
    let dave = admin.inspect_principal(inspect("dave")).await.expect("inspect").into_inner();
    let account = dave.account.clone().expect("account");
    assert_eq!((account.spent, account.remaining, account.answered), (B, 1.0 / 64.0 - B, 1));
    assert!(account.mia_bound > 0.5 && dave.epsilon_equivalent > 0.0);
    let names: Vec<String> = admin
        .list_principals(bearer(ListPrincipalsRequest {}, ADMIN_TOKEN))
        .await
        .expect("list")
        .into_inner()
        .principals
        .into_iter()
        .map(|p| p.name)
        .collect();
    assert_eq!(names, ["alice", "dave", "demo"]);
    let metrics = scrape(&server.listener("metrics"));
    assert_eq!(sample(&metrics, r#"pacpriv_budget_spent_nats{principal="dave",dataset="default"}"#), Some(B));
    assert_eq!(sample(&metrics, "pacpriv_principals"), Some(3.0));

    // Names are never reused; unknown names are NOT_FOUND; bad input says so.
    let e = admin.create_principal(bearer(create(), ADMIN_TOKEN)).await.expect_err("taken");
    assert_eq!(e.code(), Code::AlreadyExists);
    let e = admin.inspect_principal(inspect("nobody")).await.expect_err("unknown");
    assert_eq!(e.code(), Code::NotFound);
    let bad_budget = CreatePrincipalRequest { name: "erin".into(), budget_mi: "lots".into(), ..Default::default() };
    let e = admin.create_principal(bearer(bad_budget, ADMIN_TOKEN)).await.expect_err("bad budget");
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("budget_mi"), "{}", e.message());

    // Revoke: the key stops working at once; the spending stays on record.
    let revoked = admin
        .revoke_principal(bearer(RevokePrincipalRequest { name: "dave".into() }, ADMIN_TOKEN))
        .await
        .expect("revoked")
        .into_inner();
    assert!(revoked.revoked && revoked.revoked_unix.is_some());
    assert_eq!(revoked.account.expect("account").spent, B);
    let e = predict(&mut c, &key, image("d2", &digit(5))).await.expect_err("revoked key");
    assert_eq!(e.code(), Code::Unauthenticated);
    let e = c.get_budget(with_key(GetBudgetRequest::default(), &key)).await.expect_err("revoked key");
    assert_eq!(e.code(), Code::Unauthenticated);
    assert_eq!(sample(&scrape(&server.listener("metrics")), "pacpriv_principals"), Some(2.0));

    // A restart on the same store: still revoked, still charged.
    drop((c, admin, on_client_port, server));
    let server = Process::serve(None, &env);
    assert!(!server.logs().contains("new store"), "a restart finds its store");
    let mut c = client(&server.addr).await;
    let e = predict(&mut c, &key, image("d3", &digit(6))).await.expect_err("still revoked");
    assert_eq!(e.code(), Code::Unauthenticated);
    let mut admin = admin_client(&server.listener("admin")).await;
    let dave = admin.inspect_principal(inspect("dave")).await.expect("inspect").into_inner();
    assert!(dave.revoked);
    assert_eq!(dave.account.expect("account").spent, B);

    // The same through `pacpriv admin` (token from the environment).
    let admin_addr = server.listener("admin");
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pacpriv"))
            .args(["admin", "--addr", &admin_addr])
            .args(args)
            .env("PACPRIV_ADMIN_TOKEN", ADMIN_TOKEN)
            .output()
            .expect("pacpriv admin runs");
        assert!(out.status.success(), "pacpriv admin {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("utf-8")
    };
    assert!(cli(&["inspect", "dave"]).starts_with("dave\torigin=admin\trevoked=true\tspent=3.90625e-3"));
    let created = cli(&["create", "frank", "--budget-mi", "2^-6"]);
    let frank_key = created.lines().find_map(|l| l.strip_prefix("api_key=")).expect("key printed");
    assert_eq!(predict(&mut c, frank_key, image("f1", &digit(7))).await.expect("frank answered").mi_charged, B);
    assert_eq!(cli(&["list"]).lines().count(), 4);
    assert!(cli(&["revoke", "frank"]).contains("revoked=true"));
    assert_eq!(
        predict(&mut c, frank_key, image("f2", &digit(7))).await.expect_err("revoked").code(),
        Code::Unauthenticated
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate whose
/// subject CN is `cn`, as PEM files in `dir` (`ca.pem`, `server.pem`,
/// `server.key`, `client.pem`, `client.key`).
pub fn certificates(dir: &std::path::Path, cn: &str) -> (Certificate, Identity) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "pacpriv test CA");
    let ca = ca_params.self_signed(&ca_key).expect("CA cert");
    let issuer = rcgen::Issuer::new(ca_params, ca_key);

    let server_key = KeyPair::generate().expect("server key");
    let server = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .expect("server params")
        .signed_by(&server_key, &issuer)
        .expect("server cert");
    let client_key = KeyPair::generate().expect("client key");
    let mut client_params = CertificateParams::new(Vec::<String>::new()).expect("client params");
    client_params.distinguished_name.push(DnType::CommonName, cn);
    let client = client_params.signed_by(&client_key, &issuer).expect("client cert");

    let files = [
        ("ca.pem", ca.pem()),
        ("server.pem", server.pem()),
        ("server.key", server_key.serialize_pem()),
        ("client.pem", client.pem()),
        ("client.key", client_key.serialize_pem()),
    ];
    for (name, pem) in files {
        std::fs::write(dir.join(name), pem).expect("write PEM");
    }
    (Certificate::from_pem(ca.pem()), Identity::from_pem(client.pem(), client_key.serialize_pem()))
}

#[tokio::test(flavor = "multi_thread")]
async fn mtls_certificate_names_the_principal_and_health_stays_plaintext() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (ca, alice_identity) = certificates(dir.path(), "alice");
    let path = |f: &str| dir.path().join(f).display().to_string();
    let server = Process::serve(
        None,
        &small_demo(&[
            ("PACPRIV__TLS__CERT_FILE", path("server.pem")),
            ("PACPRIV__TLS__KEY_FILE", path("server.key")),
            ("PACPRIV__TLS__CLIENT_CA_FILE", path("ca.pem")),
            ("PACPRIV__TLS__PRINCIPAL_FROM_CERT", "true".into()),
            ("PACPRIV__SERVER__HEALTH_LISTEN", "127.0.0.1:0".into()),
        ]),
    );
    let tls_channel = |identity: Option<Identity>| {
        let mut tls = ClientTlsConfig::new().ca_certificate(ca.clone()).domain_name("localhost");
        if let Some(id) = identity {
            tls = tls.identity(id);
        }
        Endpoint::from_shared(format!("https://{}", server.addr)).expect("uri").tls_config(tls).expect("tls config")
    };

    // With alice's certificate and no API key: answered as alice.
    let mut c = PrivatizerClient::new(tls_channel(Some(alice_identity)).connect().await.expect("mTLS handshake"));
    let r = c.predict(image("t1", &digit(2))).await.expect("answered by certificate").into_inner();
    assert_eq!(r.budget.expect("budget").principal, "alice");
    // An API key still wins over the certificate.
    assert_eq!(budget(&mut c, "demo-key").await.principal, "demo");

    // No client certificate, or no TLS at all: no answer.
    let no_cert = tls_channel(None).connect().await;
    if let Ok(channel) = no_cert {
        let mut c = PrivatizerClient::new(channel);
        assert!(c.predict(with_key(image("t2", &digit(2)), "alice-key")).await.is_err(), "handshake must fail");
    }
    let plain = Endpoint::from_shared(format!("http://{}", server.addr)).expect("uri").connect().await;
    if let Ok(channel) = plain {
        let mut c = PrivatizerClient::new(channel);
        assert!(c.predict(with_key(image("t3", &digit(2)), "alice-key")).await.is_err(), "plaintext must fail");
    }

    // The HTTP/REST listener speaks TLS with the same files and asks for a
    // client certificate too; the API key names the principal.
    let url = format!("https://{}/v2/models/private/infer", server.listener("http"));
    let body = format!(r#"{{"inputs":[{{"name":"input","datatype":"FP32","shape":[1,64],"data":{:?}}}]}}"#, digit(3));
    let curl = |extra: &[&str]| {
        std::process::Command::new("curl")
            .args(["-s", "-w", " %{http_code}", "--cacert", &path("ca.pem"), "-H", "x-api-key: alice-key", "-d", &body])
            .args(extra)
            .arg(&url)
            .output()
            .expect("curl runs")
    };
    let out = curl(&["--cert", &path("client.pem"), "--key", &path("client.key")]);
    let reply = String::from_utf8_lossy(&out.stdout);
    assert!(reply.ends_with(" 200") && reply.contains(r#""principal":"alice""#), "{reply}");
    assert!(!curl(&[]).status.success(), "no client certificate: the handshake fails");
    let plain = std::process::Command::new("curl")
        .args(["-s", "-H", "x-api-key: alice-key", "-d", &body, &url.replace("https://", "http://")])
        .output()
        .expect("curl runs");
    assert!(String::from_utf8_lossy(&plain.stdout).is_empty(), "plaintext gets no answer");

    // The health listener speaks plaintext, for probes; `pacpriv health` uses it.
    let health = server.listener("health");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pacpriv"))
        .args(["health", "--addr", &health])
        .output()
        .expect("pacpriv health runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "SERVING");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pacpriv"))
        .args(["health", "--addr", "127.0.0.1:1", "--timeout-ms", "500"])
        .output()
        .expect("pacpriv health runs");
    assert!(!out.status.success(), "nothing listens on port 1");
}

/// `pacpriv --version` names the release and every format it writes, as
/// the store and the exporter define them; `-V` the release alone.
#[test]
fn version_names_the_release_and_the_formats_it_writes() {
    use pacpriv_store::{postgres, record};
    let long = crate::util::pacpriv(&["--version"]);
    assert!(long.status.success(), "{}", String::from_utf8_lossy(&long.stderr));
    let text = String::from_utf8_lossy(&long.stdout);
    for expected in [
        format!("pacpriv {}", env!("CARGO_PKG_VERSION")),
        format!("sessions format {} ({} with a cache tail)", record::SESSION_FORMAT, record::TAIL_FORMAT),
        format!(
            "principals format {} ({} for a principal with per-dataset budgets)",
            record::FORMAT,
            record::PRINCIPAL_BUDGETS_FORMAT
        ),
        format!("PostgreSQL schema: migration {}", postgres::SCHEMA_VERSION),
        format!("journal export: {}", pacpriv_tools::verify::format::FORMAT),
    ] {
        assert!(text.contains(&expected), "`pacpriv --version` lacks {expected:?}:\n{text}");
    }
    let short = crate::util::pacpriv(&["-V"]);
    assert_eq!(String::from_utf8_lossy(&short.stdout).trim(), format!("pacpriv {}", env!("CARGO_PKG_VERSION")));
}
