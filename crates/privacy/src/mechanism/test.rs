use super::*;
use crate::ledger::Policy;
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
        let h = crate::label::helmert(k);
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
    let lse = crate::posterior::log_sum_exp(logs.iter().copied());
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

/// Policy `unanimous_only`: a unanimous query is answered exactly and
/// free; a contested one is refused with [`PrivacyError::Contested`] before
/// anything is drawn, whichever subset is secret, with the state untouched
/// — in label and vector mode, and although the budget could pay.
#[test]
fn unanimous_only_answers_agreement_free_and_refuses_disagreement_untouched() -> Result<(), PrivacyError> {
    let mut st = state(3, 0.1, 1.0, Policy::UnanimousOnly);
    let agreed = TeacherOutputs::Labels { labels: vec![2, 2, 2], classes: 3 };
    let a = answer(&mut st, &agreed, SecretIndex::new(1, 3)?, None, &mut ChaCha20Rng::seed_from_u64(7))?;
    assert!(a.unanimous);
    assert_eq!((a.label, a.charge, st.ledger.spent(), st.ledger.answered()), (2, Nats::ZERO, Nats::ZERO, 1));
    let before = st.clone();
    let contested = [
        TeacherOutputs::Labels { labels: vec![2, 1, 2], classes: 3 },
        TeacherOutputs::Vectors(array![[0.5, 0.5], [0.5, 0.5], [0.25, 0.75]]),
    ];
    for outputs in &contested {
        for s in 0..3 {
            let mut rng = ChaCha20Rng::seed_from_u64(7);
            let refused = answer(&mut st, outputs, SecretIndex::new(s, 3)?, None, &mut rng);
            assert!(matches!(refused, Err(PrivacyError::Contested)), "secret {s}: {refused:?}");
            assert_eq!(st, before, "a refusal changes nothing");
            let fresh: u64 = ChaCha20Rng::seed_from_u64(7).random();
            assert_eq!(rng.random::<u64>(), fresh, "nothing was drawn");
        }
    }
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

// ---- docs/assurance/accounting.md: properties of one step and of a whole session ----

use crate::conservative::add_up;

/// Log-weights from well mixed to nearly degenerate, including weights that
/// underflow when exponentiated (they stay in the support).
fn log_weight() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), -40.0f64..0.0, -745.0f64..-700.0, Just(-1e6)]
}

/// A ledger that has charged `earlier` answers of b and has
/// {0, ½, 1, 3}·b of headroom left, so that refusals are exercised.
fn ledger_near_limit(b: f64, policy: Policy, earlier: u64, headroom: u8) -> Ledger {
    let mut spent = Nats::ZERO;
    for _ in 0..earlier {
        spent = add_up(spent, n(b)).expect("finite");
    }
    let extra = [0.0, 0.5, 1.0, 3.0][usize::from(headroom % 4)] * b;
    Ledger::restore(n(b), n(spent.get() + extra), policy, spent, earlier, earlier).expect("valid")
}

fn log_weight_bits(p: &Posterior) -> Vec<u64> {
    p.log_weights().iter().map(|x| x.to_bits()).collect()
}

