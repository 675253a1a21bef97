//! An authenticated caller's [`Handle`] on its session: the preflight (one
//! read), the step under the cell's lock, and the [`Step`] whose answers
//! are reachable only once what they were charged is durable.
//!
//! # Invariants
//! - The lock is held only around the math, never across the teacher
//!   fan-out nor the fsync.
//! - An answer leaves only through [`Step::release`], which waits for the
//!   durable record its [`Release`](pacpriv_store::Release) names.

use super::cache::{CacheKey, Lookup, Owner, QueryDigest};
use super::error::SessionError;
use super::query::{Asking, Reply};
use super::state::{BudgetView, Scope, Session};
use super::step::{Site, step_all};
use pacpriv_privacy::mechanism::TeacherOutputs;
use pacpriv_store::Change;
use pacpriv_store::record::EventKind;
use pacpriv_store::{Arrival, CacheProbe, Ticket};
use std::sync::Arc;

/// `session`'s current account (one read).
pub(super) async fn account_of(session: &Session) -> Result<BudgetView, SessionError> {
    session.read(&[], |v| BudgetView::of(&v.state.ledger)).await
}

/// What the preflight of a query found (one read of the session).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preflight {
    /// The session answered this query before (or refuses it as an evicted
    /// repeat): no teacher is needed, nor any budget.
    Known,
    /// A new query the budget can pay for: ask the teachers.
    Ask,
}

/// An authenticated caller and the session it is charged to in one
/// dataset (see [`Caller::on`](super::Caller::on)).
#[derive(Clone)]
pub struct Handle {
    pub(super) principal: Arc<str>,
    /// The dataset's name.
    pub(super) dataset: Arc<str>,
    pub(super) scope: Scope,
    pub(super) session: Arc<Session>,
}

impl Handle {
    /// The principal's name.
    pub fn principal(&self) -> &str {
        &self.principal
    }

    /// Whose account the session is, as the budget gauges label it: the
    /// principal's name, or [`GLOBAL_SESSION`](pacpriv_store::GLOBAL_SESSION)
    /// under global scope.
    pub fn account_label(&self) -> &str {
        self.scope.account_of(&self.principal)
    }

    /// The name of the dataset whose session this is.
    pub fn dataset(&self) -> &str {
        &self.dataset
    }

    /// The session scope.
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// The store key of the session charged: the principal's name, or
    /// [`GLOBAL_SESSION`](pacpriv_store::GLOBAL_SESSION) under global scope, prefixed
    /// by the dataset's name outside the default dataset
    /// ([`session_key`](pacpriv_store::session_key)).
    pub fn session_name(&self) -> &str {
        self.session.key()
    }

    /// The current account.
    ///
    /// # Errors
    /// [`SessionError::Poisoned`] or a store error.
    pub async fn budget(&self) -> Result<BudgetView, SessionError> {
        account_of(&self.session).await
    }

    /// The cache key of an example with digest `digest` asked by this
    /// caller: the digest itself, or under global scope the digest of this
    /// principal's asking (see [`QueryDigest::of_principal`]) in this
    /// principal's own partition of the shared cache.
    pub fn cache_key(&self, digest: QueryDigest) -> CacheKey {
        match self.scope {
            Scope::PerPrincipal => CacheKey::from(digest),
            Scope::Global => {
                CacheKey { digest: digest.of_principal(&self.principal), owner: Owner::of(&self.principal) }
            }
        }
    }

    /// The first of `candidates` (a request's keys under each of several
    /// model versions) every one of whose keys the session holds an
    /// answer to (cached, not evicted): one read, nothing refused,
    /// journaled or charged. How a request naming no model version finds
    /// the version that answered it before (a retry, or a repeat after a
    /// newer version came), and one naming an unloaded version whether it
    /// was answered.
    ///
    /// # Errors
    /// [`SessionError::Poisoned`] or a store error.
    pub async fn first_answered(&self, candidates: &[Vec<CacheKey>]) -> Result<Option<usize>, SessionError> {
        let probes: Vec<CacheProbe> = candidates.iter().flatten().map(CacheProbe::from).collect();
        self.session
            .read(&probes, |v| {
                candidates.iter().position(|keys| keys.iter().all(|key| matches!(v.cache.lookup(key), Lookup::Hit(_))))
            })
            .await
    }

