//! Start-up, in one place: [`serve`] builds the teachers, the store, the
//! secret and the sessions that `settings` describe, then binds up to five
//! listeners, and runs them until shutdown:
//!
//! - client (`server.listen`): `pacpriv.v1.Privatizer`, health, reflection,
//!   and the private model on the Open Inference Protocol
//!   ([`crate::server::inference`]); TLS/mTLS when configured
//!   ([`crate::net::tls`]);
//! - HTTP (`server.http_listen`, with `server.inference_model`): the
//!   private model on the Open Inference Protocol's REST binding
//!   ([`crate::server::inference::http`]);
//! - admin (`admin.listen`, only with an admin token): `pacpriv.v1.Admin`
//!   ([`crate::server::admin`]), same TLS;
//! - health (`server.health_listen`, optional): plaintext `grpc.health.v1`
//!   only, for probes that cannot speak TLS;
//! - metrics (`metrics.listen`): Prometheus over HTTP ([`crate::metrics`]).
//!
//! Shutdown is one [`CancellationToken`]: the signal cancels it, every
//! listener and background task watches it, and a [`TaskTracker`] waits
//! for the background tasks (the readiness probe, the demo teachers)
//! before [`Started::server`] resolves.
//!
//! The plaintext health listener comes first, before the teachers and the
//! store: probes see a live process that is not ready (readiness
//! NOT_SERVING) while the demo trains or start-up waits for a database
//! node that accepts writes ([`store`]).
//!
//! # Invariants
//! - Nothing but health is served before the store is open, the secret
//!   established and every configured principal provisioned.
//! - The first listener to fail stops the others (cancelling the token)
//!   and is the error [`Started::server`] returns.

pub mod descriptors;
pub mod identity;
pub mod models;
pub mod readiness;
pub mod reload;
pub mod store;

use crate::metrics::{self, Metrics};
use crate::net::guard::{Watch, guarded_incoming};
use crate::net::tls::{Alpn, ServerTls, TlsError};
use crate::net::{self, BindError, Limits, bind, tls_incoming};
use crate::proto::inference::grpc_inference_service_server::GrpcInferenceServiceServer;
use crate::proto::pacpriv::admin_server::AdminServer;
use crate::proto::pacpriv::privatizer_server::PrivatizerServer;
use crate::server::auth::CredentialFirst;
use crate::server::models::{Model, Models};
use crate::server::{App, Service, admin, inference, rate};
use crate::session::secret::SecretError;
use crate::settings::{Settings, TeacherSource};
use crate::teachers::{FanoutError, Teachers};
use pacpriv_privacy::mechanism::Calibration;
use pacpriv_store::{Arrivals, StoreError};
use sha2::Digest;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Demo training failed.
    #[error("training the demo teachers failed: {0}")]
    Demo(String),
    /// A listener could not be bound.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// Teacher configuration.
    #[error(transparent)]
    Teachers(#[from] FanoutError),
    /// Secret index.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// A model version's number names other teachers in the store.
    #[error(transparent)]
    Identity(#[from] identity::IdentityError),
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Sessions (budget values, unreadable records).
    #[error("sessions: {0}")]
    Sessions(#[from] crate::session::SessionError),
    /// A dataset without a model, or a model of no dataset (the
    /// configuration's load refuses both; kept so that start-up never
    /// panics on settings built another way).
    #[error("dataset {0:?}: every model needs a configured dataset, and every dataset a model")]
    UnknownDataset(String),
    /// Reflection descriptor.
    #[error("reflection: {0}")]
    Reflection(String),
    /// TLS files unreadable or unusable.
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    /// The linked BLAS/LAPACK takes other integers than pacpriv passes
    /// (an ILP64 OpenBLAS).
    #[error("BLAS/LAPACK: {0}")]
    Lapack(#[from] pacpriv_lapack::Error),
    /// The process may not open the file descriptors the configuration
    /// may hold (`descriptors`).
    #[error("file descriptors: {0}")]
    Descriptors(String),
    /// No database node accepted writes within `store.start_wait_ms`
    /// ([`store`]).
    #[error(
        "no database node accepted writes within store.start_wait_ms = {wait_ms} ({attempts} attempts; the last: \
         {last}). Check that the database has a primary (a failover still under way? only a standby reachable?) \
         and that this replica can reach it, or raise store.start_wait_ms"
    )]
    NoWritableStore {
        /// The configured wait, in milliseconds.
        wait_ms: u64,
        /// Attempts made.
        attempts: u32,
        /// The last attempt's failure.
        last: Box<StartError>,
    },
    /// The shutdown signal came before the service was ready to serve.
    #[error("stopped by a signal before serving")]
    Stopped,
}

/// A listener failed while serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A gRPC listener.
    #[error("gRPC listener: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// A listener's task panicked or was cancelled.
    #[error("listener task: {0}")]
    Task(String),
}

