//! The verifier's promise to an auditor: building `pacpriv-verify` builds
//! no server. Its whole dependency tree (`cargo tree`: what it links and
//! what builds it) holds no gRPC stack, HTTP server, async runtime or
//! database client, so that a data owner can build and run it on a
//! machine the operator does not control from the privacy crate and the
//! records' format alone.

use std::process::Command;

/// What a server links and the verifier must not.
const SERVER_CRATES: [&str; 9] =
    ["tonic", "hyper", "axum", "h2", "tokio", "tokio-postgres", "deadpool-postgres", "redb", "pacpriv-service"];

#[test]
fn the_verifier_links_no_server() {
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--package", "pacpriv-verify", "--prefix", "none", "--locked", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    let tree = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&output.stderr));
    let names: Vec<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
    assert!(
        names.contains(&"pacpriv-records") && names.contains(&"pacpriv-privacy"),
        "not the verifier's tree:\n{tree}"
    );
    let linked: Vec<&&str> = SERVER_CRATES.iter().filter(|c| names.contains(c)).collect();
    assert!(linked.is_empty(), "pacpriv-verify's dependency tree holds {linked:?}:\n{tree}");
}
