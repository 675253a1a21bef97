//! `GetBudget`: the caller's account, free of charge.

use super::output;
use super::status::ServiceError;
use crate::proto::pacpriv::Budget;
use crate::session::Handle;

/// The session's current budget.
///
/// # Errors
/// A poisoned session or an unreachable store.
pub async fn apply(handle: &Handle) -> Result<Budget, ServiceError> {
    Ok(output::budget(handle.principal(), handle.scope(), &handle.budget().await?))
}
