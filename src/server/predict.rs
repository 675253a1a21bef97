//! `Predict`: one private prediction. The pipeline every answer takes:
//! refuse early if even the cheapest answer no longer fits → ask all m
//! teachers (no lock held) → one step of Algorithm 1, made durable
//! ([`Handle::answer`]) → response.

use super::App;
use super::input::Query;
use super::status::ServiceError;
use crate::proto::pacpriv::{Budget, PredictResponse};
use crate::session::{BudgetView, Handle};
use std::sync::Arc;

/// Answers one validated query for `handle`'s session.
///
/// # Errors
/// Exhausted budget, unavailable teachers, or a core refusal — in each case
/// nothing was charged.
pub async fn apply(app: &Arc<App>, handle: &Handle, query: Query) -> Result<PredictResponse, ServiceError> {
    handle.ensure_can_pay().await?;
    let outputs = app.ensemble.query(&query.features).await?;
    let (answer, view) = handle.answer(outputs, query.alpha, query.query_id.clone()).await?;
    tracing::info!(charged = answer.charge.get(), unanimous = answer.unanimous, spent = view.spent, "answered");
    Ok(PredictResponse {
        query_id: query.query_id,
        label: u32::try_from(answer.label).map_err(|_| ServiceError::Internal("label out of range".into()))?,
        unanimous: answer.unanimous,
        mi_charged: answer.charge.get(),
        budget: Some(budget_message(handle, &view)),
        confident: answer.confident,
    })
}

/// The wire form of a session's account.
pub fn budget_message(handle: &Handle, v: &BudgetView) -> Budget {
    Budget {
        principal: handle.principal().to_owned(),
        scope: handle.scope().as_str().to_owned(),
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
