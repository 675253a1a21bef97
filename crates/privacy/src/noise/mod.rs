//! A calibrated Gaussian noise covariance Σ with its certificate, and the
//! sampler (paper Theorem 2.4; argument in `docs/assurance/privacy-core.md` §2–3).
//!
//! Theorem 2.4: if the output covariance C has eigenpairs (λ_j, u_j), noise
//! with variance σ_j = √λ_j · (Σ_l √λ_l) / (2b) along u_j gives
//! I(S; M(S) + Z) ≤ ½·tr(Σ⁺C) = b.
//!
//! The bound ½·tr(Σ⁺C) ≤ b holds for *any* orthonormal basis U spanning
//! range(C), with q_j = u_jᵀ C u_j in place of λ_j (Gaussian channel:
//! I ≤ ½ log det(I + Σ⁺C) ≤ ½ tr(Σ⁺C)). So the calibration modes use LAPACK
//! only to *find* a good basis, and take the variances from upper bounds of
//! the exact quadratic forms q_j in that basis. An inaccurate eigenvector then
//! costs a little utility, never privacy.
//!
//! # Invariants
//! - [`Noise::certified`] is the only constructor of a noisy `Noise`: it
//!   calibrates to b·(1 − [`CALIBRATION_SLACK`])·(1 − η), then recomputes
//!   ½·(Σ_j q_j/v_j + residual term)/(1 − η) — the sampler's coefficients
//!   have covariance UᵀU ⪰ (1 − η)I — and requires it ≤ b·(1 −
//!   [`CERTIFICATE_MARGIN`]); if round-off pushed it above, *all* variances
//!   are scaled up and it is re-checked. The margin is ten times the
//!   agreement (~10⁻⁹ relative) measured between the certified value and an
//!   independent high-precision evaluation of ½·tr(Σ⁺C), so the floating-point
//!   error of the certificate itself cannot carry the true value past b.
//! - The basis arrives as an [`Orthonormal`], checked to
//!   [`ORTHONORMALITY_TOLERANCE`] (or, vector mode's check from G, to
//!   within its UᵀU's rounding bound), and the certificate charges for its
//!   η ≥ ‖UᵀU − I‖₂ (`privacy-core.md` §2, *Bases that are nearly
//!   orthonormal*): no step assumes U exactly orthonormal.
//! - No variance is below [`dynamic_range_floor`] of the block's largest,
//!   so round-off cannot decide a posterior update (issue 52); and under
//!   [`Floor::Resolvable`] (every release since committed noise) no basis
//!   direction's is below [`resolvable_floor`] nor the complement's below
//!   [`COMPLEMENT_RESOLUTION`] of the basis's, so every machine's kernels
//!   compute Σ closely enough for the key audit to pin its noise in every
//!   direction (issue 66): more noise, never less.
//! - Every direction has variance ≥ [`VARIANCE_FLOOR`] > 0, so range(Σ)
//!   always contains the span of the basis (never clamped down to zero).
//! - Where the caller reports signal outside the basis (residual > 0), the
//!   whole coordinate block gets isotropic noise, so range(Σ) is everything.

use super::{Nats, PrivacyError};
use ndarray::{Array1, Array2, ArrayView1, Axis};
use rand::CryptoRng;
use rand_distr::{Distribution, StandardNormal};

/// Smallest per-query MI the calibration accepts. Below it the floor
/// argument (signal lost to underflow ≪ slack·b) no longer holds.
pub const MIN_PER_QUERY: f64 = 1e-30;

/// Variance given to a direction whose exact signal is (or underflowed to)
/// zero. Tiny enough never to move an argmax, positive so range(Σ) is right.
/// Any signal that underflowed is < 2⁻¹⁰²² per subset, so its contribution
/// to ½·tr(Σ⁺C) is < 128·2⁻¹⁰²²/1e−250 ≈ 1e−70 ≪ 1e−9·[`MIN_PER_QUERY`].
pub const VARIANCE_FLOOR: f64 = 1e-250;

/// Relative headroom the certificate must show: ½·tr(Σ⁺C) ≤ b·(1 − 10⁻⁸),
/// ten times the ~10⁻⁹ by which an independent high-precision reference
/// and this computation were measured to agree (issue 21).
pub const CERTIFICATE_MARGIN: f64 = 1e-8;

