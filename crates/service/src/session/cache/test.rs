use super::*;
use pacpriv_privacy::posterior::Form;
use pacpriv_store::SessionRecord;
use pacpriv_store::answers::squash;
use pacpriv_store::record::EvictedRecord;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// What a store holds of one session's cache: the rows its writes left.
#[derive(Default)]
struct Rows {
    answers: BTreeMap<(u64, u64), CachedAnswerRecord>,
    evicted: BTreeSet<(u64, u64)>,
}

impl Rows {
    /// Applies `cache`'s pending writes as both backends do.
    fn write(&mut self, cache: &mut AnswerCache) {
        let s = squash(&cache.take_writes());
        for (owner, seq, remember) in s.evict {
            let gone = self.answers.remove(&(owner, seq)).expect("an evicted answer is stored");
            if remember {
                self.evicted.insert((owner, pacpriv_store::answers::prefix(&gone.digest)));
            }
        }
        for a in s.insert {
            assert!(self.answers.insert((a.owner, a.seq), a).is_none(), "numbers are never reused");
        }
        self.evicted.extend(s.remember.iter().map(|&(owner, _, prefix)| (owner, prefix)));
    }

    /// The cache a resumed session holds.
    fn read(&self, owners: &[CacheOwnerRecord]) -> Option<AnswerCache> {
        let rows = CacheRows {
            entries: self.answers.values().cloned().collect(),
            evicted: self.evicted.iter().copied().collect(),
            probed: None,
        };
        AnswerCache::from_rows(owners, rows)
    }
}

fn answer(label: usize) -> Cached {
    Cached { label, unanimous: false, evidence: Evidence::restore(1.5, 3).ok(), published: None }
}

fn key(x: f64) -> CacheKey {
    QueryDigest::of(&[x]).into()
}

/// A version's answers are keyed by its identity as well as its name and
/// version: the same number given other teachers meets none of them, and
/// the key differs from the name-and-version key of earlier releases.
#[test]
fn a_version_keys_its_answers_by_its_identity() {
    let q = QueryDigest::of(&[1.0, 2.0]);
    let key = q.of_identity("private", "2", "aaaa");
    assert_ne!(key, q.of_identity("private", "2", "bbbb"), "other teachers under the number");
    assert_ne!(key, q.of_identity("private", "3", "aaaa"));
    assert_ne!(key, q.of_identity("bayes", "2", "aaaa"));
    assert_ne!(key, q.of_model("private", "2"), "the legacy key is another key");
    assert_eq!(key, QueryDigest::of(&[1.0, 2.0]).of_identity("private", "2", "aaaa"), "a function of them");
}

const REFUSE: CacheSettings = CacheSettings { capacity: 2, on_evicted: OnEvicted::Refuse };

#[test]
fn the_key_is_the_values_not_their_encoding() {
    let a = QueryDigest::of(&[0.0, 1.0, 16.0]);
    assert_eq!(a, QueryDigest::of(&[-0.0, 1.0, 16.0]), "−0.0 is 0.0");
    assert_eq!(a, QueryDigest::of(&[f64::from(0.0f32), f64::from(1.0f32), f64::from(16.0f32)]), "FP32 = FP64");
    assert_ne!(a, QueryDigest::of(&[0.0, 1.0, 16.000001]));
    assert_ne!(a, QueryDigest::of(&[0.0, 1.0]), "length is part of the key");
    assert_ne!(QueryDigest::of(&[]), QueryDigest::of(&[0.0]));
}

#[test]
fn the_oldest_entry_is_evicted_and_then_remembered_or_forgotten() {
    let (a, b, c) = (key(1.0), key(2.0), key(3.0));
    for on_evicted in [OnEvicted::Refuse, OnEvicted::Charge] {
        let settings = CacheSettings { capacity: 2, on_evicted };
        let mut cache = AnswerCache::default();
        cache.insert(a, answer(1), settings);
        cache.insert(b, answer(2), settings);
        assert_eq!(cache.lookup(&a), Lookup::Hit(&answer(1)));
        cache.insert(c, answer(3), settings);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.lookup(&b), Lookup::Hit(&answer(2)));
        assert_eq!(cache.lookup(&c), Lookup::Hit(&answer(3)));
        let want = if on_evicted == OnEvicted::Refuse { Lookup::Evicted } else { Lookup::Miss };
        assert_eq!(cache.lookup(&a), want, "{on_evicted:?}");
    }
}

