//! One step of Algorithm 1, applied atomically to a session's state: budget
//! check → calibrate Σ_t to P_{t−1} → release M_t(S) + N(0, Σ_t) → update
//! the posterior (Eq. 4) and the ledger. Argument: `docs/privacy-core.md` §5.
//!
//! # Invariants
//! - Either the answer is returned *and* both the posterior and the ledger
//!   reflect it, or an error is returned and neither changed.
//! - The secret index only selects which teacher's output is the centre of
//!   the release; the refusal decision, the calibration and the amount of
//!   work never depend on it.

use super::confidence;
use super::label::{self, LabelCalibration};
use super::ledger::Ledger;
use super::posterior::Posterior;
use super::vector;
use super::{Nats, PrivacyError};
use ndarray::{Array1, Array2};
use rand::CryptoRng;
use std::fmt;

/// Index of the secret subset s*, i.e. of the teacher whose output is
/// released. Deliberately has no `Display` and a redacting `Debug`, so it
/// cannot end up in a log line or an error message by accident.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SecretIndex(usize);

impl SecretIndex {
    /// Wraps index `i` of `m` subsets.
    ///
    /// # Errors
    /// [`PrivacyError::Domain`] if i ≥ m (the message does not contain i).
    pub fn new(i: usize, m: usize) -> Result<Self, PrivacyError> {
        if i < m {
            Ok(SecretIndex(i))
        } else {
            Err(PrivacyError::Domain(format!("secret index out of range for {m} subsets")))
        }
    }

    /// The index itself, for the store that seals it and for the mechanism.
    pub fn expose(self) -> usize {
        self.0
    }
}

impl fmt::Debug for SecretIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretIndex(<redacted>)")
    }
}

/// What the m teachers returned for one query, in subset order.
#[derive(Clone, Debug)]
pub enum TeacherOutputs {
    /// Label mode: teacher i predicted class `labels[i]` < `classes`.
    Labels {
        /// One label per teacher.
        labels: Vec<usize>,
        /// Number of classes d.
        classes: usize,
    },
    /// Vector mode: row i is teacher i's output (m × d).
    Vectors(Array2<f64>),
}

impl TeacherOutputs {
    /// Number of teachers.
    pub fn len(&self) -> usize {
        match self {
            TeacherOutputs::Labels { labels, .. } => labels.len(),
            TeacherOutputs::Vectors(v) => v.nrows(),
        }
    }

    /// True when there are no teacher outputs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Output dimension d.
    pub fn dim(&self) -> usize {
        match self {
            TeacherOutputs::Labels { classes, .. } => *classes,
            TeacherOutputs::Vectors(v) => v.ncols(),
        }
    }

    /// Checks labels < classes, d ≥ 1 and finite vectors.
    ///
    /// # Errors
    /// [`PrivacyError::Shape`] or [`PrivacyError::NonFinite`].
    pub fn validate(&self) -> Result<(), PrivacyError> {
        match self {
            TeacherOutputs::Labels { labels, classes } => label::check_labels(labels, *classes),
            TeacherOutputs::Vectors(v) => vector::check_outputs(v.view()),
        }
    }

    /// True when every teacher gave the same output: then every subset with
    /// positive posterior weight yields the same release, and it is exact.
    pub fn unanimous(&self) -> bool {
        match self {
            TeacherOutputs::Labels { labels, .. } => labels.windows(2).all(|w| w[0] == w[1]),
            TeacherOutputs::Vectors(v) => v.rows().into_iter().all(|r| r == v.row(0)),
        }
    }
}

/// A session's privacy state: belief and account.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionState {
    /// P_t over the m subsets.
    pub posterior: Posterior,
    /// MI spent and the limit.
    pub ledger: Ledger,
}

/// What one answered query produced. `noisy` never leaves the process;
/// `published` does when the operator opts in.
#[derive(Clone, Debug)]
pub struct Answer {
    /// argmax of the release.
    pub label: usize,
    /// Whether all teachers agreed (the release is then exact).
    pub unanimous: bool,
    /// MI charged to the ledger for this answer.
    pub charge: Nats,
    /// Certified ½·tr(Σ⁺C) of this release (≤ b).
    pub mi_bound: f64,
    /// Prop. 5.1 at the requested α, if one was requested.
    pub confident: Option<bool>,
    /// What the confidence test needs of this release at any α (label
    /// mode; `None` in vector mode).
    pub evidence: Option<confidence::Evidence>,
    /// The full noisy release r (length d).
    pub noisy: Array1<f64>,
    /// The form in which r may leave the process (opt-in): on the 2⁻³²
    /// grid, with no bit that depends on the centre beyond the centre's
    /// own grid value (see [`to_grid`]).
    pub published: Vec<f64>,
    /// The log-likelihood vector Eq. 4 applied to the posterior (one entry
    /// per subset); `None` for an exact unanimous answer, which leaves the
    /// posterior unchanged. Lets a store journal and replay the transcript.
    pub log_likelihood: Option<Array1<f64>>,
}

