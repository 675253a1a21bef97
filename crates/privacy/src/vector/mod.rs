//! Vector-mode calibration for teachers whose released output is a vector
//! (scores, regression outputs): paper §2.1 remark — the principal
//! directions of the weighted, centred m × d output matrix — with the same
//! Theorem 2.4 formula, the same certificate and the same posterior update
//! as label mode (argument in `docs/assurance/privacy-core.md` §4).
//!
//! With X = diag(√w)(V − 1μᵀ), C = XᵀX. The basis U (d × r) is X's right
//! singular vectors, found from the eigenvectors of the smaller of X's two
//! Gram matrices — C itself when d ≤ m, K = XXᵀ (m × m) otherwise — or, when
//! that declines, by the thin SVD of X ([`Basis`]); each
//! direction's variance comes from an upper bound of ‖X u_j‖², the exact
//! quadratic form. When r < d the signal left outside span(U) is bounded
//! from above and covered by isotropic noise on the complement (a
//! [`RESIDUAL_SHARE`](super::noise::RESIDUAL_SHARE) of b), so range(C) ⊆
//! range(Σ) holds without trusting either decomposition's rank.
//!
//! # Runtime
//! d ≤ m: C (BLAS `dsyrk`, m·d² flops), LAPACK `dsyevd` on the d × d C, the
//! orthonormality check, the coefficients and (when a direction is left
//! out) the residual. d > m: K (`dsyrk`, m²·d), `dsyevd` on K (m × m), the
//! d-wide directions, the orthonormality check and the residual (three
//! O(m·d·r) products), the coefficients from the m × m G that K is scaled
//! from, with an a-priori allowance for its rounding ([`Coefficients`],
//! `privacy-core.md` §4, *Coefficients from K*). Both are
//! faster than the thin SVD of X (LAPACK `gesdd`), which serves only when
//! they decline. Milliseconds at d = 1000; callers run it off the async
//! executor.

use super::noise::{Floor, Noise, NoiseDraw, Orthonormal};
use super::posterior::Posterior;
use super::{Nats, PrivacyError};
use ndarray::linalg::general_mat_mul;
use ndarray::{Array1, Array2, ArrayView1, ArrayView2, Axis, Slice};
use ndarray_linalg::{JobSvd, SVDDC};
use pacpriv_lapack::Side;

/// Noise for one vector-mode query under one posterior.
#[derive(Clone, Debug)]
pub struct VectorCalibration<'a> {
    /// The caller's outputs, borrowed: at d = 10 000 a copy is 10 MiB.
    outputs: ArrayView2<'a, f64>,
    /// Teacher outputs in the basis, (V − 1μᵀ)·U, m × r.
    coef: Array2<f64>,
    /// Teacher outputs outside the basis, (V − 1μᵀ)(I − UUᵀ), m × d (empty when r = d).
    residual: Array2<f64>,
    noise: Noise,
    source: Basis,
    /// The SVD kept all min(m, d) of its directions ([`Path::Svd`]).
    all_singular: bool,
    /// With [`Coefficients::FromK`] (else `None`): what bounds their error
    /// (see [`VectorCalibration::coefficient_error`]). What the journal
    /// records with the path.
    error: Option<CoefficientError>,
    /// With K's coefficients, whether the basis's orthonormality was
    /// checked from G too ([`Path::GramKeepingCheckedFromK`]).
    checked_from_g: bool,
}

/// How far coefficients formed from K may be from the exact coefficients
/// of the basis: teacher i's on direction j by at most
/// `per_direction[j]`·`lengths[i]` + `absolute[j]` (γ_K·N_j·S_j·‖c_i‖ and
/// what underflow adds, `privacy-core.md` §4), and so a difference of two
/// teachers' by at most `per_direction[j]`·(‖c_s‖ + ‖c_i‖) + 2·`absolute[j]`.
/// What a verifier allows Eq. 4's ℓ at a server that read them.
#[derive(Clone, Debug)]
pub struct CoefficientError {
    /// γ_K·N_j·S_j, per direction of the basis.
    pub per_direction: Vec<f64>,
    /// What underflow may add, per direction.
    pub absolute: Vec<f64>,
    /// ‖c_i‖, each teacher's centred output's norm.
    pub lengths: Vec<f64>,
}

/// Calibrates vector-mode noise for the m × d teacher outputs under
/// `posterior` with per-query budget `b`.
///
/// # Errors
/// [`PrivacyError::NonFinite`] for NaN/∞ outputs, [`PrivacyError::TeacherCount`]
/// for a wrong number of rows, [`PrivacyError::Linalg`] if the SVD fails, and
/// whatever [`Noise::certified`] refuses.
pub fn calibrate<'a>(
    posterior: &Posterior,
    outputs: ArrayView2<'a, f64>,
    b: Nats,
) -> Result<VectorCalibration<'a>, PrivacyError> {
    calibrate_on(posterior, outputs, b, Path::Auto, Floor::default())
}

/// Which decomposition [`calibrate_on`] may use for the basis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// What the server does: the Gram matrix when it serves ([`gram_basis`]'s
    /// conditions), the SVD otherwise, keeping its directions of singular
    /// value at least [`SVD_KEEP`] of the largest.
    Auto,
    /// The SVD of X, keeping all min(m, d) of its directions: what a server
    /// before issue 70 took (journaled with no rank), and
    /// what a verifier follows for a step that journals no path.
    Svd,
    /// The SVD of X keeping exactly this many directions: what a server
    /// since issue 70 journals when the SVD served. Accepted only within
    /// [`KEEP_BAND`] of [`SVD_KEEP`], as [`Path::GramKeeping`] is of
    /// [`GRAM_KEEP`].
    SvdKeeping(usize),
    /// A Gram matrix whenever it gives a checked basis and
    /// leaves out at most [`GRAM_LEFT_OUT_MARGIN`] times what
    /// [`Path::Auto`] allows — what a verifier needs to follow a server
    /// whose kernels chose it near that threshold, and no further, so that
    /// a step cannot be matched to a Σ no server would have drawn from.
    /// Either path's Σ is certified.
    Gram,
    /// The Gram path keeping exactly this many directions: what a server
    /// journaled it took (`replay`), so that a verifier recomputes the
    /// server's Σ even where its own kernels round an eigenvalue to the
    /// other side of [`GRAM_KEEP`]. Accepted only within [`KEEP_BAND`] of
    /// that threshold and [`GRAM_LEFT_OUT_MARGIN`] of the left-out share.
    /// The coefficients are formed in output space (every d ≤ m, and every
    /// step journaled before issue 70).
    GramKeeping(usize),
    /// As [`Path::GramKeeping`], with K's coefficients ([`Coefficients::FromK`]):
    /// what a server since issue 70 takes at d > m (where, under
    /// [`RULES`] 2, the check from G does not serve).
    GramKeepingFromK(usize),
    /// As [`Path::GramKeepingFromK`], with the orthonormality checked from
    /// G as well ([`CHECK_FROM_G`]): what a server under [`RULES`] 2 takes
    /// at d > m wherever that check's rounding allows it and it passes.
    GramKeepingCheckedFromK(usize),
    /// What a journal that records no path (before issue 66) was
    /// calibrated on: [`Path::Auto`]'s choice, with the coefficients
    /// formed in output space and the SVD keeping all its directions, as
    /// every server then did.
    Unrecorded,
}

