//! Re-derives one journaled step of Algorithm 1 from its public record —
//! the teachers' outputs, the published release and the session's state
//! before it — without the secret index or the draw: what `pacpriv verify`
//! runs for every entry of an exported journal (argument:
//! `docs/assurance/accounting.md` §9).
//!
//! For each step it checks:
//! - the charge is the policy's for the outputs' agreement, fits the
//!   limit, and a contested query was not answered under `unanimous_only`;
//! - a unanimous answer is the teachers' common output, exactly, and moves
//!   nothing but the ledger;
//! - otherwise Σ recalibrated to the posterior before the step certifies
//!   ½·tr(Σ⁺C) ≤ b; the release is centred where Σ allows (coordinates
//!   Σ does not cover equal the common centre exactly); and the recorded
//!   Eq. 4 log-likelihood vector is that of the published release:
//!   ℓ_i = −½ (r − x_i)ᵀ Σ⁺ (r − x_i) for every teacher i, up to a
//!   constant common to every teacher (every update rule ignores it, and
//!   it is all that differs between the two vector-mode bases or two
//!   machines' kernels) and within what the 2⁻³² grid can move it (the
//!   server evaluates ℓ at the exact r, which never leaves it);
//! - every published value is on the grid and within the clamp, and the
//!   released label is the argmax of the published release;
//! - and it hands the noise audit ([`noise_audit`]) the step's residuals
//!   under every candidate subset.
//!
//! What cannot be checked is not passed silently ([`Unchecked`]): a
//! release coordinate the noise covers that sits *at* the clamp (±2²⁰)
//! stands for every value beyond it, so any recorded ℓ would fit; and a
//! direction whose variance is too small for the grid lets the tolerance
//! on ℓ grow past [`LOG_LIKELIHOOD_TOLERANCE`]. Such a step's other checks
//! still run, it is applied as recorded, and [`Replayed::unchecked`] says
//! so, for the caller to refuse or report (`pacpriv verify` fails on it
//! unless told to list such steps instead).
//!
//! In vector mode the server's kernels (or an earlier release) may have
//! found the basis through the other decomposition than the verifier's; a step that
//! does not match on the verifier's is checked on the other before it is
//! called a mismatch (`privacy-core.md` §9).
//!
//! Then it applies the recorded vector to the posterior exactly as the
//! server did (Eq. 4), so the replayed posterior is the server's bit for
//! bit, and the next step is checked against it.
//!
//! # Invariants
//! - Pure: the same inputs give the same verdict; nothing here sees s*.
//! - On a mismatch the state is left as it was before the step.

use super::grid::{self, PUBLISHED_CLAMP, PUBLISHED_GRID};
use super::key_audit;
use super::keyed::{NoiseKey, Position};
use super::label;
use super::ledger::Policy;
use super::mechanism::{self, SessionState, TeacherOutputs};
use super::noise::{Floor, Noise};
use super::noise_audit;
use super::posterior::UpdateRule;
use super::vector;
use super::{Nats, PrivacyError};
use ndarray::{Array1, ArrayView1};

/// One journaled step, as recorded.
#[derive(Clone, Copy, Debug)]
pub struct Recorded<'a> {
    /// The teachers' outputs (vectors on the release grid).
    pub outputs: &'a TeacherOutputs,
    /// The published release Q(r).
    pub published: &'a [f64],
    /// The released label.
    pub label: usize,
    /// The charge recorded.
    pub charge: f64,
    /// The Eq. 4 vector the server applied (empty: none).
    pub log_likelihood: &'a [f64],
    /// How the server's posterior applied it.
    pub update_rule: UpdateRule,
    /// Vector mode: the basis path the server journaled it took
    /// ([`mechanism::Answer::path`]; `None`: not recorded, and then either
    /// path is tried).
    pub path: Option<vector::Path>,
    /// The calibration rules the server journaled it followed
    /// ([`vector::RULES`]; 0: not recorded), which decide which paths it
    /// would have taken.
    pub rules: u32,
    /// The least variance the server gave Σ's basis directions:
    /// [`Floor::Resolvable`] for a step whose journal commits to a noise
    /// key (every step since committed noise), [`Floor::RoundOff`] for one
    /// from before.
    pub floor: Floor,
}

