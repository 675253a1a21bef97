//! The curator's belief over which of the m subsets is the secret one
//! (paper Eq. 4, Lemma 3.2).
//!
//! Algorithm 1 is only private if the noise of query t is calibrated to the
//! exact posterior P_{t−1} that an optimal adversary holds after the
//! transcript; this module keeps that posterior.
//!
//! # Invariants
//! - Stored as natural-log weights normalised so that log Σ exp = 0: every
//!   log-weight is finite or −∞, never NaN or +∞, and at least one is finite.
//! - Every weight is strictly positive in exact arithmetic (a Gaussian
//!   likelihood never vanishes); a weight that underflows when exponentiated
//!   is still a member of the support. Only a log-weight that *overflows*
//!   (below −1.8·10³⁰⁸, a weight under e^(−10³⁰⁸)) saturates to −∞, i.e. weight
//!   0: its contribution to any covariance is far below the variance floor,
//!   and saturating instead of failing keeps the update infallible after
//!   the draw, so no error can depend on which subset is secret
//!   (`docs/accounting.md` §1.5).
//! - Updates add log-likelihoods and renormalise with log-sum-exp; nothing is
//!   exponentiated before normalising.
//! - Two rules compute the renormaliser L = log Σ_i exp(log w_i + ℓ_i)
//!   ([`UpdateRule`]); they agree to rounding and differ in the last bits.
//!   A journal records which rule each step used, because `pacpriv verify`
//!   replays the posterior bit for bit (`docs/privacy-core.md` §5).

use super::PrivacyError;
use ndarray::{Array1, ArrayView1};

/// How Eq. 4's renormaliser L = log Σ_i exp(log w_i + ℓ_i) is computed.
///
/// Label mode gives every teacher with the same label the same ℓ, so L only
/// needs each group's log-mass and one exponential per group
/// ([`UpdateRule::Grouped`]). The rules are equal in exact arithmetic; a
/// journal names the one each step used so that replay reproduces it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UpdateRule {
    /// Log-sum-exp over every subset (m exponentials). Every step journaled
    /// before the grouped rule existed, and vector mode.
    #[default]
    PerSubset,
    /// Subsets grouped by a public key (label mode: the teacher's label),
    /// numbered by first appearance, every subset of a group with the same
    /// ℓ; L = log Σ_g exp(ℓ_g + log-mass_g), the log-masses from
    /// [`Posterior::group_log_masses`].
    Grouped,
}

impl UpdateRule {
    /// The rule's number in a journal (0 = absent = [`UpdateRule::PerSubset`]).
    pub fn code(self) -> u32 {
        match self {
            UpdateRule::PerSubset => 0,
            UpdateRule::Grouped => 1,
        }
    }

    /// The rule numbered `code`; `None` for a number no release wrote.
    pub fn from_code(code: u32) -> Option<Self> {
        match code {
            0 => Some(UpdateRule::PerSubset),
            1 => Some(UpdateRule::Grouped),
            _ => None,
        }
    }
}

/// Subsets partitioned into groups that share one log-likelihood: `of[i]` is
/// subset i's group, groups numbered 0, 1, … in order of first appearance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Groups {
    of: Vec<usize>,
    count: usize,
}

impl Groups {
    /// Groups from any labelling (`key[i]` compared for equality), renumbered
    /// by first appearance. O(m·k) for k groups.
    pub fn by_key<K: PartialEq>(key: &[K]) -> Self {
        let mut firsts: Vec<&K> = Vec::new();
        let of = key
            .iter()
            .map(|x| match firsts.iter().position(|f| *f == x) {
                Some(g) => g,
                None => {
                    firsts.push(x);
                    firsts.len() - 1
                }
            })
            .collect();
        Groups { of, count: firsts.len() }
    }

    /// The group of each subset.
    pub fn of(&self) -> &[usize] {
        &self.of
    }

    /// Number of groups k.
    pub fn count(&self) -> usize {
        self.count
    }
}

/// A normalised posterior over m subsets, as log-weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Posterior {
    log_w: Array1<f64>,
}

impl Posterior {
    /// The prior P_S: uniform over m subsets (paper §4.2.1).
    ///
    /// # Errors
    /// [`PrivacyError::Domain`] if m = 0.
    pub fn uniform(m: usize) -> Result<Self, PrivacyError> {
        if m == 0 {
            return Err(PrivacyError::Domain("a posterior needs at least one subset".into()));
        }
        Ok(Posterior { log_w: Array1::from_elem(m, -(m as f64).ln()) })
    }

