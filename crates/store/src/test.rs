use super::*;
use pacpriv_privacy::posterior::Form;

/// A record at `version` (also the log's tests', `embedded::test`).
pub(crate) fn record(version: u64) -> SessionRecord {
    SessionRecord {
        version,
        posterior: Form::Log(vec![-0.5, -1e250, 0.0, -f64::MIN_POSITIVE]),
        spent: 0.1 * version as f64,
        limit: 1.0,
        answered: version,
        charged: version,
        cache: None,
        journal_head: None,
        journal_events: 0,
        cache_owners: Vec::new(),
        dataset: None,
    }
}

#[test]
fn meta_records_and_journal_survive_reopening() -> Result<(), StoreError> {
    let dir = tempfile::tempdir().map_err(|e| StoreError::Backend(e.to_string()))?;
    let path = dir.path().join("nested/state.redb");
    {
        let store = EmbeddedStore::open(&path)?;
        assert_eq!(store.meta(DEFAULT_DATASET)?, None);
        assert_eq!(store.load("alice")?, None);
        store.init_meta(DEFAULT_DATASET, &Meta { secret: 5, teachers: "demo m=8".into() })?;
        let tickets: Vec<Ticket> = (1..=20)
            .map(|v| {
                let j = JournalEntry {
                    version: v,
                    query_id: format!("q{v}"),
                    charge: 0.1,
                    log_likelihood: vec![],
                    ..Default::default()
                };
                store.enqueue("alice", record(v), Change { journal: vec![j], ..Default::default() })
            })
            .collect::<Result<_, _>>()?;
        for t in tickets {
            t.wait()?;
        }
        store.enqueue("bob", record(1), Change::default())?.wait()?;
    }
    let store = EmbeddedStore::open(&path)?;
    assert_eq!(store.meta(DEFAULT_DATASET)?, Some(Meta { secret: 5, teachers: "demo m=8".into() }));
    assert_eq!(store.load("alice")?, Some(record(20)));
    assert_eq!(store.load("bob")?, Some(record(1)));
    let journal = store.journal("alice")?;
    assert_eq!(journal.iter().map(|j| j.version).collect::<Vec<_>>(), (1..=20).collect::<Vec<_>>());
    assert!(store.journal("bob")?.is_empty());
    assert!(format!("{:?}", store.meta(DEFAULT_DATASET)?).contains("<redacted>"));
    Ok(())
}

fn principal(name: &str, key: u8, budget: f64, origin: Origin) -> PrincipalRecord {
    PrincipalRecord {
        name: name.into(),
        key_sha256: [key; 32],
        budget,
        origin,
        created_unix: 1_000 + i64::from(key),
        revoked_unix: None,
        dataset_budgets: Default::default(),
    }
}

/// One principal provisioned on its own (what `Store::provision` does).
fn provision(store: &EmbeddedStore, record: &PrincipalRecord) -> Result<PrincipalRecord, StoreError> {
    let mut stored = store.provision_all(std::slice::from_ref(record))?;
    stored.pop().ok_or_else(|| StoreError::Backend("provisioning one principal stored none".into()))
}

/// Two empty stores in one temp dir.
fn two_stores() -> Result<(tempfile::TempDir, EmbeddedStore, EmbeddedStore), StoreError> {
    let dir = tempfile::tempdir().map_err(|e| StoreError::Backend(e.to_string()))?;
    let (a, b) = (EmbeddedStore::open(&dir.path().join("a.redb"))?, EmbeddedStore::open(&dir.path().join("b.redb"))?);
    Ok((dir, a, b))
}

/// What went wrong, comparably (StoreError is not `PartialEq`).
fn outcome(r: Result<Vec<PrincipalRecord>, StoreError>) -> Result<Vec<PrincipalRecord>, String> {
    r.map_err(|e| format!("{e:?}"))
}

