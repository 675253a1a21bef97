//! What a session's cell holds ([`Versioned`]): the privacy state
//! (posterior + ledger), its version, the journal chain's head and the
//! answer cache; how it is read back from its record and written to one;
//! and what every session of a deployment shares ([`SessionParams`],
//! [`Scope`]).
//!
//! # Invariants
//! - The version counts steps of Algorithm 1: it moves by one for each
//!   row answered by the mechanism, and never for an answer from the
//!   cache or a refusal.

use super::cache::AnswerCache;
use super::cache::CacheSettings;
use super::error::SessionError;
use pacpriv_privacy::keyed::NoiseKey;
use pacpriv_privacy::ledger::{Ledger, Policy};
use pacpriv_privacy::mechanism::{Calibration, SecretIndex, SessionState};
use pacpriv_privacy::posterior::Posterior;
use pacpriv_privacy::{Nats, PrivacyError, report};
use pacpriv_store::cell::{Cell, State};
use pacpriv_store::{CacheRows, CacheWrite, JournalEntry, SessionRecord, StoreError};

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
    pub(super) fn of(ledger: &Ledger) -> Self {
        Self::with_bound(ledger, report::mia_bound(ledger.spent()))
    }

    /// The view of `ledger` whose MIA bound is `mia_bound` (computed from
    /// its `spent` by the caller).
    fn with_bound(ledger: &Ledger, mia_bound: f64) -> Self {
        BudgetView {
            spent: ledger.spent().get(),
            limit: ledger.limit().get(),
            remaining: ledger.remaining(),
            per_query: ledger.per_query().get(),
            answered: ledger.answered(),
            charged: ledger.charged(),
            mia_bound,
            policy: ledger.policy(),
        }
    }
}

/// A session's state and how many steps produced it: what a
/// [`Cell`] holds.
#[derive(Clone)]
pub struct Versioned {
    pub(super) state: SessionState,
    pub(super) version: u64,
    pub(super) cache: AnswerCache,
    /// The chain hash of the last journal entry or event (the session's
    /// genesis hash before the first).
    pub(super) head: [u8; 32],
    /// Journal events so far (the last one's sequence number).
    pub(super) events: u64,
    /// The MIA bound of the last `spent` a view was made of, as (spent,
    /// bound): a free answer leaves `spent` as it was, and the bound's
    /// root-finding is the budget view's only non-trivial cost.
    pub(super) bound: Option<(f64, f64)>,
    /// The commitment to its dataset's noise key, written into every
    /// record: a record that names another is not resumed.
    pub(super) dataset: [u8; 32],
}

impl Versioned {
    /// The account now, as [`BudgetView::of`], with the MIA bound
    /// recomputed only when `spent` moved since the last view.
    pub(super) fn view(&mut self) -> BudgetView {
        let ledger = &self.state.ledger;
        let spent = ledger.spent();
        let bound = match self.bound {
            Some((at, bound)) if at.to_bits() == spent.get().to_bits() => bound,
            _ => report::mia_bound(spent),
        };
        self.bound = Some((spent.get(), bound));
        BudgetView::with_bound(ledger, bound)
    }
}

/// What resuming a session needs besides its record.
pub struct Terms {
    pub(super) params: std::sync::Arc<SessionParams>,
    /// The session's limit (the principal's budget, or the global one).
    pub(super) limit: Nats,
}

impl State for Versioned {
    type Context = Terms;
    type Error = SessionError;

    /// The state a record describes, or the uniform prior with an empty
    /// ledger; checked against m and against the dataset's secret (a
    /// record another dataset's session wrote — a key that named it under
    /// an earlier release's rules — is refused, never resumed).
    fn resume(
        terms: &Terms,
        key: &str,
        record: Option<&SessionRecord>,
        cache: CacheRows,
    ) -> Result<Self, SessionError> {
        let p = &terms.params;
        let dataset = p.noise.commitment();
        if record.and_then(|r| r.dataset).is_some_and(|d| d != dataset) {
            return Err(SessionError::OtherDataset { session: key.to_owned() });
        }
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
        Ok(Versioned { state, version, cache, head, events, bound: None, dataset })
    }

    fn record(&mut self) -> (SessionRecord, Vec<CacheWrite>) {
        let record = SessionRecord {
            journal_head: Some(self.head),
            journal_events: self.events,
            dataset: Some(self.dataset),
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
pub(super) fn cache_of(
    key: &str,
    record: Option<&SessionRecord>,
    rows: CacheRows,
) -> Result<AnswerCache, SessionError> {
    let cache = match record {
        Some(SessionRecord { cache: Some(inline), .. }) => AnswerCache::migrated(inline),
        Some(r) => AnswerCache::from_rows(&r.cache_owners, rows),
        None => AnswerCache::from_rows(&[], rows),
    };
    cache.ok_or_else(|| {
        SessionError::Store(StoreError::Corrupt { session: key.into(), reason: "undecodable answer cache".into() })
    })
}

/// One privacy session: its state, where the store keeps it.
pub type Session = Cell<Versioned>;

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
    /// The dataset's noise key: every draw's normals come from it
    /// ([`pacpriv_privacy::keyed`]).
    pub noise: NoiseKey,
    /// Journal every step (for audit and replay).
    pub journal: bool,
    /// The answer cache.
    pub cache: CacheSettings,
    /// What Σ is calibrated to: [`Calibration::Certified`] except in the
    /// canary audit's deliberately broken test server.
    pub calibration: Calibration,
}

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

    /// Whose account `principal`'s session is under this scope, as the
    /// budget gauges label it: the principal's own, or the shared
    /// session's ([`GLOBAL_SESSION`](pacpriv_store::GLOBAL_SESSION)).
    pub fn account_of(self, principal: &str) -> &str {
        match self {
            Scope::PerPrincipal => principal,
            Scope::Global => pacpriv_store::GLOBAL_SESSION,
        }
    }
}
