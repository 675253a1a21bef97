use super::*;

fn record(version: u64) -> SessionRecord {
    SessionRecord {
        version,
        log_weights: vec![-0.5, -1e250, 0.0, -f64::MIN_POSITIVE],
        spent: 0.1 * version as f64,
        limit: 1.0,
        answered: version,
        charged: version,
    }
}

#[test]
fn records_and_journal_entries_round_trip_bit_exactly() {
    let r = record(7);
    assert_eq!(SessionRecord::decode(&r.encode()), Some(r.clone()));
    let mut truncated = r.encode();
    truncated.pop();
    assert_eq!(SessionRecord::decode(&truncated), None);
    let j = JournalEntry {
        version: 3,
        query_id: "q-ü".into(),
        charge: 2f64.powi(-32),
        log_likelihood: vec![-3.25, 1e-300],
    };
    assert_eq!(JournalEntry::decode(&j.encode()), Some(j));
}

#[test]
fn meta_records_and_journal_survive_reopening() -> Result<(), StoreError> {
    let dir = tempfile::tempdir().map_err(|e| StoreError::Backend(e.to_string()))?;
    let path = dir.path().join("nested/state.redb");
    {
        let store = EmbeddedStore::open(&path)?;
        assert_eq!(store.meta()?, None);
        assert_eq!(store.load("alice")?, None);
        store.init_meta(&Meta { secret: 5, teachers: "demo m=8".into() })?;
        let tickets: Vec<Ticket> = (1..=20)
            .map(|v| {
                let j = JournalEntry { version: v, query_id: format!("q{v}"), charge: 0.1, log_likelihood: vec![] };
                store.enqueue("alice", record(v), Some(j))
            })
            .collect::<Result<_, _>>()?;
        for t in tickets {
            t.wait()?;
        }
        store.enqueue("bob", record(1), None)?.wait()?;
    }
    let store = EmbeddedStore::open(&path)?;
    assert_eq!(store.meta()?, Some(Meta { secret: 5, teachers: "demo m=8".into() }));
    assert_eq!(store.load("alice")?, Some(record(20)));
    assert_eq!(store.load("bob")?, Some(record(1)));
    let journal = store.journal("alice")?;
    assert_eq!(journal.iter().map(|j| j.version).collect::<Vec<_>>(), (1..=20).collect::<Vec<_>>());
    assert!(store.journal("bob")?.is_empty());
    assert!(format!("{:?}", store.meta()?).contains("<redacted>"));
    Ok(())
}
