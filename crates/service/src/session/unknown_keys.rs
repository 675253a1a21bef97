//! Which key digests to look up in the store ([`UnknownKeys`]). With
//! PostgreSQL every request looks its key up (so that a principal created
//! or revoked on any replica counts on every replica at once), on the
//! lookups' own connections (`store::postgres::LOOKUP_CONNECTIONS`). A peer
//! sending random keys would cost the database a round trip each; three
//! things bound that:
//!
//! - a digest found unknown is refused without a lookup for [`TTL`];
//! - a digest not seen naming a principal within [`KNOWN_TTL`] costs its
//!   peer (an IPv4 address or IPv6 /48) a token of a bucket of
//!   [`PEER_LOOKUPS_PER_SECOND`] (bursts of [`PEER_LOOKUP_BURST`]); a peer
//!   whose bucket is empty is refused such keys without a lookup, while
//!   keys seen naming a principal lately are still looked up for it (a
//!   client behind the same address as a flood goes on working);
//! - both sets hold at most [`CAPACITY`] digests each, and every operation
//!   on them is O(1) (amortised).
//!
//! # Invariants
//! - Only digests that named no principal at all are kept as unknown: a
//!   known key is always looked up (its revocation must count at once).
//! - A key provisioned through this replica is forgotten as unknown at
//!   once; one provisioned through another replica works here within
//!   [`TTL`] (and, from a peer whose bucket is empty, once it refills).

use governor::{DefaultKeyedRateLimiter, Quota};
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long an unknown digest is refused without a lookup.
pub const TTL: Duration = Duration::from_secs(2);
/// How long a digest that named a principal is looked up for any peer.
pub const KNOWN_TTL: Duration = Duration::from_secs(300);
/// How often every active principal's key is marked as seen lately
/// (`Sessions::learn_active_keys`): well within [`KNOWN_TTL`].
pub const KNOWN_REFRESH: Duration = Duration::from_secs(60);
/// Most digests kept in each set (~3 MiB each).
pub const CAPACITY: usize = 65_536;
/// Lookups of keys not known lately, per peer and second…
pub const PEER_LOOKUPS_PER_SECOND: u32 = 20;
/// …and at once.
pub const PEER_LOOKUP_BURST: u32 = 40;

/// What to do with a key before looking it up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Lookup {
    /// Found unknown within [`TTL`]: refuse it as unknown.
    Unknown,
    /// Seen naming a principal lately, or presented by this process:
    /// look it up as any step's read is made.
    Familiar,
    /// Neither: look it up on the unfamiliar keys' own connections.
    Unfamiliar,
    /// Neither, and its peer (or every peer together) has no lookup left:
    /// refuse it for now, without a lookup.
    Limited,
}

/// Digests found unknown, digests found naming a principal, and each
/// peer's bucket of lookups.
pub(super) struct UnknownKeys {
    unknown: Mutex<Recent>,
    known: Mutex<Recent>,
    peers: DefaultKeyedRateLimiter<IpAddr>,
    /// When `peers` was last pruned of full buckets.
    pruned: Mutex<Instant>,
}

impl Default for UnknownKeys {
    fn default() -> Self {
        let quota = |rate: u32, burst: u32| {
            let (rate, burst) = (NonZeroU32::new(rate), NonZeroU32::new(burst));
            Quota::per_second(rate.unwrap_or(NonZeroU32::MIN)).allow_burst(burst.unwrap_or(NonZeroU32::MIN))
        };
        UnknownKeys {
            unknown: Mutex::new(Recent::new(TTL)),
            known: Mutex::new(Recent::new(KNOWN_TTL)),
            peers: DefaultKeyedRateLimiter::keyed(quota(PEER_LOOKUPS_PER_SECOND, PEER_LOOKUP_BURST)),
            pruned: Mutex::new(Instant::now()),
        }
    }
}

impl UnknownKeys {
    /// How to look `digest` up for `peer` (none: a caller of this
    /// process, not a peer) ([`Lookup`]); an unfamiliar key takes a token
    /// of its peer's bucket and of the one all peers share.
    pub(super) fn classify(&self, digest: &[u8; 32], peer: Option<IpAddr>) -> Lookup {
        if lock(&self.unknown).contains(digest) {
            return Lookup::Unknown;
        }
        let Some(peer) = peer else { return Lookup::Familiar };
        if lock(&self.known).contains(digest) {
            return Lookup::Familiar;
        }
        if self.peers.len() > CAPACITY {
            // O(peers), at most once a second: a bucket idle that long is
            // full again (a burst of 40 refills in 2 s), and dropping a
            // full bucket changes nothing.
            let mut pruned = self.pruned.lock().unwrap_or_else(PoisonError::into_inner);
            if pruned.elapsed() > Duration::from_secs(1) {
                self.peers.retain_recent();
                self.peers.shrink_to_fit();
                *pruned = Instant::now();
            }
        }
        if self.peers.check_key(&crate::net::guard::site(peer)).is_ok() { Lookup::Unfamiliar } else { Lookup::Limited }
    }