/// The rules a server of this release follows for which path it journals,
/// recorded with each step (`calibration`) so that a verifier holds the
/// step to them ([`Path::refused_under`]): one Σ for given outputs and
/// posterior, never two to choose from after the draw.
///
/// - 0 (not recorded): every step journaled before issue 70's SVD rank. At
///   d > m a Gram basis may journal path 2 or 3, and the SVD journals no
///   rank (all its directions).
/// - 1: at d > m a Gram basis journals path 3 (the coefficients from K),
///   and the SVD journals the directions it kept.
/// - 2: as 1, and at d > m a Gram basis journals path 4 (its
///   orthonormality checked from G as well) where G's rounding allows
///   ([`CHECK_FROM_G`]) and that check passes; path 3 otherwise.
pub const RULES: u32 = 2;

/// How the teachers' coefficients in the basis, (V − 1μᵀ)U, are formed
/// (`docs/assurance/privacy-core.md` §4, *Coefficients from K*).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coefficients {
    /// In output space: one m × d × r product, rounding within
    /// γ‖X‖_F of the exact forms.
    Outputs,
    /// From the m × m matrix G = (V − 1μᵀ)(V − 1μᵀ)ᵀ that K is formed
    /// from (d > m): one m × m × r product, with an a-priori allowance
    /// for G's rounding on each direction's bound.
    FromK,
}

impl Path {
    /// The path as a journal records it: (basis, rank), basis 1 for the
    /// SVD keeping `rank` directions (0: all min(m, d) of them), 2 for a
    /// Gram matrix keeping `rank` directions with the coefficients in
    /// output space, 3 with them from K, 4 with the orthonormality check
    /// from K's G too, (0, 0) for the
    /// paths that choose ([`Path::Auto`], [`Path::Gram`],
    /// [`Path::Unrecorded`]), which the mechanism never reports as taken.
    pub fn code(self) -> (u32, u32) {
        match self {
            Path::Svd => (1, 0),
            Path::SvdKeeping(r) => (1, u32::try_from(r).unwrap_or(u32::MAX)),
            Path::GramKeeping(r) => (2, u32::try_from(r).unwrap_or(u32::MAX)),
            Path::GramKeepingFromK(r) => (3, u32::try_from(r).unwrap_or(u32::MAX)),
            Path::GramKeepingCheckedFromK(r) => (4, u32::try_from(r).unwrap_or(u32::MAX)),
            Path::Auto | Path::Gram | Path::Unrecorded => (0, 0),
        }
    }

    /// The path a journaled (basis, rank) names (`None`: not recorded, or
    /// a code this release does not know).
    pub fn from_code(basis: u32, rank: u32) -> Option<Path> {
        match basis {
            1 if rank == 0 => Some(Path::Svd),
            1 => Some(Path::SvdKeeping(rank as usize)),
            2 => Some(Path::GramKeeping(rank as usize)),
            3 => Some(Path::GramKeepingFromK(rank as usize)),
            4 => Some(Path::GramKeepingCheckedFromK(rank as usize)),
            _ => None,
        }
    }

    /// Why a server following calibration `rules` ([`RULES`], which the
    /// caller has checked it knows) would not journal this path for
    /// outputs of `m` teachers and `d` coordinates (`None`: it might).
    pub fn refused_under(self, rules: u32, m: usize, d: usize) -> Option<String> {
        match self {
            Path::GramKeepingCheckedFromK(_) if rules < 2 || d <= m => Some(
                "vector basis path 4 where a server following the calibration rules the step records does not \
                 journal it (rules before 2, or d ≤ m)"
                    .into(),
            ),
            _ if rules == 0 => None,
            Path::GramKeeping(_) if d > m => Some(
                "vector basis path 2 at d > m, where a server following the calibration rules the step records \
                 journals path 3 (the coefficients from K)"
                    .into(),
            ),
            Path::Svd => Some(
                "vector basis path 1 with no rank (the SVD keeping all its directions), where a server following the \
                 calibration rules the step records journals the directions it kept"
                    .into(),
            ),
            _ => None,
        }
    }

    /// How a basis from K is checked on this path (only K's coefficients
    /// give what the check from G needs).
    fn check(self) -> Check {
        match self {
            Path::Auto => Check::Either(Limits::SERVER),
            Path::GramKeepingCheckedFromK(_) => Check::FromG(Limits::FOLLOWING),
            _ => Check::Basis,
        }
    }

    /// How the coefficients are formed on this path where K gives the
    /// basis (d > m; below, always in output space).
    fn coefficients(self) -> Coefficients {
        match self {
            Path::Auto | Path::GramKeepingFromK(_) | Path::GramKeepingCheckedFromK(_) => Coefficients::FromK,
            Path::Svd | Path::SvdKeeping(_) | Path::Gram | Path::GramKeeping(_) | Path::Unrecorded => {
                Coefficients::Outputs
            }
        }
    }
}