    /// Before any teacher is asked, one read of the session: for each of
    /// a request's rows, whether the session answered `key` before
    /// ([`Preflight::Known`]: no teacher, no budget), else
    /// [`Preflight::Ask`] — if even the cheapest possible answers (free
    /// unanimous ones under `contested`, b each otherwise) of all the new
    /// rows still fit. Depends on the session's own transcript and public
    /// state only. With the journal on, a refusal is journaled (as the
    /// request `query_id`) before it is returned; with no `query_id`, it
    /// is returned only (a tentative read: the request may go on
    /// elsewhere, and journals its own refusal there).
    ///
    /// # Errors
    /// [`SessionError::Exhausted`], [`SessionError::Poisoned`] or a store
    /// error.
    pub async fn preflight(&self, keys: &[CacheKey], query_id: Option<&str>) -> Result<Vec<Preflight>, SessionError> {
        let probes: Vec<CacheProbe> = keys.iter().map(CacheProbe::from).collect();
        let found = self
            .session
            .read(&probes, |v| {
                let found: Vec<Preflight> = keys
                    .iter()
                    .map(|key| match v.cache.lookup(key) {
                        Lookup::Miss => Preflight::Ask,
                        Lookup::Hit(_) | Lookup::Evicted => Preflight::Known,
                    })
                    .collect();
                let new: std::collections::HashSet<_> =
                    keys.iter().zip(&found).filter(|(_, p)| **p == Preflight::Ask).map(|(k, _)| k.digest).collect();
                // The cheapest the new rows can cost: b each, or nothing
                // (free unanimous answers) under `contested`.
                let ledger = &v.state.ledger;
                let charged = if ledger.charge_for(true).get() > 0.0 { new.len() as u64 } else { 0 };
                if charged > 0 {
                    ledger.check_charges(charged).map_err(|e| (charged, e.into()))?;
                }
                Ok::<_, (u64, SessionError)>(found)
            })
            .await?;
        match found {
            Ok(found) => Ok(found),
            Err((charged, refused @ SessionError::Exhausted { .. })) if self.session.context().params.journal => {
                match query_id {
                    Some(query_id) => Err(self.journal_exhausted(query_id, charged, refused).await),
                    None => Err(refused),
                }
            }
            Err((_, refused)) => Err(refused),
        }
    }

    /// Journals the preflight's refusal of request `query_id`, which
    /// needed `charged` charges of b, and returns it (or the store's
    /// error). Re-checked under the session's lock: the event records the
    /// ledger it was refused on (a limit raised meanwhile leaves the
    /// refusal unjournaled — it no longer holds).
    pub(super) async fn journal_exhausted(&self, query_id: &str, charged: u64, refused: SessionError) -> SessionError {
        let query_id = query_id.to_owned();
        let need = match &refused {
            SessionError::Exhausted { charge, .. } => *charge,
            _ => 0.0,
        };
        let journaled = self
            .session
            .step(false, Vec::new(), move |v| {
                let mut change = Change::default();
                if v.state.ledger.check_charges(charged).is_err() {
                    change.events.push(v.event(EventKind::Exhausted, &query_id, v.terms(None), need));
                }
                Ok(((), change))
            })
            .await;
        match journaled {
            Ok(((), ticket)) => once_journaled(refused, ticket).await,
            Err(e) => uncharged(e),
        }
    }

    /// One step of Algorithm 1 on this session — budget check,
    /// calibration, noise, posterior and ledger update, atomically — and
    /// returns only once the step may be released: [`Handle::begin`], then
    /// [`Step::release`]. Not cached.
    ///
    /// # Errors
    /// As [`Handle::begin`] and [`Step::release`].
    pub async fn answer(
        &self,
        outputs: TeacherOutputs,
        alpha: Option<f64>,
        query_id: String,
    ) -> Result<(Reply, BudgetView), SessionError> {
        let (mut replies, view) =
            self.begin(vec![(Some(outputs), Asking::uncached(alpha, query_id))], Vec::new()).await?.release().await?;
        // One row in, one reply out.
        let reply = replies.pop().ok_or(SessionError::Poisoned)?;
        Ok((reply, view))
    }