/// Why a recorded step is not what the mechanism would have done.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Mismatch {
    /// The outputs are malformed or do not fit the session.
    #[error("the teachers' outputs do not fit the session: {0}")]
    Outputs(String),
    /// A contested query was answered under `unanimous_only`.
    #[error("a contested query was answered under policy unanimous_only, which answers unanimous queries only")]
    ContestedAnswered,
    /// The recorded charge is not the policy's.
    #[error("charged {recorded:e} nats, but policy {policy} charges {expected:e} for this step")]
    Charge {
        /// What was recorded.
        recorded: f64,
        /// What the policy charges.
        expected: f64,
        /// The policy.
        policy: Policy,
    },
    /// The charge did not fit the limit.
    #[error("the step was answered past the limit: {0}")]
    OverBudget(String),
    /// A unanimous answer is not the common output, or moved the posterior.
    #[error("a unanimous answer must release the teachers' common output exactly and leave the posterior alone: {0}")]
    NotExact(String),
    /// Σ could not be recalibrated or did not certify.
    #[error("the noise recalibrated to the posterior before this step is not certified: {0}")]
    Uncertified(String),
    /// A published coordinate the noise does not cover differs from the
    /// teachers' common value there.
    #[error("coordinate {coordinate} of the release carries no noise, but is {published} instead of {expected}")]
    OffSupport {
        /// The coordinate.
        coordinate: usize,
        /// Published.
        published: f64,
        /// The common centre.
        expected: f64,
    },
    /// The recorded Eq. 4 vector is not the published release's, up to a
    /// constant common to every teacher.
    #[error(
        "the posterior update does not match the release: teacher {teacher}'s log-likelihood relative to teacher \
         {reference}'s is recorded as {recorded:e}, the published release gives {derived:e} (± {tolerance:e})"
    )]
    LogLikelihood {
        /// Which teacher.
        teacher: usize,
        /// The teacher both are taken relative to (the most likely after
        /// the step).
        reference: usize,
        /// Recorded, relative to the reference.
        recorded: f64,
        /// Derived from the published release, relative to the reference.
        derived: f64,
        /// How far the grid can move it.
        tolerance: f64,
    },
    /// A published value is not a grid value within the clamp (or not a
    /// number): no release the server makes looks like it.
    #[error(
        "published value {value:e} at coordinate {coordinate} is not a multiple of 2^-32 within ±2^20: no release \
         is published so"
    )]
    OffGrid {
        /// The coordinate.
        coordinate: usize,
        /// What was published.
        value: f64,
    },
    /// The released label is not the argmax of the published release.
    #[error("released label {recorded}, but the published release's argmax is {expected}")]
    Label {
        /// Recorded.
        recorded: usize,
        /// argmax(published).
        expected: usize,
    },
}

/// Largest tolerance, in nats, with which a recorded ℓ_i − ℓ_ref counts as
/// checked. A forger free to move every teacher's ℓ within τ moves each
/// weight ratio by at most e^{2τ}, so the next C by at most that factor in
/// the PSD order, and the next step's true MI stays within e^{2τ}·b ≈
/// 1.002·b of its certificate (`privacy-core.md` §9). Beyond it, the grid
/// no longer pins the update: the step is [`Unchecked::Tolerance`].
pub const LOG_LIKELIHOOD_TOLERANCE: f64 = 1e-3;

/// A teacher whose weight after the step is below e^{−1000} of the most
/// likely teacher's, for every release the grid allows, has weight 0 in
/// the next calibrations (e^{−745} underflows; the linear form keeps 0 for
/// ever, and in the log form honest releases close 255 nats of the gap
/// only with probability ≤ e^{−255}), so a wide tolerance on its ℓ does not
/// leave the step unchecked.
pub const NEGLIGIBLE: f64 = 1000.0;

