//! `RepositoryModelLoad` and `RepositoryModelUnload`, Triton's model
//! repository extension (`inference.GRPCInferenceService`, what
//! tritonclient's `load_model` / `unload_model` call), served on the admin
//! listener with the admin token, beside the repository index.
//!
//! The repository is the configuration: every model and version it
//! names is built at start (and by a reload that adds it); loading and
//! unloading decide which of them new requests may resolve to, on this
//! replica, until it restarts or a reload removes the version (one that
//! rebuilds it keeps its state: [`App::replace_models`])
//! (`docs/concepts/models-and-datasets.md`: a deployment changes what
//! every replica serves through the configuration, reloaded). Neither
//! touches a session: an unloaded version's new questions are refused
//! before anything is asked or charged
//! ([`crate::server::models::Models::serving`]), what it answered before
//! is still given again from the cache, and requests already answering on
//! it finish on it.
//!
//! Both calls take one path, [`RepositoryService::load_or_unload`]:
//! [`check_token`] → [`parse`] → [`apply`].

use super::check_token;
use crate::proto::inference::grpc_inference_service_server::GrpcInferenceService;
use crate::proto::inference::model_repository_parameter::ParameterChoice;
use crate::proto::inference::{
    ModelRepositoryParameter, RepositoryIndexRequest, RepositoryIndexResponse, RepositoryModelLoadRequest,
    RepositoryModelLoadResponse, RepositoryModelUnloadRequest, RepositoryModelUnloadResponse,
};
use crate::server::App;
use crate::server::status::ServiceError;
use std::collections::HashMap;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The repository calls of the admin listener.
pub struct RepositoryService {
    app: Arc<App>,
    token_sha256: [u8; 32],
}

impl RepositoryService {
    /// Loads and unloads `app`'s models for holders of the token hashing
    /// to `token_sha256`.
    pub fn new(app: Arc<App>, token_sha256: [u8; 32]) -> Self {
        RepositoryService { app, token_sha256 }
    }
}

/// A load or unload request's fields (the two messages have the same).
pub struct Fields {
    /// Must be empty: there is one repository.
    pub repository_name: String,
    /// The model.
    pub model_name: String,
    /// `version`, and on unload `unload_dependents`.
    pub parameters: HashMap<String, ModelRepositoryParameter>,
}

impl From<RepositoryModelLoadRequest> for Fields {
    fn from(r: RepositoryModelLoadRequest) -> Self {
        Fields { repository_name: r.repository_name, model_name: r.model_name, parameters: r.parameters }
    }
}

impl From<RepositoryModelUnloadRequest> for Fields {
    fn from(r: RepositoryModelUnloadRequest) -> Self {
        Fields { repository_name: r.repository_name, model_name: r.model_name, parameters: r.parameters }
    }
}

/// A load or unload, validated.
#[derive(Debug, PartialEq)]
pub struct Change {
    /// The model.
    pub name: String,
    /// One version of it, or every version (`None`, as Triton's load and
    /// unload act).
    pub version: Option<String>,
    /// Load (`true`) or unload.
    pub load: bool,
}

/// Reads a request's fields: a model name, no repository name (there is
/// one repository), and at most the parameter `version` (a string or an
/// integer; and on unload `unload_dependents`, which tritonclient always
/// sends: a pacpriv model has none).
///
/// # Errors
/// [`ServiceError::InvalidInput`] saying what to change.
pub fn parse(fields: Fields, load: bool) -> Result<Change, ServiceError> {
    let Fields { repository_name, model_name, parameters } = fields;
    let bad = ServiceError::InvalidInput;
    if !repository_name.is_empty() {
        return Err(bad("pacpriv has one model repository, its configuration: leave repository_name empty".into()));
    }
    if model_name.is_empty() {
        return Err(bad("model_name is empty: name the model to load or unload".into()));
    }
    let mut version = None;
    for (key, value) in parameters {
        match (key.as_str(), value.parameter_choice) {
            ("version", Some(ParameterChoice::StringParam(v))) if !v.is_empty() => version = Some(v),
            ("version", Some(ParameterChoice::Int64Param(v))) => version = Some(v.to_string()),
            ("version", _) => {
                return Err(bad("parameter \"version\" is a non-empty string or an int64, e.g. \"2\"".into()));
            }
            // What tritonclient's unload_model always sends: a pacpriv
            // model has no dependents.
            ("unload_dependents", Some(ParameterChoice::BoolParam(_))) if !load => {}
            _ => {
                let key: String = key.chars().take(64).collect();
                return Err(bad(format!(
                    "parameter {key:?} is not read here: pacpriv loads only the models and versions its \
                     configuration names ([models.NAME], [versions.NAME.V]), so a config or files cannot be sent; \
                     the parameters are \"version\" (and \"unload_dependents\" on unload, ignored)"
                )));
            }
        }
    }
    Ok(Change { name: model_name, version, load })
}

/// Applies `change` on this replica.
///
/// # Errors
/// [`ServiceError::NotFound`] for a model or version the configuration
/// does not name.
pub fn apply(app: &App, change: Change) -> Result<(), ServiceError> {
    let versions = app.set_loaded(&change.name, change.version.as_deref(), change.load)?;
    tracing::info!(model = %change.name, ?versions, loaded = change.load, "model repository: versions loaded or unloaded");
    Ok(())
}

impl RepositoryService {
    /// A load (`load`) or an unload: the token, the request's fields, the
    /// change on this replica.
    fn load_or_unload(&self, request: Request<impl Into<Fields>>, load: bool) -> Result<(), Status> {
        check_token(&request, &self.token_sha256)?;
        apply(&self.app, parse(request.into_inner().into(), load)?)?;
        Ok(())
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for RepositoryService {
    async fn repository_index(
        &self,
        request: Request<RepositoryIndexRequest>,
    ) -> Result<Response<RepositoryIndexResponse>, Status> {
        check_token(&request, &self.token_sha256)?;
        let models = crate::server::inference::index(&self.app, request.get_ref().ready);
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        request: Request<RepositoryModelLoadRequest>,
    ) -> Result<Response<RepositoryModelLoadResponse>, Status> {
        self.load_or_unload(request, true)?;
        Ok(Response::new(RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<RepositoryModelUnloadRequest>,
    ) -> Result<Response<RepositoryModelUnloadResponse>, Status> {
        self.load_or_unload(request, false)?;
        Ok(Response::new(RepositoryModelUnloadResponse {}))
    }
}
