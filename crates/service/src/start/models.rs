//! A model version's teachers, built from its settings: the demo's
//! trained and served on a listener of their own, remote ones connected,
//! their TLS checked ([`Builder`]) — at start, and again when a reload
//! adds a model or a version (`super::reload`).
//!
//! # Invariants
//! - A version's own tasks (the demo teachers' server) end when the
//!   version is dropped — once no request holds it — or at shutdown,
//!   whichever is first ([`Served::teachers_running`]).

use super::StartError;
#[cfg(feature = "demo")]
use super::bind;
use crate::metrics::Metrics;
use crate::server::input::InputSpec;
use crate::server::models::Served;
use crate::settings::{ModelSettings, Settings, TeacherSource};
use crate::teachers::Ensemble;
#[cfg(feature = "demo")]
use crate::teachers::Teachers;
#[cfg(feature = "demo")]
use crate::teachers::demo::{self, DemoServer};
#[cfg(feature = "demo")]
use pacpriv_demo::Trained;
use pacpriv_store::Arrivals;
#[cfg(feature = "demo")]
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Builds model versions' teachers for the running service.
#[derive(Clone)]
pub struct Builder {
    /// Where their teacher series are.
    metrics: Arc<Metrics>,
    /// Holds the demo teachers' servers, waited for at shutdown.
    background: TaskTracker,
    /// Shutdown: every version's tasks end with it.
    stop: CancellationToken,
    /// Where every version's teachers count their answers on their way
    /// to the store.
    arrivals: Arc<Arrivals>,
}

impl Builder {
    pub(super) fn new(
        metrics: Arc<Metrics>,
        background: TaskTracker,
        stop: CancellationToken,
        arrivals: Arc<Arrivals>,
    ) -> Self {
        Builder { metrics, background, stop, arrivals }
    }

    /// `model` of `settings`, its teachers started and checked (not yet
    /// probed for readiness).
    ///
    /// # Errors
    /// Its dataset is not configured, the demo failed to train or bind,
    /// or its teachers' TLS does not check.
    pub async fn served(&self, settings: &Settings, model: &ModelSettings) -> Result<Served, StartError> {
        let dataset = settings.dataset_of(model).ok_or_else(|| StartError::UnknownDataset(model.dataset.clone()))?;
        let release_noisy = settings.datasets().nth(dataset).is_some_and(|d| d.release_noisy_vector);
        let own = self.stop.child_token();
        // Guarded before anything starts: a build that fails after its
        // demo server started (a later check, a reload refused) stops it.
        let teachers_running = own.clone().drop_guard();
        let ensemble = ensemble(model, &self.metrics, &self.background, &own, &self.arrivals).await?;
        Ok(Served {
            name: model.name.clone(),
            version: model.version.clone(),
            dataset,
            ensemble,
            input: InputSpec { shape: model.input_shape.clone(), release_noisy, max_rows: settings.max_batch_rows },
            teachers_running,
        })
    }
}

/// What the demo ensemble is trained from.
#[cfg(feature = "demo")]
struct Demo {
    models: usize,
    seed: u64,
    learner: pacpriv_demo::Learner,
    canaries: usize,
}

/// Starts the demo teachers on their own loopback listener (a task of this
/// runtime, ended by `stop`) and returns how to ask them: m models, or
/// their stacked one.
#[cfg(feature = "demo")]
async fn start_demo(
    Demo { models, seed, learner, canaries }: Demo,
    listen: SocketAddr,
    stacked: bool,
    background: &TaskTracker,
    stop: &CancellationToken,
) -> Result<Teachers, StartError> {
    let started = std::time::Instant::now();
    let ensemble = tokio::task::spawn_blocking(move || Trained::train_learner(models, seed, learner, canaries))
        .await
        .map_err(|e| StartError::Demo(e.to_string()))?
        .map_err(StartError::Demo)?;
    let (listener, addr) = bind(listen).await?;
    tracing::info!(models, %addr, seconds = started.elapsed().as_secs_f64(), "demo teachers trained and serving");
    background.spawn(DemoServer::new(ensemble.teachers).serve(listener, stop.clone().cancelled_owned()));
    Ok(if stacked {
        Teachers::Stacked { spec: demo::stacked_spec(addr), models }
    } else {
        Teachers::PerTeacher(demo::specs(addr, models))
    })
}

/// `model`'s teachers (the demo ones trained and served first), their
/// TLS checked.
async fn ensemble(
    model: &ModelSettings,
    metrics: &Metrics,
    background: &TaskTracker,
    stop: &CancellationToken,
    arrivals: &Arc<Arrivals>,
) -> Result<Ensemble, StartError> {
    let teachers = match &model.teachers {
        #[cfg(feature = "demo")]
        TeacherSource::Demo { models, seed, listen, stacked, learner, regularisation, canaries } => {
            let demo =
                Demo { models: *models, seed: *seed, learner: learner.with(*regularisation), canaries: *canaries };
            start_demo(demo, *listen, *stacked, background, stop).await?
        }
        // Refused when the settings were read (teachers.source); kept
        // as an error, not a panic, should a caller build settings by hand.
        #[cfg(not(feature = "demo"))]
        TeacherSource::Demo { .. } => {
            // Only the demo teachers run as tasks of their own.
            let _ = (background, stop);
            return Err(StartError::Demo(crate::settings::NO_DEMO.into()));
        }
        TeacherSource::Remote(teachers) => teachers.clone(),
    };
    let series = metrics.teachers.of_model(&model.name, &model.version);
    let ensemble =
        Ensemble::new(teachers, model.call.clone(), model.mode, model.batching, &series, Arc::clone(arrivals))?;
    ensemble.check_tls().await?;
    Ok(ensemble)
}