/// Whether every server following calibration `rules` would have taken a
/// Gram matrix for these outputs under `posterior`: the Gram path serves
/// even with a tenth of the left-out share [`Path::Auto`] allows
/// ([`GRAM_LEFT_OUT_MARGIN`]), far beyond what kernels' rounding moves,
/// and its basis passes the check in output space or, under rules 2, the
/// check from G inside [`Limits::ALWAYS`]. A journal that says the SVD
/// served such a step chose Σ another way than the mechanism does —
/// possibly after seeing the draw — and `replay` refuses it.
///
/// # Errors
/// As [`calibrate`] for outputs that do not fit.
pub fn gram_always_serves(
    posterior: &Posterior,
    outputs: ArrayView2<'_, f64>,
    rules: u32,
) -> Result<bool, PrivacyError> {
    fits(posterior, outputs)?;
    let Centred { centred, sqrt_w, deviations, .. } = Centred::new(posterior, outputs);
    let share = GRAM_LEFT_OUT / GRAM_LEFT_OUT_MARGIN;
    let (coefficients, check) = if rules >= 2 {
        (Coefficients::FromK, Check::Either(Limits::ALWAYS))
    } else {
        (Coefficients::Outputs, Check::Basis)
    };
    Ok(gram_basis(&centred, &sqrt_w, share, None, coefficients, check, &deviations).is_some())
}

/// Whether every server following calibration rules 2 that took K's
/// basis of `kept` directions for these outputs under `posterior` would
/// have checked it from G ([`Limits::ALWAYS`]): a journal that says such a
/// server checked it in output space (path 3) chose Σ another way than the
/// mechanism does, and `replay` refuses it.
///
/// # Errors
/// As [`calibrate`] for outputs that do not fit.
pub fn checks_from_g_always(
    posterior: &Posterior,
    outputs: ArrayView2<'_, f64>,
    kept: usize,
) -> Result<bool, PrivacyError> {
    fits(posterior, outputs)?;
    let Centred { centred, sqrt_w, deviations, .. } = Centred::new(posterior, outputs);
    let share = GRAM_LEFT_OUT * GRAM_LEFT_OUT_MARGIN;
    let check = Check::FromG(Limits::ALWAYS);
    let gram = gram_basis(&centred, &sqrt_w, share, Some(kept), Coefficients::FromK, check, &deviations);
    Ok(gram.is_some_and(|g| g.checked_from_g))
}

/// The outputs centred on their weighted mean μ = wᵀV, and what every
/// basis is formed from with them.
struct Centred {
    /// V − 1μᵀ, m × d.
    centred: Array2<f64>,
    /// The posterior's weights w.
    w: Array1<f64>,
    sqrt_w: Array1<f64>,
    /// ‖c_i‖² of each teacher's centred output.
    deviations: Vec<f64>,
}

impl Centred {
    /// For outputs that [`fits`] `posterior`.
    fn new(posterior: &Posterior, outputs: ArrayView2<'_, f64>) -> Centred {
        let w = posterior.weights();
        let mu = w.dot(&outputs);
        let centred = &outputs - &mu.view().insert_axis(Axis(0));
        let deviations = centred.rows().into_iter().map(|row| row.dot(&row)).collect();
        let sqrt_w = w.mapv(f64::sqrt);
        Centred { centred, w, sqrt_w, deviations }
    }
}

/// Whether `outputs` are one finite row per teacher of `posterior`.
///
/// # Errors
/// [`PrivacyError::TeacherCount`], or [`check_outputs`]'s.
fn fits(posterior: &Posterior, outputs: ArrayView2<'_, f64>) -> Result<(), PrivacyError> {
    let m = outputs.nrows();
    if m != posterior.len() {
        return Err(PrivacyError::TeacherCount { posterior: posterior.len(), teachers: m });
    }
    check_outputs(outputs)
}

