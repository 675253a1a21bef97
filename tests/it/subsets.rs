//! `pacpriv subsets`: the secret-space file, written by the real binary.

use crate::util::{pacpriv, pacpriv_ok};
use std::path::Path;

/// Runs `pacpriv subsets` into `path`; returns the file's bytes.
fn write_subsets(path: &Path, n: &str, m: &str, seed: &str) -> Vec<u8> {
    let out =
        pacpriv(&["subsets", "--n", n, "--m", m, "--seed", seed, "--out", path.to_str().expect("utf-8 temp path")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(out.stdout.is_empty(), "stdout is reserved for data");
    assert!(stderr.contains("wrote"), "one-line summary on stderr: {stderr}");
    std::fs::read(path).expect("the output file exists")
}

#[test]
fn file_has_the_exact_half_property() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bytes = write_subsets(&dir.path().join("s.json"), "1797", "128", "42");
    let doc: serde_json::Value = serde_json::from_slice(&bytes).expect("valid JSON");
    assert_eq!(doc["format"], "pacpriv-subsets/v1");
    assert_eq!((doc["n"].as_u64(), doc["m"].as_u64(), doc["seed"].as_u64()), (Some(1797), Some(128), Some(42)));
    let subsets = doc["subsets"].as_array().expect("subsets array");
    assert_eq!(subsets.len(), 128);
    let mut per_point = vec![0usize; 1797];
    for subset in subsets {
        let points: Vec<usize> = subset
            .as_array()
            .expect("a list of points")
            .iter()
            .map(|p| p.as_u64().expect("a point index") as usize)
            .collect();
        assert!(points.windows(2).all(|w| w[0] < w[1]), "sorted, no duplicates");
        for point in points {
            per_point[point] += 1;
        }
    }
    assert!(per_point.iter().all(|&count| count == 64));
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let a = write_subsets(&dir.path().join("a.json"), "200", "16", "7");
    let b = write_subsets(&dir.path().join("b.json"), "200", "16", "7");
    let c = write_subsets(&dir.path().join("c.json"), "200", "16", "8");
    assert_eq!(a, b);
    assert_ne!(a, c);
    // Standard output carries the same document when --out is absent.
    let stdout = pacpriv_ok(&["subsets", "--n", "200", "--m", "16", "--seed", "7"]);
    assert_eq!(stdout.as_bytes(), a.as_slice());
}

#[test]
fn default_m_is_128() {
    let stdout = pacpriv_ok(&["subsets", "--n", "3", "--seed", "1"]);
    let doc: serde_json::Value = serde_json::from_str(&stdout).expect("valid JSON");
    assert_eq!(doc["m"], 128);
}

#[test]
fn odd_m_is_rejected() {
    let out = pacpriv(&["subsets", "--n", "10", "--m", "7", "--seed", "1"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--m 7"), "{stderr}");
    assert!(stderr.contains("must be even"), "{stderr}");
    assert!(out.stdout.is_empty());
}