/// A running server future.
type Serving = Pin<Box<dyn Future<Output = Result<(), ServeError>> + Send>>;

/// A started service: where each listener is bound, and the future that
/// runs them all.
pub struct Started {
    /// The client API address (useful when configured with port 0).
    pub addr: SocketAddr,
    /// The Open Inference Protocol's HTTP/REST address, if enabled.
    pub http: Option<SocketAddr>,
    /// The admin API address, if enabled.
    pub admin: Option<SocketAddr>,
    /// The plaintext health address, if enabled.
    pub health: Option<SocketAddr>,
    /// The `/metrics` address, if enabled.
    pub metrics: Option<SocketAddr>,
    /// Runs every listener until `shutdown` resolves; fails if any fails.
    pub server: Serving,
    /// Applies a reloaded configuration (SIGHUP).
    pub reloader: reload::Reloader,
}

/// Builds everything `settings` describes and binds every listener; the
/// service stops when `shutdown` resolves.
///
/// # Errors
/// [`StartError`].
pub async fn serve(
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Started, StartError> {
    // Before any calibration: every LAPACK call assumes 32-bit integers.
    pacpriv_lapack::check_lp64()?;
    let stop = CancellationToken::new();
    let background = TaskTracker::new();
    // The signal is watched from the start; the drain begins once there
    // is something to drain (below).
    let signalled = CancellationToken::new();
    let (signal, stopped) = (signalled.clone(), stop.clone());
    tokio::spawn(async move {
        tokio::select! { () = shutdown => signal.cancel(), () = stopped.cancelled() => {} }
    });
    // A failed start drops `stop`'s clones below, not the token: cancel
    // it so the background tasks already spawned end too.
    let cancel_on_error = stop.clone().drop_guard();

    let metrics = Arc::new(Metrics::new(settings.metrics.max_principal_series));
    // Health first, so probes see the process from now on: alive, not
    // ready (readiness follows the teachers once the service is built).
    let (health, _) = tonic_health::server::health_reporter();
    let health_service = crate::server::health::server(&health, settings.limits.max_connection_age);
    readiness::starting(&health).await;
    let mut servers: Vec<Serving> = Vec::new();
    let mut health_addr = None;
    if let Some(listen) = settings.health_listen {
        let (listener, bound) = bind(listen).await?;
        health_addr = Some(bound);
        tracing::info!(health = %bound, "health listener up: liveness SERVING, readiness NOT_SERVING until ready");
        // Plaintext, for probes on a private port; held to the same limits.
        let server = net::builder(&settings.limits).add_service(health_service.clone());
        servers.push(now(grpc(server, listener, None, &settings.limits, &stop)));
    }

    // The teachers count their answers on the way to the store, which the
    // embedded writer waits for: one count for the process.
    let arrivals = Arc::new(Arrivals::default());
    let builder = models::Builder::new(Arc::clone(&metrics), background.clone(), stop.clone(), Arc::clone(&arrivals));
    let mut served = Vec::with_capacity(1 + settings.more_models.len());
    for model in settings.models() {
        served.push(builder.served(&settings, model).await?);
    }
    // The sessions belong to the data: each dataset's first model's
    // teacher set names it (its others are over the same subsets).
    let datasets = settings
        .datasets()
        .map(|dataset| {
            let first = settings.models().find(|m| m.dataset == dataset.name);
            let first = first.ok_or_else(|| StartError::UnknownDataset(dataset.name.clone()))?;
            Ok(store::DatasetTeachers {
                m: first.teachers.m(),
                fingerprint: teacher_fingerprint(&first.teachers),
                data: data_prefix(&first.teachers),
            })
        })
        .collect::<Result<Vec<_>, StartError>>()?;
    descriptors::provide(descriptors::need(&settings, served.iter().map(|s| s.ensemble.len()).sum()))?;
    if settings.calibration != Calibration::Certified {
        tracing::error!(
            calibration = ?settings.calibration,
            "THIS SERVER IS UNDER-NOISED ON PURPOSE (a test of pacpriv audit --canaries): its answers are not private"
        );
    }
    let wanted = store::Wanted { settings: &settings, datasets, metrics: &metrics, arrivals };
    let store::Opened { sessions, accounts, keyings } = store::open(wanted, &signalled).await?;
    if signalled.is_cancelled() {
        // SIGTERM while starting: nothing to drain, so nothing is opened.
        return Err(StartError::Stopped);
    }
    let built = served.into_iter().zip(keyings).map(|(served, keying)| Model::new(served, keying)).collect();
    let models = Models::new(settings.model.name.clone(), built);
    metrics.service.principals(accounts.len());
    for a in &accounts {
        for d in &a.datasets {
            let label = d.scope.account_of(&a.principal.name);
            metrics.service.budget(label, &d.dataset, d.budget.spent, d.budget.limit, d.budget.mia_bound);
        }
    }
    let principal_from_cert = settings.tls.as_ref().is_some_and(|t| t.principal_from_cert);
    let app = Arc::new(App {
        sessions,
        models: std::sync::RwLock::new(Arc::new(models)),
        principal_from_cert,
        metrics: Arc::clone(&metrics),
        ready: false.into(),
        draining: false.into(),
        rate: rate::RateLimit::new(settings.rate_limit),
        in_flight: crate::server::in_flight::InFlight::new(settings.max_calls_in_flight),
    });

    readiness::watch(Arc::clone(&app), health.clone(), settings.health_interval, &background, &stop).await;
    background.spawn(learn_active_keys(Arc::clone(&app), stop.clone()));
    tokio::spawn(drain(Arc::clone(&app), health, settings.drain_grace, signalled, stop.clone()));

    // Calls that need a credential are authenticated from their headers
    // before their body is read (`server::auth::CredentialFirst`).
    let privatizer = CredentialFirst::new(
        Arc::clone(&app),
        PrivatizerServer::new(Service::new(Arc::clone(&app)))
            .max_decoding_message_size(settings.max_message_bytes)
            .max_encoding_message_size(settings.max_message_bytes),
    );
    let inference = settings.inference_model.is_some().then(|| {
        CredentialFirst::new(
            Arc::clone(&app),
            GrpcInferenceServiceServer::new(inference::InferenceService::new(Arc::clone(&app)))
                .max_decoding_message_size(settings.max_message_bytes)
                .max_encoding_message_size(settings.max_message_bytes),
        )
    });
    let tls = settings.tls.as_ref().map(|t| ServerTls::load(&t.files())).transpose()?.map(Arc::new);
    let (listener, addr) = bind(settings.listen).await?;
    let privatizer_name = <PrivatizerServer<Service> as tonic::server::NamedService>::NAME;
    let client_services: Vec<&str> =
        std::iter::once(privatizer_name).chain(inference.is_some().then_some(INFERENCE)).collect();
    let client = net::builder(&settings.limits)
        .add_service(health_service.clone())
        .add_service(reflection(&client_services, settings.limits.max_connection_age)?)
        .add_service(privatizer)
        .add_optional_service(inference);
    servers.push(grpc(client, listener, tls.as_ref(), &settings.limits, &stop));

    let mut http_addr = None;
    if let (Some(listen), Some(_)) = (settings.http_listen, &settings.inference_model) {
        let (listener, bound) = bind(listen).await?;
        http_addr = Some(bound);
        let router = inference::http::router(Arc::clone(&app), settings.max_message_bytes, settings.limits.request);
        let limits = settings.limits;
        let stop = stop.clone();
        servers.push(match &tls {
            Some(tls) => {
                let connections =
                    tls_incoming(listener, Arc::clone(tls), Alpn::Http1, stop.clone(), limits.slots(), Watch::Nothing);
                Box::pin(async move {
                    net::http::serve(connections, router, &limits, stop).await;
                    Ok(())
                })
            }
            None => {
                let connections = guarded_incoming(listener, limits.slots(), Watch::Nothing, stop.clone());
                Box::pin(async move {
                    net::http::serve(connections, router, &limits, stop).await;
                    Ok(())
                })
            }
        });
    }

    let mut admin_addr = None;
    if let Some(admin) = &settings.admin {
        let (listener, bound) = bind(admin.listen).await?;
        admin_addr = Some(bound);
        // Both gated by the token before a body is read (health and
        // reflection stay open, as on every listener).
        let gate = admin::token_gate(admin.key_sha256);
        let service =
            AdminServer::with_interceptor(admin::AdminService::new(Arc::clone(&app), admin.key_sha256), gate.clone());
        // The model repository's load and unload (Triton's gRPC service,
        // its other calls UNIMPLEMENTED here: the client listener's).
        let repository = GrpcInferenceServiceServer::with_interceptor(
            admin::repository::RepositoryService::new(Arc::clone(&app), admin.key_sha256),
            gate,
        );
        let server = net::builder(&settings.limits)
            .add_service(health_service.clone())
            .add_service(reflection(
                &[<AdminServer<admin::AdminService> as tonic::server::NamedService>::NAME, INFERENCE],
                settings.limits.max_connection_age,
            )?)
            .add_service(service)
            .add_service(repository);
        servers.push(grpc(server, listener, tls.as_ref(), &settings.limits, &stop));
    } else {
        tracing::info!("admin API off: set admin.key_sha256 to provision principals at run time");
    }

    let mut metrics_addr = None;
    if let Some(listen) = settings.metrics.listen {
        let (listener, bound) = bind(listen).await?;
        metrics_addr = Some(bound);
        if settings.metrics.token_sha256.is_none() && !bound.ip().is_loopback() {
            tracing::warn!(%bound, "metrics listener off loopback with no metrics.token_sha256: anyone who reaches it \
                reads principal names and their spending; set a token or keep it on a private network");
        }
        let token = settings.metrics.token_sha256;
        let server = metrics::http::serve(listener, metrics, token, settings.limits, stop.clone());
        servers.push(Box::pin(async move {
            server.await;
            Ok(())
        }));
    }

    tracing::info!(%addr, http = ?http_addr, admin = ?admin_addr, health = ?health_addr, metrics = ?metrics_addr, teachers = settings.model.teachers.m(),
        scope = settings.dataset.scope.as_str(), per_query = settings.dataset.per_query.get(),
        datasets = settings.datasets().count(), models = settings.models().count(), tls = settings.tls.is_some(), "pacpriv serving");
    cancel_on_error.disarm();
    let server: Serving = Box::pin(run(servers, stop, settings.drain_deadline, background));
    let reloader = reload::Reloader::new(app, tls, builder, settings.clone());
    Ok(Started {
        addr,
        http: http_addr,
        admin: admin_addr,
        health: health_addr,
        metrics: metrics_addr,
        server,
        reloader,
    })
}

/// Runs `serving` from now on, on a task of its own (a listener that must
/// answer before [`serve`] returns), as a [`Serving`] that aborts it when
/// dropped.
/// Marks the active principals' keys as seen lately, now and every
/// [`crate::session::KNOWN_REFRESH`] until `stop` (`Sessions::learn_active_keys`).
async fn learn_active_keys(app: Arc<App>, stop: CancellationToken) {
    loop {
        if let Err(e) = app.sessions.learn_active_keys().await {
            tracing::warn!(error = %e, "reading the principals to mark their keys as known failed; trying again later");
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(crate::session::KNOWN_REFRESH) => {}
        }
    }
}

fn now(serving: Serving) -> Serving {
    let task = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(serving));
    Box::pin(async move { task.await.map_err(|e| ServeError::Task(e.to_string()))? })
}

