//! The records' byte form. What a session makes of the answer cache a
//! record keeps is `crates/service/src/session/cache/test.rs`'s to check (this module
//! reads the schema, and imports nothing from `session`).

use super::*;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/store-format-1").join(name)
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name)).expect("fixture file present")
}

/// An entry's label, unanimity and evidence (min_t, k).
type Entry = (u32, bool, Option<(f64, u32)>);

/// The label, unanimity and evidence of each entry of a cache record.
fn entries(cache: &AnswerCacheRecord) -> Vec<Entry> {
    cache.entries.iter().map(|e| (e.label, e.unanimous, e.evidence.map(|v| (v.min_t, v.k)))).collect()
}

/// What `tests/fixtures/store-format-1/session-alice.bin` holds (see its
/// README): capacity 2 in refuse mode, three queries, the first evicted.
fn alice() -> SessionRecord {
    let old = SessionRecord::decode(&read("session-alice.bin")).expect("format-1 session record decodes");
    let cache = old.cache.clone().expect("alice's record keeps a cache");
    assert_eq!(entries(&cache), vec![(2, true, None), (0, false, Some((1.75, 3)))]);
    assert_eq!(cache.entries[1].published, Some(PublishedRecord { values: vec![0.25, -1.5, 3.0] }));
    assert!(cache.entries.iter().all(|e| e.digest.len() == 32 && e.owner == 0));
    assert_eq!(cache.evicted.len(), 1);
    SessionRecord {
        version: 3,
        posterior: Form::Log(vec![-0.5, -1e250, 0.0, f64::NEG_INFINITY]),
        spent: 3.0 * 2f64.powi(-20),
        limit: 2f64.powi(-10),
        answered: 3,
        charged: 2,
        cache: Some(cache),
        journal_head: None,
        journal_events: 0,
        cache_owners: Vec::new(),
        dataset: None,
    }
}

fn journal(v: u64) -> JournalEntry {
    JournalEntry {
        version: v,
        query_id: format!("q{v}"),
        charge: if v == 2 { 0.0 } else { 2f64.powi(-20) },
        log_likelihood: if v == 2 { vec![] } else { vec![-0.25, -3.0, 0.0, -1e-300] },
        ..Default::default()
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
            dataset_budgets: Default::default(),
        },
        PrincipalRecord {
            name: "bob".into(),
            key_sha256: [2; 32],
            budget: 0.5,
            origin: Origin::Admin,
            created_unix: 1_002,
            revoked_unix: Some(2_000),
            dataset_budgets: Default::default(),
        },
    ]
}

