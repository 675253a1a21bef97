//! The keyed audit of one step: which teachers' output, plus the draw the
//! noise key gives at the step's position shaped by the Σ the verifier
//! recalibrated, is the published release (`pacpriv verify --noise-key`;
//! argument: `docs/assurance/privacy-core.md` §10).
//!
//! Algorithm 1 releases r = x_{s*} + z, z drawn from the key's normals by
//! [`Noise::sample_from`] (a function of Σ and the normals, not of the
//! basis), published as Q(r) on the 2⁻³² grid. With the normals recomputed
//! from the key, the verifier forms Q(x_i + z′) for each teacher i, z′ drawn
//! the same way on its own Σ′, and calls teacher i *matching* when the difference d from the
//! published release is within what the grid and the drift between two
//! machines' kernels explain, in **every** direction of Σ′, whitened:
//!
//! - along each basis direction u_j: |u_jᵀd| / √v_j ≤ τ_j =
//!   (2⁻³²·‖u_j‖₁ + [`KERNEL_DRIFT`]·‖z′‖₂) / √v_j + |g′_j|·δ_j;
//! - in the complement (vector mode): ‖(I − UUᵀ)d‖₂ / √f ≤
//!   (2⁻³²·√n + [`KERNEL_DRIFT`]·‖z′‖₂) / √f,
//!
//! where δ_j = min(1, [`SPECTRAL_DRIFT`]·n·2⁻⁵²·(v_max/v_j)²) is how far the
//! server's standard deviation along a weak direction may be from the
//! verifier's: its signal q_j ∝ v_j² is known only to ~n·2⁻⁵²·q_max.
//!
//! An operator that released c·z instead of z moves direction j by
//! (1 − c)·|g′_j| standard deviations: it passes only where that is within
//! τ_j everywhere. [`KeyCheck::undetectable`] is the largest such 1 − c for
//! the step; directions with τ_j ≥ 1 (the grid cannot see one standard
//! deviation of their noise) are counted in [`KeyCheck::unresolved`].
//!
//! **The draws themselves** ([`Alignment`]). A release that matches is the
//! key's draw at its position, which no input can change (`keyed`): an
//! operator holding the key has no draw to pick for a release. Should it
//! still pick (a draw the audit could not tell from the key's, or choice
//! this module does not know of), favouring s* means
//! moving the release along w = Σ^{−1/2}(x_{s*} − μ) (μ the posterior mean
//! of the centres; every teacher i's log-likelihood ratio against s* moves
//! by ⟨z, x_{s*} − x_i⟩_{Σ⁻¹}), or away from it. With the key the verifier
//! holds g, so each step gives a = ⟨g, w⟩/‖w‖ ([`KeyCheck::alignment`]), which
//! is N(0, 1) given everything before the draw: g is a pseudorandom
//! function of the position, independent of the inputs. A session's a's
//! are bet on as a mixture of exp(λa − λ²/2) over ±λ — a nonnegative
//! martingale, whose wealth is an e-value — and the export's sessions'
//! wealths averaged ([`Alignment::p_averaged`]), so an honest export fails
//! with chance at most α; picking the best of N draws each step, a shift
//! of ~√(2 ln N), is caught in a few steps ([`Alignment::steps_to_catch`]).
//! Picking on a direction orthogonal to w (against one rival) leaves a
//! unbiased, and which query meets a version's draw is still the
//! operator's to order (`accounting.md` §11): this is a second line.
//!
//! # Invariants
//! - Pure: a function of Σ′, the centres, the published release and g.
//! - Nothing here needs s*: every teacher is tried; the caller checks that
//!   one teacher matches every step of a dataset.

use super::grid::{self, PUBLISHED_GRID};
use super::keyed::KeyedNormals;
use super::noise::Noise;
use ndarray::{Array1, ArrayView1};

