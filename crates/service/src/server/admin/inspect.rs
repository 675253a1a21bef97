//! `InspectPrincipal`: one principal's account (spent, remaining, MIA
//! bound, ε-equivalent).

use super::principal_message;
use crate::proto::pacpriv::Principal;
use crate::server::App;
use crate::server::status::ServiceError;

/// The principal called `name`.
///
/// # Errors
/// No such principal, or a store failure.
pub async fn apply(app: &App, name: &str) -> Result<Principal, ServiceError> {
    Ok(principal_message(&app.sessions.inspect(name).await?))
}
