use super::*;
use crate::privacy::confidence::Evidence;
use crate::session::cache::{AnswerCache, CacheKey, CacheSettings, Cached, Lookup, OnEvicted, Owner, QueryDigest};
use crate::store::{EmbeddedStore, Meta, StoreError};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/store-format-1").join(name)
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name)).expect("fixture file present")
}

fn ev(min_t: f64, k: usize) -> Option<Evidence> {
    Evidence::restore(min_t, k).ok()
}

/// What `tests/fixtures/store-format-1/session-alice.bin` holds (see its
/// README): capacity 2 in refuse mode, three queries, the first evicted.
fn alice() -> (SessionRecord, AnswerCache) {
    let settings = CacheSettings { capacity: 2, on_evicted: OnEvicted::Refuse };
    let mut cache = AnswerCache::default();
    let answers = [
        (1.0, Cached { label: 1, unanimous: false, evidence: ev(1.75, 3), published: None }),
        (2.0, Cached { label: 2, unanimous: true, evidence: None, published: None }),
        (3.0, Cached { label: 0, unanimous: false, evidence: ev(1.75, 3), published: Some(vec![0.25, -1.5, 3.0]) }),
    ];
    for (x, c) in answers {
        cache.insert(QueryDigest::of(&[x]).into(), c, settings);
    }
    let record = SessionRecord {
        version: 3,
        log_weights: vec![-0.5, -1e250, 0.0, f64::NEG_INFINITY],
        spent: 3.0 * 2f64.powi(-20),
        limit: 2f64.powi(-10),
        answered: 3,
        charged: 2,
        cache: cache.to_record(),
    };
    (record, cache)
}

fn journal(v: u64) -> JournalEntry {
    JournalEntry {
        version: v,
        query_id: format!("q{v}"),
        charge: if v == 2 { 0.0 } else { 2f64.powi(-20) },
        log_likelihood: if v == 2 { vec![] } else { vec![-0.25, -3.0, 0.0, -1e-300] },
    }
}

fn principals() -> [PrincipalRecord; 2] {
    [
        PrincipalRecord {
            name: "alice".into(),
            key_sha256: [1; 32],
            budget: 2f64.powi(-10),
            origin: Origin::Config,
            created_unix: 1_001,
            revoked_unix: None,
        },
        PrincipalRecord {
            name: "bob".into(),
            key_sha256: [2; 32],
            budget: 0.5,
            origin: Origin::Admin,
            created_unix: 1_002,
            revoked_unix: Some(2_000),
        },
    ]
}

#[test]
fn records_round_trip_bit_exactly_in_the_current_format() {
    let (r, _) = alice();
    let bytes = r.encode();
    assert!(bytes.starts_with(&MARK));
    assert_eq!(SessionRecord::decode(&bytes), Some(r.clone()));
    let bare = SessionRecord { cache: None, ..r };
    assert_eq!(SessionRecord::decode(&bare.encode()), Some(bare));
    let j = JournalEntry { version: 3, query_id: "q-ü".into(), charge: 2f64.powi(-32), log_likelihood: vec![-3.25, 1e-300] };
    assert_eq!(JournalEntry::decode(&j.encode()), Some(j));
    for p in principals() {
        assert_eq!(decode_principal(&p.name, &encode_principal(&p)), Some(p));
    }
}

/// Format 1 (no mark, no schema) is read without loss: every value a
/// release wrote comes back, and written again in the current format it
/// reads the same.
#[test]
fn format_1_fixture_records_decode_without_loss() {
    let (expected, cache) = alice();
    let old = SessionRecord::decode(&read("session-alice.bin")).expect("format-1 session record decodes");
    assert_eq!(old, expected);
    assert_eq!(AnswerCache::from_record(old.cache.as_ref().expect("cache kept")), Some(cache.clone()));
    assert_eq!(cache.lookup(&QueryDigest::of(&[1.0]).into()), Lookup::Evicted);
    assert_eq!(SessionRecord::decode(&old.encode()), Some(old));

    let global = SessionRecord::decode(&read("session-global.bin")).expect("format-1 global record decodes");
    let global_cache = AnswerCache::from_record(global.cache.as_ref().expect("cache kept")).expect("valid cache");
    for (i, who) in ["alice", "bob"].into_iter().enumerate() {
        let key = CacheKey { digest: QueryDigest::of(&[i as f64]).of_principal(who), owner: Owner::of(who) };
        let Lookup::Hit(c) = global_cache.lookup(&key) else { panic!("{who}'s entry lost") };
        assert_eq!((c.label, c.unanimous, c.evidence), (i, i == 1, ev(1.75, 3)));
    }

    assert_eq!(JournalEntry::decode(&read("journal-alice-1.bin")), Some(journal(1)));
    assert_eq!(decode_principal("bob", &read("principal-bob.bin")), Some(principals()[1].clone()));
}

/// The whole embedded store a format-1 release wrote opens and reads the
/// same; a step written over it is in the current format and reads back.
#[test]
fn a_format_1_embedded_store_opens_and_reads_the_same() -> Result<(), StoreError> {
    let dir = tempfile::tempdir().map_err(|e| StoreError::Backend(e.to_string()))?;
    let path = dir.path().join("state.redb");
    std::fs::copy(fixture("state.redb"), &path).map_err(|e| StoreError::Backend(e.to_string()))?;
    let store = EmbeddedStore::open(&path)?;
    assert_eq!(store.meta()?, Some(Meta { secret: 2, teachers: "fixture m=4".into() }));
    assert_eq!(store.principals()?, principals().to_vec());
    let (alice, _) = alice();
    assert_eq!(store.load("alice")?, Some(alice.clone()));
    assert_eq!(store.journal("alice")?, (1..=3).map(journal).collect::<Vec<_>>());
    assert!(store.load(crate::session::GLOBAL_SESSION)?.is_some());
    let next = SessionRecord { version: 4, ..alice };
    store.enqueue("alice", next.clone(), None)?.wait()?;
    assert_eq!(store.load("alice")?, Some(next));
    Ok(())
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
    assert_eq!(c.evidence, ev(1264.0 / 1024.0, 4));
    old.pop();
    assert_eq!(SessionRecord::decode(&old), None, "a truncated record is corrupt, not misread");
}

/// A format this release does not know, or malformed bytes behind the
/// mark, are refused — never guessed at.
#[test]
fn unknown_formats_and_malformed_bytes_are_refused() {
    let (r, _) = alice();
    let mut message = crate::proto::store::SessionRecord::decode(&r.encode()[MARK.len()..]).expect("decodes");
    message.format = FORMAT + 1;
    let mut future = MARK.to_vec();
    future.extend_from_slice(&message.encode_to_vec());
    assert_eq!(SessionRecord::decode(&future), None);
    let mut garbage = MARK.to_vec();
    garbage.extend_from_slice(&[0xFF; 5]);
    assert_eq!(SessionRecord::decode(&garbage), None);
    assert_eq!(JournalEntry::decode(&garbage), None);
    assert_eq!(decode_principal("x", &garbage), None);
    assert_eq!(SessionRecord::decode(&[]), None);
}
