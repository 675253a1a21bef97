use super::*;
use crate::privacy::ledger::Policy;
use chacha20::ChaCha20Rng;
use ndarray::{Array2, array};
use ndarray_linalg::Solve;
use proptest::prelude::*;
use rand::{RngExt, SeedableRng};

fn n(x: f64) -> Nats {
    Nats::new(x).expect("valid")
}

fn state(m: usize, b: f64, limit: f64, policy: Policy) -> SessionState {
    SessionState {
        posterior: Posterior::uniform(m).expect("m > 0"),
        ledger: Ledger::new(n(b), n(limit), policy).expect("valid"),
    }
}

/// xᵀ Σ⁺ x from the dense Σ, independently of the mechanism's basis: Σ is
/// restricted to the coordinates it touches and, when it is singular there
/// (label mode: Σ·1 = 0), to the Helmert coordinates of 1^⊥, then solved.
fn dense_quad(sigma: &Array2<f64>, x: &Array1<f64>) -> f64 {
    let idx: Vec<usize> = (0..sigma.nrows()).filter(|&i| sigma[[i, i]] > 0.0).collect();
    let k = idx.len();
    let block = Array2::from_shape_fn((k, k), |(i, j)| sigma[[idx[i], idx[j]]]);
    let xb = Array1::from_shape_fn(k, |i| x[idx[i]]);
    let ones_null = block.sum_axis(ndarray::Axis(1)).iter().all(|s| s.abs() < 1e-9 * block[[0, 0]]);
    let (s, y) = if ones_null {
        let h = crate::privacy::label::helmert(k);
        (h.t().dot(&block).dot(&h), h.t().dot(&xb))
    } else {
        (block, xb)
    };
    let sol = s.solve(&y).expect("Σ is invertible on its range");
    y.dot(&sol)
}

/// Eq. 4 by brute force: P_t(s_i) ∝ exp(−½ (r − M(s_i))ᵀ Σ⁺ (r − M(s_i))) P_{t−1}(s_i).
fn brute_force_bayes(prior: &Posterior, outputs: &[Array1<f64>], sigma: &Array2<f64>, r: &Array1<f64>) -> Vec<f64> {
    let logs: Vec<f64> =
        outputs.iter().zip(prior.log_weights()).map(|(m, lw)| lw - 0.5 * dense_quad(sigma, &(r - m))).collect();
    let lse = crate::privacy::posterior::log_sum_exp(logs.iter().copied());
    logs.iter().map(|l| (l - lse).exp()).collect()
}

fn one_hot(c: usize, d: usize) -> Array1<f64> {
    let mut e = Array1::zeros(d);
    e[c] = 1.0;
    e
}

#[test]
fn label_posterior_equals_brute_force_bayes() -> Result<(), PrivacyError> {
    let mut rng = ChaCha20Rng::seed_from_u64(5);
    let labels = vec![0, 1, 1, 2, 2, 2];
    let outputs = TeacherOutputs::Labels { labels: labels.clone(), classes: 4 };
    let rows: Vec<Array1<f64>> = labels.iter().map(|&y| one_hot(y, 4)).collect();
    // The secret is persistent (paper §3.1): one session per secret.
    for secret in [0, 1, 4] {
        let mut st = state(6, 0.3, 100.0, Policy::Paper);
        for step in 0..12 {
            let prior = st.posterior.clone();
            let sigma = label::calibrate(&prior, &labels, 4, n(0.3))?.noise().dense();
            let ans = answer(&mut st, &outputs, SecretIndex::new(secret, 6)?, None, &mut rng)?;
            let want = brute_force_bayes(&prior, &rows, &sigma, &ans.noisy);
            for (got, want) in st.posterior.weights().iter().zip(&want) {
                assert!((got - want).abs() < 1e-9, "secret {secret} step {step}: {got} vs {want}");
            }
        }
    }
    Ok(())
}

#[test]
fn vector_posterior_equals_brute_force_bayes() -> Result<(), PrivacyError> {
    let mut rng = ChaCha20Rng::seed_from_u64(6);
    let v = Array2::from_shape_fn((5, 3), |_| rng.random_range(0.0..1.0));
    let outputs = TeacherOutputs::Vectors(v.clone());
    let mut st = state(5, 0.2, 100.0, Policy::Paper);
    for step in 0..10 {
        let prior = st.posterior.clone();
        let sigma = vector::calibrate(&prior, v.view(), n(0.2))?.noise().dense();
        let ans = answer(&mut st, &outputs, SecretIndex::new(2, 5)?, None, &mut rng)?;
        let rows: Vec<Array1<f64>> = v.rows().into_iter().map(|r| r.to_owned()).collect();
        let want = brute_force_bayes(&prior, &rows, &sigma, &ans.noisy);
        for (got, want) in st.posterior.weights().iter().zip(&want) {
            assert!((got - want).abs() < 1e-8, "step {step}: {got} vs {want}");
        }
    }
    Ok(())
}

#[test]
fn unanimous_answers_are_exact_and_leave_the_posterior_alone() -> Result<(), PrivacyError> {
    let mut rng = ChaCha20Rng::seed_from_u64(0);
    let mut st = state(4, 0.1, 0.1, Policy::Contested);
    st.posterior = Posterior::from_log_weights(vec![0.0, -1.0, -2.0, -3.0])?;
    let before = st.posterior.clone();
    let outputs = TeacherOutputs::Labels { labels: vec![3; 4], classes: 5 };
    for _ in 0..10 {
        let a = answer(&mut st, &outputs, SecretIndex::new(1, 4)?, Some(0.01), &mut rng)?;
        assert_eq!((a.label, a.unanimous, a.charge, a.confident), (3, true, Nats::ZERO, Some(true)));
        assert_eq!(a.noisy, one_hot(3, 5));
    }
    assert_eq!(st.posterior, before);
    assert_eq!((st.ledger.answered(), st.ledger.charged()), (10, 0));
    Ok(())
}

