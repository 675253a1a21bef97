//! A session's answer cache: an identical query is answered with the
//! session's stored release instead of fresh noise.
//!
//! Returning a stored answer is post-processing of a release already
//! charged (`docs/assurance/accounting.md` §2, "Repeated queries"): it costs nothing, leaves the
//! posterior alone and reveals nothing new. Asking the same question again
//! and again therefore cannot average the noise away.
//!
//! # Owns
//! [`QueryDigest`] (the canonical key of a query), [`CacheKey`] (that key
//! and the principal whose partition it counts against) and
//! [`AnswerCache`] (per principal, the bounded FIFO of released answers
//! and what is remembered of evicted ones) and the writes that make its
//! changes durable ([`pacpriv_store::answers`]: rows of their own, beside
//! the session record).
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
//!   are remembered with its owner for the life of the session (one row
//!   per evicted query), so a repeat of it is refused, never answered with
//!   fresh noise. Nothing one owner does changes what another owner's
//!   lookups return: under global scope the shared budget is the only
//!   state principals share (`docs/assurance/accounting.md` §2, §4).
//! - Each owner's entries are numbered in answer order, and the session
//!   record keeps only each owner's span of numbers: a step writes the
//!   entry it added and the one it evicted, never the history.
//! - A cache read from the database holds the rows of the queries it was
//!   read for (probed) only; a lookup of any other query is refused as an
//!   evicted repeat, never answered with fresh noise.

