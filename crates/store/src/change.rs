//! What one step changed, for the store to write with the session's new
//! record ([`Change`]).

use super::answers::CacheWrite;
use super::record::{JournalEntry, JournalEvent};

/// What a step did, for the store: nothing (a cached answer, the
/// journal off), or steps and journal items to write with the state's
/// new record.
#[derive(Debug, Default)]
pub struct Change {
    /// How many steps the version moved (one per charged row).
    pub steps: u64,
    /// One entry per step, in version order, or none (journal off).
    pub journal: Vec<JournalEntry>,
    /// The journal's events (cache hits, refusals), in sequence order.
    pub events: Vec<JournalEvent>,
    /// The cache writes to commit with the record, in the order they
    /// happened (set by the cell from [`State::record`](super::cell::State::record)).
    pub cache: Vec<CacheWrite>,
    /// When the step's answers may leave, relative to the record's commit.
    pub release: Release,
    /// The step's answers, counted on their way to the embedded store
    /// until it has queued the record ([`Arrivals`](crate::Arrivals)).
    pub arriving: Vec<crate::Arrival>,
}

/// When a step's answers may leave (`docs/assurance/accounting.md` §5):
/// a charged answer only once its charge is durable; an answer that
/// charged nothing and moved no posterior without waiting for the disk.
/// Ordered from no wait to the longest: a request waits for its strictest
/// row (`max`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Release {
    /// At once: nothing in it was charged, moved a posterior, or repeats
    /// an answer that was (exact unanimous answers under `contested` or
    /// `unanimous_only`, fresh or cached), and the journal is off (with it
    /// on, every answer waits for its entry). A crash may drop its record:
    /// what that loses is said in `docs/assurance/accounting.md` §5.
    Free,
    /// Once the session's charges are durable: it repeats a cached answer
    /// whose step was charged, which may still be committing.
    AfterCharges,
    /// Once this record is durable: it charged, moved a posterior or
    /// journaled a refusal. What every step does unless it says otherwise.
    #[default]
    Durable,
}

impl Change {
    /// Whether there is nothing to write.
    pub fn is_none(&self) -> bool {
        self.steps == 0 && self.events.is_empty() && self.cache.is_empty()
    }
}
