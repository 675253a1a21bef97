//! `Predict`: one private prediction. The pipeline every answer takes:
//! refuse early if even the cheapest answer no longer fits → ask all m
//! teachers (no lock held) → one step of Algorithm 1, made durable
//! ([`Handle::answer`]) → response.

use super::App;
use super::input::Query;
use super::status::{self, ServiceError};
use crate::metrics::Rpc;
use crate::proto::pacpriv::{Budget, PredictRequest, PredictResponse};
use crate::session::{BudgetView, Handle, Scope};
use std::sync::Arc;
use tracing::Instrument;

/// Validates and answers one request of `rpc` for an authenticated caller,
/// recording its outcome and latency.
///
/// # Errors
/// As [`apply`], plus invalid input.
pub async fn handle(
    app: &Arc<App>,
    handle: &Handle,
    request: PredictRequest,
    rpc: Rpc,
) -> Result<PredictResponse, ServiceError> {
    let started = std::time::Instant::now();
    let query = app.input.parse(request);
    let query_id = query.as_ref().map(|q| q.query_id.clone()).unwrap_or_default();
    let span = tracing::info_span!("query", principal = %handle.principal(), query_id = %query_id);
    let result = async {
        let result = match query {
            Ok(q) => apply(app, handle, q).await,
            Err(e) => Err(e),
        };
        if let Err(e) = &result {
            tracing::info!(error = %e, "not answered");
            app.metrics.service.query(status::outcome(e));
        }
        result
    }
    .instrument(span)
    .await;
    app.metrics.service.duration(rpc, started.elapsed().as_secs_f64());
    result
}

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
    app.metrics.service.answered(answer.unanimous, answer.charge.get());
    app.metrics.service.budget(handle.session_name(), &view);
    Ok(PredictResponse {
        query_id: query.query_id,
        label: u32::try_from(answer.label).map_err(|_| ServiceError::Internal("label out of range".into()))?,
        unanimous: answer.unanimous,
        mi_charged: answer.charge.get(),
        budget: Some(budget_message(handle.principal(), handle.scope(), &view)),
        confident: answer.confident,
        noisy: if query.return_noisy { answer.published } else { Vec::new() },
    })
}

/// The wire form of a session's account, as `principal` sees it.
pub fn budget_message(principal: &str, scope: Scope, v: &BudgetView) -> Budget {
    Budget {
        principal: principal.to_owned(),
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