/// Why a step's posterior update was applied without being checked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unchecked {
    /// The noise covers a coordinate published at the clamp (±2²⁰): the
    /// exact release there is unknown.
    Clamp {
        /// The first such coordinate.
        coordinate: usize,
    },
    /// The grid can move a teacher's ℓ by more than
    /// [`LOG_LIKELIHOOD_TOLERANCE`]: a direction's variance is too small
    /// for the 2⁻³² grid to pin the update (a collapsed direction).
    Tolerance {
        /// The first teacher whose tolerance is too wide.
        teacher: usize,
        /// Its tolerance, nats.
        tolerance: f64,
    },
}

impl std::fmt::Display for Unchecked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unchecked::Clamp { coordinate } => write!(
                f,
                "the release is published at the ±2^20 clamp on coordinate {coordinate}, where the noise lies, so \
                 its exact value and the posterior update recorded with it cannot be checked"
            ),
            Unchecked::Tolerance { teacher, tolerance } => write!(
                f,
                "the 2^-32 grid can move teacher {teacher}'s log-likelihood by up to {tolerance:e} nats (more than \
                 {LOG_LIKELIHOOD_TOLERANCE:e}): a noise direction's variance is too small for the published release \
                 to pin the posterior update, so it cannot be checked"
            ),
        }
    }
}

/// What a verified step certified.
#[derive(Clone, Debug, PartialEq)]
pub struct Replayed {
    /// ½·tr(Σ⁺C) of the recalibrated Σ (0 for an exact answer).
    pub mi_bound: f64,
    /// Whether all teachers agreed.
    pub unanimous: bool,
    /// Why the recorded log-likelihoods were applied without being checked,
    /// if they were.
    pub unchecked: Option<Unchecked>,
    /// What the step contributes to the noise audit (`None` for an exact
    /// answer).
    pub evidence: Option<noise_audit::StepEvidence>,
    /// How far, in nats, the recorded ℓ_i − ℓ_ref of a teacher that is not
    /// negligible could be from the true one and still pass: the largest
    /// tolerance checked (0 for an exact answer; at most
    /// [`LOG_LIKELIHOOD_TOLERANCE`] unless the step is unchecked, and ∞ for
    /// a release at the clamp, whose update has no bound). Summed
    /// over a session it bounds how far the replayed posterior can be from
    /// the true one (`privacy-core.md` §9).
    pub slack: f64,
    /// The keyed audit of the release ([`replay_keyed`]; `None` without a
    /// key, and for an exact answer, which drew nothing).
    pub key: Option<key_audit::KeyCheck>,
}

/// Checks `step` against `state` (the session before it) and applies it.
///
/// # Errors
/// The first [`Mismatch`] found; `state` is then unchanged.
pub fn replay(state: &mut SessionState, step: &Recorded<'_>) -> Result<Replayed, Mismatch> {
    replay_on(state, step, vector::Path::Unrecorded, None)
}

/// [`replay`], and with the dataset's noise key and the step's position,
/// the keyed audit of its release ([`key_audit::check`], in
/// [`Replayed::key`]): on the Σ the recorded update matched, and in vector
/// mode on the other basis too when that one does not match the key.
///
/// # Errors
/// As [`replay`].
pub fn replay_keyed(
    state: &mut SessionState,
    step: &Recorded<'_>,
    key: &NoiseKey,
    at: &Position<'_>,
) -> Result<Replayed, Mismatch> {
    replay_on(state, step, vector::Path::Unrecorded, Some((key, at)))
}

