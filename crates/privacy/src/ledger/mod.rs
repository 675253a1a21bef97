//! The MI ledger of one session: what has been spent, what the limit is, and
//! whether the next answer may be released (paper Theorem 3.3; the
//! `contested` policy's argument is in `docs/assurance/privacy-core.md` §6).
//! The whole accounting argument, end to end: `docs/assurance/accounting.md`.
//!
//! Theorem 3.3: with noise calibrated to the current posterior, the MI
//! between the secret and the whole transcript is at most Σ_t b_t. The
//! ledger is that sum. It is a filter (OpenDP `privacy_filter`): the charge
//! is checked *before* anything is released, and the sum is rounded up.
//!
//! # Policies
//! - [`Policy::Paper`]: every answered query costs b.
//! - [`Policy::Contested`]: a unanimous answer costs 0 — the release is then a
//!   function of public state (every subset with positive weight gives the
//!   same output), so I(S; R_t | transcript) = 0 exactly — and any other
//!   answer costs b.
//! - [`Policy::UnanimousOnly`]: only unanimous answers are released (free,
//!   as under `contested`); any other query is refused before anything is
//!   drawn or charged ([`super::mechanism::answer`]). Whether all m
//!   teachers agree is a function of the m outputs, not of which subset is
//!   secret, so the refusal reveals nothing (`docs/assurance/accounting.md` §3).
//!
//! # Invariants
//! - `spent` only grows, and only by [`Ledger::record`].
//! - An answer is refused iff spent + charge > limit (computed rounding up);
//!   the decision depends only on public quantities, never on the secret.

use super::conservative::{add_up, mul_up};
use super::noise::MIN_PER_QUERY;
use super::{Nats, PrivacyError};
use std::fmt;
use std::str::FromStr;

/// How answers are charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Charge b for every answer (Theorem 3.3 as stated).
    Paper,
    /// Charge 0 for unanimous answers and b otherwise.
    Contested,
    /// Answer unanimous queries only (free); refuse contested ones.
    UnanimousOnly,
}

impl FromStr for Policy {
    type Err = PrivacyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "paper" => Ok(Policy::Paper),
            "contested" => Ok(Policy::Contested),
            "unanimous_only" => Ok(Policy::UnanimousOnly),
            other => Err(PrivacyError::Domain(format!(
                "unknown charging policy {other:?}: expected \"paper\", \"contested\" or \"unanimous_only\""
            ))),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::Paper => "paper",
            Policy::Contested => "contested",
            Policy::UnanimousOnly => "unanimous_only",
        })
    }
}

/// One session's MI account.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Ledger {
    per_query: Nats,
    limit: Nats,
    policy: Policy,
    spent: Nats,
    answered: u64,
    charged: u64,
}

impl Ledger {
    /// A fresh ledger: nothing spent.
    ///
    /// # Errors
    /// [`PrivacyError::PerQueryTooSmall`] if b < [`MIN_PER_QUERY`].
    pub fn new(per_query: Nats, limit: Nats, policy: Policy) -> Result<Self, PrivacyError> {
        Self::restore(per_query, limit, policy, Nats::ZERO, 0, 0)
    }

    /// A ledger read back from durable state.
    ///
    /// # Errors
    /// As [`Ledger::new`]; [`PrivacyError::Domain`] if more answers were
    /// charged than answered.
    pub fn restore(
        per_query: Nats,
        limit: Nats,
        policy: Policy,
        spent: Nats,
        answered: u64,
        charged: u64,
    ) -> Result<Self, PrivacyError> {
        if per_query.get() < MIN_PER_QUERY {
            return Err(PrivacyError::PerQueryTooSmall { value: per_query.get(), min: MIN_PER_QUERY });
        }
        if charged > answered {
            return Err(PrivacyError::Domain(format!(
                "ledger has {charged} charged answers but only {answered} answered"
            )));
        }
        Ok(Ledger { per_query, limit, policy, spent, answered, charged })
    }

    /// What an answer costs under this ledger's policy.
    pub fn charge_for(&self, unanimous: bool) -> Nats {
        match (self.policy, unanimous) {
            (Policy::Contested | Policy::UnanimousOnly, true) => Nats::ZERO,
            _ => self.per_query,
        }
    }

    /// Checks that `charge` fits: returns the spent total after it.
    ///
    /// # Errors
    /// [`PrivacyError::BudgetExhausted`] if spent + charge > limit.
    pub fn check(&self, charge: Nats) -> Result<Nats, PrivacyError> {
        let after = add_up(self.spent, charge)?;
        if after > self.limit {
            return Err(PrivacyError::BudgetExhausted { spent: self.spent, budget: self.limit, charge });
        }
        Ok(after)
    }

    /// Checks that `n` charges of b fit when recorded one after the other,
    /// each sum rounded up as [`Ledger::record`] rounds it: returns the
    /// spent total after them. This is the check before a request with `n`
    /// charged rows draws anything: the same additions as the rows'
    /// records, so a request it lets through never fails a row's record
    /// for budget (a single rounded sum n·b can differ from them in the
    /// last place). A free answer (charge 0) adds nothing, so it does not
    /// count. `n` is a request's row count: the loop stops at the first
    /// sum past the limit.
    ///
    /// # Errors
    /// [`PrivacyError::BudgetExhausted`] (its `charge`: n·b, rounded up) if
    /// they do not fit.
    pub fn check_charges(&self, n: u64) -> Result<Nats, PrivacyError> {
        let mut after = self.spent;
        for _ in 0..n {
            after = add_up(after, self.per_query)?;
            if after > self.limit {
                let charge = mul_up(n, self.per_query)?;
                return Err(PrivacyError::BudgetExhausted { spent: self.spent, budget: self.limit, charge });
            }
        }
        Ok(after)
    }

    /// Records one released answer and its charge.
    ///
    /// # Errors
    /// [`PrivacyError::BudgetExhausted`] if it does not fit (nothing recorded).
    pub fn record(&mut self, charge: Nats) -> Result<(), PrivacyError> {
        let after = self.check(charge)?;
        self.spent = after;
        self.answered += 1;
        if charge.get() > 0.0 {
            self.charged += 1;
        }
        Ok(())
    }

    /// Per-query budget b.
    pub fn per_query(&self) -> Nats {
        self.per_query
    }

    /// Sets the limit B (the operator changed the budget). Spending is
    /// untouched: a limit below what is spent leaves the session exhausted.
    pub fn set_limit(&mut self, limit: Nats) {
        self.limit = limit;
    }

    /// The session's total limit B.
    pub fn limit(&self) -> Nats {
        self.limit
    }

    /// MI spent so far (rounded up).
    pub fn spent(&self) -> Nats {
        self.spent
    }

    /// limit − spent, never negative.
    pub fn remaining(&self) -> f64 {
        (self.limit.get() - self.spent.get()).max(0.0)
    }

    /// Charging policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Answers released.
    pub fn answered(&self) -> u64 {
        self.answered
    }

    /// Answers that cost more than zero.
    pub fn charged(&self) -> u64 {
        self.charged
    }
}

#[cfg(test)]
mod test;
