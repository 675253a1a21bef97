//! The log (issue 70 §1): what a crash leaves in it is folded at the next
//! open, exactly once and never over newer records.

use super::log::{self, Log};
use super::{EmbeddedStore, Write, log_state};
use crate::answers::CacheWrite;
use crate::change::Change;
use crate::error::StoreError;
use crate::record::{CachedAnswerRecord, JournalEntry, SessionRecord};
use std::path::{Path, PathBuf};

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// The crate tests' record at `version`, with `cached` answers of owner 0.
fn record(version: u64, cached: u64) -> SessionRecord {
    let owner = crate::record::CacheOwnerRecord { owner: 0, oldest: 0, next: cached };
    SessionRecord { cache_owners: if cached > 0 { vec![owner] } else { Vec::new() }, ..crate::test::record(version) }
}

/// Step `version` of `session`: journaled, caching answer number
/// `version − 1` of owner 0.
fn step(session: &str, version: u64) -> Write {
    let answer =
        CachedAnswerRecord { digest: vec![version as u8; 32], owner: 0, seq: version - 1, ..Default::default() };
    let entry = JournalEntry { version, query_id: format!("q{version}"), charge: 0.1, ..Default::default() };
    let change =
        Change { steps: 1, journal: vec![entry], cache: vec![CacheWrite::Insert(answer)], ..Change::default() };
    Write { session: session.into(), record: record(version, version), change, seq: 0, done: None }
}

/// An empty store file at `path` (opened once and closed).
fn created(path: &Path) -> Result<(), StoreError> {
    drop(EmbeddedStore::open(path)?);
    Ok(())
}

/// A temporary directory holding an empty store file, and its path.
fn new_store_file() -> Result<(tempfile::TempDir, PathBuf), StoreError> {
    let dir = tempfile::tempdir().map_err(backend)?;
    let path = dir.path().join("state.redb");
    created(&path)?;
    Ok((dir, path))
}

/// The store file's highest-numbered segment.
fn last_segment(path: &Path) -> Result<(u64, PathBuf), StoreError> {
    log::segments(path)?.pop().ok_or_else(|| backend("no segment"))
}

/// The file's identity and the last segment it has folded.
fn log_state_of(path: &Path) -> Result<(u64, u64), StoreError> {
    log_state(&redb::Database::open(path).map_err(backend)?)
}

/// The log of the closed store file at `path`, its next segment after
/// the last folded (what a server appends to after a start).
fn log_after_folded(path: &Path) -> Result<Log, StoreError> {
    let (id, folded) = log_state_of(path)?;
    Ok(Log::new(path, id, folded))
}

/// (version, journaled versions, cached answers' numbers) of a session.
type Seen = (Option<u64>, Vec<u64>, Vec<u64>);

/// What `store` holds of `session`.
fn state(store: &EmbeddedStore, session: &str) -> Result<Seen, StoreError> {
    let version = store.load(session)?.map(|r| r.version);
    let journal = store.journal(session)?.iter().map(|j| j.version).collect();
    let cached = store.load_cache(session)?.entries.iter().map(|a| a.seq).collect();
    Ok((version, journal, cached))
}

#[test]
fn records_only_in_the_log_are_folded_at_the_next_open() -> Result<(), StoreError> {
    let (_dir, path) = new_store_file()?;
    // What a crash after three durable commits and before any fold leaves.
    let mut log = log_after_folded(&path)?;
    log.append(&[step("alice", 1)])?;
    log.append(&[step("alice", 2), step("bob", 1)])?;
    log.append(&[step("alice", 3)])?;
    drop(log);
    assert_eq!(log::segments(&path)?.len(), 1);

    let store = EmbeddedStore::open(&path)?;
    assert_eq!(state(&store, "alice")?, (Some(3), vec![1, 2, 3], vec![0, 1, 2]));
    assert_eq!(state(&store, "bob")?, (Some(1), vec![1], vec![0]));
    assert!(log::segments(&path)?.is_empty(), "folded segments are removed");
    Ok(())
}