/// [`calibrate`] on the basis `path` asks for, its basis directions'
/// variances floored as `floor` says: what `replay` uses to follow a
/// server whose kernels chose the other path than the verifier's, and a
/// step from before committed noise ([`Floor::RoundOff`]).
///
/// # Errors
/// As [`calibrate`]; [`PrivacyError::Linalg`] if `path` is [`Path::Gram`]
/// and the Gram matrix gives no checked basis (LAPACK or the checks
/// refuse it).
pub fn calibrate_on<'a>(
    posterior: &Posterior,
    outputs: ArrayView2<'a, f64>,
    b: Nats,
    path: Path,
    floor: Floor,
) -> Result<VectorCalibration<'a>, PrivacyError> {
    let (m, d) = outputs.dim();
    fits(posterior, outputs)?;
    let first = outputs.row(0);
    if outputs.rows().into_iter().all(|r| r == first) {
        return Ok(VectorCalibration {
            coef: Array2::zeros((m, 0)),
            residual: Array2::zeros((0, 0)),
            outputs,
            noise: Noise::none(d),
            source: Basis::Unanimous,
            all_singular: false,
            error: None,
            checked_from_g: false,
        });
    }

    let Centred { centred, w, sqrt_w, deviations } = Centred::new(posterior, outputs);
    let underflowed = w.iter().filter(|&&x| x == 0.0).count();
    let (coefficients, check) = (path.coefficients(), path.check());
    // Before issue 70 every server's SVD kept all min(m, d) directions.
    let svd_keep = match path {
        Path::Auto => SvdKeep::Strong,
        Path::SvdKeeping(r) => SvdKeep::Exactly(r),
        _ => SvdKeep::All,
    };
    let gram = match path {
        Path::Auto | Path::Unrecorded => {
            gram_basis(&centred, &sqrt_w, GRAM_LEFT_OUT, None, coefficients, check, &deviations)
        }
        Path::Gram | Path::GramKeeping(_) | Path::GramKeepingFromK(_) | Path::GramKeepingCheckedFromK(_) => {
            let kept = match path {
                Path::GramKeeping(r) | Path::GramKeepingFromK(r) | Path::GramKeepingCheckedFromK(r) => Some(r),
                _ => None,
            };
            let share = GRAM_LEFT_OUT * GRAM_LEFT_OUT_MARGIN;
            let basis = gram_basis(&centred, &sqrt_w, share, kept, coefficients, check, &deviations);
            Some(basis.ok_or_else(|| PrivacyError::Linalg("the Gram matrix gives no checked basis here".into()))?)
        }
        Path::Svd | Path::SvdKeeping(_) => None,
    };
    let (basis, from_k, checked_from_g, source) = match gram {
        Some(GramBasis { basis, from_k, checked_from_g }) => (basis, from_k, checked_from_g, Basis::Gram),
        None => {
            let x = &centred * &sqrt_w.view().insert_axis(Axis(1));
            (svd_basis(&x, svd_keep)?, None, false, Basis::Svd)
        }
    };
    let r = basis.matrix().ncols();
    let all_singular = source == Basis::Svd && svd_keep == SvdKeep::All;

    // Upper bounds of the exact quadratic forms (see module doc): computed
    // norms plus a rounding allowance γ‖X‖_F, plus what underflowed weights
    // (each < 2⁻¹⁰²²) could hide.
    let gamma = 4.0 * (d + r + 4) as f64 * f64::EPSILON;
    let x_norm = deviations.iter().zip(&w).map(|(dev, w)| w * dev).sum::<f64>().sqrt();
    let max_dev = deviations.iter().copied().fold(0.0, f64::max);
    let hidden = underflowed as f64 * f64::MIN_POSITIVE * max_dev;
    // `allowance`: what else may separate the computed weighted norm from
    // the exact one (K's coefficients, below).
    let inflate = |norm_sq: f64, allowance: f64| {
        ((norm_sq.sqrt() + gamma * x_norm + allowance).powi(2) + hidden) * (1.0 + super::label::WEIGHT_ROUNDING)
    };

    // Coefficients from K carry G's rounding: on direction j the weighted
    // norm of their error is at most γ_K·‖X‖_F·N_j·Σ_k‖c_k‖·|a_kj|
    // (privacy-core.md §4, *Coefficients from K*); in output space, none
    // beyond γ.
    let (coef, allowance, error) = match from_k {
        Some(FromK { coef, spread, underflow }) => {
            let gamma_k = 4.0 * (d + 2 * m + 4) as f64 * f64::EPSILON;
            // Σ_i w_i ≤ 1 (to rounding far inside the margin): the
            // absolute part adds at most itself to the weighted norm.
            let allowance = spread.iter().zip(&underflow).map(|(s, u)| gamma_k * x_norm * s + 2.0 * u).collect();
            let per_direction = spread.iter().map(|s| gamma_k * s).collect();
            let lengths = deviations.iter().map(|dev| dev.sqrt()).collect();
            (coef, allowance, Some(CoefficientError { per_direction, absolute: underflow, lengths }))
        }
        None => (centred.dot(basis.matrix()), vec![0.0; r], None),
    };
    let q: Vec<f64> = coef
        .columns()
        .into_iter()
        .zip(&allowance)
        .map(|(col, &a)| inflate(col.iter().zip(&w).map(|(c, w)| w * c * c).sum(), a))
        .collect();
    let (residual, residual_bound) = if r < d {
        let mut res = centred;
        general_mat_mul(-1.0, &coef, &basis.matrix().t(), 1.0, &mut res);
        let norm_sq: f64 = res.rows().into_iter().zip(&w).map(|(row, w)| w * row.dot(&row)).sum();
        // The coefficients' error E moves the residual by E·Uᵀ, whose
        // weighted norm is at most ‖E‖_F·‖U‖₂ ≤ ‖E‖_F·(1 + η).
        let moved = allowance.iter().map(|a| a * a).sum::<f64>().sqrt() * (1.0 + basis.eta());
        // Never 0: a teacher whose weight is ~1e-300 makes every term of
        // the bound underflow to 0, which would leave the complement
        // without noise while its outputs may still differ there by
        // round-off. The smallest positive bound floors the complement's
        // variance instead (more noise, a negligible MI term).
        (res, inflate(norm_sq, moved).max(f64::MIN_POSITIVE))
    } else {
        (Array2::zeros((0, 0)), 0.0)
    };

    let noise = Noise::certified_with_floor(
        d,
        (0..d).collect(),
        basis,
        &q,
        residual_bound,
        b,
        complement_floor(&residual),
        floor,
    )?;
    Ok(VectorCalibration { outputs, coef, residual, noise, source, all_singular, error, checked_from_g })
}

/// How far the 2⁻³² grid may move any two teachers' ℓ through the
/// complement of the basis: 10⁻⁴ nats, a tenth of what replay accepts as
/// checked ([`LOG_LIKELIHOOD_TOLERANCE`](super::replay::LOG_LIKELIHOOD_TOLERANCE)).
pub const COMPLEMENT_PIN: f64 = 1e-4;

/// The complement's least variance f (issue 52 §3). Its certificate-only
/// value is proportional to the squared residuals, which are round-off or
/// signal the basis left out, and can be far below anything the 2⁻³² grid
/// resolves (10⁻²⁰ is common); Eq. 4 then divides round-off by round-off
/// there, and no verifier can check the posterior update. So f is raised
/// to at least
/// - what the grid resolves along every direction of the block,
///   (2⁻³³·√n / 10⁻³)² (the noise audit's
///   [`GRID_SHARE`](super::noise_audit::GRID_SHARE)): ~10⁻¹⁰ at n = 10 000,
///   a standard deviation of 10⁻⁵ per coordinate; and
/// - what keeps the grid's effect on any two teachers' ℓ through the
///   complement, 2⁻³³·‖res_i − res_k‖₁ / f, below [`COMPLEMENT_PIN`].
///
/// More noise than the certificate needs, never less.
fn complement_floor(residual: &Array2<f64>) -> f64 {
    let resolvable = super::grid::resolved_variance(residual.ncols(), super::noise_audit::GRID_SHARE);
    let widest = residual.rows().into_iter().map(|row| lane_sum(row, |x| x.abs())).fold(0.0, f64::max);
    let half_grid = 0.5 * super::grid::PUBLISHED_GRID;
    resolvable.max(half_grid * 2.0 * widest / COMPLEMENT_PIN)
}

/// How many partial sums a reduction over an output row keeps. One sum,
/// added to term by term, waits on the addition before it (~4 cycles a
/// term, a tenth of a millisecond over m × d = 128 000 values); eight
/// interleaved ones vectorise. The same terms in another order: the result
/// differs by rounding (~d·2⁻⁵³ relative), as two machines' BLAS kernels'
/// do, which `pacpriv verify` allows for.
const LANES: usize = 8;

/// Σ_k term(x_k) over a row, in [`LANES`] interleaved partial sums.
fn lane_sum(row: ArrayView1<'_, f64>, term: impl Fn(f64) -> f64) -> f64 {
    let Some(x) = row.as_slice() else { return row.iter().map(|&x| term(x)).sum() };
    let chunks = x.chunks_exact(LANES);
    let tail: f64 = chunks.remainder().iter().map(|&x| term(x)).sum();
    let mut lanes = [0.0; LANES];
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane += term(x);
        }
    }
    lanes.iter().sum::<f64>() + tail
}

