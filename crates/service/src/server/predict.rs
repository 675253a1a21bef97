//! `Predict`: one private prediction. The pipeline every answer takes, in
//! three phases that [`predict_stream`](super::predict_stream) also runs
//! (overlapping across a stream's queries):
//!
//! 1. [`ask`]: validate, refuse early if even the cheapest answer no longer
//!    fits, ask all m teachers (no lock held);
//! 2. [`step`]: one step of Algorithm 1 on the session, charged, its record
//!    queued for the store ([`Handle::begin`]);
//! 3. [`respond`]: wait until the record the answers depend on is durable
//!    (none, for free answers: `store::Release`), then the response.

use super::App;
use super::input::Query;
use super::models::{Model, Models};
use super::output;
use super::rate::{Admitted, Over};
use super::statistics::Timings;
use super::status::{self, ServiceError};
use crate::metrics::{Rpc, Stage};
use crate::proto::pacpriv::{PredictRequest, PredictResponse, RowAnswer};
use crate::session::cache::CacheKey;
use crate::session::{Asking, Caller, DatasetIndex, Handle, ModelTag, Preflight, Reply, SessionError, Step};
use pacpriv_privacy::mechanism::TeacherOutputs;
use pacpriv_store::Arrival;
use std::sync::Arc;
use std::time::Instant;
use tracing::{Instrument, Span};

/// A request on its way: its span (principal, query id), when it
/// arrived, the model version it was resolved to and how long its phases
/// took (for that version's [`super::statistics::Statistics`]), carried through every phase.
pub struct Traced<T> {
    /// What the phase produced.
    value: T,
    span: Span,
    started: Instant,
    model: Option<Arc<Model>>,
    timings: Timings,
}

/// A request that failed in some phase, with its trace.
pub type Failed = Traced<ServiceError>;

impl Failed {
    /// Logs the failure and records its outcome and latency; the error.
    pub fn record(self, app: &App, rpc: Rpc) -> ServiceError {
        self.span.in_scope(|| tracing::info!(error = %self.value, "not answered"));
        app.metrics.service.query(status::outcome(&self.value));
        app.metrics.service.duration(rpc, self.started.elapsed().as_secs_f64());
        if let Some(model) = &self.model {
            model.stats.failed(self.started.elapsed());
        }
        self.value
    }
}

impl<T> Traced<T> {
    fn fail(&self, e: impl Into<ServiceError>) -> Failed {
        self.then(e.into())
    }

    fn then<U>(&self, value: U) -> Traced<U> {
        let (span, model) = (self.span.clone(), self.model.clone());
        Traced { value, span, started: self.started, model, timings: self.timings }
    }

    /// The phase's value, and the trace that goes on to the next phase.
    fn take(self) -> (T, Traced<()>) {
        let Traced { value, span, started, model, timings } = self;
        (value, Traced { value: (), span, started, model, timings })
    }
}

/// A validated query the teachers have answered — or, for the rows the
/// session answered before, did not need to.
pub struct Asked {
    query: Query,
    /// The dataset of the model asked: whose session the step charges.
    dataset: DatasetIndex,
    /// The model asked, as the journal records it.
    model: ModelTag,
    /// Each row's key in the session's answer cache (this principal's
    /// partition).
    keys: Vec<CacheKey>,
    /// Each row's teacher outputs; `None` for a row the session knows.
    outputs: Vec<Option<TeacherOutputs>>,
    /// The asked rows, counted on their way to the store until the step
    /// has queued its record ([`Handle::begin`]).
    arriving: Vec<Arrival>,
}

impl Traced<Asked> {
    /// Stops counting its rows on their way to the store
    /// (`pacpriv_store::Arrivals`): for a fan-out that waits in a stream's
    /// queue behind earlier steps, whose own step may be far off.
    pub fn queued(mut self) -> Self {
        self.value.arriving.clear();
        self
    }
}

