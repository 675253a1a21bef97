//! The gRPC front: the `pacpriv.v1.Privatizer` service, health and
//! reflection on one listener, and start-up (teachers, secret, sessions).
//!
//! A request's path: [`auth`] (API key → session) → [`input`] (wire →
//! validated [`input::Query`]) → the RPC's file ([`predict`],
//! [`predict_stream`], [`get_budget`]) → [`status`] for any error.

pub mod auth;
pub mod get_budget;
pub mod input;
pub mod predict;
pub mod predict_stream;
pub mod status;

use crate::proto::pacpriv::privatizer_server::{Privatizer, PrivatizerServer};
use crate::proto::pacpriv::{Budget, GetBudgetRequest, PredictRequest, PredictResponse};
use crate::session::secret::{self, SecretError};
use crate::session::{SessionParams, Sessions};
use crate::settings::{Settings, StoreSettings, TeacherSource};
use crate::store::{EmbeddedStore, PgStore, Store, StoreError};
use crate::teachers::demo::server::DemoServer;
use crate::teachers::demo::{self, Ensemble as DemoEnsemble};
use crate::teachers::{Ensemble, FanoutError, TeacherSpec};
use input::InputSpec;
use sha2::Digest;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status, Streaming};
use tonic_health::ServingStatus;
use tracing::Instrument;

/// Everything a request needs, shared by all of them.
pub struct App {
    /// Principals and their sessions.
    pub sessions: Sessions,
    /// The m teachers.
    pub ensemble: Ensemble,
    /// What an input example looks like.
    pub input: InputSpec,
    /// A verified client certificate's CN may name the principal.
    pub principal_from_cert: bool,
}

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Demo training failed.
    #[error("training the demo teachers failed: {0}")]
    Demo(String),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {reason}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        reason: String,
    },
    /// Teacher configuration.
    #[error(transparent)]
    Teachers(#[from] FanoutError),
    /// Secret index.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Sessions (budget values, unreadable records).
    #[error("sessions: {0}")]
    Sessions(#[from] crate::session::SessionError),
    /// Reflection descriptor.
    #[error("reflection: {0}")]
    Reflection(String),
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr).await.map_err(|e| StartError::Bind { addr, reason: e.to_string() })
}

/// Starts the demo teachers on their own loopback listener (a task of this
/// runtime) and returns their specs.
async fn start_demo(models: usize, seed: u64, listen: SocketAddr) -> Result<Vec<TeacherSpec>, StartError> {
    let started = std::time::Instant::now();
    let ensemble = tokio::task::spawn_blocking(move || DemoEnsemble::train(models, seed))
        .await
        .map_err(|e| StartError::Demo(e.to_string()))?
        .map_err(StartError::Demo)?;
    let listener = bind(listen).await?;
    let addr = listener.local_addr().map_err(|e| StartError::Bind { addr: listen, reason: e.to_string() })?;
    tracing::info!(models, %addr, seconds = started.elapsed().as_secs_f64(), "demo teachers trained and serving");
    tokio::spawn(DemoServer::new(ensemble.teachers).serve(listener, std::future::pending()));
    Ok(demo::specs(addr, models))
}

/// Names the teacher set s* indexes into: the demo's seed and m, or the
/// remote models in order (endpoints may move; the models may not).
fn teacher_fingerprint(source: &TeacherSource, specs: &[TeacherSpec]) -> String {
    match source {
        TeacherSource::Demo { models, seed, .. } => format!("demo digits seed={seed} m={models}"),
        TeacherSource::Remote(_) => {
            let names: Vec<String> = specs.iter().map(|s| format!("{}@{}", s.model, s.version)).collect();
            let digest = sha2::Sha256::digest(names.join("\n").as_bytes());
            let short: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
            format!("remote m={} models-sha256={short}", specs.len())
        }
    }
}

/// A started service: its address, and the future that runs it.
pub struct Started {
    /// The client API address (useful when configured with port 0).
    pub addr: SocketAddr,
    /// Runs the gRPC server until `shutdown` resolves.
    pub server: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), tonic::transport::Error>> + Send>>,
}

