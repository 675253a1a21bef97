//! The Python client package (`clients/python`), installed with pip as a
//! user would: its committed stubs match the proto, and its own tests pass
//! against real servers (plaintext, and TLS with a rate limit).

use crate::ops::certificates;
use crate::util::{B, Process, client_python, key_hash, small_demo};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

#[test]
fn the_committed_stubs_are_what_the_proto_generates() {
    let python = client_python();
    let dir = tempfile::tempdir().expect("temp dir");
    let out = Command::new(&python)
        .args(["-m", "grpc_tools.protoc", &format!("-I{ROOT}/proto"), "pacpriv/v1/privatizer.proto"])
        .arg(format!("--python_out={}", dir.path().display()))
        .arg(format!("--grpc_python_out={}", dir.path().display()))
        .arg(format!("--pyi_out={}", dir.path().display()))
        .output()
        .expect("protoc runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for file in ["privatizer_pb2.py", "privatizer_pb2_grpc.py", "privatizer_pb2.pyi"] {
        let fresh = std::fs::read_to_string(dir.path().join("pacpriv/v1").join(file)).expect("generated");
        let committed =
            std::fs::read_to_string(format!("{ROOT}/clients/python/src/pacpriv/v1/{file}")).expect("committed");
        assert!(fresh == committed, "clients/python/src/pacpriv/v1/{file} is stale: run clients/python/generate.sh");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_clients_tests_pass_against_real_servers() {
    let python = client_python();
    let dir = tempfile::tempdir().expect("temp dir");
    certificates(dir.path(), "unused");
    let path = |f: &str| dir.path().join(f).display().to_string();
    let plain = Process::serve(
        None,
        &small_demo(&[
            ("PACPRIV__PRINCIPALS__TINY__KEY_SHA256", key_hash("tiny-key")),
            ("PACPRIV__PRINCIPALS__TINY__BUDGET_MI", format!("{}", B / 2.0)),
            ("PACPRIV__MODELS__RIDGE__DEMO__REGULARISATION", "1".into()),
            ("PACPRIV__VERSIONS__RIDGE__2__DEMO__REGULARISATION", "2".into()),
        ]),
    );
    let tls = Process::serve(
        None,
        &small_demo(&[
            ("PACPRIV__TLS__CERT_FILE", path("server.pem")),
            ("PACPRIV__TLS__KEY_FILE", path("server.key")),
            ("PACPRIV__SERVER__RATE_LIMIT_PER_SECOND", "1".into()),
        ]),
    );
    let out = Command::new(&python)
        .args(["-m", "unittest", "discover", "-s", &format!("{ROOT}/clients/python/tests"), "-v"])
        .env("PACPRIV_TEST_ADDR", &plain.addr)
        .env("PACPRIV_TEST_TLS_ADDR", &tls.addr)
        .env("PACPRIV_TEST_CA", path("ca.pem"))
        .env("PACPRIV_TEST_B", format!("{B}"))
        .output()
        .expect("python runs");
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the client's tests failed:\n{report}");
    assert!(report.contains("Ran 7 tests") && report.contains("OK"), "{report}");
}
