//! What start-up needs from the store before anything is served — the
//! store open (PostgreSQL: connected and migrated), the deployment's
//! secret index established, the configured principals provisioned, their
//! accounts read, every model version's identity claimed — and, on PostgreSQL, waiting for a node that accepts
//! writes when none does yet ([`open`]).
//!
//! A replica that starts during a failover, before the database is up, or
//! while only a standby is reachable, would otherwise exit at once and be
//! restarted by its orchestrator in a loop, each time paying the teachers'
//! start again. Instead it waits about `store.start_wait_ms` (its health
//! listener already answers: liveness SERVING, readiness NOT_SERVING), and
//! only then exits, naming the last failure.
//!
//! # Invariants
//! - Each attempt opens everything afresh; whatever an attempt did is
//!   idempotent (migrations, the secret's first-writer-wins row,
//!   provisioning), so retrying is what a restarted process would do, and
//!   nothing from a failed attempt is kept.
//! - Only [`StoreError::Unreachable`] (no node accepted the connection or
//!   the write just now) is waited out. Any other failure — credentials, a
//!   missing database, the schema, another teacher set, a conflicting
//!   secret — ends the start at once with that failure.
//! - The wait ends at `store.start_wait_ms` after the first attempt, give
//!   or take the last attempt: each attempt is bounded by what is left of
//!   the wait, and never by less than `store.postgres_timeout_ms` (an
//!   attempt can hang where no socket timeout fires — a COMMIT waiting for
//!   a synchronous standby that is gone). The shutdown signal ends it at
//!   once, mid-attempt too: dropping the attempt closes its connections,
//!   which rolls back what it had begun — except a COMMIT already waiting
//!   for a standby, which stands once one returns (as each step is
//!   idempotent, the next start finds it done).

use super::StartError;
use super::identity::{self, IdentityError};
use crate::metrics::Metrics;
use crate::server::models::CacheKeying;
use crate::session::secret::{self, SecretError};
use crate::session::{Account, DatasetTerms, SessionError, SessionParams, Sessions};
use crate::settings::{Settings, StoreSettings};
use pacpriv_store::{Arrivals, EmbeddedStore, PgStore, Store, StoreError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The first pause between attempts; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// The longest pause between attempts: a failover's end is seen within it.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What the service needs from the store to start.
pub struct Opened {
    /// The sessions, every configured principal provisioned.
    pub sessions: Sessions,
    /// The active principals' accounts, for the budget metrics.
    pub accounts: Vec<Account>,
    /// How each model version keys its answers, in the order of
    /// [`Settings::models`], every identity claimed ([`identity`]).
    pub keyings: Vec<CacheKeying>,
}

/// What [`open`] opens: the store, principals and privacy parameters
/// `settings` name, and each of its datasets' secret index.
pub struct Wanted<'a> {
    /// The whole configuration.
    pub settings: &'a Settings,
    /// Each dataset's teachers, in the order of [`Settings::datasets`].
    pub datasets: Vec<DatasetTeachers>,
    /// Where the store reports its transactions.
    pub metrics: &'a Metrics,
    /// The teachers' answers on their way to the store (the embedded
    /// writer gathers their records into one sync).
    pub arrivals: Arc<Arrivals>,
}

/// What a dataset's secret index points into.
pub struct DatasetTeachers {
    /// m.
    pub m: usize,
    /// The teacher set's name (its first model's teachers).
    pub fingerprint: String,
    /// What every teacher set over the same subsets is named starting
    /// with, when the configuration can tell (the demo: its seed).
    pub data: Option<String>,
}

