//! `CreatePrincipal`: a new principal, its budget and a fresh API key.

use super::{principal_message, refresh_gauges};
use crate::proto::pacpriv::{CreatePrincipalRequest, CreatePrincipalResponse};
use crate::server::App;
use crate::server::status::ServiceError;
use pacpriv_privacy::Nats;
use std::collections::BTreeMap;

/// A validated request.
pub struct Create {
    name: String,
    budget: Nats,
    dataset_budgets: BTreeMap<String, Nats>,
}

/// Checks the budgets (the name and the datasets are checked by the
/// registry).
///
/// # Errors
/// [`ServiceError::InvalidInput`] for a budget that is not a non-negative
/// number of nats.
pub fn parse(request: CreatePrincipalRequest) -> Result<Create, ServiceError> {
    let nats = |key: &str, value: &str| {
        value
            .parse::<Nats>()
            .map_err(|e| ServiceError::InvalidInput(format!("{key} {value:?}: {e} (nats, e.g. \"2^-8\" or 0.01)")))
    };
    let budget = nats("budget_mi", &request.budget_mi)?;
    let dataset_budgets = request
        .dataset_budget_mi
        .iter()
        .map(|(dataset, value)| Ok((dataset.clone(), nats(&format!("dataset_budget_mi[{dataset:?}]"), value)?)))
        .collect::<Result<_, ServiceError>>()?;
    Ok(Create { name: request.name, budget, dataset_budgets })
}

/// Provisions it durably; the key is in the response and nowhere else.
///
/// # Errors
/// A bad or taken name, or a store failure.
pub async fn apply(app: &App, c: Create) -> Result<CreatePrincipalResponse, ServiceError> {
    let (account, api_key) = app.sessions.create(&c.name, c.budget, &c.dataset_budgets).await?;
    refresh_gauges(&app.sessions, &app.metrics.service).await?;
    Ok(CreatePrincipalResponse { principal: Some(principal_message(&account)), api_key })
}
