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
//! and what is remembered of evicted ones), including its schema form
//! inside a session record ([`crate::store::record`]).
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
use crate::store::record::{AnswerCacheRecord, CachedAnswerRecord, EvictedRecord, EvidenceRecord, PublishedRecord};
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

    /// The digest's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
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

/// What a repeat of an evicted query gets (`privacy.answer_cache_evicted`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
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

    /// The schema form a session record keeps (`None`: nothing cached or
    /// remembered, so a record without a cache stays small).
    pub fn to_record(&self) -> Option<AnswerCacheRecord> {
        if self.is_empty() {
            return None;
        }
        let entries = self
            .entries
            .iter()
            .map(|(k, c)| CachedAnswerRecord {
                digest: k.digest.0.to_vec(),
                owner: k.owner.0,
                label: c.label as u32,
                unanimous: c.unanimous,
                evidence: c.evidence.map(|e| EvidenceRecord { min_t: e.min_t(), k: e.k() as u32 }),
                published: c.published.as_ref().map(|p| PublishedRecord { values: p.clone() }),
            })
            .collect();
        let evicted = self.evicted.iter().map(|&(owner, prefix)| EvictedRecord { owner: owner.0, prefix }).collect();
        Some(AnswerCacheRecord { entries, evicted })
    }

    /// Back from [`AnswerCache::to_record`]'s form; `None` for values
    /// outside their domain (a digest not 32 bytes, invalid evidence,
    /// unsorted evictions).
    pub fn from_record(record: &AnswerCacheRecord) -> Option<AnswerCache> {
        let entries = record
            .entries
            .iter()
            .map(|e| {
                let key = CacheKey { digest: QueryDigest(e.digest.as_slice().try_into().ok()?), owner: Owner(e.owner) };
                let evidence = match e.evidence {
                    Some(ev) => Some(Evidence::restore(ev.min_t, ev.k as usize).ok()?),
                    None => None,
                };
                let published = e.published.as_ref().map(|p| p.values.clone());
                Some((key, Cached { label: e.label as usize, unanimous: e.unanimous, evidence, published }))
            })
            .collect::<Option<VecDeque<_>>>()?;
        let evicted: Vec<(Owner, u64)> = record.evicted.iter().map(|e| (Owner(e.owner), e.prefix)).collect();
        evicted.is_sorted().then_some(AnswerCache { entries, evicted })
    }
}

#[cfg(test)]
mod test;
