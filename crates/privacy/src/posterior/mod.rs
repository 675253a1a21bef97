//! The curator's belief over which of the m subsets is the secret one
//! (paper Eq. 4, Lemma 3.2).
//!
//! Algorithm 1 is only private if the noise of query t is calibrated to the
//! exact posterior P_{t−1} that an optimal adversary holds after the
//! transcript; this module keeps that posterior.
//!
//! # Invariants
//! - Held in one of two [`Form`]s, and a store keeps the form as it is:
//!   natural-log weights normalised so that log Σ exp = 0 (the prior,
//!   vector mode, and label mode before 2026-11-26), or linear weights up
//!   to a common factor (label mode's [`UpdateRule::Linear`]).
//! - Log form: every log-weight is finite or −∞, never NaN or +∞, and at
//!   least one is finite. A weight that underflows when exponentiated is
//!   still a member of the support; only a log-weight that *overflows*
//!   (below −1.8·10³⁰⁸) saturates to −∞, i.e. weight 0: its contribution
//!   to any covariance is far below the variance floor, and saturating
//!   instead of failing keeps the update infallible after the draw, so no
//!   error can depend on which subset is secret (`docs/assurance/accounting.md` §1.5).
//! - Linear form: every weight is finite and ≥ 0, at least one is > 0, and
//!   each update rescales so that the largest group mass is ≈ 1. A weight
//!   below 2⁻¹⁰⁷⁴·m of the largest is 0 and stays 0 — the same saturation,
//!   at a relative weight the variance floor covers (`docs/assurance/privacy-core.md`
//!   §5).
//! - The update rules ([`UpdateRule`]) agree to rounding and differ in the
//!   last bits. A journal records which rule each step used, because
//!   `pacpriv verify` replays the posterior bit for bit
//!   (`docs/assurance/privacy-core.md` §5).

use super::PrivacyError;
use ndarray::{Array1, ArrayView1};

/// How Eq. 4 is applied.
///
/// Label mode gives every teacher with the same label the same ℓ, so the
/// renormaliser only needs each group's mass ([`UpdateRule::Grouped`]), and
/// in linear form an update is one exponential per group and one multiply
/// per subset ([`UpdateRule::Linear`]). The rules are equal in exact
/// arithmetic; a journal names the one each step used so that replay
/// reproduces it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UpdateRule {
    /// Log form, log-sum-exp over every subset (m exponentials). Every step
    /// journaled before the grouped rule existed, and vector mode.
    #[default]
    PerSubset,
    /// Log form, subsets grouped by a public key (label mode: the teacher's
    /// label), numbered by first appearance, every subset of a group with
    /// the same ℓ; L = log Σ_g exp(ℓ_g + log-mass_g). Label mode from
    /// 2026-11-25 to 2026-11-26.
    Grouped,
    /// Linear form, the groups of [`UpdateRule::Grouped`]: w_i ← w_i·f_g
    /// with f_g = exp(ℓ_g − c) for subset i's group g, where c = max over
    /// groups with weight of (ℓ_g + log of the group's mass), so the
    /// largest new group mass is ≈ 1 ([`Posterior::update_linear`]). A
    /// log-form posterior is first converted (w_i = exp(log w_i − max)).
    /// Label mode since 2026-11-26.
    Linear,
}

impl UpdateRule {
    /// The rule's number in a journal (0 = absent = [`UpdateRule::PerSubset`]).
    pub fn code(self) -> u32 {
        match self {
            UpdateRule::PerSubset => 0,
            UpdateRule::Grouped => 1,
            UpdateRule::Linear => 2,
        }
    }

    /// The rule numbered `code`; `None` for a number no release wrote.
    pub fn from_code(code: u32) -> Option<Self> {
        match code {
            0 => Some(UpdateRule::PerSubset),
            1 => Some(UpdateRule::Grouped),
            2 => Some(UpdateRule::Linear),
            _ => None,
        }
    }
}

/// The exact numbers a posterior is held in. A store writes them as they
/// are, and resuming from them continues bit for bit where the session
/// left off.
#[derive(Clone, Debug, PartialEq)]
pub enum Form {
    /// log P(s_i), normalised: log Σ exp = 0.
    Log(Vec<f64>),
    /// P(s_i) = w_i / Σ_j w_j.
    Linear(Vec<f64>),
}

impl Form {
    /// The numbers, whichever form.
    pub fn values(&self) -> &[f64] {
        match self {
            Form::Log(v) | Form::Linear(v) => v,
        }
    }

    /// (log-weights, weights), one of them empty: the two fields a record
    /// or an export keeps the form in.
    pub fn to_fields(&self) -> (Vec<f64>, Vec<f64>) {
        match self {
            Form::Log(v) => (v.clone(), Vec::new()),
            Form::Linear(v) => (Vec::new(), v.clone()),
        }
    }

