//! The optimal membership-inference decision rule, paper Prop. 6.1 (proof:
//! Appendix B.4). It is what the audit adversary plays: given the posterior
//! P_T over subsets after a transcript, predict that point u is a member iff
//! Pr(u ∈ S | transcript) = Σ_i 1{u ∈ S_i} P_T(S_i) > ½.

use super::posterior::Posterior;

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
