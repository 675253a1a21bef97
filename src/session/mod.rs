//! Sessions: who is asking (API key → principal) and the privacy state
//! their answers are charged to (posterior + ledger, one per principal or
//! one shared). Applies one step of Algorithm 1 under the session's lock.
//!
//! # Invariants
//! - Principals are provisioned by the operator; a client can never open a
//!   fresh session or reset a budget.
//! - Keys are configured, stored and compared as SHA-256 hashes; the
//!   plaintext key is never stored (see [`registry`]).
//! - A session does not know where its state lives: it reads it once per
//!   query ([`Handle::preflight`]) and steps it ([`Handle::begin`]) through
//!   a [`crate::store::cell::Cell`], which holds it in memory (embedded
//!   store) or in PostgreSQL. A lock is held only around the math
//!   (microseconds), never across the teacher fan-out, nor across the
//!   fsync (early lock release; see the cell).
//! - An answer is reachable only through [`Step::durable`], after its
//!   record is durable — a cached answer too, after the step that produced
//!   it ([`cache`]).
//! - A query the session answered before is answered from its [`cache`]:
//!   no charge, no noise, no change; which queries hit depends on the
//!   session's own transcript, never on the secret.
//! - The secret index lives only in the sessions' parameters and is handed
//!   to the mechanism; it is never returned, logged or put in an error.
//! - Noise comes from [`rand::rng`]: a per-thread ChaCha12 CSPRNG seeded
//!   from the OS and reseeded from it every 64 KiB of output.

use crate::privacy::ledger::{Ledger, Policy};
use crate::privacy::mechanism::{self, Answer, Calibration, SecretIndex, SessionState, TeacherOutputs};
use crate::privacy::posterior::Posterior;
use crate::privacy::{Nats, PrivacyError, report};
use crate::store::cell::{Cell, Change, State};
use crate::store::record::{EventKind, JournalStepRecord};
use crate::store::{CacheProbe, CacheRows, CacheWrite, JournalEntry, JournalEvent, SessionRecord, StoreError, Ticket};
use cache::{AnswerCache, CacheKey, CacheSettings, Cached, Lookup, OnEvicted, Owner, QueryDigest};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;

pub mod cache;
pub mod registry;
pub mod secret;

pub use registry::{Account, Credential, GLOBAL_SESSION, Sessions};

/// Whose transcript a session bounds (`privacy.scope`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// One session per principal.
    PerPrincipal,
    /// One session shared by every principal (holds against collusion).
    Global,
}

impl Scope {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::PerPrincipal => "per_principal",
            Scope::Global => "global",
        }
    }
}

/// A provisioned principal.
#[derive(Clone, Debug)]
pub struct PrincipalConfig {
    /// Name, used in logs and responses.
    pub name: String,
    /// SHA-256 of its API key.
    pub key_sha256: [u8; 32],
    /// Its MI budget (its session's limit under per-principal scope).
    pub budget: Nats,
}

impl PrincipalConfig {
    /// Its store record, provisioned by the configuration at `now_unix`.
    pub fn record(&self, now_unix: i64) -> crate::store::PrincipalRecord {
        crate::store::PrincipalRecord {
            name: self.name.clone(),
            key_sha256: self.key_sha256,
            budget: self.budget.get(),
            origin: crate::store::Origin::Config,
            created_unix: now_unix,
            revoked_unix: None,
        }
    }
}

