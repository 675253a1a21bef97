//! An estimate of the heap the session registry holds for N idle
//! sessions, by part, from the types' sizes, the maps' growth rule and
//! glibc's chunk rounding — beside `sessions`' measured RSS, so the
//! unaccounted rest (redb's page cache, allocator slack) is visible.
//! Computed here from public types and what the bench provisioned, so the
//! library carries no measuring hooks.

use pacpriv_service::session::{Session, Versioned};
use pacpriv_store::PrincipalRecord;
use std::sync::{Arc, Mutex};

/// Heap bytes by part, for `principals` idle per-principal sessions.
#[derive(Clone, Copy, Debug)]
pub struct Footprint {
    /// Principals held, each with its session.
    pub principals: usize,
    /// Posterior log-weights: m f64 per session (the floor).
    pub log_weights: usize,
    /// Per session: the `Arc<Session>` (key, terms, place) and the state
    /// it holds in memory (the lock, the ledger, the empty cache).
    pub session_objects: usize,
    /// The registry's two hash tables (slots and control bytes).
    pub maps: usize,
    /// Heap copies of principal names: map key, record, session key, and
    /// the key index's value.
    pub names: usize,
}

impl Footprint {
    /// The registry of `names` (every principal active), each with a
    /// session in each of `datasets` datasets (the default one, then
    /// `d1`, `d2`, …) of `m` log-weights, as `Sessions::new` builds it for
    /// the embedded store.
    pub fn of(names: &[String], m: usize, datasets: usize) -> Footprint {
        let n = names.len();
        // An Arc's allocation: two counts and the value.
        let arc = |value: usize| heap_chunk(2 * size_of::<usize>() + value);
        // The state held in memory: its lock and the store it commits to.
        let held = arc(size_of::<Mutex<Versioned>>() + size_of::<usize>());
        // A further dataset's session key is "dN/NAME".
        let session_keys = |name: &str| {
            heap_chunk(name.len())
                + (1..datasets).map(|i| heap_chunk(name.len() + format!("d{i}/").len())).sum::<usize>()
        };
        Footprint {
            principals: n,
            log_weights: n * datasets * heap_chunk(8 * m),
            // Each principal's sessions are one `Arc<[Arc<Session>]>`.
            session_objects: n * (datasets * (arc(size_of::<Session>()) + held) + arc(datasets * size_of::<usize>())),
            maps: table_bytes::<String, (PrincipalRecord, Arc<[Arc<Session>]>)>(n) + table_bytes::<[u8; 32], String>(n),
            // Map key, record, key index's value, and each session's key.
            names: names.iter().map(|name| 3 * heap_chunk(name.len()) + session_keys(name)).sum(),
        }
    }

    /// The sum of the parts.
    pub fn total(&self) -> usize {
        self.log_weights + self.session_objects + self.maps + self.names
    }
}

/// What glibc's malloc takes for `n` bytes: an 8-byte header, 16-byte
/// alignment, 32 bytes at least (nothing for an empty allocation).
fn heap_chunk(n: usize) -> usize {
    if n == 0 { 0 } else { (n + 8).next_multiple_of(16).max(32) }
}

/// A hashbrown table grown by inserting `len` entries one by one: the
/// smallest power-of-two bucket count whose 7/8 holds them, one slot and
/// one control byte per bucket, plus a trailing group of control bytes.
fn table_bytes<K, V>(len: usize) -> usize {
    if len == 0 {
        return 0;
    }
    let buckets =
        if len < 8 { (len + 1).next_power_of_two().max(4) } else { (len * 8).div_ceil(7).next_power_of_two() };
    buckets * (size_of::<(K, V)>() + 1) + 16
}