/// A charged step whose record is on its way to the store.
pub struct Taken {
    query: Query,
    /// The model version that answers.
    model: ModelTag,
    step: Step,
    /// The session charged.
    handle: Handle,
}

/// Answers one request of `rpc` for an authenticated caller, recording its
/// outcome and latency.
///
/// # Errors
/// Invalid input, exhausted budget, unavailable teachers, a core refusal —
/// nothing charged — or a failed commit (charged, withheld).
pub async fn handle(
    app: &Arc<App>,
    caller: &Caller,
    request: PredictRequest,
    rpc: Rpc,
) -> Result<PredictResponse, ServiceError> {
    let result = async {
        // Held until answered; a refusal goes through `ask`, traced.
        let (admitted, _place) = match app.in_flight.enter(caller.principal()) {
            Ok(place) => (app.rate.admit(caller.principal()), Some(place)),
            Err(refused) => (Err(refused), None),
        };
        let asked = ask(app, caller, request, admitted, Over::Refuse).await?;
        let taken = step_rechecked(app, caller, asked).await?;
        respond(app, taken, rpc).await
    };
    result.await.map_err(|f| f.record(app, rpc))
}

/// Phase 1: given the principal's rate limit's verdict on the request's
/// first token (a token, or the refusal), validates `request`, takes a
/// token for each further row (`over`: refused or paced), and asks every
/// teacher about each row the session has not answered before, unless the
/// session cannot pay even for the cheapest answers. In three steps:
/// [`resolve`] (the version named and the input against its shape),
/// [`choose`] (the version that answers, and what the session knows of
/// each row), [`fan_out`] (the teachers, for the rows it does not).
///
/// # Errors
/// Rate limited, invalid input, exhausted budget, unavailable teachers
/// (nothing charged).
pub async fn ask(
    app: &Arc<App>,
    caller: &Caller,
    request: PredictRequest,
    admitted: Result<Admitted, ServiceError>,
    over: Over,
) -> Result<Traced<Asked>, Failed> {
    let models = app.models();
    let resolved = resolve(&models, caller, request);
    admitted.map_err(|e| resolved.fail(e))?;
    let (resolved, mut traced) = resolved.take();
    let resolved = resolved.map_err(|e| traced.fail(e))?;
    let (query, handle) = (&resolved.query, &resolved.handle);
    let chosen = async {
        app.rate.take_more(handle.principal(), query.rows.len() - 1, over).await?;
        choose(&models, &resolved).await
    };
    let Chosen { model, keys, found } = chosen.instrument(traced.span.clone()).await.map_err(|e| traced.fail(e))?;
    // The version that answers (a request may have been switched to another).
    traced.model = Some(Arc::clone(&model));
    let admitted = Instant::now();
    app.metrics.service.stage(Stage::Admission, (admitted - traced.started).as_secs_f64());
    let asks_teachers = found.contains(&Preflight::Ask);
    let (outputs, arriving) =
        fan_out(&model, query, found).instrument(traced.span.clone()).await.map_err(|e| traced.fail(e))?;
    let fanout = asks_teachers.then(|| admitted.elapsed());
    if let Some(took) = fanout {
        app.metrics.service.stage(Stage::Fanout, took.as_secs_f64());
    }
    traced.timings = Timings { queue: admitted - traced.started, fanout, ..Timings::default() };
    let Resolved { query, .. } = resolved;
    Ok(traced.then(Asked { query, dataset: model.dataset, model: model.tag().clone(), keys, outputs, arriving }))
}

/// A request resolved to the model version it names, and its input parsed
/// against that version's shape.
struct Resolved {
    model: Arc<Model>,
    /// For a named version that is unloaded: the refusal to give unless
    /// the session answered every row before.
    unloaded: Option<String>,
    /// Whether the request named its version (one that names none may be
    /// answered by another version that answered every row).
    named_version: bool,
    query: Query,
    /// The caller's session in the model's dataset.
    handle: Handle,
}