/// Why a session refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// No key, or one that names no principal.
    #[error("unknown or missing API key")]
    Unauthenticated,
    /// The budget cannot pay for this request's answers (all of them:
    /// none was given).
    #[error("MI budget exhausted: spent {spent} of {limit} nats; this request's answers cost {charge} nats")]
    Exhausted {
        /// MI spent.
        spent: f64,
        /// The limit.
        limit: f64,
        /// What the request's answers cost together.
        charge: f64,
    },
    /// The privacy core refused (shapes, calibration); nothing released.
    #[error(transparent)]
    Privacy(PrivacyError),
    /// An earlier panic left the session lock poisoned; the session refuses
    /// to answer rather than risk a half-applied step.
    #[error("session state unavailable after an internal failure; refusing to answer")]
    Poisoned,
    /// The step ran but could not be confirmed durable, so its answer is
    /// withheld. Its charge may stand (it may be on disk, and later steps
    /// build on it); its answer is kept with the session's cached answers,
    /// so a retry of the same query receives it, once durable, without a
    /// second charge.
    #[error(
        "the answer could not be confirmed durable and was withheld; it may have been charged — retry the same \
         query (same input and options) to receive this answer without a second charge ({0})"
    )]
    Withheld(StoreError),
    /// The session store could not be read, or the step's transaction
    /// failed before it committed: nothing was answered or charged.
    #[error("the session store is unavailable ({0}); nothing was answered or charged, the query can be retried")]
    Store(StoreError),
    /// The principal registry could not be read or written (nothing was
    /// answered or charged).
    #[error("principal registry: {0}")]
    Registry(StoreError),
    /// A repeat of a query whose cached answer was evicted, under
    /// `on_evicted = refuse`: answering it would release fresh noise for a
    /// query already answered. Nothing changed.
    #[error(
        "this session answered this exact query before and its cached answer has since been evicted \
         (privacy.answer_cache_entries); answering it again would release fresh noise, so it is refused — nothing \
         was charged"
    )]
    EvictedRepeat,
    /// A repeat asking for the noisy vector of a query first answered
    /// without it: the vector was not kept, and a fresh one would be a new
    /// release. Nothing changed.
    #[error(
        "this session answered this exact query before without return_noisy, and its noisy vector was not kept; \
         repeat it without return_noisy to get the same answer (nothing was charged)"
    )]
    NoisyNotKept,
    /// The query's cached answer disappeared between the check before the
    /// fan-out and the step (evicted meanwhile, or another replica's step).
    /// Nothing changed; a retry is answered correctly.
    #[error("the session's answer cache changed while this query was in flight; nothing was charged, retry it")]
    CacheMoved,
    /// A row of a multi-row request failed after earlier rows had drawn
    /// their noise: the request is refused whole and rolled back, and the
    /// cause is not shown (it was computed on a posterior those draws had
    /// moved; the log names its kind).
    #[error("row {row} of this request could not be answered, so none was: nothing was charged or released")]
    RowFailed {
        /// The row, from 0.
        row: usize,
    },
    /// No principal of that name.
    #[error("no principal named {0:?}")]
    UnknownPrincipal(String),
    /// A principal could not be provisioned as asked.
    #[error("{0}")]
    InvalidPrincipal(String),
}

impl From<StoreError> for SessionError {
    /// [`SessionError::Withheld`] for a write that may have landed, else
    /// [`SessionError::Store`]: the classification errs toward "charged".
    fn from(e: StoreError) -> Self {
        if e.may_have_charged() { SessionError::Withheld(e) } else { SessionError::Store(e) }
    }
}

impl From<PrivacyError> for SessionError {
    fn from(e: PrivacyError) -> Self {
        match e {
            PrivacyError::BudgetExhausted { spent, budget, charge } => {
                SessionError::Exhausted { spent: spent.get(), limit: budget.get(), charge: charge.get() }
            }
            other => SessionError::Privacy(other),
        }
    }
}

/// A session's public account, as reported to its principal.
#[derive(Clone, Debug, PartialEq)]
pub struct BudgetView {
    /// MI spent, nats.
    pub spent: f64,
    /// Limit, nats.
    pub limit: f64,
    /// limit − spent, nats.
    pub remaining: f64,
    /// b, nats.
    pub per_query: f64,
    /// Answers released.
    pub answered: u64,
    /// Answers charged.
    pub charged: u64,
    /// MIA success bound at `spent`.
    pub mia_bound: f64,
    /// Charging policy.
    pub policy: Policy,
}

impl BudgetView {
    fn of(ledger: &Ledger) -> Self {
        BudgetView {
            spent: ledger.spent().get(),
            limit: ledger.limit().get(),
            remaining: ledger.remaining(),
            per_query: ledger.per_query().get(),
            answered: ledger.answered(),
            charged: ledger.charged(),
            mia_bound: report::mia_bound(ledger.spent()),
            policy: ledger.policy(),
        }
    }
}

