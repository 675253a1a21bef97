//! Label-mode calibration: every teacher answers with a label, the released
//! output is the one-hot vector of the secret teacher's label plus noise
//! (paper §4.2.4 "output stabilization", Theorem 2.4; argument in
//! `docs/assurance/privacy-core.md` §3).
//!
//! Under weights w the one-hot outputs are categorical with
//! p_c = Σ_{i: y_i = c} w_i, so C = diag(p) − ppᵀ exactly. Only the k active
//! classes (those some teacher predicts) carry signal, and on them C·1 = 0:
//! C lives on the (k−1)-dimensional subspace of the active coordinates
//! orthogonal to the all-ones vector. Hence:
//! - k = 1: C = 0, the answer is exact and the posterior cannot move.
//! - k = 2: one direction (e₁ − e₂)/√2 with u ᵀCu = 2·p₁·p₂, closed form.
//! - k ≥ 3: project C onto an orthonormal (Helmert) basis of 1^⊥ and
//!   eigendecompose the (k−1)×(k−1) result with LAPACK `eigh`.
//!
//! Inactive classes and the all-ones direction get no noise *by
//! construction*, so no round-off eigenvalue there is ever amplified by
//! 1/(2b) (NOTES.md: that used to flip argmaxes at b = 2⁻³²).
//!
//! The variance along each direction comes from q_j = Var_p(u_j), computed
//! as Σ_c p_c (u_jc − ū_j)²: a sum of non-negative terms (no cancellation),
//! and any rounding in the centre ū_j only makes it larger — an upper bound
//! of the exact quadratic form, as [`Noise::certified`] requires.

use super::noise::{Floor, Noise, NoiseDraw, Orthonormal};
use super::posterior::{Groups, Posterior};
use super::{Nats, PrivacyError};
use ndarray::{Array1, Array2, ArrayView1};
use ndarray_linalg::{Eigh, UPLO};

/// Relative error allowance for class probabilities: from log form,
/// exponentials of normalised log-weights (|log w| ≤ 745 ⇒ relative error
/// ≤ 745·2⁻⁵³); in either form, sums of m non-negative terms and one
/// division (≤ (m + 1)·2⁻⁵³, below the margin for m < 9 000).
pub const WEIGHT_ROUNDING: f64 = 1e-12;

/// Largest tolerated |1ᵀu_j| for a label-mode noise direction.
pub const ONES_TOLERANCE: f64 = 1e-10;

/// Smallest variance, relative to the largest, an observer resolves when it
/// recomputes the noise basis ([`LabelCalibration::observed_teacher_log_likelihoods`]).
pub const OBSERVER_RELATIVE_FLOOR: f64 = 1e-12;

/// Noise for one label-mode query under one posterior.
#[derive(Clone, Debug)]
pub struct LabelCalibration {
    classes: Vec<usize>,
    /// The teachers grouped by label in order of first appearance (the
    /// groups of [`UpdateRule::Linear`](super::posterior::UpdateRule::Linear)),
    /// and each group's position in `classes` and mass
    /// ([`Posterior::group_masses`]).
    groups: Groups,
    group_position: Vec<usize>,
    masses: Vec<f64>,
    p: Vec<f64>,
    noise: Noise,
}

/// Calibrates label-mode noise for teacher labels `labels` (one per subset,
/// each < `classes`) under `posterior` with per-query budget `b`.
///
/// # Errors
/// [`PrivacyError::TeacherCount`] / [`PrivacyError::Shape`] for mismatched
/// inputs, [`PrivacyError::Linalg`] if LAPACK fails, and whatever
/// [`Noise::certified`] refuses.
///
/// # Runtime
/// O(m) for k ≤ 2; O(m + k³) with one LAPACK `eigh` of size k−1 otherwise.
pub fn calibrate(
    posterior: &Posterior,
    labels: &[usize],
    classes: usize,
    b: Nats,
) -> Result<LabelCalibration, PrivacyError> {
    calibrate_with(posterior, labels, classes, b, Floor::default())
}