/// Step 1: the model version `request` names (the model's name and the
/// dataset it charges are the client's choice, public) and its input
/// against that version's shape, traced from here on: the span carries
/// the principal and the query id whatever fails.
fn resolve(models: &Models, caller: &Caller, request: PredictRequest) -> Traced<Result<Resolved, ServiceError>> {
    let started = Instant::now();
    let named_version = !request.model_version.is_empty();
    let resolved = version(models, &request.model, &request.model_version);
    let resolved_model = resolved.as_ref().ok().map(|(model, _)| Arc::clone(model));
    let parsed = resolved.and_then(|(model, unloaded)| {
        let query = model.input.parse(request)?;
        let handle = caller.on(model.dataset)?.clone();
        Ok(Resolved { model, unloaded, named_version, query, handle })
    });
    let query_id = parsed.as_ref().map(|r| r.query.query_id.clone()).unwrap_or_default();
    let span = tracing::info_span!("query", principal = %caller.principal(), query_id = %query_id);
    Traced { value: parsed, span, started, model: resolved_model, timings: Timings::default() }
}

/// The version that answers, each row's key in the session's answer
/// cache under it, and what the session knows of each row.
struct Chosen {
    model: Arc<Model>,
    keys: Vec<CacheKey>,
    found: Vec<Preflight>,
}

/// Each row's key in `handle`'s answer cache for `model`'s answers.
fn keys_of(handle: &Handle, model: &Model, query: &Query) -> Vec<CacheKey> {
    query.rows.iter().map(|r| handle.cache_key(model.digest(r.digest))).collect()
}

/// Step 2: the version that answers, and one read of the session
/// ([`Handle::preflight`]) for what it knows of each row.
///
/// An answer is released again, free, by the version that gave it (the
/// cache keys the version): a request naming an unloaded version is
/// answered if the session holds every row's answer; one naming none, by
/// another version that answered every row, if the one resolved did not
/// (a retry after the newest version changed). Both are the session's own
/// history; neither asks a teacher. One read of the session, for every
/// version at once.
///
/// # Errors
/// The unloaded version's refusal, an exhausted budget, a store error.
async fn choose(models: &Models, resolved: &Resolved) -> Result<Chosen, ServiceError> {
    let Resolved { model: named, unloaded, named_version, query, handle } = resolved;
    let (mut model, mut keys, mut switched) = (Arc::clone(named), keys_of(handle, named, query), false);
    if let Some(refusal) = unloaded {
        if handle.first_answered(std::slice::from_ref(&keys)).await?.is_none() {
            return Err(ServiceError::Unloaded(refusal.clone()));
        }
    } else if !named_version && models.versions(&model.name).len() > 1 {
        let others: Vec<&Arc<Model>> =
            models.versions(&model.name).iter().rev().filter(|m| !Arc::ptr_eq(m, named)).collect();
        let candidates: Vec<Vec<CacheKey>> =
            std::iter::once(keys.clone()).chain(others.iter().map(|m| keys_of(handle, m, query))).collect();
        if let Some(i) = handle.first_answered(&candidates).await?
            && let Some(other) = i.checked_sub(1).and_then(|j| others.get(j))
        {
            (model, keys, switched) = (Arc::clone(other), candidates[i].clone(), true);
        }
    }
    // One read of the session: a repeat costs nothing and needs no
    // teacher (its refusal, if its answer was evicted, neither).
    let row_id = query.row_id(0);
    let tentative = unloaded.is_some() || switched;
    let found = handle.preflight(&keys, (!tentative).then_some(row_id.as_str())).await;
    // For an unloaded version, or one the request was switched to, an
    // answer the read above found was evicted since (by another request
    // of the session, or on another replica) if any row needs a fresh
    // answer (or the budget for one): such a version is never asked
    // afresh, and its budget refusal is not this request's. An unloaded
    // version's request is refused; a switched one goes to the version
    // resolved, whose preflight journals its own refusal.
    let fresh = |found: &Result<Vec<Preflight>, SessionError>| match found {
        Ok(found) => found.contains(&Preflight::Ask),
        Err(SessionError::Exhausted { .. }) => true,
        Err(_) => false,
    };
    match (unloaded, tentative && fresh(&found)) {
        (Some(refusal), true) => Err(ServiceError::Unloaded(refusal.clone())),
        (None, true) => {
            let keys = keys_of(handle, named, query);
            let found = handle.preflight(&keys, Some(&row_id)).await?;
            Ok(Chosen { model: Arc::clone(named), keys, found })
        }
        (_, false) => Ok(Chosen { model, keys, found: found? }),
    }
}