/// A session's state and how many steps produced it: what a
/// [`Cell`] holds.
#[derive(Clone)]
pub struct Versioned {
    state: SessionState,
    version: u64,
    cache: AnswerCache,
    /// The chain hash of the last journal entry or event (the session's
    /// genesis hash before the first).
    head: [u8; 32],
    /// Journal events so far (the last one's sequence number).
    events: u64,
}

/// What resuming a session needs besides its record.
pub struct Terms {
    params: SessionParams,
    /// The session's limit (the principal's budget, or the global one).
    limit: Nats,
}

impl State for Versioned {
    type Context = Terms;
    type Error = SessionError;

    /// The state a record describes, or the uniform prior with an empty
    /// ledger; checked against m.
    fn resume(
        terms: &Terms,
        key: &str,
        record: Option<&SessionRecord>,
        cache: CacheRows,
    ) -> Result<Self, SessionError> {
        let p = &terms.params;
        let (state, version) = match record {
            Some(r) => (r.restore(p.per_query, terms.limit, p.policy)?, r.version),
            None => (
                SessionState {
                    posterior: Posterior::uniform(p.m)?,
                    ledger: Ledger::new(p.per_query, terms.limit, p.policy)?,
                },
                0,
            ),
        };
        if state.posterior.len() != p.m {
            return Err(PrivacyError::TeacherCount { posterior: state.posterior.len(), teachers: p.m }.into());
        }
        let cache = cache_of(key, record, cache)?;
        let head = record.and_then(|r| r.journal_head).unwrap_or_else(|| JournalEntry::genesis(key));
        let events = record.map_or(0, |r| r.journal_events);
        Ok(Versioned { state, version, cache, head, events })
    }

    fn record(&mut self) -> (SessionRecord, Vec<CacheWrite>) {
        let record = SessionRecord {
            journal_head: Some(self.head),
            journal_events: self.events,
            ..SessionRecord::of(&self.state, self.cache.owners(), self.version)
        };
        (record, self.cache.take_writes())
    }

    fn poisoned() -> SessionError {
        SessionError::Poisoned
    }

    /// A new limit (the principal's budget was changed).
    fn retarget(&mut self, terms: &Terms) {
        self.state.ledger.set_limit(terms.limit);
    }
}

/// Session `key`'s answer cache: the `rows` its `record`'s spans describe,
/// or a format-2 record's inline cache, to be moved to rows by the
/// session's next write.
fn cache_of(key: &str, record: Option<&SessionRecord>, rows: CacheRows) -> Result<AnswerCache, SessionError> {
    let cache = match record {
        Some(SessionRecord { cache: Some(inline), .. }) => AnswerCache::migrated(inline),
        Some(r) => AnswerCache::from_rows(&r.cache_owners, rows),
        None => AnswerCache::from_rows(&[], rows),
    };
    cache.ok_or_else(|| {
        SessionError::Store(StoreError::Corrupt { session: key.into(), reason: "undecodable answer cache".into() })
    })
}

impl SessionError {
    /// The variant's name, for logs that must not carry its details.
    pub fn kind(&self) -> &'static str {
        match self {
            SessionError::Privacy(_) => "privacy",
            SessionError::Store(_) | SessionError::Withheld(_) | SessionError::Registry(_) => "store",
            _ => "session",
        }
    }
}

/// One privacy session: its state, where the store keeps it.
pub type Session = Cell<Versioned>;

/// `session`'s current account (one read).
async fn account_of(session: &Session) -> Result<BudgetView, SessionError> {
    session.read(&[], |v| BudgetView::of(&v.state.ledger)).await
}

impl Versioned {
    /// The terms a journal item records: the query's digest (if any), b,
    /// the limit and the policy.
    fn terms(&self, key: Option<&CacheKey>) -> JournalStepRecord {
        let ledger = &self.state.ledger;
        JournalStepRecord {
            digest: key.map(|k| k.digest.as_bytes().to_vec()).unwrap_or_default(),
            per_query: ledger.per_query().get(),
            limit: ledger.limit().get(),
            policy: ledger.policy().to_string(),
            ..Default::default()
        }
    }