/// [`calibrate`] with the basis directions' variances floored as `floor`
/// says: replay recalibrates a step from before committed noise with
/// [`Floor::RoundOff`], as it was released.
///
/// # Errors
/// As [`calibrate`].
pub fn calibrate_with(
    posterior: &Posterior,
    labels: &[usize],
    classes: usize,
    b: Nats,
    floor: Floor,
) -> Result<LabelCalibration, PrivacyError> {
    if labels.len() != posterior.len() {
        return Err(PrivacyError::TeacherCount { posterior: posterior.len(), teachers: labels.len() });
    }
    check_labels(labels, classes)?;

    // Classes in order of first appearance (the posterior's groups), then
    // sorted for the release; no pass over the m labels sorts them.
    let groups = Groups::by_key(labels);
    let k = groups.count();
    let mut first_seen = vec![0; k];
    for (&g, &y) in groups.of().iter().zip(labels) {
        first_seen[g] = y;
    }
    let mut classes_seen = first_seen.clone();
    classes_seen.sort_unstable();
    let group_position: Vec<usize> =
        first_seen.iter().map(|y| classes_seen.binary_search(y).unwrap_or_default()).collect(); // every class is in the sorted set

    let masses = posterior.group_masses(&groups);
    let p = class_probabilities(&masses, &group_position);

    let noise = match k {
        1 => Noise::none(classes),
        2 => {
            let u =
                Array2::from_shape_vec((2, 1), vec![std::f64::consts::FRAC_1_SQRT_2, -std::f64::consts::FRAC_1_SQRT_2])
                    .map_err(|e| PrivacyError::Shape(e.to_string()))?;
            let q = 2.0 * p[0] * p[1] * (1.0 + WEIGHT_ROUNDING);
            Noise::certified_with_floor(
                classes,
                classes_seen.clone(),
                Orthonormal::check(u)?,
                &[q],
                0.0,
                b,
                0.0,
                floor,
            )?
        }
        _ => {
            let u = eigenbasis(&p)?;
            check_orthogonal_to_ones(&u)?;
            let q: Vec<f64> =
                (0..k - 1).map(|j| weighted_variance(&p, u.column(j)) * (1.0 + WEIGHT_ROUNDING)).collect();
            Noise::certified_with_floor(classes, classes_seen.clone(), Orthonormal::check(u)?, &q, 0.0, b, 0.0, floor)?
        }
    };
    Ok(LabelCalibration { classes: classes_seen, groups, group_position, masses, p, noise })
}

impl LabelCalibration {
    /// The active classes, sorted.
    pub fn classes(&self) -> &[usize] {
        &self.classes
    }

    /// Posterior probability of each active class.
    pub fn class_probabilities(&self) -> &[f64] {
        &self.p
    }

    /// True when every teacher gave the same label (k = 1).
    pub fn unanimous(&self) -> bool {
        self.classes.len() == 1
    }

    /// The certified noise.
    pub fn noise(&self) -> &Noise {
        &self.noise
    }

    /// Position (within [`classes`](Self::classes)) of teacher i's label.
    pub fn position_of_teacher(&self, teacher: usize) -> Option<usize> {
        self.groups.of().get(teacher).map(|&g| self.group_position[g])
    }

    /// The release r = e_{y*} + z restricted to the active classes, where
    /// `center` is the position of the secret teacher's label.
    pub fn release_block(&self, center: usize, draw: &NoiseDraw) -> Array1<f64> {
        // The noise lives on the active classes, in their order.
        let mut r = if self.noise.rank() > 0 { self.noise.block(draw) } else { Array1::zeros(self.classes.len()) };
        r[center] += 1.0;
        r
    }

    /// −½ (r − e_c)ᵀ Σ⁺ (r − e_c) for every active class c (one quadratic
    /// form per class, O(k) each), where r was released around `center`.
    pub fn class_log_likelihoods(&self, center: usize, draw: &NoiseDraw) -> Array1<f64> {
        let basis = self.noise.basis();
        let empty = Array1::zeros(0);
        (0..self.classes.len())
            .map(|c| {
                if self.noise.rank() == 0 {
                    return 0.0;
                }
                let delta = &basis.row(center) - &basis.row(c);
                self.noise.log_likelihood(delta.view(), empty.view(), draw)
            })
            .collect()
    }