/// [`replay`] with the verifier's first choice of vector-mode basis forced
/// (tests stand in for a verifier whose kernels chose the other path).
pub(crate) fn replay_on(
    state: &mut SessionState,
    step: &Recorded<'_>,
    first: vector::Path,
    key: Option<(&NoiseKey, &Position<'_>)>,
) -> Result<Replayed, Mismatch> {
    let outputs = step.outputs;
    if outputs.len() != state.posterior.len() {
        return Err(Mismatch::Outputs(format!("{} teachers for {} subsets", outputs.len(), state.posterior.len())));
    }
    outputs.validate().map_err(|e| Mismatch::Outputs(e.to_string()))?;
    let gridded = outputs.on_grid();
    let outputs: &TeacherOutputs = &gridded;
    if step.published.len() != outputs.dim() {
        return Err(Mismatch::Outputs(format!("{} published values for d = {}", step.published.len(), outputs.dim())));
    }
    if let Some((coordinate, &value)) =
        step.published.iter().enumerate().find(|(_, v)| grid::q(**v, PUBLISHED_CLAMP).to_bits() != v.to_bits())
    {
        return Err(Mismatch::OffGrid { coordinate, value });
    }
    let expected = mechanism::argmax(step.published.iter().copied());
    if step.label != expected {
        return Err(Mismatch::Label { recorded: step.label, expected });
    }
    let unanimous = outputs.unanimous();
    let policy = state.ledger.policy();
    if !unanimous && policy == Policy::UnanimousOnly {
        return Err(Mismatch::ContestedAnswered);
    }
    let charge = state.ledger.charge_for(unanimous);
    if step.charge.to_bits() != charge.get().to_bits() {
        return Err(Mismatch::Charge { recorded: step.charge, expected: charge.get(), policy });
    }
    state.ledger.check(charge).map_err(|e| Mismatch::OverBudget(e.to_string()))?;

    if unanimous {
        let exact = grid::to_grid(mechanism::exact_release(outputs).view());
        if exact.iter().zip(step.published).any(|(a, b)| a.to_bits() != b.to_bits()) {
            return Err(Mismatch::NotExact("the published release differs from the common output".into()));
        }
        if !step.log_likelihood.is_empty() {
            return Err(Mismatch::NotExact("a log-likelihood vector was applied".into()));
        }
        state.ledger.record(charge).map_err(|e| Mismatch::OverBudget(e.to_string()))?;
        return Ok(Replayed { mi_bound: 0.0, unanimous, unchecked: None, evidence: None, slack: 0.0, key: None });
    }

    let b = state.ledger.per_query();
    // A journaled path is the server's Σ: recomputed as such, with no
    // second choice (journals before issue 66 record none).
    if let (Some(path), TeacherOutputs::Vectors(v)) = (step.path, outputs) {
        let fits = |e: PrivacyError| Mismatch::Outputs(e.to_string());
        let other = match path {
            vector::Path::Svd | vector::Path::SvdKeeping(_) => {
                vector::gram_always_serves(&state.posterior, v.view(), step.rules).map_err(fits)?.then_some(
                    "the journal says the SVD found the basis, but the mechanism takes a Gram matrix here on every \
                     machine",
                )
            }
            vector::Path::GramKeepingFromK(kept) if step.rules >= 2 => {
                vector::checks_from_g_always(&state.posterior, v.view(), kept).map_err(fits)?.then_some(
                    "the journal says K's basis was checked in output space (path 3), but the mechanism checks it \
                     from G here on every machine (path 4)",
                )
            }
            _ => None,
        };
        if let Some(why) = other {
            return Err(Mismatch::Uncertified(format!(
                "{why}: Σ was chosen another way than the mechanism chooses it"
            )));
        }
    }
    let calibrated = calibrate(state, outputs, b, step.path.unwrap_or(first), step.floor)?;
    let either = |c: &Calibrated| if step.path.is_some() { None } else { other_path(state, outputs, b, step.floor, c) };
    check_support(&calibrated.noise, outputs, step.published)?;
    if step.log_likelihood.len() != calibrated.centres.len() {
        return Err(Mismatch::Outputs(format!(
            "{} log-likelihoods for {} teachers",
            step.log_likelihood.len(),
            calibrated.centres.len()
        )));
    }
    let r: Array1<f64> = calibrated.noise.coords().iter().map(|&c| step.published[c]).collect();
    let clamped = r.iter().position(|v| v.abs() >= PUBLISHED_CLAMP).map(|i| calibrated.noise.coords()[i]);
    let (calibrated, (unchecked, slack)) = match clamped {
        // Taken wholly on trust: no bound on how far its update may be.
        Some(coordinate) => (calibrated, (Some(Unchecked::Clamp { coordinate }), f64::INFINITY)),
        None => match check_log_likelihood(state, &calibrated, &r, step.log_likelihood) {
            Ok(checked @ (None, _)) => (calibrated, checked),
            // The server's kernels may have chosen the other basis than
            // ours (near the Gram path's thresholds): follow it before
            // calling the step a mismatch, or unchecked.
            first => {
                let other = either(&calibrated).and_then(|other| {
                    Some((check_log_likelihood(state, &other, &r, step.log_likelihood).ok()?, other))
                });
                match (first, other) {
                    (_, Some((checked @ (None, _), other))) => (other, checked),
                    (Ok(checked), _) => (calibrated, checked),
                    (Err(mismatch), _) => return Err(mismatch),
                }
            }
        },
    };
    let noise = &calibrated.noise;
    // A journaled path is the server's basis: its weak directions are
    // held to their variance as label mode's are.
    let either_basis = matches!(outputs, TeacherOutputs::Vectors(_)) && step.path.is_none();
    let weights = state.posterior.weights();
    let evidence = noise_audit::evidence(noise, r.view(), &calibrated.centres, weights.view(), either_basis);
    let key = key.map(|(key, at)| {
        let keyed =
            |c: &Calibrated| key_audit::check(&c.noise, &c.centres, weights.view(), r.view(), &mut key.normals(at));
        let check = keyed(&calibrated);
        // A journaled path is the server's Σ: no second choice (L1 of
        // issue 66's second review).
        if !check.matching.is_empty() || step.path.is_some() {
            return check;
        }
        other_path(state, outputs, b, step.floor, &calibrated)
            .map(|o| keyed(&o))
            .filter(|c| !c.matching.is_empty())
            .unwrap_or(check)
    });
    // Checked (or reported unchecked): now applied exactly as the server did.
    apply_recorded(state, step)?;
    Ok(Replayed { mi_bound: noise.mi_bound(), unanimous, unchecked, evidence: Some(evidence), slack, key })
}

/// Applies `step` as recorded, unchecked: the charge (where it fits) and
/// the recorded ℓ. What `pacpriv verify` does after a mismatch, so that it
/// can go on to report every later one against the server's own state.
///
/// # Errors
/// The step cannot be applied at all (a malformed ℓ, or a charge past the
/// limit); `state` is then unchanged.
pub fn apply_recorded(state: &mut SessionState, step: &Recorded<'_>) -> Result<(), Mismatch> {
    let charge = Nats::new(step.charge).map_err(|e| Mismatch::OverBudget(e.to_string()))?;
    let mut posterior = state.posterior.clone();
    if !step.log_likelihood.is_empty() {
        // The grouped rules group by label; vector outputs have none.
        let labels: &[usize] = match step.outputs {
            TeacherOutputs::Labels { labels, .. } => labels,
            TeacherOutputs::Vectors(_) => &[],
        };
        posterior
            .update_by(step.update_rule, labels, ArrayView1::from(step.log_likelihood))
            .map_err(|e| Mismatch::Outputs(format!("the recorded log-likelihoods cannot be applied: {e}")))?;
    }
    state.ledger.record(charge).map_err(|e| Mismatch::OverBudget(e.to_string()))?;
    state.posterior = posterior;
    Ok(())
}

/// Σ recalibrated for a step, with each teacher's output on the noise's
/// coordinate block, certified and with the release where Σ allows it.
struct Calibrated {
    noise: Noise,
    centres: Vec<Array1<f64>>,
    /// Vector mode: which basis the verifier's calibration took.
    source: Option<vector::Basis>,
    /// Vector mode with the coefficients from K: how far the server's
    /// coefficients, which its Eq. 4 read, may be from exact.
    coefficients: Option<vector::CoefficientError>,
}

/// Σ calibrated to `state`'s posterior as the mechanism calibrates it (in
/// vector mode on the basis `path` asks for, its basis variances floored
/// as `floor` says), certified ½·tr(Σ⁺C) ≤ b.
fn calibrate(
    state: &SessionState,
    outputs: &TeacherOutputs,
    b: Nats,
    path: vector::Path,
    floor: Floor,
) -> Result<Calibrated, Mismatch> {
    let uncertified = |e: PrivacyError| Mismatch::Uncertified(e.to_string());
    let calibrated = match outputs {
        TeacherOutputs::Labels { labels, classes } => {
            let cal = label::calibrate_with(&state.posterior, labels, *classes, b, floor).map_err(uncertified)?;
            let k = cal.classes().len();
            let centres = (0..labels.len())
                .map(|i| {
                    let mut x = Array1::zeros(k);
                    if let Some(pos) = cal.position_of_teacher(i) {
                        x[pos] = 1.0;
                    }
                    x
                })
                .collect();
            Calibrated { noise: cal.noise().clone(), centres, source: None, coefficients: None }
        }
        TeacherOutputs::Vectors(v) => {
            let cal = vector::calibrate_on(&state.posterior, v.view(), b, path, floor).map_err(uncertified)?;
            let centres = v.rows().into_iter().map(|r| r.to_owned()).collect();
            Calibrated {
                noise: cal.noise().clone(),
                centres,
                source: Some(cal.basis_source()),
                coefficients: cal.coefficient_error().cloned(),
            }
        }
    };
    // Written so that a NaN bound fails too.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    if !(calibrated.noise.mi_bound() <= b.get()) {
        return Err(Mismatch::Uncertified(format!(
            "½·tr(Σ⁺C) = {:e} > b = {:e}",
            calibrated.noise.mi_bound(),
            b.get()
        )));
    }
    Ok(calibrated)
}