    /// The journal event `kind` about query `query_id` (with `step`'s
    /// details; `need`: what an exhausted request needed), numbered and
    /// chained next.
    fn event(&mut self, kind: EventKind, query_id: &str, step: JournalStepRecord, need: f64) -> JournalEvent {
        self.events += 1;
        let mut event = JournalEvent {
            seq: self.events,
            after_version: self.version,
            query_id: query_id.to_owned(),
            kind: kind.as_str().to_owned(),
            step: Some(step),
            spent: self.state.ledger.spent().get(),
            need,
            ..Default::default()
        };
        let chain = event.chained(&self.head);
        event.chain = chain.to_vec();
        self.head = chain;
        event
    }
}

/// What one answered row leaves in the journal (when it is on).
enum Row {
    /// Answered from the cache: its event.
    Cached(Option<JournalEvent>),
    /// A step: its entry.
    Stepped(Option<JournalEntry>),
}

/// Answers `asking` on `v`: from the cache when this exact query was
/// answered before (nothing changes but the journal), or by one step of
/// Algorithm 1 on `outputs`.
fn step(
    params: &SessionParams,
    v: &mut Versioned,
    outputs: Option<&TeacherOutputs>,
    asking: &Asking,
) -> Result<(Reply, Row), SessionError> {
    if let Some(key) = &asking.key {
        match v.cache.lookup(key) {
            Lookup::Hit(c) => {
                let reply = Reply::cached(c, asking)?;
                let event = params.journal.then(|| {
                    let step = JournalStepRecord {
                        label: reply.label as u32,
                        published: reply.published.clone(),
                        ..v.terms(Some(key))
                    };
                    v.event(EventKind::CacheHit, &asking.query_id, step, 0.0)
                });
                return Ok((reply, Row::Cached(event)));
            }
            Lookup::Evicted => return Err(SessionError::EvictedRepeat),
            Lookup::Miss => {}
        }
    }
    // The preflight saw an answer that is gone now.
    let outputs = outputs.ok_or(SessionError::CacheMoved)?;
    let answer = mechanism::answer_calibrated(
        &mut v.state,
        outputs,
        params.secret,
        asking.alpha,
        &mut rand::rng(),
        params.calibration,
    )?;
    if let Some(key) = asking.key {
        let kept = Cached {
            label: answer.label,
            unanimous: answer.unanimous,
            evidence: answer.evidence,
            published: asking.return_noisy.then(|| answer.published.clone()),
        };
        v.cache.insert(key, kept, params.cache);
    }
    v.version += 1;
    let entry = params.journal.then(|| {
        let mut entry = journal_entry(v, outputs, asking, &answer);
        let chain = entry.chained(&v.head);
        entry.chain = chain.to_vec();
        v.head = chain;
        entry
    });
    Ok((Reply::fresh(answer), Row::Stepped(entry)))
}

/// The journal entry of the step that just took `v` to its version: what
/// it used and released, in the form `pacpriv verify` re-derives it from
/// (the teachers' outputs on the release grid, as the mechanism used them).
fn journal_entry(v: &Versioned, outputs: &TeacherOutputs, asking: &Asking, answer: &Answer) -> JournalEntry {
    let mut step = JournalStepRecord {
        published: answer.published.clone(),
        label: answer.label as u32,
        ..v.terms(asking.key.as_ref())
    };
    record_outputs(&mut step, outputs);
    JournalEntry {
        version: v.version,
        query_id: asking.query_id.clone(),
        charge: answer.charge.get(),
        log_likelihood: answer.log_likelihood.as_ref().map(|l| l.to_vec()).unwrap_or_default(),
        update_rule: answer.update_rule.code(),
        step: Some(step),
        chain: Vec::new(),
    }
}

/// Puts the teachers' `outputs`, on the release grid, into `step`.
fn record_outputs(step: &mut JournalStepRecord, outputs: &TeacherOutputs) {
    match &*outputs.on_grid() {
        TeacherOutputs::Labels { labels, classes } => {
            step.classes = *classes as u32;
            step.labels = labels.iter().map(|&l| l as u32).collect();
        }
        TeacherOutputs::Vectors(values) => {
            step.dim = values.ncols() as u32;
            step.vectors = values.iter().copied().collect();
        }
    }
}

/// A request's replies and the account after them.
type Answered = (Vec<Reply>, BudgetView);

/// A request's answers, or its refusal.
type Outcome = Result<Answered, SessionError>;

/// A refusal and the row of the request it concerns (`None`: all).
type Refused = (Option<usize>, SessionError);