/// Σ_k term(a_k, b_k, c_k) over three rows of one length, as [`lane_sum`].
fn lane_sum3(rows: [ArrayView1<'_, f64>; 3], term: impl Fn(f64, f64, f64) -> f64) -> f64 {
    let [a, b, c] = &rows;
    let (Some(a), Some(b), Some(c)) = (a.as_slice(), b.as_slice(), c.as_slice()) else {
        return a.iter().zip(b).zip(c).map(|((&a, &b), &c)| term(a, b, c)).sum();
    };
    let n = a.len().min(b.len()).min(c.len());
    let whole = n - n % LANES;
    let tail: f64 = (whole..n).map(|k| term(a[k], b[k], c[k])).sum();
    let mut lanes = [0.0; LANES];
    for ((a, b), c) in
        a[..whole].chunks_exact(LANES).zip(b[..whole].chunks_exact(LANES)).zip(c[..whole].chunks_exact(LANES))
    {
        for (k, lane) in lanes.iter_mut().enumerate() {
            *lane += term(a[k], b[k], c[k]);
        }
    }
    lanes.iter().sum::<f64>() + tail
}

/// Which decomposition found the noise basis (the certificate does not
/// depend on it; benchmarks and tests report it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Basis {
    /// No noise: every teacher gave the same vector.
    Unanimous,
    /// Right singular vectors of X (LAPACK `gesdd` on m × d): those of
    /// singular value at least [`SVD_KEEP`] of the largest, or on
    /// [`Path::Svd`] all min(m, d) of them.
    Svd,
    /// Strong eigenvectors of C = XᵀX (d ≤ m), or of K = XXᵀ mapped to
    /// ℝ^d (`gram_basis`).
    Gram,
}

/// Singular directions the SVD path keeps: singular values at least this
/// share of the largest (issue 70). LAPACK computes a right singular
/// vector to within ~p(m, d)·2⁻⁵³·σ₁/gap of its exact direction, so those
/// of X's null space — centring leaves at least d − m + 1 of them at
/// d ≥ m, a posterior that rules teachers out more — come back at σ of
/// round-off size as whatever rotation of that space rounding chose, and
/// another machine's kernels choose another: the key audit, recomputing the
/// draw along them, then finds the release off the key's draw (an honest
/// export failed it on other kernels). Kept directions are at least
/// 10⁻⁶·σ₁ from that cluster, so kernels turn them by ~10⁻¹⁰ at the demo's
/// sizes and ~10⁻⁷ at m·d = 4·10⁶. What the left-out directions carry
/// (each at most 10⁻¹² of the largest eigenvalue) is covered by the
/// complement's isotropic noise, far below the complement's floors.
pub const SVD_KEEP: f64 = 1e-6;

/// Which of the SVD's directions [`svd_basis`] keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SvdKeep {
    /// All min(m, d) ([`Path::Svd`]).
    All,
    /// Those of singular value at least [`SVD_KEEP`] of the largest.
    Strong,
    /// The first r, if each is within [`KEEP_BAND`] above that threshold
    /// and each left out within it below ([`Path::SvdKeeping`]).
    Exactly(usize),
}

/// Right singular vectors of X: those `keep` asks for, strongest first.
///
/// # Errors
/// [`PrivacyError::Linalg`] when LAPACK fails, or when a journaled rank
/// ([`SvdKeep::Exactly`]) is not the one the threshold gives here.
fn svd_basis(x: &Array2<f64>, keep: SvdKeep) -> Result<Orthonormal, PrivacyError> {
    let (_, sigma, vt) = x.svddc(JobSvd::Some)?;
    let vt = vt.ok_or_else(|| PrivacyError::Linalg("SVD returned no right singular vectors".into()))?;
    // Descending, as LAPACK returns them.
    let threshold = SVD_KEEP * sigma.first().copied().unwrap_or(0.0);
    // A threshold that is not a normal number (σ₁ = 0: a posterior that
    // has put all its weight on one teacher makes X = 0 while the outputs
    // still differ) would let every count pass the band: every direction
    // is kept, and a journaled rank must say so.
    let resolvable = (threshold * (1.0 - KEEP_BAND)).is_normal();
    let kept = match keep {
        SvdKeep::All => sigma.len(),
        SvdKeep::Strong if !resolvable => sigma.len(),
        SvdKeep::Strong => sigma.iter().take_while(|&&s| s >= threshold).count(),
        SvdKeep::Exactly(r) => {
            let within = if resolvable {
                (1..=sigma.len()).contains(&r)
                    && within_keep_band(sigma.iter().take(r), sigma.iter().skip(r), threshold)
            } else {
                r == sigma.len()
            };
            if !within {
                return Err(PrivacyError::Linalg(format!(
                    "the SVD does not keep {r} directions here: its singular values do not cross {SVD_KEEP:e} of \
                     the largest there"
                )));
            }
            r
        }
    };
    Orthonormal::check(vt.slice_axis_move(Axis(0), Slice::from(..kept)).reversed_axes())
}

/// Directions kept from a Gram matrix's spectrum: eigenvalues at least
/// this share of the largest. Below it the eigenvectors of K (whose
/// rounding is ~d·2⁻⁵³·‖X‖²) map to directions too far from orthonormal,
/// and those of C are decided by its rounding.
const GRAM_KEEP: f64 = 1e-6;

/// How far (relative) an eigenvalue kept or left out by a journaled rank
/// ([`Path::GramKeeping`]) may sit on the other side of [`GRAM_KEEP`]:
/// kernels move an eigenvalue near the threshold by ~m·2⁻⁵³ of the
/// largest, 10⁻⁸ of the threshold; this allows a hundred thousand times that.
pub const KEEP_BAND: f64 = 1e-3;

/// How far past [`GRAM_LEFT_OUT`] a verifier follows the Gram path
/// ([`Path::Gram`]): kernels move the left-out signal's share by round-off,
/// far less than this factor.
pub const GRAM_LEFT_OUT_MARGIN: f64 = 10.0;

/// How much of the signal the Gram basis may leave outside itself: the
/// isotropic noise that covers it on all d coordinates must stay below
/// this share of the noise along the basis (see [`first_strong`]).
const GRAM_LEFT_OUT: f64 = 1e-6;

