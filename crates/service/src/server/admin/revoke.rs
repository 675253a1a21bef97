//! `RevokePrincipal`: the key stops working at once and for good.

use super::{principal_message, refresh_gauges};
use crate::proto::pacpriv::Principal;
use crate::server::App;
use crate::server::status::ServiceError;

/// Revokes `name` (durably, then in memory) and returns its final account.
///
/// # Errors
/// No such principal, or a store failure.
pub async fn apply(app: &App, name: &str) -> Result<Principal, ServiceError> {
    let account = app.sessions.revoke(name).await?;
    refresh_gauges(&app.sessions, &app.metrics.service).await?;
    Ok(principal_message(&account))
}