/// Relative margin between the b used for calibration and b: twice
/// [`CERTIFICATE_MARGIN`], so the certificate passes without rescaling.
pub const CALIBRATION_SLACK: f64 = 2e-8;

/// Share of b spent on isotropic noise outside the basis (vector mode).
pub const RESIDUAL_SHARE: f64 = 1e-3;

/// How far the round-off of projecting a release may move the difference of
/// two subsets' Eq. 4 log-likelihoods, in nats, at the variance ratio
/// [`dynamic_range_floor`] allows.
pub const ROUNDING_PIN: f64 = 1e-5;

/// The least ratio of any variance of a block of n coordinates to the
/// block's largest (issue 52 §3). Projecting δ = r − x onto the basis errs
/// by up to γ‖δ‖ (γ = 4(n + 2)·2⁻⁵³), which moves δᵀΣ⁺δ by up to
/// 2γ‖δ‖‖Σ⁺δ‖ ≈ 2γ·√n·√(v_max/v_min) for honest noise: with variances
/// spanning 10²⁰ (a weak direction, or the complement at its round-off
/// size) round-off, not the release, decides the posterior update, and no
/// verifier can check it. Raising every variance to at least
/// v_max·(8γ√n / [`ROUNDING_PIN`])² bounds that term by ~[`ROUNDING_PIN`]/4:
/// more noise, never less, and at most ~10⁻³·√v_max in standard deviation
/// (n = 10 000; 10⁻⁶ at n = 128, 10⁻⁸ at n = 10).
pub fn dynamic_range_floor(n: usize) -> f64 {
    let gamma = 4.0 * (n + 2) as f64 * f64::EPSILON;
    (8.0 * gamma * (n as f64).sqrt() / ROUNDING_PIN).powi(2)
}

/// The least ratio of a basis direction's variance to the block's largest
/// for a release whose noise is committed to a key (issue 66, H2 of its
/// review). A direction's signal q_j is known to another machine's kernels
/// only to ~n·2⁻⁵²·q_max, so its variance v_j ∝ √q_j only to a relative
/// [`SPECTRAL_DRIFT`](crate::key_audit::SPECTRAL_DRIFT)·n·2⁻⁵²·(v_max/v_j)²
/// (the key audit's allowance); at this ratio that allowance is half of
/// [`UNRESOLVED_DRIFT`](crate::key_audit::UNRESOLVED_DRIFT), so the key
/// audit pins every basis direction's noise to within 10⁻³ of its standard
/// deviation (wherever the 2⁻³² grid resolves it). Without it, a direction
/// whose teachers differ by ~10⁻⁶ of the strongest one's spread could carry
/// far less noise than calibrated, unseen by the key audit, and still
/// separate the teachers by many standard deviations. In standard
/// deviation the floor is 1.2·10⁻³ of the largest at n = 1, 2.0·10⁻³ at
/// n = 10, 6.5·10⁻³ at n = 1 000: more noise, never less, on directions
/// that carry almost none of b. The complement has a floor of its own,
/// [`COMPLEMENT_RESOLUTION`].
pub fn resolvable_floor(n: usize) -> f64 {
    use crate::key_audit::{SPECTRAL_DRIFT, UNRESOLVED_DRIFT};
    (2.0 * SPECTRAL_DRIFT * n.max(1) as f64 * f64::EPSILON / UNRESOLVED_DRIFT).sqrt()
}

/// The least ratio of the complement's variance f to the sum of the basis
/// directions' for a release whose noise is committed to a key (issue 66).
/// The key audit allows the complement's whitened residual the kernels'
/// drift [`KERNEL_DRIFT`](crate::key_audit::KERNEL_DRIFT)·‖z′‖₂/√f, and
/// E‖z′‖² = tr Σ; at this ratio that is ~10⁻⁴ of a standard deviation
/// (for d − r ≤ 10⁶), where a complement at its round-off size (~10⁻⁸ of
/// the largest variance) left its noise unseen. It adds at most (d − r)·10⁻⁶
/// of the basis noise's energy: 0.1 % at d = 1 000, 3.3 % at d = 32 768.
pub const COMPLEMENT_RESOLUTION: f64 = 1e-6;

/// Which least variances a calibration gives Σ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Floor {
    /// [`dynamic_range_floor`] only: how releases were calibrated before
    /// committed noise. Replay uses it for steps that commit to no key.
    RoundOff,
    /// Also [`resolvable_floor`] on the basis directions and
    /// [`COMPLEMENT_RESOLUTION`] on the complement: every release of this
    /// version.
    #[default]
    Resolvable,
}

