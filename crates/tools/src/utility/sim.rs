//! The computations behind `pacpriv utility`, without I/O: the real
//! mechanism ([`mechanism::answer`]) run over teacher votes held in memory,
//! and the closed forms its results are checked against.
//!
//! # Invariants
//! - Every answer goes through [`mechanism::answer`] with a fresh
//!   [`SessionState`] per trial (uniform posterior, empty ledger), exactly as
//!   a new session of the service would; nothing here recomputes noise.
//! - Refusal is the mechanism's own [`PrivacyError::BudgetExhausted`].

use pacpriv_privacy::ledger::{Ledger, Policy};
use pacpriv_privacy::mechanism::{self, SecretIndex, SessionState, TeacherOutputs};
use pacpriv_privacy::posterior::Posterior;
use pacpriv_privacy::{Nats, PrivacyError};
use rand::seq::SliceRandom;
use rand::{CryptoRng, RngExt};

/// Every teacher's label for every held-out example, and the truth.
#[derive(Clone, Debug)]
pub struct Votes {
    /// `outputs[j]`: the m teachers' labels for example j, in subset order.
    outputs: Vec<TeacherOutputs>,
    /// `truth[j]`: example j's true class.
    truth: Vec<usize>,
    /// Number of teachers.
    m: usize,
}

impl Votes {
    /// `labels[j][i]` is teacher i's label for example j, whose true class
    /// is `truth[j]`; `classes` is d.
    ///
    /// # Errors
    /// [`PrivacyError::Shape`] for no examples, no teachers, rows of unequal
    /// length, a truth or label ≥ `classes`.
    pub fn new(labels: Vec<Vec<usize>>, truth: Vec<usize>, classes: usize) -> Result<Self, PrivacyError> {
        if labels.is_empty() || labels.len() != truth.len() {
            return Err(PrivacyError::Shape(format!(
                "{} label rows for {} examples (need at least one)",
                labels.len(),
                truth.len()
            )));
        }
        let m = labels.first().map_or(0, Vec::len);
        if m == 0 || labels.iter().any(|row| row.len() != m) {
            return Err(PrivacyError::Shape("every example needs one label from each of the same teachers".into()));
        }
        if let Some(&t) = truth.iter().find(|&&t| t >= classes) {
            return Err(PrivacyError::Shape(format!("true class {t} is not below d = {classes}")));
        }
        let outputs: Vec<TeacherOutputs> =
            labels.into_iter().map(|labels| TeacherOutputs::Labels { labels, classes }).collect();
        for o in &outputs {
            o.validate()?;
        }
        Ok(Votes { outputs, truth, m })
    }

    /// Number of held-out examples n.
    pub fn len(&self) -> usize {
        self.truth.len()
    }

    /// Always false: [`Votes::new`] needs an example.
    pub fn is_empty(&self) -> bool {
        self.truth.is_empty()
    }

    /// Number of teachers m.
    pub fn teachers(&self) -> usize {
        self.m
    }

    /// Examples on which all m teachers agree: answered exactly, and free
    /// under [`Policy::Contested`].
    pub fn unanimous(&self) -> usize {
        self.outputs.iter().filter(|o| o.unanimous()).count()
    }

    /// Examples on which all m teachers agree on the true class. Every
    /// private answer to them is correct, whatever b: a floor under the
    /// private accuracy.
    pub fn unanimous_correct(&self) -> usize {
        self.outputs.iter().zip(&self.truth).filter(|(o, t)| o.unanimous() && label_of(o, 0) == Some(**t)).count()
    }

    /// Accuracy (a fraction) of teacher i alone, i.e. of b = ∞ when s* = i.
    pub fn teacher_accuracy(&self, i: usize) -> f64 {
        let correct = self.outputs.iter().zip(&self.truth).filter(|(o, t)| label_of(o, i) == Some(**t)).count();
        correct as f64 / self.len() as f64
    }