/// Answers one query: checks the budget, calibrates, samples with `rng`,
/// updates `state`. On error `state` is untouched and nothing is released.
///
/// # Errors
/// [`PrivacyError::BudgetExhausted`] when the charge does not fit; shape and
/// calibration errors from the modes.
pub fn answer<R: CryptoRng + ?Sized>(
    state: &mut SessionState,
    outputs: &TeacherOutputs,
    secret: SecretIndex,
    alpha: Option<f64>,
    rng: &mut R,
) -> Result<Answer, PrivacyError> {
    if outputs.len() != state.posterior.len() {
        return Err(PrivacyError::TeacherCount { posterior: state.posterior.len(), teachers: outputs.len() });
    }
    outputs.validate()?;
    if let Some(a) = alpha {
        confidence::threshold(a)?;
    }
    let unanimous = outputs.unanimous();
    let charge = state.ledger.charge_for(unanimous);
    state.ledger.check(charge)?;
    let b = state.ledger.per_query();
    let s = secret.expose();

    if unanimous {
        // Every subset gives the same output: the release is that output,
        // exact, and Eq. 4's likelihood is the same for every subset, so the
        // posterior is unchanged. Only the ledger moves.
        state.ledger.record(charge)?;
        let (label, noisy) = exact_release(outputs);
        let published = to_grid(&noisy);
        return Ok(Answer {
            label,
            unanimous,
            charge,
            mi_bound: 0.0,
            confident: alpha.map(|_| true),
            evidence: matches!(outputs, TeacherOutputs::Labels { .. }).then_some(confidence::Evidence::EXACT),
            noisy,
            published,
            log_likelihood: None,
        });
    }

    let (label, noisy, published, log_lik, noise_mi, evidence) = match outputs {
        TeacherOutputs::Labels { labels, classes } => {
            let cal = label::calibrate(&state.posterior, labels, *classes, b)?;
            let (label, noisy, published, log_lik, evidence) = release_label(&cal, s, rng)?;
            (label, noisy, published, log_lik, cal.noise().mi_bound(), Some(evidence))
        }
        TeacherOutputs::Vectors(v) => {
            let cal = vector::calibrate(&state.posterior, v.view(), b)?;
            let draw = cal.noise().sample(rng);
            let noisy = cal.release(s, &draw);
            let published = to_grid(&noisy);
            let log_lik = cal.teacher_log_likelihoods(s, &draw);
            (argmax(noisy.iter().copied()), noisy, published, log_lik, cal.noise().mi_bound(), None)
        }
    };

    // Before any state changes: the flag's only failure is a bad α.
    let confident = match (alpha, evidence) {
        (Some(a), Some(e)) => Some(e.confident(a)?),
        _ => None,
    };

    // Commit: the fallible posterior update runs on a copy; `record` either
    // charges or changes nothing; only then is the new posterior swapped in.
    let mut posterior = state.posterior.clone();
    posterior.update(log_lik.view())?;
    state.ledger.record(charge)?;
    state.posterior = posterior;
    Ok(Answer {
        label,
        unanimous,
        charge,
        mi_bound: noise_mi,
        confident,
        evidence,
        noisy,
        published,
        log_likelihood: Some(log_lik),
    })
}

/// The common output of unanimous teachers and its argmax.
fn exact_release(outputs: &TeacherOutputs) -> (usize, Array1<f64>) {
    match outputs {
        TeacherOutputs::Labels { labels, classes } => {
            // validate() guaranteed a non-empty list of labels < classes.
            let y = labels.first().copied().unwrap_or_default();
            let mut e = Array1::zeros(*classes);
            if let Some(slot) = e.get_mut(y) {
                *slot = 1.0;
            }
            (y, e)
        }
        TeacherOutputs::Vectors(v) => {
            let row = v.row(0).to_owned();
            (argmax(row.iter().copied()), row)
        }
    }
}

