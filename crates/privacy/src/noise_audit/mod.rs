//! The noise audit: a sequential test, from a session's journal alone,
//! that its releases carried at least the calibrated noise (argument and
//! power: `docs/assurance/privacy-core.md` §9).
//!
//! Replay ([`super::replay`]) checks that every recorded ℓ is the published
//! release's likelihood under the recalibrated Σ_t. An operator who draws
//! from c²·Σ_t (c < 1), or adds nothing, and records the ℓ of what it
//! published under Σ_t passes that check: every such release is a possible
//! draw. What gives it away is the size of the residuals. For candidate
//! subset s, with J_t the directions of Σ_t the test uses (chosen before
//! the draw, from Σ_t alone) and v_j their variances,
//!
//! ```text
//! Q_t(s) = Σ_{j∈J_t} (u_jᵀ(r_t − x_t(s)))² / v_j
//! ```
//!
//! is, given the past, χ²(|J_t|) for s = s* under honest noise, and a
//! non-central χ² (stochastically larger) for every other s. So for a λ > 0
//! fixed in advance, E[e^{−λ Q_t(s)} | past] ≤ (1 + 2λ)^{−|J_t|/2} for
//! every s, and
//!
//! ```text
//! X_T(s) = Σ_λ π_λ · Π_t (1 + 2λ)^{|J_t|/2} · e^{−λ Q̄_t(s)} / (1 + p̄_t)
//! ```
//!
//! (a fixed mixture over [`LAMBDAS`]; Q̄_t ≥ Q_t an upper bound that absorbs
//! the grid and the verifier's own round-off; p̄_t a bound on the chance
//! that step t is excluded for sitting at the clamp) is a non-negative
//! supermartingale with X_0 = 1 for every s, whatever the adaptively chosen
//! queries. By Ville's inequality and a union bound over the m candidates,
//! P(max_s X_T(s) ≥ m/α) ≤ α: the p-value bound is min(1, m / max_s X_T(s)).
//! Under c-scaled noise Q_t(s*) ≈ c²·χ²(|J_t|) and log X_T(s*) grows by
//! about ½·ln(1 + 2λ) − λc² per degree of freedom.
//!
//! # Invariants
//! - Pure: a function of the public record (outputs, Σ_t, the published
//!   release); nothing here sees s* or the draw.
//! - Which directions count is decided from Σ_t and the grid before the
//!   release is looked at, so the degrees of freedom are predictable.
//! - Every approximation is bounded in the direction that makes the test
//!   *less* likely to fire on honest noise.

use super::grid::{PUBLISHED_CLAMP, PUBLISHED_GRID};
use super::noise::Noise;
use ndarray::{Array1, Array2, ArrayView1};
use statrs::distribution::{ChiSquared, ContinuousCDF, Normal};

/// The mixture's λ grid, uniform weights: 2⁻⁴ … 2¹⁰. A λ near
/// (1/c² − 1)/2 is the most powerful against noise scaled by c, so this
/// covers c from about 0.97 down to no noise at all; the mixture costs
/// ln 15 ≈ 2.7 nats against the best single λ.
pub const LAMBDAS: [f64; 15] =
    [0.0625, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];

/// The default significance: `pacpriv verify --noise-alpha`.
pub const DEFAULT_ALPHA: f64 = 1e-6;

/// A direction counts only if its variance is at least this share of the
/// step's largest (√10⁻⁵: its signal q_j ≥ 10⁻⁵ of the largest). Weaker
/// directions' variances rest on round-off bounds and on which
/// decomposition found the basis (vector mode keeps directions down to
/// 10⁻⁶ of the largest eigenvalue on one path and not the other), so a
/// verifier on another machine would compute another variance for them.
pub const SIGNAL_SHARE: f64 = 3.162_277_660_168_379_5e-3;