#[test]
fn an_off_cache_keeps_nothing() {
    let mut cache = AnswerCache::default();
    cache.insert(key(1.0), answer(1), CacheSettings::OFF);
    assert!(cache.is_empty());
    assert_eq!(cache.lookup(&key(1.0)), Lookup::Miss);
}

/// A format-2 inline cache comes back as it was, with every entry and
/// eviction pending as a write; values outside their domain are refused.
#[test]
fn inline_caches_with_values_outside_their_domain_are_refused() {
    let entry = |x: f64, label: u32| CachedAnswerRecord {
        digest: QueryDigest::of(&[x]).0.to_vec(),
        label,
        evidence: Some(EvidenceRecord { min_t: 1.5, k: 3 }),
        ..Default::default()
    };
    let evicted = EvictedRecord { owner: 0, prefix: QueryDigest::of(&[1.0]).prefix() };
    let good = AnswerCacheRecord { entries: vec![entry(2.0, 5), entry(3.0, 6)], evicted: vec![evicted] };
    let mut cache = AnswerCache::migrated(&good).expect("valid");
    assert_eq!(cache.lookup(&key(1.0)), Lookup::Evicted);
    assert_eq!(cache.lookup(&key(3.0)), Lookup::Hit(&answer(6)));
    let mut rows = Rows::default();
    rows.write(&mut cache);
    let numbers: Vec<(u64, u64)> = rows.answers.keys().copied().collect();
    assert_eq!(numbers, [(0, 1), (0, 2)], "numbered in their order, after the one eviction");
    assert_eq!(rows.read(&cache.owners()), Some(cache));
    let mut short = good.clone();
    short.entries[0].digest.pop();
    assert_eq!(AnswerCache::migrated(&short), None, "a digest of 31 bytes");
    let mut bad_evidence = good.clone();
    bad_evidence.entries[0].evidence = Some(EvidenceRecord { min_t: f64::NAN, k: 3 });
    assert_eq!(AnswerCache::migrated(&bad_evidence), None, "NaN evidence");
    let mut unsorted = good;
    unsorted.evicted.push(EvictedRecord { owner: 0, prefix: 0 });
    assert_eq!(AnswerCache::migrated(&unsorted), None, "unsorted evictions");
}

/// A step writes the answer it added and the one it evicted, whatever the
/// history: the writes of the n-th insert do not grow with n.
#[test]
fn a_step_writes_one_answer_in_and_one_out() {
    let mut cache = AnswerCache::default();
    let mut rows = Rows::default();
    for n in 0..1000 {
        cache.insert(key(f64::from(n)), answer(1), REFUSE);
        let writes = cache.take_writes();
        let expected = if n < 2 { 1 } else { 2 };
        assert_eq!(writes.len(), expected, "insert {n}: {writes:?}");
        cache.contents().writes = writes;
        rows.write(&mut cache);
    }
    assert_eq!((rows.answers.len(), rows.evicted.len()), (2, 998));
    assert_eq!(cache.owners(), [CacheOwnerRecord { owner: 0, oldest: 998, next: 1000 }]);
    assert_eq!(rows.read(&cache.owners()), Some(cache));
}

/// Rows outside their owner's span, or whose owner has none, are corrupt.
#[test]
fn rows_outside_the_spans_are_refused() {
    let mut cache = AnswerCache::default();
    let mut rows = Rows::default();
    cache.insert(key(1.0), answer(1), REFUSE);
    rows.write(&mut cache);
    assert!(rows.read(&cache.owners()).is_some());
    assert_eq!(rows.read(&[]), None, "no span for the owner");
    assert_eq!(rows.read(&[CacheOwnerRecord { owner: 0, oldest: 1, next: 2 }]), None, "before the span");
}