/// ‖x‖₂ without overflow (Σ⁺δ reaches 10²⁵⁰ at the variance floor).
fn norm(x: &Array1<f64>) -> f64 {
    let largest = x.iter().fold(0.0f64, |a, v| a.max(v.abs()));
    if largest == 0.0 || !largest.is_finite() {
        return largest;
    }
    largest * x.iter().map(|v| (v / largest).powi(2)).sum::<f64>().sqrt()
}

/// Vector mode: Σ on the basis the verifier did not take (the SVD if it
/// took a Gram matrix, and the other way round), if that calibrates and
/// certifies. A server before issue 56 took the SVD at d ≤ 2m, and one
/// whose Gram path declined takes it at any d.
fn other_path(
    state: &SessionState,
    outputs: &TeacherOutputs,
    b: Nats,
    floor: Floor,
    taken: &Calibrated,
) -> Option<Calibrated> {
    let other = match taken.source? {
        vector::Basis::Gram => vector::Path::Svd,
        vector::Basis::Svd => vector::Path::Gram,
        vector::Basis::Unanimous => return None,
    };
    calibrate(state, outputs, b, other, floor).ok()
}

/// Checks the recorded Eq. 4 vector against the published release `r`
/// (on Σ's block) up to a constant common to every teacher, which every
/// update rule ignores (`privacy-core.md` §9): for each teacher i, with
/// ref the teacher most likely after the step,
/// (recorded_i − recorded_ref) − (derived_i − derived_ref) may differ
/// from 0 by what the grid can move it, 2⁻³³·‖Σ⁺(x_ref − x_i)‖₁ (half a
/// step per coordinate), plus the round-off of projecting δ on both sides
/// and 10⁻⁹ relative for the two evaluation orders.
/// A tolerance above [`LOG_LIKELIHOOD_TOLERANCE`] on a teacher that is not
/// negligible after the step ([`NEGLIGIBLE`]) leaves the step unchecked.
/// Returns that, and the largest tolerance on a teacher that is not
/// negligible ([`Replayed::slack`]).
fn check_log_likelihood(
    state: &SessionState,
    calibrated: &Calibrated,
    r: &Array1<f64>,
    recorded: &[f64],
) -> Result<(Option<Unchecked>, f64), Mismatch> {
    let h = grid_error(r);
    // Round-off of either side's evaluation beyond the 10⁻⁹ relative: a
    // projection of δ is within γ‖δ‖ of exact, which moves δᵀΣ⁺δ by up to
    // 2γ‖δ‖‖Σ⁺δ‖ (the server's coefficients err alike).
    let gamma = 4.0 * (r.len() + 2) as f64 * f64::EPSILON;
    let derived: Vec<(f64, Array1<f64>, f64)> = calibrated
        .centres
        .iter()
        .enumerate()
        .map(|(i, centre)| {
            let delta = r - centre;
            let Observed { ll, g, t, outside } = observed(&calibrated.noise, &delta.view());
            let rounding = 2.0 * gamma * norm(&delta) * norm(&g)
                + calibrated.coefficients.as_ref().map_or(0.0, |e| from_k(&calibrated.noise, e, i, &t, outside));
            (ll, g, rounding)
        })
        .collect();
    let prior = state.posterior.log_weights();
    let after = |i: usize| prior[i] + derived[i].0;
    let reference = (0..derived.len()).fold(0, |best, i| if after(i) > after(best) { i } else { best });
    let (ref_derived, ref_gradient, ref_rounding) = &derived[reference];
    let ref_recorded = recorded[reference];
    let (mut unchecked, mut slack) = (None, 0.0f64);
    for (teacher, ((derived, gradient, rounding), &rec)) in derived.iter().zip(recorded).enumerate() {
        let gap = (rec - ref_recorded) - (derived - ref_derived);
        let tolerance = h * (gradient - ref_gradient).iter().map(|x| x.abs()).sum::<f64>()
            + 2.0 * (rounding + ref_rounding)
            + 1e-9 * (2.0 + derived.abs() + ref_derived.abs());
        // Negligible on both sides — the recorded update and the derived
        // one each leave it below e^{−1000} of ref — it has weight 0 in
        // every later calibration either way, so its ℓ need not match:
        // such an ℓ runs to −10¹⁰ on a direction whose variance is near
        // the floor, where another machine's kernels compute another
        // variance (up to a few per cent).
        let negligible = |ll: f64, ref_ll: f64| prior[teacher] + ll - (prior[reference] + ref_ll) < -NEGLIGIBLE;
        if negligible(rec, ref_recorded) && negligible(derived + tolerance, *ref_derived) {
            continue;
        }
        // Written so that a NaN on either side fails too.
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        if !(gap.abs() <= tolerance) {
            return Err(Mismatch::LogLikelihood {
                teacher,
                reference,
                recorded: rec - ref_recorded,
                derived: derived - ref_derived,
                tolerance,
            });
        }
        // A weight already 0 stays 0 whatever ℓ is (in either form).
        if prior[teacher] == f64::NEG_INFINITY || after(teacher) + tolerance - after(reference) < -NEGLIGIBLE {
            continue;
        }
        slack = slack.max(tolerance);
        if tolerance > LOG_LIKELIHOOD_TOLERANCE && unchecked.is_none() {
            unchecked = Some(Unchecked::Tolerance { teacher, tolerance });
        }
    }
    Ok((unchecked, slack))
}

