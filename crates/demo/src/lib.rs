//! The demo teacher ensembles: m multinomial logistic regressions, or m
//! Gaussian naive Bayes classifiers ([`Learner`], both linfa), on the
//! vendored optical-digits data, teacher i trained only on subset i of the
//! secret-space assignment (paper §4.2.1, [`Assignment`]), served
//! over the Open Inference Protocol by the service
//! (`pacpriv_service::teachers::demo`). The only crate that uses linfa (and
//! the ndarray 0.16 it needs).
//!
//! # Invariants
//! - Deterministic: the same seed and m give the same split, subsets and
//!   models (linfa's L-BFGS fit and the naive Bayes moments have no
//!   randomness).
//! - Teacher i never sees a training example outside subset i, and no
//!   teacher sees the test split.

#![forbid(unsafe_code)]

pub mod digits;

use digits::{CLASSES, Example, FEATURES, Split};
use linfa::prelude::*;
use linfa_bayes::{GaussianNb, NaiveBayes};
use linfa_logistic::{MultiFittedLogisticRegression, MultiLogisticRegression};
use ndarray016::{Array1, Array2};
use pacpriv_privacy::secret_space::Assignment;

/// The default L2 penalty of each fit (`demo.regularisation`): ~91 % test
/// accuracy on half the training data, ~30 ms per model.
pub const DEFAULT_REGULARISATION: f64 = 1e-2;

/// Iteration cap of each fit.
const MAX_ITERATIONS: u64 = 50;

/// The naive Bayes fit's variance smoothing, a share of the largest
/// feature variance added to every variance: pixels that are constant in
/// a class's training examples (the digits' borders) would otherwise make
/// every other image's likelihood vanish for that class.
const VAR_SMOOTHING: f64 = 0.05;

/// What each teacher of an ensemble is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Learner {
    /// Multinomial logistic regression with this L2 penalty (~30 ms per
    /// teacher).
    Logistic {
        /// The L2 penalty.
        regularisation: f64,
    },
    /// Gaussian naive Bayes: per-class pixel means and variances, fit in
    /// closed form (well under a millisecond per teacher), less accurate.
    NaiveBayes,
}

/// Model names on the wire: `digits-000` … `digits-127`.
pub fn model_name(i: usize) -> String {
    format!("digits-{i:03}")
}

/// The demo server's stacked model: every teacher's output per example.
pub const STACKED_MODEL: &str = "digits-ensemble";

/// One trained teacher.
pub struct Teacher {
    model: Fitted,
}

enum Fitted {
    Logistic(MultiFittedLogisticRegression<f64, usize>),
    NaiveBayes(GaussianNb<f64, usize>),
}

impl Teacher {
    /// Trains on `examples` (features scaled to [0, 1]).
    ///
    /// # Errors
    /// linfa's fit error, as text.
    pub fn train(examples: &[&Example]) -> Result<Self, String> {
        Self::train_regularised(examples, DEFAULT_REGULARISATION)
    }

    /// Trains on `examples` with L2 penalty `alpha`.
    ///
    /// # Errors
    /// linfa's fit error, as text.
    pub fn train_regularised(examples: &[&Example], alpha: f64) -> Result<Self, String> {
        Self::fit(examples, Learner::Logistic { regularisation: alpha })
    }

    /// Trains a `learner` on `examples`.
    ///
    /// # Errors
    /// linfa's fit error, as text.
    pub fn fit(examples: &[&Example], learner: Learner) -> Result<Self, String> {
        let x = Array2::from_shape_fn((examples.len(), FEATURES), |(i, j)| f64::from(examples[i].pixels[j]) / 16.0);
        let y = Array1::from_iter(examples.iter().map(|e| e.digit));
        let data = Dataset::new(x, y);
        let model = match learner {
            Learner::Logistic { regularisation } => Fitted::Logistic(
                MultiLogisticRegression::default()
                    .alpha(regularisation)
                    .max_iterations(MAX_ITERATIONS)
                    .fit(&data)
                    .map_err(|e| e.to_string())?,
            ),
            Learner::NaiveBayes => Fitted::NaiveBayes(
                GaussianNb::params().var_smoothing(VAR_SMOOTHING).fit(&data).map_err(|e| e.to_string())?,
            ),
        };
        Ok(Teacher { model })
    }