/// Step 3: every teacher of `model`, about each row the session does not
/// know (`None` for a row it knows), and the asked rows' counts on their
/// way to the store. The rows' fan-outs run at once (and so share the
/// teachers' batches); any failure fails the request, nothing charged.
///
/// # Errors
/// Unavailable teachers, or a reply that is not an answer.
async fn fan_out(
    model: &Model,
    query: &Query,
    found: Vec<Preflight>,
) -> Result<(Vec<Option<TeacherOutputs>>, Vec<Arrival>), ServiceError> {
    // One row keeps the count its batch gave it; several are counted only
    // once all are answered, so that rows answered early do not hold the
    // store's writer while a later batch (or a retry) is out.
    let several = found.iter().filter(|f| **f == Preflight::Ask).count() > 1;
    let asks = query.rows.iter().zip(found).map(|(row, found)| async move {
        match found {
            Preflight::Known => Ok::<_, ServiceError>(None),
            Preflight::Ask => {
                let (outputs, arrival) = model.ensemble.query(&row.features).await?;
                Ok(Some((outputs, (!several).then_some(arrival))))
            }
        }
    });
    let mut arriving = Vec::new();
    let outputs = futures_util::future::try_join_all(asks)
        .await?
        .into_iter()
        .map(|row| {
            row.map(|(outputs, arrival)| {
                arriving.push(arrival.unwrap_or_else(|| model.ensemble.arrive()));
                outputs
            })
        })
        .collect();
    Ok((outputs, arriving))
}

/// The version of `name` (empty: the default model) at `version` (empty:
/// the one [`Models::serving`] chooses) a request is asked of; with the
/// refusal ([`ServiceError::Unloaded`]'s message) to give if the session
/// has not answered it before, for a named version that is unloaded.
///
/// # Errors
/// [`ServiceError::NotFound`], or [`ServiceError::Unloaded`] for a model
/// whose every version is unloaded.
fn version(models: &Models, name: &str, version: &str) -> Result<(Arc<Model>, Option<String>), ServiceError> {
    match models.serving(name, version) {
        Ok(model) => Ok((Arc::clone(model), None)),
        Err(ServiceError::Unloaded(refusal)) if !version.is_empty() => {
            Ok((Arc::clone(models.named(models.model_name(name), version)?), Some(refusal)))
        }
        Err(e) => Err(e),
    }
}

/// Phase 2: one step of Algorithm 1 on `caller`'s session in the asked
/// model's dataset for each row (all or none), charged and queued for the
/// store. A session's steps happen in the order of these calls.
///
/// # Errors
/// A budget that cannot pay for every row, or a core refusal (nothing
/// charged).
pub async fn step(app: &App, caller: &Caller, asked: Traced<Asked>) -> Result<Traced<Taken>, Failed> {
    let (Asked { query, dataset, model, keys, outputs, arriving }, mut traced) = asked.take();
    let handle = caller.on(dataset).map_err(|e| traced.fail(e))?.clone();
    let rows = keys
        .into_iter()
        .zip(outputs)
        .enumerate()
        .map(|(i, (key, outputs))| {
            let asking = Asking {
                alpha: query.alpha,
                query_id: query.row_id(i),
                key: Some(key),
                return_noisy: query.return_noisy,
                model: model.clone(),
            };
            (outputs, asking)
        })
        .collect();
    let stepping = Instant::now();
    let begun = handle.begin(rows, arriving).instrument(traced.span.clone()).await;
    let step = begun.map_err(|e| traced.fail(e))?;
    traced.timings.step = stepping.elapsed();
    app.metrics.service.stage(Stage::Calibration, traced.timings.step.as_secs_f64());
    Ok(traced.then(Taken { query, model, step, handle }))
}

