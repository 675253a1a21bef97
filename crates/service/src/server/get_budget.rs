//! `GetBudget`: the caller's account in a dataset, free of charge.

use super::App;
use super::output;
use super::status::ServiceError;
use crate::proto::pacpriv::{Budget, GetBudgetRequest};
use crate::session::{Caller, DEFAULT_DATASET_INDEX};

/// The caller's current budget in the dataset `request` names, or else
/// the dataset of the model it names (both empty: the default dataset).
///
/// # Errors
/// An unknown dataset or model (NOT_FOUND, naming those served), a
/// poisoned session or an unreachable store.
pub async fn apply(app: &App, caller: &Caller, request: &GetBudgetRequest) -> Result<Budget, ServiceError> {
    // The dataset of the model named, if one is.
    let of_model = (!request.model.is_empty()).then(|| app.models().named(&request.model, "").map(|m| m.dataset));
    let of_model = of_model.transpose()?;
    let dataset = if request.dataset.is_empty() {
        of_model.unwrap_or(DEFAULT_DATASET_INDEX)
    } else {
        app.sessions.dataset_index(&request.dataset).ok_or_else(|| {
            let served: Vec<&str> = app.sessions.datasets().collect();
            let asked: String = request.dataset.chars().take(64).collect();
            ServiceError::NotFound(format!("no dataset {asked:?} here: the datasets are {served:?}"))
        })?
    };
    if of_model.is_some_and(|d| d != dataset) {
        return Err(ServiceError::InvalidInput(format!(
            "model {:?} is not over dataset {:?}: name one of them (its account is its dataset's)",
            request.model, request.dataset
        )));
    }
    let handle = caller.on(dataset)?;
    Ok(output::budget(handle.principal(), handle.dataset(), handle.scope(), &handle.budget().await?))
}