    /// A posterior from unnormalised log-weights (e.g. read back from a store).
    ///
    /// # Errors
    /// [`PrivacyError::NonFinite`] if any log-weight is NaN or +∞ or all are
    /// −∞, [`PrivacyError::Domain`] if empty.
    pub fn from_log_weights(log_w: Vec<f64>) -> Result<Self, PrivacyError> {
        check_log_weights(&log_w)?;
        let mut p = Posterior { log_w: Array1::from(log_w) };
        p.normalise();
        Ok(p)
    }

    /// Exactly the given normalised log-weights, as written by a store:
    /// resuming must not renormalise, or the restored session would drift
    /// (in the last bits) from the one that released the answers.
    ///
    /// # Errors
    /// As [`Posterior::from_log_weights`], and [`PrivacyError::Domain`] if
    /// the weights do not sum to 1 (within 1e−9 in log space).
    pub fn restore(log_w: Vec<f64>) -> Result<Self, PrivacyError> {
        check_log_weights(&log_w)?;
        let lse = log_sum_exp(log_w.iter().copied());
        if lse.abs() > 1e-9 {
            return Err(PrivacyError::Domain(format!("stored posterior is not normalised (log-sum {lse:e})")));
        }
        Ok(Posterior { log_w: Array1::from(log_w) })
    }

    /// Number of subsets m.
    pub fn len(&self) -> usize {
        self.log_w.len()
    }