/// What one step produced, minus everything that may legitimately depend on
/// the secret (the centre of the release and hence the posterior update).
#[derive(Debug, PartialEq)]
struct PublicOutcome {
    error: Option<PrivacyError>,
    charge: Option<Nats>,
    unanimous: Option<bool>,
    mi_bound_bits: Option<u64>,
    ledger: Ledger,
    /// The next output of the step's generator: how much randomness it drew.
    next_random: u64,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// docs/assurance/accounting.md §3: a unanimous step releases the common output
    /// exactly, draws no randomness, leaves P_t = P_{t−1} bit for bit, and
    /// costs 0 under `contested` and b under `paper` — where b does not fit,
    /// `paper` refuses and nothing changes.
    #[test]
    fn unanimous_steps_move_only_the_ledger(
        log_w in prop::collection::vec(log_weight(), 1..=16),
        y in 0usize..10,
        extra_classes in 1usize..4,
        vector in any::<bool>(),
        row in prop::collection::vec(-2.0f64..2.0, 1..=4),
        contested in any::<bool>(),
        e in 1i32..=40,
        earlier in 0u64..4,
        headroom in 0u8..4,
        alpha in prop::option::of(0.001f64..0.5),
        seed in any::<u64>(),
    ) {
        let m = log_w.len();
        let b = 2f64.powi(-e);
        let policy = if contested { Policy::Contested } else { Policy::Paper };
        let mut st = SessionState {
            posterior: Posterior::from_log_weights(log_w).expect("finite"),
            ledger: ledger_near_limit(b, policy, earlier, headroom),
        };
        let (outputs, exact) = if vector {
            let v = Array2::from_shape_fn((m, row.len()), |(_, j)| row[j]);
            (TeacherOutputs::Vectors(v), Array1::from(row.clone()).mapv(crate::grid::centre))
        } else {
            let classes = y + extra_classes;
            (TeacherOutputs::Labels { labels: vec![y; m], classes }, one_hot(y, classes))
        };
        let before = st.clone();
        let fits = add_up(before.ledger.spent(), n(b)).expect("finite") <= before.ledger.limit();
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let mut untouched = ChaCha20Rng::seed_from_u64(seed);
        let secret = SecretIndex::new(usize::try_from(seed % m as u64).expect("small"), m).expect("in range");
        match answer(&mut st, &outputs, secret, alpha, &mut rng) {
            Ok(a) => {
                let charge = if contested { Nats::ZERO } else { n(b) };
                prop_assert!(contested || fits);
                prop_assert!(a.unanimous);
                prop_assert_eq!(a.charge, charge);
                prop_assert_eq!(a.mi_bound, 0.0);
                prop_assert!(a.log_likelihood.is_none());
                prop_assert_eq!(&a.noisy, &exact);
                prop_assert_eq!(a.label, argmax(exact.iter().copied()));
                prop_assert_eq!(a.confident, alpha.map(|_| true));
                prop_assert_eq!(log_weight_bits(&st.posterior), log_weight_bits(&before.posterior));
                prop_assert_eq!(st.ledger.spent(), add_up(before.ledger.spent(), charge).expect("finite"));
                prop_assert_eq!(st.ledger.answered(), before.ledger.answered() + 1);
                prop_assert_eq!(st.ledger.charged(), before.ledger.charged() + u64::from(!contested));
            }
            Err(err) => {
                prop_assert!(!contested && !fits, "unexpected refusal {:?}", err);
                prop_assert!(matches!(err, PrivacyError::BudgetExhausted { .. }), "{:?}", err);
                prop_assert_eq!(&st, &before);
            }
        }
        prop_assert_eq!(rng.next_u64(), untouched.next_u64(), "an exact answer draws no noise");
    }

