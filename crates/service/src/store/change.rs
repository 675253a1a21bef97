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
}

impl Change {
    /// Whether there is nothing to write.
    pub fn is_none(&self) -> bool {
        self.steps == 0 && self.events.is_empty() && self.cache.is_empty()
    }
}
