//! The private predictor as a model of the Open Inference Protocol
//! (`inference.GRPCInferenceService`, the gRPC API of Triton, KServe and
//! MLServer), served on the client listener beside `pacpriv.v1.Privatizer`
//! so that unchanged tritonclient / KServe programs can call it.
//!
//! Every model of [`super::models`]: the default one, named by
//! `server.inference_model` (default `private`), and each
//! `[models.<name>]`, each at version `1` and its `[versions.<name>.<V>]`
//! (load and unload are the admin listener's: `super::admin::repository`).
//! `ModelInfer` is `Predict` under
//! another encoding: the same
//! credential (`x-api-key` or `authorization: Bearer` metadata), the same
//! validation, charge and durability ([`super::predict::handle`]), the
//! same errors ([`super::status`]). Liveness, readiness, metadata and the
//! repository index (`RepositoryIndex`, Triton's repository extension:
//! names, versions, states) need no credential and reveal nothing about
//! any session.
//!
//! A request's path: [`Infer::parse`] (wire → a
//! `PredictRequest` and what to send back) → [`super::predict::handle`]
//! → [`Infer::respond`].

pub mod http;
pub mod metadata;
pub mod model_infer;

use super::models::Model;
use super::status::{self, ServiceError};
use super::{App, auth};
use crate::metrics::Rpc;
use crate::proto::inference::grpc_inference_service_server::GrpcInferenceService;
use crate::proto::inference::{
    ModelInferRequest, ModelInferResponse, ModelMetadataRequest, ModelMetadataResponse, ModelReadyRequest,
    ModelReadyResponse, ModelStatistics, ModelStatisticsRequest, ModelStatisticsResponse, RepositoryIndexRequest,
    RepositoryIndexResponse, RepositoryModelLoadRequest, RepositoryModelLoadResponse, RepositoryModelUnloadRequest,
    RepositoryModelUnloadResponse, ServerLiveRequest, ServerLiveResponse, ServerMetadataRequest,
    ServerMetadataResponse, ServerReadyRequest, ServerReadyResponse, repository_index_response::ModelIndex,
};
use model_infer::Infer;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tonic::{Request, Response, Status};
use tracing::Instrument;

/// The `inference.GRPCInferenceService` implementation.
pub struct InferenceService {
    app: Arc<App>,
}

impl InferenceService {
    /// Serves `app`'s models.
    pub fn new(app: Arc<App>) -> Self {
        InferenceService { app }
    }

    /// Whether the server is ready (what gRPC health reports): the last
    /// probe found every teacher of the default model ready, and the
    /// server is not draining.
    fn ready(&self) -> bool {
        self.app.ready.load(Ordering::Relaxed)
    }

    /// Whether `model` answers ([`model_ready`]).
    fn model_ready(&self, model: &Model) -> bool {
        model_ready(&self.app, model)
    }

    /// `model`'s metadata, listing every version of it.
    fn metadata(&self, model: &Model) -> ModelMetadataResponse {
        let versions = self.app.models().versions(&model.name).iter().map(|m| m.version().to_owned()).collect();
        metadata::model(model, versions)
    }

    /// The model `name`/`version`, loaded or not (an empty version means
    /// the newest, as in Triton).
    fn names(&self, name: &str, version: &str) -> Result<Arc<Model>, ServiceError> {
        self.app.models().named(name, version).map(Arc::clone)
    }
}

/// Whether `model` answers: it is loaded, its teachers were all ready at
/// the last probe, and the server is not draining.
fn model_ready(app: &App, model: &Model) -> bool {
    model.loaded() && model.teachers_ready() && !app.draining.load(Ordering::Relaxed)
}

/// Every model and version, READY while it answers ([`model_ready`]), else
/// UNAVAILABLE with the reason; only the ready ones if `ready_only`. Names,
/// versions and states: nothing about any session.
pub fn index(app: &App, ready_only: bool) -> Vec<ModelIndex> {
    app.models()
        .iter()
        .map(|model| (model, model_ready(app, model)))
        .filter(|&(_, ready)| ready || !ready_only)
        .map(|(model, ready)| {
            let (state, reason) = if ready {
                ("READY", "")
            } else if !model.loaded() {
                ("UNAVAILABLE", "unloaded")
            } else if app.draining.load(Ordering::Relaxed) {
                ("UNAVAILABLE", "the server is draining")
            } else {
                ("UNAVAILABLE", "its teachers are not all ready")
            };
            ModelIndex {
                name: model.name.clone(),
                version: model.version().to_owned(),
                state: state.to_owned(),
                reason: reason.to_owned(),
            }
        })
        .collect()
}