    /// docs/assurance/accounting.md §1.5 and §2: given the same posterior, teacher
    /// outputs, ledger and generator, every secret index gets the same
    /// refusal, charge, unanimity, certified bound (≤ b(1 − 10⁻⁸), ≤ the
    /// charge), ledger, noise vector z and amount of randomness drawn. Only
    /// the centre of the release r = M(s*) + z differs, and the label is
    /// argmax(r).
    #[test]
    fn only_the_release_centre_depends_on_the_secret(
        seed in any::<u64>(),
        m in 2usize..=10,
        classes in 2usize..=5,
        vector in any::<bool>(),
        contested in any::<bool>(),
        earlier in 0u64..3,
        headroom in 0u8..4,
        alpha in prop::option::of(0.001f64..0.5),
    ) {
        let mut draw = ChaCha20Rng::seed_from_u64(seed);
        let b = 2f64.powi(-draw.random_range(1..=32));
        let log_w: Vec<f64> =
            (0..m).map(|_| if draw.random_bool(0.2) { -700.0 } else { draw.random_range(-20.0..0.0) }).collect();
        let all_agree = draw.random_bool(0.2);
        let outputs = if vector {
            // d ≤ m takes C's basis, d > m K's (vector::gram_basis); the SVD where they decline.
            let d = draw.random_range(1..=40);
            TeacherOutputs::Vectors(Array2::from_shape_fn((m, d), |_| {
                if all_agree { 0.5 } else { draw.random_range(0.0..1.0) }
            }))
        } else {
            let labels = (0..m).map(|_| if all_agree { 1 } else { draw.random_range(0..classes) }).collect();
            TeacherOutputs::Labels { labels, classes }
        };
        let centre = |s: usize| -> Array1<f64> {
            match &outputs {
                TeacherOutputs::Labels { labels, classes } => one_hot(labels[s], *classes),
                TeacherOutputs::Vectors(v) => v.row(s).mapv(crate::grid::centre),
            }
        };
        let policy = if contested { Policy::Contested } else { Policy::Paper };
        let base = SessionState {
            posterior: Posterior::from_log_weights(log_w).expect("finite"),
            ledger: ledger_near_limit(b, policy, earlier, headroom),
        };

        let mut first: Option<(PublicOutcome, Array1<f64>)> = None;
        for s in 0..m {
            let mut st = base.clone();
            let mut rng = ChaCha20Rng::seed_from_u64(seed.wrapping_add(1));
            let result = answer(&mut st, &outputs, SecretIndex::new(s, m).expect("in range"), alpha, &mut rng);
            let (error, charge, unanimous, mi_bound_bits, z) = match result {
                Ok(a) => {
                    prop_assert_eq!(a.label, argmax(a.noisy.iter().copied()));
                    prop_assert!(a.mi_bound <= a.charge.get());
                    let headroom = crate::noise::CERTIFICATE_MARGIN;
                    prop_assert!(a.unanimous || a.mi_bound <= b * (1.0 - headroom), "no headroom: {} vs b = {}", a.mi_bound, b);
                    let z = &a.noisy - &centre(s);
                    (None, Some(a.charge), Some(a.unanimous), Some(a.mi_bound.to_bits()), z)
                }
                Err(err) => {
                    prop_assert_eq!(&st, &base, "a refusal changes nothing");
                    (Some(err), None, None, None, Array1::zeros(0))
                }
            };
            let outcome =
                PublicOutcome { error, charge, unanimous, mi_bound_bits, ledger: st.ledger.clone(), next_random: rng.next_u64() };
            match &first {
                None => first = Some((outcome, z)),
                Some((want, want_z)) => {
                    prop_assert_eq!(&outcome, want, "secret {} differs from secret 0", s);
                    prop_assert_eq!(z.len(), want_z.len());
                    for (got, want) in z.iter().zip(want_z) {
                        // r − M(s*) recovers z up to the rounding of M(s*) + z.
                        prop_assert!((got - want).abs() <= 1e-12 * (1.0 + want.abs()), "z differs: {} vs {}", got, want);
                    }
                }
            }
        }
    }