/// A basis from a Gram matrix, and when K gave it and the path asks for
/// them ([`Coefficients::FromK`]), the coefficients formed from G.
struct GramBasis {
    basis: Orthonormal,
    from_k: Option<FromK>,
    /// Its orthonormality was checked from G ([`from_g`]).
    checked_from_g: bool,
}

/// How a basis from K has its orthonormality checked.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Check {
    /// UᵀU of the d × r basis ([`Orthonormal::check`]).
    Basis,
    /// From G ([`from_g`]) within these limits, or not at all.
    FromG(Limits),
    /// From G within these limits where it passes, else as
    /// [`Check::Basis`]: what a server does.
    Either(Limits),
}

/// The coefficients (V − 1μᵀ)U formed as G·A·diag(N), where U =
/// (V − 1μᵀ)ᵀ·A·diag(N), A = diag(√w)·W_J (m × r) and N_j = 1/‖(V − 1μᵀ)ᵀa_j‖
/// as computed; and for each direction N_j·Σ_k ‖c_k‖·|a_kj| (c_k teacher
/// k's centred output), what their rounding allowance scales with.
struct FromK {
    coef: Array2<f64>,
    spread: Vec<f64>,
    /// Per direction, what underflow may add to any one coefficient's
    /// error beyond the relative bound (products below 2⁻¹⁰²² round to
    /// within 2⁻¹⁰⁷⁵ absolutely, outside γ_n's model).
    underflow: Vec<f64>,
}

/// The basis from the smaller of X's two Gram matrices (issue 44 §3,
/// issue 56 §1): C = XᵀX when d ≤ m ([`columns_basis`]), K = XXᵀ otherwise
/// ([`rows_basis`]). Either is one BLAS `dsyrk` and one LAPACK `dsyevd` on a
/// matrix of at most m × m, where the thin SVD of X costs more at every d
/// measured (`BENCHMARKS.md`, "Vector mode"). Both square X's condition
/// number, so both keep only the directions whose eigenvalue is at least
/// [`GRAM_KEEP`] of the largest ([`first_strong`]); what they leave out
/// is covered by the complement's isotropic noise.
///
/// `None` (use the SVD) when the chosen side declines. Whichever basis is
/// returned goes through the same orthonormality check and certificate, so
/// the choice can cost time, never privacy.
fn gram_basis(
    centred: &Array2<f64>,
    sqrt_w: &Array1<f64>,
    left_out_share: f64,
    kept: Option<usize>,
    coefficients: Coefficients,
    check: Check,
    deviations: &[f64],
) -> Option<GramBasis> {
    let (m, d) = centred.dim();
    if d <= m {
        let basis = columns_basis(centred, sqrt_w, left_out_share, kept)?;
        Some(GramBasis { basis, from_k: None, checked_from_g: false })
    } else {
        rows_basis(centred, sqrt_w, left_out_share, kept, coefficients, check, deviations)
    }
}

/// d ≤ m: U = the eigenvectors of the d × d C = XᵀX for its strong
/// eigenvalues. They are X's right singular vectors, orthonormal to
/// round-off as LAPACK returns them.
///
/// Why not all d of them: C's rounding (~m·2⁻⁵³·‖X‖²) decides the
/// eigenvectors of its weakest eigenvalues, and with them those
/// directions' variances, so another machine's kernels would compute
/// another Σ there and Eq. 4's update could not be checked (`pacpriv
/// verify`). The complement's isotropic noise covers them instead, as in
/// [`rows_basis`].
///
/// `None` when C's entries overflow, when LAPACK fails, when the spectrum
/// declines ([`first_strong`]), or when the eigenvectors fail the
/// orthonormality check.
fn columns_basis(
    centred: &Array2<f64>,
    sqrt_w: &Array1<f64>,
    left_out_share: f64,
    kept: Option<usize>,
) -> Option<Orthonormal> {
    let d = centred.ncols();
    let x = centred * &sqrt_w.view().insert_axis(Axis(1));
    let c = pacpriv_lapack::gram(x.view(), Side::Columns).ok()?;
    let eigen = pacpriv_lapack::eigh(c.view()).ok()?;
    let first_kept = first_strong(&eigen.values, d, left_out_share, kept)?;
    Orthonormal::check(eigen.vectors.slice_axis_move(Axis(1), Slice::from(first_kept..))).ok()
}

