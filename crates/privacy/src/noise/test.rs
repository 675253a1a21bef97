use super::*;
use chacha20::ChaCha20Rng;
use ndarray::array;
use proptest::prelude::*;
use rand::SeedableRng;

fn basis(u: Array2<f64>) -> Orthonormal {
    Orthonormal::check(u).expect("orthonormal")
}

fn b(x: f64) -> Nats {
    Nats::new(x).expect("valid")
}

proptest! {
    /// Theorem 2.4's closed form: with q the exact eigenvalues, ½Σ q/σ = b.
    #[test]
    fn theorem_2_4_spends_exactly_b(q in prop::collection::vec(1e-12f64..1.0, 1..50), e in 4i32..40) {
        let bb = 2f64.powi(-e);
        let s = theorem_2_4(&q, bb);
        let mi: f64 = 0.5 * q.iter().zip(&s).map(|(q, s)| q / s).sum::<f64>();
        prop_assert!((mi - bb).abs() <= 1e-12 * bb);
        // σ_i ∝ √λ_i: more noise where the teachers disagree more.
        for i in 1..q.len() {
            prop_assert_eq!(q[i] > q[i - 1], s[i] > s[i - 1]);
        }
    }
}

#[test]
fn certified_noise_spends_at_most_b_and_nearly_all_of_it() -> Result<(), PrivacyError> {
    let u = array![[std::f64::consts::FRAC_1_SQRT_2], [-std::f64::consts::FRAC_1_SQRT_2]];
    let n = Noise::certified(3, vec![0, 2], basis(u), &[0.375], 0.0, b(2f64.powi(-8)))?;
    assert!(n.mi_bound() <= 2f64.powi(-8) * (1.0 - CERTIFICATE_MARGIN));
    assert!(n.mi_bound() >= 2f64.powi(-8) * (1.0 - 2.0 * CALIBRATION_SLACK));
    // σ = q/(2b) for a single direction.
    assert!((n.variances()[0] - 0.375 * 128.0).abs() < 1e-6);
    // Inactive coordinate 1 gets no noise at all.
    let dense = n.dense();
    assert_eq!(dense.row(1).iter().map(|x| x.abs()).sum::<f64>(), 0.0);
    Ok(())
}

#[test]
fn zero_signal_directions_get_the_floor_not_zero() -> Result<(), PrivacyError> {
    // η = 0 (a basis known exactly orthonormal), so the floor is all q = 0 gets.
    let exact = Orthonormal { u: Array2::<f64>::eye(2), eta: 0.0 };
    let n = Noise::certified(2, vec![0, 1], exact, &[0.0, 0.25], 0.0, b(1e-3))?;
    // The floor: no variance below resolvable_floor of the largest (the
    // key audit resolves it), nor, as calibrated before committed noise,
    // below dynamic_range_floor.
    assert_eq!(n.variances()[0], n.variances()[1] * resolvable_floor(2));
    assert!(resolvable_floor(2) > dynamic_range_floor(2));
    assert!(n.variances()[0] > VARIANCE_FLOOR && n.variances()[1] > 1.0);
    let exact = Orthonormal { u: Array2::<f64>::eye(2), eta: 0.0 };
    let old = Noise::certified_with_floor(2, vec![0, 1], exact, &[0.0, 0.25], 0.0, b(1e-3), 0.0, Floor::RoundOff)?;
    assert_eq!(old.variances()[0], old.variances()[1] * dynamic_range_floor(2));
    assert_eq!(old.variances()[1], n.variances()[1]);
    // The checked identity carries the rounding allowance of UᵀU: a zero
    // direction is then charged (κ·√Σq)², ~10⁻¹⁵ of the other's variance.
    // (Under the round-off floor, which is lower.)
    let checked = basis(Array2::eye(2));
    let n = Noise::certified_with_floor(2, vec![0, 1], checked, &[0.0, 0.25], 0.0, b(1e-3), 0.0, Floor::RoundOff)?;
    assert!(n.variances()[0] >= VARIANCE_FLOOR && n.variances()[0] < 1e-12 * n.variances()[1]);
    Ok(())
}

