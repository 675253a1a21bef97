use super::*;
use ndarray::array;
use proptest::prelude::*;

const G: f64 = PUBLISHED_GRID;

#[test]
fn ties_round_up_toward_plus_infinity() {
    assert_eq!(q(0.5 * G, PUBLISHED_CLAMP), G);
    assert_eq!(q(-0.5 * G, PUBLISHED_CLAMP), 0.0);
    assert_eq!(q(1.5 * G, PUBLISHED_CLAMP), 2.0 * G);
    assert_eq!(q(-1.5 * G, PUBLISHED_CLAMP), -G);
    assert_eq!(q(1.0 + 0.5 * G, PUBLISHED_CLAMP), 1.0 + G);
    assert_eq!(q(-1.0 - 0.5 * G, PUBLISHED_CLAMP), -1.0);
    // Just below a tie rounds down, although ⌊t + ½⌋ in floating point
    // would round t + ½ = 1 − 2⁻⁵⁴ up to 1.
    assert_eq!(q((0.5 - 2f64.powi(-54)) * G, PUBLISHED_CLAMP), 0.0);
    assert_eq!(q((-0.5 - 2f64.powi(-53)) * G, PUBLISHED_CLAMP), -G);
    // No negative zero leaves.
    assert_eq!(q(-0.25 * G, PUBLISHED_CLAMP).to_bits(), 0.0f64.to_bits());
    assert_eq!(q(-0.0, PUBLISHED_CLAMP).to_bits(), 0.0f64.to_bits());
}

#[test]
fn clamps_and_maps_nan_to_zero() {
    let p = to_grid(array![1.0 + 1e-12, -0.3, 5e6, -7e9, 0.0, f64::NAN].view());
    assert_eq!(p[0], 1.0);
    assert!((p[1] + 0.3).abs() <= G / 2.0);
    assert_eq!((p[2], p[3], p[4], p[5]), (PUBLISHED_CLAMP, -PUBLISHED_CLAMP, 0.0, 0.0));
}

#[test]
fn publish_at_the_clamp_does_not_name_the_centre() {
    // Far beyond the clamp the centre's 1 must vanish: ±2²⁰ + 1 would say
    // which coordinate held it.
    let z = array![5e6, 5e6, -5e6];
    for y in 0..3 {
        let mut c = array![0.0, 0.0, 0.0];
        c[y] = 1.0;
        assert_eq!(publish(c.view(), &z), vec![PUBLISHED_CLAMP, PUBLISHED_CLAMP, -PUBLISHED_CLAMP]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Q is the nearest grid point, ties up, and lands on the grid.
    #[test]
    fn q_is_the_nearest_grid_point_ties_up(k in -(1i64 << 52)..(1i64 << 52), frac in 0.0f64..1.0) {
        let x = (k as f64 + frac) * G;
        let got = q(x, 2.0 * PUBLISHED_CLAMP);
        let exact_frac = x / G - k as f64; // x / G is exact; so is this difference for |k| < 2⁵²
        let want = if exact_frac >= 0.5 { (k + 1) as f64 * G } else { k as f64 * G };
        prop_assert_eq!(got, want);
        prop_assert_eq!((got / G).fract(), 0.0);
    }

    /// Q(g + z) = g + Q(z) for grid g, ties included: exactly the identity
    /// `publish` relies on.
    #[test]
    fn q_commutes_with_grid_translations(
        g in -(1i64 << 40)..(1i64 << 40),
        zk in -(1i64 << 40)..(1i64 << 40),
        half in prop_oneof![Just(0.0), Just(0.5), (0u32..256).prop_map(|k| f64::from(k) / 256.0)],
    ) {
        // |g + z| < 2⁴¹ grid steps with 8 bits below: every sum is exact.
        let (g, z) = (g as f64 * G, (zk as f64 + half) * G);
        prop_assert_eq!(q(g + z, 2.0 * PUBLISHED_CLAMP), g + q(z, 2.0 * PUBLISHED_CLAMP));
    }

    /// `publish` is Q of the exact release for centres on the grid: where
    /// centre + z is exact (multiples of 2⁻³³ below 2²⁰) the two agree.
    #[test]
    fn publish_is_q_of_the_exact_release(
        zs in proptest::collection::vec(-(1i64 << 52)..(1i64 << 52), 4),
        cs in proptest::collection::vec(-(1i64 << 51)..(1i64 << 51), 4),
    ) {
        let z = Array1::from_iter(zs.iter().map(|&k| k as f64 * 2f64.powi(-33)));
        let c = Array1::from_iter(cs.iter().map(|&k| k as f64 * G));
        let p = publish(c.view(), &z);
        for j in 0..4 {
            prop_assert_eq!(p[j], q(c[j] + z[j], PUBLISHED_CLAMP), "coordinate {}", j);
        }
    }

    /// The grid's ⌊·⌋ (branch-free, through 2⁵²) is libm's, but for the
    /// sign of a zero: on any bit pattern, on integers and fractions near 0,
    /// and at the edges where the rounding through 2⁵² could err.
    #[test]
    fn floor_is_libms_floor_up_to_the_sign_of_zero(bits in any::<u64>(), small in -1e7f64..1e7) {
        let p52 = 4_503_599_627_370_496.0;
        let edges = [p52 - 0.5, p52 - 1.0, p52, p52 + 2.0, p52 / 2.0 + 0.5, p52 / 2.0 - 0.5, 0.5, 1.5, 2.5, -0.0, f64::from_bits(1)];
        let signed = edges.into_iter().flat_map(|e| [e, -e]);
        for t in [f64::from_bits(bits), small, small.trunc(), -small.trunc(), small * 4_294_967_296.0].into_iter().chain(signed) {
            if t.is_nan() {
                continue;
            }
            let (ours, libm) = (super::floor(t), t.floor());
            prop_assert!(ours == libm, "⌊{t:e}⌋: {ours:e} against {libm:e}");
        }
    }

    /// Two releases that differ only below the grid publish the same vector.
    #[test]
    fn bits_below_the_grid_never_leave(x in -1000.0f64..1000.0, tiny in -1e-13f64..1e-13) {
        let snapped = q(x, PUBLISHED_CLAMP);
        prop_assert!((snapped - x).abs() <= G / 2.0);
        prop_assert_eq!(q(snapped + tiny, PUBLISHED_CLAMP), snapped);
    }
}