/// Serves `router` on `listener` — through TLS when `tls` is set — with
/// every connection held to `limits` ([`net::guard`]), until `stop` is
/// cancelled.
fn grpc(
    router: tonic::transport::server::Router,
    listener: tokio::net::TcpListener,
    tls: Option<&Arc<ServerTls>>,
    limits: &Limits,
    stop: &CancellationToken,
) -> Serving {
    let done = stop.clone().cancelled_owned();
    let (slots, watch) = (limits.slots(), limits.h2_watch());
    match tls {
        Some(tls) => {
            let connections = tls_incoming(listener, Arc::clone(tls), Alpn::H2, stop.clone(), slots, watch);
            let server = router.serve_with_incoming_shutdown(connections, done);
            Box::pin(async move { Ok(server.await?) })
        }
        None => {
            let connections = guarded_incoming(listener, slots, watch, stop.clone());
            let server = router.serve_with_incoming_shutdown(connections, done);
            Box::pin(async move { Ok(server.await?) })
        }
    }
}

/// Once `signalled` (SIGTERM): readiness turns NOT_SERVING at once, the
/// listeners keep answering for `grace` (while load balancers and endpoint
/// lists catch up), then `stop` is cancelled: they stop accepting and
/// finish what is in flight ([`run`]).
async fn drain(
    app: Arc<App>,
    health: tonic_health::server::HealthReporter,
    grace: std::time::Duration,
    signalled: CancellationToken,
    stop: CancellationToken,
) {
    tokio::select! {
        () = signalled.cancelled() => {}
        () = stop.cancelled() => return,
    }
    tracing::info!(grace_ms = grace.as_millis() as u64, "shutdown signal: not ready any more, still answering");
    readiness::drain(&app, &health).await;
    tokio::select! {
        () = tokio::time::sleep(grace) => {}
        () = stop.cancelled() => {}
    }
    tracing::info!("drain grace over: no new connections; finishing the requests in flight");
    stop.cancel();
}