    /// docs/assurance/accounting.md §1 and §3, along whole sessions: on every path,
    /// each answered step's certified per-step bound is at most its charge,
    /// a unanimous step leaves the posterior bit for bit, spent is the
    /// rounded-up sum of the charges, and Σ_t (per-step bound) ≤ Σ_t c_t ≤
    /// spent ≤ B. A refused step changes nothing.
    #[test]
    fn per_step_bounds_add_up_to_at_most_the_limit_on_every_path(
        seed in any::<u64>(),
        m in 2usize..=8,
        steps in 1usize..40,
        contested in any::<bool>(),
        e in 2i32..=20,
        answers_that_fit in 0u32..30,
    ) {
        let b = 2f64.powi(-e);
        let policy = if contested { Policy::Contested } else { Policy::Paper };
        let mut st = state(m, b, f64::from(answers_that_fit) * b, policy);
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let (mut per_step_sum, mut charges) = (0.0f64, Nats::ZERO);
        for _ in 0..steps {
            let labels: Vec<usize> =
                if rng.random_bool(0.4) { vec![2; m] } else { (0..m).map(|_| rng.random_range(0..3)).collect() };
            let outputs = TeacherOutputs::Labels { labels, classes: 3 };
            let before = st.clone();
            let secret = SecretIndex::new(rng.random_range(0..m), m).expect("in range");
            match answer(&mut st, &outputs, secret, None, &mut rng) {
                Ok(a) => {
                    prop_assert!(a.mi_bound <= a.charge.get());
                    prop_assert_eq!(a.charge, before.ledger.charge_for(a.unanimous));
                    if a.unanimous {
                        prop_assert_eq!(log_weight_bits(&st.posterior), log_weight_bits(&before.posterior));
                    }
                    per_step_sum += a.mi_bound;
                    charges = add_up(charges, a.charge).expect("finite");
                }
                Err(err) => {
                    prop_assert!(matches!(err, PrivacyError::BudgetExhausted { .. }), "{:?}", err);
                    prop_assert_eq!(&st, &before);
                }
            }
            prop_assert_eq!(st.ledger.spent(), charges);
            prop_assert!(per_step_sum <= charges.get());
            prop_assert!(st.ledger.spent() <= st.ledger.limit());
        }
    }
}

/// I(S; Y) for S uniform over `means.len()` subsets and Y = means[S] + N(0, var),
/// one-dimensional, by the midpoint rule on ±(max|mean| + 12σ).
fn binary_channel_mi(means: &[f64], var: f64) -> f64 {
    let sd = var.sqrt();
    let half = means.iter().fold(0.0f64, |a, x| a.max(x.abs())) + 12.0 * sd;
    let steps = 20_000;
    let h = 2.0 * half / f64::from(steps);
    let w = 1.0 / means.len() as f64;
    let mut mi = 0.0;
    for i in 0..steps {
        let y = -half + (f64::from(i) + 0.5) * h;
        let dens: Vec<f64> = means.iter().map(|mu| gauss(y, *mu, var)).collect();
        let mix = w * dens.iter().sum::<f64>();
        mi += dens.iter().filter(|d| **d > 0.0).map(|d| w * d * (d / mix).ln()).sum::<f64>() * h;
    }
    mi
}

fn gauss(y: f64, mean: f64, var: f64) -> f64 {
    (-(y - mean).powi(2) / (2.0 * var)).exp() / (2.0 * std::f64::consts::PI * var).sqrt()
}