#[test]
fn records_round_trip_bit_exactly_in_the_current_format() {
    let r = alice();
    let bytes = r.encode();
    assert!(bytes.starts_with(&MARK));
    assert_eq!(SessionRecord::decode(&bytes), Some(r.clone()));
    let bare = SessionRecord { cache: None, ..r.clone() };
    assert_eq!(SessionRecord::decode(&bare.encode()), Some(bare));
    let chained = SessionRecord { journal_head: Some([7; 32]), ..r.clone() };
    assert_eq!(SessionRecord::decode(&chained.encode()), Some(chained));
    let datasets = SessionRecord { dataset: Some([9; 32]), ..r.clone() };
    assert_eq!(SessionRecord::decode(&datasets.encode()), Some(datasets));
    // A linear-form posterior comes back in linear form, bit for bit.
    let linear = SessionRecord { posterior: Form::Linear(vec![1.0, 0.0, 5e-324, 0.75]), ..r.clone() };
    let back = SessionRecord::decode(&linear.encode()).expect("decodes");
    assert!(back.posterior.same_bits(&linear.posterior));
    assert_eq!(back, linear);
    // Both forms, or neither: not a record any release wrote.
    let (log_weights, weights) = (vec![0.0], vec![1.0]);
    for (log_weights, weights) in [(log_weights, weights), (vec![], vec![])] {
        let both =
            schema::SessionRecord { format: SESSION_FORMAT, version: 1, log_weights, weights, ..Default::default() };
        assert_eq!(SessionRecord::decode(&seal(&both)), None);
    }
    let mut j = JournalEntry {
        version: 3,
        query_id: "q-ü".into(),
        charge: 2f64.powi(-32),
        log_likelihood: vec![-3.25, 1e-300],
        update_rule: 1,
        step: Some(JournalStepRecord {
            digest: vec![9; 32],
            per_query: 2f64.powi(-32),
            limit: 1.0,
            policy: "contested".into(),
            classes: 3,
            labels: vec![0, 2],
            published: vec![0.25, -0.5, 1.25],
            label: 2,
            ..Default::default()
        }),
        chain: Vec::new(),
    };
    j.chain = j.chained(&JournalEntry::genesis("alice")).to_vec();
    assert_eq!(JournalEntry::decode(&j.encode()), Some(j));
    for p in principals() {
        assert_eq!(decode_principal(&p.name, &encode_principal(&p)), Some(p));
    }
    let [alice, _] = principals();
    let budgets = [("census".to_owned(), 2f64.powi(-12)), ("other".to_owned(), 0.0)];
    let alice = PrincipalRecord { dataset_budgets: budgets.into_iter().collect(), ..alice };
    let bytes = encode_principal(&alice);
    assert_eq!(decode_principal("alice", &bytes), Some(alice.clone()));
    // In a format an earlier release refuses rather than drop the budgets.
    let written = <schema::PrincipalRecord as prost::Message>::decode(&bytes[MARK.len()..]).expect("marked protobuf");
    assert_eq!(written.format, PRINCIPAL_BUDGETS_FORMAT);
    let plain = <schema::PrincipalRecord as prost::Message>::decode(&encode_principal(&principals()[0])[MARK.len()..]);
    assert_eq!(plain.expect("marked protobuf").format, FORMAT, "a principal without them stays readable");
    assert_eq!((alice.budget_in("census"), alice.budget_in("default")), (2f64.powi(-12), 2f64.powi(-10)));
}

/// Format 1 (no mark, no schema) is read without loss: every value a
/// release wrote comes back, and written again in the current format it
/// reads the same.
#[test]
fn format_1_fixture_records_decode_without_loss() {
    let old = alice();
    assert_eq!(SessionRecord::decode(&read("session-alice.bin")), Some(old.clone()));
    assert_eq!(SessionRecord::decode(&old.encode()), Some(old));

    let global = SessionRecord::decode(&read("session-global.bin")).expect("format-1 global record decodes");
    assert_eq!((global.version, global.answered, global.charged), (2, 2, 1));
    let cache = global.cache.expect("cache kept");
    assert_eq!(entries(&cache), vec![(0, false, Some((1.75, 3))), (1, true, Some((1.75, 3)))]);
    assert!(cache.entries.iter().all(|e| e.owner != 0), "entries keep their owners");

    assert_eq!(JournalEntry::decode(&read("journal-alice-1.bin")), Some(journal(1)));
    assert_eq!(decode_principal("bob", &read("principal-bob.bin")), Some(principals()[1].clone()));
}