/// Builds everything `settings` describes and binds the client listener.
///
/// # Errors
/// [`StartError`].
pub async fn start(
    settings: Settings,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Started, StartError> {
    let specs = match &settings.teachers {
        TeacherSource::Demo { models, seed, listen } => start_demo(*models, *seed, *listen).await?,
        TeacherSource::Remote(specs) => specs.clone(),
    };
    let m = specs.len();
    let fingerprint = teacher_fingerprint(&settings.teachers, &specs);
    let ensemble = Ensemble::new(specs, settings.call.clone(), settings.mode)?;
    let store = match &settings.store {
        StoreSettings::Embedded { path } => Store::Embedded(Arc::new(EmbeddedStore::open(path)?)),
        StoreSettings::Postgres { url, max_connections } => {
            Store::Postgres(Arc::new(PgStore::connect(url, *max_connections).await?))
        }
    };
    let secret = secret::establish(&store, settings.secret_index_file.as_deref(), m, &fingerprint).await?;
    let params =
        SessionParams { per_query: settings.per_query, policy: settings.policy, m, secret, journal: settings.journal };
    let sessions = Sessions::new(&settings.principals, settings.scope, settings.global_budget, params, &store).await?;
    let principal_from_cert = settings.tls.as_ref().is_some_and(|t| t.principal_from_cert);
    let input = InputSpec { shape: settings.input_shape.clone() };
    let app = Arc::new(App { sessions, ensemble, input, principal_from_cert });

    let (health, health_service) = tonic_health::server::health_reporter();
    watch_teachers(Arc::clone(&app), health, settings.health_interval).await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| StartError::Reflection(e.to_string()))?;
    let privatizer = PrivatizerServer::new(Service { app })
        .max_decoding_message_size(settings.max_message_bytes)
        .max_encoding_message_size(settings.max_message_bytes);

    let listener = bind(settings.listen).await?;
    let addr = listener.local_addr().map_err(|e| StartError::Bind { addr: settings.listen, reason: e.to_string() })?;
    tracing::info!(%addr, teachers = m, scope = settings.scope.as_str(), per_query = settings.per_query.get(), "pacpriv serving");
    let server = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(privatizer)
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown);
    Ok(Started { addr, server: Box::pin(server) })
}

/// Keeps the health status of `pacpriv.v1.Privatizer` (and of the server,
/// "") SERVING exactly while every teacher reports its model ready, so a
/// load balancer or Kubernetes readiness probe stops sending queries that
/// could only fail with UNAVAILABLE. Probes once before returning, then
/// every `every` on a task of its own.
async fn watch_teachers(app: Arc<App>, health: tonic_health::server::HealthReporter, every: std::time::Duration) {
    let mut missing = app.ensemble.not_ready().await;
    set_health(&health, missing).await;
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let now = app.ensemble.not_ready().await;
            if (now == 0) != (missing == 0) {
                set_health(&health, now).await;
            }
            missing = now;
        }
    });
}

async fn set_health(health: &tonic_health::server::HealthReporter, missing: usize) {
    let status = if missing == 0 { ServingStatus::Serving } else { ServingStatus::NotServing };
    for name in ["", <PrivatizerServer<Service> as tonic::server::NamedService>::NAME] {
        health.set_service_status(name, status).await;
    }
    tracing::info!(ready = missing == 0, teachers_not_ready = missing, "teacher readiness");
}

/// The `pacpriv.v1.Privatizer` implementation: authenticates, then hands
/// each RPC to its own module.
pub struct Service {
    app: Arc<App>,
}

impl Service {
    async fn authenticate<T>(&self, request: &Request<T>) -> Result<crate::session::Handle, Status> {
        Ok(auth::authenticate(&self.app.sessions, request, self.app.principal_from_cert).await?)
    }
}

#[tonic::async_trait]
impl Privatizer for Service {
    async fn predict(&self, request: Request<PredictRequest>) -> Result<Response<PredictResponse>, Status> {
        let handle = self.authenticate(&request).await?;
        let query = self.app.input.parse(request.into_inner())?;
        let span = tracing::info_span!("predict", principal = %handle.principal(), query_id = %query.query_id);
        let response = predict::apply(&self.app, &handle, query).instrument(span.clone()).await;
        if let Err(e) = &response {
            span.in_scope(|| tracing::info!(error = %e, "not answered"));
        }
        Ok(Response::new(response?))
    }

    type PredictStreamStream = predict_stream::ResponseStream;

    async fn predict_stream(
        &self,
        request: Request<Streaming<PredictRequest>>,
    ) -> Result<Response<Self::PredictStreamStream>, Status> {
        let handle = self.authenticate(&request).await?;
        Ok(Response::new(predict_stream::start(Arc::clone(&self.app), handle, request.into_inner())))
    }

    async fn get_budget(&self, request: Request<GetBudgetRequest>) -> Result<Response<Budget>, Status> {
        let handle = self.authenticate(&request).await?;
        Ok(Response::new(get_budget::apply(&handle).await?))
    }
}
