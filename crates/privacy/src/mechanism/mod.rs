//! One step of Algorithm 1, applied atomically to a session's state: budget
//! check → calibrate Σ_t to P_{t−1} → release M_t(S) + N(0, Σ_t) → update
//! the posterior (Eq. 4) and the ledger. Argument: `docs/assurance/privacy-core.md` §5.
//!
//! # Invariants
//! - Either the answer is returned *and* both the posterior and the ledger
//!   reflect it, or an error is returned and neither changed.
//! - The secret index only selects which teacher's output is the centre of
//!   the release; the refusal decision, the calibration and the amount of
//!   work never depend on it.

use super::confidence;
use super::grid;
use super::keyed::KeyedNormals;
use super::label::{self, LabelCalibration};
use super::ledger::{Ledger, Policy};
use super::noise::NoiseDraw;
use super::posterior::{Posterior, UpdateRule};
use super::vector;
use super::{Nats, PrivacyError};
use ndarray::{Array1, Array2};
use rand::CryptoRng;
use rand_distr::{Distribution, StandardNormal};
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

    /// The same outputs with every vector value on the release grid
    /// ([`grid::centre`]: clamped to ±2¹⁹, rounded to 2⁻³²); labels as they
    /// are. Everything after validation uses this form.
    pub fn on_grid(&self) -> std::borrow::Cow<'_, TeacherOutputs> {
        match self {
            TeacherOutputs::Labels { .. } => std::borrow::Cow::Borrowed(self),
            TeacherOutputs::Vectors(v) => std::borrow::Cow::Owned(TeacherOutputs::Vectors(v.mapv(grid::centre))),
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
    /// argmax of the published release (lowest class on ties).
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
    /// Q(r), the form in which r may leave the process (opt-in), and the
    /// only form anything that leaves is computed from: on the 2⁻³² grid,
    /// with no bit that depends on the centre beyond the centre's own grid
    /// value (see [`grid`]).
    pub published: Vec<f64>,
    /// The log-likelihood vector Eq. 4 applied to the posterior (one entry
    /// per subset); `None` for an exact unanimous answer, which leaves the
    /// posterior unchanged. Lets a store journal and replay the transcript.
    pub log_likelihood: Option<Array1<f64>>,
    /// How the posterior applied it ([`UpdateRule`]); a journal records it
    /// so that replay renormalises the same way, bit for bit.
    pub update_rule: UpdateRule,
    /// Vector mode: the basis path Σ was calibrated on, with its kept rank
    /// (`None` in label mode and for an exact answer). A journal records
    /// it, so that replay recomputes this Σ, not the one its own kernels
    /// would choose near a threshold, and Σ is fixed before the draw.
    pub path: Option<vector::Path>,
}

/// What Σ is calibrated to. Every deployment is [`Calibration::Certified`];
/// the other variant exists so that `pacpriv audit --canaries` can be shown
/// to catch a broken mechanism (`examples/undernoised.rs`,
/// `tests/it/canaries.rs`). No configuration key, flag or environment
/// variable of the `pacpriv` binary selects it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Calibration {
    /// Σ certified for the b the ledger charges.
    #[default]
    Certified,
    /// BROKEN ON PURPOSE: Σ calibrated to `factor`·b while b is charged —
    /// less noise than the accounting says.
    UnderNoisedForAuditTests {
        /// How much larger than b the calibration budget is.
        factor: f64,
    },
}

impl Calibration {
    /// The budget Σ is calibrated to when the ledger charges `b`.
    fn budget(self, b: Nats) -> Nats {
        match self {
            Calibration::Certified => b,
            Calibration::UnderNoisedForAuditTests { factor } => Nats::new(b.get() * factor).unwrap_or(b),
        }
    }
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
    answer_calibrated(state, outputs, secret, alpha, rng, Calibration::Certified)
}

/// [`answer`] with Σ calibrated as `calibration` says (always
/// [`Calibration::Certified`] in a deployment).
///
/// # Errors
/// [`PrivacyError::BudgetExhausted`] when the charge does not fit; shape and
/// calibration errors from the modes.
pub fn answer_calibrated<R: CryptoRng + ?Sized>(
    state: &mut SessionState,
    outputs: &TeacherOutputs,
    secret: SecretIndex,
    alpha: Option<f64>,
    rng: &mut R,
    calibration: Calibration,
) -> Result<Answer, PrivacyError> {
    answer_drawn(state, outputs, secret, alpha, &mut || StandardNormal.sample(rng), calibration, |_| ())
}