/// A format this release does not know, or malformed bytes behind the
/// mark, are refused — never guessed at.
#[test]
fn unknown_formats_and_malformed_bytes_are_refused() {
    let r = alice();
    let mut message = schema::SessionRecord::decode(&r.encode()[MARK.len()..]).expect("decodes");
    message.format = TAIL_FORMAT + 1;
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

#[test]
fn the_chain_hash_covers_every_field_and_the_session() {
    let a = JournalEntry::genesis("alice");
    assert_ne!(a, JournalEntry::genesis("bob"));
    let base = JournalEntry {
        step: Some(JournalStepRecord { labels: vec![1, 1, 0], published: vec![0.5, 0.5], ..Default::default() }),
        ..journal(1)
    };
    let h = base.chained(&a);
    // The stored hash is not part of what is hashed.
    assert_eq!(JournalEntry { chain: h.to_vec(), ..base.clone() }.chained(&a), h);
    assert_ne!(base.chained(&JournalEntry::genesis("bob")), h);
    let step = base.step.clone().unwrap_or_default();
    let changed = [
        JournalEntry { version: 2, ..base.clone() },
        JournalEntry { charge: 0.0, ..base.clone() },
        JournalEntry { log_likelihood: vec![-0.25, -3.0, 0.0, -2e-300], ..base.clone() },
        JournalEntry { step: Some(JournalStepRecord { label: 1, ..step.clone() }), ..base.clone() },
        JournalEntry { step: Some(JournalStepRecord { labels: vec![1, 0, 0], ..step.clone() }), ..base.clone() },
        JournalEntry { step: Some(JournalStepRecord { rank: 7, ..step.clone() }), ..base.clone() },
        JournalEntry { step: Some(JournalStepRecord { calibration: 1, ..step }), ..base.clone() },
    ];
    for c in changed {
        assert_ne!(c.chained(&a), h, "{c:?}");
    }
}

fn event(seq: u64, after_version: u64, kind: EventKind) -> JournalEvent {
    JournalEvent {
        seq,
        after_version,
        query_id: format!("e{seq}"),
        kind: kind.as_str().to_owned(),
        step: Some(JournalStepRecord { label: 3, published: vec![0.25], ..Default::default() }),
        spent: 1e-3,
        need: 0.0,
        ..Default::default()
    }
}

#[test]
fn events_round_trip_and_their_chain_covers_every_field() {
    let a = JournalEntry::genesis("alice");
    let base = event(1, 2, EventKind::CacheHit);
    let h = base.chained(&a);
    let sealed = JournalEvent { chain: h.to_vec(), ..base.clone() };
    let read = JournalEvent::decode_sealed(&sealed.encode_sealed()).expect("decodes");
    assert_eq!(read.chained(&a), h, "the stored hash is not part of what is hashed");
    assert_eq!((read.event_kind(), read.seq, read.chain), (Some(EventKind::CacheHit), 1, h.to_vec()));
    assert_eq!(JournalEvent::decode_sealed(b"not an event"), None);
    let step = base.step.clone().unwrap_or_default();
    let changed = [
        JournalEvent { seq: 2, ..base.clone() },
        JournalEvent { after_version: 3, ..base.clone() },
        JournalEvent { query_id: "other".into(), ..base.clone() },
        JournalEvent { kind: EventKind::Exhausted.as_str().into(), ..base.clone() },
        JournalEvent { spent: 2e-3, ..base.clone() },
        JournalEvent { need: 1e-9, ..base.clone() },
        JournalEvent { step: Some(JournalStepRecord { label: 4, ..step }), ..base.clone() },
    ];
    for c in changed {
        assert_ne!(c.chained(&a), h, "{c:?}");
    }
    assert_ne!(base.chained(&JournalEntry::genesis("bob")), h);
    for kind in EventKind::ALL {
        assert_eq!(EventKind::parse(kind.as_str()), Some(kind));
    }
    assert_eq!(EventKind::parse("refused"), None);
}

#[test]
fn chain_order_puts_each_event_after_the_step_it_followed() {
    let entries: Vec<JournalEntry> = (1..=3).map(journal).collect();
    let events = vec![
        event(1, 0, EventKind::Exhausted),
        event(2, 1, EventKind::CacheHit),
        event(3, 1, EventKind::CacheHit),
        event(4, 3, EventKind::EvictedRepeat),
    ];
    let order: Vec<String> = chain_order(entries, events)
        .into_iter()
        .map(|j| match j {
            Journaled::Entry(e) => format!("v{}", e.version),
            Journaled::Event(e) => format!("e{}", e.seq),
        })
        .collect();
    assert_eq!(order, ["e1", "v1", "e2", "e3", "v2", "v3", "e4"]);
}
