use super::*;
use proptest::prelude::*;

fn nats(x: f64) -> Nats {
    Nats::new(x).expect("test values are valid")
}

/// b = 2⁻⁴, 2⁻⁸, …, 2⁻³²: the columns of Table 1.
fn table_columns() -> [Nats; 8] {
    [4, 8, 12, 16, 20, 24, 28, 32].map(|k| nats(2f64.powi(-k)))
}

/// `value` rounded to `decimals` places, as the paper prints it.
fn rounded(value: f64, decimals: usize) -> String {
    format!("{value:.decimals$}")
}

fn pct(s: f64) -> f64 {
    100.0 * s
}

fn rel_err(got: f64, want: f64) -> f64 {
    ((got - want) / want).abs()
}

/// Paper Table 1, rows T = 1, 10, …, 10⁶; "100" is a saturated bound.
const TABLE_1: [(u64, [&str; 8]); 7] = [
    (1, ["67.5", "54.4", "51.1", "50.3", "50.07", "50.02", "50.00", "50.00"]),
    (10, ["98.7", "63.9", "53.5", "50.9", "50.22", "50.05", "50.01", "50.00"]),
    (100, ["100", "91.0", "61.0", "52.8", "50.69", "50.17", "50.04", "50.01"]),
    (1_000, ["100", "100", "83.4", "58.7", "52.18", "50.55", "50.14", "50.03"]),
    (10_000, ["100", "100", "100", "76.9", "56.89", "51.73", "50.43", "50.11"]),
    (100_000, ["100", "100", "100", "100", "71.48", "55.45", "51.36", "50.34"]),
    (1_000_000, ["100", "100", "100", "100", "100", "67.09", "54.31", "51.08"]),
];

/// Table 1, "T s.t. ε ≤ 1" and "T s.t. ε ≤ 8": exact counts (NOTES.md) and
/// the paper's printed form.
const EPS_1: [(u64, &str); 8] = [
    (1, "1"),
    (28, "28"),
    (454, "454"),
    (7_271, "7K"),
    (116_336, "116K"),
    (1_861_377, "2M"),
    (29_782_044, "30M"),
    (476_512_710, "477M"),
];
const EPS_8: [(u64, &str); 8] = [
    (11, "11"),
    (176, "176"),
    (2_826, "3K"),
    (45_228, "45K"),
    (723_652, "724K"),
    (11_578_443, "12M"),
    (185_255_092, "185M"),
    (2_964_081_484, "3B"),
];

#[test]
fn table_1_mia_bounds_digit_for_digit() -> Result<(), PrivacyError> {
    for (t, row) in TABLE_1 {
        for (b, want) in table_columns().into_iter().zip(row) {
            let s = mia_bound(mul_up(t, b)?);
            if want == "100" {
                // Every "100" in the table is a truly saturated bound (T·b ≥ ln 2).
                assert_eq!(s, 1.0, "T = {t}, b = {b}: expected saturation");
            } else {
                let decimals = want.split_once('.').map_or(0, |(_, frac)| frac.len());
                assert_eq!(rounded(pct(s), decimals), want, "T = {t}, b = {b}: bound {}", pct(s));
            }
        }
    }
    Ok(())
}

#[test]
fn table_1_epsilon_rows_exact() -> Result<(), PrivacyError> {
    for (eps, row) in [(1.0, EPS_1), (8.0, EPS_8)] {
        for (b, (want, _)) in table_columns().into_iter().zip(row) {
            assert_eq!(max_queries_for_epsilon(b, eps)?, want, "ε = {eps}, b = {b}");
            // The answer really is the boundary of the MIA comparison.
            let target = mia_of_epsilon(eps);
            assert!(mia_bound(mul_up(want, b)?) <= target.next_up());
            assert!(mia_bound(mul_up(want + 1, b)?) > target);
        }
    }
    Ok(())
}

