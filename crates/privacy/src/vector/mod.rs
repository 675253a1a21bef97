//! Vector-mode calibration for teachers whose released output is a vector
//! (scores, regression outputs): paper §2.1 remark — SVD of the weighted,
//! centred m × d output matrix — with the same Theorem 2.4 formula, the same
//! certificate and the same posterior update as label mode (argument in
//! `docs/assurance/privacy-core.md` §4).
//!
//! With X = diag(√w)(V − 1μᵀ), C = XᵀX. The right singular vectors of X
//! give the basis U (d × r, r = min(m, d)); each direction's variance comes
//! from an upper bound of ‖X u_j‖², the exact quadratic form. When r < d the
//! signal left outside span(U) by round-off is bounded from above and covered
//! by isotropic noise on the complement (a [`RESIDUAL_SHARE`](super::noise::RESIDUAL_SHARE)
//! of b), so range(C) ⊆ range(Σ) holds without trusting the SVD's rank.
//!
//! # Runtime
//! One thin SVD of m × d (LAPACK `gesdd`) and O(m·d·r) products: milliseconds
//! at d = 1000; callers run it off the async executor.

use super::noise::{Noise, NoiseDraw};
use super::posterior::Posterior;
use super::{Nats, PrivacyError};
use ndarray::{Array1, Array2, ArrayView2, Axis};
use ndarray_linalg::{JobSvd, SVDDC};

/// Noise for one vector-mode query under one posterior.
#[derive(Clone, Debug)]
pub struct VectorCalibration {
    outputs: Array2<f64>,
    /// Teacher outputs in the basis, (V − 1μᵀ)·U, m × r.
    coef: Array2<f64>,
    /// Teacher outputs outside the basis, (V − 1μᵀ)(I − UUᵀ), m × d (empty when r = d).
    residual: Array2<f64>,
    noise: Noise,
}

/// Calibrates vector-mode noise for the m × d teacher outputs under
/// `posterior` with per-query budget `b`.
///
/// # Errors
/// [`PrivacyError::NonFinite`] for NaN/∞ outputs, [`PrivacyError::TeacherCount`]
/// for a wrong number of rows, [`PrivacyError::Linalg`] if the SVD fails, and
/// whatever [`Noise::certified`] refuses.
pub fn calibrate(
    posterior: &Posterior,
    outputs: ArrayView2<'_, f64>,
    b: Nats,
) -> Result<VectorCalibration, PrivacyError> {
    let (m, d) = outputs.dim();
    if m != posterior.len() {
        return Err(PrivacyError::TeacherCount { posterior: posterior.len(), teachers: m });
    }
    check_outputs(outputs)?;
    let outputs = outputs.to_owned();
    let first = outputs.row(0);
    if outputs.rows().into_iter().all(|r| r == first) {
        return Ok(VectorCalibration {
            coef: Array2::zeros((m, 0)),
            residual: Array2::zeros((0, 0)),
            outputs,
            noise: Noise::none(d),
        });
    }

    let w = posterior.weights();
    let underflowed = w.iter().filter(|&&x| x == 0.0).count();
    let mu = w.dot(&outputs);
    let centred = &outputs - &mu.view().insert_axis(Axis(0));
    let sqrt_w = w.mapv(f64::sqrt);
    let x = &centred * &sqrt_w.view().insert_axis(Axis(1));
    let (_, _, vt) = x.svddc(JobSvd::Some)?;
    let vt = vt.ok_or_else(|| PrivacyError::Linalg("SVD returned no right singular vectors".into()))?;
    let basis = vt.t().to_owned();
    let r = basis.ncols();

    // Upper bounds of the exact quadratic forms (see module doc): computed
    // norms plus a rounding allowance γ‖X‖_F, plus what underflowed weights
    // (each < 2⁻¹⁰²²) could hide.
    let gamma = 4.0 * (d + r + 4) as f64 * f64::EPSILON;
    let x_norm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
    let max_dev = centred.rows().into_iter().map(|row| row.dot(&row)).fold(0.0, f64::max);
    let hidden = underflowed as f64 * f64::MIN_POSITIVE * max_dev;
    let inflate =
        |norm_sq: f64| ((norm_sq.sqrt() + gamma * x_norm).powi(2) + hidden) * (1.0 + super::label::WEIGHT_ROUNDING);

    let coef = centred.dot(&basis);
    let q: Vec<f64> =
        coef.columns().into_iter().map(|col| inflate(col.iter().zip(&w).map(|(c, w)| w * c * c).sum())).collect();
    let (residual, residual_bound) = if r < d {
        let res = &centred - &coef.dot(&basis.t());
        let norm_sq: f64 = res.rows().into_iter().zip(&w).map(|(row, w)| w * row.dot(&row)).sum();
        // Never 0: a teacher whose weight is ~1e-300 makes every term of
        // the bound underflow to 0, which would leave the complement
        // without noise while its outputs may still differ there by
        // round-off. The smallest positive bound floors the complement's
        // variance instead (more noise, a negligible MI term).
        (res, inflate(norm_sq).max(f64::MIN_POSITIVE))
    } else {
        (Array2::zeros((0, 0)), 0.0)
    };

    let noise = Noise::certified(d, (0..d).collect(), basis, &q, residual_bound, b)?;
    Ok(VectorCalibration { outputs, coef, residual, noise })
}

/// Teacher vectors must have at least one column and only finite values.
///
/// # Errors
/// [`PrivacyError::Shape`] or [`PrivacyError::NonFinite`].
pub fn check_outputs(outputs: ArrayView2<'_, f64>) -> Result<(), PrivacyError> {
    if outputs.ncols() == 0 {
        return Err(PrivacyError::Shape("teacher outputs have no columns".into()));
    }
    if outputs.iter().any(|x| !x.is_finite()) {
        return Err(PrivacyError::NonFinite("teacher outputs"));
    }
    Ok(())
}

impl VectorCalibration {
    /// True when every teacher gave exactly the same vector.
    pub fn unanimous(&self) -> bool {
        self.noise.is_exact()
    }

    /// The certified noise.
    pub fn noise(&self) -> &Noise {
        &self.noise
    }

    /// The release r = v_{s*} + z.
    pub fn release(&self, secret: usize, draw: &NoiseDraw) -> Array1<f64> {
        &self.outputs.row(secret) + &self.noise.noise_vector(draw)
    }

    /// Eq. 4's log-likelihood of the release under each teacher's output.
    pub fn teacher_log_likelihoods(&self, secret: usize, draw: &NoiseDraw) -> Array1<f64> {
        let m = self.outputs.nrows();
        if self.noise.is_exact() {
            return Array1::zeros(m);
        }
        let empty = Array1::zeros(0);
        (0..m)
            .map(|i| {
                let dc = &self.coef.row(secret) - &self.coef.row(i);
                if self.residual.is_empty() {
                    self.noise.log_likelihood(dc.view(), empty.view(), draw)
                } else {
                    let dr = &self.residual.row(secret) - &self.residual.row(i);
                    self.noise.log_likelihood(dc.view(), dr.view(), draw)
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod test;