/// Answers `rows` as [`answer_all`] does. When the journal is on, a
/// refusal (budget, contested, evicted or noisy-not-kept repeat) is
/// journaled as an event and returned as the outcome, to be written like
/// a step; other errors, and every refusal with the journal off, change
/// nothing.
fn step_all(
    params: &SessionParams,
    v: &mut Versioned,
    rows: &[(Option<TeacherOutputs>, Asking)],
) -> Result<(Outcome, Change), SessionError> {
    let (row, error) = match answer_all(params, v, rows) {
        Ok((done, change)) => return Ok((Ok(done), change)),
        Err(refused) => refused,
    };
    let kind = match &error {
        SessionError::Exhausted { .. } => EventKind::Exhausted,
        SessionError::Privacy(PrivacyError::Contested) => EventKind::Contested,
        SessionError::EvictedRepeat => EventKind::EvictedRepeat,
        SessionError::NoisyNotKept => EventKind::NoisyNotKept,
        _ => return Err(error),
    };
    let Some((outputs, asking)) = rows.get(row.unwrap_or(0)).filter(|_| params.journal) else { return Err(error) };
    // An exhausted request is about all its rows: no digest.
    let mut step = v.terms(row.and(asking.key.as_ref()));
    if let (EventKind::Contested, Some(outputs)) = (kind, outputs) {
        record_outputs(&mut step, outputs);
    }
    let need = match &error {
        SessionError::Exhausted { charge, .. } => *charge,
        _ => 0.0,
    };
    let event = v.event(kind, &asking.query_id, step, need);
    Ok((Err(error), Change { events: vec![event], ..Change::default() }))
}

/// Answers `rows` in order, all or none: each as [`step`] would, on a copy
/// of the state that replaces `v` only once every row is answered. Before
/// any noise is drawn, the budget must cover every row that will be
/// charged (what [`cost`] counts); a refusal of any row leaves `v` as it
/// was. Returns the replies, the account after them, and what changed;
/// or the refusal and the row it concerns (`None`: the whole request).
fn answer_all(
    params: &SessionParams,
    v: &mut Versioned,
    rows: &[(Option<TeacherOutputs>, Asking)],
) -> Result<(Answered, Change), Refused> {
    let need = cost(params, v, rows)?;
    // Cached answers are free even past the limit (a cut budget).
    if need.get() > 0.0 {
        v.state.ledger.check(need).map_err(|e| (None, e.into()))?;
    }
    // One row needs no undo: a refused step changes nothing. Several keep
    // what the cache needs to take back rather than copy it whole.
    let saved = (rows.len() > 1).then(|| (v.state.clone(), v.version, v.head, v.events, v.cache.checkpoint()));
    let mut replies = Vec::with_capacity(rows.len());
    let mut change = Change::default();
    for (i, (outputs, asking)) in rows.iter().enumerate() {
        let (reply, row) = match step(params, v, outputs.as_ref(), asking) {
            Ok(done) => done,
            Err(e) => {
                if let Some((state, version, head, events, at)) = saved {
                    (v.state, v.version, v.head, v.events) = (state, version, head, events);
                    v.cache.rollback(at);
                }
                // Every refusal that does not depend on the draw was found
                // by `cost`; what fails after earlier rows drew says nothing
                // that was computed from them.
                if change.steps > 0 {
                    tracing::error!(
                        row = i,
                        kind = e.kind(),
                        "a row failed after earlier rows drew; request refused whole"
                    );
                    return Err((Some(i), SessionError::RowFailed { row: i }));
                }
                return Err((Some(i), e));
            }
        };
        replies.push(reply);
        match row {
            Row::Cached(event) => change.events.extend(event),
            Row::Stepped(entry) => {
                change.steps += 1;
                change.journal.extend(entry);
            }
        }
    }
    v.cache.release();
    let view = BudgetView::of(&v.state.ledger);
    Ok(((replies, view), change))
}

