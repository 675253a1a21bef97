//! The gRPC front and start-up. [`start`] builds the teachers, the store,
//! the secret and the sessions, then binds up to four listeners:
//!
//! - client (`server.listen`): `pacpriv.v1.Privatizer`, health, reflection,
//!   and the private model on the Open Inference Protocol ([`inference`]);
//!   TLS/mTLS when configured ([`tls`]);
//! - admin (`admin.listen`, only with an admin token): `pacpriv.v1.Admin`
//!   ([`admin`]), same TLS;
//! - health (`server.health_listen`, optional): plaintext `grpc.health.v1`
//!   only, for probes that cannot speak TLS;
//! - metrics (`metrics.listen`): Prometheus over HTTP ([`crate::metrics`]).
//!
//! A client request's path: [`auth`] (credential → session) → [`rate`]
//! (the principal's rate limit, for queries) → [`input`]
//! (wire → validated [`input::Query`]) → the RPC's file ([`predict`],
//! [`predict_stream`], [`get_budget`], or [`inference`]'s `ModelInfer`,
//! which re-encodes [`predict`]) → [`status`] for any error.

pub mod admin;
pub mod auth;
pub mod get_budget;
pub mod inference;
pub mod input;
pub mod predict;
pub mod predict_stream;
pub mod rate;
pub mod status;
pub mod tls;

use crate::metrics::{self, Metrics, Rpc};
use crate::proto::inference::grpc_inference_service_server::GrpcInferenceServiceServer;
use crate::proto::pacpriv::admin_server::AdminServer;
use crate::proto::pacpriv::privatizer_server::{Privatizer, PrivatizerServer};
use crate::proto::pacpriv::{Budget, GetBudgetRequest, PredictRequest, PredictResponse};
use crate::session::secret::{self, SecretError};
use crate::session::{GLOBAL_SESSION, Scope, SessionParams, Sessions};
use crate::settings::{Settings, StoreSettings, TeacherSource};
use crate::store::{EmbeddedStore, PgStore, Store, StoreError};
use crate::teachers::demo::server::DemoServer;
use crate::teachers::demo::{self, Ensemble as DemoEnsemble};
use crate::teachers::{Ensemble, FanoutError, Teachers};
use input::InputSpec;
use sha2::Digest;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status, Streaming};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

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
    /// Every exported metric.
    pub metrics: Arc<Metrics>,
    /// Whether the last probe found every teacher ready.
    pub ready: std::sync::atomic::AtomicBool,
    /// Per-principal query rate limit.
    pub rate: rate::RateLimit,
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
    /// TLS files unreadable or unusable.
    #[error("TLS: {0}")]
    Tls(String),
}

/// A listener on `addr` and the address it got (the port, when `addr`'s
/// is 0).
async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let error = |e: std::io::Error| StartError::Bind { addr, reason: e.to_string() };
    let listener = TcpListener::bind(addr).await.map_err(error)?;
    let bound = listener.local_addr().map_err(error)?;
    Ok((listener, bound))
}

/// Starts the demo teachers on their own loopback listener (a task of this
/// runtime) and returns how to ask them: m models, or their stacked one.
async fn start_demo(models: usize, seed: u64, listen: SocketAddr, stacked: bool) -> Result<Teachers, StartError> {
    let started = std::time::Instant::now();
    let ensemble = tokio::task::spawn_blocking(move || DemoEnsemble::train(models, seed))
        .await
        .map_err(|e| StartError::Demo(e.to_string()))?
        .map_err(StartError::Demo)?;
    let (listener, addr) = bind(listen).await?;
    tracing::info!(models, %addr, seconds = started.elapsed().as_secs_f64(), "demo teachers trained and serving");
    tokio::spawn(DemoServer::new(ensemble.teachers).serve(listener, std::future::pending()));
    Ok(if stacked {
        Teachers::Stacked { spec: demo::stacked_spec(addr), models }
    } else {
        Teachers::PerTeacher(demo::specs(addr, models))
    })
}

