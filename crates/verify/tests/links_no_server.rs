//! The verifier's promise to an auditor: building `pacpriv-verify` builds
//! no server. What it links (`cargo tree -e normal`, every target) holds
//! no gRPC stack, HTTP server or client, TLS, async runtime or database
//! client; what builds it (build dependencies too) holds no server or
//! runtime. So a data owner can build and run it on a machine the operator
//! does not control from the privacy crate and the records' format alone.
//!
//! Two crates in its tree speak of HTTP and run no code of it: `http` and
//! `httparse` come from `pacpriv-workspace-hack`, which holds no code and
//! only fixes the workspace's feature sets (`docs/architecture.md`, "One
//! feature set"); and openblas-src's build script depends on an HTTP
//! client (`ureq`, with rustls) that it uses only to download OpenBLAS,
//! which its `system` feature never does.

use std::process::Command;

/// Crate families (a name, or its prefix before `-`) no part of the
/// verifier's build may hold: servers, gRPC, async runtimes, databases.
const NEVER_BUILT: [&str; 12] = [
    "tonic",
    "hyper",
    "axum",
    "h2",
    "tower",
    "tokio",
    "mio",
    "postgres",
    "deadpool",
    "redb",
    "pacpriv-service",
    "pacpriv-store",
];

/// Families the verifier may be built with (build scripts) but never links:
/// network clients and TLS.
const NEVER_LINKED: [&str; 5] = ["ureq", "reqwest", "rustls", "ring", "webpki"];

/// The crate names of `cargo tree -p pacpriv-verify` over every target,
/// with `edges` (`normal`: what is linked; `normal,build`: what is built).
fn tree(edges: &str) -> Vec<String> {
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--package", "pacpriv-verify", "--prefix", "none", "--target", "all", "--edges", edges])
        .args(["--locked", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(output.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&output.stderr));
    let tree = String::from_utf8_lossy(&output.stdout);
    let names: Vec<String> = tree.lines().filter_map(|l| l.split_whitespace().next()).map(str::to_owned).collect();
    assert!(names.iter().any(|n| n == "pacpriv-records"), "not the verifier's tree:\n{tree}");
    names
}

/// The names of `tree` in one of `families`.
fn of<'a>(tree: &'a [String], families: &[&str]) -> Vec<&'a str> {
    let in_family = |name: &str| families.iter().any(|f| name == *f || name.starts_with(&format!("{f}-")));
    let mut found: Vec<&str> = tree.iter().map(String::as_str).filter(|n| in_family(n)).collect();
    found.dedup();
    found
}

#[test]
fn the_verifier_links_no_server() {
    let built = tree("normal,build");
    assert_eq!(of(&built, &NEVER_BUILT), Vec::<&str>::new(), "built with pacpriv-verify");
    let linked = tree("normal");
    let families: Vec<&str> = NEVER_BUILT.iter().chain(&NEVER_LINKED).copied().collect();
    assert_eq!(of(&linked, &families), Vec::<&str>::new(), "linked into pacpriv-verify");
}

#[test]
fn a_family_is_matched_by_its_name_and_prefix() {
    let names: Vec<String> =
        ["tokio-postgres", "tokio", "hyperloop", "h2", "rustls-pki-types"].map(String::from).into();
    assert_eq!(of(&names, &["tokio", "hyper", "h2", "rustls"]), ["tokio-postgres", "tokio", "h2", "rustls-pki-types"]);
}