/// docs/assurance/accounting.md §4: two principals with separate sessions (each a
/// fresh, uniform posterior over m = 4 subsets, one answer of b = 0.01
/// each) who collude *adaptively* — B's query depends on A's answer — learn
/// more than the sum of their budgets about the secret from the two
/// releases: I(S; R_A, R_B) ≈ 0.02047 > 0.02. Each session's noise is
/// calibrated to a posterior that ignores the other's answer, so Theorem
/// 3.3 does not cover the joint transcript. Without the adaptive choice
/// (B's query fixed in advance) the releases are conditionally independent
/// given S and the sum does hold. Noise variances are the implementation's.
#[test]
fn adaptive_collusion_across_sessions_can_exceed_the_sum_of_budgets() -> Result<(), PrivacyError> {
    let (m, b) = (4, 0.01);
    let uniform = Posterior::uniform(m)?;
    // A: teachers 0, 1 say class 0, teachers 2, 3 say class 1. The release
    // varies only along u = (e₀ − e₁)/√2; its coordinate there is sufficient.
    let a_cal = label::calibrate(&uniform, &[0, 0, 1, 1], 2, n(b))?;
    let along = |cal: &label::LabelCalibration, s: usize| -> f64 {
        cal.noise().basis()[[cal.position_of_teacher(s).expect("teacher exists"), 0]]
    };
    let a_means: Vec<f64> = (0..m).map(|s| along(&a_cal, s)).collect();
    let a_var = a_cal.noise().variances()[0];
    // B: one teacher (the "dissenter") says 0, the other three say 1.
    let b_cals: Vec<label::LabelCalibration> = (0..m)
        .map(|d| {
            let labels: Vec<usize> = (0..m).map(|i| usize::from(i != d)).collect();
            label::calibrate(&uniform, &labels, 2, n(b))
        })
        .collect::<Result<_, _>>()?;

    let joint = |adaptive: bool| -> f64 {
        let steps = 600;
        let (sd_a, sd_b) = (a_var.sqrt(), b_cals[0].noise().variances()[0].sqrt());
        let (half_a, half_b) = (1.0 + 9.0 * sd_a, 1.0 + 9.0 * sd_b);
        let (ha, hb) = (2.0 * half_a / f64::from(steps), 2.0 * half_b / f64::from(steps));
        let mut mi = 0.0;
        for i in 0..steps {
            let ya = -half_a + (f64::from(i) + 0.5) * ha;
            // Adaptive: the dissenter is a subset of the pair A's answer favours.
            let favoured = (0..m).find(|&s| a_means[s] * ya > 0.0).unwrap_or(0);
            let cal = &b_cals[if adaptive { favoured } else { 0 }];
            let b_var = cal.noise().variances()[0];
            let pa: Vec<f64> = a_means.iter().map(|mu| gauss(ya, *mu, a_var)).collect();
            for j in 0..steps {
                let yb = -half_b + (f64::from(j) + 0.5) * hb;
                let p: Vec<f64> = (0..m).map(|s| pa[s] * gauss(yb, along(cal, s), b_var)).collect();
                let mix = p.iter().sum::<f64>() / m as f64;
                mi += p.iter().filter(|x| **x > 0.0).map(|x| x * (x / mix).ln()).sum::<f64>() / m as f64 * ha * hb;
            }
        }
        mi
    };
    let alone = binary_channel_mi(&a_means, a_var);
    assert!(alone <= b, "one session alone stays within its budget: {alone}");
    let (adaptive, fixed) = (joint(true), joint(false));
    assert!(fixed <= 2.0 * b, "non-adaptive pooling stays within the sum: {fixed}");
    assert!(adaptive > 2.0 * b + 3e-4, "adaptive collusion exceeds the sum of budgets: {adaptive}");
    assert!(adaptive < 2.0 * b + 7e-4, "and by the computed amount (≈ 4.7e−4): {adaptive}");
    Ok(())
}

/// The published label-mode vector when teacher `secret` serves a session
/// at budget `b`, with `seed`'s noise (the same draw for every secret),
/// and the secret teacher's label: 8 teachers voting over 3 of 4 classes.
fn published_by(b: f64, seed: u64, secret: usize) -> Result<(Vec<f64>, usize), PrivacyError> {
    let labels = vec![0, 0, 1, 2, 0, 1, 0, 0];
    let y = labels[secret];
    let outputs = TeacherOutputs::Labels { labels, classes: 4 };
    let mut st = state(8, b, 1.0, Policy::Paper);
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    Ok((answer(&mut st, &outputs, SecretIndex::new(secret, 8)?, None, &mut rng)?.published, y))
}

/// What leaves the process in label mode is e_y* + Q(z): with the same
/// noise draw, the published vectors for two different secret teachers
/// differ by exactly e_a − e_b — no bit below the grid depends on the centre.
#[test]
fn the_published_label_release_is_the_centre_plus_gridded_noise() -> Result<(), PrivacyError> {
    for seed in 0..50 {
        let mut released = Vec::new();
        for secret in [0, 2] {
            let (mut noise, y) = published_by(2f64.powi(-20), seed, secret)?;
            assert!(noise.iter().all(|v| (v / crate::grid::PUBLISHED_GRID).fract() == 0.0), "on the grid");
            noise[y] -= 1.0;
            released.push(noise);
        }
        assert_eq!(released[0], released[1], "seed {seed}: the gridded noise does not depend on the centre");
    }
    Ok(())
}