/// [`answer_calibrated`] with the draw's standard normals from the keyed
/// generator at the step's position ([`super::keyed`]): what the service
/// runs, so that an auditor holding the key recomputes the draw
/// ([`super::key_audit`]). The caller names the position; it must be one
/// no other release of the dataset used (`accounting.md` §11).
///
/// # Errors
/// As [`answer`].
pub fn answer_keyed(
    state: &mut SessionState,
    outputs: &TeacherOutputs,
    secret: SecretIndex,
    alpha: Option<f64>,
    normals: &mut KeyedNormals,
    calibration: Calibration,
) -> Result<Answer, PrivacyError> {
    answer_drawn(state, outputs, secret, alpha, &mut || normals.next_normal(), calibration, |_| ())
}

/// BROKEN ON PURPOSE, tests only: [`answer`] with the noise drawn from
/// c²·Σ instead of Σ, and everything else — the journaled ℓ (that of the
/// actual release under the calibrated Σ), the posterior, the charge —
/// exactly as the real mechanism: the dishonest operator that the noise
/// audit ([`super::noise_audit`]) exists to catch. Never compiled into a
/// binary.
#[cfg(test)]
pub(crate) fn answer_scaled<R: CryptoRng + ?Sized>(
    state: &mut SessionState,
    outputs: &TeacherOutputs,
    secret: SecretIndex,
    rng: &mut R,
    c: f64,
) -> Result<Answer, PrivacyError> {
    answer_drawn(state, outputs, secret, None, &mut || StandardNormal.sample(rng), Calibration::Certified, |draw| {
        draw.std_coef *= c;
        draw.residual *= c;
    })
}

/// [`answer_calibrated`] on the standard normals `normals` gives, with
/// `reshape` applied to the draw: the identity everywhere but in the
/// tests' dishonest mechanisms ([`answer_scaled`]).
pub(crate) fn answer_drawn(
    state: &mut SessionState,
    outputs: &TeacherOutputs,
    secret: SecretIndex,
    alpha: Option<f64>,
    normals: &mut dyn FnMut() -> f64,
    calibration: Calibration,
    reshape: impl FnOnce(&mut NoiseDraw),
) -> Result<Answer, PrivacyError> {
    if outputs.len() != state.posterior.len() {
        return Err(PrivacyError::TeacherCount { posterior: state.posterior.len(), teachers: outputs.len() });
    }
    outputs.validate()?;
    // Vector outputs are put on the grid first, so that the release centre
    // is a grid value and `grid::publish` never forms fl(centre + z).
    let gridded = outputs.on_grid();
    let outputs: &TeacherOutputs = &gridded;
    if let Some(a) = alpha {
        confidence::threshold(a)?;
    }
    let unanimous = outputs.unanimous();
    // A function of the outputs alone (public), so refusing reveals
    // nothing about s*; before the budget, the draw or any state change.
    if !unanimous && state.ledger.policy() == Policy::UnanimousOnly {
        return Err(PrivacyError::Contested);
    }
    let charge = state.ledger.charge_for(unanimous);
    state.ledger.check(charge)?;
    let b = calibration.budget(state.ledger.per_query());
    let s = secret.expose();

    if unanimous {
        // Every subset gives the same output: the release is that output,
        // exact, and Eq. 4's likelihood is the same for every subset, so the
        // posterior is unchanged. Only the ledger moves.
        state.ledger.record(charge)?;
        let noisy = exact_release(outputs);
        let (label, published) = match outputs {
            // A one-hot vector is on the grid already: Q leaves it as it
            // is, and its argmax is its label (O(1) in d, not O(d)).
            TeacherOutputs::Labels { labels, .. } => (labels.first().copied().unwrap_or_default(), noisy.to_vec()),
            TeacherOutputs::Vectors(_) => {
                let published = grid::to_grid(noisy.view());
                (argmax(published.iter().copied()), published)
            }
        };
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
            update_rule: UpdateRule::PerSubset,
            path: None,
        });
    }

    // The fallible posterior update runs on a copy, swapped in at the commit.
    let mut posterior = state.posterior.clone();
    let (label, noisy, published, log_lik, rule, noise_mi, evidence, path) = match outputs {
        TeacherOutputs::Labels { labels, classes } => {
            let cal = label::calibrate(&state.posterior, labels, *classes, b)?;
            let center =
                cal.position_of_teacher(s).ok_or_else(|| PrivacyError::Domain("secret index out of range".into()))?;
            let mut draw = cal.noise().sample_from(&mut *normals);
            reshape(&mut draw);
            let (label, noisy, published, evidence) = release_label(&cal, center, &draw);
            let log_lik = cal.update_posterior(&mut posterior, center, &draw)?;
            (label, noisy, published, log_lik, UpdateRule::Linear, cal.noise().mi_bound(), Some(evidence), None)
        }
        TeacherOutputs::Vectors(v) => {
            let cal = vector::calibrate(&state.posterior, v.view(), b)?;
            let mut draw = cal.noise().sample_from(&mut *normals);
            reshape(&mut draw);
            let z = cal.noise().noise_vector(&draw);
            let noisy = &v.row(s) + &z;
            let published = grid::publish(v.row(s), &z);
            let log_lik = cal.teacher_log_likelihoods(s, &draw);
            posterior.update(log_lik.view())?;
            let label = argmax(published.iter().copied());
            let path = cal.path_taken();
            (label, noisy, published, log_lik, UpdateRule::PerSubset, cal.noise().mi_bound(), None, path)
        }
    };

    // Before any state changes: the flag's only failure is a bad α.
    let confident = match (alpha, evidence) {
        (Some(a), Some(e)) => Some(e.confident(a)?),
        _ => None,
    };

    // Commit: `record` either charges or changes nothing; only then is the
    // updated posterior swapped in.
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
        update_rule: rule,
        path,
    })
}