impl Floor {
    /// The least ratio of a basis direction's variance to the block's
    /// largest, for a block of `n` coordinates.
    pub fn ratio(self, n: usize) -> f64 {
        match self {
            Floor::RoundOff => dynamic_range_floor(n),
            Floor::Resolvable => dynamic_range_floor(n).max(resolvable_floor(n)),
        }
    }

    /// The least variance of the complement of a block of `n` coordinates
    /// whose largest variance is `top` and whose basis variances sum to
    /// `basis_sum`.
    fn complement(self, n: usize, top: f64, basis_sum: f64) -> f64 {
        let round_off = top * dynamic_range_floor(n);
        match self {
            Floor::RoundOff => round_off,
            Floor::Resolvable => round_off.max(COMPLEMENT_RESOLUTION * basis_sum),
        }
    }
}

/// Largest tolerated deviation of UᵀU from the identity.
pub const ORTHONORMALITY_TOLERANCE: f64 = 1e-10;

/// A basis U (n × r) whose columns were checked to be orthonormal, with a
/// bound η ≥ ‖UᵀU − I‖₂ that the certificate charges for
/// (`docs/assurance/privacy-core.md` §2). The only way to hand a basis to
/// [`Noise::certified`].
#[derive(Clone, Debug)]
pub struct Orthonormal {
    u: Array2<f64>,
    eta: f64,
}

impl Orthonormal {
    /// Checks that every entry of UᵀU is within [`ORTHONORMALITY_TOLERANCE`]
    /// of the identity's and bounds ‖UᵀU − I‖₂ by the computed Frobenius
    /// norm plus the rounding of the product (each entry of fl(UᵀU) is
    /// within n·2⁻⁵³·‖u_i‖‖u_j‖ of the exact one).
    ///
    /// # Errors
    /// [`PrivacyError::Uncertified`] if the columns are further from
    /// orthonormal than the tolerance.
    pub fn check(u: Array2<f64>) -> Result<Self, PrivacyError> {
        let (n, r) = u.dim();
        // UᵀU by `dsyrk`: one triangle, half a general product's flops;
        // each entry is still one dot product, so the bound below holds.
        let gram = pacpriv_lapack::gram(u.view(), pacpriv_lapack::Side::Columns)
            .map_err(|e| PrivacyError::Linalg(e.to_string()))?;
        let (mut worst, mut frobenius_sq) = (0.0, 0.0);
        for ((i, j), g) in gram.indexed_iter() {
            let e = (g - if i == j { 1.0 } else { 0.0 }).abs();
            worst = f64::max(worst, e);
            frobenius_sq += e * e;
        }
        if !(worst <= ORTHONORMALITY_TOLERANCE && frobenius_sq.is_finite()) {
            return Err(PrivacyError::Uncertified(format!("noise basis is not orthonormal (|UᵀU − I| = {worst:e})")));
        }
        // ‖E‖₂ ≤ ‖E‖_F; the computed entries are within n·2⁻⁵³·‖u_i‖‖u_j‖ of
        // the exact ones, so the Frobenius norm moves by at most n·r·2⁻⁵³·(1 + tol)
        // (allowed twice over); the last factor covers summing and the root.
        let rounding = (n * r) as f64 * f64::EPSILON * (1.0 + ORTHONORMALITY_TOLERANCE);
        let eta = (frobenius_sq.sqrt() + rounding) * (1.0 + 1e-6);
        // The charge needs η < 1; this many columns this close to orthonormal
        // always meet it unless r·n is ~10¹⁵.
        if eta >= 0.5 {
            return Err(PrivacyError::Uncertified(format!("noise basis too large to certify (η = {eta:e})")));
        }
        Ok(Orthonormal { u, eta })
    }

