//! A session's answer cache: an identical query is answered with the
//! session's stored release instead of fresh noise.
//!
//! Returning a stored answer is post-processing of a release already
//! charged (`docs/accounting.md` §2, "Repeated queries"): it costs nothing, leaves the
//! posterior alone and reveals nothing new. Asking the same question again
//! and again therefore cannot average the noise away.
//!
//! # Owns
//! [`QueryDigest`] (the canonical key of a query), [`CacheKey`] (that key
//! and the principal whose partition it counts against) and
//! [`AnswerCache`] (per principal, the bounded FIFO of released answers
//! and what is remembered of evicted ones), including its byte encoding
//! inside a session record.
//!
//! # Invariants
//! - The key is the validated example itself, not its encoding: FP32 or
//!   FP64, typed or raw, `[64]` or `[1, 64]`, Predict or `ModelInfer` — the
//!   same values are the same query (−0.0 counts as 0.0). In a session
//!   shared by several principals (global scope) it also names the
//!   principal, so nobody learns from a `cached` flag what another asked.
//! - An entry holds only what was released, plus Prop. 5.1's evidence (a
//!   function of the published release Q(r) and Σ, so the flag can be
//!   given at any α); the published noisy vector is kept only when it was
//!   returned.
//! - Entries are partitioned by [`Owner`], the principal that asked: at
//!   most `capacity` entries *per owner*, the owner's oldest evicted first,
//!   and under [`OnEvicted::Refuse`] the first 8 bytes of an evicted digest
//!   are remembered with its owner for the life of the session (16 bytes
//!   per evicted query), so a repeat of it is refused, never answered with
//!   fresh noise. Nothing one owner does changes what another owner's
//!   lookups return: under global scope the shared budget is the only
//!   state principals share (`docs/accounting.md` §2, §4).

use crate::privacy::confidence::Evidence;
use crate::store::{Reader, put_floats};
use sha2::{Digest as _, Sha256};
use std::collections::VecDeque;

/// SHA-256 of a query's canonical form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QueryDigest([u8; 32]);

impl QueryDigest {
    /// The key of the validated example `features` (row-major).
    pub fn of(features: &[f64]) -> QueryDigest {
        let mut h = Sha256::new();
        h.update(b"pacpriv-query/v1\0");
        h.update((features.len() as u64).to_le_bytes());
        for &x in features {
            // +0.0 for −0.0: the same input to every model.
            let x = if x == 0.0 { 0.0 } else { x };
            h.update(x.to_le_bytes());
        }
        QueryDigest(h.finalize().into())
    }

    /// This key as asked by `principal`: under global scope one session
    /// serves every principal, and a repeat must not tell one principal
    /// what another asked.
    pub fn of_principal(&self, principal: &str) -> QueryDigest {
        let mut h = Sha256::new();
        h.update(b"pacpriv-query-of/v1\0");
        h.update(self.0);
        h.update(principal.as_bytes());
        QueryDigest(h.finalize().into())
    }

    fn prefix(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[..8]);
        u64::from_le_bytes(b)
    }
}

/// The partition a cached answer counts against: the principal that asked
/// it. Every principal of a per-principal session is [`Owner::SOLE`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Owner(u64);

impl Owner {
    /// The one principal of a per-principal session (and every entry a
    /// record written before partitioning holds).
    pub const SOLE: Owner = Owner(0);

    /// `principal`'s partition in a shared (global-scope) session: the
    /// first 8 bytes of a SHA-256 of its name (never [`Owner::SOLE`]).
    pub fn of(principal: &str) -> Owner {
        let mut h = Sha256::new();
        h.update(b"pacpriv-cache-owner/v1\0");
        h.update(principal.as_bytes());
        let mut b = [0u8; 8];
        b.copy_from_slice(&h.finalize()[..8]);
        Owner(u64::from_le_bytes(b).max(1))
    }
}

/// A query as a session's cache knows it: its digest (under global scope
/// already the principal's own, [`QueryDigest::of_principal`]) and the
/// partition it counts against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// The query's digest.
    pub digest: QueryDigest,
    /// Whose partition.
    pub owner: Owner,
}

impl From<QueryDigest> for CacheKey {
    /// The key of a query in a per-principal session.
    fn from(digest: QueryDigest) -> CacheKey {
        CacheKey { digest, owner: Owner::SOLE }
    }
}

/// What a repeat of an evicted query gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnEvicted {
    /// Refused (the default): a query is answered with noise at most once.
    Refuse,
    /// Answered afresh and charged like any new query.
    Charge,
}

/// Cache configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheSettings {
    /// Entries kept per principal in a session; 0 turns the cache off.
    pub capacity: usize,
    /// What a repeat of an evicted query gets.
    pub on_evicted: OnEvicted,
}

impl CacheSettings {
    /// No caching: every query is answered afresh.
    pub const OFF: CacheSettings = CacheSettings { capacity: 0, on_evicted: OnEvicted::Charge };
}

/// One released answer, as a repeat gets it back.
#[derive(Clone, Debug, PartialEq)]
pub struct Cached {
    /// The released label.
    pub label: usize,
    /// Whether the teachers were unanimous.
    pub unanimous: bool,
    /// Prop. 5.1's evidence (label mode).
    pub evidence: Option<Evidence>,
    /// The published noisy vector, if it was returned.
    pub published: Option<Vec<f64>>,
}

/// What the cache knows of a query.
#[derive(Debug, PartialEq)]
pub enum Lookup<'a> {
    /// Answered before and still cached.
    Hit(&'a Cached),
    /// Answered before, evicted since, and remembered (only under
    /// [`OnEvicted::Refuse`]).
    Evicted,
    /// Not answered before, as far as this session remembers.
    Miss,
}