    /// The form kept in those two fields; `None` unless exactly one of
    /// them holds numbers.
    pub fn from_fields(log_weights: Vec<f64>, weights: Vec<f64>) -> Option<Self> {
        match (log_weights.is_empty(), weights.is_empty()) {
            (false, true) => Some(Form::Log(log_weights)),
            (true, false) => Some(Form::Linear(weights)),
            _ => None,
        }
    }

    /// The same form with the same bits (−0.0 ≠ 0.0, NaN = NaN).
    pub fn same_bits(&self, other: &Form) -> bool {
        let bits = |f: &Form| f.values().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        std::mem::discriminant(self) == std::mem::discriminant(other) && bits(self) == bits(other)
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

/// A normalised posterior over m subsets.
#[derive(Clone, Debug, PartialEq)]
pub struct Posterior {
    form: Form,
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
        Ok(Posterior { form: Form::Log(vec![-(m as f64).ln(); m]) })
    }

    /// A posterior from unnormalised log-weights.
    ///
    /// # Errors
    /// [`PrivacyError::NonFinite`] if any log-weight is NaN or +∞ or all are
    /// −∞, [`PrivacyError::Domain`] if empty.
    pub fn from_log_weights(mut log_w: Vec<f64>) -> Result<Self, PrivacyError> {
        check_log_weights(&log_w)?;
        let lse = log_sum_exp(log_w.iter().copied());
        log_w.iter_mut().for_each(|x| *x -= lse);
        Ok(Posterior { form: Form::Log(log_w) })
    }

    /// Exactly the given form, as written by a store: resuming must not
    /// renormalise, or the restored session would drift (in the last bits)
    /// from the one that released the answers.
    ///
    /// # Errors
    /// As [`Posterior::from_log_weights`], and [`PrivacyError::Domain`] if
    /// log-weights do not sum to 1 (within 1e−9 in log space);
    /// [`PrivacyError::NonFinite`] if linear weights are negative, NaN or
    /// ∞, all 0, or sum to ∞.
    pub fn restore(form: Form) -> Result<Self, PrivacyError> {
        match &form {
            Form::Log(log_w) => {
                check_log_weights(log_w)?;
                let lse = log_sum_exp(log_w.iter().copied());
                if lse.abs() > 1e-9 {
                    return Err(PrivacyError::Domain(format!("stored posterior is not normalised (log-sum {lse:e})")));
                }
            }
            Form::Linear(w) => {
                if w.is_empty() {
                    return Err(PrivacyError::Domain("a posterior needs at least one subset".into()));
                }
                let bad = |x: &f64| !x.is_finite() || *x < 0.0;
                if w.iter().any(bad) || !w.iter().any(|x| *x > 0.0) || !w.iter().sum::<f64>().is_finite() {
                    return Err(PrivacyError::NonFinite("posterior weights"));
                }
            }
        }
        Ok(Posterior { form })
    }

    /// The numbers the posterior is held in, for a store and for comparing
    /// two posteriors bit for bit.
    pub fn form(&self) -> &Form {
        &self.form
    }

    /// Number of subsets m.
    pub fn len(&self) -> usize {
        self.form.values().len()
    }

    /// Always false: a posterior has at least one subset.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Normalised log-weights, log P_t(s_i).
    pub fn log_weights(&self) -> Array1<f64> {
        match &self.form {
            Form::Log(log_w) => Array1::from(log_w.clone()),
            Form::Linear(w) => {
                let log_total = w.iter().sum::<f64>().ln();
                w.iter().map(|x| x.ln() - log_total).collect()
            }
        }
    }

    /// Normalised weights P_t(s_i); in log form tiny ones may underflow to 0.
    pub fn weights(&self) -> Array1<f64> {
        match &self.form {
            Form::Log(log_w) => log_w.iter().map(|x| x.exp()).collect(),
            Form::Linear(w) => {
                let total: f64 = w.iter().sum();
                w.iter().map(|x| x / total).collect()
            }
        }
    }

    /// log Σ_{i ∈ members} P(s_i): the log-probability of a set of subsets.
    /// Returns −∞ for an empty set.
    pub fn log_mass(&self, members: impl IntoIterator<Item = usize>) -> f64 {
        match &self.form {
            Form::Log(log_w) => log_sum_exp(members.into_iter().map(|i| log_w[i]).collect::<Vec<_>>()),
            Form::Linear(w) => {
                let part: f64 = members.into_iter().map(|i| w[i]).sum();
                part.ln() - w.iter().sum::<f64>().ln()
            }
        }
    }

    /// Σ_{i ∈ g} P(s_i) for every group g, up to a common positive factor
    /// (divide by their sum for probabilities): the masses of the linear
    /// weights, a log-form posterior's as it converts to them
    /// (w_i = exp(log w_i − max log w), m exponentials). A function of the
    /// posterior and the groups alone; the largest is > 0.
    pub fn group_masses(&self, groups: &Groups) -> Vec<f64> {
        // Four partial sums per group, so that consecutive subsets of one
        // group do not wait on each other's addition.
        let mut lanes = vec![[0.0f64; 4]; groups.count()];
        for (j, (&g, &x)) in groups.of().iter().zip(self.linear_weights().iter()).enumerate() {
            lanes[g][j % 4] += x;
        }
        lanes.iter().map(|l| (l[0] + l[1]) + (l[2] + l[3])).collect()
    }

    /// The linear form's numbers (converted from log form:
    /// w_i = exp(log w_i − max log w)).
    fn linear_weights(&self) -> std::borrow::Cow<'_, [f64]> {
        match &self.form {
            Form::Linear(w) => std::borrow::Cow::Borrowed(w),
            Form::Log(log_w) => {
                let max = log_w.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                std::borrow::Cow::Owned(log_w.iter().map(|lw| (lw - max).exp()).collect())
            }
        }
    }

