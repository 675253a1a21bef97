//! `RotateKey`: an admin-created principal's new API key; its session and
//! spending stay.

use super::{principal_message, refresh_gauges};
use crate::proto::pacpriv::CreatePrincipalResponse;
use crate::server::App;
use crate::server::status::ServiceError;

/// Rotates `name`'s key durably; the new key is in the response and
/// nowhere else.
///
/// # Errors
/// No such principal, one whose key is not the admin API's to rotate, or
/// a store failure.
pub async fn apply(app: &App, name: &str) -> Result<CreatePrincipalResponse, ServiceError> {
    let (account, api_key) = app.sessions.rotate(name).await?;
    refresh_gauges(&app.sessions, &app.metrics.service).await?;
    Ok(CreatePrincipalResponse { principal: Some(principal_message(&account)), api_key })
}