#[test]
fn bulk_provisioning_stores_what_one_by_one_provisioning_stores() -> Result<(), StoreError> {
    let (_dir, bulk, single) = two_stores()?;
    let earlier = [
        principal("alice", 1, 1.0, Origin::Config),
        principal("bob", 2, 1.0, Origin::Config),
        principal("carol", 3, 1.0, Origin::Admin),
    ];
    for store in [&bulk, &single] {
        for p in &earlier {
            provision(store, p)?;
        }
        store.revoke("bob", 5_000)?;
    }
    // A restart with another configuration: alice moves to a new key and
    // budget, bob takes alice's old key (freed earlier in the same batch),
    // dave is new, and a configured name listed twice ends with its last
    // key (as one-by-one provisioning would).
    let batch = [
        principal("alice", 9, 2.0, Origin::Config),
        principal("bob", 1, 3.0, Origin::Config),
        principal("dave", 4, 1.0, Origin::Config),
        principal("erin", 5, 1.0, Origin::Config),
        principal("erin", 6, 1.5, Origin::Config),
    ];
    let stored = bulk.provision_all(&batch)?;
    let one_by_one = batch.iter().map(|p| provision(&single, p)).collect::<Result<Vec<_>, _>>()?;
    assert_eq!(stored, one_by_one);
    assert_eq!(bulk.principals()?, single.principals()?);
    // Creation and revocation survive an update; key and budget change.
    let bob = bulk.principal("bob")?;
    assert_eq!(
        bob.map(|b| (b.key_sha256, b.budget, b.created_unix, b.revoked_unix)),
        Some(([1; 32], 3.0, 1_002, Some(5_000)))
    );
    // erin's first key (5) was freed by her second; alice's new key 9 is taken.
    provision(&bulk, &principal("frank", 5, 1.0, Origin::Admin))?;
    assert!(matches!(
        provision(&bulk, &principal("gina", 9, 1.0, Origin::Admin)),
        Err(StoreError::KeyInUse { name }) if name == "gina"
    ));
    Ok(())
}

#[test]
fn bulk_provisioning_fails_as_one_by_one_would_and_stores_nothing() -> Result<(), StoreError> {
    let cases: [(&str, Vec<PrincipalRecord>); 4] = [
        (
            "a key twice in one batch",
            vec![principal("x", 7, 1.0, Origin::Config), principal("y", 7, 1.0, Origin::Config)],
        ),
        (
            "the key of an admin-created principal",
            vec![principal("x", 8, 1.0, Origin::Config), principal("y", 3, 1.0, Origin::Config)],
        ),
        (
            "the name of an admin-created principal",
            vec![principal("x", 8, 1.0, Origin::Config), principal("carol", 9, 1.0, Origin::Config)],
        ),
        (
            "an admin record under a configured name",
            vec![principal("x", 8, 1.0, Origin::Config), principal("alice", 9, 1.0, Origin::Admin)],
        ),
    ];
    let expected = [
        StoreError::KeyInUse { name: "y".into() },
        StoreError::KeyInUse { name: "y".into() },
        StoreError::PrincipalExists { name: "carol".into(), origin: "admin" },
        StoreError::PrincipalExists { name: "alice".into(), origin: "config" },
    ];
    for ((what, batch), expected) in cases.into_iter().zip(expected) {
        let (_dir, bulk, single) = two_stores()?;
        for store in [&bulk, &single] {
            provision(store, &principal("alice", 1, 1.0, Origin::Config))?;
            provision(store, &principal("carol", 3, 1.0, Origin::Admin))?;
        }
        let before = bulk.principals()?;
        let bulk_error = outcome(bulk.provision_all(&batch));
        let single_error = outcome(batch.iter().map(|p| provision(&single, p)).collect());
        assert_eq!(bulk_error, Err(format!("{expected:?}")), "{what}");
        assert_eq!(bulk_error, single_error, "{what}");
        assert_eq!(bulk.principals()?, before, "{what}: all or nothing");
    }
    Ok(())
}