    /// Class probabilities for each row of `pixels` (n × 64, raw 0–16
    /// counts), as n rows of [`CLASSES`] values indexed by digit.
    pub fn predict_proba(&self, pixels: &[f64]) -> Vec<[f64; CLASSES]> {
        let n = pixels.len() / FEATURES;
        let x = Array2::from_shape_fn((n, FEATURES), |(i, j)| pixels[i * FEATURES + j] / 16.0);
        let mut out = vec![[0.0; CLASSES]; n];
        match &self.model {
            Fitted::Logistic(model) => {
                let p = model.predict_probabilities(&x);
                for (row, probs) in out.iter_mut().zip(p.rows()) {
                    // linfa orders columns by the classes it saw; map back to digits.
                    for (&digit, &v) in model.classes().iter().zip(probs) {
                        if let Some(slot) = row.get_mut(digit) {
                            *slot = v;
                        }
                    }
                }
            }
            Fitted::NaiveBayes(model) => {
                // The joint log-likelihoods, normalised with the largest
                // subtracted first: they run to -10^3 and below, where
                // exponentiating first (linfa's predict_proba) gives 0/0.
                // Classes in digit order, so the sums are the same in
                // every process.
                let joint = model.joint_log_likelihood(x.view());
                let mut classes: Vec<(usize, &ndarray016::Array1<f64>)> = joint.iter().map(|(&&d, l)| (d, l)).collect();
                classes.sort_by_key(|(d, _)| *d);
                for (i, row) in out.iter_mut().enumerate() {
                    let top = classes.iter().map(|(_, l)| l[i]).fold(f64::NEG_INFINITY, f64::max);
                    if !top.is_finite() {
                        // An input so far from every class that no
                        // likelihood is finite (pixels of 10^150): no class
                        // is more likely than another.
                        let known = classes.len().max(1) as f64;
                        for (digit, _) in &classes {
                            if let Some(slot) = row.get_mut(*digit) {
                                *slot = 1.0 / known;
                            }
                        }
                        continue;
                    }
                    let total: f64 = classes.iter().map(|(_, l)| (l[i] - top).exp()).sum();
                    for (digit, l) in &classes {
                        if let Some(slot) = row.get_mut(*digit) {
                            *slot = (l[i] - top).exp() / total;
                        }
                    }
                }
            }
        }
        out
    }

    /// The most probable digit for one image (64 raw counts).
    pub fn predict(&self, pixels: &[f64]) -> usize {
        let probs = self.predict_proba(pixels);
        probs.first().map_or(0, |p| pacpriv_privacy::mechanism::argmax(p.iter().copied()))
    }
}

/// The trained ensemble and the data it came from.
pub struct Trained {
    /// Teacher i was trained on subset i.
    pub teachers: Vec<Teacher>,
    /// The split the teachers were trained on.
    pub split: Split,
    /// Which training examples each subset holds.
    pub assignment: Assignment,
}

impl Trained {
    /// Splits the data with `seed`, draws the m-subset assignment of the
    /// training split with `seed`, and trains the m teachers on all cores.
    ///
    /// # Errors
    /// An invalid m (odd, < 2) or a failed fit.
    pub fn train(m: usize, seed: u64) -> Result<Self, String> {
        Self::train_regularised(m, seed, DEFAULT_REGULARISATION)
    }

    /// As [`Trained::train`], each teacher fit with L2 penalty `alpha`.
    ///
    /// # Errors
    /// An invalid m (odd, < 2) or a failed fit.
    pub fn train_regularised(m: usize, seed: u64, alpha: f64) -> Result<Self, String> {
        Self::train_with_canaries(m, seed, alpha, 0)
    }

    /// As [`Trained::train_regularised`], with `canaries`
    /// ([`digits::canaries`]) appended to the training split — the last
    /// `canaries` points of the universe, each, like every point, in
    /// exactly m/2 subsets.
    ///
    /// # Errors
    /// An invalid m (odd, < 2) or a failed fit.
    pub fn train_with_canaries(m: usize, seed: u64, alpha: f64, canaries: usize) -> Result<Self, String> {
        Self::train_learner(m, seed, Learner::Logistic { regularisation: alpha }, canaries)
    }

    /// As [`Trained::train_with_canaries`], each teacher a `learner`.
    ///
    /// # Errors
    /// An invalid m (odd, < 2) or a failed fit.
    pub fn train_learner(m: usize, seed: u64, learner: Learner, canaries: usize) -> Result<Self, String> {
        let mut split = digits::split(seed)?;
        split.train.extend(digits::canaries(canaries, seed));
        let assignment = Assignment::from_seed(split.train.len(), m, seed).map_err(|e| e.to_string())?;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(m);
        let mut slots: Vec<Option<Result<Teacher, String>>> = (0..m).map(|_| None).collect();
        std::thread::scope(|scope| {
            for (t, chunk) in slots.chunks_mut(m.div_ceil(threads)).enumerate() {
                let (split, assignment) = (&split, &assignment);
                let first = t * m.div_ceil(threads);
                scope.spawn(move || {
                    for (k, slot) in chunk.iter_mut().enumerate() {
                        let members = assignment.members_of_subset(first + k);
                        let examples: Vec<&Example> = members.iter().map(|&i| &split.train[i]).collect();
                        *slot = Some(Teacher::fit(&examples, learner));
                    }
                });
            }
        });
        let teachers = slots
            .into_iter()
            .enumerate()
            .map(|(i, s)| s.unwrap_or_else(|| Err("not trained".into())).map_err(|e| format!("teacher {i}: {e}")))
            .collect::<Result<_, _>>()?;
        Ok(Trained { teachers, split, assignment })
    }

    /// Every teacher's label for each of `examples` (`[example][teacher]`),
    /// computed as a served teacher computes its `label` output for a
    /// one-example request (the fan-out's label mode reads exactly that).
    pub fn labels(&self, examples: &[Example]) -> Vec<Vec<usize>> {
        examples
            .iter()
            .map(|e| {
                let pixels: Vec<f64> = e.pixels.iter().map(|&p| f64::from(p)).collect();
                self.teachers.iter().map(|t| t.predict(&pixels)).collect()
            })
            .collect()
    }

    /// Trains one model on the whole training split: the paper's
    /// "non-private" baseline.
    ///
    /// # Errors
    /// A failed fit.
    pub fn full_data_model(&self) -> Result<Teacher, String> {
        Teacher::train(&self.split.train.iter().collect::<Vec<_>>())
    }
}

#[cfg(test)]
mod test;