#[test]
fn compact_count_prints_table_1() {
    for (n, want) in EPS_1.into_iter().chain(EPS_8) {
        assert_eq!(compact_count(n), want);
    }
    assert_eq!(compact_count(0), "0");
    assert_eq!(compact_count(999), "999");
    assert_eq!(compact_count(1_000), "1K");
    assert_eq!(compact_count(999_499), "999K");
    assert_eq!(compact_count(999_500), "1M");
    assert_eq!(compact_count(1_500), "2K");
    assert_eq!(compact_count(2_000_000_000_000), "2T");
    assert_eq!(compact_count(u64::MAX), "18446744T");
}

#[test]
fn paper_section_3_values() -> Result<(), PrivacyError> {
    // b = 2⁻³², T = 10⁶ → 51.08 %, ε ≈ 0.04 (0.0431 to 4 decimals; abstract).
    let s = mia_bound(mul_up(1_000_000, nats(2f64.powi(-32)))?);
    assert_eq!(rounded(pct(s), 2), "51.08");
    assert_eq!(rounded(epsilon_equivalent(s), 4), "0.0431");
    // b = 2⁻⁸: 54.42 % and ε ≈ 0.18 after one response, 91 % and ε ≈ 2.31 after 100.
    let b = nats(2f64.powi(-8));
    let s1 = mia_bound(b);
    assert_eq!(rounded(pct(s1), 2), "54.42");
    assert_eq!(rounded(epsilon_equivalent(s1), 2), "0.18");
    let s100 = mia_bound(mul_up(100, b)?);
    assert_eq!(rounded(pct(s100), 1), "91.0");
    assert_eq!(rounded(epsilon_equivalent(s100), 2), "2.31");
    // b = 2⁻³² supports ≈ 477 million responses before matching (1, 10⁻⁵)-DP.
    assert_eq!(compact_count(max_queries_for_epsilon(nats(2f64.powi(-32)), 1.0)?), "477M");
    Ok(())
}

#[test]
fn paper_section_2_2_values() {
    // B = 2⁻¹⁰ → 52.21 %.
    assert_eq!(rounded(pct(mia_bound(nats(2f64.powi(-10)))), 2), "52.21");
    // B = 2⁻² → the paper prints 83.78 %; the root is 83.7893… %, which the
    // paper truncated (rounding gives 83.79; Table 1 and Table 4 round).
    let s = pct(mia_bound(nats(0.25)));
    assert_eq!(rounded(s, 2), "83.79");
    assert_eq!((s * 100.0).floor() / 100.0, 83.78);
    // B = 2⁻³² → ≈ 50.001 %.
    assert_eq!(rounded(pct(mia_bound(nats(2f64.powi(-32)))), 3), "50.001");
    // (1, 10⁻⁵)-DP ↔ 73.11 %, (0.1, 10⁻⁵)-DP ↔ 52.50 %.
    assert_eq!(rounded(pct(mia_of_epsilon(1.0)), 2), "73.11");
    assert_eq!(rounded(pct(mia_of_epsilon(0.1)), 2), "52.50");
}

#[test]
fn kl_matches_high_precision_references() {
    // kl(½ + x) for exactly representable x, from 40-digit arithmetic (mpmath),
    // rounded to the nearest f64.
    let references = [
        (1e-8, 2.0000000000000002e-16),
        (1e-3, 2.000001333335467e-06),
        (0.0499999, 0.005008346779307493),
        (0.05, 0.005008366846356838),
        (0.1, 0.020135513550688877),
        (0.25, 0.13081203594113697),
        (0.4999, 0.6921261515229145),
    ];
    for (x, want) in references {
        let got = kl_of_offset(x);
        assert!(rel_err(got, want) < 1e-14, "kl(½ + {x}) = {got}, want {want}");
        assert_eq!(kl_of_offset(-x), got, "symmetric");
    }
}

