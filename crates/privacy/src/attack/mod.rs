//! The optimal membership-inference decision rule, paper Prop. 6.1 (proof:
//! Appendix B.4). It is what the audit adversary plays: given the posterior
//! P_T over subsets after a transcript, predict that point u is a member iff
//! Pr(u ∈ S | transcript) = Σ_i 1{u ∈ S_i} P_T(S_i) > ½.
//!
//! The posterior it needs is the curator's own (Lemma 3.2: P_t is the exact
//! posterior given the transcript), which an adversary who knows the
//! teachers can recompute from the releases it sees ([`observe_label_release`]).

use super::label;
use super::posterior::Posterior;
use super::secret_space::Assignment;
use super::{Nats, PrivacyError};

/// The share of all points of the universe whose membership in subset
/// `truth` the rule above gets right: the empirical membership-inference
/// accuracy of paper §6.3 (the experimenter knows the truth; the adversary
/// does not use it).
pub fn accuracy(posterior: &Posterior, assignment: &Assignment, truth: usize) -> f64 {
    let n = assignment.n();
    let correct = (0..n)
        .filter(|&u| predict_member(posterior, assignment.subsets_of_point(u)) == assignment.contains(truth, u))
        .count();
    correct as f64 / n.max(1) as f64
}

/// The probability, under the posterior, that the rule above is right,
/// averaged over all points of the universe: Σ_u max(p_u, 1 − p_u) / n with
/// p_u = Pr(u ∈ S | transcript). It needs no knowledge of the truth. Since
/// the posterior is the exact one (Lemma 3.2), its expectation over
/// transcripts equals the expected [`accuracy`] — the quantity Eq. 2 bounds
/// — but one run's value scatters far less: the guesses of all points hinge
/// on the same posterior, so near the prior the raw accuracy of one run
/// swings with tilts the posterior itself considers insignificant.
pub fn expected_accuracy(posterior: &Posterior, assignment: &Assignment) -> f64 {
    let n = assignment.n();
    let total: f64 = (0..n)
        .map(|u| {
            let p = membership_probability(posterior, assignment.subsets_of_point(u));
            p.max(1.0 - p)
        })
        .sum();
    total / n.max(1) as f64
}

/// Relative floor of one step's log-likelihoods: a subset 10⁶ nats behind
/// the most likely one has weight e^(−10⁶) = 0 in `f64` either way, and the
/// floor keeps every log-weight finite (which [`Posterior::update`] needs)
/// when a rounded release makes some subset astronomically unlikely.
const LOG_LIKELIHOOD_FLOOR: f64 = 1e6;

/// One step of Eq. 4 as the adversary plays it (label mode): given its
/// posterior, every teacher's label for the query (it knows the teachers),
/// the per-query budget b and the observed release r, calibrate Σ_t exactly
/// as Algorithm 1 does and update the posterior with r's likelihood under
/// each subset. A unanimous query leaves the posterior unchanged, as it does
/// the curator's.
///
/// `rounding` is how far each coordinate of the observed r may be from the
/// release: 0 for the exact r, half of [`super::grid::PUBLISHED_GRID`]
/// for what the service publishes ([`super::mechanism::Answer::published`]). With the exact r this reproduces the
/// curator's posterior; with the published r it learns slightly less
/// (directions whose noise is below the grid carry nothing after rounding).
///
/// # Errors
/// Calibration errors and a malformed r; the posterior is then unchanged.
pub fn observe_label_release(
    posterior: &mut Posterior,
    labels: &[usize],
    classes: usize,
    b: Nats,
    r: &[f64],
    rounding: f64,
) -> Result<(), PrivacyError> {
    let cal = label::calibrate(posterior, labels, classes, b)?;
    if cal.unanimous() {
        return Ok(());
    }
    let mut log_lik = cal.observed_teacher_log_likelihoods(r, rounding)?;
    let best = log_lik.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    log_lik.mapv_inplace(|x| x.max(best - LOG_LIKELIHOOD_FLOOR));
    posterior.update(log_lik.view())
}

/// Pr(u ∈ S | transcript) for a point contained in the given subsets.
pub fn membership_probability(posterior: &Posterior, subsets_containing: &[usize]) -> f64 {
    posterior.log_mass(subsets_containing.iter().copied()).exp().min(1.0)
}

/// The Bayes-optimal guess: member iff the posterior membership
/// probability exceeds ½, i.e. iff the mass of the subsets containing the
/// point exceeds the mass of the others (compared directly, so that an exact
/// tie such as the uniform prior is not decided by rounding).
pub fn predict_member(posterior: &Posterior, subsets_containing: &[usize]) -> bool {
    let mut inside = vec![false; posterior.len()];
    for &i in subsets_containing {
        if let Some(slot) = inside.get_mut(i) {
            *slot = true;
        }
    }
    let outside = inside.iter().enumerate().filter(|(_, m)| !**m).map(|(i, _)| i);
    posterior.log_mass(subsets_containing.iter().copied()) > posterior.log_mass(outside)
}

#[cfg(test)]
mod test;