/// At the smallest budget the noise is ~10¹⁵ and every active coordinate
/// is clamped: the published vector must not carry the centre's 1 on top
/// of the clamp (±2²⁰ + 1 would name y*). Both secrets publish the same.
#[test]
fn a_clamped_label_release_does_not_name_the_centre() -> Result<(), PrivacyError> {
    for seed in 0..50 {
        let mut released = Vec::new();
        for secret in [0, 2] {
            let (published, _) = published_by(crate::noise::MIN_PER_QUERY, seed, secret)?;
            assert!(published.iter().all(|v| v.abs() <= crate::grid::PUBLISHED_CLAMP), "seed {seed}: {published:?}");
            released.push(published);
        }
        assert_eq!(released[0], released[1], "seed {seed}: clamped coordinates are the same for every centre");
    }
    Ok(())
}

/// Issue 44 §4: the label release computes only the k active coordinates.
/// It must be bit for bit the dense definition — Q(e_y* + z) over all d
/// coordinates, its first argmax, r = e_y* + z — for any label space,
/// budget (clamped releases included) and centre.
#[test]
fn the_sparse_label_release_is_the_dense_one() -> Result<(), PrivacyError> {
    let mut rng = ChaCha20Rng::seed_from_u64(44);
    for step in 0..400 {
        let d = [3, 10, 1000, 32_768][step % 4];
        let k = 2 + step % 7;
        let m = 16;
        let classes: Vec<usize> = (0..k).map(|_| rng.random_range(0..d)).collect();
        let labels: Vec<usize> = (0..m).map(|i| classes[i % k]).collect();
        let log_w: Vec<f64> = (0..m).map(|_| rng.random_range(-6.0..0.0)).collect();
        let posterior = Posterior::from_log_weights(log_w)?;
        let b = if step % 5 == 0 { crate::noise::MIN_PER_QUERY } else { 2f64.powi(-(step as i32 % 30) - 1) };
        let cal = label::calibrate(&posterior, &labels, d, n(b))?;
        let draw = cal.noise().sample(&mut rng);
        for center in 0..cal.classes().len() {
            let (label, noisy, published, evidence) = release_label(&cal, center, &draw);
            let y = one_hot(cal.classes()[center], d);
            let z = cal.noise().noise_vector(&draw);
            let dense = crate::grid::publish(y.view(), &z);
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&published), bits(&dense), "step {step}, centre {center}");
            assert_eq!(label, argmax(dense.iter().copied()), "step {step}, centre {center}");
            assert_eq!(noisy, &y + &z, "step {step}, centre {center}");
            let released = cal.classes().binary_search(&label).unwrap_or(usize::MAX);
            let want = crate::confidence::Evidence::of(cal.noise(), &dense, released);
            assert_eq!((evidence.min_t().to_bits(), evidence.k()), (want.min_t().to_bits(), want.k()));
        }
    }
    Ok(())
}

// ---- issue 21: a client observes nothing beyond the charged, gridded release ----

