//! Crash test: `kill -9` the server at random points while clients are
//! mid-query, restart it on the same store, and check that durability held:
//! every answer a client received is in its session's journal and charged
//! in its ledger, each stored posterior equals replaying its journal, and
//! each session's answer cache rows are exactly what its durable steps
//! left (a step and its cache write are one transaction).
//!
//! CI runs a short version (5 rounds). The long campaign is opt-in:
//! `PACPRIV_CRASH_ROUNDS=100 cargo test --release --test it crash -- --nocapture`.

use crate::util::{Process, client, distinct, image, key_hash, predict, replay};
use pacpriv_privacy::Nats;
use pacpriv_privacy::ledger::{Ledger, Policy};
use pacpriv_store::answers::prefix;
use pacpriv_store::{EmbeddedStore, JournalEntry, SessionRecord};
use rand::RngExt;
use std::collections::HashMap;
use std::time::Duration;

const M: usize = 16;
const CLIENTS_PER_PRINCIPAL: usize = 3;
const PRINCIPALS: [&str; 2] = ["alice", "bob"];

#[tokio::test(flavor = "multi_thread")]
async fn no_received_answer_is_lost_across_kill_9() {
    let rounds: usize = std::env::var("PACPRIV_CRASH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(5);
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = dir.path().join("teachers.toml");
    let store_path = dir.path().join("state.redb");
    let _teachers = Process::teachers(M, 1, &cfg);
    let mut env = vec![
        ("PACPRIV__STORE__PATH", store_path.display().to_string()),
        ("PACPRIV__STORE__JOURNAL", "true".to_owned()),
        ("PACPRIV__PRIVACY__PER_QUERY_MI", "2^-8".to_owned()),
    ];
    for p in PRINCIPALS {
        env.push((leak(format!("PACPRIV__PRINCIPALS__{}__KEY_SHA256", p.to_uppercase())), key_hash(p)));
        env.push((leak(format!("PACPRIV__PRINCIPALS__{}__BUDGET_MI", p.to_uppercase())), "1000".to_owned()));
    }

    // (principal, query id) → charge, for every answer a client received.
    let mut received: HashMap<(String, String), f64> = HashMap::new();
    for round in 0..rounds {
        let mut server = Process::serve(Some(&cfg), &env);
        let c = client(&server.addr).await;
        let mut clients = tokio::task::JoinSet::new();
        for (p, k) in PRINCIPALS.iter().flat_map(|p| (0..CLIENTS_PER_PRINCIPAL).map(move |k| (*p, k))) {
            let mut c = c.clone();
            clients.spawn(async move {
                let mut got = Vec::new();
                for n in 0u32.. {
                    let id = format!("r{round}-{p}-{k}-{n}");
                    let pixels = (0..64).map(|j| ((n * 13 + j * 5 + k as u32) % 17) as f32).collect();
                    // Unique across rounds too: the store (and its answer cache) persists.
                    let pixels = distinct(pixels, (round as u32) << 24 | (k as u32) << 20 | n);
                    match predict(&mut c, p, image(&id, &pixels)).await {
                        Ok(r) => got.push(((p.to_owned(), id), r.mi_charged)),
                        Err(_) => break,
                    }
                }
                got
            });
        }
        let wait = rand::rng().random_range(30..400);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        server.kill();
        while let Some(got) = clients.join_next().await {
            received.extend(got.expect("client task"));
        }
    }

    let store = EmbeddedStore::open(&store_path).expect("store reopens after kill -9");
    let b = Nats::new(2f64.powi(-8)).expect("b");
    let mut steps = 0;
    for p in PRINCIPALS {
        let record = store.load(p).expect("readable").expect("the principal was answered");
        let journal = store.journal(p).expect("journal");
        let versions: Vec<u64> = journal.iter().map(|j| j.version).collect();
        assert_eq!(versions, (1..=record.version).collect::<Vec<_>>(), "{p}: journal has every step once");
        assert_eq!(record.answered, record.version);
        let charges: HashMap<&str, f64> = journal.iter().map(|j| (j.query_id.as_str(), j.charge)).collect();
        for ((who, id), charge) in received.iter().filter(|((who, _), _)| who == p) {
            assert_eq!(charges.get(id.as_str()), Some(charge), "{who}: received answer {id} is not in the store");
        }
        let mut ledger = Ledger::new(b, Nats::new(1000.0).expect("limit"), Policy::Paper).expect("ledger");
        for j in &journal {
            ledger.record(Nats::new(j.charge).expect("charge")).expect("fits");
        }
        assert_eq!(ledger.spent().get(), record.spent, "{p}: ledger equals the journal's charges");
        assert_eq!(replay(M, &journal), record.posterior, "{p}: posterior equals replaying the journal");
        cache_matches_journal(&store, p, &record, &journal);
        steps += journal.len();
    }
    assert!(!received.is_empty(), "clients got answers");
    println!(
        "crash test: {rounds} kill -9 rounds, {} received answers checked, {steps} durable steps replayed",
        received.len()
    );
}

/// Every step here answered a new query and kept it (default capacity 64,
/// `refuse`): the answer of step v is number v − 1, the newest 64 are
/// cached with the label the journal says was released, and every older
/// one is remembered as evicted — no more, no less, whatever instant the
/// kill came at.
fn cache_matches_journal(store: &EmbeddedStore, p: &str, record: &SessionRecord, journal: &[JournalEntry]) {
    const CAPACITY: u64 = 64;
    let oldest = record.version.saturating_sub(CAPACITY);
    let span: Vec<(u64, u64)> = record.cache_owners.iter().map(|o| (o.oldest, o.next)).collect();
    assert_eq!(span, [(oldest, record.version)], "{p}: the record's span covers its newest answers");
    let rows = store.load_cache(p).expect("cache rows");
    let mut cached: Vec<(u64, Vec<u8>, u32)> =
        rows.entries.iter().map(|a| (a.seq, a.digest.clone(), a.label)).collect();
    cached.sort();
    let step = |j: &JournalEntry| j.step.clone().expect("journaled in full");
    let expected: Vec<(u64, Vec<u8>, u32)> =
        journal[oldest as usize..].iter().map(|j| (j.version - 1, step(j).digest, step(j).label)).collect();
    assert_eq!(cached, expected, "{p}: the cached answers are the newest steps' releases");
    let mut evicted: Vec<(u64, u64)> = rows.evicted.clone();
    evicted.sort();
    let mut expected: Vec<(u64, u64)> =
        journal[..oldest as usize].iter().map(|j| (0, prefix(&step(j).digest))).collect();
    expected.sort();
    assert_eq!(evicted, expected, "{p}: every older answer is remembered as evicted");
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}
