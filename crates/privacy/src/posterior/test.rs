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
    assert_eq!(Posterior::restore(Form::Log(lw.clone()))?, p);
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
    assert!(matches!(p.form(), Form::Log(_)));
    assert_eq!(Posterior::restore(p.form().clone())?, p);
    assert!(Posterior::restore(Form::Log(vec![0.0, 0.0])).is_err());
    assert!(Posterior::restore(Form::Log(vec![f64::NEG_INFINITY, f64::NEG_INFINITY])).is_err());
    assert!(Posterior::restore(Form::Log(vec![f64::NAN, 0.0])).is_err());
    assert!(Posterior::restore(Form::Log(vec![])).is_err());
    Ok(())
}

#[test]
fn restore_keeps_linear_weights_as_they_are_and_refuses_impossible_ones() -> Result<(), PrivacyError> {
    let mut p = Posterior::uniform(4)?;
    p.update_by(UpdateRule::Linear, &[0, 0, 1, 2], array![-0.25, -0.25, -3.0, -1e-9].view())?;
    let Form::Linear(w) = p.form().clone() else { panic!("a linear step leaves linear weights") };
    assert_eq!(Posterior::restore(Form::Linear(w))?, p);
    // Linear weights need not sum to 1, only be a posterior up to a factor.
    assert!(Posterior::restore(Form::Linear(vec![3.0, 0.0, 1e-300]))?.weights()[0] > 0.99);
    let too_big = vec![f64::MAX, f64::MAX];
    for bad in [vec![], vec![0.0, 0.0], vec![1.0, -1e-300], vec![1.0, f64::NAN], vec![f64::INFINITY, 1.0], too_big] {
        assert!(Posterior::restore(Form::Linear(bad.clone())).is_err(), "{bad:?}");
    }
    Ok(())
}

#[test]
fn forms_round_trip_through_their_two_fields() {
    for form in [Form::Log(vec![-0.5, f64::NEG_INFINITY]), Form::Linear(vec![1.0, 0.0])] {
        let (log_w, w) = form.to_fields();
        let back = Form::from_fields(log_w, w).expect("one field holds numbers");
        assert!(back.same_bits(&form));
    }
    assert_eq!(Form::from_fields(vec![], vec![]), None);
    assert_eq!(Form::from_fields(vec![0.0], vec![1.0]), None);
    assert!(!Form::Log(vec![0.0]).same_bits(&Form::Linear(vec![0.0])));
    assert!(!Form::Linear(vec![0.0]).same_bits(&Form::Linear(vec![-0.0])));
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
    for rule in [UpdateRule::PerSubset, UpdateRule::Grouped, UpdateRule::Linear] {
        assert_eq!(UpdateRule::from_code(rule.code()), Some(rule));
    }
    assert_eq!(UpdateRule::default().code(), 0, "entries without the field were per-subset");
    assert_eq!(UpdateRule::from_code(3), None);
}

/// A group whose weights all underflow relative to the largest weight must
/// still be renormalised from its own largest weight, not dropped: here it
/// is the only one the release favours.
#[test]
fn grouped_update_keeps_groups_far_below_the_largest_weight() -> Result<(), PrivacyError> {
    let start = Posterior::from_log_weights(vec![0.0, -800.0, -801.0])?;
    let mut grouped = start.clone();
    grouped.update_by(UpdateRule::Grouped, &[0, 1, 1], array![-1000.0, 0.0, 0.0].view())?;
    let mut legacy = start;
    legacy.update(array![-1000.0, 0.0, 0.0].view())?;
    // Both rules round ℓ + log w − L at magnitude 10³: ulps of 10³ apart.
    for (g, l) in grouped.log_weights().iter().zip(legacy.log_weights()) {
        assert!((g - l).abs() < 1e-12, "{g} vs {l}");
    }
    assert!(log_sum_exp(grouped.log_weights().iter().copied()).abs() < 1e-12);
    Ok(())
}