/// Two draws whose unrounded releases differ below the grid but publish the
/// same vector give bit-identical responses — label, published vector and
/// the confidence evidence a repeat answers from, hence the flag at every
/// α, first answer and repeats alike. (The evidence used to be computed from
/// the unrounded draw, so ~50 free repeats bisecting α read its low bits.)
#[test]
fn responses_are_functions_of_the_published_release() -> Result<(), PrivacyError> {
    let mut rng = ChaCha20Rng::seed_from_u64(21);
    let labels = [0, 0, 1, 1, 1, 2, 2, 3];
    let alphas: Vec<f64> = (1..200).map(|i| f64::from(i) / 400.0).collect();
    let mut compared = 0;
    for step in 0..300 {
        let log_w: Vec<f64> = (0..labels.len()).map(|_| rng.random_range(-6.0..0.0)).collect();
        let posterior = Posterior::from_log_weights(log_w)?;
        let cal = label::calibrate(&posterior, &labels, 5, n(2f64.powi(-(step % 12) - 1)))?;
        let draw = cal.noise().sample(&mut rng);
        let nudged = NoiseDraw { std_coef: draw.std_coef.mapv(|g| g * (1.0 + 1e-13)), residual: draw.residual.clone() };
        for center in 0..cal.classes().len() {
            let (label_a, noisy_a, pub_a, ev_a) = release_label(&cal, center, &draw);
            let (label_b, noisy_b, pub_b, ev_b) = release_label(&cal, center, &nudged);
            assert_ne!(noisy_a, noisy_b, "the unrounded releases differ");
            if pub_a != pub_b {
                continue; // the nudge crossed a grid midpoint: a different release
            }
            compared += 1;
            assert_eq!(label_a, label_b);
            assert_eq!((ev_a.min_t().to_bits(), ev_a.k()), (ev_b.min_t().to_bits(), ev_b.k()), "step {step}");
            for &a in &alphas {
                assert_eq!(ev_a.confident(a)?, ev_b.confident(a)?);
            }
        }
    }
    assert!(compared > 500, "{compared} pairs published the same vector");
    Ok(())
}

/// Vector mode: teacher outputs are put on the grid before anything else,
/// so the published release is centre + Q(z) with no floating-point sum of
/// the two — its noise part is bit-identical for every secret, also for
/// outputs far from the grid and large enough that fl(x + z) rounds, and a
/// coordinate where every teacher agrees is published identically whoever
/// is secret.
#[test]
fn vector_releases_carry_no_residue_of_the_centre() -> Result<(), PrivacyError> {
    let mut rng = ChaCha20Rng::seed_from_u64(7);
    for seed in 0..40u64 {
        let m = 6;
        let v = Array2::from_shape_fn((m, 4), |(_, j)| {
            // Large values off the grid, so that fl(x + z) rounds; column 3 agrees.
            if j == 3 {
                1_234.567_891_234_5
            } else {
                3.0e5 + rng.random_range(0.0..10.0) + rng.random_range(0.0..1.0) * 1e-7
            }
        });
        let outputs = TeacherOutputs::Vectors(v.clone());
        let mut noise_parts = Vec::new();
        let mut agreed = Vec::new();
        for s in 0..m {
            let mut st = state(m, 2f64.powi(-4), 1.0, Policy::Paper);
            let a = answer(&mut st, &outputs, SecretIndex::new(s, m)?, None, &mut ChaCha20Rng::seed_from_u64(seed))?;
            assert_eq!(a.label, argmax(a.published.iter().copied()));
            let centre = v.row(s).mapv(crate::grid::centre);
            noise_parts.push((&Array1::from(a.published.clone()) - &centre).to_vec());
            agreed.push(a.published[3]);
        }
        assert!(noise_parts.windows(2).all(|w| w[0] == w[1]), "seed {seed}: {noise_parts:?}");
        assert!(agreed.windows(2).all(|w| w[0].to_bits() == w[1].to_bits()), "seed {seed}: {agreed:?}");
    }
    Ok(())
}

/// Log-weights from well mixed to adversarial: weights down to 1e−300 and
/// beyond underflow, near-ties, and subsets already saturated at −∞ (one
/// subset may be all that is left).
fn adversarial_log_weight() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.0),
        Just(-1e-15),
        -40.0f64..0.0,
        -700.0f64..-690.0,
        Just(-1e6),
        Just(-1.7e308),
        Just(f64::NEG_INFINITY),
    ]
}

