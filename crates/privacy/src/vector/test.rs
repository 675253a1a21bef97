use super::*;
use crate::noise::Floor;
use chacha20::ChaCha20Rng;
use proptest::prelude::*;
use rand::{RngExt, SeedableRng};

fn b(x: f64) -> Nats {
    Nats::new(x).expect("valid")
}

#[test]
fn identical_vectors_are_exact() -> Result<(), PrivacyError> {
    let v = Array2::from_shape_fn((8, 4), |(_, j)| j as f64 * 0.1);
    let cal = calibrate(&Posterior::uniform(8)?, v.view(), b(2f64.powi(-32)))?;
    assert!(cal.unanimous());
    Ok(())
}

#[test]
fn agreement_directions_get_negligible_noise() -> Result<(), PrivacyError> {
    // Teachers disagree only on coordinate 0; the others are identical.
    // NOTES.md: a dense eigh put variance 0.3–3 there at b = 2⁻³².
    let mut v = Array2::from_elem((128, 10), 0.25);
    for i in 0..128 {
        v[[i, 0]] = if i % 2 == 0 { 0.9 } else { 0.1 };
    }
    let cal = calibrate(&Posterior::uniform(128)?, v.view(), b(2f64.powi(-32)))?;
    let sigma = cal.noise().dense();
    assert!(sigma[[0, 0]] > 1e6);
    // The complement's floor for the key audit (COMPLEMENT_RESOLUTION): a
    // thousandth of the main noise's standard deviation.
    for j in 1..10 {
        assert!(sigma[[j, j]] <= 2e-6 * sigma[[0, 0]], "coordinate {j} got variance {}", sigma[[j, j]]);
    }
    // As calibrated before committed noise: round-off's floor only.
    let old = calibrate_on(&Posterior::uniform(128)?, v.view(), b(2f64.powi(-32)), Path::Auto, Floor::RoundOff)?;
    let sigma = old.noise().dense();
    for j in 1..10 {
        assert!(sigma[[j, j]] < 1e-3, "coordinate {j} got variance {}", sigma[[j, j]]);
    }
    Ok(())
}

#[test]
fn wrong_shapes_and_values_are_rejected() -> Result<(), PrivacyError> {
    let p = Posterior::uniform(3)?;
    assert!(matches!(calibrate(&p, Array2::zeros((2, 2)).view(), b(0.1)), Err(PrivacyError::TeacherCount { .. })));
    assert!(matches!(calibrate(&p, Array2::zeros((3, 0)).view(), b(0.1)), Err(PrivacyError::Shape(_))));
    let mut v = Array2::zeros((3, 2));
    v[[1, 1]] = f64::INFINITY;
    assert!(matches!(calibrate(&p, v.view(), b(0.1)), Err(PrivacyError::NonFinite(_))));
    Ok(())
}