/// The relative drift allowed between the server's z and the verifier's
/// z′ for the same g: ‖z − z′‖₂ ≤ KERNEL_DRIFT·‖z′‖₂. Σ is recomputed from
/// the same public inputs on the path the server journaled, so the two
/// differ only by the kernels' rounding. Measured between OpenBLAS's SSE3
/// and AVX-512 kernels on the demo's exports (`tests/it/verify.rs`): below
/// 10⁻¹³ in label mode and on the Gram path, up to 2.5·10⁻⁹ on vector
/// mode's SVD path at d = 10, whose weakest directions rounding decides
/// (one coordinate moved by two grid steps). This allows 40 times that;
/// what it leaves unresolved is counted ([`KeyCheck::unresolved`]).
pub const KERNEL_DRIFT: f64 = 1e-7;

/// The factor on n·2⁻⁵²·(v_max/v_j)² allowed as the relative drift of a
/// direction's standard deviation between two machines' kernels. A
/// direction's signal q_j is an eigenvalue computed to ~n·2⁻⁵²·q_max; its
/// variance v_j ∝ √q_j (Theorem 2.4) moves by half that relative to q_j,
/// (v_max/v_j)²·n·2⁻⁵²/2, and this allows eight times that. Found on a
/// label-mode session whose posterior had all but ruled out one class
/// (k = 10): between OpenBLAS's SSE3 and AVX-512 kernels its weakest
/// direction's variance differed by a few per cent, far past
/// [`KERNEL_DRIFT`].
pub const SPECTRAL_DRIFT: f64 = 4.0;

/// A direction whose spectral drift allowance reaches this share of its
/// standard deviation is counted as unresolved ([`KeyCheck::unresolved`]).
pub const UNRESOLVED_DRIFT: f64 = 1e-3;

/// ln((1/n)·Σ eˣ) without overflow (0 for none).
fn log_mean_exp(xs: &[f64]) -> f64 {
    let top = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !top.is_finite() {
        return if xs.is_empty() { 0.0 } else { top };
    }
    top + (xs.iter().map(|x| (x - top).exp()).sum::<f64>() / xs.len() as f64).ln()
}

/// What the key says about one step.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyCheck {
    /// The teachers whose output plus the key's noise is the release (in
    /// label mode, every teacher of the matching class).
    pub matching: Vec<usize>,
    /// The largest shortfall 1 − c such that releasing c·z instead of z
    /// would still match: min over directions of τ_j / |g′_j| (at most 1,
    /// no noise at all).
    pub undetectable: f64,
    /// Directions of Σ′ (and the complement, as one) whose tolerance is a
    /// whole standard deviation or more — the grid cannot see their noise —
    /// or whose variance two machines' kernels may put more than
    /// [`UNRESOLVED_DRIFT`] apart.
    pub unresolved: usize,
    /// For the first matching teacher's centre x: a = ⟨g, w⟩/‖w‖ with
    /// w = Σ^{−1/2}(x − μ) on the basis, μ the posterior mean of the
    /// centres: N(0, 1) for an honest draw (`None`: no teacher matched, or
    /// x is μ on every direction).
    pub alignment: Option<f64>,
}

/// The bets' sizes λ on the alignment (each taken with either sign).
pub const ALIGNMENT_BETS: [f64; 8] = [0.0625, 0.125, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0];

/// A dataset's bets that its draws lean toward (or away from) its secret
/// teacher: for each ±λ of [`ALIGNMENT_BETS`], Σ_t (λ·a_t − λ²/2), the log
/// of a product of factors of mean one when a_t ~ N(0, 1) given the past.
/// Their average is a nonnegative martingale under honest draws, so
/// [`Alignment::p`] ≤ α with chance at most α, at any stopping time.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Alignment {
    log_wealth: Vec<f64>,
    /// Steps bet on.
    pub steps: u64,
    /// Σ a_t, for the report.
    pub sum: f64,
}