#[test]
fn kl_edges_and_series_switch() {
    assert_eq!(kl_from_half(0.5), 0.0);
    assert_eq!(kl_from_half(1.0), LN_2);
    assert_eq!(kl_from_half(0.0), LN_2);
    assert!(kl_from_half(1.5).is_nan());
    assert!(kl_from_half(f64::NAN).is_nan());
    // Tiny offsets: kl ≈ 2x², no cancellation down to subnormal x².
    assert!(rel_err(kl_of_offset(1e-150), 2e-300) < 1e-15);
    // The two formulas agree where they meet.
    let below = kl_of_offset(SERIES_BELOW.next_down());
    let above = kl_of_offset(SERIES_BELOW);
    assert!(below <= above && rel_err(below, above) < 1e-14);
}

#[test]
fn mia_bound_saturates_and_starts_at_half() {
    assert_eq!(mia_bound(Nats::ZERO), 0.5);
    assert_eq!(mia_bound(nats(LN_2)), 1.0);
    assert_eq!(mia_bound(nats(10.0)), 1.0);
    // Just below ln 2 the root is within 10⁻¹⁷ of 1: rounding up gives 1.
    assert_eq!(mia_bound(nats(LN_2.next_down())), 1.0);
    assert!(mia_bound(nats(LN_2 - 1e-8)) < 1.0);
    assert!(mia_bound(nats(f64::from_bits(1))) > 0.5, "a subnormal budget still rounds up");
}

#[test]
fn epsilon_equivalent_edges() {
    assert_eq!(epsilon_equivalent(0.5), 0.0);
    // Below ½ + δ/2 the naive ln((s−δ)/(1−s)) is negative.
    assert_eq!(epsilon_equivalent(0.5 + DELTA / 4.0), 0.0);
    assert!(epsilon_equivalent(mia_of_epsilon(0.0)) < 1e-15);
    assert_eq!(epsilon_equivalent(0.3), 0.0);
    assert_eq!(epsilon_equivalent(1.0), f64::INFINITY);
    assert!(epsilon_equivalent(f64::NAN).is_nan());
    assert_eq!(mia_of_epsilon(0.0), 0.5 + DELTA / 2.0);
    assert_eq!(mia_of_epsilon(-3.0), mia_of_epsilon(0.0));
    assert_eq!(mia_of_epsilon(f64::INFINITY), 1.0);
    assert!(mia_of_epsilon(f64::NAN).is_nan());
}

#[test]
fn max_queries_rounds_the_product_up() {
    assert_eq!(max_queries(nats(0.25), nats(1.0)), 4, "exact products fit exactly");
    // 3 × 0.1 rounds to 0.30000000000000004 > 0.3: the third query does not fit.
    assert_eq!(max_queries(nats(0.1), nats(0.3)), 2);
    assert_eq!(max_queries(nats(0.1), Nats::ZERO), 0);
    assert_eq!(max_queries(nats(2.0), nats(1.0)), 0);
    assert_eq!(max_queries(Nats::ZERO, nats(1.0)), u64::MAX);
    assert_eq!(max_queries(nats(f64::MIN_POSITIVE), nats(f64::MAX)), u64::MAX);
}

#[test]
fn target_domain_errors() {
    let b = nats(2f64.powi(-32));
    for mia in [0.49, 1.0, 1.2, f64::NAN, -0.5] {
        assert!(
            matches!(max_queries_for_mia(b, mia), Err(PrivacyError::Domain(_))),
            "target MIA {mia} should be rejected"
        );
    }
    for eps in [-1.0, f64::NAN, f64::INFINITY, 40.0] {
        assert!(
            matches!(max_queries_for_epsilon(b, eps), Err(PrivacyError::Domain(_))),
            "target ε {eps} should be rejected"
        );
    }
    assert_eq!(max_queries_for_mia(b, 0.5), Ok(0));
    assert!(max_queries_for_epsilon(b, 0.0).is_ok());
}

/// B log-uniform over [10⁻²⁰, ln 2).
fn budget() -> impl Strategy<Value = f64> {
    (1e-20f64.ln()..LN_2.ln()).prop_map(f64::exp).prop_filter("below ln 2", |&b| b < LN_2)
}

