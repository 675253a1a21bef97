//! Session values → wire messages: what a client is shown of its account
//! (the inverse direction of [`super::input`]).

use crate::proto::pacpriv::Budget;
use crate::session::{BudgetView, Scope};

/// The wire form of a session's account, as `principal` sees it.
pub fn budget(principal: &str, dataset: &str, scope: Scope, v: &BudgetView) -> Budget {
    Budget {
        principal: principal.to_owned(),
        dataset: dataset.to_owned(),
        scope: scope.as_str().to_owned(),
        spent: v.spent,
        limit: v.limit,
        remaining: v.remaining,
        per_query: v.per_query,
        answered: v.answered,
        charged: v.charged,
        mia_bound: v.mia_bound,
        policy: v.policy.to_string(),
    }
}