/// A direction counts only if the grid moves its whitened coefficient by
/// at most this much: 2⁻³³·√n / √v_j ≤ 10⁻³. Below that variance the
/// rounding of the published release, not the noise, would decide the
/// statistic (at [`VARIANCE_FLOOR`](super::noise::VARIANCE_FLOOR) by a
/// factor of 10¹¹⁵).
pub const GRID_SHARE: f64 = 1e-3;

/// Relative difference allowed between the variances the verifier
/// recomputes and the server's on the directions that count: OpenBLAS
/// kernels differ by ~10⁻¹⁴; the two vector-mode bases by at most
/// ~2·10⁻⁴ (`privacy-core.md` §9). Q̄ is inflated by 1 + this.
pub const VARIANCE_DRIFT: f64 = 1e-3;

/// What one noisy step contributes to the audit.
#[derive(Clone, Debug, PartialEq)]
pub struct StepEvidence {
    /// Q̄_t(s) for every candidate s (empty when no direction counts or the
    /// step is clamped).
    pub statistic: Vec<f64>,
    /// |J_t|: the directions that count.
    pub dof: usize,
    /// p̄_t: a bound on the chance that honest noise reaches the clamp on
    /// one of the block's coordinates (0 when no direction counts).
    pub clamp_bound: f64,
    /// Directions left out because their variance is below
    /// [`SIGNAL_SHARE`] of the largest.
    pub weak: usize,
    /// Directions left out because the 2⁻³² grid cannot resolve them
    /// ([`GRID_SHARE`]).
    pub unresolved: usize,
    /// Dimensions of the isotropic complement left out (vector mode: its
    /// variance covers round-off and left-out signal, machine-dependent).
    pub complement: usize,
    /// The release sits at the ±2²⁰ clamp on a noisy coordinate: its exact
    /// value is unknown and the step is left out (counted in p̄).
    pub clamped: bool,
    /// The published block equals a candidate's output exactly although a
    /// direction that counts carries noise.
    pub exact: bool,
}

/// The evidence of one noisy step: `noise` is Σ_t as the verifier
/// recalibrated it, `published` the release on `noise`'s coordinates, and
/// `centres[s]` candidate s's output there.
pub fn evidence(noise: &Noise, published: ArrayView1<'_, f64>, centres: &[Array1<f64>]) -> StepEvidence {
    let n = noise.coords().len();
    let v = noise.variances();
    let largest = v.iter().fold(0.0f64, |a, &x| a.max(x));
    // 2⁻³³: Q rounds to the nearest multiple of 2⁻³² (grid, §8).
    let half_grid = 0.5 * PUBLISHED_GRID;
    let resolvable = (half_grid * (n as f64).sqrt() / GRID_SHARE).powi(2);
    let (mut weak, mut unresolved) = (0, 0);
    let mut used = Vec::new();
    // Written so that a NaN variance counts as left out.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    for (j, &vj) in v.iter().enumerate() {
        if !(vj >= SIGNAL_SHARE * largest) {
            weak += 1;
        } else if !(vj >= resolvable) {
            unresolved += 1;
        } else {
            used.push(j);
        }
    }
    let complement = if noise.complement() > 0.0 { n - noise.rank() } else { 0 };
    let mut e = StepEvidence {
        statistic: Vec::new(),
        dof: used.len(),
        clamp_bound: 0.0,
        weak,
        unresolved,
        complement,
        clamped: false,
        exact: false,
    };
    if used.is_empty() {
        return e;
    }
    e.clamp_bound = clamp_bound(noise, centres, largest);
    e.clamped = published.iter().any(|x| x.abs() >= PUBLISHED_CLAMP);
    if e.clamped {
        return e;
    }
    e.exact = centres.iter().any(|x| x.iter().zip(&published).all(|(a, b)| a.to_bits() == b.to_bits()));

    let basis = noise.basis();
    let u = Array2::from_shape_fn((n, used.len()), |(i, k)| basis[[i, used[k]]]);
    let inv_sd: Array1<f64> = used.iter().map(|&j| 1.0 / v[j].sqrt()).collect();
    let v_min = used.iter().map(|&j| v[j]).fold(f64::INFINITY, f64::min);
    // ‖U_J‖₂ ≤ 1 + η, η ≤ 10⁻¹⁰ (the Orthonormal check).
    let norm = 1.0 + 1e-9;
    // Round-off of uᵀδ in the verifier: within (n + 2)·2⁻⁵³·‖δ‖ per
    // coefficient, allowed four times over.
    let gamma = 4.0 * (n + 2) as f64 * f64::EPSILON;
    let dof = used.len() as f64;
    e.statistic = centres
        .iter()
        .map(|x| {
            // r̂ − x is exact: both are multiples of 2⁻³² below 2²¹.
            let delta = &published - x;
            let t = u.t().dot(&delta) * &inv_sd;
            let q: f64 = t.dot(&t);
            let slack =
                norm * (half_grid * (n as f64).sqrt() + gamma * delta.dot(&delta).sqrt() * dof.sqrt()) / v_min.sqrt();
            (1.0 + VARIANCE_DRIFT) * (q.sqrt() + slack).powi(2)
        })
        .collect();
    e
}

