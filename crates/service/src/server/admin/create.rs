//! `CreatePrincipal`: a new principal, its budget and a fresh API key.

use super::{principal_message, refresh_gauges};
use crate::proto::pacpriv::{CreatePrincipalRequest, CreatePrincipalResponse};
use crate::server::App;
use crate::server::status::ServiceError;
use pacpriv_privacy::Nats;

/// A validated request.
pub struct Create {
    name: String,
    budget: Nats,
}

/// Checks the budget (the name is checked by the registry).
///
/// # Errors
/// [`ServiceError::InvalidInput`] for a budget that is not a non-negative
/// number of nats.
pub fn parse(request: CreatePrincipalRequest) -> Result<Create, ServiceError> {
    let budget = request.budget_mi.parse::<Nats>().map_err(|e| {
        ServiceError::InvalidInput(format!("budget_mi {:?}: {e} (nats, e.g. \"2^-8\" or 0.01)", request.budget_mi))
    })?;
    Ok(Create { name: request.name, budget })
}

/// Provisions it durably; the key is in the response and nowhere else.
///
/// # Errors
/// A bad or taken name, or a store failure.
pub async fn apply(app: &App, c: Create) -> Result<CreatePrincipalResponse, ServiceError> {
    let (account, api_key) = app.sessions.create(&c.name, c.budget).await?;
    refresh_gauges(&app.sessions, &app.metrics.service).await?;
    Ok(CreatePrincipalResponse { principal: Some(principal_message(&account)), api_key })
}