/// Names the teacher set s* indexes into: the demo's seed and m (however
/// they are served), or the remote models in order (endpoints may move;
/// the models may not).
fn teacher_fingerprint(source: &TeacherSource) -> String {
    match source {
        TeacherSource::Demo { models, seed, .. } => format!("demo digits seed={seed} m={models}"),
        TeacherSource::Remote(Teachers::PerTeacher(specs)) => {
            let names: Vec<String> = specs.iter().map(|s| format!("{}@{}", s.model, s.version)).collect();
            let digest = sha2::Sha256::digest(names.join("\n").as_bytes());
            format!("remote m={} models-sha256={}", specs.len(), crate::session::hex(&digest[..8]))
        }
        TeacherSource::Remote(Teachers::Stacked { spec, models }) => {
            format!("remote stacked m={models} model={}@{}", spec.model, spec.version)
        }
    }
}

/// Accepted connections of `listener`, with Nagle's algorithm off: gRPC
/// replies are small and latency-bound, and with Nagle a reply can wait for
/// the peer's delayed ACK (BENCHMARKS.md measured 2.4× throughput with it
/// off).
pub fn incoming(listener: TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// A running server future.
type Serving = Pin<Box<dyn Future<Output = Result<(), ServeError>> + Send>>;

/// A listener failed while serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A gRPC listener.
    #[error("gRPC listener: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// The metrics listener.
    #[error("metrics listener: {0}")]
    Metrics(#[from] std::io::Error),
    /// A listener's task panicked or was cancelled.
    #[error("listener task: {0}")]
    Task(String),
}

/// A started service: where each listener is bound, and the future that
/// runs them all.
pub struct Started {
    /// The client API address (useful when configured with port 0).
    pub addr: SocketAddr,
    /// The admin API address, if enabled.
    pub admin: Option<SocketAddr>,
    /// The plaintext health address, if enabled.
    pub health: Option<SocketAddr>,
    /// The `/metrics` address, if enabled.
    pub metrics: Option<SocketAddr>,
    /// Runs every listener until `shutdown` resolves; fails if any fails.
    pub server: Serving,
}

/// Builds everything `settings` describes and binds every listener.
///
/// # Errors
/// [`StartError`].
pub async fn start(
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Started, StartError> {
    let metrics = Arc::new(Metrics::new(settings.metrics.max_principal_series));
    let teachers = match &settings.teachers {
        TeacherSource::Demo { models, seed, listen, stacked } => start_demo(*models, *seed, *listen, *stacked).await?,
        TeacherSource::Remote(teachers) => teachers.clone(),
    };
    let fingerprint = teacher_fingerprint(&settings.teachers);
    let ensemble = Ensemble::new(teachers, settings.call.clone(), settings.mode, settings.batching, &metrics.teachers)?;
    let m = ensemble.len();
    let store = match &settings.store {
        StoreSettings::Embedded { path } => {
            Store::Embedded(Arc::new(EmbeddedStore::open_with(path, metrics.store.clone())?))
        }
        StoreSettings::Postgres { url, max_connections } => {
            Store::Postgres(Arc::new(PgStore::connect(url, *max_connections).await?.observed(metrics.store.clone())))
        }
    };
    let secret = secret::establish(&store, settings.secret_index_file.as_deref(), m, &fingerprint).await?;
    let params = SessionParams {
        per_query: settings.per_query,
        policy: settings.policy,
        m,
        secret,
        journal: settings.journal,
        cache: settings.cache,
    };
    let sessions = Sessions::new(&settings.principals, settings.scope, settings.global_budget, params, &store).await?;
    let accounts = sessions.active_accounts().await?;
    metrics.service.principals(accounts.len());
    for a in &accounts {
        let session = match sessions.scope() {
            Scope::PerPrincipal => a.principal.name.as_str(),
            Scope::Global => GLOBAL_SESSION,
        };
        metrics.service.budget(session, &a.budget);
    }
    let principal_from_cert = settings.tls.as_ref().is_some_and(|t| t.principal_from_cert);
    let input = InputSpec { shape: settings.input_shape.clone(), release_noisy: settings.release_noisy_vector };
    let app = Arc::new(App {
        sessions,
        ensemble,
        input,
        principal_from_cert,
        metrics: Arc::clone(&metrics),
        ready: false.into(),
        rate: rate::RateLimit::new(settings.rate_limit),
    });

    let (health, health_service) = tonic_health::server::health_reporter();
    watch_teachers(Arc::clone(&app), health, settings.health_interval).await;
    let shutdown = Shutdown::new(shutdown);
    let mut servers: Vec<Serving> = Vec::new();

    let privatizer = PrivatizerServer::new(Service { app: Arc::clone(&app) })
        .max_decoding_message_size(settings.max_message_bytes)
        .max_encoding_message_size(settings.max_message_bytes);
    let inference = settings.inference_model.clone().map(|model| {
        GrpcInferenceServiceServer::new(inference::InferenceService::new(Arc::clone(&app), model))
            .max_decoding_message_size(settings.max_message_bytes)
            .max_encoding_message_size(settings.max_message_bytes)
    });
    let (listener, addr) = bind(settings.listen).await?;
    let client = tls::builder(settings.tls.as_ref(), settings.max_concurrent_streams)?
        .add_service(health_service.clone())
        .add_service(reflection(<PrivatizerServer<Service> as tonic::server::NamedService>::NAME)?)
        .add_service(privatizer)
        .add_optional_service(inference)
        .serve_with_incoming_shutdown(incoming(listener), shutdown.signal());
    servers.push(Box::pin(async move { Ok(client.await?) }));

    let mut admin_addr = None;
    if let Some(admin) = &settings.admin {
        let (listener, bound) = bind(admin.listen).await?;
        admin_addr = Some(bound);
        let service = AdminServer::new(admin::AdminService::new(Arc::clone(&app), admin.key_sha256));
        let server = tls::builder(settings.tls.as_ref(), settings.max_concurrent_streams)?
            .add_service(health_service.clone())
            .add_service(reflection(<AdminServer<admin::AdminService> as tonic::server::NamedService>::NAME)?)
            .add_service(service)
            .serve_with_incoming_shutdown(incoming(listener), shutdown.signal());
        servers.push(Box::pin(async move { Ok(server.await?) }));
    } else {
        tracing::info!("admin API off: set admin.key_sha256 to provision principals at run time");
    }

    let mut health_addr = None;
    if let Some(listen) = settings.health_listen {
        let (listener, bound) = bind(listen).await?;
        health_addr = Some(bound);
        let server = tonic::transport::Server::builder()
            .add_service(health_service)
            .serve_with_incoming_shutdown(incoming(listener), shutdown.signal());
        servers.push(Box::pin(async move { Ok(server.await?) }));
    }

    let mut metrics_addr = None;
    if let Some(listen) = settings.metrics.listen {
        let (listener, bound) = bind(listen).await?;
        metrics_addr = Some(bound);
        let server = metrics::http::serve(listener, metrics, shutdown.signal());
        servers.push(Box::pin(async move { Ok(server.await?) }));
    }

    tracing::info!(%addr, admin = ?admin_addr, health = ?health_addr, metrics = ?metrics_addr, teachers = m,
        scope = settings.scope.as_str(), per_query = settings.per_query.get(), tls = settings.tls.is_some(), "pacpriv serving");
    // All listeners run until the shutdown signal; the first to fail ends
    // the service (dropping the set stops the others).
    let server: Serving = Box::pin(async move {
        let mut running: tokio::task::JoinSet<Result<(), ServeError>> = servers.into_iter().collect();
        while let Some(done) = running.join_next().await {
            done.map_err(|e| ServeError::Task(e.to_string()))??;
        }
        Ok(())
    });
    Ok(Started { addr, admin: admin_addr, health: health_addr, metrics: metrics_addr, server })
}

/// Reflection advertising `service` and health (each listener names only
/// what it serves).
fn reflection(
    service: &str,
) -> Result<
    tonic_reflection::server::v1::ServerReflectionServer<impl tonic_reflection::server::v1::ServerReflection>,
    StartError,
> {
    let health = <tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService> as tonic::server::NamedService>::NAME;
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .with_service_name(service)
        .with_service_name(health)
        .with_service_name("grpc.reflection.v1.ServerReflection")
        .build_v1()
        .map_err(|e| StartError::Reflection(e.to_string()))
}

/// One shutdown signal fanned out to every listener.
struct Shutdown(tokio::sync::watch::Receiver<bool>);

impl Shutdown {
    fn new(signal: impl Future<Output = ()> + Send + 'static) -> Self {
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            signal.await;
            let _ = tx.send(true);
        });
        Shutdown(rx)
    }

    fn signal(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.0.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }
}

