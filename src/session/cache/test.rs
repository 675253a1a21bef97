use super::*;
use crate::store::SessionRecord;
use proptest::prelude::*;

fn answer(label: usize) -> Cached {
    Cached { label, unanimous: false, evidence: Evidence::restore(1.5, 3).ok(), published: None }
}

fn key(x: f64) -> CacheKey {
    QueryDigest::of(&[x]).into()
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

#[test]
fn records_with_values_outside_their_domain_are_refused() {
    let mut cache = AnswerCache::default();
    cache.insert(key(1.0), answer(4), REFUSE);
    cache.insert(key(2.0), answer(5), REFUSE);
    cache.insert(key(3.0), answer(6), REFUSE);
    let good = cache.to_record().expect("not empty");
    assert_eq!(AnswerCache::from_record(&good), Some(cache));
    let mut short = good.clone();
    short.entries[0].digest.pop();
    assert_eq!(AnswerCache::from_record(&short), None, "a digest of 31 bytes");
    let mut bad_evidence = good.clone();
    bad_evidence.entries[0].evidence = Some(EvidenceRecord { min_t: f64::NAN, k: 3 });
    assert_eq!(AnswerCache::from_record(&bad_evidence), None, "NaN evidence");
    let mut unsorted = good;
    unsorted.evicted.push(EvictedRecord { owner: 0, prefix: 0 });
    assert_eq!(AnswerCache::from_record(&unsorted), None, "unsorted evictions");
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
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-format-1").join(name);
    SessionRecord::decode(&std::fs::read(path).expect("fixture present")).expect("decodes")
}

/// The caches a format-1 release kept (`tests/fixtures/store-format-1/`)
/// come back as the caches it had: same answers, same evictions, same
/// owners.
#[test]
fn format_1_caches_come_back_as_they_were() {
    let alice = AnswerCache::from_record(fixture("session-alice.bin").cache.as_ref().expect("kept")).expect("valid");
    let ev = Evidence::restore(1.75, 3).ok();
    assert_eq!(alice.lookup(&key(1.0)), Lookup::Evicted);
    assert_eq!(
        alice.lookup(&key(2.0)),
        Lookup::Hit(&Cached { label: 2, unanimous: true, evidence: None, published: None })
    );
    let third = Cached { label: 0, unanimous: false, evidence: ev, published: Some(vec![0.25, -1.5, 3.0]) };
    assert_eq!(alice.lookup(&key(3.0)), Lookup::Hit(&third));
    let global = AnswerCache::from_record(fixture("session-global.bin").cache.as_ref().expect("kept")).expect("valid");
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
    assert_eq!((record.version, record.spent, record.log_weights.clone()), (7, 0.25, vec![-0.5]));
    let cache = AnswerCache::from_record(record.cache.as_ref().expect("cache kept")).expect("valid cache");
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
            cache.insert(key, Cached { label, unanimous, evidence, published }, settings);
        }
        prop_assert!(cache.len() <= 3 * capacity);
        let record = cache.to_record();
        prop_assert_eq!(record.is_none(), cache.is_empty());
        let back = record.as_ref().map_or(Some(AnswerCache::default()), AnswerCache::from_record);
        prop_assert_eq!(back, Some(cache));
    }
}