    /// The b = ∞ column: the serving teacher alone (no noise), averaged
    /// over the uniformly drawn secret, i.e. exactly the mean of the m
    /// teachers' accuracies.
    pub fn serving_accuracy(&self) -> f64 {
        (0..self.m).map(|i| self.teacher_accuracy(i)).sum::<f64>() / self.m as f64
    }
}

/// Teacher i's label in `o`, if `o` holds labels and i is a teacher.
fn label_of(o: &TeacherOutputs, i: usize) -> Option<usize> {
    match o {
        TeacherOutputs::Labels { labels, .. } => labels.get(i).copied(),
        TeacherOutputs::Vectors(_) => None,
    }
}

/// A fresh session: uniform posterior, nothing spent.
fn fresh_session(m: usize, per_query: Nats, limit: Nats, policy: Policy) -> Result<SessionState, PrivacyError> {
    Ok(SessionState { posterior: Posterior::uniform(m)?, ledger: Ledger::new(per_query, limit, policy)? })
}

/// s* drawn uniformly from `rng`, as the service draws it on first start.
fn draw_secret<R: CryptoRng + ?Sized>(m: usize, rng: &mut R) -> Result<SecretIndex, PrivacyError> {
    SecretIndex::new(rng.random_range(0..m), m)
}

/// One trial of the paper's §6.2 experiment: a fresh session with a secret
/// drawn from `rng` answers every held-out example once, in an order drawn
/// from `rng`, at `per_query` nats each. Returns the number answered
/// correctly (all n are answered).
///
/// As in the paper no total budget is fixed (§6.2 treats b as the security
/// parameter), so the ledger's limit is the largest finite value and the
/// policy does not matter: it changes what an answer costs, not its noise.
///
/// # Errors
/// A calibration error from the mechanism; [`PrivacyError::PerQueryTooSmall`].
pub fn accuracy_trial<R: CryptoRng + ?Sized>(
    votes: &Votes,
    per_query: Nats,
    rng: &mut R,
) -> Result<usize, PrivacyError> {
    let unlimited = Nats::new(f64::MAX)?;
    let mut state = fresh_session(votes.m, per_query, unlimited, Policy::Paper)?;
    let secret = draw_secret(votes.m, rng)?;
    let mut order: Vec<usize> = (0..votes.len()).collect();
    order.shuffle(rng);
    let mut correct = 0;
    for j in order {
        let answer = mechanism::answer(&mut state, &votes.outputs[j], secret, None, rng)?;
        if answer.label == votes.truth[j] {
            correct += 1;
        }
    }
    Ok(correct)
}

/// What `privacy.policy = "unanimous_only"` gives: a fresh session with a
/// secret drawn from `rng`, under its limit `budget`, asked every held-out
/// example once through the real mechanism. Returns (answered, answered
/// correctly, MI spent); every other query is refused
/// [`PrivacyError::Contested`], so nothing is ever charged and no order or
/// secret changes the result.
///
/// # Errors
/// A mechanism error other than the refusal.
pub fn unanimous_only_run<R: CryptoRng + ?Sized>(
    votes: &Votes,
    per_query: Nats,
    budget: Nats,
    rng: &mut R,
) -> Result<(usize, usize, Nats), PrivacyError> {
    let mut state = fresh_session(votes.m, per_query, budget, Policy::UnanimousOnly)?;
    let secret = draw_secret(votes.m, rng)?;
    let (mut answered, mut correct) = (0, 0);
    for (outputs, truth) in votes.outputs.iter().zip(&votes.truth) {
        match mechanism::answer(&mut state, outputs, secret, None, rng) {
            Ok(a) => {
                answered += 1;
                correct += usize::from(a.label == *truth);
            }
            Err(PrivacyError::Contested) => {}
            Err(e) => return Err(e),
        }
    }
    Ok((answered, correct, state.ledger.spent()))
}

/// How a run until refusal ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Answers released before the run stopped.
    pub answered: u64,
    /// True if it stopped at the first refusal, false if it reached the cap
    /// without one.
    pub refused: bool,
}