    /// Eq. 4's log-likelihood for each teacher computed from an *observed*
    /// release `r` (length d), as an observer who knows the teachers'
    /// labels and the posterior computes it: −½ Σ_j (u_jᵀ(r − e_c))² / (v_j + k·ρ²)
    /// for teacher i's class c, where every coordinate of r may be off by up
    /// to ρ (`rounding`, at least 8 ulps of max(1, ‖r‖∞)). The k·ρ² term models that
    /// error as extra noise along u_j (|u_jᵀe| ≤ ‖e‖ ≤ √k·ρ): without it, a
    /// direction whose noise is far below the rounding would turn 2⁻³³ of
    /// rounding into an astronomically confident, wrong likelihood.
    /// Coordinates of inactive classes are ignored (the mechanism puts no
    /// noise there). The curator uses the noise coefficients instead
    /// ([`teacher_log_likelihoods`](Self::teacher_log_likelihoods)), the same
    /// function of the exact r without cancellation.
    ///
    /// # Errors
    /// [`PrivacyError::Shape`] if r has the wrong length,
    /// [`PrivacyError::NonFinite`] if it holds NaN or ±∞.
    pub fn observed_teacher_log_likelihoods(&self, r: &[f64], rounding: f64) -> Result<Array1<f64>, PrivacyError> {
        if r.len() != self.noise.dim() {
            return Err(PrivacyError::Shape(format!("release has {} values, expected {}", r.len(), self.noise.dim())));
        }
        if r.iter().any(|v| !v.is_finite()) {
            return Err(PrivacyError::NonFinite("observed release"));
        }
        let basis = self.noise.basis();
        // A double is itself only known to within a few ulps once u_jᵀr is
        // summed: the same floor applies to an "exact" r.
        let scale = r.iter().fold(1.0f64, |a, v| a.max(v.abs()));
        let rounding = rounding.max(8.0 * f64::EPSILON * scale);
        let extra = self.classes.len() as f64 * rounding * rounding;
        // The observer computes its own eigenbasis, and LAPACK pins an
        // eigenvector only to about ε/gap: near-degenerate directions can tilt
        // by ~10⁻⁷, leaking ~10⁻⁷·σ_max of the strong direction into a weak
        // one. Below 10⁻¹² of the largest variance a direction is therefore
        // treated as having that variance — still enough to rule out every
        // class that differs there by more than ~10⁻⁶·σ_max.
        let v_max = self.noise.variances().iter().copied().fold(0.0, f64::max);
        let variances = self.noise.variances().mapv(|v| v.max(OBSERVER_RELATIVE_FLOOR * v_max));
        let per_class: Vec<f64> = (0..self.classes.len())
            .map(|c| {
                let mut qf = 0.0;
                for j in 0..self.noise.rank() {
                    let t: f64 = self
                        .classes
                        .iter()
                        .enumerate()
                        .map(|(a, &class)| basis[[a, j]] * (r[class] - if a == c { 1.0 } else { 0.0 }))
                        .sum();
                    qf += t * t / (variances[j] + extra);
                }
                -0.5 * qf
            })
            .collect();
        Ok(self.per_teacher(ArrayView1::from(&per_class)))
    }

    /// Eq. 4's log-likelihood for each teacher: the value of its label's class.
    pub fn teacher_log_likelihoods(&self, center: usize, draw: &NoiseDraw) -> Array1<f64> {
        self.per_teacher(self.class_log_likelihoods(center, draw).view())
    }

    /// Each teacher's entry of a per-class vector (indexed by position in
    /// [`classes`](Self::classes)).
    fn per_teacher(&self, per_class: ArrayView1<'_, f64>) -> Array1<f64> {
        self.spread(&self.per_group(per_class))
    }

    /// Each group's entry of a per-class vector.
    fn per_group(&self, per_class: ArrayView1<'_, f64>) -> Vec<f64> {
        self.group_position.iter().map(|&at| per_class[at]).collect()
    }

    /// Each teacher's entry of a per-group vector.
    fn spread(&self, per_group: &[f64]) -> Array1<f64> {
        self.groups.of().iter().map(|&g| per_group[g]).collect()
    }

    /// Applies Eq. 4 for the release drawn around `center` to `posterior`
    /// (the one this calibration was made under) by the linear rule
    /// ([`super::posterior::UpdateRule::Linear`], one group per label):
    /// k exponentials and m multiplies, reusing the class masses computed
    /// for p. Bit for bit what
    /// [`Posterior::update_by`] makes of the teachers' labels and the
    /// returned [`teacher_log_likelihoods`](Self::teacher_log_likelihoods),
    /// which is what replay runs. The same work whatever `center` is.
    ///
    /// # Errors
    /// As [`Posterior::update`]; the posterior is then unchanged.
    pub fn update_posterior(
        &self,
        posterior: &mut Posterior,
        center: usize,
        draw: &NoiseDraw,
    ) -> Result<Array1<f64>, PrivacyError> {
        let per_class = self.class_log_likelihoods(center, draw);
        let group_lik = self.per_group(per_class.view());
        posterior.update_linear(&self.groups, &group_lik, &self.masses)?;
        Ok(self.spread(&group_lik))
    }
}