/// The health service name that is SERVING for as long as the process
/// serves at all, for liveness probes: teachers being down is a reason to
/// stop routing queries here (readiness), not to restart this process.
pub const LIVENESS_SERVICE: &str = "liveness";

/// Keeps the health status of `pacpriv.v1.Privatizer` (and of the server,
/// "") SERVING exactly while every teacher reports its model ready, so a
/// load balancer or Kubernetes readiness probe stops sending queries that
/// could only fail with UNAVAILABLE; [`LIVENESS_SERVICE`] is SERVING
/// throughout. Probes once before returning, then every `every` on a task
/// of its own.
async fn watch_teachers(app: Arc<App>, health: HealthReporter, every: std::time::Duration) {
    health.set_service_status(LIVENESS_SERVICE, ServingStatus::Serving).await;
    let mut missing = probe(&app).await;
    set_health(&app, &health, missing).await;
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let now = probe(&app).await;
            if (now == 0) != (missing == 0) {
                set_health(&app, &health, now).await;
            }
            missing = now;
        }
    });
}

/// Teachers not ready, also recorded as a gauge.
async fn probe(app: &App) -> usize {
    let missing = app.ensemble.not_ready().await;
    let total = app.ensemble.len();
    app.metrics.teachers.readiness(total.saturating_sub(missing), total);
    missing
}

