use super::*;
use ndarray::array;

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