/// A bound on P(some coordinate of the block reaches ±2²⁰) under honest
/// noise: each coordinate's variance is at most Σ's largest eigenvalue,
/// and its centre is within the largest |x_s| of 0.
fn clamp_bound(noise: &Noise, centres: &[Array1<f64>], largest: f64) -> f64 {
    let n = noise.coords().len();
    let centre = centres.iter().flat_map(|x| x.iter()).fold(0.0f64, |a, x| a.max(x.abs()));
    let margin = PUBLISHED_CLAMP - 0.5 * PUBLISHED_GRID - centre;
    let sd = (largest.max(noise.complement()) * (1.0 + VARIANCE_DRIFT)).sqrt();
    if !(margin > 0.0 && sd > 0.0) {
        return 1.0;
    }
    let tail = Normal::standard().sf(margin / sd);
    (2.0 * n as f64 * tail).min(1.0)
}

/// A session's audit so far: X_T(s) for every candidate, per λ, in logs.
#[derive(Clone, Debug)]
pub struct NoiseAudit {
    /// log Π_t (1 + 2λ)^{|J_t|/2} e^{−λQ̄_t(s)} / (1 + p̄_t), [s][λ].
    log_factor: Vec<[f64; LAMBDAS.len()]>,
    /// Σ_t Q̄_t(s).
    sum: Vec<f64>,
    dof: u64,
    steps: u64,
    used: u64,
    clamped: u64,
    weak: u64,
    unresolved: u64,
    complement: u64,
    exact: u64,
}

/// The audit's verdict on one session.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    /// min_s Σ_t Q̄_t(s): the residuals' size under the best-fitting subset.
    pub statistic: f64,
    /// Σ_t |J_t|.
    pub dof: u64,
    /// min(1, m / max_s X_T(s)): a bound on the chance that honest noise
    /// looks this small, valid under adaptive queries.
    pub p_bound: f64,
    /// P(χ²_dof ≥ statistic), as information only: small when the noise is
    /// *larger* than calibrated (a utility loss, not a privacy one).
    /// Exact for a fixed sequence of queries only.
    pub upper_tail: f64,
    /// √(statistic / dof): the noise's apparent scale against Σ (≈ 1 when
    /// honest; ≤ the true scale, since the best-fitting subset is chosen).
    pub scale: f64,
    /// Noisy steps seen.
    pub steps: u64,
    /// Steps with at least one direction counted.
    pub used: u64,
    /// Steps left out at the clamp.
    pub clamped: u64,
    /// Directions left out as weak, unresolved, and complement dimensions.
    pub weak: u64,
    /// See [`StepEvidence::unresolved`].
    pub unresolved: u64,
    /// See [`StepEvidence::complement`].
    pub complement: u64,
    /// Steps whose release equals a candidate's output exactly.
    pub exact: u64,
}