async fn set_health(app: &App, health: &HealthReporter, missing: usize) {
    app.ready.store(missing == 0, std::sync::atomic::Ordering::Relaxed);
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

#[tonic::async_trait]
impl Privatizer for Service {
    async fn predict(&self, request: Request<PredictRequest>) -> Result<Response<PredictResponse>, Status> {
        let handle = auth::querier(&self.app, &request).await?;
        Ok(Response::new(predict::handle(&self.app, &handle, request.into_inner(), Rpc::Predict).await?))
    }

    type PredictStreamStream = predict_stream::ResponseStream;

    async fn predict_stream(
        &self,
        request: Request<Streaming<PredictRequest>>,
    ) -> Result<Response<Self::PredictStreamStream>, Status> {
        let handle = auth::querier(&self.app, &request).await?;
        Ok(Response::new(predict_stream::start(Arc::clone(&self.app), handle, request.into_inner())))
    }

    async fn get_budget(&self, request: Request<GetBudgetRequest>) -> Result<Response<Budget>, Status> {
        let started = std::time::Instant::now();
        let handle = auth::authenticate(&self.app.sessions, &request, self.app.principal_from_cert).await?;
        let budget = get_budget::apply(&handle).await;
        self.app.metrics.service.duration(Rpc::GetBudget, started.elapsed().as_secs_f64());
        Ok(Response::new(budget?))
    }
}
