//! The private predictor as a model of the Open Inference Protocol
//! (`inference.GRPCInferenceService`, the gRPC API of Triton, KServe and
//! MLServer), served on the client listener beside `pacpriv.v1.Privatizer`
//! so that unchanged tritonclient / KServe programs can call it.
//!
//! Every model of [`super::models`]: the default one, named by
//! `server.inference_model` (default `private`), and each
//! `[models.<name>]`, all version `1`. `ModelInfer` is `Predict` under
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
    ModelReadyResponse, RepositoryIndexRequest, RepositoryIndexResponse, ServerLiveRequest, ServerLiveResponse,
    ServerMetadataRequest, ServerMetadataResponse, ServerReadyRequest, ServerReadyResponse,
    repository_index_response::ModelIndex,
};
use model_infer::Infer;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tonic::{Request, Response, Status};
use tracing::Instrument;

pub use super::models::MODEL_VERSION;

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

    /// Whether `model` answers: its teachers were all ready at the last
    /// probe, and the server is not draining.
    fn model_ready(&self, model: &Model) -> bool {
        model.teachers_ready() && !self.app.draining.load(Ordering::Relaxed)
    }

    /// Every model and version, READY while it answers ([`Self::model_ready`]),
    /// else UNAVAILABLE; only the ready ones if `ready_only`.
    fn index(&self, ready_only: bool) -> Vec<ModelIndex> {
        self.app
            .models
            .iter()
            .map(|model| (model, self.model_ready(model)))
            .filter(|&(_, ready)| ready || !ready_only)
            .map(|(model, ready)| {
                let (state, reason) = if ready {
                    ("READY", "")
                } else if self.app.draining.load(Ordering::Relaxed) {
                    ("UNAVAILABLE", "the server is draining")
                } else {
                    ("UNAVAILABLE", "its teachers are not all ready")
                };
                ModelIndex {
                    name: model.name.clone(),
                    version: MODEL_VERSION.to_owned(),
                    state: state.to_owned(),
                    reason: reason.to_owned(),
                }
            })
            .collect()
    }

    /// The model `name`/`version` (an empty version means the latest, as
    /// in Triton).
    fn names(&self, name: &str, version: &str) -> Result<&Arc<Model>, ServiceError> {
        self.app.models.named(name, version)
    }
}

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
        let ready = self.names(&r.name, &r.version).is_ok_and(|model| self.model_ready(model));
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
        Ok(Response::new(metadata::model(model)))
    }

    async fn repository_index(
        &self,
        request: Request<RepositoryIndexRequest>,
    ) -> Result<Response<RepositoryIndexResponse>, Status> {
        Ok(Response::new(RepositoryIndexResponse { models: self.index(request.get_ref().ready) }))
    }

    async fn model_infer(&self, request: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
        let span = super::grpc_span(Rpc::ModelInfer, &request);
        self.infer(request).instrument(span).await
    }
}

impl InferenceService {
    async fn infer(&self, request: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
        let handle = auth::querier(&self.app, &request).await?;
        let request = request.into_inner();
        let parsed = self
            .names(&request.model_name, &request.model_version)
            .map(|model| model.name.clone())
            .and_then(|name| Ok((name, Infer::parse(request)?)));
        let (name, (predict, infer)) = parsed.map_err(|e| {
            self.app.metrics.service.query(status::outcome(&e));
            Status::from(e)
        })?;
        let answer = super::predict::handle(&self.app, &handle, predict, Rpc::ModelInfer).await?;
        Ok(Response::new(infer.respond(&name, answer)))
    }
}

#[cfg(test)]
mod test;
