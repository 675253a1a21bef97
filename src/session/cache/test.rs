use super::*;
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
fn malformed_bytes_are_refused() {
    let mut cache = AnswerCache::default();
    cache.insert(key(1.0), answer(4), REFUSE);
    let mut bytes = Vec::new();
    cache.encode(&mut bytes);
    for cut in 0..bytes.len() {
        assert!(AnswerCache::decode(&bytes[..cut]).is_none(), "truncated at {cut}");
    }
    assert_eq!(AnswerCache::decode(&bytes), Some((cache, &[][..])));
}

/// One principal's queries never evict, or make refused, another's entry:
/// each owner has its own `capacity` and its own memory of evictions.
#[test]
fn owners_have_their_own_partitions() {
    let (alice, bob) = (Owner::of("alice"), Owner::of("bob"));
    assert_ne!(alice, bob);
    assert_ne!(alice, Owner::SOLE);
    let of = |owner: Owner, x: f64| CacheKey { digest: QueryDigest::of(&[x]).of_principal(&format!("{owner:?}")), owner };
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

/// A record written by the first, unmarked format still decodes: its
/// entries belong to the sole owner, and the evidence it kept (computed from
/// the unrounded release) comes back rounded down to a multiple of 2⁻¹⁰.
#[test]
fn the_first_format_still_decodes() {
    let digest = QueryDigest::of(&[5.0]);
    let mut old = Vec::new();
    old.extend_from_slice(&1u32.to_le_bytes());
    old.extend_from_slice(&digest.0);
    old.extend_from_slice(&3u32.to_le_bytes());
    old.push(0b110);
    old.extend_from_slice(&1.234_567_890_123f64.to_le_bytes());
    old.extend_from_slice(&4u32.to_le_bytes());
    crate::store::put_floats(&mut old, &[0.25, 0.75]);
    old.extend_from_slice(&1u32.to_le_bytes());
    old.extend_from_slice(&42u64.to_le_bytes());
    old.push(0xAB);
    let (cache, rest) = AnswerCache::decode(&old).expect("the first format decodes");
    assert_eq!(rest, &[0xAB]);
    let Lookup::Hit(c) = cache.lookup(&digest.into()) else { panic!("entry lost") };
    assert_eq!((c.label, c.unanimous, c.published.clone()), (3, false, Some(vec![0.25, 0.75])));
    let e = c.evidence.expect("evidence kept");
    assert_eq!((e.min_t(), e.k()), (1264.0 / 1024.0, 4));
    assert_eq!(cache.evicted, vec![(Owner::SOLE, 42)]);
    // Written back in the current format, it reads the same.
    let mut bytes = Vec::new();
    cache.encode(&mut bytes);
    assert_eq!(AnswerCache::decode(&bytes), Some((cache, &[][..])));
}

proptest! {
    #[test]
    fn encoding_round_trips(
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
        let mut bytes = vec![7u8];
        cache.encode(&mut bytes);
        bytes.push(9);
        let (back, rest) = AnswerCache::decode(&bytes[1..]).expect("decodes");
        prop_assert_eq!(rest, &[9u8][..]);
        prop_assert_eq!(back, cache);
    }
}