impl Alignment {
    /// Bets on one step's alignment a.
    pub fn add(&mut self, a: f64) {
        if self.log_wealth.is_empty() {
            self.log_wealth = vec![0.0; 2 * ALIGNMENT_BETS.len()];
        }
        let signed = ALIGNMENT_BETS.iter().flat_map(|&l| [l, -l]);
        for (w, l) in self.log_wealth.iter_mut().zip(signed) {
            *w += l * a - 0.5 * l * l;
        }
        self.steps += 1;
        self.sum += a;
    }

    /// The p-value bound 1/(average wealth), at most 1.
    pub fn p(&self) -> f64 {
        (-self.log_wealth()).exp().min(1.0)
    }

    /// The log of the bets' average wealth (0 before any step).
    pub fn log_wealth(&self) -> f64 {
        log_mean_exp(&self.log_wealth)
    }

    /// The p-value bound of several sessions' bets together: 1 over the
    /// average of their wealths, at most 1. Each wealth is an e-value, and
    /// so is their average, so an honest export stays below 1/α with
    /// chance at least 1 − α; a bias confined to one session among K costs
    /// ln K, where pooling its steps with theirs would dilute it.
    pub fn p_averaged<'a>(sessions: impl IntoIterator<Item = &'a Alignment>) -> f64 {
        let logs: Vec<f64> = sessions.into_iter().map(Alignment::log_wealth).collect();
        (-log_mean_exp(&logs)).exp().min(1.0)
    }

    /// How many steps whose alignments all shift by `shift` make
    /// [`Alignment::p`] fall below `alpha` (the expected a's, no noise):
    /// the power against picking the best of N draws, shift ≈ √(2 ln N).
    pub fn steps_to_catch(shift: f64, alpha: f64) -> u64 {
        let mut bets = Alignment::default();
        while bets.p() >= alpha && bets.steps < 1_000_000 {
            bets.add(shift);
        }
        bets.steps
    }
}

/// Checks `published` (the release on the noise's coordinate block, in its
/// order) against every teacher's `centres` (on the same block) plus the
/// draw `normals` gives, shaped by `noise` (the verifier's Σ′).
pub fn check(
    noise: &Noise,
    centres: &[Array1<f64>],
    weights: ArrayView1<'_, f64>,
    published: ArrayView1<'_, f64>,
    normals: &mut KeyedNormals,
) -> KeyCheck {
    let draw = noise.sample_from(|| normals.next_normal());
    let z = noise.block(&draw);
    let basis = noise.basis();
    let drift = KERNEL_DRIFT * z.dot(&z).sqrt();
    let n = noise.coords().len();
    let complement = noise.complement();
    let v_max = noise.variances().iter().fold(complement, |a, &v| a.max(v));
    let spectral = |v: f64| (SPECTRAL_DRIFT * n as f64 * f64::EPSILON * (v_max / v).powi(2)).min(1.0);
    let tolerances: Vec<f64> = basis
        .columns()
        .into_iter()
        .zip(noise.variances())
        .zip(&draw.std_coef)
        .map(|((u, &v), g)| {
            (PUBLISHED_GRID * u.iter().map(|x| x.abs()).sum::<f64>() + drift) / v.sqrt() + g.abs() * spectral(v)
        })
        .collect();
    // ‖(I − UUᵀ)h‖₂: the complement's draw, whitened.
    let res_g = if complement > 0.0 { draw.residual.dot(&draw.residual).sqrt() / complement.sqrt() } else { 0.0 };
    // The complement's variance is a floor (round-off, left-out signal,
    // the grid's resolution), not an eigenvalue: no spectral drift.
    let res_tolerance = (complement > 0.0).then(|| (PUBLISHED_GRID * (n as f64).sqrt() + drift) / complement.sqrt());
    // How far one coordinate may move with the spectral drift (|u_jc| ≤ 1).
    let moved =
        noise.variances().iter().zip(&draw.std_coef).map(|(&v, g)| v.sqrt() * g.abs() * spectral(v)).sum::<f64>();

    let mut undetectable = tolerances
        .iter()
        .zip(&draw.std_coef)
        .map(|(t, g)| t / g.abs())
        .chain(res_tolerance.map(|t| t / res_g))
        .fold(f64::INFINITY, f64::min);
    // More than the whole noise cannot go: a shortfall of 1 is no noise.
    undetectable = undetectable.min(1.0);
    // Unresolved: the grid cannot see one standard deviation, or the
    // kernels may disagree on it by more than 10⁻³ (there the check sees
    // only noise cut by more than that share).
    let unresolved = tolerances.iter().chain(&res_tolerance).filter(|&&t| t >= 1.0).count()
        + noise
            .variances()
            .iter()
            .zip(&tolerances)
            .filter(|&(&v, &t)| t < 1.0 && spectral(v) >= UNRESOLVED_DRIFT)
            .count();

    // Teachers with the same centre (label mode: one class) are judged once.
    let mut judged: Vec<(&Array1<f64>, bool)> = Vec::new();
    let mut matching = Vec::new();
    for (i, x) in centres.iter().enumerate() {
        let same = judged.iter().find(|(y, _)| *y == x).map(|&(_, m)| m);
        let matches = same.unwrap_or_else(|| {
            let m = matches(noise, x, &z, published, &tolerances, res_tolerance, drift + moved);
            judged.push((x, m));
            m
        });
        if matches {
            matching.push(i);
        }
    }
    let alignment = matching.first().and_then(|&i| alignment(noise, centres, weights, &centres[i], &draw.std_coef));
    KeyCheck { matching, undetectable, unresolved, alignment }
}