/// A fresh session with a secret drawn from `rng`, limit `budget` and
/// `policy` answers the held-out examples in random passes (a new order
/// from `rng` each pass) until the mechanism first refuses, or until `cap`
/// answers.
///
/// # Errors
/// A calibration error; [`PrivacyError::PerQueryTooSmall`].
pub fn answers_until_refusal<R: CryptoRng + ?Sized>(
    votes: &Votes,
    per_query: Nats,
    budget: Nats,
    policy: Policy,
    cap: u64,
    rng: &mut R,
) -> Result<Refusal, PrivacyError> {
    let mut state = fresh_session(votes.m, per_query, budget, policy)?;
    let secret = draw_secret(votes.m, rng)?;
    let mut order: Vec<usize> = (0..votes.len()).collect();
    let mut answered = 0;
    while answered < cap {
        order.shuffle(rng);
        for &j in &order {
            if answered == cap {
                break;
            }
            match mechanism::answer(&mut state, &votes.outputs[j], secret, None, rng) {
                Ok(_) => answered += 1,
                Err(PrivacyError::BudgetExhausted { .. }) => return Ok(Refusal { answered, refused: true }),
                Err(e) => return Err(e),
            }
        }
    }
    Ok(Refusal { answered, refused: false })
}

/// What the `contested` policy must give when `charged` answers at b fit in
/// the budget (⌊B/b⌋), the held-out split has n examples of which
/// `unanimous` are free, and examples come in independent uniformly random
/// passes. `None` when every example is unanimous: then nothing is ever
/// charged and the budget never runs out.
///
/// The refusal comes at the (K+1)-th contested query, K = `charged`. With
/// c = n − `unanimous` contested examples per pass, K = q·c + r (0 ≤ r < c):
/// q whole passes, then the (r+1)-th contested example of pass q+1, whose
/// position in that pass lies in [r+1, r+1+`unanimous`] and is on average
/// (r+1)(n+1)/(c+1) (order statistics of a uniform permutation). The answers
/// before it number one less.
pub fn contested_forecast(n: u64, unanimous: u64, charged: u64) -> Option<Forecast> {
    let contested = n.checked_sub(unanimous).filter(|&c| c > 0)?;
    let (q, r) = (charged / contested, charged % contested);
    let low = q.saturating_mul(n).saturating_add(r);
    let expected = q as f64 * n as f64 + (r + 1) as f64 * (n + 1) as f64 / (contested + 1) as f64 - 1.0;
    Some(Forecast { low, high: low.saturating_add(unanimous), expected })
}

/// The distribution of the `contested` count over random orders.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Forecast {
    /// Fewest answers before refusal (every unanimous example of the last
    /// pass comes after the refused one).
    pub low: u64,
    /// Most answers before refusal (all of them come before it).
    pub high: u64,
    /// The exact mean.
    pub expected: f64,
}

/// Mean, standard error and range of a sample.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Arithmetic mean.
    pub mean: f64,
    /// Standard error of the mean (sample standard deviation / √n); `None`
    /// with fewer than two values.
    pub se: Option<f64>,
    /// Smallest value.
    pub min: f64,
    /// Largest value.
    pub max: f64,
}

/// Summarises `xs`; `None` if it is empty.
pub fn summarize(xs: &[f64]) -> Option<Summary> {
    if xs.is_empty() {
        return None;
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let se = (xs.len() > 1).then(|| {
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        (var / n).sqrt()
    });
    let min = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Some(Summary { mean, se, min, max })
}

/// Whether `per_query` is usable at all (b ≥ the calibration minimum), so
/// that a bad `--per-query-mi` is reported before the teachers are trained.
///
/// # Errors
/// [`PrivacyError::PerQueryTooSmall`].
pub fn check_per_query(per_query: Nats) -> Result<(), PrivacyError> {
    Ledger::new(per_query, per_query, Policy::Paper).map(|_| ())
}
