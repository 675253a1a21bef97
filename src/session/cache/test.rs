use super::*;
use proptest::prelude::*;

fn answer(label: usize) -> Cached {
    Cached { label, unanimous: false, evidence: Evidence::restore(1.5, 3).ok(), published: None }
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
    let (a, b, c) = (QueryDigest::of(&[1.0]), QueryDigest::of(&[2.0]), QueryDigest::of(&[3.0]));
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
    cache.insert(QueryDigest::of(&[1.0]), answer(1), CacheSettings::OFF);
    assert!(cache.is_empty());
    assert_eq!(cache.lookup(&QueryDigest::of(&[1.0])), Lookup::Miss);
}

#[test]
fn malformed_bytes_are_refused() {
    let mut cache = AnswerCache::default();
    cache.insert(QueryDigest::of(&[1.0]), answer(4), REFUSE);
    let mut bytes = Vec::new();
    cache.encode(&mut bytes);
    for cut in 0..bytes.len() {
        assert!(AnswerCache::decode(&bytes[..cut]).is_none(), "truncated at {cut}");
    }
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
            cache.insert(QueryDigest::of(&[f64::from(q)]), Cached { label, unanimous, evidence, published }, settings);
        }
        prop_assert!(cache.len() <= capacity);
        let mut bytes = vec![7u8];
        cache.encode(&mut bytes);
        bytes.push(9);
        let (back, rest) = AnswerCache::decode(&bytes[1..]).expect("decodes");
        prop_assert_eq!(rest, &[9u8][..]);
        prop_assert_eq!(back, cache);
    }
}