#[test]
fn refuses_bad_bases_and_tiny_budgets() {
    let skew = array![[1.0, 0.1], [0.0, 1.0]];
    assert!(matches!(Orthonormal::check(skew), Err(PrivacyError::Uncertified(_))));
    let u = Array2::<f64>::eye(1);
    assert!(matches!(
        Noise::certified(1, vec![0], basis(u.clone()), &[0.1], 0.0, b(1e-31)),
        Err(PrivacyError::PerQueryTooSmall { .. })
    ));
    assert!(matches!(
        Noise::certified(1, vec![0], basis(u.clone()), &[f64::NAN], 0.0, b(0.1)),
        Err(PrivacyError::NonFinite(_))
    ));
    assert!(matches!(Noise::certified(1, vec![3], basis(u), &[0.1], 0.0, b(0.1)), Err(PrivacyError::Shape(_))));
}

#[test]
fn residual_signal_gets_isotropic_noise_within_its_share() -> Result<(), PrivacyError> {
    // One basis direction in ℝ³ and a residual outside it.
    let u = array![[1.0], [0.0], [0.0]];
    let n = Noise::certified(3, vec![0, 1, 2], basis(u), &[0.2], 1e-6, b(0.01))?;
    assert!(n.complement() >= 1e-6 / (2.0 * 0.01 * RESIDUAL_SHARE) * 0.999);
    assert!(n.mi_bound() <= 0.01);
    // Σ is full rank: range(C) ⊆ range(Σ) whatever C is.
    let (eig, _) = ndarray_linalg::Eigh::eigh(&n.dense(), ndarray_linalg::UPLO::Lower)?;
    assert!(eig.iter().all(|&e| e > 0.0));
    Ok(())
}

/// The sampler's empirical covariance matches Σ.
#[test]
fn samples_have_the_calibrated_covariance() -> Result<(), PrivacyError> {
    let h = crate::label::helmert(3);
    let n = Noise::certified(3, vec![0, 1, 2], basis(h), &[0.1, 0.3], 0.0, b(0.5))?;
    let sigma = n.dense();
    let mut rng = ChaCha20Rng::seed_from_u64(7);
    let draws = 40_000;
    let mut acc = Array2::<f64>::zeros((3, 3));
    for _ in 0..draws {
        let z = n.noise_vector(&n.sample(&mut rng));
        acc += &z.view().insert_axis(ndarray::Axis(1)).dot(&z.view().insert_axis(ndarray::Axis(0)));
    }
    acc /= draws as f64;
    for ((i, j), s) in sigma.indexed_iter() {
        // Standard error of a covariance estimate ≈ √((Σii Σjj + Σij²)/n).
        let se = ((sigma[[i, i]] * sigma[[j, j]] + s * s) / draws as f64).sqrt();
        assert!((acc[[i, j]] - s).abs() < 5.0 * se + 1e-12, "entry {i},{j}: {} vs {s}", acc[[i, j]]);
    }
    Ok(())
}

/// tr(Σ⁻¹C) for the covariance the sampler really draws from a basis U,
/// variances v and complement f (`Noise::sample_from`: coefficients Uᵀg,
/// whose covariance is UᵀU): Σ = U·diag(√v)·UᵀU·diag(√v)·Uᵀ + f·(I − UUᵀ)².
fn sampled_trace(u: &Array2<f64>, v: &[f64], f: f64, c: &Array2<f64>) -> f64 {
    let n = u.nrows();
    let scaled =
        u * &ndarray::Array1::from(v.iter().map(|v| v.sqrt()).collect::<Vec<_>>()).insert_axis(ndarray::Axis(0));
    let p_perp = Array2::<f64>::eye(n) - u.dot(&u.t());
    let sigma = scaled.dot(&u.t().dot(u)).dot(&scaled.t()) + p_perp.dot(&p_perp) * f;
    // tr(Σ⁻¹C) = Σ_k e_kᵀCe_k/σ_k over Σ's eigenpairs.
    let (sig, e) = ndarray_linalg::Eigh::eigh(&sigma, ndarray_linalg::UPLO::Lower).expect("symmetric");
    (0..n).map(|k| e.column(k).dot(&c.dot(&e.column(k))) / sig[k]).sum()
}