/// The statistics of model `name` (empty: every model) at `version`
/// (empty: every version), in the repository's order (Triton's statistics
/// extension: [`super::statistics`]).
///
/// # Errors
/// [`ServiceError::NotFound`] for a name or version not served here.
pub fn statistics(app: &App, name: &str, version: &str) -> Result<Vec<ModelStatistics>, ServiceError> {
    let models = app.models();
    let chosen: Vec<&Arc<Model>> = match (name, version) {
        ("", "") => models.iter().collect(),
        ("", _) => return Err(ServiceError::InvalidInput("a version was named without its model".into())),
        (name, "") => {
            models.named(name, "")?;
            models.versions(name).iter().collect()
        }
        (name, version) => vec![models.named(name, version)?],
    };
    Ok(chosen.into_iter().map(|m| m.stats.report(&m.name, m.version())).collect())
}

/// What the client listener says of load and unload.
pub const LOAD_ON_ADMIN: &str = "load and unload are served on the admin listener only, with the admin token \
     (inference.GRPCInferenceService/RepositoryModelLoad and RepositoryModelUnload; pacpriv admin load|unload NAME)";

#[tonic::async_trait]
impl GrpcInferenceService for InferenceService {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> Result<Response<ServerReadyResponse>, Status> {
        Ok(Response::new(ServerReadyResponse { ready: self.ready() }))
    }

    async fn model_ready(&self, request: Request<ModelReadyRequest>) -> Result<Response<ModelReadyResponse>, Status> {
        let r = request.get_ref();
        // An empty version: whether a request naming none is answered
        // (by the version it would be asked of).
        let ready = if r.version.is_empty() {
            self.app.models().serving(&r.name, "").is_ok_and(|model| self.model_ready(model))
        } else {
            self.names(&r.name, &r.version).is_ok_and(|model| self.model_ready(&model))
        };
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(metadata::server()))
    }

    async fn model_metadata(
        &self,
        request: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let r = request.get_ref();
        let model = self.names(&r.name, &r.version)?;
        Ok(Response::new(self.metadata(&model)))
    }

    async fn repository_index(
        &self,
        request: Request<RepositoryIndexRequest>,
    ) -> Result<Response<RepositoryIndexResponse>, Status> {
        Ok(Response::new(RepositoryIndexResponse { models: index(&self.app, request.get_ref().ready) }))
    }

    async fn model_infer(&self, request: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
        let span = super::grpc_span(Rpc::ModelInfer, &request);
        self.infer(request).instrument(span).await
    }

    async fn model_statistics(
        &self,
        request: Request<ModelStatisticsRequest>,
    ) -> Result<Response<ModelStatisticsResponse>, Status> {
        // The service's counts, over every principal's calls: for
        // principals, not strangers.
        auth::authenticate(&self.app.sessions, &request, self.app.principal_from_cert).await?;
        let r = request.get_ref();
        Ok(Response::new(ModelStatisticsResponse { model_stats: statistics(&self.app, &r.name, &r.version)? }))
    }

    async fn repository_model_load(
        &self,
        _: Request<RepositoryModelLoadRequest>,
    ) -> Result<Response<RepositoryModelLoadResponse>, Status> {
        Err(load_on_admin())
    }

    async fn repository_model_unload(
        &self,
        _: Request<RepositoryModelUnloadRequest>,
    ) -> Result<Response<RepositoryModelUnloadResponse>, Status> {
        Err(load_on_admin())
    }
}

/// Load or unload asked of the client listener.
fn load_on_admin() -> Status {
    status::with_reason(tonic::Code::Unimplemented, LOAD_ON_ADMIN.into(), status::reason::ADMIN_ONLY, false, &[])
}

impl InferenceService {
    async fn infer(&self, request: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
        let handle = auth::querier(&self.app, &request).await?;
        // The model and version are resolved again where the query is
        // asked (`predict::ask`); parsing names them in the request.
        let (predict, infer) = Infer::parse(request.into_inner()).map_err(|e| {
            self.app.metrics.service.query(status::outcome(&e));
            Status::from(e)
        })?;
        let answer = super::predict::handle(&self.app, &handle, predict, Rpc::ModelInfer).await?;
        Ok(Response::new(infer.respond(answer)))
    }
}

#[cfg(test)]
mod test;