use pacpriv_privacy::confidence::Evidence;
use pacpriv_store::answers::{CacheProbe, CacheRows, CacheWrite};
use pacpriv_store::record::{AnswerCacheRecord, CacheOwnerRecord, CachedAnswerRecord, EvidenceRecord, PublishedRecord};
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, HashMap, HashSet};

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

    /// This key as asked of the model `name` at `version`: every model
    /// answers for itself, so a repeat is a repeat of the same model's
    /// question. (The default model keeps [`QueryDigest::of`]'s key.)
    pub fn of_model(&self, name: &str, version: &str) -> QueryDigest {
        self.with(b"pacpriv-query-model/v1\0", &[name, version])
    }

    /// This key as asked of the model `name` at `version` whose stored
    /// identity is `identity` (`ModelSettings::identity`): a version
    /// number given other teachers never meets its predecessor's answers,
    /// even where the store's refusal of a reused number is bypassed.
    pub fn of_identity(&self, name: &str, version: &str, identity: &str) -> QueryDigest {
        self.with(b"pacpriv-query-identity/v1\0", &[name, version, identity])
    }

    /// SHA-256 over `tag`, this key and each of `parts` after its length.
    fn with(&self, tag: &[u8], parts: &[&str]) -> QueryDigest {
        let mut h = Sha256::new();
        h.update(tag);
        h.update(self.0);
        for part in parts {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        QueryDigest(h.finalize().into())
    }

    /// The digest's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    fn prefix(&self) -> u64 {
        pacpriv_store::answers::prefix(&self.0)
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

impl From<&CacheKey> for CacheProbe {
    fn from(key: &CacheKey) -> CacheProbe {
        CacheProbe { owner: key.owner.0, digest: key.digest.0 }
    }
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

/// A session's cached answers: all of them (a session held in this
/// process) or those of the queries a step was read for (a session in the
/// database), with the writes that make its changes durable.
///
/// Nothing is allocated until the first answer is kept (or a multi-row
/// request is checkpointed): an idle session's cache is one pointer, not
/// the ~260 bytes of its empty maps (issue 68 §5).
#[derive(Clone, Debug, Default)]
pub struct AnswerCache(Option<Box<Contents>>);

/// What an [`AnswerCache`] holds once it holds anything.
#[derive(Clone, Debug, Default, PartialEq)]
struct Contents {
    entries: HashMap<QueryDigest, Entry>,
    /// Which digest each held (owner, number) is.
    numbered: HashMap<(Owner, u64), QueryDigest>,
    /// (owner, digest prefix) of remembered evictions (only under `Refuse`).
    evicted: HashSet<(Owner, u64)>,
    /// Every owner's span of numbers, held or not.
    owners: BTreeMap<Owner, Span>,
    /// `None`: every entry is held; `Some`: only these keys were read.
    probed: Option<HashSet<CacheKey>>,
    /// Changes not yet handed to the store, in order.
    writes: Vec<CacheWrite>,
    /// While a multi-row request runs: how to take its changes back.
    undo: Option<Vec<Undo>>,
}

#[derive(Clone, Debug, PartialEq)]
struct Entry {
    owner: Owner,
    seq: u64,
    cached: Cached,
}

/// An owner's entries are numbered `oldest` … `next` − 1.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Span {
    oldest: u64,
    next: u64,
}

/// One change [`AnswerCache::rollback`] takes back.
#[derive(Clone, Debug, PartialEq)]
enum Undo {
    Inserted(QueryDigest),
    Evicted { owner: Owner, seq: u64, entry: Option<(QueryDigest, Entry)>, marked: Option<(Owner, u64)> },
}

/// Where [`AnswerCache::checkpoint`] was taken.
#[derive(Debug)]
pub struct Checkpoint {
    owners: BTreeMap<Owner, Span>,
    writes: usize,
}

impl PartialEq for AnswerCache {
    fn eq(&self, other: &Self) -> bool {
        match (self.0.as_deref(), other.0.as_deref()) {
            (Some(a), Some(b)) => a == b,
            (Some(held), None) | (None, Some(held)) => *held == Contents::default(),
            (None, None) => true,
        }
    }
}

impl AnswerCache {
    fn contents(&mut self) -> &mut Contents {
        self.0.get_or_insert_default()
    }

    /// What the cache knows of `key`.
    pub fn lookup(&self, key: &CacheKey) -> Lookup<'_> {
        self.0.as_deref().map_or(Lookup::Miss, |c| c.lookup(key))
    }

    /// The number `key`'s held entry has in its owner's order, and the
    /// number the owner's next entry will get ([`Contents::numbers`]).
    pub fn numbers(&self, key: &CacheKey) -> (Option<u64>, u64) {
        self.0.as_deref().map_or((None, 0), |c| c.numbers(key))
    }

    /// Keeps `answer` for `key` ([`Contents::insert`]); with the cache off,
    /// nothing (and nothing is allocated).
    pub fn insert(&mut self, key: CacheKey, answer: Cached, settings: CacheSettings) {
        if settings.capacity > 0 {
            self.contents().insert(key, answer, settings);
        }
    }

    /// Starts recording how to take back what follows (a multi-row
    /// request, all or nothing), instead of copying the whole cache.
    pub fn checkpoint(&mut self) -> Checkpoint {
        self.contents().checkpoint()
    }

    /// Takes back everything since `at`.
    pub fn rollback(&mut self, at: Checkpoint) {
        self.contents().rollback(at);
    }

    /// Keeps everything since the checkpoint.
    pub fn release(&mut self) {
        if let Some(c) = &mut self.0 {
            c.undo = None;
        }
    }

    /// Number of cached answers held (all owners).
    pub fn len(&self) -> usize {
        self.0.as_deref().map_or(0, |c| c.entries.len())
    }

    /// Whether nothing is held or remembered.
    pub fn is_empty(&self) -> bool {
        self.0.as_deref().is_none_or(|c| c.entries.is_empty() && c.evicted.is_empty())
    }

    /// Each owner's span, as the session record keeps it.
    pub fn owners(&self) -> Vec<CacheOwnerRecord> {
        let owners = self.0.as_deref().map(|c| c.owners.iter()).into_iter().flatten();
        owners.map(|(o, s)| CacheOwnerRecord { owner: o.0, oldest: s.oldest, next: s.next }).collect()
    }

    /// The changes since the last call, for the store to write with the
    /// session record.
    pub fn take_writes(&mut self) -> Vec<CacheWrite> {
        self.0.as_mut().map(|c| std::mem::take(&mut c.writes)).unwrap_or_default()
    }

    /// The cache the store's `rows` and a record's owner spans describe
    /// ([`Contents::from_rows`]).
    pub fn from_rows(owners: &[CacheOwnerRecord], rows: CacheRows) -> Option<AnswerCache> {
        Contents::from_rows(owners, rows).map(AnswerCache::of)
    }

    /// The cache a format-2 record kept inline ([`Contents::migrated`]).
    pub fn migrated(record: &AnswerCacheRecord) -> Option<AnswerCache> {
        Contents::migrated(record).map(AnswerCache::of)
    }

    /// `contents`, allocated only if it holds anything (a session resumed
    /// with an empty cache stays one pointer).
    fn of(contents: Contents) -> AnswerCache {
        AnswerCache((contents != Contents::default()).then(|| Box::new(contents)))
    }
}

