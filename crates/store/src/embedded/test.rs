//! The log (issue 70 §1): what a crash leaves in it is folded at the next
//! open, exactly once and never over newer records.

use super::log::{self, Log};
use super::{EmbeddedStore, Write, folded_through};
use crate::answers::CacheWrite;
use crate::change::Change;
use crate::error::StoreError;
use crate::record::{CachedAnswerRecord, JournalEntry, SessionRecord};
use pacpriv_privacy::posterior::Form;
use std::path::Path;

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

fn record(version: u64, cached: u64) -> SessionRecord {
    let owner = crate::record::CacheOwnerRecord { owner: 0, oldest: 0, next: cached };
    SessionRecord {
        version,
        posterior: Form::Log(vec![-0.5, -1.5, 0.0]),
        spent: 0.1 * version as f64,
        limit: 1.0,
        answered: version,
        charged: version,
        cache: None,
        journal_head: None,
        journal_events: 0,
        cache_owners: if cached > 0 { vec![owner] } else { Vec::new() },
        dataset: None,
    }
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

/// The last segment the file at `path` has folded.
fn folded(path: &Path) -> Result<u64, StoreError> {
    folded_through(&redb::Database::open(path).map_err(backend)?)
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
    let dir = tempfile::tempdir().map_err(backend)?;
    let path = dir.path().join("state.redb");
    created(&path)?;
    // What a crash after three durable commits and before any fold leaves.
    let mut log = Log::new(&path, folded(&path)?);
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
    let dir = tempfile::tempdir().map_err(backend)?;
    let path = dir.path().join("state.redb");
    created(&path)?;
    let mut log = Log::new(&path, folded(&path)?);
    log.append(&[step("alice", 1)])?;
    log.append(&[step("alice", 2)])?;
    drop(log);
    // The last frame's write was cut short by a crash: never reported.
    let (_, segment) = log::segments(&path)?.pop().ok_or_else(|| backend("no segment"))?;
    let len = std::fs::metadata(&segment).map_err(backend)?.len();
    std::fs::OpenOptions::new().write(true).open(&segment).and_then(|f| f.set_len(len - 3)).map_err(backend)?;
    let store = EmbeddedStore::open(&path)?;
    assert_eq!(state(&store, "alice")?, (Some(1), vec![1], vec![0]));
    drop(store);

    // A frame whose bytes changed fails its checksum, and so does
    // everything after it, whole frames included.
    let mut log = Log::new(&path, folded(&path)?);
    log.append(&[step("bob", 1)])?;
    log.append(&[step("bob", 2)])?;
    log.append(&[step("bob", 3)])?;
    drop(log);
    let (_, segment) = log::segments(&path)?.pop().ok_or_else(|| backend("no segment"))?;
    let mut bytes = std::fs::read(&segment).map_err(backend)?;
    // The first frame: a 16-byte mark, then its length, checksum, payload.
    let first = u32::from_le_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]) as usize;
    bytes[16 + 8 + first + 8 + 5] ^= 1;
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
    let through = folded(&path)?;
    assert!(through >= 1, "the stop folded the log");
    // A segment that outlived its fold (a crash between the fold's commit
    // and the segment's removal), holding the session's first step.
    let mut stale = Log::new(&path, through - 1);
    stale.append(&[step("alice", 1)])?;
    drop(stale);
    let store = EmbeddedStore::open(&path)?;
    assert_eq!(state(&store, "alice")?, (Some(3), vec![1, 2, 3], vec![0, 1, 2]), "not taken back to step 1");
    assert!(log::segments(&path)?.is_empty());
    Ok(())
}

#[test]
fn a_spare_segment_is_written_over_and_its_old_frames_are_never_read() -> Result<(), StoreError> {
    let dir = tempfile::tempdir().map_err(backend)?;
    let path = dir.path().join("state.redb");
    {
        let store = EmbeddedStore::open(&path)?;
        for v in 1..=3 {
            let w = step("alice", v);
            store.enqueue("alice", w.record, w.change)?.wait()?;
            // One frame each, all in one segment.
            assert_eq!(state(&store, "alice")?.0, Some(v));
        }
    }
    let spare = dir.path().join("state.redb.log-spare");
    let old = std::fs::read(&spare).map_err(backend)?;
    // The next segment is the spare, written over with one frame.
    let mut log = Log::new(&path, folded(&path)?);
    log.append(&[step("bob", 1)])?;
    drop(log);
    assert!(!spare.exists());
    let (number, segment) = log::segments(&path)?.pop().ok_or_else(|| backend("no segment"))?;
    assert_eq!(std::fs::metadata(&segment).map_err(backend)?.len(), old.len() as u64, "written over, not anew");
    let writes = log::read(number, &segment)?;
    assert_eq!(writes.iter().map(|w| (w.session.as_str(), w.record.version)).collect::<Vec<_>>(), [("bob", 1)]);
    Ok(())
}

#[test]
fn a_frame_written_again_after_a_failed_sync_applies_once() -> Result<(), StoreError> {
    let dir = tempfile::tempdir().map_err(backend)?;
    let (once, twice) = (dir.path().join("once.redb"), dir.path().join("twice.redb"));
    for path in [&once, &twice] {
        created(path)?;
        let mut log = Log::new(path, folded(path)?);
        log.append(&[step("alice", 1)])?;
        if path == &twice {
            // Its sync failed: the frame may be on disk, the writer opens
            // a new segment and appends the same records there.
            log = Log::new(path, log.rotate());
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