type LabelRelease = (usize, Array1<f64>, Vec<f64>, Array1<f64>, confidence::Evidence);

fn release_label<R: CryptoRng + ?Sized>(
    cal: &LabelCalibration,
    secret: usize,
    rng: &mut R,
) -> Result<LabelRelease, PrivacyError> {
    let center =
        cal.position_of_teacher(secret).ok_or_else(|| PrivacyError::Domain("secret index out of range".into()))?;
    let draw = cal.noise().sample(rng);
    let block = cal.release_block(center, &draw);
    // The active block sums to 1 (noise ⊥ 1), so its maximum is ≥ 1/k > 0 =
    // every inactive coordinate: the argmax is always an active class.
    let pos = argmax(block.iter().copied());
    let mut noisy = Array1::zeros(cal.noise().dim());
    for (&c, v) in cal.classes().iter().zip(&block) {
        noisy[c] = *v;
    }
    let published = publish_label(&cal.noise().noise_vector(&draw), cal.classes()[center]);
    let evidence = confidence::Evidence::of(cal.noise(), center, pos, &draw);
    Ok((cal.classes()[pos], noisy, published, cal.teacher_log_likelihoods(center, &draw), evidence))
}

/// Grid the published noisy vector is rounded to: 2⁻³².
pub const PUBLISHED_GRID: f64 = 1.0 / 4_294_967_296.0;

/// Largest magnitude of a published coordinate: 2²⁰. Below it every
/// multiple of [`PUBLISHED_GRID`] is an exact `f64` (2²⁰ / 2⁻³² = 2⁵²).
pub const PUBLISHED_CLAMP: f64 = 1_048_576.0;

/// Q: every coordinate clamped to ±2²⁰ and rounded to the nearest multiple
/// of 2⁻³² — the grid on which a release may leave the process (opt-in,
/// [`Answer::published`]).
///
/// The low-order bits of a floating-point release depend on how it was
/// computed, and so on the centre the noise was added to (a known side
/// channel for Laplace and Gaussian samplers, Mironov 2012). Label mode
/// therefore computes Q(e_y* + z) without fl(1 + z) (`publish_label`); vector mode publishes Q(r), which leaves a residue only when
/// r lies within its own rounding error of a grid midpoint
/// (`docs/accounting.md` §2, §6). Q is a function of its input alone:
/// post-processing, no privacy cost.
pub fn to_grid(noisy: &Array1<f64>) -> Vec<f64> {
    noisy.iter().map(|&v| grid(v, PUBLISHED_CLAMP)).collect()
}

/// Q(e_y + z) for the label release centred on class `y` with noise `z`,
/// computed as clamp(e_y + Q'(z)) and never as Q(fl(e_y + z)): the rounding
/// of 1 + z_y depends on which coordinate holds the 1, and near a grid
/// midpoint it would survive Q. Q' rounds like Q but clamps one further out,
/// so adding e_y (on the grid) is exact (|sum| < 2²¹), and the final clamp
/// erases the 1 wherever the release is clamped (±2²⁰ + 1 would name y).
fn publish_label(z: &Array1<f64>, y: usize) -> Vec<f64> {
    let mut published: Vec<f64> = z.iter().map(|&v| grid(v, PUBLISHED_CLAMP + 1.0)).collect();
    if let Some(slot) = published.get_mut(y) {
        *slot += 1.0;
    }
    published.iter().map(|v| v.clamp(-PUBLISHED_CLAMP, PUBLISHED_CLAMP)).collect()
}

/// `v` clamped to ±`clamp` and rounded to the nearest multiple of
/// [`PUBLISHED_GRID`]; exact for `clamp` < 2²¹.
fn grid(v: f64, clamp: f64) -> f64 {
    // A release is finite; NaN cannot occur, but must not escape as
    // anything informative if it ever did.
    let v = if v.is_nan() { 0.0 } else { v.clamp(-clamp, clamp) };
    (v / PUBLISHED_GRID).round() * PUBLISHED_GRID
}

/// Index of the largest value; the first one on ties (a measure-zero event
/// for continuous noise).
pub fn argmax(values: impl Iterator<Item = f64>) -> usize {
    let mut best = (0, f64::NEG_INFINITY);
    for (i, v) in values.enumerate() {
        if v > best.1 {
            best = (i, v);
        }
    }
    best.0
}

#[cfg(test)]
mod test;
