use super::*;
use crate::privacy::PrivacyError;

#[test]
fn prior_gives_no_advantage() -> Result<(), PrivacyError> {
    // Exact-half construction: every point is in m/2 subsets, so under the
    // uniform prior membership probability is exactly ½ and the rule abstains
    // to "non-member" (it needs > ½).
    let p = Posterior::uniform(8)?;
    assert!((membership_probability(&p, &[0, 2, 4, 6]) - 0.5).abs() < 1e-15);
    assert!(!predict_member(&p, &[0, 2, 4, 6]));
    Ok(())
}

#[test]
fn follows_the_posterior_mass() -> Result<(), PrivacyError> {
    let p = Posterior::from_log_weights(vec![0.0, -5.0, -5.0, -5.0])?;
    assert!(predict_member(&p, &[0, 1]));
    assert!(!predict_member(&p, &[2, 3]));
    let want = (1.0 + (-5f64).exp()) / (1.0 + 3.0 * (-5f64).exp());
    assert!((membership_probability(&p, &[0, 1]) - want).abs() < 1e-15);
    Ok(())
}