/// A cache read for some queries answers those and refuses any other.
#[test]
fn a_probed_cache_refuses_what_it_was_not_read_for() {
    let mut cache = AnswerCache::default();
    let mut rows = Rows::default();
    for x in [1.0, 2.0, 3.0] {
        cache.insert(key(x), answer(x as usize), REFUSE);
    }
    rows.write(&mut cache);
    let owners = cache.owners();
    let probes = [CacheProbe::from(&key(1.0)), CacheProbe::from(&key(3.0)), CacheProbe::from(&key(9.0))];
    let found = CacheRows {
        entries: rows.answers.values().filter(|a| a.digest == key(3.0).digest.0).cloned().collect(),
        evicted: vec![(0, key(1.0).digest.prefix())],
        probed: Some(probes.to_vec()),
    };
    let mut probed = AnswerCache::from_rows(&owners, found).expect("valid");
    assert_eq!(probed.lookup(&key(1.0)), Lookup::Evicted);
    assert_eq!(probed.lookup(&key(3.0)), Lookup::Hit(&answer(3)));
    assert_eq!(probed.lookup(&key(9.0)), Lookup::Miss);
    assert_eq!(probed.lookup(&key(2.0)), Lookup::Evicted, "held in the store but not read: refused");
    // It evicts what it does not hold by number; the store resolves it.
    probed.insert(key(9.0), answer(9), REFUSE);
    cache.insert(key(9.0), answer(9), REFUSE);
    assert_eq!(probed.take_writes(), cache.take_writes());
}

/// A multi-row request's changes are taken back exactly on a refusal.
#[test]
fn a_rollback_restores_the_cache_as_it_was() {
    let mut cache = AnswerCache::default();
    for x in 0..5 {
        cache.insert(key(f64::from(x)), answer(1), REFUSE);
    }
    let before = cache.clone();
    let at = cache.checkpoint();
    for x in 5..9 {
        cache.insert(key(f64::from(x)), answer(2), REFUSE);
    }
    assert_eq!(cache.lookup(&key(5.0)), Lookup::Evicted);
    cache.rollback(at);
    assert_eq!(cache, before);
    assert_eq!(cache.lookup(&key(4.0)), Lookup::Hit(&answer(1)));
}

/// One principal's queries never evict, or make refused, another's entry:
/// each owner has its own `capacity` and its own memory of evictions.
#[test]
fn owners_have_their_own_partitions() {
    let (alice, bob) = (Owner::of("alice"), Owner::of("bob"));
    assert_ne!(alice, bob);
    assert_ne!(alice, Owner::SOLE);
    let of =
        |owner: Owner, x: f64| CacheKey { digest: QueryDigest::of(&[x]).of_principal(&format!("{owner:?}")), owner };
    let mut cache = AnswerCache::default();
    cache.insert(of(bob, 1.0), answer(1), REFUSE);
    cache.insert(of(bob, 2.0), answer(2), REFUSE);
    for x in 0..50 {
        cache.insert(of(alice, 100.0 + f64::from(x)), answer(9), REFUSE);
    }
    assert_eq!(cache.lookup(&of(bob, 1.0)), Lookup::Hit(&answer(1)));
    assert_eq!(cache.lookup(&of(bob, 2.0)), Lookup::Hit(&answer(2)));
    assert_eq!(cache.lookup(&of(alice, 100.0)), Lookup::Evicted);
    assert_eq!(cache.len(), 4);
    // An evicted prefix of alice's is no refusal for bob.
    let alice_evicted = of(alice, 100.0);
    assert_eq!(cache.lookup(&CacheKey { digest: alice_evicted.digest, owner: bob }), Lookup::Miss);
}

fn fixture(name: &str) -> SessionRecord {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/store-format-1").join(name);
    SessionRecord::decode(&std::fs::read(path).expect("fixture present")).expect("decodes")
}

/// The caches a format-1 release kept (`tests/fixtures/store-format-1/`)
/// come back as the caches it had: same answers, same evictions, same
/// owners.
#[test]
fn format_1_caches_come_back_as_they_were() {
    let alice = AnswerCache::migrated(fixture("session-alice.bin").cache.as_ref().expect("kept")).expect("valid");
    let ev = Evidence::restore(1.75, 3).ok();
    assert_eq!(alice.lookup(&key(1.0)), Lookup::Evicted);
    assert_eq!(
        alice.lookup(&key(2.0)),
        Lookup::Hit(&Cached { label: 2, unanimous: true, evidence: None, published: None })
    );
    let third = Cached { label: 0, unanimous: false, evidence: ev, published: Some(vec![0.25, -1.5, 3.0]) };
    assert_eq!(alice.lookup(&key(3.0)), Lookup::Hit(&third));
    let global = AnswerCache::migrated(fixture("session-global.bin").cache.as_ref().expect("kept")).expect("valid");
    for (i, who) in ["alice", "bob"].into_iter().enumerate() {
        let key = CacheKey { digest: QueryDigest::of(&[i as f64]).of_principal(who), owner: Owner::of(who) };
        let Lookup::Hit(c) = global.lookup(&key) else { panic!("{who}'s entry lost") };
        assert_eq!((c.label, c.unanimous, c.evidence), (i, i == 1, ev));
    }
}

