//! Teachers behind TLS, client certificates and a bearer token, as a
//! hosted inference server is deployed: `pacpriv teachers` with TLS flags
//! on one side, `teachers.remote` connection settings on the other.

use crate::ops::certificates;
use crate::util::{Process, budget, client, digit, image, predict};
use std::process::Command;
use tonic::Code;

const TOKEN: &str = "teacher-token-7f3a";

/// The `[teachers]` config `pacpriv teachers --write-config` wrote, each
/// endpoint turned https:// with `connection` (TOML fields) added.
fn with_connection(written: &str, connection: &str) -> String {
    written
        .replace("{ endpoint = \"http://", "{ endpoint = \"https://")
        .replace("\" },", &format!("\", {connection} }},"))
}

/// `pacpriv serve --config config` run to its end (a start that fails).
fn failed_start(config: &std::path::Path, env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = Command::new(env!("CARGO_BIN_EXE_pacpriv"))
        .args(["serve", "--config", &config.display().to_string()])
        .env("PACPRIV__SERVER__LISTEN", "127.0.0.1:0")
        .env("PACPRIV__SERVER__HTTP_LISTEN", "")
        .env("PACPRIV__METRICS__LISTEN", "")
        .env("PACPRIV__STORE__PATH", dir.path().join("s.redb"))
        .envs(env.iter().copied())
        .output()
        .expect("pacpriv runs");
    assert!(!out.status.success(), "the start must fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn teachers_behind_tls_client_certificates_and_a_bearer_token() {
    let dir = tempfile::tempdir().expect("temp dir");
    certificates(dir.path(), "pacpriv");
    let path = |f: &str| dir.path().join(f).display().to_string();
    std::fs::write(dir.path().join("token"), format!("{TOKEN}\n")).expect("token written");
    let written = dir.path().join("teachers.toml");
    let _teachers = Process::start(
        &[
            "teachers",
            "--models",
            "4",
            "--seed",
            "7",
            "--listen",
            "127.0.0.1:0",
            "--write-config",
            &written.display().to_string(),
            "--tls-cert",
            &path("server.pem"),
            "--tls-key",
            &path("server.key"),
            "--tls-client-ca",
            &path("ca.pem"),
            "--bearer-file",
            &path("token"),
        ],
        &[],
        "teachers listening on",
    );
    let written = std::fs::read_to_string(&written).expect("config written");
    let connection = format!(
        r#"ca_file = "{}", cert_file = "{}", key_file = "{}", server_name = "localhost", headers = [{{ name = "Authorization", prefix = "Bearer ", value_env = "TEACHER_TOKEN" }}]"#,
        path("ca.pem"),
        path("client.pem"),
        path("client.key")
    );
    let good = dir.path().join("good.toml");
    std::fs::write(&good, with_connection(&written, &connection)).expect("config");

    // Everything right: answered, and charged.
    let server = Process::serve(Some(&good), &[("TEACHER_TOKEN", TOKEN.to_owned())]);
    let mut c = client(&server.addr).await;
    let answer = predict(&mut c, "demo-key", image("tls", &digit(1))).await.expect("answered through TLS");
    assert!(answer.label < 10);
    assert!(!server.logs().contains(TOKEN), "the token is never logged");
    drop(server);

    // The wrong token: the teachers refuse every call, so queries are
    // refused as unavailable and nothing is charged.
    let server = Process::serve(Some(&good), &[("TEACHER_TOKEN", "not-the-token".to_owned())]);
    let mut c = client(&server.addr).await;
    let e = predict(&mut c, "demo-key", image("tok", &digit(1))).await.expect_err("teachers refuse");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(!e.message().contains("not-the-token"), "{}", e.message());
    assert_eq!(budget(&mut c, "demo-key").await.answered, 0);
    drop(server);

    // A CA that did not sign the teachers' certificate: a start-up error
    // naming the endpoint and the setting, not a stream of failed queries.
    let other = tempfile::tempdir().expect("temp dir");
    certificates(other.path(), "pacpriv");
    let wrong_ca = connection.replace(&path("ca.pem"), &other.path().join("ca.pem").display().to_string());
    let wrong = dir.path().join("wrong-ca.toml");
    std::fs::write(&wrong, with_connection(&written, &wrong_ca)).expect("config");
    let stderr = failed_start(&wrong, &[("TEACHER_TOKEN", TOKEN)]);
    assert!(stderr.contains("TLS handshake failed") && stderr.contains("ca_file"), "{stderr}");

    // A header value in the configuration itself is refused, by key.
    let literal = connection.replace(r#"value_env = "TEACHER_TOKEN""#, &format!(r#"value = "{TOKEN}""#));
    let inline = dir.path().join("inline.toml");
    std::fs::write(&inline, with_connection(&written, &literal)).expect("config");
    let stderr = failed_start(&inline, &[]);
    assert!(
        stderr.contains("teachers.remote[0].headers[0].value") && stderr.contains("value_file or value_env"),
        "{stderr}"
    );
    // So is a secret whose variable is not set.
    let stderr = failed_start(&good, &[]);
    assert!(stderr.contains("teachers.remote[0].headers[0].value_env") && stderr.contains("TEACHER_TOKEN"), "{stderr}");

    // Issue 40 §7: credentials towards a plaintext endpoint are refused,
    // by key, unless the operator says the network is private.
    let header = r#"headers = [{ name = "Authorization", prefix = "Bearer ", value_env = "TEACHER_TOKEN" }]"#;
    let plaintext = dir.path().join("plaintext.toml");
    let plain = written.replace("https://", "http://").replace("\" },", &format!("\", {header} }},"));
    std::fs::write(&plaintext, plain).expect("config");
    let stderr = failed_start(&plaintext, &[("TEACHER_TOKEN", TOKEN)]);
    assert!(
        stderr.contains("teachers.remote[0].headers") && stderr.contains("teachers.allow_plaintext_credentials"),
        "{stderr}"
    );
    assert!(!stderr.contains(TOKEN), "{stderr}");
    let o = Command::new(env!("CARGO_BIN_EXE_pacpriv"))
        .args(["serve", "--check", "--config", &plaintext.display().to_string()])
        .env("TEACHER_TOKEN", TOKEN)
        .env("PACPRIV__TEACHERS__ALLOW_PLAINTEXT_CREDENTIALS", "true")
        .output()
        .expect("pacpriv runs");
    assert!(o.status.success(), "allowed explicitly: {}", String::from_utf8_lossy(&o.stderr));
}
