use super::*;
use chacha20::ChaCha20Rng;

fn rng(seed: u64) -> ChaCha20Rng {
    ChaCha20Rng::seed_from_u64(seed)
}

/// How many subsets each point is in, counted from `members_of_subset`.
fn memberships_per_point(a: &Assignment) -> Vec<usize> {
    let mut counts = vec![0; a.n()];
    for subset in 0..a.m() {
        for point in a.members_of_subset(subset) {
            counts[point] += 1;
        }
    }
    counts
}

#[test]
fn rejects_bad_shapes() {
    for (n, m) in [(10, 7), (10, 1), (10, 0), (0, 128), (0, 3)] {
        let result = Assignment::generate(n, m, &mut rng(1));
        assert!(matches!(result, Err(PrivacyError::Domain(_))), "n = {n}, m = {m}");
    }
    let message = Assignment::from_seed(10, 7, 1).map(|_| ()).map_err(|e| e.to_string());
    assert_eq!(
        message,
        Err("the number of subsets m must be even and at least 2 (every point goes into \
             exactly m/2 of them), got m = 7"
            .to_owned())
    );
}

#[test]
fn every_point_is_in_exactly_half_the_subsets() -> Result<(), PrivacyError> {
    for (n, m) in [(1, 2), (10, 2), (100, 4), (50, 6), (3, 128), (1797, 128)] {
        let a = Assignment::generate(n, m, &mut rng(n as u64 * 1000 + m as u64))?;
        assert_eq!((a.n(), a.m()), (n, m));
        for point in 0..n {
            let subsets = a.subsets_of_point(point);
            assert_eq!(subsets.len(), m / 2);
            assert!(subsets.windows(2).all(|w| w[0] < w[1]), "sorted and distinct");
            assert!(subsets.iter().all(|&s| s < m));
        }
        assert!(memberships_per_point(&a).iter().all(|&c| c == m / 2), "n = {n}, m = {m}");
    }
    Ok(())
}

#[test]
fn accessors_agree() -> Result<(), PrivacyError> {
    let a = Assignment::generate(40, 8, &mut rng(3))?;
    for subset in 0..a.m() {
        let members = a.members_of_subset(subset);
        assert!(members.windows(2).all(|w| w[0] < w[1]));
        for point in 0..a.n() {
            let listed = a.subsets_of_point(point).contains(&subset);
            assert_eq!(a.contains(subset, point), listed);
            assert_eq!(members.binary_search(&point).is_ok(), listed);
        }
    }
    assert!(a.members_of_subset(8).is_empty());
    assert!(!a.contains(8, 0));
    Ok(())
}

#[test]
fn subset_sizes_are_about_half() -> Result<(), PrivacyError> {
    for (n, m, seed) in [(1797, 128, 11), (10_000, 16, 12), (501, 2, 13)] {
        let a = Assignment::generate(n, m, &mut rng(seed))?;
        // |S_i| ~ Binomial(n, ½): mean n/2, standard deviation √n/2.
        let (mean, sd) = (n as f64 / 2.0, (n as f64).sqrt() / 2.0);
        for subset in 0..m {
            let size = a.members_of_subset(subset).len() as f64;
            assert!((size - mean).abs() <= 6.0 * sd, "|S_{subset}| = {size}, n = {n}");
        }
    }
    Ok(())
}

#[test]
fn fixed_seed_is_deterministic() -> Result<(), PrivacyError> {
    let a = Assignment::generate(500, 128, &mut rng(42))?;
    let b = Assignment::generate(500, 128, &mut rng(42))?;
    let c = Assignment::generate(500, 128, &mut rng(43))?;
    assert_eq!(a, b);
    assert_ne!(a, c);
    let seeded = Assignment::from_seed(500, 128, 42)?;
    assert_eq!(seeded.seed(), Some(42));
    assert_eq!(seeded.subsets_of_point(7), a.subsets_of_point(7));
    Ok(())
}

#[test]
fn each_subset_index_is_chosen_half_the_time() -> Result<(), PrivacyError> {
    let (n, m) = (20_000, 128);
    let a = Assignment::generate(n, m, &mut rng(7))?;
    // Chi-square of the per-subset counts against n/2 (variance n/4 each);
    // ≈ χ²(m − 1): mean 127, sd ≈ 16. Allow mean + 10 sd.
    let chi2: f64 = (0..m)
        .map(|s| {
            let d = a.members_of_subset(s).len() as f64 - n as f64 / 2.0;
            d * d / (n as f64 / 4.0)
        })
        .sum();
    let df = (m - 1) as f64;
    assert!(chi2 < df + 10.0 * (2.0 * df).sqrt(), "χ² = {chi2}");
    Ok(())
}