#[test]
fn a_frame_cut_short_or_corrupt_ends_what_is_folded() -> Result<(), StoreError> {
    let (_dir, path) = new_store_file()?;
    let mut log = log_after_folded(&path)?;
    log.append(&[step("alice", 1)])?;
    log.append(&[step("alice", 2)])?;
    drop(log);
    // The last frame's write was cut short by a crash: never reported.
    let (_, segment) = last_segment(&path)?;
    let len = std::fs::metadata(&segment).map_err(backend)?.len();
    std::fs::OpenOptions::new().write(true).open(&segment).and_then(|f| f.set_len(len - 3)).map_err(backend)?;
    let store = EmbeddedStore::open(&path)?;
    assert_eq!(state(&store, "alice")?, (Some(1), vec![1], vec![0]));
    drop(store);

    // A frame whose bytes changed fails its checksum, and so does
    // everything after it, whole frames included.
    let mut log = log_after_folded(&path)?;
    log.append(&[step("bob", 1)])?;
    log.append(&[step("bob", 2)])?;
    log.append(&[step("bob", 3)])?;
    drop(log);
    let (_, segment) = last_segment(&path)?;
    let mut bytes = std::fs::read(&segment).map_err(backend)?;
    // The first frame: after the 24-byte header (mark, file identity), its
    // length, checksum, payload.
    let first = u32::from_le_bytes([bytes[24], bytes[25], bytes[26], bytes[27]]) as usize;
    bytes[24 + 8 + first + 8 + 5] ^= 1;
    std::fs::write(&segment, &bytes).map_err(backend)?;
    let store = EmbeddedStore::open(&path)?;
    assert_eq!(state(&store, "bob")?, (Some(1), vec![1], vec![0]));
    Ok(())
}

#[test]
fn a_segment_the_file_has_folded_is_never_folded_again() -> Result<(), StoreError> {
    let dir = tempfile::tempdir().map_err(backend)?;
    let path = dir.path().join("state.redb");
    {
        let store = EmbeddedStore::open(&path)?;
        for v in 1..=3 {
            let w = step("alice", v);
            store.enqueue("alice", w.record, w.change)?.wait()?;
        }
    }
    let (id, through) = log_state_of(&path)?;
    assert!(through >= 1, "the stop folded the log");
    // A segment that outlived its fold (a crash between the fold's commit
    // and the segment's removal), holding the session's first step and a
    // session the file does not have.
    let mut stale = Log::new(&path, id, through - 1);
    stale.append(&[step("alice", 1), step("bob", 1)])?;
    drop(stale);
    let store = EmbeddedStore::open(&path)?;
    assert_eq!(state(&store, "alice")?, (Some(3), vec![1, 2, 3], vec![0, 1, 2]), "not taken back to step 1");
    assert_eq!(state(&store, "bob")?, (None, vec![], vec![]), "not folded again");
    assert!(log::segments(&path)?.is_empty());
    Ok(())
}

#[test]
fn a_spare_segment_is_written_over_and_its_old_frames_are_never_read() -> Result<(), StoreError> {
    let (_dir, path) = new_store_file()?;
    let (id, folded) = log_state_of(&path)?;
    let mut log = Log::new(&path, id, folded);
    for v in 1..=3 {
        log.append(&[step("alice", v)])?;
    }
    let used = log.rotate();
    drop(log);
    let full = std::fs::metadata(log::segments(&path)?[0].1.clone()).map_err(backend)?.len();
    // Folded: the segment becomes the spare.
    log::retire_through(&path, used);
    assert!(log::segments(&path)?.is_empty());
    // The next segment is the spare, written over with one frame exactly
    // as long as its first: its second frame follows whole, a valid frame
    // but for the segment's number.
    let mut log = Log::new(&path, id, used);
    log.append(&[step("carol", 1)])?;
    drop(log);
    let (number, segment) = last_segment(&path)?;
    assert_eq!(std::fs::metadata(&segment).map_err(backend)?.len(), full, "written over, not anew");
    let writes = log::read(id, number, &segment)?.ok_or_else(|| backend("its own segment"))?;
    assert_eq!(writes.iter().map(|w| (w.session.as_str(), w.record.version)).collect::<Vec<_>>(), [("carol", 1)]);
    Ok(())
}

#[test]
fn a_log_left_beside_a_new_store_file_is_not_folded_into_it() -> Result<(), StoreError> {
    let (_dir, path) = new_store_file()?;
    let mut log = log_after_folded(&path)?;
    log.append(&[step("alice", 1)])?;
    drop(log);
    // The operator deletes the file (every budget reset) and not its log.
    std::fs::remove_file(&path).map_err(backend)?;
    let store = EmbeddedStore::open(&path)?;
    assert_eq!(state(&store, "alice")?, (None, vec![], vec![]));
    assert!(log::segments(&path)?.is_empty(), "the other file's segment is retired");
    drop(store);
    // What the new file appends next is its own, and is folded.
    let mut log = log_after_folded(&path)?;
    log.append(&[step("bob", 1)])?;
    drop(log);
    let store = EmbeddedStore::open(&path)?;
    assert_eq!(state(&store, "bob")?, (Some(1), vec![1], vec![0]));
    Ok(())
}