    /// Answers a request's rows in order, all or none (see `step::step_all`):
    /// each with the session's cached answer when this exact query was
    /// answered before (no charge, no change), otherwise by one step of
    /// Algorithm 1 on its outputs (`None` only when [`Handle::preflight`]
    /// found the row [`Preflight::Known`]). Hands the steps' record to the
    /// store without waiting for it to be durable where the store allows
    /// (see [`pacpriv_store::cell`]): a caller with several requests of one
    /// session (a stream) takes the next step while this one's commit is
    /// under way, and the steps keep the order in which `begin` was
    /// called. Label-mode steps with few active classes run on the calling
    /// task (microseconds, see `quick`); the rest run on a blocking thread
    /// (LAPACK). The replies are only reachable through [`Step::release`].
    ///
    /// # Errors
    /// [`SessionError::Exhausted`] (the budget cannot pay for every
    /// charged row), a cache refusal or the core's refusal: nothing
    /// changed. [`SessionError::Withheld`]: the steps may have happened but
    /// are withheld.
    pub async fn begin(
        &self,
        rows: Vec<(Option<TeacherOutputs>, Asking)>,
        arriving: Vec<Arrival>,
    ) -> Result<Step, SessionError> {
        // A few microseconds of math run here: a hop to a blocking thread
        // would cost more than the step (BENCHMARKS.md).
        let blocking = rows.iter().any(|(o, _)| o.as_ref().is_some_and(|o| !quick(o))) || rows.len() > 8;
        let params = std::sync::Arc::clone(&self.session.context().params);
        let site = Site(params.noise.session(&self.dataset, self.session.key()));
        let probes = rows.iter().filter_map(|(_, a)| a.key.as_ref().map(CacheProbe::from)).collect();
        let (outcome, ticket) = self
            .session
            .step(blocking, probes, move |v| {
                // Queued with the record: the store stops counting them
                // once it is (`pacpriv_store::Arrivals`).
                step_all(&params, &site, v, &rows).map(|(outcome, change)| (outcome, Change { arriving, ..change }))
            })
            .await?;
        match (outcome, ticket) {
            (Ok((replies, view)), ticket) => Ok(Step { replies, view, ticket }),
            // Rows that drew were charged: a failed write withholds, as
            // for an answer (charged = "true").
            (Err(refused @ SessionError::RowFailed { .. }), Some(ticket)) => {
                Err(ticket.durable().await.err().map_or(refused, SessionError::from))
            }
            (Err(refused), ticket) => Err(once_journaled(refused, ticket).await),
        }
    }
}

/// A refusal, returned once its journal event is durable (`ticket`;
/// `None`: durable already, or nothing was journaled); a failed write is
/// a store error, with nothing charged either way.
pub(super) async fn once_journaled(refused: SessionError, ticket: Option<Ticket>) -> SessionError {
    match ticket {
        Some(ticket) => ticket.durable().await.err().map_or(refused, SessionError::Store),
        None => refused,
    }
}

/// A store error met while journaling a refusal: nothing was charged,
/// whatever the store says about the write.
pub(super) fn uncharged(e: SessionError) -> SessionError {
    match e {
        SessionError::Withheld(e) => SessionError::Store(e),
        other => other,
    }
}

/// Whether a step on `outputs` is cheap enough for an async worker: label
/// mode with few active classes (an eigendecomposition of at most 7 × 7,
/// microseconds). Vector mode (milliseconds: a thin SVD of m × d, or an
/// m × m Gram matrix and four m × d × m products) and many active classes
/// go to a blocking thread.
pub(super) fn quick(outputs: &TeacherOutputs) -> bool {
    pub(super) const MAX_ACTIVE: usize = 8;
    match outputs {
        TeacherOutputs::Labels { labels, .. } => {
            let mut active: Vec<usize> = Vec::with_capacity(MAX_ACTIVE + 1);
            for &l in labels {
                if !active.contains(&l) {
                    active.push(l);
                    if active.len() > MAX_ACTIVE {
                        return false;
                    }
                }
            }
            true
        }
        TeacherOutputs::Vectors(_) => false,
    }
}

/// A request's steps, taken and charged, whose record may not be durable
/// yet.
pub struct Step {
    pub(super) replies: Vec<Reply>,
    pub(super) view: BudgetView,
    /// What the answers wait for; `None`: nothing (durable already, or
    /// free answers: see [`Release`](pacpriv_store::Release)).
    pub(super) ticket: Option<Ticket>,
}

impl Step {
    /// The answers, one per row, and the account after them, once they may
    /// leave, as the step's [`Release`](pacpriv_store::Release) says: for a
    /// charged step, once its record (and so every earlier one of the
    /// session) is durable; for a cached answer whose step was charged,
    /// once the session's last charged record is; for exact unanimous
    /// answers that charged nothing, at once (their record goes with the
    /// next commit).
    ///
    /// # Errors
    /// [`SessionError::Withheld`]: the answers are withheld; they may have
    /// been charged.
    pub async fn release(self) -> Result<(Vec<Reply>, BudgetView), SessionError> {
        if let Some(ticket) = self.ticket {
            ticket.durable().await?;
        }
        Ok((self.replies, self.view))
    }
}
