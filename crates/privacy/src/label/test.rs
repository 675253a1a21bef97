use super::*;
use crate::noise::NoiseDraw;
use crate::noise::{CALIBRATION_SLACK, VARIANCE_FLOOR};
use crate::posterior::UpdateRule;
use chacha20::ChaCha20Rng;
use ndarray::Axis;
use ndarray_linalg::{Eigh, UPLO};
use proptest::prelude::*;
use rand::{RngExt, SeedableRng};
use statrs::distribution::{ChiSquared, ContinuousCDF};

fn b(x: f64) -> Nats {
    Nats::new(x).expect("valid")
}

/// ½·tr(Σ⁺C) evaluated densely: C = diag(p) − ppᵀ on the active classes,
/// Σ⁺ from an eigendecomposition of the dense Σ. Only trustworthy when no
/// variance is astronomically small (moderate posteriors).
fn dense_mi(cal: &LabelCalibration) -> f64 {
    if cal.noise().rank() == 0 {
        return 0.0;
    }
    dense_mi_under(cal, cal.class_probabilities())
}

fn posterior_from(log_w: Vec<f64>) -> Posterior {
    Posterior::from_log_weights(log_w).expect("finite")
}

#[test]
fn unanimous_is_exact() -> Result<(), PrivacyError> {
    let cal = calibrate(&Posterior::uniform(8)?, &[3; 8], 10, b(2f64.powi(-32)))?;
    assert!(cal.unanimous());
    assert!(cal.noise().is_exact());
    assert_eq!(cal.noise().mi_bound(), 0.0);
    Ok(())
}

#[test]
fn two_classes_match_the_closed_form() -> Result<(), PrivacyError> {
    // 3 of 4 teachers say 1, one says 4: p = (3/4, 1/4), C's eigenvalue 2·p₁p₂.
    let bb = 2f64.powi(-10);
    let cal = calibrate(&Posterior::uniform(4)?, &[1, 1, 4, 1], 6, b(bb))?;
    assert_eq!(cal.classes(), &[1, 4]);
    let sigma = cal.noise().variances()[0];
    let closed = (3.0 / 16.0) / bb * (1.0 + WEIGHT_ROUNDING) / (1.0 - CALIBRATION_SLACK);
    assert!((sigma - closed).abs() <= 1e-12 * closed, "{sigma} vs {closed}");
    assert!((dense_mi(&cal) - bb).abs() <= 1e-6 * bb);
    Ok(())
}

#[test]
fn helmert_is_an_orthonormal_basis_of_the_ones_complement() {
    for k in 2..20 {
        let h = helmert(k);
        let gram = h.t().dot(&h);
        for ((i, j), g) in gram.indexed_iter() {
            assert!((g - if i == j { 1.0 } else { 0.0 }).abs() < 1e-14);
        }
        for col in h.columns() {
            assert!(col.sum().abs() < 1e-14);
        }
    }
}

/// For k = 3 (the closed-form 2 × 2 rotation) and k ≥ 4 (LAPACK) alike,
/// including equal and vanishing probabilities.
#[test]
fn eigenbasis_diagonalises_c() -> Result<(), PrivacyError> {
    let cases: [&[f64]; 7] = [
        &[0.5, 0.3, 0.15, 0.05],
        &[0.6, 0.3, 0.1],
        &[0.25, 0.5, 0.25],
        &[1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0],
        &[1.0 - 2e-300, 1e-300, 1e-300],
        &[0.5, 0.5 - 1e-17, 1e-17],
        &[0.1, 0.2, 0.3, 0.1, 0.1, 0.05, 0.15],
    ];
    for p in cases {
        let u = eigenbasis(p)?;
        let gram = u.t().dot(&u);
        for ((i, j), g) in gram.indexed_iter() {
            assert!((g - if i == j { 1.0 } else { 0.0 }).abs() < 1e-14, "{p:?}: UᵀU");
        }
        for col in u.columns() {
            assert!(col.sum().abs() < 1e-14, "{p:?}: 1ᵀu");
        }
        let pv = Array1::from(p.to_vec());
        let c = Array2::from_diag(&pv) - pv.view().insert_axis(Axis(1)).dot(&pv.view().insert_axis(Axis(0)));
        let d = u.t().dot(&c).dot(&u);
        // Rebuild C from its eigenpairs.
        let rebuilt = u.dot(&Array2::from_diag(&d.diag().to_owned())).dot(&u.t());
        for (a, b) in rebuilt.iter().zip(&c) {
            assert!((a - b).abs() < 1e-14, "{p:?}: rebuilt C");
        }
        for ((i, j), v) in d.indexed_iter() {
            if i != j {
                assert!(v.abs() < 1e-14, "{p:?}: off-diagonal");
            }
        }
    }
    Ok(())
}