proptest! {
    #[test]
    fn mia_bound_is_monotone(b1 in budget(), b2 in budget()) {
        let (lo, hi) = if b1 <= b2 { (b1, b2) } else { (b2, b1) };
        prop_assert!(mia_bound(nats(lo)) <= mia_bound(nats(hi)));
    }

    #[test]
    fn mia_bound_is_monotone_for_close_budgets(b in budget(), r in 0.0f64..1e-6) {
        prop_assert!(mia_bound(nats(b)) <= mia_bound(nats(b * (1.0 + r))));
    }

    /// Newton's bracket changes where the bisection starts, not the bound:
    /// the same s as bisecting all of [0, ½], for B from 10⁻³⁰⁰ up to ln 2,
    /// where the bracket is widest. (Above x ≈ 0.05 the crossing in x may
    /// differ by a few ulps of x, where the KL's rounding is not monotone;
    /// settled on the grid of s, it is the same.)
    #[test]
    fn the_newton_bracket_finds_the_bisections_bound(e in -300.0f64..LN_2.log10(), near_ln2 in 0.0f64..1e-3) {
        for b in [10f64.powf(e), LN_2 * (1.0 - near_ln2)] {
            if b < LN_2 {
                prop_assert_eq!(mia_bound(nats(b)), on_grid_of_s(b, bisect(b, 0.0, 0.5)), "B = {:e}", b);
            }
        }
    }

    /// The bisection solves kl(½ + x) = B to full precision in x.
    #[test]
    fn advantage_inverts_kl(b in budget()) {
        let x = advantage(b);
        prop_assert!(rel_err(kl_of_offset(x), b) < 1e-9, "B = {b:e}, x = {x:e}");
        prop_assert!(kl_of_offset(x) >= b && kl_of_offset(x.next_down()) < b);
    }

    /// The returned s is the smallest double whose kl reaches B: never below
    /// the real root, at most one ulp of s above it.
    #[test]
    fn mia_bound_is_the_rounded_up_root(b in budget()) {
        let s = mia_bound(nats(b));
        prop_assert!(kl_from_half(s) >= b);
        prop_assert!(kl_from_half(s.next_down()) < b);
    }

    /// kl(mia_bound(B)) ≈ B to 10⁻⁹ wherever the f64 grid of s allows it: near
    /// ½ its spacing 1.1·10⁻¹⁶ alone moves kl ≈ 2x² by a relative 2.2·10⁻¹⁶/x,
    /// which exceeds 10⁻⁹ once B ≲ 10⁻¹³ (covered by `advantage_inverts_kl`).
    #[test]
    fn kl_inverts_mia_bound(b in (1e-12f64.ln()..LN_2.ln()).prop_map(f64::exp)) {
        prop_assume!(b < LN_2);
        let s = mia_bound(nats(b));
        prop_assert!(rel_err(kl_from_half(s), b) < 1e-9, "B = {b:e}, s = {s}");
    }

    #[test]
    fn epsilon_round_trip(eps in prop_oneof![0.0f64..15.0, (1e-12f64.ln()..0.0).prop_map(f64::exp)]) {
        let back = epsilon_equivalent(mia_of_epsilon(eps));
        prop_assert!((back - eps).abs() <= 1e-9 * eps + 1e-12, "ε = {eps:e} came back as {back:e}");
    }

    /// T·b ≤ target < (T+1)·b with the products rounded up.
    #[test]
    fn max_queries_invariant(
        b in (1e-12f64.ln()..0.0).prop_map(f64::exp),
        k in 4i32..=32,
        use_power_of_two in any::<bool>(),
        target in 0.0f64..10.0,
    ) {
        let b = nats(if use_power_of_two { 2f64.powi(-k) } else { b });
        let target = nats(target);
        let t = max_queries(b, target);
        prop_assert!(mul_up(t, b).expect("finite") <= target);
        prop_assert!(t == u64::MAX || mul_up(t + 1, b).expect("finite") > target);
        prop_assert!(t as f64 * b.get() <= target.get() * (1.0 + 1e-15));
    }
}
