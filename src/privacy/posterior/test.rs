use super::*;
use ndarray::{Array1, array};
use proptest::prelude::*;

#[test]
fn uniform_is_normalised() -> Result<(), PrivacyError> {
    let p = Posterior::uniform(128)?;
    assert!((p.weights().sum() - 1.0).abs() < 1e-12);
    assert!(Posterior::uniform(0).is_err());
    Ok(())
}

#[test]
fn log_sum_exp_handles_extremes() {
    assert_eq!(log_sum_exp([0.0f64; 0]), f64::NEG_INFINITY);
    assert!((log_sum_exp([1000.0, 1000.0]) - (1000.0 + 2f64.ln())).abs() < 1e-12);
    assert!((log_sum_exp([-1000.0, -1000.0]) - (-1000.0 + 2f64.ln())).abs() < 1e-12);
    assert_eq!(log_sum_exp([-1e300, 0.0]), 0.0);
}

#[test]
fn update_is_bayes_rule() -> Result<(), PrivacyError> {
    let mut p = Posterior::uniform(3)?;
    p.update(array![0.0, 2f64.ln(), 3f64.ln()].view())?;
    let w = p.weights();
    for (got, want) in w.iter().zip([1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0]) {
        assert!((got - want).abs() < 1e-15);
    }
    Ok(())
}

#[test]
fn weights_far_below_underflow_stay_in_the_support() -> Result<(), PrivacyError> {
    let mut p = Posterior::from_log_weights(vec![0.0, -1e6, -5000.0])?;
    // The update that favours the vanishing subset brings it back exactly.
    p.update(array![0.0, 1e6, 0.0].view())?;
    assert!((p.log_weights()[0] - p.log_weights()[1]).abs() < 1e-9);
    assert!(p.log_weights().iter().all(|x| x.is_finite()));
    Ok(())
}

#[test]
fn bad_input_leaves_posterior_unchanged() -> Result<(), PrivacyError> {
    let mut p = Posterior::uniform(2)?;
    let before = p.clone();
    assert!(p.update(array![0.0, f64::NAN].view()).is_err());
    assert!(p.update(array![0.0, f64::INFINITY].view()).is_err());
    assert!(p.update(array![0.0].view()).is_err());
    assert!(p.update(array![f64::NEG_INFINITY, f64::NEG_INFINITY].view()).is_err(), "no subset left");
    assert_eq!(p, before);
    assert!(Posterior::from_log_weights(vec![f64::NEG_INFINITY, f64::NEG_INFINITY]).is_err());
    assert!(Posterior::from_log_weights(vec![0.0, f64::INFINITY]).is_err());
    assert!(Posterior::from_log_weights(vec![0.0, f64::NAN]).is_err());
    Ok(())
}

/// Eq. 4 saturates a log-weight that overflows to −∞ (weight 0) instead of
/// failing after the draw: the other weights are updated exactly, the
/// result is normalised, and it survives a store round trip.
#[test]
fn overflowing_log_weights_saturate_to_minus_infinity() -> Result<(), PrivacyError> {
    let mut p = Posterior::from_log_weights(vec![0.0, -1.7e308, -1.0])?;
    p.update(array![-0.5, -1e308, -0.5].view())?;
    let lw = p.log_weights().to_vec();
    assert_eq!(lw[1], f64::NEG_INFINITY);
    assert!((lw[0] - lw[2] - 1.0).abs() < 1e-15);
    assert!(log_sum_exp(lw.iter().copied()).abs() < 1e-15);
    assert_eq!(Posterior::restore(lw.clone())?, p);
    assert_eq!(Posterior::from_log_weights(vec![0.0, f64::NEG_INFINITY])?.weights()[1], 0.0);
    // A saturated subset stays out whatever later likelihoods say.
    p.update(array![-3.0, 0.0, -3.0].view())?;
    assert_eq!(p.log_weights()[1], f64::NEG_INFINITY);
    Ok(())
}

#[test]
fn restore_is_bit_exact_and_refuses_unnormalised_weights() -> Result<(), PrivacyError> {
    let mut p = Posterior::uniform(5)?;
    p.update(ndarray::array![0.3, -1.7, 2.2, -1e3, 0.1].view())?;
    let restored = Posterior::restore(p.log_weights().to_vec())?;
    assert_eq!(restored, p);
    assert!(Posterior::restore(vec![0.0, 0.0]).is_err());
    assert!(Posterior::restore(vec![f64::NEG_INFINITY, f64::NEG_INFINITY]).is_err());
    assert!(Posterior::restore(vec![f64::NAN, 0.0]).is_err());
    Ok(())
}

#[test]
fn groups_are_numbered_by_first_appearance() {
    let g = Groups::by_key(&[7, 3, 7, 9, 3]);
    assert_eq!(g.of(), [0, 1, 0, 2, 1]);
    assert_eq!(g.count(), 3);
    assert_eq!(Groups::by_key::<u8>(&[]).count(), 0);
}

