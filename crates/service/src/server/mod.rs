//! Request handling: the gRPC services and what every request shares
//! ([`App`]). Start-up — building the store, teachers, secret and sessions
//! and binding the listeners — is [`crate::start`]'s.
//!
//! A client request's path: [`auth`] (credential → session) → [`rate`]
//! (the principal's rate limit, for queries) → [`models`] (which model's
//! teachers) → [`input`] (wire → validated [`input::Query`]) → the RPC's file ([`predict`],
//! [`predict_stream`], [`get_budget`], or [`inference`]'s `ModelInfer`,
//! which re-encodes [`predict`]) → [`status`] for any error.

pub mod admin;
pub mod auth;
pub mod get_budget;
pub mod health;
pub mod in_flight;
pub mod inference;
pub mod input;
pub mod models;
pub mod output;
pub mod predict;
pub mod predict_stream;
pub mod rate;
pub mod statistics;
pub mod status;

use crate::metrics::{Metrics, Rpc};
use crate::proto::pacpriv::privatizer_server::Privatizer;
use crate::proto::pacpriv::{Budget, GetBudgetRequest, PredictRequest, PredictResponse};
use crate::session::Sessions;
use std::sync::Arc;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

/// Everything a request needs, shared by all of them.
pub struct App {
    /// Principals and their sessions.
    pub sessions: Sessions,
    /// The models, each its m teachers and input shape: replaced whole by
    /// a reload that adds or removes models or versions ([`App::models`]).
    pub models: std::sync::RwLock<Arc<models::Models>>,
    /// A verified client certificate's CN may name the principal.
    pub principal_from_cert: bool,
    /// Every exported metric.
    pub metrics: Arc<Metrics>,
    /// Whether the last probe found every teacher of the default model
    /// ready, and the server is not draining (what readiness reports).
    pub ready: std::sync::atomic::AtomicBool,
    /// Set once on SIGTERM: readiness stays false from then on.
    pub draining: std::sync::atomic::AtomicBool,
    /// Per-principal query rate limit.
    pub rate: rate::RateLimit,
    /// Per-principal cap on calls in flight.
    pub in_flight: in_flight::InFlight,
}

impl App {
    /// The models as they are now. A request resolves its model once, from
    /// one snapshot, and keeps that version (its teachers) until it is
    /// answered, whatever a reload does meanwhile.
    pub fn models(&self) -> Arc<models::Models> {
        // A poisoned lock held a complete value (it is only ever replaced).
        Arc::clone(&self.models.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Serves `models` from now on (a reload); a version served before
    /// keeps its load state (an admin's unload survives its rebuild).
    pub fn replace_models(&self, models: Arc<models::Models>) {
        let mut serving = self.models.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        models.keep_load_state(&serving);
        *serving = models;
    }

    /// Loads or unloads `version` (none: every version) of model `name`
    /// on this replica; the versions changed. Under the lock a reload
    /// replaces the models with, so neither undoes the other.
    ///
    /// # Errors
    /// [`ServiceError`](status::ServiceError)`::NotFound` for a model or
    /// version not served.
    pub fn set_loaded(
        &self,
        name: &str,
        version: Option<&str>,
        load: bool,
    ) -> Result<Vec<String>, status::ServiceError> {
        let serving = self.models.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let changed = serving.set_loaded(name, version, load)?;
        Ok(changed.iter().map(|m| m.version().to_owned()).collect())
    }
}

/// The `pacpriv.v1.Privatizer` implementation: authenticates, then hands
/// each RPC to its own module.
pub struct Service {
    app: Arc<App>,
}

impl Service {
    /// The client API over `app`.
    pub fn new(app: Arc<App>) -> Self {
        Service { app }
    }
}

/// The span of one RPC, child of the trace context the client sent among
/// `headers` (if any, and if traces are exported).
pub fn rpc_span(rpc: Rpc, headers: &dyn opentelemetry::propagation::Extractor) -> tracing::Span {
    let span = tracing::info_span!("rpc", rpc = rpc.as_str());
    crate::trace::adopt_parent(&span, headers);
    span
}

/// [`rpc_span`] for a gRPC request.
pub fn grpc_span<T>(rpc: Rpc, request: &Request<T>) -> tracing::Span {
    rpc_span(rpc, &crate::trace::Metadata(request.metadata()))
}

#[tonic::async_trait]
impl Privatizer for Service {
    async fn predict(&self, request: Request<PredictRequest>) -> Result<Response<PredictResponse>, Status> {
        let span = grpc_span(Rpc::Predict, &request);
        async {
            let handle = auth::querier(&self.app, &request).await?;
            Ok(Response::new(predict::handle(&self.app, &handle, request.into_inner(), Rpc::Predict).await?))
        }
        .instrument(span)
        .await
    }

    type PredictStreamStream = predict_stream::ResponseStream;

    async fn predict_stream(
        &self,
        request: Request<Streaming<PredictRequest>>,
    ) -> Result<Response<Self::PredictStreamStream>, Status> {
        let span = grpc_span(Rpc::PredictStream, &request);
        let handle = auth::querier(&self.app, &request).instrument(span.clone()).await?;
        let place = self.app.in_flight.enter(handle.principal()).map_err(|refused| {
            self.app.metrics.service.query(status::outcome(&refused));
            Status::from(refused)
        })?;
        let _entered = span.enter();
        Ok(Response::new(predict_stream::start(Arc::clone(&self.app), handle, place, request.into_inner())))
    }

    async fn get_budget(&self, request: Request<GetBudgetRequest>) -> Result<Response<Budget>, Status> {
        let started = std::time::Instant::now();
        let caller = auth::authenticate(&self.app.sessions, &request, self.app.principal_from_cert).await?;
        let budget = get_budget::apply(&self.app, &caller, request.get_ref()).await;
        self.app.metrics.service.duration(Rpc::GetBudget, started.elapsed().as_secs_f64());
        Ok(Response::new(budget?))
    }
}