    /// Remembers that `digest` named no principal just now.
    pub(super) fn insert(&self, digest: [u8; 32]) {
        lock(&self.unknown).insert(digest);
    }

    /// Remembers that `digest` named an active principal just now.
    pub(super) fn known(&self, digest: &[u8; 32]) {
        lock(&self.known).insert(*digest);
    }

    /// Forgets `digest` as unknown: it names a principal now.
    pub(super) fn forget(&self, digest: &[u8; 32]) {
        lock(&self.unknown).remove(digest);
    }
}

fn lock(recent: &Mutex<Recent>) -> std::sync::MutexGuard<'_, Recent> {
    recent.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Digests each kept for `ttl` from when it was last inserted, at most
/// [`CAPACITY`] of them (the oldest give way), each operation O(1)
/// amortised: the queue holds insertions in order, so expiry pops its
/// front, and an entry removed or inserted again leaves a stale one there
/// that is dropped when it reaches the front.
struct Recent {
    ttl: Duration,
    at: HashMap<[u8; 32], Instant>,
    order: VecDeque<([u8; 32], Instant)>,
}

impl Recent {
    fn new(ttl: Duration) -> Self {
        Recent { ttl, at: HashMap::new(), order: VecDeque::new() }
    }

    fn contains(&self, digest: &[u8; 32]) -> bool {
        self.at.get(digest).is_some_and(|at| at.elapsed() < self.ttl)
    }

    fn insert(&mut self, digest: [u8; 32]) {
        let now = Instant::now();
        // Expired entries, stale ones, and while over capacity the oldest:
        // each insertion is popped once at most.
        while let Some(&(front, at)) = self.order.front() {
            let live = self.at.get(&front) == Some(&at);
            let over = self.at.len() >= CAPACITY || self.order.len() >= 2 * CAPACITY;
            if live && now.duration_since(at) < self.ttl && !over {
                break;
            }
            self.order.pop_front();
            if live {
                self.at.remove(&front);
            }
        }
        self.at.insert(digest, now);
        self.order.push_back((digest, now));
    }

    fn remove(&mut self, digest: &[u8; 32]) {
        self.at.remove(digest);
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn digest(i: u32) -> [u8; 32] {
        let mut d = [0; 32];
        d[..4].copy_from_slice(&i.to_be_bytes());
        d
    }

    #[test]
    fn a_full_set_gives_way_oldest_first_and_stays_bounded() {
        let mut recent = Recent::new(Duration::from_secs(60));
        for i in 0..(3 * CAPACITY as u32) {
            recent.insert(digest(i));
            if i % 7 == 0 {
                recent.remove(&digest(i));
            }
        }
        assert!(recent.at.len() <= CAPACITY && recent.order.len() <= 2 * CAPACITY);
        let last = 3 * CAPACITY as u32 - 1;
        assert!(recent.contains(&digest(last)) && !recent.contains(&digest(0)), "the newest stay, the oldest go");
    }

    #[test]
    fn a_peer_past_its_lookups_is_refused_unknown_keys_but_not_known_ones() {
        let keys = UnknownKeys::default();
        let (flood, other): (IpAddr, IpAddr) = ("192.0.2.1".parse().expect("ip"), "192.0.2.2".parse().expect("ip"));
        keys.known(&digest(0));
        let allowed = (1..=1000).filter(|&i| keys.classify(&digest(i), Some(flood)) == Lookup::Unfamiliar).count();
        assert!(
            (PEER_LOOKUP_BURST as usize..PEER_LOOKUP_BURST as usize + 10).contains(&allowed),
            "{allowed} lookups of random keys from one peer"
        );
        assert_eq!(keys.classify(&digest(0), Some(flood)), Lookup::Familiar, "a key known lately is still looked up");
        assert_eq!(keys.classify(&digest(2000), Some(other)), Lookup::Unfamiliar, "another peer has its own bucket");
        assert_eq!(keys.classify(&digest(2001), None), Lookup::Familiar, "the process's own callers are not capped");
        keys.insert(digest(3000));
        assert_eq!(keys.classify(&digest(3000), None), Lookup::Unknown, "refused without a lookup");
        keys.forget(&digest(3000));
        assert_eq!(keys.classify(&digest(3000), None), Lookup::Familiar);

        // The /64s of one /48 share a bucket.
        let keys = UnknownKeys::default();
        let sixty_fours =
            (0..1000u128).map(|i| IpAddr::from(std::net::Ipv6Addr::from((0x2001_0db8_0001u128 << 80) | (i << 64))));
        let allowed = sixty_fours.filter(|&p| keys.classify(&digest(1), Some(p)) == Lookup::Unfamiliar).count();
        assert!((PEER_LOOKUP_BURST as usize..PEER_LOOKUP_BURST as usize + 10).contains(&allowed), "{allowed}");
    }
}