/// What answering `rows` on `v` will charge: the charge for its teachers'
/// agreement of every row that is not answered from the cache (neither
/// cached before nor a repeat of an earlier row of `rows`, when the cache
/// is on).
///
/// Every refusal that does not depend on the draw is found here, before
/// anything is drawn or any posterior moves (issue 40 §4): a repeat of an
/// evicted answer, or of one that this request's own earlier rows will
/// evict; a repeat asking for a noisy vector that was not kept; a row whose
/// cached answer vanished since the preflight (no outputs were fetched for
/// it); outputs that do not fit; a contested row under `unanimous_only`.
fn cost(params: &SessionParams, v: &Versioned, rows: &[(Option<TeacherOutputs>, Asking)]) -> Result<Nats, Refused> {
    let ledger = &v.state.ledger;
    let capacity = params.cache.capacity as u64;
    // Per owner, the inserts this request's rows make before the current
    // row; per digest, the number an earlier row's answer will get.
    let mut inserts: HashMap<Owner, u64> = HashMap::new();
    let mut fresh: HashMap<QueryDigest, u64> = HashMap::new();
    let mut need = 0.0;
    for (i, (outputs, asking)) in rows.iter().enumerate() {
        let refuse = |e: SessionError| Err((Some(i), e));
        if let Some(key) = &asking.key {
            let (held, next) = v.cache.numbers(key);
            let later = inserts.get(&key.owner).copied().unwrap_or(0);
            let still_held = |seq: u64| seq + capacity >= next + later;
            let found = match v.cache.lookup(key) {
                Lookup::Hit(c) => {
                    if asking.return_noisy && c.published.is_none() {
                        return refuse(SessionError::NoisyNotKept);
                    }
                    held
                }
                Lookup::Evicted => return refuse(SessionError::EvictedRepeat),
                Lookup::Miss => fresh.get(&key.digest).copied(),
            };
            match found {
                Some(seq) if still_held(seq) => continue,
                // Evicted by this request's own earlier rows: refused as
                // any evicted repeat, or answered afresh under "charge".
                Some(_) if params.cache.on_evicted == OnEvicted::Refuse => {
                    return refuse(SessionError::EvictedRepeat);
                }
                _ => {}
            }
            // Only a later row of this request can meet it (a one-row
            // request allocates nothing here).
            if capacity > 0 && i + 1 < rows.len() {
                fresh.insert(key.digest, next + later);
                *inserts.entry(key.owner).or_default() += 1;
            }
        }
        // The preflight saw an answer that is gone now: no teacher was asked.
        let Some(o) = outputs else { return refuse(SessionError::CacheMoved) };
        o.validate().map_err(|e| (Some(i), e.into()))?;
        // Unanimity as the mechanism judges it: on the release grid.
        let unanimous = o.on_grid().unanimous();
        if !unanimous && ledger.policy() == Policy::UnanimousOnly {
            return refuse(PrivacyError::Contested.into());
        }
        need += ledger.charge_for(unanimous).get();
    }
    Nats::new(need).map_err(|e| (None, e.into()))
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

/// An authenticated caller and the session it is charged to.
#[derive(Clone)]
pub struct Handle {
    principal: Arc<str>,
    scope: Scope,
    session: Arc<Session>,
    /// What the caller presented, so that a long-lived caller (a stream)
    /// can be checked again against the registry as it is now
    /// ([`Sessions::recheck`]): a rotated key stops working there too.
    presented: registry::Presented,
}

impl Handle {
    /// The principal's name.
    pub fn principal(&self) -> &str {
        &self.principal
    }

    /// The session scope.
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// The name of the session charged: the principal's, or
    /// [`GLOBAL_SESSION`] under global scope (the budget gauges' label).
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

    /// Before any teacher is asked, one read of the session: for each of
    /// a request's rows, whether the session answered `key` before
    /// ([`Preflight::Known`]: no teacher, no budget), else
    /// [`Preflight::Ask`] — if even the cheapest possible answers (free
    /// unanimous ones under `contested`, b each otherwise) of all the new
    /// rows still fit. Depends on the session's own transcript and public
    /// state only. With the journal on, a refusal is journaled (as the
    /// request `query_id`) before it is returned.
    ///
    /// # Errors
    /// [`SessionError::Exhausted`], [`SessionError::Poisoned`] or a store
    /// error.
    pub async fn preflight(&self, keys: &[CacheKey], query_id: &str) -> Result<Vec<Preflight>, SessionError> {
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
                if !new.is_empty() {
                    let ledger = &v.state.ledger;
                    let need = Nats::new(ledger.charge_for(true).get() * new.len() as f64)
                        .map_err(|e| (Nats::ZERO, e.into()))?;
                    ledger.check(need).map_err(|e| (need, e.into()))?;
                }
                Ok::<_, (Nats, SessionError)>(found)
            })
            .await?;
        match found {
            Ok(found) => Ok(found),
            Err((need, refused @ SessionError::Exhausted { .. })) if self.session.context().params.journal => {
                Err(self.journal_exhausted(query_id, need, refused).await)
            }
            Err((_, refused)) => Err(refused),
        }
    }

    /// Journals the preflight's refusal of request `query_id`, which
    /// needed `need`, and returns it (or the store's error). Re-checked
    /// under the session's lock: the event records the ledger it was
    /// refused on (a limit raised meanwhile leaves the refusal
    /// unjournaled — it no longer holds).
    async fn journal_exhausted(&self, query_id: &str, need: Nats, refused: SessionError) -> SessionError {
        let query_id = query_id.to_owned();
        let journaled = self
            .session
            .step(false, Vec::new(), move |v| {
                let mut change = Change::default();
                if v.state.ledger.check(need).is_err() {
                    change.events.push(v.event(EventKind::Exhausted, &query_id, v.terms(None), need.get()));
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
    /// returns only once the step is durable: [`Handle::begin`], then
    /// [`Step::durable`]. Not cached.
    ///
    /// # Errors
    /// As [`Handle::begin`] and [`Step::durable`].
    pub async fn answer(
        &self,
        outputs: TeacherOutputs,
        alpha: Option<f64>,
        query_id: String,
    ) -> Result<(Reply, BudgetView), SessionError> {
        let (mut replies, view) =
            self.begin(vec![(Some(outputs), Asking::uncached(alpha, query_id))]).await?.durable().await?;
        // One row in, one reply out.
        let reply = replies.pop().ok_or(SessionError::Poisoned)?;
        Ok((reply, view))
    }

    /// Answers a request's rows in order, all or none (see [`step_all`]):
    /// each with the session's cached answer when this exact query was
    /// answered before (no charge, no change), otherwise by one step of
    /// Algorithm 1 on its outputs (`None` only when [`Handle::preflight`]
    /// found the row [`Preflight::Known`]). Hands the steps' record to the
    /// store without waiting for it to be durable where the store allows
    /// (see [`crate::store::cell`]): a caller with several requests of one
    /// session (a stream) takes the next step while this one's commit is
    /// under way, and the steps keep the order in which `begin` was
    /// called. Label-mode steps with few active classes run on the calling
    /// task (microseconds, see `quick`); the rest run on a blocking thread
    /// (LAPACK). The replies are only reachable through [`Step::durable`].
    ///
    /// # Errors
    /// [`SessionError::Exhausted`] (the budget cannot pay for every
    /// charged row), a cache refusal or the core's refusal: nothing
    /// changed. [`SessionError::Withheld`]: the steps may have happened but
    /// are withheld.
    pub async fn begin(&self, rows: Vec<(Option<TeacherOutputs>, Asking)>) -> Result<Step, SessionError> {
        // A few microseconds of math run here: a hop to a blocking thread
        // would cost more than the step (BENCHMARKS.md).
        let blocking = rows.iter().any(|(o, _)| o.as_ref().is_some_and(|o| !quick(o))) || rows.len() > 8;
        let params = self.session.context().params;
        let probes = rows.iter().filter_map(|(_, a)| a.key.as_ref().map(CacheProbe::from)).collect();
        let (outcome, ticket) = self.session.step(blocking, probes, move |v| step_all(&params, v, &rows)).await?;
        match outcome {
            Ok((replies, view)) => Ok(Step { replies, view, ticket }),
            Err(refused) => Err(once_journaled(refused, ticket).await),
        }
    }
}

/// A refusal, returned once its journal event is durable (`ticket`;
/// `None`: durable already, or nothing was journaled); a failed write is
/// a store error, with nothing charged either way.
async fn once_journaled(refused: SessionError, ticket: Option<Ticket>) -> SessionError {
    match ticket {
        Some(ticket) => ticket.durable().await.err().map_or(refused, SessionError::Store),
        None => refused,
    }
}

/// A store error met while journaling a refusal: nothing was charged,
/// whatever the store says about the write.
fn uncharged(e: SessionError) -> SessionError {
    match e {
        SessionError::Withheld(e) => SessionError::Store(e),
        other => other,
    }
}

/// One query as its session sees it.
#[derive(Clone, Debug)]
pub struct Asking {
    /// Confidence level asked for.
    pub alpha: Option<f64>,
    /// The client's id (journal).
    pub query_id: String,
    /// The query's cache key; `None`: never cached (internal callers).
    pub key: Option<CacheKey>,
    /// Whether the noisy vector will be returned (it is kept with the
    /// cached answer only then).
    pub return_noisy: bool,
}

impl Asking {
    /// A query that is neither looked up nor kept in the cache.
    pub fn uncached(alpha: Option<f64>, query_id: String) -> Asking {
        Asking { alpha, query_id, key: None, return_noisy: false }
    }
}

/// What a query released: a fresh answer, or the cached one again.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    /// The released label.
    pub label: usize,
    /// Whether the teachers were unanimous.
    pub unanimous: bool,
    /// MI charged for this reply (zero when cached).
    pub charge: Nats,
    /// Prop. 5.1 at the requested α, if one was requested (label mode).
    pub confident: Option<bool>,
    /// The published noisy vector (sent only on request).
    pub published: Vec<f64>,
    /// Whether this is an earlier answer returned again.
    pub cached: bool,
}

impl Reply {
    fn fresh(a: Answer) -> Reply {
        Reply {
            label: a.label,
            unanimous: a.unanimous,
            charge: a.charge,
            confident: a.confident,
            published: a.published,
            cached: false,
        }
    }

    /// `c` again, with the flag at the α this repeat asks for.
    fn cached(c: &Cached, asking: &Asking) -> Result<Reply, SessionError> {
        if asking.return_noisy && c.published.is_none() {
            return Err(SessionError::NoisyNotKept);
        }
        let confident = match (asking.alpha, c.evidence) {
            (Some(a), Some(e)) => Some(e.confident(a)?),
            _ => None,
        };
        Ok(Reply {
            label: c.label,
            unanimous: c.unanimous,
            charge: Nats::ZERO,
            confident,
            published: c.published.clone().unwrap_or_default(),
            cached: true,
        })
    }
}

/// Whether a step on `outputs` is cheap enough for an async worker: label
/// mode with few active classes (an eigendecomposition of at most 7 × 7,
/// microseconds). Vector mode (a thin SVD of m × d) and many active classes
/// go to a blocking thread.
fn quick(outputs: &TeacherOutputs) -> bool {
    const MAX_ACTIVE: usize = 8;
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
    replies: Vec<Reply>,
    view: BudgetView,
    /// `None`: already durable.
    ticket: Option<Ticket>,
}

impl Step {
    /// The answers, one per row, and the account after them, once the
    /// steps' record (and so every earlier one of the session) is durable.
    ///
    /// # Errors
    /// [`SessionError::Withheld`]: the answers are withheld; they may have
    /// been charged.
    pub async fn durable(self) -> Result<(Vec<Reply>, BudgetView), SessionError> {
        if let Some(ticket) = self.ticket {
            ticket.durable().await?;
        }
        Ok((self.replies, self.view))
    }
}

/// What every session of a deployment shares.
#[derive(Clone, Copy, Debug)]
pub struct SessionParams {
    /// b.
    pub per_query: Nats,
    /// Charging policy.
    pub policy: Policy,
    /// Number of subsets (teachers).
    pub m: usize,
    /// s*.
    pub secret: SecretIndex,
    /// Journal every step (for audit and replay).
    pub journal: bool,
    /// The answer cache.
    pub cache: CacheSettings,
    /// What Σ is calibrated to: [`Calibration::Certified`] except in the
    /// canary audit's deliberately broken test server.
    pub calibration: Calibration,
}

/// SHA-256 of a key as 64 lowercase hex digits, the form `key_sha256`
/// takes in the configuration.
pub fn key_digest_hex(api_key: &str) -> String {
    hex(&Sha256::digest(api_key.as_bytes()))
}

/// Lowercase hex, two digits per byte.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod test;
