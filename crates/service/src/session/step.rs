//! One request's step, all or nothing: every row answered from the cache
//! or by one step of Algorithm 1 on a copy of the session's state, which
//! replaces the state only once every row is answered ([`answer_all`]).
//! Works on a [`Versioned`] value alone — no cell, no store, no I/O — so
//! that it is tested as such; [`super::handle`] runs it under the cell.
//!
//! # Invariants
//! - Before any noise is drawn, the budget covers every row that will be
//!   charged ([`charged_rows`]), checked with the very additions the rows'
//!   records make ([`Ledger::check_charges`]); every refusal that does not
//!   depend on the draw is found there.
//! - A refusal before any row drew leaves the state as it was; with the
//!   journal on, it is journaled as an event.
//! - A row that fails after earlier rows drew (not expected: an internal
//!   failure) refuses the request, but the rows that drew stay stepped and
//!   charged, their answers kept for a retry and withheld now
//!   (`docs/assurance/accounting.md` §1.8: why charging them covers the
//!   failure, which depended on their draws).
//!
//! [`Ledger::check_charges`]: pacpriv_privacy::ledger::Ledger::check_charges

use super::cache::{Cached, Lookup, OnEvicted, Owner, QueryDigest};
use super::error::SessionError;
use super::journal::{journal_entry, record_outputs};
use super::query::{Asking, Reply};
use super::state::{BudgetView, SessionParams, Versioned};
use pacpriv_privacy::keyed::SessionDraws;
use pacpriv_privacy::ledger::Policy;
use pacpriv_privacy::mechanism::{self, TeacherOutputs};
use pacpriv_privacy::{PrivacyError, confidence};
use pacpriv_store::record::{EventKind, JournalStepRecord};
use pacpriv_store::{Change, Release};
use pacpriv_store::{JournalEntry, JournalEvent};
use std::collections::HashMap;

/// Where a session's draws sit: the dataset's key at (its name, the
/// session's store key), derived once per request. With each step's
/// version this is the position of the step's draw in the dataset's keyed
/// generator ([`pacpriv_privacy::keyed::Position`]): unique per release,
/// since sessions are never deleted and each step moves the version by one
/// (`docs/assurance/accounting.md` §11).
#[derive(Clone, Debug)]
pub(super) struct Site(pub(super) SessionDraws);

/// What one answered row leaves in the journal (when it is on).
pub(super) enum Row {
    /// Answered from the cache: its event.
    Cached(Option<JournalEvent>),
    /// A step: its entry.
    Stepped(Option<JournalEntry>),
}