    /// A basis whose UᵀU was computed some other way: `gram` is within
    /// `rounding` of UᵀU in Frobenius norm (vector mode's check from G,
    /// `privacy-core.md` §4, *The orthonormality check from G*). Refused
    /// when ‖gram − I‖_F is above `most`; otherwise η = (max(‖gram − I‖_F,
    /// `rounding`) + `rounding`)·(1 + 10⁻⁶), which for `most` ≤ `rounding`
    /// is 2·`rounding`·(1 + 10⁻⁶) whatever the kernels computed.
    ///
    /// # Errors
    /// [`PrivacyError::Uncertified`] past `most` or at η ≥ ½,
    /// [`PrivacyError::Shape`] if `gram` is not r × r, with the basis
    /// handed back.
    pub fn from_gram(
        u: Array2<f64>,
        gram: &Array2<f64>,
        rounding: f64,
        most: f64,
    ) -> Result<Self, Box<(PrivacyError, Array2<f64>)>> {
        let r = u.ncols();
        let refused = |e, u| Err(Box::new((e, u)));
        if gram.dim() != (r, r) {
            return refused(PrivacyError::Shape(format!("UᵀU of {:?} for a basis of {r} columns", gram.dim())), u);
        }
        let deviation =
            gram.indexed_iter().map(|((i, j), g)| (g - if i == j { 1.0 } else { 0.0 }).powi(2)).sum::<f64>().sqrt();
        if !(deviation <= most && rounding.is_finite() && rounding >= 0.0) {
            let e = PrivacyError::Uncertified(format!("noise basis is not orthonormal (‖UᵀU − I‖_F = {deviation:e})"));
            return refused(e, u);
        }
        let eta = (deviation.max(rounding) + rounding) * (1.0 + 1e-6);
        if eta >= 0.5 {
            return refused(PrivacyError::Uncertified(format!("noise basis too large to certify (η = {eta:e})")), u);
        }
        Ok(Orthonormal { u, eta })
    }

    /// The checked matrix.
    pub fn matrix(&self) -> &Array2<f64> {
        &self.u
    }

    /// The bound η ≥ ‖UᵀU − I‖₂ (below ½): ‖U‖₂ ≤ √(1 + η).
    pub fn eta(&self) -> f64 {
        self.eta
    }

    /// Upper bounds of the quadratic forms the certificate needs when U is
    /// only nearly orthonormal: q_j ↦ (√q_j + κ√Σ_l q_l)², κ = η/(1 − η)
    /// (argument in `docs/assurance/privacy-core.md` §2, *Bases that are
    /// nearly orthonormal*). The residual bound needs no charge. η is
    /// mostly the rounding allowance n·r·2⁻⁵² (2.8·10⁻¹⁰ at d = 10 000,
    /// r = 127), or, for a basis checked from G (vector mode), up to
    /// 2·10⁻⁵; Σ_j √q̃_j grows by at most r·κ·√Σq, so Σ's trace by
    /// ≲ 4·10⁻⁸ in the first case and ≲ 5·10⁻³ in the second, while a
    /// direction that carries no signal of its own is charged its
    /// neighbours' κ²·Σq.
    fn charge(&self, q: &[f64]) -> Vec<f64> {
        let kappa = self.eta / (1.0 - self.eta);
        let spread = kappa * q.iter().sum::<f64>().sqrt();
        q.iter().map(|q| (q.sqrt() + spread).powi(2)).collect()
    }
}

/// Noise Σ = U·diag(v)·Uᵀ + f·(I − UUᵀ) on a block of output coordinates,
/// certified against the exact output covariance C.
#[derive(Clone, Debug)]
pub struct Noise {
    dim: usize,
    coords: Vec<usize>,
    basis: Array2<f64>,
    variances: Array1<f64>,
    complement: f64,
    mi_bound: f64,
}

/// One draw from a [`Noise`]: standard-normal coefficients along the basis
/// and the (already scaled) part orthogonal to it. Kept in this form because
/// the posterior update and confidence test need the coefficients without
/// the cancellation that recomputing them from r would cause when variances
/// span hundreds of orders of magnitude.
#[derive(Clone, Debug)]
pub struct NoiseDraw {
    /// g_j ~ N(0, 1); the noise along u_j is √v_j · g_j.
    pub std_coef: Array1<f64>,
    /// Noise in the complement of span(U) within the coordinate block
    /// (empty when f = 0).
    pub residual: Array1<f64>,
}

impl Noise {
    /// No noise at all: the output is the same under every subset with
    /// positive weight (unanimous teachers), so C = 0 and the answer is exact.
    pub fn none(dim: usize) -> Self {
        Noise {
            dim,
            coords: Vec::new(),
            basis: Array2::zeros((0, 0)),
            variances: Array1::zeros(0),
            complement: 0.0,
            mi_bound: 0.0,
        }
    }