/// d > m: with K = XXᵀ = WΛWᵀ (m × m), u_j = Xᵀw_j/‖Xᵀw_j‖ is X's right
/// singular vector for λ_j: one m × d × m product and an m × m
/// eigendecomposition cost a fraction of the thin SVD of X. With
/// [`Coefficients::FromK`], the coefficients too come from the m × m G
/// that K is scaled from, instead of an m × d × r product.
///
/// `None` (use the SVD) when LAPACK fails on K, when the spectrum declines
/// ([`first_strong`]), when a mapped column's squared norm is not a
/// normal number, or when the mapped directions fail the orthonormality
/// check.
fn rows_basis(
    centred: &Array2<f64>,
    sqrt_w: &Array1<f64>,
    left_out_share: f64,
    kept: Option<usize>,
    coefficients: Coefficients,
    check: Check,
    deviations: &[f64],
) -> Option<GramBasis> {
    let (m, d) = centred.dim();
    if coefficients == Coefficients::FromK && deviations.len() != m {
        // No norms to bound the coefficients with: decline rather than
        // certify with no allowance.
        return None;
    }
    // X = diag(√w)·centred is never formed: K = diag(√w)·G·diag(√w) with
    // G = centred·centredᵀ, and Xᵀw_j = centredᵀ(√w ∘ w_j), one m-wide
    // scaling each.
    let g = pacpriv_lapack::gram(centred.view(), Side::Rows).ok()?;
    let mut k = g.clone();
    for ((i, j), kij) in k.indexed_iter_mut() {
        *kij *= sqrt_w[i] * sqrt_w[j];
    }
    // A LAPACK failure here only costs the SVD.
    let eigen = pacpriv_lapack::eigh(k.view()).ok()?;
    let first_kept = first_strong(&eigen.values, d, left_out_share, kept)?;
    let kept = eigen.values.len() - first_kept;
    let mut a = eigen.vectors.slice_axis_move(Axis(1), Slice::from(first_kept..));
    a *= &sqrt_w.view().insert_axis(Axis(1));
    // Row-major (a product of a transposed view would be column-major):
    // the check and everything after read it by rows.
    let mut basis = Array2::zeros((d, kept));
    general_mat_mul(1.0, &centred.t(), &a, 0.0, &mut basis);
    // Column norms in one pass over the rows (the basis is d × r, row-major).
    let mut norms = Array1::<f64>::zeros(kept);
    for row in basis.rows() {
        norms.zip_mut_with(&row, |n, x| *n += x * x);
    }
    if !norms.iter().all(|n| n.is_normal()) {
        return None;
    }
    let inverse = norms.mapv(|n| 1.0 / n.sqrt());
    basis *= &inverse.view().insert_axis(Axis(0));
    if coefficients == Coefficients::Outputs {
        let basis = Orthonormal::check(basis).ok()?;
        return Some(GramBasis { basis, from_k: None, checked_from_g: false });
    }

    // G·A: the coefficients before their scaling, and the check from G's half.
    let ga = g.dot(&a);
    // ‖c_k‖ once, not once per direction (the same values: √ rounds correctly).
    let lengths: Vec<f64> = deviations.iter().map(|dev| dev.sqrt()).collect();
    // σ_j = N_j·Σ_k |a_kj|·‖c_k‖: what rounding in G scales with on direction j.
    let spread: Vec<f64> = a
        .columns()
        .into_iter()
        .zip(&inverse)
        .map(|(a, n)| n * a.iter().zip(&lengths).map(|(a, length)| a.abs() * length).sum::<f64>())
        .collect();
    let (basis, checked_from_g) = match check {
        Check::Basis => (Orthonormal::check(basis).ok()?, false),
        Check::FromG(limits) => (from_g(basis, &a, &ga, &inverse, &lengths, limits).ok()?, true),
        Check::Either(limits) => match from_g(basis, &a, &ga, &inverse, &lengths, limits) {
            Ok(basis) => (basis, true),
            Err(basis) => (Orthonormal::check(basis).ok()?, false),
        },
    };

    let mut coef = ga;
    coef *= &inverse.view().insert_axis(Axis(0));
    // Underflow: each of G's entries (d products), G·a_j's (m),
    // Cᵀa_j's (m, in d entries: √d·m in norm, times ‖c_i‖) and the two
    // scalings may lose 2⁻¹⁰⁷⁵ more; allowed four times over.
    let widest = lengths.iter().copied().fold(0.0, f64::max);
    let tiny = 4.0 * f64::from_bits(1); // 2⁻¹⁰⁷²
    let underflow = a
        .columns()
        .into_iter()
        .zip(&inverse)
        .map(|(a, n)| {
            let mass: f64 = a.iter().map(|a| a.abs()).sum();
            let m = m as f64;
            tiny * (n * (d as f64 * mass + m + (d as f64).sqrt() * m * widest + 1.0) + 1.0)
        })
        .collect();
    Some(GramBasis { basis, from_k: Some(FromK { coef, spread, underflow }), checked_from_g })
}

/// The most G's rounding bound R may be for the check from G to be taken
/// (η = 2R; `privacy-core.md` §4, *The orthonormality check from G*): the
/// charge then raises Σ's trace by at most (1 + 2rR)²/(1 − 2R), 0.5 % at
/// r = 127, where the check in output space costs a d × r × r product.
/// The jittered scores of `BENCHMARKS.md` have R ≈ 10⁻⁶.
pub const CHECK_FROM_G: f64 = 1e-5;

/// Where [`from_g`] takes the check: the server's own limits, and a band
/// on either side of them, so that a verifier follows every server that
/// took it ([`Limits::FOLLOWING`]) and refuses a journal that says a
/// server did not where every server would have ([`Limits::ALWAYS`]).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Limits {
    /// Most G's rounding bound R may be.
    rounding: f64,
    /// log₂ of the most max_j N_j²·d·m² may be (underflow).
    safe: i32,
    /// Most the computed ‖UᵀU − I‖_F may be, as a share of R.
    deviation: f64,
}

impl Limits {
    /// What a server takes.
    const SERVER: Limits = Limits { rounding: CHECK_FROM_G, safe: 900, deviation: 0.5 };
    /// What a verifier accepts where a journal says a server took it.
    const FOLLOWING: Limits = Limits { rounding: CHECK_FROM_G * (1.0 + KEEP_BAND), safe: 901, deviation: 1.0 };
    /// Where every server takes it, on any kernels.
    const ALWAYS: Limits = Limits { rounding: CHECK_FROM_G * (1.0 - KEEP_BAND), safe: 899, deviation: 0.25 };
}

/// The orthonormality check from G: UᵀU = diag(N)·Aᵀ(G·A)·diag(N), an
/// r × m × r product from the G·A the coefficients need anyway, in place
/// of the d × r × r one. Its rounding is at most γ_G·σ_jσ_l in
/// entry (j, l), and in Frobenius norm at most γ_G·Σσ_j² ≤ R =
/// γ_G·m·Σ_j N_j²·Σ_k a_kj²‖c_k‖², a bound that, unlike Σσ_j², does not
/// change when kernels rotate a repeated eigenvalue's eigenvectors; the
/// computed ‖UᵀU − I‖_F must be at most a share of R, so η is 2R on every
/// machine (`Orthonormal::from_gram`). Taken within `limits` and when no
/// product can have underflowed far enough to matter; the basis back
/// otherwise (`privacy-core.md` §4, *The orthonormality check from G*).
fn from_g(
    basis: Array2<f64>,
    a: &Array2<f64>,
    ga: &Array2<f64>,
    inverse: &Array1<f64>,
    lengths: &[f64],
    limits: Limits,
) -> Result<Orthonormal, Array2<f64>> {
    let (m, d) = (a.nrows(), basis.nrows());
    let gamma = 4.0 * (d + 4 * m + 4) as f64 * f64::EPSILON;
    let weighted: f64 = a
        .columns()
        .into_iter()
        .zip(inverse)
        .map(|(a, n)| n * n * a.iter().zip(lengths).map(|(a, l)| (a * l) * (a * l)).sum::<f64>())
        .sum();
    // Below this every product that could underflow (2⁻¹⁰⁷⁵ each) moves an
    // entry of diag(N)·AᵀGA·diag(N) by less than 2⁻¹⁶⁰, added r² times.
    let widest = inverse.iter().copied().fold(0.0, f64::max);
    let safe = widest * widest * (d * m * m) as f64 <= 2f64.powi(limits.safe);
    let r = a.ncols() as f64;
    // (1 + 10⁻⁶): this sum's own rounding.
    let rounding = gamma * m as f64 * weighted * (1.0 + 1e-6) + r * r * 2f64.powi(-160);
    if !(rounding <= limits.rounding && safe) {
        return Err(basis);
    }
    let mut gram = a.t().dot(ga);
    for ((j, l), x) in gram.indexed_iter_mut() {
        *x *= inverse[j] * inverse[l];
    }
    Orthonormal::from_gram(basis, &gram, rounding, limits.deviation * rounding).map_err(|declined| declined.1)
}