/// Issue 27: the embedded store keeps a session's newest cache changes in
/// its record and moves them to the answers table once they fill
/// `TAIL_BYTES`. Whatever the split, a read finds exactly what the writes
/// said — after every write, and after reopening — and the record stays
/// bounded. Two owners, `refuse` for owner 0 and `charge` for
/// owner 1, capacity 32, a format-2 eviction moved in first, steps with no cache
/// change, and writes that insert and evict the same answers.
#[test]
fn cache_changes_read_back_the_same_wherever_they_are_kept() -> Result<(), StoreError> {
    let dir = tempfile::tempdir().map_err(|e| StoreError::Backend(e.to_string()))?;
    let path = dir.path().join("state.redb");
    let store = EmbeddedStore::open(&path)?;
    let mut model = CacheModel::default();
    for step in 0..600 {
        let (rows, owner) = match step {
            300 => (40, 0),
            450 => (40, 1),
            _ if step % 7 == 3 => (0, 0),
            _ => (1, u64::from(step % 3 == 0)),
        };
        let (record, change) = model.step(rows, owner);
        store.enqueue("alice", record, change)?.wait()?;
        assert_eq!(CacheModel::read(&store)?, model.expected(), "after step {step}");
    }
    drop(store);
    let store = EmbeddedStore::open(&path)?;
    assert_eq!(CacheModel::read(&store)?, model.expected(), "after reopening");
    drop(store);
    // Most changes moved to the table; the record never grew past its tail.
    use redb::{ReadableDatabase as _, ReadableTableMetadata as _};
    let backend = |e: redb::Error| StoreError::Backend(e.to_string());
    let db = redb::Database::open(&path).map_err(|e| backend(e.into()))?;
    let txn = db.begin_read().map_err(|e| backend(e.into()))?;
    let rows = txn.open_table(embedded::ANSWERS).map_err(|e| backend(e.into()))?;
    assert!(rows.len().map_err(|e| backend(e.into()))? > 100, "the tail moved to the table");
    let sessions = txn.open_table(embedded::SESSIONS).map_err(|e| backend(e.into()))?;
    let bytes = sessions.get("alice").map_err(|e| backend(e.into()))?.map(|v| v.value().len());
    let plain = model.step(0, 0).0.encode().len();
    assert!(bytes.is_some_and(|b| b <= plain + embedded::TAIL_BYTES + 8), "{bytes:?} bytes");
    Ok(())
}

/// A session's cached answers and remembered evictions, sorted.
type CacheState = (Vec<record::CachedAnswerRecord>, Vec<(u64, u64)>);

/// What a session's cache writes should leave behind: each owner's FIFO
/// of capacity 32 and the prefixes remembered (owner 0 only).
#[derive(Default)]
struct CacheModel {
    version: u64,
    spans: [(u64, u64); 2],
    cached: std::collections::BTreeMap<(u64, u64), record::CachedAnswerRecord>,
    evicted: Vec<(u64, u64)>,
}

impl CacheModel {
    const CAPACITY: u64 = 32;

    /// The next step's record and cache writes: `rows` new answers of
    /// `owner` (the first step also moves in a format-2 eviction).
    fn step(&mut self, rows: usize, owner: u64) -> (SessionRecord, Change) {
        use sha2::{Digest, Sha256};
        let mut cache = Vec::new();
        if self.version == 0 {
            cache.push(CacheWrite::Remember { owner: 0, seq: 0, prefix: 77 });
            self.evicted.push((0, 77));
            self.spans[0] = (1, 1);
        }
        let o = owner as usize;
        for _ in 0..rows {
            let seq = self.spans[o].1;
            self.spans[o].1 += 1;
            let digest = Sha256::digest([owner.to_le_bytes(), seq.to_le_bytes()].concat()).to_vec();
            let answer = record::CachedAnswerRecord { digest, owner, seq, label: 3, ..Default::default() };
            self.cached.insert((owner, seq), answer.clone());
            cache.push(CacheWrite::Insert(answer));
            if self.spans[o].1 - self.spans[o].0 > Self::CAPACITY {
                let oldest = self.spans[o].0;
                self.spans[o].0 += 1;
                let gone = self.cached.remove(&(owner, oldest)).map(|a| answers::prefix(&a.digest));
                cache.push(CacheWrite::Evict { owner, seq: oldest, remember: owner == 0 });
                self.evicted.extend(gone.filter(|_| owner == 0).map(|p| (0, p)));
            }
        }
        self.version += 1;
        let cache_owners = (0..2)
            .map(|o| record::CacheOwnerRecord {
                owner: o,
                oldest: self.spans[o as usize].0,
                next: self.spans[o as usize].1,
            })
            .collect();
        (SessionRecord { cache_owners, ..record(self.version) }, Change { steps: 1, cache, ..Default::default() })
    }

    fn expected(&self) -> CacheState {
        let mut evicted = self.evicted.clone();
        evicted.sort_unstable();
        (self.cached.values().cloned().collect(), evicted)
    }