/// The unmarked cache layout (before partitioning) kept evidence computed
/// from the unrounded release: it comes back rounded down to 2⁻¹⁰, its
/// entries and evictions belong to the sole owner.
#[test]
fn the_unmarked_cache_layout_is_read_with_its_evidence_rounded_down() {
    let digest = QueryDigest::of(&[5.0]);
    let mut old = Vec::new();
    for x in [7u64, 0.25f64.to_bits(), 1.0f64.to_bits(), 7, 6] {
        old.extend_from_slice(&x.to_le_bytes());
    }
    old.extend_from_slice(&1u32.to_le_bytes());
    old.extend_from_slice(&(-0.5f64).to_le_bytes());
    old.extend_from_slice(&1u32.to_le_bytes());
    old.extend_from_slice(digest.as_bytes());
    old.extend_from_slice(&3u32.to_le_bytes());
    old.push(0b110);
    old.extend_from_slice(&1.234_567_890_123f64.to_le_bytes());
    old.extend_from_slice(&4u32.to_le_bytes());
    old.extend_from_slice(&2u32.to_le_bytes());
    old.extend_from_slice(&0.25f64.to_le_bytes());
    old.extend_from_slice(&0.75f64.to_le_bytes());
    old.extend_from_slice(&1u32.to_le_bytes());
    old.extend_from_slice(&42u64.to_le_bytes());
    let record = SessionRecord::decode(&old).expect("format 1 decodes");
    assert_eq!((record.version, record.spent, record.posterior.clone()), (7, 0.25, Form::Log(vec![-0.5])));
    let cache = AnswerCache::migrated(record.cache.as_ref().expect("cache kept")).expect("valid cache");
    let Lookup::Hit(c) = cache.lookup(&digest.into()) else { panic!("entry lost") };
    assert_eq!((c.label, c.unanimous, c.published.clone()), (3, false, Some(vec![0.25, 0.75])));
    assert_eq!(c.evidence, Evidence::restore(1264.0 / 1024.0, 4).ok());
    old.pop();
    assert_eq!(SessionRecord::decode(&old), None, "a truncated record is corrupt, not misread");
}

proptest! {
    #[test]
    fn the_record_form_round_trips(
        queries in proptest::collection::vec((0u8..40, 0usize..10, any::<bool>(), proptest::option::of(proptest::collection::vec(-1e6f64..1e6, 0..12))), 0..30),
        capacity in 1usize..8,
        refuse in any::<bool>(),
    ) {
        let settings = CacheSettings { capacity, on_evicted: if refuse { OnEvicted::Refuse } else { OnEvicted::Charge } };
        let mut cache = AnswerCache::default();
        for (q, label, unanimous, published) in queries {
            let evidence = if unanimous { Some(Evidence::EXACT) } else { Evidence::restore(-0.5 * label as f64, 4).ok() };
            let owner = if q % 3 == 0 { Owner::SOLE } else { Owner::of(&format!("p{}", q % 3)) };
            let key = CacheKey { digest: QueryDigest::of(&[f64::from(q)]), owner };
            // As a session does: a query is answered afresh (and kept) only
            // on a miss.
            if cache.lookup(&key) == Lookup::Miss {
                cache.insert(key, Cached { label, unanimous, evidence, published }, settings);
            }
        }
        prop_assert!(cache.len() <= 3 * capacity);
        let mut rows = Rows::default();
        rows.write(&mut cache);
        prop_assert_eq!(rows.answers.len(), cache.len());
        prop_assert_eq!(rows.read(&cache.owners()), Some(cache));
    }
}