/// In linear form a group e⁻⁷⁰⁰ below the largest weight is still
/// there, and comes back exactly as Bayes' rule says when the release
/// favours it; one below 2⁻¹⁰⁷⁴ of the largest is 0 (saturated).
#[test]
fn linear_update_keeps_groups_far_below_the_largest_weight() -> Result<(), PrivacyError> {
    let start = Posterior::from_log_weights(vec![0.0, -700.0, -701.0, -800.0])?;
    let ll = array![-1000.0, 0.0, 0.0, 0.0];
    let mut linear = start.clone();
    linear.update_by(UpdateRule::Linear, &[0, 1, 1, 2], ll.view())?;
    let mut legacy = start;
    legacy.update(ll.view())?;
    let (lin, log) = (linear.log_weights(), legacy.log_weights());
    for i in 0..3 {
        assert!((lin[i] - log[i]).abs() < 1e-11, "{i}: {} vs {}", lin[i], log[i]);
    }
    assert_eq!(lin[3], f64::NEG_INFINITY, "e⁻⁸⁰⁰ of the largest weight is below 2⁻¹⁰⁷⁴");
    assert!((linear.weights().sum() - 1.0).abs() < 1e-15);
    let Form::Linear(w) = linear.form() else { panic!("a linear step leaves linear weights") };
    let largest = w.iter().copied().fold(0.0, f64::max);
    assert!((0.25..=1.0 + 1e-12).contains(&largest), "the largest new weight is in [1/m, 1]: {w:?}");
    Ok(())
}

#[test]
fn grouped_updates_refuse_what_the_per_subset_rule_refuses() -> Result<(), PrivacyError> {
    for rule in [UpdateRule::Grouped, UpdateRule::Linear] {
        let mut p = Posterior::from_log_weights(vec![0.0, -1.0, f64::NEG_INFINITY])?;
        let before = p.clone();
        let keys = [0, 1, 2];
        assert!(p.update_by(rule, &keys, array![0.0, f64::NAN, 0.0].view()).is_err());
        assert!(p.update_by(rule, &keys, array![0.0, f64::INFINITY, 0.0].view()).is_err());
        assert!(p.update_by(rule, &keys, array![0.0, 0.0].view()).is_err());
        assert!(matches!(
            p.update_by(rule, &[0, 1], array![0.0, 0.0, 0.0].view()),
            Err(PrivacyError::TeacherCount { posterior: 3, teachers: 2 })
        ));
        // One group, two likelihoods: not a grouped step.
        assert!(p.update_by(rule, &[0, 1, 1], array![0.0, -1.0, -2.0].view()).is_err());
        let pairs = Groups::by_key(&[0, 1, 1]);
        assert!(p.update_linear(&pairs, &[0.0], &p.group_masses(&pairs)).is_err());
        assert!(p.update_linear(&pairs, &[0.0, 0.0], &[1.0]).is_err());
        assert_eq!(p, before, "{rule:?}");
        // A subset already at weight 0 stays there; the rest renormalise.
        p.update_by(rule, &keys, array![-1.0, 0.0, 0.0].view())?;
        let lw = p.log_weights();
        assert_eq!(lw[2], f64::NEG_INFINITY, "{rule:?}");
        assert!((lw[0] - lw[1]).abs() < 1e-15, "{rule:?}");
    }
    // Every subset with weight ruled out: the grouped rule refuses; the
    // linear one, which runs after the draw, keeps the weights.
    let none_left = array![f64::NEG_INFINITY, f64::NEG_INFINITY, 0.0];
    let mut p = Posterior::from_log_weights(vec![0.0, -1.0, f64::NEG_INFINITY])?;
    assert!(p.update_by(UpdateRule::Grouped, &[0, 1, 2], none_left.view()).is_err(), "no subset left");
    let before = p.weights();
    p.update_by(UpdateRule::Linear, &[0, 1, 2], none_left.view())?;
    assert!(p.weights().iter().zip(&before).all(|(a, b)| (a - b).abs() < 1e-15));
    Ok(())
}