impl Contents {
    fn lookup(&self, key: &CacheKey) -> Lookup<'_> {
        if let Some(e) = self.entries.get(&key.digest) {
            return Lookup::Hit(&e.cached);
        }
        if self.evicted.contains(&(key.owner, key.digest.prefix())) {
            return Lookup::Evicted;
        }
        if self.probed.as_ref().is_some_and(|p| !p.contains(key)) {
            // Read without this key: what the store holds of it is unknown
            // here, and only a refusal is safe.
            return Lookup::Evicted;
        }
        Lookup::Miss
    }

    /// The number `key`'s held entry has in its owner's order, and the
    /// number the owner's next entry will get: with capacity c, an entry
    /// numbered s is still held after the owner's next n inserts iff
    /// s + c ≥ next + n — what lets a request's cost tell, before any draw,
    /// whether its own earlier rows will evict an answer a later row
    /// repeats.
    fn numbers(&self, key: &CacheKey) -> (Option<u64>, u64) {
        let held = self.entries.get(&key.digest).map(|e| e.seq);
        (held, self.owners.get(&key.owner).map_or(0, |s| s.next))
    }

    /// Keeps `answer` for `key` (a query just answered afresh, after a
    /// [`Lookup::Miss`]), evicting the owner's oldest entries beyond
    /// `settings.capacity`. Other owners' entries are never touched; a key
    /// already held keeps its first answer.
    fn insert(&mut self, key: CacheKey, answer: Cached, settings: CacheSettings) {
        if settings.capacity == 0 || self.entries.contains_key(&key.digest) {
            return;
        }
        self.append(key, answer);
        if let Some(undo) = &mut self.undo {
            undo.push(Undo::Inserted(key.digest));
        }
        let remember = settings.on_evicted == OnEvicted::Refuse;
        let span = self.owners.entry(key.owner).or_default();
        let beyond = (span.next - span.oldest).saturating_sub(settings.capacity as u64);
        let first = span.oldest;
        span.oldest += beyond;
        for seq in first..first + beyond {
            self.evict(key.owner, seq, remember);
        }
    }

    /// Holds `cached` for `key` as its owner's next number, and writes it.
    fn append(&mut self, key: CacheKey, cached: Cached) {
        let span = self.owners.entry(key.owner).or_default();
        let seq = span.next;
        span.next += 1;
        self.writes.push(CacheWrite::Insert(answer_record(&key, seq, &cached)));
        self.numbered.insert((key.owner, seq), key.digest);
        self.entries.insert(key.digest, Entry { owner: key.owner, seq, cached });
    }

    /// Evicts the owner's entry number `seq` (held or not).
    fn evict(&mut self, owner: Owner, seq: u64, remember: bool) {
        let entry = self.numbered.remove(&(owner, seq)).and_then(|d| Some((d, self.entries.remove(&d)?)));
        let marked = match &entry {
            Some((digest, _)) if remember && self.evicted.insert((owner, digest.prefix())) => {
                Some((owner, digest.prefix()))
            }
            _ => None,
        };
        self.writes.push(CacheWrite::Evict { owner: owner.0, seq, remember });
        if let Some(undo) = &mut self.undo {
            undo.push(Undo::Evicted { owner, seq, entry, marked });
        }
    }

    fn checkpoint(&mut self) -> Checkpoint {
        self.undo = Some(Vec::new());
        Checkpoint { owners: self.owners.clone(), writes: self.writes.len() }
    }

    fn rollback(&mut self, at: Checkpoint) {
        for undo in self.undo.take().unwrap_or_default().into_iter().rev() {
            match undo {
                Undo::Inserted(digest) => {
                    if let Some(e) = self.entries.remove(&digest) {
                        self.numbered.remove(&(e.owner, e.seq));
                    }
                }
                Undo::Evicted { owner, seq, entry, marked } => {
                    if let Some((digest, entry)) = entry {
                        self.numbered.insert((owner, seq), digest);
                        self.entries.insert(digest, entry);
                    }
                    if let Some(mark) = marked {
                        self.evicted.remove(&mark);
                    }
                }
            }
        }
        self.owners = at.owners;
        self.writes.truncate(at.writes);
    }

    /// The cache the store's `rows` and a record's owner spans describe;
    /// `None` for values outside their domain (a digest not 32 bytes,
    /// invalid evidence, an entry outside its owner's span).
    fn from_rows(owners: &[CacheOwnerRecord], rows: CacheRows) -> Option<Contents> {
        let owners: BTreeMap<Owner, Span> =
            owners.iter().map(|o| (Owner(o.owner), Span { oldest: o.oldest, next: o.next })).collect();
        let mut cache = Contents { owners, ..Contents::default() };
        for record in &rows.entries {
            let (key, cached) = from_answer_record(record)?;
            let span = cache.owners.get(&key.owner)?;
            if !(span.oldest..span.next).contains(&record.seq) {
                return None;
            }
            cache.numbered.insert((key.owner, record.seq), key.digest);
            cache.entries.insert(key.digest, Entry { owner: key.owner, seq: record.seq, cached });
        }
        cache.evicted = rows.evicted.iter().map(|&(owner, prefix)| (Owner(owner), prefix)).collect();
        cache.probed = rows.probed.map(|probes| {
            probes.iter().map(|p| CacheKey { digest: QueryDigest(p.digest), owner: Owner(p.owner) }).collect()
        });
        Some(cache)
    }

    /// The cache a format-2 record kept inline, with every entry and
    /// eviction pending as a write, so the session's next write moves it to
    /// its own rows: each owner's remembered evictions are numbered first,
    /// then its entries in their FIFO order. `None` for values outside
    /// their domain (a digest not 32 bytes, invalid evidence, unsorted
    /// evictions).
    fn migrated(record: &AnswerCacheRecord) -> Option<Contents> {
        if !record.evicted.is_sorted_by_key(|e| (e.owner, e.prefix)) {
            return None;
        }
        let mut cache = Contents::default();
        for e in &record.evicted {
            let span = cache.owners.entry(Owner(e.owner)).or_default();
            let seq = span.next;
            (span.oldest, span.next) = (seq + 1, seq + 1);
            cache.evicted.insert((Owner(e.owner), e.prefix));
            cache.writes.push(CacheWrite::Remember { owner: e.owner, seq, prefix: e.prefix });
        }
        for e in &record.entries {
            let (key, cached) = from_answer_record(e)?;
            cache.append(key, cached);
        }
        Some(cache)
    }
}

/// `answer` to `key` as the store keeps it, number `seq`.
fn answer_record(key: &CacheKey, seq: u64, c: &Cached) -> CachedAnswerRecord {
    CachedAnswerRecord {
        digest: key.digest.0.to_vec(),
        owner: key.owner.0,
        seq,
        label: c.label as u32,
        unanimous: c.unanimous,
        evidence: c.evidence.map(|e| EvidenceRecord { min_t: e.min_t(), k: e.k() as u32 }),
        published: c.published.as_ref().map(|p| PublishedRecord { values: p.clone() }),
    }
}

/// Back from [`answer_record`]'s form; `None` outside the domain.
fn from_answer_record(e: &CachedAnswerRecord) -> Option<(CacheKey, Cached)> {
    let key = CacheKey { digest: QueryDigest(e.digest.as_slice().try_into().ok()?), owner: Owner(e.owner) };
    let evidence = match e.evidence {
        Some(ev) => Some(Evidence::restore(ev.min_t, ev.k as usize).ok()?),
        None => None,
    };
    let published = e.published.as_ref().map(|p| p.values.clone());
    Some((key, Cached { label: e.label as usize, unanimous: e.unanimous, evidence, published }))
}

#[cfg(test)]
mod test;