/// NOTES.md's pitfall: unanimous except one teacher whose weight has all but
/// vanished, at b = 2⁻³². Round-off must never put visible noise anywhere.
#[test]
fn vanishing_dissent_never_moves_the_argmax() -> Result<(), PrivacyError> {
    let mut log_w = vec![0.0; 128];
    log_w[17] = -690.0; // weight ≈ 1e−300
    let mut labels = vec![2; 128];
    labels[17] = 7;
    let cal = calibrate(&posterior_from(log_w), &labels, 10, b(2f64.powi(-32)))?;
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let center = cal.position_of_teacher(0).expect("teacher 0 exists");
    for _ in 0..2000 {
        let r = cal.release_block(center, &cal.noise().sample(&mut rng));
        assert_eq!(crate::mechanism::argmax(r.iter().copied()), center);
        assert!((r[center] - 1.0).abs() < 1e-100);
    }
    Ok(())
}

/// With uniform weights and one dissenter at b = 2⁻³² the noise is huge,
/// but only along e₁ − e₂: inactive classes are never answered.
#[test]
fn inactive_classes_are_never_released() -> Result<(), PrivacyError> {
    let mut labels = vec![2; 128];
    labels[5] = 7;
    labels[9] = 4;
    let cal = calibrate(&Posterior::uniform(128)?, &labels, 10, b(2f64.powi(-32)))?;
    let mut rng = ChaCha20Rng::seed_from_u64(2);
    for _ in 0..2000 {
        let r = cal.release_block(0, &cal.noise().sample(&mut rng));
        assert!((r.sum() - 1.0).abs() < 1e-6 * r.iter().map(|x| x.abs()).fold(1.0, f64::max));
    }
    Ok(())
}

/// Statistical check of the released distribution, k = 2: r₁ − r₂ − 1 is
/// N(0, 2σ) with σ = p₁p₂/b; the sample variance must lie in its 99.99 %
/// chi-square interval.
#[test]
fn released_difference_has_the_calibrated_variance() -> Result<(), PrivacyError> {
    let bb = 0.05;
    let mut labels = vec![0; 10];
    labels[..3].fill(1);
    let cal = calibrate(&Posterior::uniform(10)?, &labels, 2, b(bb))?;
    let target = 2.0 * 0.3 * 0.7 / bb / (1.0 - CALIBRATION_SLACK);
    let mut rng = ChaCha20Rng::seed_from_u64(3);
    let n = 20_000;
    let center = cal.position_of_teacher(5).expect("exists");
    let xs: Vec<f64> = (0..n)
        .map(|_| {
            let r = cal.release_block(center, &cal.noise().sample(&mut rng));
            r[0] - r[1] - 1.0
        })
        .collect();
    let mean = xs.iter().sum::<f64>() / n as f64;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let chi = ChiSquared::new((n - 1) as f64).expect("dof > 0");
    let (lo, hi) = (chi.inverse_cdf(5e-5), chi.inverse_cdf(1.0 - 5e-5));
    let stat = (n - 1) as f64 * var / target;
    assert!(lo < stat && stat < hi, "variance {var} vs calibrated {target}");
    assert!(mean.abs() < 5.0 * (target / n as f64).sqrt());
    Ok(())
}