#[test]
fn paper_policy_charges_unanimous_answers_too() -> Result<(), PrivacyError> {
    let mut rng = ChaCha20Rng::seed_from_u64(0);
    let mut st = state(2, 0.1, 1.0, Policy::Paper);
    let outputs = TeacherOutputs::Labels { labels: vec![0, 0], classes: 2 };
    let a = answer(&mut st, &outputs, SecretIndex::new(0, 2)?, None, &mut rng)?;
    assert_eq!(a.charge, n(0.1));
    assert_eq!(st.ledger.spent(), n(0.1));
    Ok(())
}

#[test]
fn refusals_and_errors_change_nothing() -> Result<(), PrivacyError> {
    let mut rng = ChaCha20Rng::seed_from_u64(0);
    let mut st = state(3, 0.5, 0.5, Policy::Paper);
    let outputs = TeacherOutputs::Labels { labels: vec![0, 1, 1], classes: 2 };
    answer(&mut st, &outputs, SecretIndex::new(0, 3)?, None, &mut rng)?;
    let before = st.clone();
    let refused = answer(&mut st, &outputs, SecretIndex::new(0, 3)?, None, &mut rng);
    assert!(matches!(refused, Err(PrivacyError::BudgetExhausted { .. })));
    let wrong_count = TeacherOutputs::Labels { labels: vec![0, 1], classes: 2 };
    assert!(answer(&mut st, &wrong_count, SecretIndex::new(0, 3)?, None, &mut rng).is_err());
    let bad_label = TeacherOutputs::Labels { labels: vec![0, 1, 2], classes: 2 };
    let bad_unanimous = TeacherOutputs::Labels { labels: vec![5, 5, 5], classes: 2 };
    assert!(answer(&mut st, &bad_unanimous, SecretIndex::new(0, 3)?, None, &mut rng).is_err());
    assert!(answer(&mut st, &bad_label, SecretIndex::new(0, 3)?, None, &mut rng).is_err());
    let nan = TeacherOutputs::Vectors(array![[0.0], [f64::NAN], [1.0]]);
    assert!(answer(&mut st, &nan, SecretIndex::new(0, 3)?, None, &mut rng).is_err());
    assert!(answer(&mut st, &outputs, SecretIndex::new(0, 3)?, Some(2.0), &mut rng).is_err());
    assert_eq!(st, before);
    Ok(())
}

#[test]
fn secret_index_never_prints() -> Result<(), PrivacyError> {
    let s = SecretIndex::new(42, 128)?;
    assert_eq!(format!("{s:?}"), "SecretIndex(<redacted>)");
    let err = SecretIndex::new(1234, 128).expect_err("out of range");
    assert!(!err.to_string().contains("1234"));
    Ok(())
}

/// Theorem 3.3 in miniature: after T answers the ledger holds T·b under the
/// paper policy and the released labels are mostly right at a generous b.
#[test]
fn a_session_composes_linearly_and_stays_useful() -> Result<(), PrivacyError> {
    let mut rng = ChaCha20Rng::seed_from_u64(9);
    let mut st = state(16, 2f64.powi(-8), 1.0, Policy::Paper);
    let mut right = 0;
    for t in 0..200 {
        let y = t % 3;
        let mut labels = vec![y; 16];
        labels[t % 16] = (y + 1) % 3; // one dissenter per query
        let outputs = TeacherOutputs::Labels { labels: labels.clone(), classes: 3 };
        let secret = SecretIndex::new(3, 16)?;
        let a = answer(&mut st, &outputs, secret, None, &mut rng)?;
        right += usize::from(a.label == labels[3]);
    }
    assert_eq!(st.ledger.spent(), n(200.0 * 2f64.powi(-8)));
    assert!(right > 100, "{right}/200 answers matched the secret teacher");
    Ok(())
}

#[test]
fn published_vector_is_on_the_grid_and_clamped() {
    let r = array![1.0 + 1e-12, -0.3, 5e6, -7e9, 0.0];
    let p = published(&r);
    // 1 + 1e-12 is 1 + ~0.004 grid steps: rounds to 1.
    assert_eq!(p[0], 1.0);
    assert_eq!(p[2], PUBLISHED_CLAMP);
    assert_eq!(p[3], -PUBLISHED_CLAMP);
    assert_eq!(p[4], 0.0);
    for v in &p {
        assert_eq!((v / PUBLISHED_GRID).fract(), 0.0, "{v} is a multiple of 2^-32");
    }
    assert!((p[1] + 0.3).abs() <= PUBLISHED_GRID / 2.0);
}

proptest! {
    /// Rounding moves no coordinate by more than half a grid step (inside the
    /// clamp), and two releases that differ only below the grid publish the
    /// same vector: the low-order bits never leave.
    #[test]
    fn published_vector_forgets_bits_below_the_grid(x in -1000.0f64..1000.0, tiny in -1e-13f64..1e-13) {
        let a = published(&array![x]);
        prop_assert!((a[0] - x).abs() <= PUBLISHED_GRID / 2.0);
        let snapped = a[0];
        let b = published(&array![snapped + tiny]);
        prop_assert_eq!(b[0], snapped);
    }
}