#[test]
fn update_rule_codes_round_trip_and_unknown_ones_are_refused() {
    for rule in [UpdateRule::PerSubset, UpdateRule::Grouped] {
        assert_eq!(UpdateRule::from_code(rule.code()), Some(rule));
    }
    assert_eq!(UpdateRule::default().code(), 0, "entries without the field were per-subset");
    assert_eq!(UpdateRule::from_code(2), None);
}

/// A group whose weights all underflow relative to the largest weight must
/// still be renormalised from its own largest weight, not dropped: here it
/// is the only one the release favours.
#[test]
fn grouped_update_keeps_groups_far_below_the_largest_weight() -> Result<(), PrivacyError> {
    let start = Posterior::from_log_weights(vec![0.0, -800.0, -801.0])?;
    let mut grouped = start.clone();
    grouped.update_grouped(&Groups::by_key(&[0, 1, 1]), array![-1000.0, 0.0, 0.0].view())?;
    let mut legacy = start;
    legacy.update(array![-1000.0, 0.0, 0.0].view())?;
    // Both rules round ℓ + log w − L at magnitude 10³: ulps of 10³ apart.
    for (g, l) in grouped.log_weights().iter().zip(legacy.log_weights()) {
        assert!((g - l).abs() < 1e-12, "{g} vs {l}");
    }
    assert!(log_sum_exp(grouped.log_weights().iter().copied()).abs() < 1e-12);
    Ok(())
}

#[test]
fn grouped_update_refuses_what_the_per_subset_rule_refuses() -> Result<(), PrivacyError> {
    let mut p = Posterior::from_log_weights(vec![0.0, -1.0, f64::NEG_INFINITY])?;
    let before = p.clone();
    let groups = Groups::by_key(&[0, 1, 2]);
    assert!(p.update_grouped(&groups, array![0.0, f64::NAN, 0.0].view()).is_err());
    assert!(p.update_grouped(&groups, array![0.0, f64::INFINITY, 0.0].view()).is_err());
    assert!(p.update_grouped(&groups, array![0.0, 0.0].view()).is_err());
    assert!(matches!(
        p.update_grouped(&Groups::by_key(&[0, 1]), array![0.0, 0.0, 0.0].view()),
        Err(PrivacyError::TeacherCount { posterior: 3, teachers: 2 })
    ));
    let none_left = array![f64::NEG_INFINITY, f64::NEG_INFINITY, 0.0];
    assert!(p.update_grouped(&groups, none_left.view()).is_err(), "no subset left");
    // One group, two likelihoods: not a grouped step.
    assert!(p.update_grouped(&Groups::by_key(&[0, 1, 1]), array![0.0, -1.0, -2.0].view()).is_err());
    let pairs = Groups::by_key(&[0, 1, 1]);
    assert!(p.update_groups(&pairs, &[0.0], &p.group_log_masses(&pairs)).is_err());
    assert_eq!(p, before);
    // A subset already at weight 0 stays there; the rest renormalise.
    p.update_grouped(&groups, array![-1.0, 0.0, 0.0].view())?;
    assert_eq!(p.log_weights()[2], f64::NEG_INFINITY);
    assert!((p.log_weights()[0] - p.log_weights()[1]).abs() < 1e-15);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// The grouped rule is Bayes' rule: it agrees with log-sum-exp over
    /// every subset to rounding, the result is normalised, and weights at 0
    /// stay at 0 — for weights over 300 orders of magnitude and
    /// log-likelihoods from 0 to −10⁶.
    #[test]
    fn grouped_update_agrees_with_the_per_subset_rule(
        (log_w, key, lik) in (1usize..=128, 1usize..=8).prop_flat_map(|(m, k)| (
            proptest::collection::vec(proptest::prop_oneof![-690.0f64..0.0, Just(0.0), Just(f64::NEG_INFINITY)], m),
            proptest::collection::vec(0..k, m),
            proptest::collection::vec(proptest::prop_oneof![-1e6f64..0.0, -40.0f64..0.0, Just(0.0)], k),
        ))
    ) {
        proptest::prop_assume!(log_w.iter().any(|x| x.is_finite()));
        let start = Posterior::from_log_weights(log_w)?;
        let start_lw = start.log_weights().to_vec();
        let ll: Array1<f64> = key.iter().map(|&g| lik[g]).collect();
        let mut grouped = start.clone();
        grouped.update_grouped(&Groups::by_key(&key), ll.view())?;
        let mut legacy = start;
        legacy.update(ll.view())?;
        // Both rules round log w + ℓ − L at the magnitude of its terms.
        let largest = |xs: &mut dyn Iterator<Item = f64>| xs.filter(|x| x.is_finite()).fold(0.0f64, |a, x| a.max(x.abs()));
        let scale = 1.0 + largest(&mut lik.iter().copied()) + largest(&mut start_lw.iter().copied());
        for (g, l) in grouped.log_weights().iter().zip(legacy.log_weights()) {
            prop_assert!(g == l || (g - l).abs() <= 1e-14 * scale, "{} vs {}", g, l);
        }
        prop_assert!(log_sum_exp(grouped.log_weights().iter().copied()).abs() <= 1e-14 * scale);
    }
}