    /// Applies Eq. 4 by [`UpdateRule::PerSubset`]: log w_i += log_lik_i,
    /// then renormalises; the result is in log form. A sum that overflows to
    /// −∞ saturates there (weight 0, see the module invariants).
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
        check_likelihoods(log_lik.iter())?;
        // −∞ + anything finite or −∞ is −∞: saturation needs no special case.
        let mut next: Vec<f64> = self.log_form().iter().zip(log_lik).map(|(lw, l)| lw + l).collect();
        let lse = log_sum_exp(next.iter().copied());
        if !lse.is_finite() {
            return Err(PrivacyError::NonFinite("posterior update"));
        }
        next.iter_mut().for_each(|x| *x -= lse);
        self.form = Form::Log(next);
        Ok(())
    }

    /// Applies Eq. 4 by `rule`; `keys` (label mode: the teachers' labels)
    /// define the groups of [`UpdateRule::Grouped`] and
    /// [`UpdateRule::Linear`] and are not read otherwise. This is how replay
    /// applies a journaled step: each group's ℓ is its members'.
    ///
    /// # Errors
    /// As [`Posterior::update`], [`PrivacyError::TeacherCount`] if the keys
    /// do not fit, and [`PrivacyError::Shape`] if two subsets of one group
    /// have different ℓ; the posterior is then unchanged.
    pub fn update_by<K: PartialEq>(
        &mut self,
        rule: UpdateRule,
        keys: &[K],
        log_lik: ArrayView1<'_, f64>,
    ) -> Result<(), PrivacyError> {
        match rule {
            UpdateRule::PerSubset => self.update(log_lik),
            UpdateRule::Grouped => {
                let groups = Groups::by_key(keys);
                let group_lik = self.group_likelihoods(&groups, log_lik)?;
                self.update_grouped(&groups, &group_lik)
            }
            UpdateRule::Linear => {
                let groups = Groups::by_key(keys);
                let group_lik = self.group_likelihoods(&groups, log_lik)?;
                let masses = self.group_masses(&groups);
                self.update_linear(&groups, &group_lik, &masses)
            }
        }
    }

    /// Each group's ℓ from a per-subset vector, refusing a group whose
    /// members were given different values.
    fn group_likelihoods(&self, groups: &Groups, log_lik: ArrayView1<'_, f64>) -> Result<Vec<f64>, PrivacyError> {
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
        Ok(group_lik.into_iter().map(|l| l.unwrap_or_default()).collect()) // every group has a member
    }

    /// Eq. 4 by [`UpdateRule::Grouped`]: `group_lik[g]` is the
    /// log-likelihood of every subset in g. log w_i += ℓ_g − L with
    /// L = log Σ_g exp(ℓ_g + log-mass_g), each log-mass taken around the
    /// group's own largest weight so that a group far below the largest
    /// weight is not lost. The result is in log form.
    ///
    /// # Errors
    /// As [`Posterior::update`]; the posterior is then unchanged.
    pub fn update_grouped(&mut self, groups: &Groups, group_lik: &[f64]) -> Result<(), PrivacyError> {
        self.check_groups(groups, group_lik)?;
        let log_w = self.log_form();
        let log_masses = group_log_masses(&log_w, groups);
        let lse = log_sum_exp(group_lik.iter().zip(&log_masses).map(|(l, m)| l + m));
        if !lse.is_finite() {
            return Err(PrivacyError::NonFinite("posterior update"));
        }
        let next = log_w.iter().zip(groups.of()).map(|(lw, &g)| (lw + group_lik[g]) - lse).collect();
        self.form = Form::Log(next);
        Ok(())
    }

    /// Eq. 4 by [`UpdateRule::Linear`]: `group_lik[g]` is the
    /// log-likelihood of every subset in g and `masses` what
    /// [`Posterior::group_masses`] returned for `groups` on this posterior.
    /// With c = max over groups with mass > 0 of ℓ_g + log mass_g and
    /// f_g = exp(min(ℓ_g − c, 700)) (0 for a group without mass),
    /// w_i ← w_i·f_g: k exponentials and logarithms and m multiplies. Every
    /// new group mass is ≤ 1 and the largest ≈ 1, so the largest weight is
    /// in [1/m, 1] and a weight only underflows below 2⁻¹⁰⁷⁴·m of it. (The
    /// cap at e⁷⁰⁰ only binds for a group whose mass is below e⁻⁷⁰⁰ of the
    /// largest, which it then keeps even smaller; without it f_g could
    /// overflow.) If no subset with weight has a finite ℓ — impossible for
    /// the mechanism's likelihoods, which are finite in label mode — the
    /// weights stay as they are rather than fail after the draw. The result
    /// is in linear form; a log-form posterior is converted first, as
    /// [`Posterior::group_masses`] converts it.
    ///
    /// # Errors
    /// [`PrivacyError::TeacherCount`] / [`PrivacyError::Shape`] if the
    /// groups, likelihoods or masses do not fit, [`PrivacyError::NonFinite`]
    /// for a NaN or +∞ likelihood; the posterior is then unchanged.
    pub fn update_linear(&mut self, groups: &Groups, group_lik: &[f64], masses: &[f64]) -> Result<(), PrivacyError> {
        self.check_groups(groups, group_lik)?;
        if masses.len() != groups.count() {
            return Err(PrivacyError::Shape(format!("{} groups with {} masses", groups.count(), masses.len())));
        }
        let c = masses
            .iter()
            .zip(group_lik)
            .filter(|(mass, _)| **mass > 0.0)
            .map(|(mass, l)| l + mass.ln())
            .fold(f64::NEG_INFINITY, f64::max);
        // Taken out of the posterior rather than copied; a log form converts.
        let mut w = match std::mem::replace(&mut self.form, Form::Linear(Vec::new())) {
            Form::Linear(w) => w,
            log => Posterior { form: log }.linear_weights().into_owned(),
        };
        if c.is_finite() {
            let factor: Vec<f64> = masses
                .iter()
                .zip(group_lik)
                .map(|(mass, l)| if *mass > 0.0 { (l - c).min(700.0).exp() } else { 0.0 })
                .collect();
            for (x, &g) in w.iter_mut().zip(groups.of()) {
                *x *= factor[g];
            }
        }
        self.form = Form::Linear(w);
        Ok(())
    }

    fn check_groups(&self, groups: &Groups, group_lik: &[f64]) -> Result<(), PrivacyError> {
        if groups.of().len() != self.len() {
            return Err(PrivacyError::TeacherCount { posterior: self.len(), teachers: groups.of().len() });
        }
        if group_lik.len() != groups.count() {
            return Err(PrivacyError::Shape(format!("{} groups with {} likelihoods", groups.count(), group_lik.len())));
        }
        check_likelihoods(group_lik.iter())
    }

    /// The log form's numbers (computed from linear weights: log w_i − log Σ w).
    fn log_form(&self) -> std::borrow::Cow<'_, [f64]> {
        match &self.form {
            Form::Log(log_w) => std::borrow::Cow::Borrowed(log_w),
            Form::Linear(_) => std::borrow::Cow::Owned(self.log_weights().to_vec()),
        }
    }
}

/// log Σ_{i ∈ g} w_i for every group g: around the group's largest
/// log-weight, summed in subset order, so the value is a function of the
/// log-weights and the groups alone. −∞ for a group whose weights are all 0.
fn group_log_masses(log_w: &[f64], groups: &Groups) -> Vec<f64> {
    let k = groups.count();
    let mut max = vec![f64::NEG_INFINITY; k];
    for (&g, &lw) in groups.of().iter().zip(log_w) {
        max[g] = max[g].max(lw);
    }
    let mut sum = vec![0.0; k];
    for (&g, &lw) in groups.of().iter().zip(log_w) {
        if max[g] != f64::NEG_INFINITY {
            sum[g] += (lw - max[g]).exp();
        }
    }
    max.iter().zip(&sum).map(|(&m, &s)| if m == f64::NEG_INFINITY { m } else { m + s.ln() }).collect()
}

fn check_likelihoods<'a>(mut log_lik: impl Iterator<Item = &'a f64>) -> Result<(), PrivacyError> {
    if log_lik.any(|x| x.is_nan() || *x == f64::INFINITY) {
        return Err(PrivacyError::NonFinite("posterior update"));
    }
    Ok(())
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