/// Every label must name one of the `classes` classes.
///
/// # Errors
/// [`PrivacyError::Shape`] naming the first label that does not.
pub fn check_labels(labels: &[usize], classes: usize) -> Result<(), PrivacyError> {
    match labels.iter().find(|&&y| y >= classes) {
        Some(bad) => Err(PrivacyError::Shape(format!("teacher label {bad} is not below the class count {classes}"))),
        None => Ok(()),
    }
}

/// p_c = Σ_{i: y_i = c} w_i from each class's mass up to a common factor
/// ([`Posterior::group_masses`]; group g sits at position `position[g]`),
/// normalised by their sum so that Σ p = 1 as C = diag(p) − ppᵀ assumes. A
/// class whose mass underflowed holds < 2⁻¹⁰²² of the largest: the
/// variance floor covers it (`docs/assurance/privacy-core.md` §2).
fn class_probabilities(masses: &[f64], position: &[usize]) -> Vec<f64> {
    let mut p = vec![0.0; masses.len()];
    for (&mass, &at) in masses.iter().zip(position) {
        p[at] = mass;
    }
    let total: f64 = p.iter().sum();
    p.iter_mut().for_each(|x| *x /= total);
    p
}

/// Orthonormal eigenbasis of C = diag(p) − ppᵀ on 1^⊥, as k × (k−1).
fn eigenbasis(p: &[f64]) -> Result<Array2<f64>, PrivacyError> {
    let k = p.len();
    let h = helmert(k);
    let pv = Array1::from(p.to_vec());
    // Qᵀ diag(p) Q − (Qᵀp)(Qᵀp)ᵀ, never forming the k × k C.
    let hp = &h * &pv.view().insert_axis(ndarray::Axis(1));
    let qtp = h.t().dot(&pv);
    let mut c = h.t().dot(&hp);
    let outer = qtp.view().insert_axis(ndarray::Axis(1)).dot(&qtp.view().insert_axis(ndarray::Axis(0)));
    c -= &outer;
    let v = if k == 3 { symmetric_2x2_eigenvectors(c[[0, 0]], c[[1, 0]], c[[1, 1]]) } else { c.eigh(UPLO::Lower)?.1 };
    Ok(h.dot(&v))
}

/// The eigenvectors of [[a, b], [b, d]] as columns: the Jacobi rotation
/// that diagonalises it (Golub & Van Loan, *Matrix Computations*, 4th ed.,
/// Alg. 8.5.1), orthonormal to rounding. k = 3 needs only this, and a
/// LAPACK call costs more than the rest of the answer; the certificate
/// checks whatever basis is used, so its accuracy is utility's concern,
/// never privacy's.
fn symmetric_2x2_eigenvectors(a: f64, b: f64, d: f64) -> Array2<f64> {
    let (cos, sin) = if b == 0.0 {
        (1.0, 0.0)
    } else {
        let tau = (d - a) / (2.0 * b);
        let t = if tau >= 0.0 { 1.0 / (tau + tau.hypot(1.0)) } else { -1.0 / (-tau + tau.hypot(1.0)) };
        let cos = 1.0 / t.hypot(1.0);
        (cos, t * cos)
    };
    ndarray::array![[cos, sin], [-sin, cos]]
}

/// The Helmert basis of 1^⊥ in ℝᵏ: column j is
/// (1, …, 1, −(j+1), 0, …) / √((j+1)(j+2)).
pub fn helmert(k: usize) -> Array2<f64> {
    let mut h = Array2::zeros((k, k.saturating_sub(1)));
    for j in 0..k.saturating_sub(1) {
        let n = (j + 1) as f64;
        let norm = (n * (n + 1.0)).sqrt();
        for i in 0..=j {
            h[[i, j]] = 1.0 / norm;
        }
        h[[j + 1, j]] = -n / norm;
    }
    h
}

/// Σ_c p_c (u_c − ū)² with ū = Σ_c p_c u_c: uᵀCu without cancellation.
pub fn weighted_variance(p: &[f64], u: ArrayView1<'_, f64>) -> f64 {
    let mean: f64 = p.iter().zip(u).map(|(p, u)| p * u).sum();
    p.iter().zip(u).map(|(p, u)| p * (u - mean) * (u - mean)).sum()
}

fn check_orthogonal_to_ones(u: &Array2<f64>) -> Result<(), PrivacyError> {
    for col in u.columns() {
        let s = col.sum().abs();
        if s > ONES_TOLERANCE {
            return Err(PrivacyError::Uncertified(format!(
                "label noise direction not orthogonal to 1 (|1ᵀu| = {s:e})"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod test;
