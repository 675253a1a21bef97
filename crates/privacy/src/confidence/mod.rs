//! The confidence filter of paper Prop. 5.1 (proof: Appendix B.3;
//! `docs/assurance/privacy-core.md` §7).
//!
//! For a release r ~ N(e_y, Σ) with known Σ and released label ỹ = argmax r,
//! keep ỹ iff for every other *active* class j
//!
//! T_j(r) = (e_ỹ − e_j)ᵀ Σ⁺ (r − e_j) / √((e_ỹ − e_j)ᵀ Σ⁺ (e_ỹ − e_j)) ≥ Φ⁻¹(1 − α).
//!
//! The paper's proof (B.3) shows T_y ~ N(0, 1) for the true label y and a
//! *fixed* ỹ. But ỹ = argmax r is chosen by the same noise, so for k ≥ 3
//! active classes the printed test can keep wrong labels more often than α
//! (measured: 6.8 % at α = 5 % with k = 3, see the test). A union bound over
//! the k − 1 values ỹ might take repairs it: we use Φ⁻¹(1 − α/(k − 1)), which is
//! the paper's threshold for k = 2 and guarantees Pr(kept ∧ wrong) ≤ α for
//! every k. (Argument: `docs/assurance/privacy-core.md` §7.)
//!
//! Inactive classes are
//! excluded with certainty (no subset with positive weight predicts them),
//! and a unanimous answer is exact, hence always confident. The test is
//! evaluated on the published release Q(r) (the 2⁻³² grid, [`super::grid`])
//! and Σ, rounded down to a lower bound of the exact T_j(r): a function of
//! what may leave the process, never of the floating-point bits of r —
//! post-processing, no privacy cost.

use super::PrivacyError;
use super::grid::{PUBLISHED_CLAMP, PUBLISHED_GRID};
use super::noise::Noise;
use statrs::distribution::{ContinuousCDF, Normal};

/// Φ⁻¹(1 − α), computed as −Φ⁻¹(α) so tiny α does not round 1 − α to 1.
///
/// # Errors
/// [`PrivacyError::Domain`] unless 0 < α < 1.
pub fn threshold(alpha: f64) -> Result<f64, PrivacyError> {
    if !(alpha > 0.0 && alpha < 1.0) {
        return Err(PrivacyError::Domain(format!("confidence level α must be in (0, 1), got {alpha}")));
    }
    let normal = Normal::standard();
    Ok(-normal.inverse_cdf(alpha))
}

/// Components of e_ỹ − e_j along a noise direction at or below this are
/// dropped from the test direction. In exact arithmetic such a component
/// is often exactly 0 (a direction that separates other classes), and what
/// LAPACK leaves there would otherwise multiply the grid error by 1/v for a
/// tiny variance v. Any fixed direction a ∈ range(Σ) gives a statistic that
/// is N(0, 1) under the true class, so dropping them keeps the test valid
/// (`docs/assurance/privacy-core.md` §7).
pub const DIRECTION_FLOOR: f64 = 1e-9;

/// What the test needs of one release, for every α: a lower bound on the
/// smallest T_j over the other active classes, and k. A function of the
/// *published* release Q(r) and Σ only — kept with a cached answer, it
/// gives the flag at whatever α a repeat asks for without saying anything
/// about r beyond Q(r).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Evidence {
    min_t: f64,
    k: usize,
}

impl Evidence {
    /// An exact answer (unanimous teachers, or no noise at all): confident
    /// at every α.
    pub const EXACT: Evidence = Evidence { min_t: f64::INFINITY, k: 1 };