/// The index of the first eigenvalue kept of a Gram matrix's `lambda`
/// (ascending, as LAPACK returns them): those at least [`GRAM_KEEP`] of
/// the largest. `None` (use the SVD) when the largest is too small for that
/// share to be a normal number, or when what the left-out directions carry
/// would get more isotropic noise than `left_out_share` allows
/// ([`GRAM_LEFT_OUT`] on the server's path): Σ_dropped λ/(2·10⁻³·b) per
/// coordinate, d times that in total, against (Σ_kept √λ)²/(2b) along the
/// basis. With `kept`, exactly that many, if each kept eigenvalue is within
/// [`KEEP_BAND`] above the threshold and each left out within it below.
fn first_strong(lambda: &Array1<f64>, d: usize, left_out_share: f64, kept: Option<usize>) -> Option<usize> {
    // Below this, GRAM_KEEP·top underflows and directions of no signal
    // would be kept (the SVD serves such inputs).
    let top = lambda.last().copied().unwrap_or(0.0);
    if top < f64::MIN_POSITIVE / GRAM_KEEP {
        return None;
    }
    let first_kept = match kept {
        None => lambda.len() - lambda.iter().rev().take_while(|&&l| l >= GRAM_KEEP * top).count(),
        Some(r) => {
            let first = lambda.len().checked_sub(r)?;
            let within = within_keep_band(lambda.iter().skip(first), lambda.iter().take(first), GRAM_KEEP * top);
            within.then_some(first)?
        }
    };
    // A negative eigenvalue is rounding: it holds no signal.
    let left_out: f64 = lambda.iter().take(first_kept).map(|l| l.max(0.0)).sum();
    let along: f64 = lambda.iter().skip(first_kept).map(|l| l.sqrt()).sum();
    // Total isotropic noise d·left_out/(2·10⁻³·b) ≤ share · along²/(2b).
    if d as f64 * left_out > left_out_share * super::noise::RESIDUAL_SHARE * along * along {
        return None;
    }
    Some(first_kept)
}

/// Whether a journaled count splits a spectrum as `threshold` does, up to
/// [`KEEP_BAND`]: each value `kept` at least threshold·(1 − band), each
/// `left_out` at most threshold·(1 + band).
fn within_keep_band<'a>(
    kept: impl IntoIterator<Item = &'a f64>,
    left_out: impl IntoIterator<Item = &'a f64>,
    threshold: f64,
) -> bool {
    kept.into_iter().all(|&v| v >= threshold * (1.0 - KEEP_BAND))
        && left_out.into_iter().all(|&v| v <= threshold * (1.0 + KEEP_BAND))
}

/// Teacher vectors must have at least one column and only finite values.
///
/// # Errors
/// [`PrivacyError::Shape`] or [`PrivacyError::NonFinite`].
pub fn check_outputs(outputs: ArrayView2<'_, f64>) -> Result<(), PrivacyError> {
    if outputs.ncols() == 0 {
        return Err(PrivacyError::Shape("teacher outputs have no columns".into()));
    }
    // A fold over every value rather than `any`: it does not stop early,
    // but it vectorises, and outputs are finite but for a bad request.
    if !outputs.iter().fold(true, |finite, x| finite & x.is_finite()) {
        return Err(PrivacyError::NonFinite("teacher outputs"));
    }
    Ok(())
}

impl VectorCalibration<'_> {
    /// True when every teacher gave exactly the same vector.
    pub fn unanimous(&self) -> bool {
        self.noise.is_exact()
    }

    /// Which decomposition found the noise basis.
    pub fn basis_source(&self) -> Basis {
        self.source
    }

    /// The path that recomputes this calibration's basis exactly: what the
    /// journal records (`None` for unanimous outputs, which draw nothing).
    pub fn path_taken(&self) -> Option<Path> {
        match self.source {
            Basis::Unanimous => None,
            Basis::Svd if self.all_singular => Some(Path::Svd),
            Basis::Svd => Some(Path::SvdKeeping(self.noise.rank())),
            Basis::Gram if self.checked_from_g => Some(Path::GramKeepingCheckedFromK(self.noise.rank())),
            Basis::Gram if self.error.is_some() => Some(Path::GramKeepingFromK(self.noise.rank())),
            Basis::Gram => Some(Path::GramKeeping(self.noise.rank())),
        }
    }

    /// With the coefficients from K, how far they (and so Eq. 4's
    /// coefficient differences) may be from exact; `None` in output space,
    /// where the rounding is the projection's own.
    pub fn coefficient_error(&self) -> Option<&CoefficientError> {
        self.error.as_ref()
    }

    /// The certified noise.
    pub fn noise(&self) -> &Noise {
        &self.noise
    }

    /// Eq. 4's log-likelihood of the release under each teacher's output.
    pub fn teacher_log_likelihoods(&self, secret: usize, draw: &NoiseDraw) -> Array1<f64> {
        let m = self.outputs.nrows();
        if self.noise.is_exact() {
            return Array1::zeros(m);
        }
        let secret_residual = (!self.residual.is_empty()).then(|| self.residual.row(secret));
        (0..m)
            .map(|i| {
                let dc = &self.coef.row(secret) - &self.coef.row(i);
                // ‖(res_s − res_i) + z_res‖², δ_res formed term by term, as
                // Noise::log_likelihood forms it (exactly z_res for i = s),
                // and summed in lanes.
                let outside = match secret_residual {
                    Some(rs) => {
                        lane_sum3([rs, self.residual.row(i), draw.residual.view()], |s, x, z| (s - x + z) * (s - x + z))
                    }
                    None => draw.residual.dot(&draw.residual),
                };
                self.noise.log_likelihood_outside(dc.view(), outside, draw)
            })
            .collect()
    }
}

#[cfg(test)]
mod test;