/// Up to 128 log-weights over 300 orders of magnitude (some exactly 0 or
/// −∞), each subset's group among k ≤ 8, and each group's ℓ from 0 to −10⁶.
fn grouped_case() -> impl Strategy<Value = (Vec<f64>, Vec<usize>, Vec<f64>)> {
    (1usize..=128, 1usize..=8).prop_flat_map(|(m, k)| {
        (
            proptest::collection::vec(proptest::prop_oneof![-690.0f64..0.0, Just(0.0), Just(f64::NEG_INFINITY)], m),
            proptest::collection::vec(0..k, m),
            proptest::collection::vec(proptest::prop_oneof![-1e6f64..0.0, -40.0f64..0.0, Just(0.0)], k),
        )
    })
}

/// The magnitude of the terms of log w + ℓ − L, which every rule rounds.
fn rounding_scale(lik: &[f64], start: &Posterior) -> f64 {
    let largest = |xs: &mut dyn Iterator<Item = f64>| xs.filter(|x| x.is_finite()).fold(0.0f64, |a, x| a.max(x.abs()));
    1.0 + largest(&mut lik.iter().copied()) + largest(&mut start.log_weights().iter().copied())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// The grouped rule is Bayes' rule: it agrees with log-sum-exp over
    /// every subset to rounding, the result is normalised, and weights at 0
    /// stay at 0.
    #[test]
    fn grouped_update_agrees_with_the_per_subset_rule((log_w, key, lik) in grouped_case()) {
        proptest::prop_assume!(log_w.iter().any(|x| x.is_finite()));
        let start = Posterior::from_log_weights(log_w)?;
        let scale = rounding_scale(&lik, &start);
        let ll: Array1<f64> = key.iter().map(|&g| lik[g]).collect();
        let mut grouped = start.clone();
        grouped.update_by(UpdateRule::Grouped, &key, ll.view())?;
        let mut legacy = start;
        legacy.update(ll.view())?;
        for (g, l) in grouped.log_weights().iter().zip(legacy.log_weights()) {
            prop_assert!(*g == l || (g - l).abs() <= 1e-14 * scale, "{} vs {}", g, l);
        }
        prop_assert!(log_sum_exp(grouped.log_weights().iter().copied()).abs() <= 1e-14 * scale);
    }

    /// The linear rule is Bayes' rule too: wherever the exact weight is
    /// within e⁻⁷⁰⁰ of the largest it agrees with log-sum-exp to rounding,
    /// far below that it is 0, and applied again to the restored result
    /// it gives the same bits as applied to the original.
    #[test]
    fn linear_update_agrees_with_the_per_subset_rule(
        (log_w, key, lik) in grouped_case(),
        lik2 in proptest::collection::vec(-40.0f64..0.0, 8),
    ) {
        proptest::prop_assume!(log_w.iter().any(|x| x.is_finite()));
        let start = Posterior::from_log_weights(log_w)?;
        let scale = rounding_scale(&lik, &start);
        let ll: Array1<f64> = key.iter().map(|&g| lik[g]).collect();
        let mut linear = start.clone();
        linear.update_by(UpdateRule::Linear, &key, ll.view())?;
        let mut legacy = start;
        legacy.update(ll.view())?;
        let top = legacy.log_weights().iter().copied().fold(f64::NEG_INFINITY, f64::max);
        for (g, l) in linear.log_weights().iter().zip(legacy.log_weights()) {
            if l > top - 700.0 {
                prop_assert!((g - l).abs() <= 1e-13 * scale, "{} vs {}", g, l);
            } else if l < top - 760.0 {
                prop_assert!(*g == f64::NEG_INFINITY || *g < top - 700.0, "{} vs {}", g, l);
            }
        }
        prop_assert!((linear.weights().sum() - 1.0).abs() <= 1e-13);
        let mut resumed = Posterior::restore(linear.form().clone())?;
        let ll2: Array1<f64> = key.iter().map(|&g| lik2[g]).collect();
        linear.update_by(UpdateRule::Linear, &key, ll2.view())?;
        resumed.update_by(UpdateRule::Linear, &key, ll2.view())?;
        prop_assert!(resumed.form().same_bits(linear.form()));
    }
}