/// A teacher output value, ordinary or extreme.
fn adversarial_value() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), -1.0f64..1.0, Just(1e-300), Just(-3e5), Just(1e300), Just(-1e300), Just(f64::MAX)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// docs/assurance/accounting.md §1.5 (and §3 for `unanimous_only`'s CONTESTED
    /// refusals): over adversarial posteriors and teacher outputs, under
    /// both the `contested` and `unanimous_only` policies, along a session,
    /// every step's status — answered or which error — and its charge are
    /// the same for every choice of s*; only the
    /// centre of the release differs. The session then continues from one
    /// secret's state, so later steps see posteriors shaped by earlier
    /// releases (and Eq. 4's saturation).
    #[test]
    fn statuses_and_errors_never_depend_on_the_secret(
        log_w in prop::collection::vec(adversarial_log_weight(), 2..=8),
        values in prop::collection::vec(adversarial_value(), 32),
        vector in any::<bool>(),
        e in 1i32..=60,
        seed in any::<u64>(),
        policy in prop_oneof![Just(Policy::Contested), Just(Policy::UnanimousOnly)],
    ) {
        let m = log_w.len();
        let mut log_w = log_w;
        if log_w.iter().all(|x| !x.is_finite()) {
            log_w[0] = 0.0;
        }
        let b = 2f64.powi(-e).max(crate::noise::MIN_PER_QUERY);
        let mut st = SessionState {
            posterior: Posterior::from_log_weights(log_w).expect("one finite weight"),
            ledger: Ledger::new(n(b), n(3.0 * b), policy).expect("valid"),
        };
        let mut pick = ChaCha20Rng::seed_from_u64(seed);
        for step in 0..5 {
            let outputs = if vector {
                let d = 1 + step % 3;
                TeacherOutputs::Vectors(Array2::from_shape_fn((m, d), |_| values[pick.random_range(0..values.len())]))
            } else {
                let classes = 2 + step % 3;
                TeacherOutputs::Labels { labels: (0..m).map(|_| pick.random_range(0..classes)).collect(), classes }
            };
            let mut outcomes = Vec::new();
            let mut next = None;
            for s in 0..m {
                let mut trial = st.clone();
                let mut rng = ChaCha20Rng::seed_from_u64(seed ^ step as u64);
                let result = answer(&mut trial, &outputs, SecretIndex::new(s, m).expect("in range"), Some(0.05), &mut rng);
                outcomes.push(result.map(|a| (a.charge, a.unanimous)));
                if s == usize::try_from(seed % m as u64).expect("small") {
                    next = Some(trial);
                }
            }
            prop_assert!(outcomes.windows(2).all(|w| w[0] == w[1]), "step {}: {:?}", step, outcomes);
            st = next.expect("one secret continues");
        }
    }
}

/// The deliberately broken calibration (for the canary audit's own test)
/// really is broken: it certifies against a larger budget than it charges.
/// The default is the certified one.
#[test]
fn the_under_noised_calibration_charges_less_than_it_certifies() -> Result<(), PrivacyError> {
    assert_eq!(Calibration::default(), Calibration::Certified);
    let outputs = TeacherOutputs::Labels { labels: vec![0, 0, 1, 2, 1, 0, 2, 2], classes: 3 };
    let secret = SecretIndex::new(3, 8)?;
    let (b, mut rng) = (2f64.powi(-10), ChaCha20Rng::seed_from_u64(4));
    let mut honest = state(8, b, 1.0, Policy::Paper);
    let a = answer(&mut honest, &outputs, secret, None, &mut rng)?;
    assert!(a.mi_bound <= b && a.charge.get() == b);
    let mut broken = state(8, b, 1.0, Policy::Paper);
    let under = Calibration::UnderNoisedForAuditTests { factor: 64.0 };
    let a = answer_calibrated(&mut broken, &outputs, secret, None, &mut rng, under)?;
    assert!(a.mi_bound > 32.0 * b && a.charge.get() == b, "{} vs {b}", a.mi_bound);
    Ok(())
}