    /// Always false: a posterior has at least one subset.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Normalised log-weights, log P_t(s_i).
    pub fn log_weights(&self) -> ArrayView1<'_, f64> {
        self.log_w.view()
    }

    /// Normalised weights P_t(s_i); tiny ones may underflow to 0.
    pub fn weights(&self) -> Array1<f64> {
        self.log_w.mapv(f64::exp)
    }

    /// log Σ_{i ∈ members} w_i: the log-probability of a set of subsets.
    /// Returns −∞ for an empty set.
    pub fn log_mass(&self, members: impl IntoIterator<Item = usize>) -> f64 {
        let xs: Vec<f64> = members.into_iter().map(|i| self.log_w[i]).collect();
        log_sum_exp(xs.iter().copied())
    }

    /// Applies Eq. 4: log w_i += log_lik_i, then renormalises. A sum that
    /// overflows to −∞ saturates there (weight 0, see the module invariants).
    ///
    /// The caller passes the log-likelihood of the release under each subset
    /// (−½ (r − M(s_i))ᵀ Σ⁺ (r − M(s_i)) up to a common constant, ≤ 0 for
    /// the mechanism's own likelihoods).
    ///
    /// # Errors
    /// [`PrivacyError::TeacherCount`] for a wrong length, and
    /// [`PrivacyError::NonFinite`] if a log-likelihood is NaN or +∞ or every
    /// weight would vanish; the posterior is then unchanged. The mechanism
    /// never triggers either: its likelihoods are finite or −∞, and the
    /// secret subset's is −½‖g‖², finite, so some weight always survives.
    pub fn update(&mut self, log_lik: ArrayView1<'_, f64>) -> Result<(), PrivacyError> {
        if log_lik.len() != self.len() {
            return Err(PrivacyError::TeacherCount { posterior: self.len(), teachers: log_lik.len() });
        }
        if log_lik.iter().any(|x| x.is_nan() || *x == f64::INFINITY) {
            return Err(PrivacyError::NonFinite("posterior update"));
        }
        // −∞ + anything finite or −∞ is −∞: saturation needs no special case.
        let mut next = &self.log_w + &log_lik;
        let lse = log_sum_exp(next.iter().copied());
        if !lse.is_finite() {
            return Err(PrivacyError::NonFinite("posterior update"));
        }
        next.mapv_inplace(|x| x - lse);
        self.log_w = next;
        Ok(())
    }

    /// Applies Eq. 4 with the renormaliser computed as `rule` says; `keys`
    /// (label mode: the teachers' labels) define the groups of
    /// [`UpdateRule::Grouped`] and are not read otherwise.
    ///
    /// # Errors
    /// As [`Posterior::update_grouped`].
    pub fn update_by<K: PartialEq>(
        &mut self,
        rule: UpdateRule,
        keys: &[K],
        log_lik: ArrayView1<'_, f64>,
    ) -> Result<(), PrivacyError> {
        match rule {
            UpdateRule::PerSubset => self.update(log_lik),
            UpdateRule::Grouped => self.update_grouped(&Groups::by_key(keys), log_lik),
        }
    }

    /// Eq. 4 under [`UpdateRule::Grouped`] from a per-subset vector, as
    /// replay applies a journaled step: each group's ℓ is its members'.
    ///
    /// # Errors
    /// As [`Posterior::update`], and [`PrivacyError::Shape`] if two subsets
    /// of one group have different ℓ; the posterior is then unchanged.
    pub fn update_grouped(&mut self, groups: &Groups, log_lik: ArrayView1<'_, f64>) -> Result<(), PrivacyError> {
        if log_lik.len() != self.len() {
            return Err(PrivacyError::TeacherCount { posterior: self.len(), teachers: log_lik.len() });
        }
        if groups.of().len() != self.len() {
            // E.g. a journaled grouped step without labels to group by.
            return Err(PrivacyError::TeacherCount { posterior: self.len(), teachers: groups.of().len() });
        }
        let mut group_lik: Vec<Option<f64>> = vec![None; groups.count()];
        for (&g, &l) in groups.of().iter().zip(log_lik) {
            match group_lik[g] {
                None => group_lik[g] = Some(l),
                Some(first) if first.to_bits() == l.to_bits() => {}
                Some(_) => {
                    return Err(PrivacyError::Shape(format!("group {g} was given different log-likelihoods")));
                }
            }
        }
        let group_lik: Vec<f64> = group_lik.into_iter().map(|l| l.unwrap_or_default()).collect(); // every group has a member
        let masses = self.group_log_masses(groups);
        self.update_groups(groups, &group_lik, &masses)
    }

    /// log Σ_{i ∈ g} w_i for every group g: around the group's largest
    /// log-weight, summed in subset order, so the value is a function of the
    /// posterior and the groups alone. −∞ for a group whose weights are all 0.
    pub fn group_log_masses(&self, groups: &Groups) -> Vec<f64> {
        let k = groups.count();
        let mut max = vec![f64::NEG_INFINITY; k];
        for (&g, &lw) in groups.of().iter().zip(&self.log_w) {
            max[g] = max[g].max(lw);
        }
        let mut sum = vec![0.0; k];
        for (&g, &lw) in groups.of().iter().zip(&self.log_w) {
            if max[g] != f64::NEG_INFINITY {
                sum[g] += (lw - max[g]).exp();
            }
        }
        max.iter().zip(&sum).map(|(&m, &s)| if m == f64::NEG_INFINITY { m } else { m + s.ln() }).collect()
    }

    /// Eq. 4 under [`UpdateRule::Grouped`] when the groups are known:
    /// `group_lik[g]` is the log-likelihood of every subset in g and
    /// `log_masses` what [`Posterior::group_log_masses`] returned for
    /// `groups` on this posterior. log w_i += ℓ_g − L with
    /// L = log Σ_g exp(ℓ_g + log-mass_g): k exponentials instead of m.
    ///
    /// # Errors
    /// As [`Posterior::update`]; the posterior is then unchanged.
    pub fn update_groups(
        &mut self,
        groups: &Groups,
        group_lik: &[f64],
        log_masses: &[f64],
    ) -> Result<(), PrivacyError> {
        if groups.of().len() != self.len() {
            return Err(PrivacyError::TeacherCount { posterior: self.len(), teachers: groups.of().len() });
        }
        if group_lik.len() != groups.count() || log_masses.len() != groups.count() {
            return Err(PrivacyError::Shape(format!(
                "{} groups with {} likelihoods and {} masses",
                groups.count(),
                group_lik.len(),
                log_masses.len()
            )));
        }
        if group_lik.iter().any(|x| x.is_nan() || *x == f64::INFINITY) {
            return Err(PrivacyError::NonFinite("posterior update"));
        }
        let lse = log_sum_exp(group_lik.iter().zip(log_masses).map(|(l, m)| l + m));
        if !lse.is_finite() {
            return Err(PrivacyError::NonFinite("posterior update"));
        }
        for (lw, &g) in self.log_w.iter_mut().zip(groups.of()) {
            *lw = (*lw + group_lik[g]) - lse;
        }
        Ok(())
    }

    fn normalise(&mut self) {
        let lse = log_sum_exp(self.log_w.iter().copied());
        self.log_w.mapv_inplace(|x| x - lse);
    }
}

fn check_log_weights(log_w: &[f64]) -> Result<(), PrivacyError> {
    if log_w.is_empty() {
        return Err(PrivacyError::Domain("a posterior needs at least one subset".into()));
    }
    if log_w.iter().any(|x| x.is_nan() || *x == f64::INFINITY) || !log_w.iter().any(|x| x.is_finite()) {
        return Err(PrivacyError::NonFinite("posterior log-weights"));
    }
    Ok(())
}

/// log Σ exp(x_i), computed around the maximum so that no term overflows and
/// the largest term is exact. −∞ for an empty input.
pub fn log_sum_exp(xs: impl IntoIterator<Item = f64> + Clone) -> f64 {
    let max = xs.clone().into_iter().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY || !max.is_finite() {
        return max;
    }
    let sum: f64 = xs.into_iter().map(|x| (x - max).exp()).sum();
    max + sum.ln()
}

#[cfg(test)]
mod test;