/// ⟨g, w⟩/‖w‖ for w = Σ^{−1/2}(x − μ) on the basis, μ = Σ_i w_i·x_i
/// (`None` when w = 0).
fn alignment(
    noise: &Noise,
    centres: &[Array1<f64>],
    weights: ArrayView1<'_, f64>,
    x: &Array1<f64>,
    g: &Array1<f64>,
) -> Option<f64> {
    let mut mu = Array1::<f64>::zeros(x.len());
    for (c, &w) in centres.iter().zip(weights) {
        mu.scaled_add(w, c);
    }
    let t = noise.basis().t().dot(&(x - &mu));
    let w: Array1<f64> = t.iter().zip(noise.variances()).map(|(t, v)| t / v.sqrt()).collect();
    let norm = w.dot(&w).sqrt();
    (norm > 0.0 && norm.is_finite()).then(|| g.dot(&w) / norm)
}

/// Whether Q(x + z′) is `published` within the tolerances, direction by
/// direction.
fn matches(
    noise: &Noise,
    x: &Array1<f64>,
    z: &Array1<f64>,
    published: ArrayView1<'_, f64>,
    tolerances: &[f64],
    res_tolerance: Option<f64>,
    reach: f64,
) -> bool {
    let d: Array1<f64> = x.iter().zip(z).zip(published).map(|((&x, &z), &p)| p - grid::publish_one(x, z)).collect();
    // Quick reject: an honest coordinate is off by at most a grid step and
    // the drifts (`reach`). Written so that a NaN fails too.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    if d.iter().any(|v| !(v.abs() <= PUBLISHED_GRID + reach)) {
        return false;
    }
    let basis = noise.basis();
    let t = basis.t().dot(&d);
    let along = t.iter().zip(noise.variances()).zip(tolerances).all(|((t, v), tol)| t.abs() / v.sqrt() <= *tol);
    let outside = match res_tolerance {
        Some(tol) => {
            let rest = &d - &basis.dot(&t);
            rest.dot(&rest).sqrt() / noise.complement().sqrt() <= tol
        }
        None => true,
    };
    along && outside
}

#[cfg(test)]
mod test;