/// A teacher with a weight near 1e-300 whose output differs from the
/// others' by 1e-6: every term of the residual bound underflows to 0 (the
/// case proptest found with seed 5691014856312840328, m = 2, d = 3). The
/// complement still gets noise.
#[test]
fn a_residual_bound_lost_to_underflow_still_covers_the_complement() -> Result<(), PrivacyError> {
    let p = Posterior::from_log_weights(vec![0.0, -690.0]).expect("finite");
    let mut v = Array2::from_shape_vec((2, 3), vec![0.5, 0.25, 0.125, 0.5, 0.25, 0.125]).expect("2 × 3");
    v[[1, 0]] += 1e-6;
    let cal = calibrate(&p, v.view(), b(2f64.powi(-4)))?;
    let n = cal.noise();
    assert!(!cal.unanimous() && n.rank() < 3);
    assert!(n.complement() >= crate::noise::VARIANCE_FLOOR, "complement {}", n.complement());
    assert!(n.mi_bound() <= 2f64.powi(-4));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Adversarial posteriors, d up to 1000 (more outputs than teachers, so
    /// a residual outside the SVD basis must be covered): always certified,
    /// floored, full rank where needed.
    #[test]
    fn adversarial_vector_calibrations_are_certified(seed in any::<u64>(), m in 2usize..=128, d in 1usize..=1000, e in 4i32..=40) {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let log_w: Vec<f64> = (0..m).map(|_| if rng.random_bool(0.3) { -690.0 } else { rng.random_range(-30.0..0.0) }).collect();
        let v = Array2::from_shape_fn((m, d), |_| if rng.random_bool(0.5) { 0.0 } else { rng.random_range(0.0..1.0) });
        let bb = 2f64.powi(-e);
        let cal = calibrate(&Posterior::from_log_weights(log_w).expect("finite"), v.view(), b(bb)).expect("calibrates");
        let n = cal.noise();
        prop_assert!(n.mi_bound() <= bb * (1.0 - crate::noise::CERTIFICATE_MARGIN));
        prop_assert!(n.variances().iter().all(|&x| x >= crate::noise::VARIANCE_FLOOR));
        if n.rank() < d && !cal.unanimous() {
            prop_assert!(n.complement() > 0.0);
        }
    }
}

/// `pacpriv-bench math --vector`'s scores: m = 128 teachers, mostly
/// agreeing, with a deterministic per-teacher jitter in [0, 0.01).
fn jittered_scores(m: usize, d: usize) -> Array2<f64> {
    Array2::from_shape_fn((m, d), |(i, j)| {
        let base = if j == 0 { 0.8 } else { 0.2 / d as f64 };
        base + ((i * 7919 + j * 104_729) % 1000) as f64 / 1e5
    })
}

fn spread_posterior(m: usize, spread: f64, seed: u64) -> Posterior {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    Posterior::from_log_weights((0..m).map(|_| rng.random_range(-spread..0.0)).collect()).expect("finite")
}

/// Issues 44 §3 and 56 §1: with weights within e⁸ of each other the basis
/// comes from a Gram matrix at every d — the d × d C when d ≤ m, the m × m
/// K above — and the noise is the SVD path's: the same variances along the
/// same directions, up to round-off, and what the Gram basis leaves out
/// (the centring's null direction, round-off) gets the least isotropic
/// noise the block allows.
#[test]
fn the_gram_basis_gives_the_svd_paths_noise() -> Result<(), PrivacyError> {
    let bb = 2f64.powi(-32);
    for (m, d) in [(128, 1000), (128, 200), (128, 128), (128, 100), (128, 10), (8, 5), (8, 2)] {
        let v = jittered_scores(m, d);
        let p = spread_posterior(m, 8.0, 1);
        let gram = calibrate(&p, v.view(), b(bb))?;
        // The check from G charges its rounding on top (up to ~r·η more
        // variance; `coefficients_from_k_never_lower_a_variance`): the
        // same basis checked itself is what the SVD's noise is compared with.
        let gram = match gram.path_taken() {
            Some(Path::GramKeepingCheckedFromK(r)) => {
                calibrate_on(&p, v.view(), b(bb), Path::GramKeepingFromK(r), Floor::default())?
            }
            _ => gram,
        };
        let svd = calibrate_on(&p, v.view(), b(bb), Path::Svd, Floor::default())?;
        assert_eq!((gram.basis_source(), svd.basis_source()), (Basis::Gram, Basis::Svd), "m = {m}, d = {d}");
        for cal in [&gram, &svd] {
            assert!(cal.noise().mi_bound() <= bb * (1.0 - crate::noise::CERTIFICATE_MARGIN));
        }
        // Σ along each of X's singular directions: u_jᵀ Σ u_j from each path.
        let (gn, sn) = (gram.noise(), svd.noise());
        let top = sn.variances()[0];
        // Where the SVD's basis spans all d (d ≤ m) and the Gram basis
        // leaves a direction out, the complement takes its share of b, and
        // every variance is up to 1/(1 − 10⁻³) larger.
        let share =
            if (gn.complement() > 0.0) != (sn.complement() > 0.0) { 1.01 * crate::noise::RESIDUAL_SHARE } else { 0.0 };
        for j in 0..sn.rank() {
            let u = sn.basis().column(j);
            let along = |n: &Noise| {
                let c = n.basis().t().dot(&u);
                c.iter().zip(n.variances()).map(|(c, v)| c * c * (v - n.complement())).sum::<f64>() + n.complement()
            };
            let (g, s) = (along(gn), along(sn));
            // A direction with no signal the SVD keeps at the basis floor
            // lies in the Gram path's complement, whose floor is lower.
            let at_floor = s <= top * Floor::default().ratio(d) * (1.0 + 1e-9);
            assert!(
                (g - s).abs() <= 1e-6 * top + share * s || (at_floor && g <= s),
                "m = {m}, d = {d}, direction {j}: {g:e} vs {s:e}"
            );
        }
        let largest = gn.variances().iter().copied().fold(0.0, f64::max);
        let floor = (largest * crate::noise::dynamic_range_floor(d))
            .max(crate::noise::COMPLEMENT_RESOLUTION * gn.variances().sum());
        assert!(gn.complement() <= floor * (1.0 + 1e-9), "m = {m}, d = {d}");
    }
    Ok(())
}

/// A posterior that has concentrated (weights over e⁻¹⁰⁰…1) spreads K's
/// spectrum past what the Gram basis can resolve: the SVD serves it,
/// keeping its directions of singular value at least [`SVD_KEEP`] of the
/// largest (issue 70) and journaling how many, which a verifier follows
/// to the same Σ and no other count.
#[test]
fn a_concentrated_posterior_falls_back_to_the_svd() -> Result<(), PrivacyError> {
    let (m, d) = (128, 1000);
    let v = jittered_scores(m, d);
    let p = spread_posterior(m, 100.0, 2);
    let bb = b(2f64.powi(-32));
    let cal = calibrate(&p, v.view(), bb)?;
    assert_eq!(cal.basis_source(), Basis::Svd);
    let r = cal.noise().rank();
    assert_eq!(cal.path_taken(), Some(Path::SvdKeeping(r)));
    // The weakest teachers' directions, and the centring's null one, left out.
    assert!(r < m - 1, "kept {r}");
    let x = weighted(&p, &v);
    let sigma = x.dot(cal.noise().basis()).columns().into_iter().map(|c| c.dot(&c).sqrt()).collect::<Vec<_>>();
    let top = sigma.iter().copied().fold(0.0, f64::max);
    assert!(sigma.iter().all(|&s| s >= 0.999 * SVD_KEEP * top), "{sigma:?}");

    let followed = calibrate_on(&p, v.view(), bb, Path::SvdKeeping(r), Floor::default())?;
    assert_eq!(followed.noise().dense(), cal.noise().dense());
    for other in [r - 1, r + 1, 0, m] {
        let refused = calibrate_on(&p, v.view(), bb, Path::SvdKeeping(other), Floor::default());
        assert!(matches!(refused, Err(PrivacyError::Linalg(_))), "{other} directions accepted");
    }
    // As before issue 70, all min(m, d): the journal says so with rank 0.
    let all = calibrate_on(&p, v.view(), bb, Path::Svd, Floor::default())?;
    assert_eq!((all.noise().rank(), all.path_taken()), (m, Some(Path::Svd)));
    assert_eq!(Path::from_code(1, 0), Some(Path::Svd));
    assert_eq!(Path::from_code(1, r as u32), Some(Path::SvdKeeping(r)));
    Ok(())
}

/// A posterior with all its weight on one teacher makes X = 0 although the
/// outputs differ: the SVD keeps every direction (no threshold to cut at),
/// and a journaled rank other than all of them is refused — every count
/// would otherwise pass the band around a threshold of 0.
#[test]
fn a_posterior_on_one_teacher_keeps_every_svd_direction() -> Result<(), PrivacyError> {
    let (m, d) = (4, 9);
    let v = jittered_scores(m, d);
    let p = Posterior::from_log_weights(vec![0.0, f64::NEG_INFINITY, f64::NEG_INFINITY, f64::NEG_INFINITY])?;
    let bb = b(2f64.powi(-32));
    let cal = calibrate(&p, v.view(), bb)?;
    assert_eq!((cal.basis_source(), cal.path_taken()), (Basis::Svd, Some(Path::SvdKeeping(m))));
    for r in 1..m {
        let refused = calibrate_on(&p, v.view(), bb, Path::SvdKeeping(r), Floor::default());
        assert!(matches!(refused, Err(PrivacyError::Linalg(_))), "{r} directions accepted");
    }
    Ok(())
}

/// A step's calibration rules leave one path open for given outputs:
/// under [`RULES`] 1 neither path 2 at d > m (the coefficients in output
/// space where K gives the basis) nor the SVD with no rank; under 0 (steps
/// from before), both; path 4 (the check from G) only under 2, at d > m.
#[test]
fn a_steps_rules_rule_out_the_paths_its_server_never_takes() {
    let (m, wide, narrow) = (8, 10, 5);
    for path in [Path::Svd, Path::SvdKeeping(3), Path::GramKeeping(3), Path::GramKeepingFromK(3)] {
        assert_eq!(path.refused_under(0, m, wide), None, "{path:?}");
    }
    for rules in [1, 2] {
        assert!(Path::GramKeeping(3).refused_under(rules, m, wide).is_some());
        assert_eq!(Path::GramKeeping(3).refused_under(rules, m, narrow), None);
        assert!(Path::Svd.refused_under(rules, m, narrow).is_some());
        for path in [Path::SvdKeeping(3), Path::GramKeepingFromK(3)] {
            assert_eq!(path.refused_under(rules, m, wide), None, "{path:?}");
        }
    }
    let checked = Path::GramKeepingCheckedFromK(3);
    for rules in [0, 1] {
        assert!(checked.refused_under(rules, m, wide).is_some(), "rules {rules}");
    }
    assert!(checked.refused_under(2, m, narrow).is_some());
    assert_eq!(checked.refused_under(2, m, wide), None);
    assert_eq!(Path::from_code(4, 3), Some(checked));
    assert_eq!(checked.code(), (4, 3));
}

/// X = diag(√w)(V − 1μᵀ), as the calibration forms it.
fn weighted(p: &Posterior, v: &Array2<f64>) -> Array2<f64> {
    let w = p.weights();
    let centred = v - &w.dot(v).view().insert_axis(Axis(0));
    centred * w.mapv(f64::sqrt).view().insert_axis(Axis(1))
}

/// ‖UUᵀ − U′U′ᵀ‖_F: how far apart two bases' spans are.
fn span_distance(u: &Array2<f64>, other: &Array2<f64>) -> f64 {
    let diff = u.dot(&u.t()) - other.dot(&other.t());
    diff.iter().map(|x| x * x).sum::<f64>().sqrt()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Issue 70: the SVD path's basis is a function of X up to round-off,
    /// as the key audit needs of Σ on any machine's kernels. X moved by an
    /// ulp or so per entry (what another machine's kernels do to its
    /// factorisation) spans the same kept directions to within 10⁻⁶. Kept
    /// all, as before issue 70, at d > m one direction is rounding's pick
    /// from X's null space, and this fails.
    #[test]
    fn the_svd_basis_is_the_same_on_round_off(
        seed in any::<u64>(),
        m in 2usize..=32,
        wide in 1usize..=64,
        spread in 0.0f64..=30.0,
    ) {
        let d = m + wide;
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let log_w: Vec<f64> = (0..m).map(|_| rng.random_range(-spread..=0.0)).collect();
        let p = Posterior::from_log_weights(log_w).expect("finite");
        let v = Array2::from_shape_fn((m, d), |_| if rng.random_bool(0.3) { 0.0 } else { rng.random_range(0.0..1.0) });
        let x = weighted(&p, &v);
        let nudged = x.mapv(|e| e * (1.0 + f64::EPSILON * rng.random_range(-2.0..=2.0)));
        let here = svd_basis(&x, SvdKeep::Strong).expect("an SVD");
        let there = svd_basis(&nudged, SvdKeep::Strong).expect("an SVD");
        prop_assume!(here.matrix().ncols() == there.matrix().ncols());
        let apart = span_distance(here.matrix(), there.matrix());
        prop_assert!(apart <= 1e-6, "m = {}, d = {}: kept spans {:e} apart", m, d, apart);
    }
}

/// x·y to about twice working precision (Ogita, Rump and Oishi's Dot2:
/// each product split exactly by an FMA, the sum compensated): the
/// reference the a-priori allowance is checked against.
fn dot2(x: impl Iterator<Item = f64>, y: impl Iterator<Item = f64>) -> f64 {
    let (mut sum, mut carry) = (0.0f64, 0.0f64);
    for (a, b) in x.zip(y) {
        let p = a * b;
        let p_low = a.mul_add(b, -p);
        let s = sum + p;
        let z = s - sum;
        carry += (sum - (s - z)) + (p - z) + p_low;
        sum = s;
    }
    sum + carry
}

/// The verifier's bands around the server's limits for the check from G
/// nest: what every server takes (`ALWAYS`) inside what a server takes,
/// inside what a verifier follows (`FOLLOWING`), in each of R, the
/// underflow gate and the computed deviation, whose share of R stays ≤ 1
/// so that η is 2R on every machine.
#[test]
fn the_check_from_gs_bands_nest() {
    let (always, server, following) = (Limits::ALWAYS, Limits::SERVER, Limits::FOLLOWING);
    assert!(always.rounding < server.rounding && server.rounding < following.rounding);
    assert!(always.safe < server.safe && server.safe < following.safe);
    assert!(always.deviation < server.deviation && server.deviation < following.deviation);
    assert!(following.deviation <= 1.0);
}

/// Issue 70 §5: the inputs vector mode is measured on against numpy
/// (m = 128, d = 1 000, the bench's posterior) check the basis from G,
/// saving a d × r × r product.
#[test]
fn the_bench_checks_from_g() {
    let (m, d) = (128, 1000);
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let p = Posterior::from_log_weights((0..m).map(|_| rng.random_range(-8.0..0.0)).collect()).expect("finite");
    let v = jittered_scores(m, d);
    let cal = calibrate(&p, v.view(), b(2f64.powi(-32))).expect("calibrates");
    assert_eq!(cal.path_taken(), Some(Path::GramKeepingCheckedFromK(cal.noise().rank())));
}

/// The adversarial inputs of the tests of K's coefficients and of the
/// check from G: a posterior with weights down to e⁻`spread` and ~e⁻⁶⁹⁰,
/// and m × d outputs around `offset` (so that centring cancels), sparse
/// or not, scaled by `scale` (scaled down, G's entries and products reach
/// the subnormals).
fn adversarial(
    seed: u64,
    m: usize,
    d: usize,
    spread: f64,
    offset: f64,
    sparse: bool,
    scale: f64,
) -> (Posterior, Array2<f64>) {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let log_w: Vec<f64> =
        (0..m).map(|_| if rng.random_bool(0.1) { -690.0 } else { rng.random_range(-spread..=0.0) }).collect();
    let v = Array2::from_shape_fn((m, d), |_| {
        scale * if sparse && rng.random_bool(0.7) { offset } else { offset + rng.random_range(-1.0..1.0) }
    });
    (Posterior::from_log_weights(log_w).expect("finite"), v)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// Issue 70: K's coefficients (G·A·diag(N), m × m × r) are within
    /// their a-priori allowance of the exact coefficients of the basis as
    /// computed, (V − 1μᵀ)·U evaluated to twice working precision, in the
    /// weighted norm the certificate reads, on every kept direction —
    /// under adversarial posteriors (weights down to e⁻³⁰ and ~e⁻⁶⁹⁰,
    /// heavy and zero-heavy outputs, offsets that make centring cancel).
    #[test]
    fn coefficients_from_k_are_within_their_allowance(
        seed in any::<u64>(),
        m in 2usize..=64,
        extra in 1usize..=300,
        spread in 0.0f64..30.0,
        offset in -1e3f64..1e3,
        sparse in any::<bool>(),
        scale in prop::sample::select(vec![1.0, 1e-140, 1e-150, 1e150]),
    ) {
        let d = m + extra;
        let (p, v) = adversarial(seed, m, d, spread, offset, sparse, scale);
        let Centred { centred, w, sqrt_w, deviations } = Centred::new(&p, v.view());
        let Some(GramBasis { basis, from_k: Some(FromK { coef, spread, underflow }), .. }) =
            gram_basis(&centred, &sqrt_w, 1.0, None, Coefficients::FromK, Check::Either(Limits::SERVER), &deviations)
        else {
            // Declined (the SVD serves): nothing to check.
            return Ok(());
        };
        let x_norm = deviations.iter().zip(&w).map(|(dev, w)| w * dev).sum::<f64>().sqrt();
        let gamma_k = 4.0 * (d + 2 * m + 4) as f64 * f64::EPSILON;
        let u = basis.matrix();
        let r = u.ncols();
        let exact = Array2::from_shape_fn((m, r), |(i, j)| dot2(centred.row(i).iter().copied(), u.column(j).iter().copied()));
        let mut allowances = Vec::new();
        for j in 0..r {
            let error_sq: f64 = (0..m).map(|i| w[i] * (coef[[i, j]] - exact[[i, j]]).powi(2)).sum();
            let allowance = gamma_k * x_norm * spread[j] + 2.0 * underflow[j];
            prop_assert!(
                error_sq.sqrt() <= allowance,
                "direction {j} of {r}: error {:e} > allowance {allowance:e}",
                error_sq.sqrt()
            );
            allowances.push(allowance);
        }
        // The residual as calibrate_on forms it, against C − exact·Ûᵀ to
        // twice working precision: within the allowances' part of ρ̄'s
        // root plus γ‖X‖_F (the product's own rounding).
        let mut residual = centred.clone();
        general_mat_mul(-1.0, &coef, &u.t(), 1.0, &mut residual);
        let gamma = 4.0 * (d + r + 4) as f64 * f64::EPSILON;
        let moved = allowances.iter().map(|a| a * a).sum::<f64>().sqrt() * (1.0 + basis.eta());
        let error_sq: f64 = (0..m)
            .map(|i| {
                let row_sq: f64 = (0..d)
                    .map(|k| {
                        let terms = std::iter::once(centred[[i, k]]).chain(exact.row(i).into_iter().map(|c| -c));
                        let exact_res = dot2(terms, std::iter::once(1.0).chain(u.row(k).iter().copied()));
                        (residual[[i, k]] - exact_res).powi(2)
                    })
                    .sum();
                w[i] * row_sq
            })
            .sum();
        prop_assert!(error_sq.sqrt() <= moved + gamma * x_norm, "residual error {:e} > {:e}", error_sq.sqrt(), moved + gamma * x_norm);
    }

    /// Issue 70 §5: the orthonormality check from G bounds the basis as
    /// computed, ‖UᵀU − I‖_F with UᵀU to twice working precision, by its
    /// η — under the same adversarial posteriors and outputs as the
    /// coefficients above, and with no limit on G's rounding, so that the
    /// bound is tested where it is large, not only where a server takes it.
    /// (Scales of 10⁻¹³⁰ and 10⁻¹³² straddle the underflow gate.)
    #[test]
    fn the_check_from_g_bounds_the_basis(
        seed in any::<u64>(),
        m in 2usize..=64,
        extra in 1usize..=300,
        spread in 0.0f64..30.0,
        offset in -1e3f64..1e3,
        sparse in any::<bool>(),
        scale in prop::sample::select(vec![1.0, 1e-130, 1e-132, 1e-150, 1e150]),
    ) {
        let d = m + extra;
        let (p, v) = adversarial(seed, m, d, spread, offset, sparse, scale);
        let Centred { centred, sqrt_w, deviations, .. } = Centred::new(&p, v.view());
        let check = Check::FromG(Limits { rounding: f64::INFINITY, ..Limits::SERVER });
        let Some(GramBasis { basis, checked_from_g, .. }) =
            gram_basis(&centred, &sqrt_w, 1.0, None, Coefficients::FromK, check, &deviations)
        else {
            // Declined (underflow could reach the products, or η ≥ ½): nothing to check.
            return Ok(());
        };
        prop_assert!(checked_from_g);
        let u = basis.matrix();
        let r = u.ncols();
        let deviation_sq: f64 = (0..r)
            .flat_map(|j| (0..r).map(move |l| (j, l)))
            .map(|(j, l)| {
                let exact = dot2(u.column(j).iter().copied(), u.column(l).iter().copied());
                (exact - if j == l { 1.0 } else { 0.0 }).powi(2)
            })
            .sum();
        prop_assert!(deviation_sq.sqrt() <= basis.eta(), "‖UᵀU − I‖_F = {:e} > η = {:e}", deviation_sq.sqrt(), basis.eta());
    }

    /// Issue 70 §5: wherever a server checks the basis from G, the step is
    /// certified, the journaled path recomputes its Σ exactly, with more
    /// noise than the basis checked itself on every direction, never less,
    /// and at most what η ≤ 2·CHECK_FROM_G adds to Σ's trace. The bench's
    /// own inputs take it (`the_bench_checks_from_g`).
    #[test]
    fn a_check_from_g_costs_at_most_its_rounding(seed in any::<u64>(), d in 129usize..=600, spread in 0.0f64..=12.0) {
        let m = 128;
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let v = jittered_scores(m, d);
        let p = Posterior::from_log_weights((0..m).map(|_| rng.random_range(-spread..=0.0)).collect()).expect("finite");
        let cal = calibrate(&p, v.view(), b(1e-3)).expect("calibrates");
        prop_assert!(cal.noise().mi_bound() <= 1e-3 * (1.0 - crate::noise::CERTIFICATE_MARGIN));
        let Some(Path::GramKeepingCheckedFromK(r)) = cal.path_taken() else { return Ok(()) };
        let journaled = calibrate_on(&p, v.view(), b(1e-3), Path::GramKeepingCheckedFromK(r), Floor::default())
            .expect("the journaled path recomputes");
        prop_assert_eq!(journaled.noise().variances(), cal.noise().variances());
        let itself = calibrate_on(&p, v.view(), b(1e-3), Path::GramKeepingFromK(r), Floor::default())
            .expect("the basis checked itself");
        for (g, x) in cal.noise().variances().iter().zip(itself.noise().variances()) {
            prop_assert!(*g >= x * (1.0 - 1e-12), "{g:e} against {x:e}");
        }
        // Σ's trace along the basis is (Σ_j √q̃_j)²/(2b): with κ√Σq added to
        // each √q_j (Σ√q ≥ √Σq) and the sampler's 1/(1 − η), at most
        // (1 + rκ)²/(1 − η) times the basis checked itself, η ≤ 2R.
        let eta = 2.0 * CHECK_FROM_G * (1.0 + 1e-6);
        let kappa = eta / (1.0 - eta);
        let most = (1.0 + r as f64 * kappa).powi(2) / (1.0 - eta);
        let (g, x) = (cal.noise().variances().sum(), itself.noise().variances().sum());
        prop_assert!(g <= x * most, "trace {g:e} against {x:e}");
    }

    /// With K's coefficients, every calibration at d > m is certified as
    /// before, and its variances are never below those of the same basis
    /// with the coefficients formed in output space (the allowance only
    /// adds): more noise, never less.
    #[test]
    fn coefficients_from_k_never_lower_a_variance(seed in any::<u64>(), m in 2usize..=64, extra in 1usize..=300, e in 4i32..=40) {
        let d = m + extra;
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let p = Posterior::from_log_weights((0..m).map(|_| rng.random_range(-8.0..=0.0)).collect()).expect("finite");
        let v = Array2::from_shape_fn((m, d), |_| rng.random_range(0.0..1.0));
        let bb = 2f64.powi(-e);
        let from_k = calibrate(&p, v.view(), b(bb)).expect("calibrates");
        prop_assert!(from_k.noise().mi_bound() <= bb * (1.0 - crate::noise::CERTIFICATE_MARGIN));
        let r = from_k.noise().rank();
        if !matches!(from_k.path_taken(), Some(Path::GramKeepingFromK(_) | Path::GramKeepingCheckedFromK(_))) {
            return Ok(());
        }
        let outputs = calibrate_on(&p, v.view(), b(bb), Path::GramKeeping(r), Floor::default())
            .expect("the same basis, coefficients in output space");
        let (k, o) = (from_k.noise(), outputs.noise());
        prop_assert!(k.complement() >= o.complement() * (1.0 - 1e-12));
        // Σ's trace along the basis: the allowance raises every q̄_j.
        prop_assert!(k.variances().sum() >= o.variances().sum() * (1.0 - 1e-12));
    }
}