/// Answers `asking` on `v`: from the cache when this exact query was
/// answered before (nothing changes but the journal), or by one step of
/// Algorithm 1 on `outputs`.
pub(super) fn step(
    params: &SessionParams,
    site: &Site,
    v: &mut Versioned,
    outputs: Option<&TeacherOutputs>,
    asking: &Asking,
) -> Result<(Reply, Row), SessionError> {
    #[cfg(test)]
    fault::check()?;
    if let Some(key) = &asking.key {
        match v.cache.lookup(key) {
            Lookup::Hit(c) => {
                let reply = Reply::cached(c, asking)?;
                let event = params.journal.then(|| {
                    let step = JournalStepRecord {
                        label: reply.label as u32,
                        published: reply.published.clone(),
                        ..v.answered_by(asking)
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
    // The draw is the key's at (this session, the next version), fixed
    // before the inputs: nothing here can choose it.
    let mut normals = site.0.normals(v.version + 1);
    let answer =
        mechanism::answer_keyed(&mut v.state, outputs, params.secret, asking.alpha, &mut normals, params.calibration)?;
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
    let entry = params.journal.then(|| journal_entry(v, outputs, asking, &answer, &params.noise));
    Ok((Reply::fresh(answer), Row::Stepped(entry)))
}

/// A request's replies and the account after them.
pub(super) type Answered = (Vec<Reply>, BudgetView);

/// A request's answers, or its refusal.
pub(super) type Outcome = Result<Answered, SessionError>;

/// A refusal and the row of the request it concerns (`None`: all).
pub(super) type Refused = (Option<usize>, SessionError);

/// Answers `rows` as [`answer_all`] does. When the journal is on, a
/// refusal (budget, contested, evicted or noisy-not-kept repeat) is
/// journaled as an event and returned as the outcome, to be written like
/// a step; other errors, and every refusal with the journal off, change
/// nothing.
pub(super) fn step_all(
    params: &SessionParams,
    site: &Site,
    v: &mut Versioned,
    rows: &[(Option<TeacherOutputs>, Asking)],
) -> Result<(Outcome, Change), SessionError> {
    let (row, error) = match answer_all(params, site, v, rows) {
        Ok(done) => return Ok(done),
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
/// charged (what [`charged_rows`] counts); a refusal of any row before one
/// drew leaves `v` as it was. Returns the replies and the account after
/// them, with what changed; a row that fails after earlier rows drew
/// refuses the request ([`SessionError::RowFailed`]) with those rows'
/// steps kept, as what changed (see the module's invariants); any other
/// refusal, with the row it concerns (`None`: the whole request), as the
/// error.
pub(super) fn answer_all(
    params: &SessionParams,
    site: &Site,
    v: &mut Versioned,
    rows: &[(Option<TeacherOutputs>, Asking)],
) -> Result<(Outcome, Change), Refused> {
    let charged = charged_rows(params, v, rows)?;
    // Cached answers are free even past the limit (a cut budget).
    if charged > 0 {
        v.state.ledger.check_charges(charged).map_err(|e| (None, e.into()))?;
    }
    // One row needs no undo: a refused step changes nothing. Several keep
    // what the cache needs to take back rather than copy it whole.
    let saved = (rows.len() > 1).then(|| (v.state.clone(), v.version, v.head, v.events, v.cache.checkpoint()));
    let mut replies = Vec::with_capacity(rows.len());
    // With the journal on, every answer waits for its entry or event: the
    // journal holds every release that left (`accounting.md` §9).
    let least = if params.journal { Release::Durable } else { Release::Free };
    let mut change = Change { release: least, ..Change::default() };
    for (i, (outputs, asking)) in rows.iter().enumerate() {
        let (reply, row) = match step(params, site, v, outputs.as_ref(), asking) {
            Ok(done) => done,
            Err(e) if change.steps > 0 => {
                // Every refusal that does not depend on the draw was found
                // by `charged_rows`; this one may depend on the posterior
                // earlier rows' draws moved. Those rows stay stepped and
                // charged (their charge covers what this failure says
                // about their draws), their answers kept and withheld; the
                // error carries nothing computed from them.
                tracing::error!(row = i, kind = e.kind(), "a row failed after earlier rows drew; request refused");
                v.cache.release();
                let drew = change.steps;
                change.release = Release::Durable;
                return Ok((Err(SessionError::RowFailed { row: i, drew }), change));
            }
            Err(e) => {
                if let Some((state, version, head, events, at)) = saved {
                    (v.state, v.version, v.head, v.events) = (state, version, head, events);
                    v.cache.rollback(at);
                }
                return Err((Some(i), e));
            }
        };
        change.release = change.release.max(reply.release(v.state.ledger.charge_for(true).get() == 0.0));
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
    Ok((Ok((replies, v.view())), change))
}

/// How many rows answering `rows` on `v` will charge (b each): those
/// whose teachers disagree, or every one under `paper`, that are not
/// answered from the cache (neither cached before nor a repeat of an
/// earlier row of `rows`, when the cache is on).
///
/// Every refusal that does not depend on the draw is found here, before
/// anything is drawn or any posterior moves (issue 40 §4): a repeat of an
/// evicted answer, or of one that this request's own earlier rows will
/// evict; a repeat asking for a noisy vector that was not kept; a row whose
/// cached answer vanished since the preflight (no outputs were fetched for
/// it); outputs that do not fit; a contested row under `unanimous_only`.
pub(super) fn charged_rows(
    params: &SessionParams,
    v: &Versioned,
    rows: &[(Option<TeacherOutputs>, Asking)],
) -> Result<u64, Refused> {
    let ledger = &v.state.ledger;
    let capacity = params.cache.capacity as u64;
    // Per owner, the inserts this request's rows make before the current
    // row; per digest, the number an earlier row's answer will get.
    let mut inserts: HashMap<Owner, u64> = HashMap::new();
    let mut fresh: HashMap<QueryDigest, u64> = HashMap::new();
    let mut charged = 0;
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
        // What the mechanism checks before it draws, checked here for
        // every row before the first draws.
        let teachers = v.state.posterior.len();
        if o.len() != teachers {
            return refuse(PrivacyError::TeacherCount { posterior: teachers, teachers: o.len() }.into());
        }
        o.validate().map_err(|e| (Some(i), e.into()))?;
        if let Some(alpha) = asking.alpha {
            confidence::threshold(alpha).map_err(|e| (Some(i), e.into()))?;
        }
        // Unanimity as the mechanism judges it: on the release grid.
        let unanimous = o.on_grid().unanimous();
        if !unanimous && ledger.policy() == Policy::UnanimousOnly {
            return refuse(PrivacyError::Contested.into());
        }
        if ledger.charge_for(unanimous).get() > 0.0 {
            charged += 1;
        }
    }
    Ok(charged)
}

/// A failure injected into one step, standing for the internal failures
/// (LAPACK, the certificate) that no input is known to cause.
#[cfg(test)]
pub(super) mod fault {
    use super::SessionError;
    use std::cell::Cell;

    thread_local! {
        /// How many more steps succeed on this thread before one fails.
        static STEPS_LEFT: Cell<Option<usize>> = const { Cell::new(None) };
    }

    /// Makes the step of row `row` of this thread's next request fail
    /// (changing nothing, as a refused step does).
    pub(in crate::session) fn fail_row(row: usize) {
        STEPS_LEFT.with(|left| left.set(Some(row)));
    }

    /// Called by every step first.
    pub(super) fn check() -> Result<(), SessionError> {
        STEPS_LEFT.with(|left| match left.get() {
            Some(0) => {
                left.set(None);
                Err(SessionError::Poisoned)
            }
            Some(n) => {
                left.set(Some(n - 1));
                Ok(())
            }
            None => Ok(()),
        })
    }
}