/// Phase 2 as every query takes it: the call authenticated when it
/// arrived (a stream, once when it opened), and its fan-out may have
/// taken long since; its credential must still name the same active
/// principal, and the step is charged against that principal's budget as
/// it is now — so a revocation, a rotated key or a budget cut (a reload,
/// the admin API, or another replica) reaches a call in flight before its
/// charge, and an open stream before its next one.
///
/// # Errors
/// Revoked or rotated (UNAUTHENTICATED, nothing charged), as [`step`].
pub async fn step_rechecked(app: &App, caller: &Caller, asked: Traced<Asked>) -> Result<Traced<Taken>, Failed> {
    match app.sessions.recheck(caller).await {
        Ok(current) => step(app, &current, asked).await,
        Err(e) => Err(asked.fail(e)),
    }
}

/// Phase 3: the response, once the step may be released.
///
/// # Errors
/// The commit failed: the answer is withheld, its charge stands.
pub async fn respond(app: &App, taken: Traced<Taken>, rpc: Rpc) -> Result<PredictResponse, Failed> {
    let (Taken { query, model, step, handle }, mut traced) = taken.take();
    let charging = Instant::now();
    let (replies, view) = step.release().await.map_err(|e| traced.fail(e))?;
    traced.timings.durable = charging.elapsed();
    app.metrics.service.stage(Stage::DurableCharge, traced.timings.durable.as_secs_f64());
    let charged: f64 = replies.iter().map(|r| r.charge.get()).sum();
    traced.span.in_scope(|| {
        tracing::info!(
            rows = replies.len(),
            charged,
            unanimous = replies.iter().filter(|r| r.unanimous).count(),
            cached = replies.iter().filter(|r| r.cached).count(),
            spent = view.spent,
            "answered"
        );
    });
    for r in &replies {
        app.metrics.service.answered(r.unanimous, r.charge.get(), r.cached);
    }
    app.metrics.service.budget(handle.account_label(), handle.dataset(), view.spent, view.limit, view.mia_bound);
    app.metrics.service.duration(rpc, traced.started.elapsed().as_secs_f64());
    let rows = replies
        .into_iter()
        .map(|r| row_answer(r, query.return_noisy))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| traced.fail(e))?;
    if let Some(version) = &traced.model {
        version.count_answers(&app.metrics.service, rows.len());
        version.stats.answered(rows.len(), traced.started.elapsed(), &traced.timings);
    }
    let first = rows.first().cloned().unwrap_or_default();
    Ok(PredictResponse {
        query_id: query.query_id,
        label: first.label,
        unanimous: first.unanimous,
        mi_charged: charged,
        budget: Some(output::budget(handle.principal(), handle.dataset(), handle.scope(), &view)),
        confident: first.confident,
        noisy: first.noisy,
        cached: first.cached,
        rows,
        model: model.name.to_string(),
        model_version: model.version.to_string(),
    })
}

/// One row's answer on the wire.
fn row_answer(reply: Reply, return_noisy: bool) -> Result<RowAnswer, ServiceError> {
    let label = u32::try_from(reply.label).map_err(|_| ServiceError::Internal("label out of range".into()))?;
    Ok(RowAnswer {
        label,
        unanimous: reply.unanimous,
        mi_charged: reply.charge.get(),
        confident: reply.confident,
        noisy: if return_noisy { reply.published } else { Vec::new() },
        cached: reply.cached,
    })
}