/// The common output of unanimous teachers (teacher 0's copy, whatever
/// the secret).
pub(super) fn exact_release(outputs: &TeacherOutputs) -> Array1<f64> {
    match outputs {
        TeacherOutputs::Labels { labels, classes } => {
            // validate() guaranteed a non-empty list of labels < classes.
            one_hot(labels.first().copied().unwrap_or_default(), *classes)
        }
        TeacherOutputs::Vectors(v) => v.row(0).to_owned(),
    }
}

fn one_hot(y: usize, d: usize) -> Array1<f64> {
    let mut e = Array1::zeros(d);
    if let Some(slot) = e.get_mut(y) {
        *slot = 1.0;
    }
    e
}

type LabelRelease = (usize, Array1<f64>, Vec<f64>, confidence::Evidence);

/// The label-mode release of `draw` around the active class at position
/// `center` (the secret teacher's). Everything that leaves — the published
/// vector, the label, the confidence evidence — is computed from
/// `grid::publish(e_y*, z)`, i.e. from Q of the exact release; the
/// unrounded r (whose low bits depend on which coordinate held the 1) is
/// kept only for Eq. 4 and the tests.
///
/// z is 0 outside the active classes, so Q(r) is exactly +0.0 there: only
/// the k active coordinates are computed, and a huge label space (d =
/// 32 768) costs two zeroed d-vectors, not d roundings (issue 44 §4).
fn release_label(cal: &LabelCalibration, center: usize, draw: &NoiseDraw) -> LabelRelease {
    let d = cal.noise().dim();
    let z = cal.noise().block(draw);
    let mut noisy = Array1::zeros(d);
    let mut published = vec![0.0; d];
    // The best active class so far: (position, value).
    let mut best: Option<(usize, f64)> = None;
    for (a, &c) in cal.classes().iter().enumerate() {
        let y = if a == center { 1.0 } else { 0.0 };
        let z = z.get(a).copied().unwrap_or(0.0);
        noisy[c] = y + z;
        let value = grid::publish_one(y, z);
        published[c] = value;
        if best.is_none_or(|(_, v)| value > v) {
            best = Some((a, value));
        }
    }
    // The active block of r sums to 1 (noise ⊥ 1) and gridding moves each
    // value by at most 2⁻³³, so its maximum is > 0 = every inactive
    // coordinate, and the classes are sorted: the first active maximum is
    // the argmax of the whole vector. Should it ever not be positive, the
    // whole vector decides.
    let (label, released) = match best {
        Some((a, v)) if v > 0.0 => (cal.classes()[a], a),
        _ => {
            let label = argmax(published.iter().copied());
            (label, cal.classes().binary_search(&label).unwrap_or_default())
        }
    };
    let evidence = confidence::Evidence::of(cal.noise(), &published, released);
    (label, noisy, published, evidence)
}

/// Index of the largest value; the first one on ties, so that a label
/// taken from the published (gridded) vector is a function of it alone.
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