/// Runs every listener until `stop` is cancelled; the first to fail
/// cancels it for the others. Once stopped, the listeners finish their
/// requests in flight — for at most `deadline`, after which the rest are
/// dropped (an answer is released only once its charge is durable, so a
/// dropped request was either answered and charged or neither). Then
/// waits for the background tasks.
async fn run(
    servers: Vec<Serving>,
    stop: CancellationToken,
    deadline: std::time::Duration,
    background: TaskTracker,
) -> Result<(), ServeError> {
    let mut running: tokio::task::JoinSet<Result<(), ServeError>> = servers.into_iter().collect();
    let mut outcome = Ok(());
    let expired = async {
        stop.cancelled().await;
        tokio::time::sleep(deadline).await;
    };
    tokio::pin!(expired);
    loop {
        let done = tokio::select! {
            done = running.join_next() => done,
            () = &mut expired => {
                tracing::warn!(deadline_ms = deadline.as_millis() as u64, listeners = running.len(),
                    "requests still in flight at the drain deadline: dropping them");
                running.abort_all();
                while running.join_next().await.is_some() {}
                break;
            }
        };
        let Some(done) = done else { break };
        let result = done.map_err(|e| ServeError::Task(e.to_string())).and_then(|r| r);
        if let Err(e) = result
            && outcome.is_ok()
        {
            stop.cancel();
            outcome = Err(e);
        }
    }
    stop.cancel();
    background.close();
    background.wait().await;
    outcome
}