/// A basis checked from another UᵀU (`Orthonormal::from_gram`, vector
/// mode's check from G): within `most` ≤ `rounding` of the identity, η is
/// 2·rounding·(1 + 10⁻⁶) whatever was computed, so two machines' kernels
/// charge the same; past `most`, or with η ≥ ½, it is refused and the
/// basis handed back.
#[test]
fn a_basis_checked_from_another_gram_matrix_is_charged_its_rounding() {
    let u = crate::label::helmert(4);
    let r = u.ncols();
    let rounding = 1e-6;
    for skew in [0.0, 1e-9, 1e-7] {
        let gram = Array2::<f64>::eye(r) + skew;
        let checked = Orthonormal::from_gram(u.clone(), &gram, rounding, 0.5 * rounding).expect("within the share");
        assert_eq!(checked.eta(), 2.0 * rounding * (1.0 + 1e-6), "skew {skew}");
    }
    let far = Array2::<f64>::eye(r) + 1e-6;
    let declined = Orthonormal::from_gram(u.clone(), &far, rounding, 0.5 * rounding).expect_err("past the share");
    assert_eq!(declined.1, u);
    assert!(Orthonormal::from_gram(u.clone(), &Array2::eye(r), 0.3, 0.3).is_err(), "η ≥ ½");
    assert!(Orthonormal::from_gram(u.clone(), &Array2::eye(r + 1), rounding, rounding).is_err(), "shape");
}

proptest! {
    /// The charge for a basis that is not exactly orthonormal
    /// (`privacy-core.md` §2): for the covariance the sampler really
    /// draws, the exact tr(Σ⁻¹C) stays below (Σ_j q̃_j/v_j + ρ/f)/(1 − η)
    /// with ρ the uncharged ‖X(I − UUᵀ)‖²_F, what `Noise::certified`
    /// certifies. Skews far beyond the tolerance (η up to
    /// 0.2) so that the inequality, not round-off, is what is tested; half
    /// the cases put the signal inside span(U) with a tiny f, where a
    /// direction whose own q_j is 0 still sees its neighbour's signal.
    #[test]
    fn the_charge_covers_a_skewed_basis(seed in any::<u64>(), skew in 0.0f64..0.1, f in 1e-3f64..1.0, inside in any::<bool>()) {
        use rand::RngExt;
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let (n, r, m) = (5, 3, 4);
        // Orthonormal columns, then a skew: u₁ ← (u₁ + s·u₂)/‖·‖.
        let a = Array2::from_shape_fn((n, r), |_| rng.random_range(-1.0..1.0));
        let (q_factor, _) = ndarray_linalg::QR::qr(&a).expect("qr");
        let mut u = q_factor.slice_axis(ndarray::Axis(1), (0..r).into()).to_owned();
        let tilted = &u.column(0) + &(&u.column(1) * skew);
        let norm = tilted.dot(&tilted).sqrt();
        u.column_mut(0).assign(&(tilted / norm));
        let gram = u.t().dot(&u) - Array2::<f64>::eye(r);
        let eta = gram.iter().map(|x| x * x).sum::<f64>().sqrt() * 1.001;
        let basis = Orthonormal { u: u.clone(), eta };

        // Signal anywhere, or only along the original u₂ (then u₁'s own
        // q is small and the tilt is all that reaches it).
        let x = if inside {
            let coef = Array2::from_shape_fn((m, 1), |_| rng.random_range(-1.0..1.0));
            coef.dot(&q_factor.column(1).insert_axis(ndarray::Axis(0)))
        } else {
            Array2::from_shape_fn((m, n), |_| rng.random_range(-1.0..1.0))
        };
        let f = if inside { f * 1e-9 } else { f };
        let c = x.t().dot(&x);
        // (Exact zeros come out as ±10⁻¹⁷; a caller's bound is never negative.)
        let q: Vec<f64> = (0..r).map(|j| u.column(j).dot(&c.dot(&u.column(j))).max(0.0)).collect();
        let res = &x - &x.dot(&u).dot(&u.t());
        let residual = res.iter().map(|x| x * x).sum::<f64>();
        let q_charged = basis.charge(&q);

        let v: Vec<f64> = q_charged.iter().map(|q| q.sqrt().max(1e-300) + rng.random_range(0.0..1.0)).collect();
        let exact = sampled_trace(&u, &v, f, &c);
        let charged = (q_charged.iter().zip(&v).map(|(q, v)| q / v).sum::<f64>() + residual / f) / (1.0 - eta);
        prop_assert!(exact <= charged * (1.0 + 1e-9), "exact {exact} > charged {charged} at η = {eta}");
    }

    /// `Orthonormal::check`'s η bounds the spectral norm of UᵀU − I, which
    /// is what the charge's argument needs.
    #[test]
    fn eta_bounds_the_spectral_deviation(seed in any::<u64>(), n in 2usize..40, tilt in 0.0f64..1e-11) {
        use rand::RngExt;
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let r = (n / 2).max(1);
        let a = Array2::from_shape_fn((n, r), |_| rng.random_range(-1.0..1.0));
        let (q_factor, _) = ndarray_linalg::QR::qr(&a).expect("qr");
        let mut u = q_factor.slice_axis(ndarray::Axis(1), (0..r).into()).to_owned();
        u.mapv_inplace(|x| x * (1.0 + tilt * rng.random_range(-1.0..1.0)));
        let basis = Orthonormal::check(u.clone()).expect("within tolerance");
        let deviation = u.t().dot(&u) - Array2::<f64>::eye(r);
        let (eig, _) = ndarray_linalg::Eigh::eigh(&deviation, ndarray_linalg::UPLO::Lower).expect("symmetric");
        let spectral = eig.iter().fold(0.0f64, |a, e| a.max(e.abs()));
        prop_assert!(basis.eta >= spectral, "η {} < ‖UᵀU − I‖₂ {spectral}", basis.eta);
    }
}

