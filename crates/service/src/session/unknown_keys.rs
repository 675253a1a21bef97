//! Key digests that named no principal a moment ago ([`UnknownKeys`]).
//! With PostgreSQL every request looks its key up (so that a principal
//! created or revoked on any replica counts on every replica at once), and
//! a peer repeating an unknown key would cost the database a round trip
//! each time. A digest found unknown is refused without one for [`TTL`].
//!
//! # Invariants
//! - Only digests that named no principal at all are kept: a known key is
//!   always looked up (its revocation must count at once).
//! - At most [`CAPACITY`] digests are kept (~3 MiB); once full, expired
//!   ones are dropped, and a new one is not kept until there is room.
//! - A key provisioned through this replica is forgotten at once; one
//!   provisioned through another replica works here within [`TTL`].

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long an unknown digest is refused without a lookup.
pub const TTL: Duration = Duration::from_secs(2);
/// Most digests kept.
pub const CAPACITY: usize = 65_536;

/// Recently unknown key digests and when each was found unknown.
#[derive(Default)]
pub(super) struct UnknownKeys(Mutex<HashMap<[u8; 32], Instant>>);

impl UnknownKeys {
    /// Whether `digest` was found unknown within [`TTL`].
    pub(super) fn contains(&self, digest: &[u8; 32]) -> bool {
        let seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        seen.get(digest).is_some_and(|at| at.elapsed() < TTL)
    }

    /// Remembers that `digest` named no principal just now.
    pub(super) fn insert(&self, digest: [u8; 32]) {
        let mut seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.len() >= CAPACITY {
            seen.retain(|_, at| at.elapsed() < TTL);
        }
        if seen.len() < CAPACITY {
            seen.insert(digest, Instant::now());
        }
    }

    /// Forgets `digest`: it names a principal now.
    pub(super) fn forget(&self, digest: &[u8; 32]) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(digest);
    }
}