    /// Calibrates and certifies noise for per-query budget `b`.
    ///
    /// # Arguments
    /// - `dim`: output dimension d.
    /// - `coords`: the output coordinates the noise lives on (sorted).
    /// - `basis`: |coords| × r, checked orthonormal columns u_j.
    /// - `q`: for each u_j an *upper bound* on u_jᵀ C u_j for the exact C.
    /// - `residual`: an upper bound on ‖X(I − UUᵀ)‖²_F (C = XᵀX) within
    ///   `coords`; 0 only when the signal provably lies in span(U).
    ///
    /// # Errors
    /// [`PrivacyError::PerQueryTooSmall`] for b < [`MIN_PER_QUERY`],
    /// [`PrivacyError::Uncertified`] if the basis is not orthonormal or the
    /// certificate fails even after scaling; [`PrivacyError::NonFinite`] for
    /// NaN inputs.
    pub fn certified(
        dim: usize,
        coords: Vec<usize>,
        basis: Orthonormal,
        q: &[f64],
        residual: f64,
        b: Nats,
    ) -> Result<Self, PrivacyError> {
        Self::certified_with_floor(dim, coords, basis, q, residual, b, 0.0, Floor::default())
    }

    /// [`Noise::certified`] with the complement's variance at least
    /// `complement_floor` when there is a complement (residual > 0), and
    /// the least variances `floor` says. More noise than the certificate
    /// needs, never less: vector mode raises the complement until the 2⁻³²
    /// grid pins the posterior update ([`super::vector`],
    /// `docs/assurance/privacy-core.md` §9).
    ///
    /// # Errors
    /// As [`Noise::certified`]; [`PrivacyError::NonFinite`] for a NaN or
    /// negative floor.
    // The certificate's inputs and the two floors: a struct would only
    // rename them at the three callers.
    #[allow(clippy::too_many_arguments)]
    pub fn certified_with_floor(
        dim: usize,
        coords: Vec<usize>,
        basis: Orthonormal,
        q: &[f64],
        residual: f64,
        b: Nats,
        complement_floor: f64,
        floor: Floor,
    ) -> Result<Self, PrivacyError> {
        if !(complement_floor.is_finite() && complement_floor >= 0.0) {
            return Err(PrivacyError::NonFinite("complement floor"));
        }
        let b = b.get();
        if b < MIN_PER_QUERY {
            return Err(PrivacyError::PerQueryTooSmall { value: b, min: MIN_PER_QUERY });
        }
        if basis.u.nrows() != coords.len() || basis.u.ncols() != q.len() || coords.iter().any(|&c| c >= dim) {
            return Err(PrivacyError::Shape(format!(
                "basis {:?} for {} coordinates and {} quadratic forms in dimension {dim}",
                basis.u.dim(),
                coords.len(),
                q.len()
            )));
        }
        if q.iter().chain([&residual]).any(|x| !x.is_finite() || *x < 0.0) {
            return Err(PrivacyError::NonFinite("quadratic forms of C"));
        }
        let q = basis.charge(q);
        let q = q.as_slice();
        // The sampler's coefficients have covariance UᵀU ⪰ (1 − η)I, which
        // divides the Gaussian channel's bound by at most 1 − η
        // (privacy-core.md §2, step 1): calibrated and certified with it.
        let sampled = 1.0 - basis.eta;

        let b_cal = b * (1.0 - CALIBRATION_SLACK) * sampled;
        let (b_main, b_res) =
            if residual > 0.0 { (b_cal * (1.0 - RESIDUAL_SHARE), b_cal * RESIDUAL_SHARE) } else { (b_cal, 0.0) };
        let complement =
            if residual > 0.0 { (residual / (2.0 * b_res)).max(VARIANCE_FLOOR).max(complement_floor) } else { 0.0 };
        let mut variances = Array1::from(theorem_2_4(q, b_main)) + complement;
        // No variance too far below the largest for round-off to leave the
        // posterior update checkable (dynamic_range_floor), nor for the key
        // audit to resolve (resolvable_floor, COMPLEMENT_RESOLUTION): more
        // noise only.
        let n = coords.len();
        let top = variances.iter().fold(complement, |a, &v| a.max(v));
        variances.mapv_inplace(|v| v.max(top * floor.ratio(n)));
        let complement = if complement > 0.0 { complement.max(floor.complement(n, top, variances.sum())) } else { 0.0 };
        // Σ ⪰ f·I on the whole block, as the noise audit's floors assume.
        variances.mapv_inplace(|v| v.max(complement));

        let mut noise = Noise { dim, coords, basis: basis.u, variances, complement, mi_bound: f64::INFINITY };
        let certified = b * (1.0 - CERTIFICATE_MARGIN);
        // Round-off only ever adds noise: scale everything up until certified.
        for _ in 0..4 {
            let mi = certificate(q, residual, &noise.variances, noise.complement) / sampled;
            if mi <= certified {
                noise.mi_bound = mi;
                return Ok(noise);
            }
            let scale = (mi / certified) * (1.0 + CALIBRATION_SLACK);
            noise.variances.mapv_inplace(|v| v * scale);
            noise.complement *= scale;
        }
        Err(PrivacyError::Uncertified(format!("½·tr(Σ⁺C) stayed above b = {b:e} after scaling")))
    }