    fn read(store: &EmbeddedStore) -> Result<CacheState, StoreError> {
        let rows = store.load_cache("alice")?;
        let (mut entries, mut evicted) = (rows.entries, rows.evicted);
        entries.sort_by_key(|a| (a.owner, a.seq));
        evicted.sort_unstable();
        Ok((entries, evicted))
    }
}

/// Issue 53 §5: the configured principals are applied as one
/// transaction — provisioning and the revocation of configured
/// principals no longer named — and a conflict anywhere stores none of
/// it. Admin-created principals are never revoked by it.
#[test]
fn configuring_provisions_and_revokes_in_one_transaction() -> Result<(), StoreError> {
    let dir = tempfile::tempdir().map_err(|e| StoreError::Backend(e.to_string()))?;
    let store = EmbeddedStore::open(&dir.path().join("state.redb"))?;
    let (alice, bob, carol) = (
        principal("alice", 1, 1.0, Origin::Config),
        principal("bob", 2, 1.0, Origin::Config),
        principal("carol", 3, 1.0, Origin::Config),
    );
    provision(&store, &principal("admin-made", 9, 1.0, Origin::Admin))?;
    let first = store.configure(&[alice.clone(), bob.clone()], 5_000)?;
    assert_eq!((first.stored.len(), first.revoked.len()), (2, 0));

    // Bob dropped and carol added, but carol's key is the admin-made
    // principal's: nothing is applied — bob stays active, carol absent.
    let clash = PrincipalRecord { key_sha256: [9; 32], ..carol.clone() };
    assert!(matches!(store.configure(&[alice.clone(), clash], 6_000), Err(StoreError::KeyInUse { .. })));
    assert!(store.principal("bob")?.is_some_and(|b| b.active()));
    assert_eq!(store.principal("carol")?, None);

    let applied = store.configure(&[alice, carol], 7_000)?;
    assert_eq!(
        applied.revoked.iter().map(|r| (r.name.as_str(), r.revoked_unix)).collect::<Vec<_>>(),
        [("bob", Some(7_000))]
    );
    assert!(store.principal("bob")?.is_some_and(|b| !b.active()));
    assert!(store.principal("carol")?.is_some_and(|c| c.active()));
    assert!(store.principal("admin-made")?.is_some_and(|a| a.active()), "admin-made principals are not configured");
    Ok(())
}

/// `tests/fixtures/store-format-1/`'s file `name`.
fn format_1(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/store-format-1").join(name)
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(format_1(name)).expect("fixture file present")
}

/// The whole embedded store a format-1 release wrote opens and reads the
/// same as the loose records beside it (whose every field pacpriv-records'
/// tests pin); a step written over it is in the current format and reads
/// back.
#[test]
fn a_format_1_embedded_store_opens_and_reads_the_same() -> Result<(), StoreError> {
    let alice = SessionRecord::decode(&read("session-alice.bin")).expect("format-1 session record decodes");
    let first = JournalEntry::decode(&read("journal-alice-1.bin")).expect("format-1 journal entry decodes");
    let bob = record::decode_principal("bob", &read("principal-bob.bin")).expect("format-1 principal decodes");
    let dir = tempfile::tempdir().map_err(|e| StoreError::Backend(e.to_string()))?;
    let path = dir.path().join("state.redb");
    std::fs::copy(format_1("state.redb"), &path).map_err(|e| StoreError::Backend(e.to_string()))?;
    let store = EmbeddedStore::open(&path)?;
    assert_eq!(store.meta(DEFAULT_DATASET)?, Some(Meta { secret: 2, teachers: "fixture m=4".into() }));
    let principals = store.principals()?;
    assert_eq!(principals.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["alice", "bob"]);
    assert_eq!(principals[1], bob);
    assert_eq!(store.load("alice")?, Some(alice.clone()));
    let journal = store.journal("alice")?;
    assert_eq!(journal.iter().map(|e| e.version).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(journal[0], first);
    assert!(store.load("*global*")?.is_some(), "the global session");
    let next = SessionRecord { version: 4, ..alice };
    store.enqueue("alice", next.clone(), Change::default())?.wait()?;
    assert_eq!(store.load("alice")?, Some(next));
    Ok(())
}
