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
//!   ℓ_i = −½ (r − x_i)ᵀ Σ⁺ (r − x_i) for every teacher i, within what the
//!   2⁻³² grid can move it (the server evaluates ℓ at the exact r, which
//!   never leaves it; [`observed`] bounds the difference);
//! - every published value is on the grid and within the clamp, and the
//!   released label is the argmax of the published release.
//!
//! A release coordinate the noise covers that sits *at* the clamp (±2²⁰)
//! stands for every value beyond it, so the exact r there is unknown and ℓ
//! cannot be checked: any recorded ℓ would fit. Such a step is not passed
//! silently: its other checks still run, it is applied as recorded, and
//! [`Replayed::unchecked`] says so, for the caller to refuse or report
//! (`pacpriv verify` fails on it unless told to list such steps instead).
//!
//! Then it applies the recorded vector to the posterior exactly as the
//! server did (Eq. 4), so the replayed posterior is the server's bit for
//! bit, and the next step is checked against it.
//!
//! # Invariants
//! - Pure: the same inputs give the same verdict; nothing here sees s*.
//! - On a mismatch the state is left as it was before the step.

use super::grid::{self, PUBLISHED_CLAMP, PUBLISHED_GRID};
use super::label;
use super::ledger::Policy;
use super::mechanism::{self, SessionState, TeacherOutputs};
use super::noise::Noise;
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
    /// The recorded Eq. 4 vector is not the published release's.
    #[error(
        "the posterior update does not match the release: teacher {teacher}'s log-likelihood is recorded as \
         {recorded:e}, the published release gives {derived:e} (± {tolerance:e})"
    )]
    LogLikelihood {
        /// Which teacher.
        teacher: usize,
        /// Recorded.
        recorded: f64,
        /// Derived from the published release.
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

/// What a verified step certified.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Replayed {
    /// ½·tr(Σ⁺C) of the recalibrated Σ (0 for an exact answer).
    pub mi_bound: f64,
    /// Whether all teachers agreed.
    pub unanimous: bool,
    /// The noise covers a coordinate published at the clamp (±2²⁰), so the
    /// recorded log-likelihoods were applied without being checked: the
    /// first such coordinate.
    pub unchecked: Option<usize>,
}

/// Checks `step` against `state` (the session before it) and applies it.
///
/// # Errors
/// The first [`Mismatch`] found; `state` is then unchanged.
pub fn replay(state: &mut SessionState, step: &Recorded<'_>) -> Result<Replayed, Mismatch> {
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
        return Ok(Replayed { mi_bound: 0.0, unanimous, unchecked: None });
    }

    let b = state.ledger.per_query();
    let (noise, centres) = calibrate(state, outputs, b).map_err(|e| Mismatch::Uncertified(e.to_string()))?;
    // Written so that a NaN bound fails too.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    if !(noise.mi_bound() <= b.get()) {
        return Err(Mismatch::Uncertified(format!("½·tr(Σ⁺C) = {:e} > b = {:e}", noise.mi_bound(), b.get())));
    }
    check_support(&noise, outputs, step.published)?;
    if step.log_likelihood.len() != centres.len() {
        return Err(Mismatch::Outputs(format!(
            "{} log-likelihoods for {} teachers",
            step.log_likelihood.len(),
            centres.len()
        )));
    }
    let r: Array1<f64> = noise.coords().iter().map(|&c| step.published[c]).collect();
    let unchecked = r.iter().position(|v| v.abs() >= PUBLISHED_CLAMP).map(|i| noise.coords()[i]);
    if unchecked.is_none() {
        let h = grid_error(&r);
        for (teacher, (centre, &recorded)) in centres.iter().zip(step.log_likelihood).enumerate() {
            let (derived, tolerance) = observed(&noise, &(&r - centre).view(), h);
            // Written so that a NaN on either side fails too.
            #[allow(clippy::neg_cmp_op_on_partial_ord)]
            if !((recorded - derived).abs() <= tolerance) {
                return Err(Mismatch::LogLikelihood { teacher, recorded, derived, tolerance });
            }
        }
    }

    // The grouped rule groups by label; vector outputs have none to group by.
    let labels: &[usize] = match outputs {
        TeacherOutputs::Labels { labels, .. } => labels,
        TeacherOutputs::Vectors(_) => &[],
    };
    let mut posterior = state.posterior.clone();
    posterior
        .update_by(step.update_rule, labels, ArrayView1::from(step.log_likelihood))
        .map_err(|e| Mismatch::Outputs(format!("the recorded log-likelihoods cannot be applied: {e}")))?;
    state.ledger.record(charge).map_err(|e| Mismatch::OverBudget(e.to_string()))?;
    state.posterior = posterior;
    Ok(Replayed { mi_bound: noise.mi_bound(), unanimous, unchecked })
}

/// Σ calibrated to `state`'s posterior, as the mechanism calibrates it, and
/// each teacher's output on the noise's coordinate block.
fn calibrate(
    state: &SessionState,
    outputs: &TeacherOutputs,
    b: Nats,
) -> Result<(Noise, Vec<Array1<f64>>), PrivacyError> {
    match outputs {
        TeacherOutputs::Labels { labels, classes } => {
            let cal = label::calibrate(&state.posterior, labels, *classes, b)?;
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
            Ok((cal.noise().clone(), centres))
        }
        TeacherOutputs::Vectors(v) => {
            let cal = vector::calibrate(&state.posterior, v.view(), b)?;
            Ok((cal.noise().clone(), v.rows().into_iter().map(|r| r.to_owned()).collect()))
        }
    }
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

/// ℓ = −½ δᵀΣ⁺δ for δ = r − x on the noise's block, and a bound on how far
/// ℓ moves when every coordinate of r moves by at most `h`: with g = Σ⁺δ,
/// |Δℓ| ≤ h‖g‖₁ + ½·n·h²·λ_max(Σ⁺), plus 10⁻⁹ relative for the two
/// evaluation orders (the server's runs through the draw's coefficients).
fn observed(noise: &Noise, delta: &ArrayView1<'_, f64>, h: f64) -> (f64, f64) {
    let basis = noise.basis();
    let t = basis.t().dot(delta);
    let scaled = &t / &noise.variances();
    let mut qf: f64 = t.iter().zip(&scaled).map(|(t, s)| t * s).sum();
    let mut g = basis.dot(&scaled);
    let mut inverse_max = noise.variances().iter().fold(0.0f64, |a, v| a.max(1.0 / v));
    if noise.complement() > 0.0 {
        let res = delta - &basis.dot(&t);
        qf += res.dot(&res) / noise.complement();
        g += &(&res / noise.complement());
        inverse_max = inverse_max.max(1.0 / noise.complement());
    }
    let ll = -0.5 * qf;
    let n = delta.len() as f64;
    let tolerance =
        h * g.iter().map(|x| x.abs()).sum::<f64>() + 0.5 * n * h * h * inverse_max + 1e-9 * (1.0 + ll.abs());
    (ll, tolerance)
}

#[cfg(test)]
mod test;