/// The case a per-direction charge (q_j(1 + κ)²) gets badly wrong: u₁ = e₁
/// sees none of the signal (q₁ = 0, so its variance would be the 10⁻²⁵⁰
/// floor) but u₂ leans into it, and C's mass along e₂ reaches the sampled
/// noise through u₁. Through `Noise::certified`, the exact ½tr(Σ⁻¹C) of
/// what is drawn stays within b.
#[test]
fn a_direction_without_signal_is_charged_for_its_neighbours() -> Result<(), PrivacyError> {
    let lean = 0.05f64;
    let u = array![[1.0, lean], [0.0, (1.0 - lean * lean).sqrt()], [0.0, 0.0]];
    let eta = (2.0 * lean * lean).sqrt() * 1.001; // ‖UᵀU − I‖_F
    let mut c = Array2::<f64>::zeros((3, 3));
    c[[1, 1]] = 1.0;
    let q = [0.0, 1.0 - lean * lean];
    let residual = 0.0; // the signal lies in span(U)
    let bb = 0.5;
    let n = Noise::certified(3, vec![0, 1, 2], Orthonormal { u: u.clone(), eta }, &q, residual, b(bb))?;
    assert!(n.variances()[0] > 1e-6, "u₁ got {:e}", n.variances()[0]);
    // Σ as the sampler draws it (coefficients Uᵀg, of covariance UᵀU), on
    // span(U) only (f = 0): invert it on that plane.
    let plane = u.slice_axis(ndarray::Axis(0), (0..2).into()).to_owned();
    let root = Array2::from_diag(&n.variances().mapv(f64::sqrt));
    let sigma = plane.dot(&root).dot(&u.t().dot(&u)).dot(&root).dot(&plane.t());
    let det = sigma[[0, 0]] * sigma[[1, 1]] - sigma[[0, 1]] * sigma[[1, 0]];
    let exact = 0.5 * sigma[[0, 0]] / det * c[[1, 1]]; // (Σ⁻¹)₁₁ · C₁₁
    assert!(exact <= bb, "½tr(Σ⁻¹C) = {exact} > b = {bb}");
    Ok(())
}

#[test]
fn a_basis_with_nan_is_refused() {
    let u = array![[f64::NAN], [0.0]];
    assert!(matches!(Orthonormal::check(u), Err(PrivacyError::Uncertified(_))));
}