    /// Output dimension d.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Number of noisy directions r (0 for an exact answer).
    pub fn rank(&self) -> usize {
        self.variances.len()
    }

    /// True when the answer carries no noise (C = 0).
    pub fn is_exact(&self) -> bool {
        self.rank() == 0 && self.complement == 0.0
    }

    /// The certified bound ½·tr(Σ⁺C) ≤ b·(1 − [`CERTIFICATE_MARGIN`]) on the
    /// MI of this release.
    pub fn mi_bound(&self) -> f64 {
        self.mi_bound
    }

    /// Output coordinates the noise lives on.
    pub fn coords(&self) -> &[usize] {
        &self.coords
    }

    /// Orthonormal noise directions, |coords| × r.
    pub fn basis(&self) -> &Array2<f64> {
        &self.basis
    }

    /// Variance along each basis direction.
    pub fn variances(&self) -> ArrayView1<'_, f64> {
        self.variances.view()
    }

    /// Variance on the complement of span(U) within the coordinate block.
    pub fn complement(&self) -> f64 {
        self.complement
    }

    /// Draws z ~ N(0, Σ) from a cryptographically secure generator
    /// ([`Noise::sample_from`] on its standard normals).
    pub fn sample<R: CryptoRng + ?Sized>(&self, rng: &mut R) -> NoiseDraw {
        self.sample_from(|| StandardNormal.sample(rng))
    }

    /// Draws z ~ N(0, Σ) from the standard normals `normal` gives (none
    /// for an exact answer): g, the next |coords| of them, gives the
    /// coefficients along the basis, u_jᵀg; when there is a complement, h,
    /// the |coords| after them, gives its part, √f·(I − UUᵀ)h.
    ///
    /// So z = U·diag(√v)·Uᵀg + √f·(I − UUᵀ)h: the noise depends on U only
    /// through Σ's spectral projectors, and a verifier whose LAPACK returns
    /// another basis of a repeated eigenvalue's space recomputes the same z
    /// from the same normals (the keyed audit, `privacy-core.md` §10). For U
    /// orthonormal Uᵀg ~ N(0, I_r) and (I − UUᵀ)h ~ N(0, I − UUᵀ),
    /// independent, so z ~ N(0, Σ); for a checked basis the coefficients'
    /// covariance UᵀU ⪰ (1 − η)I, which the certificate divides by
    /// ([`Noise::certified`], §2). The two parts use separate normals so that no
    /// cross term between the basis and the complement arises when U is
    /// only nearly orthonormal.
    pub fn sample_from(&self, mut normal: impl FnMut() -> f64) -> NoiseDraw {
        if self.is_exact() {
            return NoiseDraw { std_coef: Array1::zeros(0), residual: Array1::zeros(0) };
        }
        let n = self.coords.len();
        let g: Array1<f64> = (0..n).map(|_| normal()).collect();
        let std_coef = self.basis.t().dot(&g);
        let residual = if self.complement > 0.0 {
            let h: Array1<f64> = (0..n).map(|_| normal()).collect();
            let inside = self.basis.dot(&self.basis.t().dot(&h));
            (h - inside) * self.complement.sqrt()
        } else {
            Array1::zeros(0)
        };
        NoiseDraw { std_coef, residual }
    }

    /// The noise vector z in the full d-dimensional output space.
    pub fn noise_vector(&self, draw: &NoiseDraw) -> Array1<f64> {
        let mut z = Array1::zeros(self.dim);
        for (&c, v) in self.coords.iter().zip(self.block(draw)) {
            z[c] = v;
        }
        z
    }

    /// z on [`coords`](Self::coords) only, in their order: every other
    /// coordinate of z is exactly 0. O(|coords|·r), independent of d.
    pub fn block(&self, draw: &NoiseDraw) -> Array1<f64> {
        if self.coords.is_empty() {
            return Array1::zeros(0);
        }
        let coef = &draw.std_coef * &self.variances.mapv(f64::sqrt);
        let mut block = self.basis.dot(&coef);
        if !draw.residual.is_empty() {
            block += &draw.residual;
        }
        block
    }

    /// −½ (r − x)ᵀ Σ⁺ (r − x) for a candidate output x, where the release is
    /// r = x* + z and the caller supplies δ = x* − x as its coefficients in
    /// the basis (`delta_coef`, length r) and its part outside the basis
    /// (`delta_residual`, length |coords|, may be empty when f = 0).
    pub fn log_likelihood(
        &self,
        delta_coef: ArrayView1<'_, f64>,
        delta_residual: ArrayView1<'_, f64>,
        draw: &NoiseDraw,
    ) -> f64 {
        let outside = if self.complement == 0.0 {
            0.0
        } else if delta_residual.is_empty() {
            draw.residual.dot(&draw.residual)
        } else {
            delta_residual.iter().zip(&draw.residual).map(|(d, z)| (d + z) * (d + z)).sum()
        };
        self.log_likelihood_outside(delta_coef, outside, draw)
    }

    /// [`log_likelihood`](Self::log_likelihood) with the release's part
    /// outside the basis given as `outside` = ‖δ_residual + z_residual‖²
    /// (ignored when f = 0): vector mode computes it for every teacher
    /// from the release's residual without forming each δ.
    pub fn log_likelihood_outside(&self, delta_coef: ArrayView1<'_, f64>, outside: f64, draw: &NoiseDraw) -> f64 {
        let mut qf = 0.0;
        for ((d, g), v) in delta_coef.iter().zip(&draw.std_coef).zip(&self.variances) {
            // (δ + √v·g)²/v = (δ/√v + g)²: exact for the true subset (δ = 0).
            let t = d / v.sqrt() + g;
            qf += t * t;
        }
        if self.complement > 0.0 {
            qf += outside / self.complement;
        }
        -0.5 * qf
    }

    /// Σ as a dense d × d matrix (tests and small-case cross-checks).
    pub fn dense(&self) -> Array2<f64> {
        let mut sigma = Array2::zeros((self.dim, self.dim));
        if self.coords.is_empty() {
            return sigma;
        }
        let k = self.coords.len();
        let scaled = &self.basis * &self.variances.view().insert_axis(Axis(0));
        let mut block = scaled.dot(&self.basis.t());
        if self.complement > 0.0 {
            let proj = self.basis.dot(&self.basis.t());
            block = block + (Array2::<f64>::eye(k) - proj) * self.complement;
        }
        for (a, &ca) in self.coords.iter().enumerate() {
            for (b, &cb) in self.coords.iter().enumerate() {
                sigma[[ca, cb]] = block[[a, b]];
            }
        }
        sigma
    }
}

/// Theorem 2.4 with quadratic forms q_j in place of eigenvalues:
/// σ_j = √q_j · (Σ_l √q_l) / (2b), floored at [`VARIANCE_FLOOR`].
pub fn theorem_2_4(q: &[f64], b: f64) -> Vec<f64> {
    let s: f64 = q.iter().map(|x| x.sqrt()).sum();
    q.iter().map(|x| (x.sqrt() * s / (2.0 * b)).max(VARIANCE_FLOOR)).collect()
}

/// ½·tr(Σ⁺C) ≤ ½·(Σ_j q_j / v_j + residual / f): the MI bound of the
/// release, evaluated with upper bounds of the exact C.
fn certificate(q: &[f64], residual: f64, variances: &Array1<f64>, complement: f64) -> f64 {
    let main: f64 = q.iter().zip(variances).map(|(q, v)| q / v).sum();
    let rest = if residual > 0.0 { residual / complement } else { 0.0 };
    0.5 * (main + rest)
}

#[cfg(test)]
mod test;