#[test]
fn every_half_of_the_subsets_is_equally_likely() -> Result<(), PrivacyError> {
    // m = 6: each point's set is one of C(6, 3) = 20, each with probability 1/20.
    let (n, m) = (40_000, 6);
    let a = Assignment::generate(n, m, &mut rng(8))?;
    let mut counts = std::collections::BTreeMap::new();
    for point in 0..n {
        *counts.entry(a.subsets_of_point(point).to_vec()).or_insert(0usize) += 1;
    }
    assert_eq!(counts.len(), 20);
    let expected = n as f64 / 20.0;
    let chi2: f64 = counts.values().map(|&c| (c as f64 - expected).powi(2) / expected).sum();
    // χ²(19): mean 19, sd ≈ 6.2. Allow mean + 10 sd.
    assert!(chi2 < 19.0 + 10.0 * 38f64.sqrt(), "χ² = {chi2}");
    Ok(())
}

#[test]
fn json_round_trip() -> Result<(), Box<dyn std::error::Error>> {
    let a = Assignment::from_seed(300, 16, 5)?;
    let json = serde_json::to_string(&a)?;
    let value: serde_json::Value = serde_json::from_str(&json)?;
    assert_eq!(value["format"], FORMAT);
    assert_eq!(value["n"], 300);
    assert_eq!(value["m"], 16);
    assert_eq!(value["seed"], 5);
    assert_eq!(value["subsets"].as_array().map(Vec::len), Some(16));
    assert_eq!(value["subsets"][3], serde_json::json!(a.members_of_subset(3)));
    let back: Assignment = serde_json::from_str(&json)?;
    assert_eq!(back, a);

    // Without a seed, the field is omitted and stays absent.
    let unseeded = Assignment::generate(10, 2, &mut rng(1))?;
    let json = serde_json::to_string(&unseeded)?;
    assert!(!json.contains("seed"));
    assert_eq!(serde_json::from_str::<Assignment>(&json)?, unseeded);
    Ok(())
}

#[test]
fn documented_example_parses() -> Result<(), serde_json::Error> {
    let json = r#"{"format":"pacpriv-subsets/v1","n":4,"m":2,"seed":7,"subsets":[[0,3],[1,2]]}"#;
    let a: Assignment = serde_json::from_str(json)?;
    assert_eq!((a.n(), a.m(), a.seed()), (4, 2, Some(7)));
    assert_eq!(a.subsets_of_point(2), [1]);
    assert_eq!(a.members_of_subset(0), [0, 3]);
    Ok(())
}

#[test]
fn malformed_files_are_rejected() {
    let cases = [
        // A point in too few subsets and one in too many.
        (r#"{"format":"pacpriv-subsets/v1","n":2,"m":2,"subsets":[[0],[0]]}"#, "subsets"),
        // Too few memberships overall.
        (r#"{"format":"pacpriv-subsets/v1","n":3,"m":2,"subsets":[[0],[1]]}"#, "n·m/2"),
        // m/2 = 2 memberships each, but point 0 is in all four subsets.
        (r#"{"format":"pacpriv-subsets/v1","n":2,"m":4,"subsets":[[0],[0],[0,1],[]]}"#, "more than m/2"),
        (r#"{"format":"pacpriv-subsets/v2","n":2,"m":2,"subsets":[[0],[1]]}"#, "format"),
        (r#"{"format":"pacpriv-subsets/v1","n":2,"m":3,"subsets":[[0],[1],[0]]}"#, "even"),
        (r#"{"format":"pacpriv-subsets/v1","n":0,"m":2,"subsets":[[],[]]}"#, "at least 1"),
        (r#"{"format":"pacpriv-subsets/v1","n":2,"m":2,"subsets":[[0,1]]}"#, "listed"),
        (r#"{"format":"pacpriv-subsets/v1","n":2,"m":2,"subsets":[[0],[2]]}"#, "point 2"),
        (r#"{"format":"pacpriv-subsets/v1","n":2,"m":4,"subsets":[[1,0],[0,1],[],[]]}"#, "increasing"),
        (r#"{"format":"pacpriv-subsets/v1","n":2,"m":4,"subsets":[[0,0],[1],[1],[]]}"#, "increasing"),
        (r#"{"format":"pacpriv-subsets/v1","n":2,"m":2,"subsets":[[0],[1]],"x":1}"#, "unknown field"),
        (r#"{"format":"pacpriv-subsets/v1","n":2,"m":2}"#, "missing field"),
        (r#"{"format":"pacpriv-subsets/v1","n":2,"m":2,"subsets":[[0],[-1]]}"#, "invalid value"),
        // A short file must not make us allocate n·m/2 entries.
        (r#"{"format":"pacpriv-subsets/v1","n":1000000000000,"m":2,"subsets":[[],[]]}"#, "n·m/2"),
        (r#"{"format":"pacpriv-subsets/v1","n":18446744073709551615,"m":4,"subsets":[[],[],[],[]]}"#, "too large"),
    ];
    for (json, needle) in cases {
        match serde_json::from_str::<Assignment>(json) {
            Ok(_) => panic!("accepted {json}"),
            Err(e) => assert!(e.to_string().contains(needle), "{json}: {e} (expected {needle:?})"),
        }
    }
}