/// What every fingerprint of teachers over `source`'s subsets starts with,
/// when the configuration can tell: for the demo, its seed (which alone
/// draws the split and the subsets of its real examples); for remote
/// teachers nothing beyond the fingerprint itself (their subsets are the
/// operator's declaration). Two datasets whose remote teachers have the
/// same names and versions are refused even on two servers: the check errs
/// toward one secret, never two budgets.
fn data_prefix(source: &TeacherSource) -> Option<String> {
    match source {
        TeacherSource::Demo { seed, .. } => Some(format!("demo digits seed={seed} m=")),
        TeacherSource::Remote(_) => None,
    }
}

/// Names the teacher set s* indexes into: the demo's seed and m (however
/// they are served), or the remote models in order (endpoints may move;
/// the models may not).
fn teacher_fingerprint(source: &TeacherSource) -> String {
    match source {
        TeacherSource::Demo { models, seed, canaries: 0, .. } => format!("demo digits seed={seed} m={models}"),
        TeacherSource::Demo { models, seed, canaries, .. } => {
            format!("demo digits seed={seed} m={models} canaries={canaries}")
        }
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

/// The Open Inference Protocol's service name, as reflection lists it.
const INFERENCE: &str = <GrpcInferenceServiceServer<inference::InferenceService> as tonic::server::NamedService>::NAME;

/// Reflection advertising `services` and health (each listener names only
/// what it serves), its streams ending at their connection's `max_age`.
fn reflection(
    services: &[&str],
    max_age: std::time::Duration,
) -> Result<
    net::aged::Aged<
        tonic_reflection::server::v1::ServerReflectionServer<impl tonic_reflection::server::v1::ServerReflection>,
    >,
    StartError,
> {
    let health = <tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService> as tonic::server::NamedService>::NAME;
    let builder = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(crate::proto::INFERENCE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
    services
        .iter()
        .fold(builder, |builder, service| builder.with_service_name(*service))
        .with_service_name(health)
        .with_service_name("grpc.reflection.v1.ServerReflection")
        .build_v1()
        .map(|reflection| net::aged::Aged::new(reflection, max_age))
        .map_err(|e| StartError::Reflection(e.to_string()))
}
