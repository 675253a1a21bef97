//! `ListPrincipals`: every principal with its account.

use super::principal_message;
use crate::proto::pacpriv::ListPrincipalsResponse;
use crate::server::App;
use crate::server::status::ServiceError;

/// All of them, by name, revoked ones included.
///
/// # Errors
/// A store failure.
pub async fn apply(app: &App) -> Result<ListPrincipalsResponse, ServiceError> {
    let accounts = app.sessions.list().await?;
    Ok(ListPrincipalsResponse { principals: accounts.iter().map(principal_message).collect() })
}
