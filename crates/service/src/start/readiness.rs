//! Readiness: the health status follows the default model's teachers, so
//! a load balancer or Kubernetes readiness probe stops sending queries
//! that could only fail with UNAVAILABLE. Each other model's readiness is
//! its own (`ModelReady`, the repository index): one model's teachers
//! being down does not take the others out of service.

use crate::proto::pacpriv::privatizer_server::PrivatizerServer;
use crate::server::{App, Service};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

/// The health service name that is SERVING for as long as the process
/// serves at all, for liveness probes: teachers being down is a reason to
/// stop routing queries here (readiness), not to restart this process.
pub const LIVENESS_SERVICE: &str = "liveness";

/// While the service is being built (the teachers, the store): alive
/// ([`LIVENESS_SERVICE`] SERVING, from now on) but not ready (the server,
/// "", and `pacpriv.v1.Privatizer` NOT_SERVING).
pub async fn starting(health: &HealthReporter) {
    health.set_service_status(LIVENESS_SERVICE, ServingStatus::Serving).await;
    readiness(health, ServingStatus::NotServing).await;
}

/// Keeps the health status of `pacpriv.v1.Privatizer` (and of the server,
/// "") SERVING exactly while every teacher of the default model reports
/// its model ready, and each model's own readiness. Probes
/// once before returning, then every `every` on a task of `background`
/// until `stop`.
pub async fn watch(
    app: Arc<App>,
    health: HealthReporter,
    every: std::time::Duration,
    background: &TaskTracker,
    stop: &CancellationToken,
) {
    let mut missing = probe(&app).await;
    set_health(&app, &health, missing).await;
    let stop = stop.clone();
    background.spawn(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(every) => {}
            }
            let now = probe(&app).await;
            if (now == 0) != (missing == 0) {
                set_health(&app, &health, now).await;
            }
            missing = now;
        }
    });
}

/// Probes every model's teachers at once and records each model's
/// readiness; returns how many of the default model's are not ready (of
/// the version a request naming no model is answered by). The
/// gauge counts every model's teachers.
async fn probe(app: &App) -> usize {
    let models = app.models();
    let missing = futures_util::future::join_all(models.iter().map(|m| m.ensemble.not_ready())).await;
    for (model, &missing) in models.iter().zip(&missing) {
        model.set_teachers_ready(missing == 0);
    }
    let total: usize = models.iter().map(|m| m.ensemble.len()).sum();
    app.metrics.teachers.readiness(total.saturating_sub(missing.iter().sum()), total);
    // The version a request naming no model is answered by (a ready one
    // when there is one); none, when every version is unloaded.
    let default = models.serving("", "").ok();
    models.iter().zip(&missing).find(|(m, _)| default.is_some_and(|d| Arc::ptr_eq(d, m))).map_or(0, |(_, &n)| n)
}

async fn set_health(app: &App, health: &HealthReporter, missing: usize) {
    if app.draining.load(Ordering::SeqCst) {
        return;
    }
    app.ready.store(missing == 0, Ordering::SeqCst);
    readiness(health, if missing == 0 { ServingStatus::Serving } else { ServingStatus::NotServing }).await;
    tracing::info!(ready = missing == 0, teachers_not_ready = missing, "teacher readiness");
    // A drain that began while this ran wins.
    if app.draining.load(Ordering::SeqCst) {
        drain(app, health).await;
    }
}

/// Drains: from now on readiness (gRPC health of the server and of
/// `pacpriv.v1.Privatizer`, and what the Open Inference Protocol's
/// readiness calls report) is NOT_SERVING for good, while the listeners go
/// on answering; liveness stays SERVING.
pub async fn drain(app: &App, health: &HealthReporter) {
    app.draining.store(true, Ordering::SeqCst);
    app.ready.store(false, Ordering::SeqCst);
    readiness(health, ServingStatus::NotServing).await;
}

/// Readiness as health reports it: of the server ("") and of
/// `pacpriv.v1.Privatizer`.
async fn readiness(health: &HealthReporter, status: ServingStatus) {
    for name in ["", <PrivatizerServer<Service> as tonic::server::NamedService>::NAME] {
        health.set_service_status(name, status).await;
    }
}