    /// The statistics of a published label-mode release `release` (length
    /// d, on the 2⁻³² grid) whose label is the active class at position
    /// `released` of `noise.coords()`.
    ///
    /// T_j is evaluated from the grid values, never from the draw, and
    /// rounded *down* by a bound on everything that separates it from T_j
    /// of the exact release: the grid (each coordinate within 2⁻³³, so
    /// |u_lᵀ(r − Q(r))| ≤ √k·2⁻³³) and the floating-point sums. So
    /// "confident" here implies Prop. 5.1's test on the exact r passes, and
    /// Pr(kept ∧ wrong) ≤ α still holds; where variances are tiny the bound
    /// is loose and the answer is simply not confident. A clamped
    /// coordinate (|value| = 2²⁰) says nothing exact: never confident.
    pub fn of(noise: &Noise, release: &[f64], released: usize) -> Evidence {
        if noise.rank() == 0 {
            return Evidence::EXACT;
        }
        let (basis, variances) = (noise.basis(), noise.variances());
        let k = basis.nrows();
        let r: Vec<f64> = noise.coords().iter().map(|&c| release.get(c).copied().unwrap_or(f64::NAN)).collect();
        if r.iter().any(|x| x.is_nan() || x.abs() >= PUBLISHED_CLAMP) {
            return Evidence { min_t: f64::NEG_INFINITY, k };
        }
        let gamma = 2.0 * (k + basis.ncols() + 2) as f64 * f64::EPSILON;
        let grid_error = (k as f64).sqrt() * PUBLISHED_GRID / 2.0;
        let mut min_t = f64::INFINITY;
        for j in (0..k).filter(|&j| j != released) {
            let (mut num, mut slack, mut den) = (0.0, 0.0, 0.0);
            for l in 0..basis.ncols() {
                let delta = basis[[released, l]] - basis[[j, l]];
                if delta.abs() <= DIRECTION_FLOOR {
                    continue;
                }
                // u_lᵀ(Q(r) − e_j), exact terms (grid values minus 0 or 1),
                // and a bound on its distance from u_lᵀ(r − e_j).
                let (mut coef, mut size) = (0.0, 0.0);
                for (a, &x) in r.iter().enumerate() {
                    let term = basis[[a, l]] * if a == j { x - 1.0 } else { x };
                    coef += term;
                    size += term.abs();
                }
                let w = delta / variances[l];
                num += w * coef;
                slack += w.abs() * (grid_error + gamma * size) + gamma * (w * coef).abs();
                den += delta * w;
            }
            // A degenerate direction can never certify the label.
            let t = if den > 0.0 {
                let low = num - slack;
                low / (den * if low > 0.0 { 1.0 + gamma } else { 1.0 - gamma }).sqrt()
            } else {
                f64::NEG_INFINITY
            };
            // NaN (never expected) also fails the test.
            min_t = if t.is_nan() { f64::NEG_INFINITY } else { min_t.min(t) };
        }
        Evidence { min_t, k }
    }

    /// Rebuilds stored evidence.
    ///
    /// # Errors
    /// [`PrivacyError::Domain`] for k = 0 or a NaN statistic (a corrupt record).
    pub fn restore(min_t: f64, k: usize) -> Result<Evidence, PrivacyError> {
        if k == 0 || min_t.is_nan() {
            return Err(PrivacyError::Domain(format!("confidence evidence: k = {k}, min T = {min_t}")));
        }
        Ok(Evidence { min_t, k })
    }

    /// The smallest T_j (+∞ when exact).
    pub fn min_t(&self) -> f64 {
        self.min_t
    }

    /// Number of active classes k.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Whether the released label is kept at level α: every T_j ≥
    /// Φ⁻¹(1 − α/(k − 1)).
    ///
    /// # Errors
    /// [`PrivacyError::Domain`] for α outside (0, 1).
    pub fn confident(&self, alpha: f64) -> Result<bool, PrivacyError> {
        threshold(alpha)?;
        if self.k <= 1 || self.min_t == f64::INFINITY {
            return Ok(true);
        }
        Ok(self.min_t >= threshold(alpha / (self.k - 1) as f64)?)
    }
}

#[cfg(test)]
mod test;