/// A session's cached answers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AnswerCache {
    /// Oldest first (all owners interleaved).
    entries: VecDeque<(CacheKey, Cached)>,
    /// (owner, digest prefix) of evicted entries, sorted (only under `Refuse`).
    evicted: Vec<(Owner, u64)>,
}

/// First u32 of the current encoding: a count no cache of the first format
/// ever had, so the two are told apart by it.
const FORMAT_MARK: u32 = u32::MAX;
/// The encoding written now (1 was the unmarked first format).
const FORMAT: u8 = 2;

impl AnswerCache {
    /// What the cache knows of `key`.
    pub fn lookup(&self, key: &CacheKey) -> Lookup<'_> {
        if let Some((_, c)) = self.entries.iter().find(|(k, _)| k.digest == key.digest) {
            return Lookup::Hit(c);
        }
        if self.evicted.binary_search(&(key.owner, key.digest.prefix())).is_ok() {
            return Lookup::Evicted;
        }
        Lookup::Miss
    }

    /// Keeps `answer` for `key` (a query just answered afresh), evicting
    /// the owner's oldest entry beyond `settings.capacity`. Other owners'
    /// entries are never touched.
    pub fn insert(&mut self, key: CacheKey, answer: Cached, settings: CacheSettings) {
        if settings.capacity == 0 {
            return;
        }
        self.entries.retain(|(k, _)| k.digest != key.digest);
        self.entries.push_back((key, answer));
        while self.entries.iter().filter(|(k, _)| k.owner == key.owner).count() > settings.capacity {
            let Some(at) = self.entries.iter().position(|(k, _)| k.owner == key.owner) else { break };
            let Some((old, _)) = self.entries.remove(at) else { break };
            if settings.on_evicted == OnEvicted::Refuse {
                let p = (old.owner, old.digest.prefix());
                if let Err(at) = self.evicted.binary_search(&p) {
                    self.evicted.insert(at, p);
                }
            }
        }
    }

    /// Number of cached answers (all owners).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is cached or remembered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.evicted.is_empty()
    }

    /// Appends the byte form, little-endian in the store's record encoding:
    /// `FORMAT_MARK`, `FORMAT`, entry count, entries (digest, owner,
    /// label, flags, evidence, published), evicted count, (owner, prefix)s.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&FORMAT_MARK.to_le_bytes());
        out.push(FORMAT);
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        for (k, c) in &self.entries {
            out.extend_from_slice(&k.digest.0);
            out.extend_from_slice(&k.owner.0.to_le_bytes());
            out.extend_from_slice(&(c.label as u32).to_le_bytes());
            let flags =
                u8::from(c.unanimous) | u8::from(c.evidence.is_some()) << 1 | u8::from(c.published.is_some()) << 2;
            out.push(flags);
            if let Some(e) = c.evidence {
                out.extend_from_slice(&e.min_t().to_le_bytes());
                out.extend_from_slice(&(e.k() as u32).to_le_bytes());
            }
            if let Some(p) = &c.published {
                put_floats(out, p);
            }
        }
        out.extend_from_slice(&(self.evicted.len() as u32).to_le_bytes());
        for (owner, prefix) in &self.evicted {
            out.extend_from_slice(&owner.0.to_le_bytes());
            out.extend_from_slice(&prefix.to_le_bytes());
        }
    }

    /// Reads what [`AnswerCache::encode`] wrote — or the first, unmarked
    /// format, whose entries all belong to [`Owner::SOLE`] — from the front
    /// of `bytes`; the cache and the rest. `None` for malformed bytes.
    ///
    /// The first format's evidence was computed from the *unrounded*
    /// release; its statistic is rounded down to a multiple of 2⁻¹⁰ here,
    /// so repeats of those answers no longer give away its low-order bits
    /// (only ever less confident than before).
    pub fn decode(bytes: &[u8]) -> Option<(AnswerCache, &[u8])> {
        let mut r = Reader(bytes);
        let first = r.u32()?;
        let (legacy, n) = if first == FORMAT_MARK {
            let [format] = r.take::<1>()?;
            (false, if format == FORMAT { r.u32()? } else { return None })
        } else {
            (true, first)
        };
        let mut entries = VecDeque::with_capacity(n.min(4096) as usize);
        for _ in 0..n {
            let digest = QueryDigest(r.take::<32>()?);
            let owner = if legacy { Owner::SOLE } else { Owner(r.u64()?) };
            let label = r.u32()? as usize;
            let [flags] = r.take::<1>()?;
            let evidence = if flags & 2 != 0 {
                let min_t = f64::from_bits(r.u64()?);
                let min_t = if legacy { (min_t * 1024.0).floor() / 1024.0 } else { min_t };
                Some(Evidence::restore(min_t, r.u32()? as usize).ok()?)
            } else {
                None
            };
            let published = if flags & 4 != 0 { Some(r.floats()?) } else { None };
            entries.push_back((CacheKey { digest, owner }, Cached { label, unanimous: flags & 1 != 0, evidence, published }));
        }
        let m = r.u32()?;
        let evicted: Vec<(Owner, u64)> = (0..m)
            .map(|_| if legacy { Some((Owner::SOLE, r.u64()?)) } else { Some((Owner(r.u64()?), r.u64()?)) })
            .collect::<Option<_>>()?;
        evicted.is_sorted().then_some((AnswerCache { entries, evicted }, r.0))
    }
}

#[cfg(test)]
mod test;