#[test]
fn a_frame_written_again_after_a_failed_sync_applies_once() -> Result<(), StoreError> {
    let dir = tempfile::tempdir().map_err(backend)?;
    let (once, twice) = (dir.path().join("once.redb"), dir.path().join("twice.redb"));
    for path in [&once, &twice] {
        created(path)?;
        let mut log = log_after_folded(path)?;
        log.append(&[step("alice", 1)])?;
        if path == &twice {
            // Its sync failed: the frame may be on disk, the writer opens
            // a new segment and appends the same records there.
            let (id, _) = log_state_of(path)?;
            log = Log::new(path, id, log.rotate());
            log.append(&[step("alice", 1)])?;
        }
        log.append(&[step("alice", 2)])?;
    }
    assert_eq!(log::segments(&twice)?.len(), 2);
    let (once, twice) = (EmbeddedStore::open(&once)?, EmbeddedStore::open(&twice)?);
    assert_eq!(state(&twice, "alice")?, (Some(2), vec![1, 2], vec![0, 1]));
    // The cache changes applied once: the record carries the same tail.
    assert_eq!(twice.stored_len("alice")?, once.stored_len("alice")?);
    Ok(())
}

#[test]
fn a_batch_larger_than_a_frame_is_appended_as_several_and_read_back_whole() -> Result<(), StoreError> {
    let (_dir, path) = new_store_file()?;
    let (id, folded) = log_state_of(&path)?;
    // Three 8 MiB journal entries: two frames.
    let big = |session: &str| {
        let mut w = step(session, 1);
        w.change.journal[0].log_likelihood = vec![0.5; 1 << 20];
        w
    };
    let mut log = Log::new(&path, id, folded);
    log.append(&[big("alice"), big("bob"), big("carol")])?;
    drop(log);
    let (number, segment) = last_segment(&path)?;
    let bytes = std::fs::read(&segment).map_err(backend)?;
    let first = u32::from_le_bytes([bytes[24], bytes[25], bytes[26], bytes[27]]) as usize;
    assert!(24 + 8 + first < bytes.len(), "a second frame follows the first");
    let writes = log::read(id, number, &segment)?.ok_or_else(|| backend("its own segment"))?;
    assert_eq!(writes.iter().map(|w| w.session.as_str()).collect::<Vec<_>>(), ["alice", "bob", "carol"]);
    assert!(writes.iter().all(|w| w.change.journal[0].log_likelihood.len() == 1 << 20));
    Ok(())
}

#[test]
fn a_reader_sees_every_durable_record_before_any_fold_is_due() -> Result<(), StoreError> {
    let dir = tempfile::tempdir().map_err(backend)?;
    let store = EmbeddedStore::open(&dir.path().join("state.redb"))?;
    for v in 1..=5 {
        let w = step("alice", v);
        store.enqueue("alice", w.record, w.change)?.wait()?;
        // Durable in the log; the reader asks for the fold it needs.
        assert_eq!(state(&store, "alice")?, (Some(v), (1..=v).collect(), (0..v).collect()));
    }
    assert_eq!(store.sessions()?, ["alice"]);
    Ok(())
}

/// The records per commit the writer reports.
#[derive(Default)]
struct Commits(std::sync::Mutex<Vec<usize>>);

impl crate::metrics::CommitObserver for Commits {
    fn commit(&self, _seconds: f64, records: usize) {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(records);
    }
}

/// Issue 70 §1: a writer that holds a record while an answer is on its
/// way waits for that answer's record and syncs the two in one frame.
#[test]
fn the_writer_syncs_a_record_on_its_way_with_the_one_it_holds() -> Result<(), StoreError> {
    use crate::arrivals::Arrivals;
    use std::sync::Arc;
    use std::time::Duration;
    let (_dir, path) = new_store_file()?;
    let commits = Arc::new(Commits::default());
    let arrivals = Arc::new(Arrivals::default());
    // Bounds of a minute: the second record comes well within them.
    let minute = Duration::from_secs(60);
    let gather = super::writer::Gather { quiet: minute, at_most: minute };
    let metrics = crate::metrics::StoreMetrics::new(Arc::clone(&commits) as Arc<dyn crate::metrics::CommitObserver>);
    let store =
        EmbeddedStore::open_gathering(&path, metrics, Arc::clone(&arrivals), super::DEFAULT_CACHE_BYTES, gather)?;
    let on_its_way = arrivals.arrive();
    let started = std::time::Instant::now();
    let first = store.enqueue("alice", record(1, 0), Change::default())?;
    // The writer takes alice's record and waits for the one on its way.
    while !arrivals.waiting() {
        if started.elapsed() > minute / 2 {
            return Err(backend("the writer holding a record did not wait for the one on its way"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let second = store.enqueue("bob", record(1, 0), Change { arriving: vec![on_its_way], ..Change::default() })?;
    first.wait()?;
    second.wait()?;
    let commits = commits.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    assert_eq!(commits, vec![2], "records per commit");
    assert_eq!(arrivals.coming(), 0);
    assert!(started.elapsed() < minute / 2, "woken by the record's arrival, not a bound");
    Ok(())
}