impl Verdict {
    /// True when the noise is smaller than calibrated at significance α.
    pub fn caught(&self, alpha: f64) -> bool {
        self.p_bound < alpha
    }
}

impl NoiseAudit {
    /// An audit over `m` candidate subsets.
    pub fn new(m: usize) -> Self {
        NoiseAudit {
            log_factor: vec![[0.0; LAMBDAS.len()]; m],
            sum: vec![0.0; m],
            dof: 0,
            steps: 0,
            used: 0,
            clamped: 0,
            weak: 0,
            unresolved: 0,
            complement: 0,
            exact: 0,
        }
    }

    /// Adds one noisy step. Evidence for another number of candidates is
    /// ignored (replay refuses such a step before it gets here).
    pub fn add(&mut self, e: &StepEvidence) {
        self.steps += 1;
        self.weak += e.weak as u64;
        self.unresolved += e.unresolved as u64;
        self.complement += e.complement as u64;
        if e.dof == 0 {
            return;
        }
        let penalty = e.clamp_bound.ln_1p();
        if e.clamped {
            self.clamped += 1;
            self.log_factor.iter_mut().flatten().for_each(|l| *l -= penalty);
            return;
        }
        if e.statistic.len() != self.sum.len() {
            return;
        }
        self.used += 1;
        self.exact += u64::from(e.exact);
        self.dof += e.dof as u64;
        let half = 0.5 * e.dof as f64;
        for ((logs, sum), &q) in self.log_factor.iter_mut().zip(&mut self.sum).zip(&e.statistic) {
            *sum += q;
            for (l, lambda) in logs.iter_mut().zip(LAMBDAS) {
                *l += half * (2.0 * lambda).ln_1p() - lambda * q - penalty;
            }
        }
    }

    /// The verdict so far.
    pub fn verdict(&self) -> Verdict {
        let m = self.sum.len() as f64;
        let weight = -(LAMBDAS.len() as f64).ln();
        let best = self
            .log_factor
            .iter()
            .map(|logs| super::posterior::log_sum_exp(logs.iter().map(|l| l + weight)))
            .fold(f64::NEG_INFINITY, f64::max);
        let p_bound = if self.dof == 0 { 1.0 } else { (m.ln() - best).exp().min(1.0) };
        let statistic = if self.dof == 0 { 0.0 } else { self.sum.iter().copied().fold(f64::INFINITY, f64::min) };
        let upper_tail = match ChiSquared::new(self.dof as f64) {
            Ok(chi) if self.dof > 0 => chi.sf(statistic),
            _ => 1.0,
        };
        let scale = if self.dof == 0 { 1.0 } else { (statistic / self.dof as f64).sqrt() };
        Verdict {
            statistic,
            dof: self.dof,
            p_bound,
            upper_tail,
            scale,
            steps: self.steps,
            used: self.used,
            clamped: self.clamped,
            weak: self.weak,
            unresolved: self.unresolved,
            complement: self.complement,
            exact: self.exact,
        }
    }
}

/// Degrees of freedom after which noise scaled by `c` is expected to be
/// caught at significance `alpha` among `m` candidates: the smallest D
/// with D·max_λ(½·ln(1 + 2λ) − λc²) ≥ ln(m·|Λ|/α) (the drift of
/// log X_T(s*); fluctuations move the actual point by O(√D)).
pub fn expected_dof(c: f64, m: usize, alpha: f64) -> f64 {
    let drift = LAMBDAS.iter().map(|l| 0.5 * (2.0 * l).ln_1p() - l * c * c).fold(f64::NEG_INFINITY, f64::max);
    ((m as f64) * LAMBDAS.len() as f64 / alpha).ln() / drift
}

#[cfg(test)]
mod test;