/// Coordinates outside the noise's block are released exactly: there the
/// published value must be the (common) centre.
fn check_support(noise: &Noise, outputs: &TeacherOutputs, published: &[f64]) -> Result<(), Mismatch> {
    let exact = mechanism::exact_release(outputs);
    for (coordinate, (&p, &e)) in published.iter().zip(&exact).enumerate() {
        if noise.coords().binary_search(&coordinate).is_err() && p.to_bits() != grid::q(e, PUBLISHED_CLAMP).to_bits() {
            return Err(Mismatch::OffSupport { coordinate, published: p, expected: e });
        }
    }
    Ok(())
}

/// How far a published coordinate can be from the exact release it was
/// rounded from: half a grid step, plus the round-off of forming r − x
/// from it. Only for a release inside the clamp: at the clamp the distance
/// is unbounded, and the caller does not check ℓ.
fn grid_error(r: &Array1<f64>) -> f64 {
    let scale = r.iter().fold(1.0f64, |a, v| a.max(v.abs()));
    0.5 * PUBLISHED_GRID + 8.0 * r.len() as f64 * f64::EPSILON * scale
}

/// How far a server's Eq. 4 ℓ for teacher `i` may be from exact when it
/// read coefficients formed from K (`privacy-core.md` §4, *Coefficients
/// from K*): its coefficient difference with the secret's errs on
/// direction j by at most e_j = per_direction_j·(max_k‖c_k‖ + ‖c_i‖) +
/// 2·absolute_j (the secret is not known here), which moves −½(t_j/√v_j)² by at most
/// |t_j|·e_j/v_j + ½e_j²/v_j, t_j = u_jᵀδ; and its residual difference,
/// E·Uᵀ, by at most e = ‖(e_j)‖·√(1 + η) ≤ 1.25‖(e_j)‖ in norm, which
/// moves ‖·‖²/(2f) by at most ‖res‖·e/f + ½e²/f (`outside` = ‖res‖).
/// Twice that: the verifier's own basis and bounds are its kernels'
/// rounding away from the server's.
fn from_k(noise: &Noise, error: &vector::CoefficientError, i: usize, t: &Array1<f64>, outside: f64) -> f64 {
    let widest = error.lengths.iter().copied().fold(0.0, f64::max);
    let own = error.lengths.get(i).copied().unwrap_or(widest);
    let mut moved = 0.0;
    let mut squares = 0.0;
    for (((t, v), per), absolute) in t.iter().zip(noise.variances()).zip(&error.per_direction).zip(&error.absolute) {
        let e = per * (widest + own) + 2.0 * absolute;
        moved += t.abs() * e / v + 0.5 * e * e / v;
        squares += e * e;
    }
    let f = noise.complement();
    if f > 0.0 {
        let e = 1.25 * squares.sqrt();
        moved += outside * e / f + 0.5 * e * e / f;
    }
    2.0 * moved
}