/// Opens what `wanted` names, waiting up to `store.start_wait_ms` for a
/// PostgreSQL node that accepts writes (module documentation); gives up
/// early when `signalled` (the shutdown signal) is cancelled.
///
/// # Errors
/// [`StartError::NoWritableStore`] once the wait is over,
/// [`StartError::Stopped`] on the signal, any other failure at once.
pub async fn open(wanted: Wanted<'_>, signalled: &CancellationToken) -> Result<Opened, StartError> {
    let (wait, patience) = match &wanted.settings.store {
        StoreSettings::Postgres { start_wait, link, .. } => (*start_wait, link.timeout),
        StoreSettings::Embedded { .. } => (Duration::ZERO, Duration::MAX),
    };
    let started = Instant::now();
    let mut backoff = FIRST_BACKOFF;
    let mut attempts: u32 = 0;
    loop {
        attempts += 1;
        // An attempt may hang where no socket timeout fires: a COMMIT
        // waiting for a synchronous standby that is gone. It has what is
        // left of the wait, and never less than one `postgres_timeout_ms`.
        let within = wait.saturating_sub(started.elapsed()).max(patience);
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(within, attempt(&wanted)) => outcome,
            () = signalled.cancelled() => return Err(StartError::Stopped),
        };
        let e = match outcome {
            Ok(Ok(opened)) => {
                if attempts > 1 {
                    tracing::info!(attempts, waited_ms = millis(started.elapsed()), "the database accepts writes");
                }
                return Ok(opened);
            }
            Ok(Err(e)) if unreachable(&e) => e,
            Ok(Err(e)) => return Err(e),
            Err(_) => StartError::Store(StoreError::Unreachable(format!(
                "connecting, migrating, establishing the secret and provisioning did not finish within {} ms",
                millis(within)
            ))),
        };
        let waited = started.elapsed();
        if signalled.is_cancelled() {
            return Err(StartError::Stopped);
        }
        if waited >= wait {
            return Err(StartError::NoWritableStore { wait_ms: millis(wait), attempts, last: Box::new(e) });
        }
        let pause = backoff.min(wait - waited);
        tracing::warn!(attempt = attempts, waited_ms = millis(waited), wait_ms = millis(wait), error = %e,
            "no database node accepts writes yet: waiting (readiness NOT_SERVING)");
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = signalled.cancelled() => return Err(StartError::Stopped),
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One attempt at everything, from nothing.
async fn attempt(wanted: &Wanted<'_>) -> Result<Opened, StartError> {
    let settings = wanted.settings;
    let store = open_store(&settings.store, wanted.metrics, &wanted.arrivals).await?;
    let mut datasets = Vec::with_capacity(wanted.datasets.len());
    // The datasets an earlier release created, whose versions keep its
    // cache keys (`identity`'s module documentation).
    let mut legacy = std::collections::HashMap::new();
    for (dataset, teachers) in settings.datasets().zip(&wanted.datasets) {
        let index = dataset.secret_index_file.as_deref();
        let (m, fingerprint, data) = (teachers.m, &teachers.fingerprint, teachers.data.as_deref());
        let secret = secret::establish(&store, &dataset.name, index, m, fingerprint, data).await?;
        let noise = secret::establish_noise_key(&store, &dataset.name).await?;
        legacy.insert(dataset.name.as_str(), !store.identity_keyed(&dataset.name).await?);
        let params = SessionParams {
            per_query: dataset.per_query,
            policy: dataset.policy,
            m: teachers.m,
            secret,
            noise,
            journal: settings.journal,
            cache: dataset.cache,
            calibration: settings.calibration,
        };
        datasets.push(DatasetTerms {
            name: dataset.name.as_str().into(),
            scope: dataset.scope,
            global_budget: dataset.global_budget,
            params: Arc::new(params),
        });
    }
    let sessions = Sessions::new(&settings.principals, datasets, &store).await?.refusing(settings.refused_key);
    let accounts = sessions.active_accounts().await?;
    let mut keyings = Vec::with_capacity(1 + settings.more_models.len());
    for model in settings.models() {
        let legacy = legacy.get(model.dataset.as_str()).copied().unwrap_or(false);
        keyings.push(identity::claim(&store, model, legacy, &settings.model.name).await?);
    }
    for (dataset, _) in legacy.iter().filter(|(_, legacy)| **legacy) {
        store.mark_identity_keyed(dataset).await?;
    }
    Ok(Opened { sessions, accounts, keyings })
}

/// The configured store, opened (and, for PostgreSQL, migrated).
async fn open_store(
    settings: &StoreSettings,
    metrics: &Metrics,
    arrivals: &Arc<Arrivals>,
) -> Result<Store, StoreError> {
    Ok(match settings {
        StoreSettings::Embedded { path } => {
            Store::Embedded(Arc::new(EmbeddedStore::open_with(path, metrics.store.clone(), Arc::clone(arrivals))?))
        }
        StoreSettings::Postgres { url, link, .. } => {
            Store::Postgres(Arc::new(PgStore::connect(url, link).await?.observed(metrics.store.clone())))
        }
    })
}

/// Whether `e` is the store's "no node accepts this now", however deep.
fn unreachable(e: &StartError) -> bool {
    let store = match e {
        StartError::Store(e)
        | StartError::Secret(SecretError::Store(e))
        | StartError::Identity(IdentityError::Store { source: e, .. })
        | StartError::Sessions(SessionError::Store(e) | SessionError::Registry(e)) => e,
        _ => return false,
    };
    matches!(store, StoreError::Unreachable(_))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