fn adversarial_case() -> impl Strategy<Value = (Vec<f64>, Vec<usize>, usize, i32)> {
    (2usize..=128, 2usize..=1000, 2u32..=128).prop_flat_map(|(m, d, kmax)| {
        let k = (kmax as usize).min(d).min(m);
        (
            // Log-weights spanning 1e−300 … 1, with many exact and near ties.
            prop::collection::vec(prop_oneof![Just(0.0), Just(-1e-15), -690.8f64..0.0, Just(-690.0)], m),
            prop::collection::vec(0..k, m),
            Just(d),
            4i32..=40,
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Every calibration over adversarial posteriors is certified, floors
    /// rather than zeroes, stays on 1^⊥ of the active classes, and is
    /// orthonormal — so range(C) ⊆ range(Σ).
    #[test]
    fn adversarial_posteriors_are_always_certified((log_w, raw, d, e) in adversarial_case()) {
        // Spread the labels over the whole class range.
        let labels: Vec<usize> = raw.iter().map(|&y| (y * 7919) % d).collect();
        let bb = 2f64.powi(-e);
        let cal = calibrate(&posterior_from(log_w), &labels, d, b(bb)).expect("calibrates");
        let n = cal.noise();
        prop_assert!(n.mi_bound() <= bb * (1.0 - crate::noise::CERTIFICATE_MARGIN));
        let k = cal.classes().len();
        prop_assert_eq!(n.rank(), k - 1);
        prop_assert!(n.variances().iter().all(|&v| v >= VARIANCE_FLOOR && v.is_finite()));
        let u = n.basis();
        let gram = u.t().dot(u);
        for ((i, j), g) in gram.indexed_iter() {
            let want = if i == j { 1.0 } else { 0.0 };
            prop_assert!((g - want).abs() < 1e-10);
        }
        // range(C) = span{e_a − e_b}: each difference lies in span(U).
        for a in 1..k {
            let mut diff = Array1::<f64>::zeros(k);
            diff[0] = 1.0;
            diff[a] = -1.0;
            let back = u.dot(&u.t().dot(&diff));
            prop_assert!((&back - &diff).iter().all(|x| x.abs() < 1e-9));
        }
    }

    /// On moderate posteriors the dense evaluation of ½tr(Σ⁺C) with the
    /// exact C agrees with the certificate and stays within b.
    #[test]
    fn dense_mutual_information_bound_matches((m, k, seed) in (2usize..40, 2usize..12, any::<u64>())) {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let log_w: Vec<f64> = (0..m).map(|_| rng.random_range(-10.0..0.0)).collect();
        let labels: Vec<usize> = (0..m).map(|_| rng.random_range(0..k)).collect();
        let bb = 2f64.powi(-16);
        let cal = calibrate(&posterior_from(log_w), &labels, k, b(bb)).expect("calibrates");
        let mi = dense_mi(&cal);
        prop_assert!(mi <= bb * (1.0 + 1e-6), "dense MI {} > b {}", mi, bb);
        if !cal.unanimous() {
            prop_assert!(mi >= bb * (1.0 - 1e-6));
        }
    }
}

// ---- docs/assurance/accounting.md §4–5: noise calibrated to the wrong posterior ----

/// ½·tr(Σ⁺C_q) for the calibration's Σ and the output covariance C_q of the
/// active classes under class probabilities `q` (dense, like [`dense_mi`]).
fn dense_mi_under(cal: &LabelCalibration, q: &[f64]) -> f64 {
    let n = cal.noise();
    let k = cal.classes().len();
    let q = Array1::from(q.to_vec());
    let c = Array2::from_diag(&q) - q.view().insert_axis(Axis(1)).dot(&q.view().insert_axis(Axis(0)));
    let dense = n.dense();
    let idx = cal.classes();
    let block = Array2::from_shape_fn((k, k), |(i, j)| dense[[idx[i], idx[j]]]);
    let (eig, vecs) = block.eigh(UPLO::Lower).expect("symmetric");
    let top = eig.iter().cloned().fold(0.0, f64::max);
    let mut mi = 0.0;
    for (j, &l) in eig.iter().enumerate() {
        if l > top * 1e-13 {
            let v = vecs.column(j);
            mi += v.dot(&c.dot(&v)) / l;
        }
    }
    0.5 * mi
}

/// Class probabilities of the active classes under subset weights `w`.
fn class_mass(cal: &LabelCalibration, w: &Array1<f64>) -> Vec<f64> {
    let mut q = vec![0.0; cal.classes().len()];
    for (i, wi) in w.iter().enumerate() {
        q[cal.position_of_teacher(i).expect("teacher exists")] += wi;
    }
    q
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// The misspecification bound of docs/assurance/accounting.md §4: noise calibrated
    /// to posterior P but facing the true posterior Q leaks at most
    /// ρ·b with ρ = max_s Q(s)/P(s), because C_Q ⪯ ρ·C_P. Checked densely
    /// for random P, Q and labels with the implementation's Σ.
    #[test]
    fn calibration_to_another_posterior_costs_at_most_the_likelihood_ratio(
        (m, k, seed) in (2usize..40, 2usize..8, any::<u64>()),
    ) {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let labels: Vec<usize> = (0..m).map(|_| rng.random_range(0..k)).collect();
        let p = posterior_from((0..m).map(|_| rng.random_range(-6.0..0.0)).collect());
        let q = posterior_from((0..m).map(|_| rng.random_range(-6.0..0.0)).collect());
        let bb = 2f64.powi(-12);
        let cal = calibrate(&p, &labels, k, b(bb)).expect("calibrates");
        let (pw, qw) = (p.weights(), q.weights());
        let rho = qw.iter().zip(&pw).map(|(q, p)| q / p).fold(0.0, f64::max);
        let leak = dense_mi_under(&cal, &class_mass(&cal, &qw));
        prop_assert!(leak <= rho * cal.noise().mi_bound() * (1.0 + 1e-6), "leak {} > ρ·bound = {}·{}", leak, rho, cal.noise().mi_bound());
        // Under P itself the dense value is the certificate (ρ = 1).
        prop_assert!(dense_mi_under(&cal, &class_mass(&cal, &pw)) <= bb * (1.0 + 1e-6));
    }
}

/// The example of docs/assurance/accounting.md §4–5: m = 128, one teacher dissents,
/// the noise is calibrated to the uniform prior (a fresh or reset session),
/// but the adversary's true posterior puts ½ on the dissenter and ½ on one
/// agreeing subset. One release then leaks ≈ 31·b, not b — exactly computed
/// for the binary-input Gaussian channel — and stays below ρ·b = 64·b.
#[test]
fn noise_calibrated_to_a_stale_posterior_leaks_far_more_than_b() -> Result<(), PrivacyError> {
    let bb = 2f64.powi(-10);
    let mut labels = vec![0; 128];
    labels[0] = 1;
    let cal = calibrate(&Posterior::uniform(128)?, &labels, 2, b(bb))?;
    let var = cal.noise().variances()[0];
    let along = |s: usize| cal.noise().basis()[[cal.position_of_teacher(s).expect("exists"), 0]];
    // Y = ±1/√2 + N(0, var), the two signs equally likely under Q.
    let (mu0, mu1) = (along(0), along(1));
    let steps = 20_000;
    let half = mu0.abs().max(mu1.abs()) + 12.0 * var.sqrt();
    let h = 2.0 * half / f64::from(steps);
    let dens = |y: f64, mu: f64| (-(y - mu).powi(2) / (2.0 * var)).exp() / (2.0 * std::f64::consts::PI * var).sqrt();
    let mut leak = 0.0;
    for i in 0..steps {
        let y = -half + (f64::from(i) + 0.5) * h;
        let (f0, f1) = (dens(y, mu0), dens(y, mu1));
        let mix = 0.5 * (f0 + f1);
        for f in [f0, f1] {
            if f > 0.0 {
                leak += 0.5 * f * (f / mix).ln() * h;
            }
        }
    }
    assert!(leak > 30.0 * bb, "a stale posterior should leak ≈ 31 b, got {} b", leak / bb);
    assert!(leak <= 64.0 * bb, "ρ·b bounds it: {} b", leak / bb);
    Ok(())
}

/// docs/assurance/accounting.md §2, why the opt-in noisy vector must be rounded: the
/// unrounded release names its centre in its low-order bits. With two
/// active classes the noise is ±z, so r_c = fl(1 + z) and r_o = −z exactly:
/// r_c = fl(1 − r_o) always holds, r_o = fl(1 − r_c) only when 1 + z happened
/// to be exact. (Never returned unrounded: only the argmax leaves by default.)
#[test]
fn the_unrounded_release_names_its_centre_in_its_low_bits() -> Result<(), PrivacyError> {
    let cal = calibrate(&Posterior::uniform(4)?, &[0, 0, 1, 1], 2, b(1.0))?;
    let mut rng = ChaCha20Rng::seed_from_u64(4);
    let draws = 10_000;
    for centre in 0..2 {
        let other = 1 - centre;
        let mut named = 0;
        for _ in 0..draws {
            let r = cal.release_block(centre, &cal.noise().sample(&mut rng));
            assert_eq!(r[centre], 1.0 - r[other], "the centre is always 1 − the other, exactly");
            named += usize::from(r[other] != 1.0 - r[centre]);
        }
        assert!(named > draws / 2, "only {named} of {draws} draws gave the centre away");
    }
    Ok(())
}

/// The mechanism's linear update (groups reused from calibration) is bit
/// for bit what replay computes from the labels and the journaled
/// per-teacher vector alone.
fn assert_update_matches_replay(
    cal: &LabelCalibration,
    labels: &[usize],
    start: &Posterior,
    center: usize,
    draw: &NoiseDraw,
) {
    let mut served = start.clone();
    let teacher = cal.update_posterior(&mut served, center, draw).expect("updates");
    assert_eq!(teacher, cal.teacher_log_likelihoods(center, draw));
    let mut replayed = start.clone();
    replayed.update_by(UpdateRule::Linear, labels, teacher.view()).expect("replays");
    assert!(served.form().same_bits(replayed.form()));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn the_served_update_is_the_replayed_one_bit_for_bit((log_w, raw, d, e) in adversarial_case(), seed in any::<u64>()) {
        let labels: Vec<usize> = raw.iter().map(|&y| (y * 7919) % d).collect();
        let start = posterior_from(log_w);
        let cal = calibrate(&start, &labels, d, b(2f64.powi(-e))).expect("calibrates");
        prop_assume!(!cal.unanimous());
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let draw = cal.noise().sample(&mut rng);
        let center = rng.random_range(0..cal.classes().len());
        assert_update_matches_replay(&cal, &labels, &start, center, &draw);
    }
}

/// With no noise drawn and a uniform posterior over balanced classes, two
/// classes can get the same log-likelihood bits; they are still two groups
/// (groups are labels), on the server and in replay alike.
#[test]
fn classes_with_equal_log_likelihoods_update_as_replay_groups_them() -> Result<(), PrivacyError> {
    let mut found = 0;
    for k in 3..=8 {
        let labels: Vec<usize> = (0..4 * k).map(|i| i % k).collect();
        let start = Posterior::uniform(labels.len())?;
        let cal = calibrate(&start, &labels, k, b(2f64.powi(-10)))?;
        let zero = NoiseDraw { std_coef: Array1::zeros(cal.noise().rank()), residual: Array1::zeros(0) };
        for center in 0..k {
            let bits: Vec<u64> = cal.class_log_likelihoods(center, &zero).iter().map(|x| x.to_bits()).collect();
            if bits.iter().enumerate().any(|(c, x)| bits[..c].contains(x)) {
                found += 1;
            }
            assert_update_matches_replay(&cal, &labels, &start, center, &zero);
        }
    }
    assert!(found > 0, "no case with coinciding log-likelihoods was exercised");
    Ok(())
}