/// ℓ = −½ δᵀΣ⁺δ for δ = r − x on the noise's block, and its gradient in r,
/// g = −Σ⁺δ up to sign: g = Σ⁺δ (the grid's effect on ℓ_i − ℓ_ref is
/// (g_i − g_ref)ᵀe for the rounding e, |e_c| ≤ 2⁻³³).
fn observed(noise: &Noise, delta: &ArrayView1<'_, f64>) -> Observed {
    let basis = noise.basis();
    let t = basis.t().dot(delta);
    let scaled = &t / &noise.variances();
    let mut qf: f64 = t.iter().zip(&scaled).map(|(t, s)| t * s).sum();
    let mut g = basis.dot(&scaled);
    let mut outside = 0.0;
    if noise.complement() > 0.0 {
        let res = delta - &basis.dot(&t);
        qf += res.dot(&res) / noise.complement();
        g += &(&res / noise.complement());
        outside = norm(&res);
    }
    Observed { ll: -0.5 * qf, g, t, outside }
}

/// What [`observed`] derives for one δ.
struct Observed {
    /// ℓ = −½ δᵀΣ⁺δ.
    ll: f64,
    /// Its gradient in r, Σ⁺δ.
    g: Array1<f64>,
    /// δ's coordinates along the basis, Uᵀδ.
    t: Array1<f64>,
    /// ‖δ − UUᵀδ‖, its part in the complement (0 without one).
    outside: f64,
}

#[cfg(test)]
mod test;
