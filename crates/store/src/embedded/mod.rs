//! The embedded store: one redb file, no server to run. A single writer
//! thread commits everything that queued up while the previous commit was
//! syncing in one transaction — group commit: one fsync for many sessions.
//!
//! Early lock release falls out of the queue order: a session enqueues its
//! records under its own lock, so they reach the writer in version order,
//! and a batch commits atomically; when a record's ticket resolves, every
//! earlier record of that session is durable too.
//!
//! A failed commit (a full disk, a file-size limit, an I/O error) withholds
//! that batch's answers, and from then on no new step is taken
//! ([`EmbeddedStore::writable`], checked before a step draws): the sessions
//! in memory would otherwise go on charging while nothing reaches the
//! disk. The failed batch is kept and written again with the next commit,
//! which the writer retries by itself every [`RETRY_EVERY`] (after opening
//! the file again: redb refuses every operation after an I/O error), so no
//! record, journal entry or cached answer of it is lost and the journal has
//! no gap. The first commit that succeeds lets steps in again.
//!
//! Here: opening the file, the sessions, their journals and caches, and
//! the writer; the datasets' records and the versions' identities are in
//! `meta`, the principals in `principals`.

use super::answers::{CacheRows, CacheWrite, Squashed, append_ops, prefix, read_ops, squash};
use super::change::Change;
use super::decode::{self, journal_entry, journal_event};
use super::error::{StoreError, backend};
use super::record::{JournalEntry, SessionRecord};
use super::record::{Journaled, chain_order};
use super::ticket::{Done, Ticket};
use crate::metrics::StoreMetrics;
use prost::Message;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, PoisonError, RwLock};

mod meta;
mod principals;

pub(super) const SESSIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("sessions");
const JOURNAL: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("journal");
/// Journal events by (session, sequence number).
const EVENTS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("journal_events");
/// A session's answers by (session, owner, number): [`CACHED`] and a
/// `CachedAnswer` message while cached; [`EVICTED`] and the digest prefix
/// once evicted under `refuse` (the row is overwritten in place; under
/// `charge` it is deleted). One table keyed by number, so moving a
/// session's tail here (see [`TAIL_BYTES`]) touches the two ends of each
/// owner's range — the answers it adds, the ones it evicts — and nothing
/// keyed by a random digest (a session held here looks its cache up in
/// memory, never in the table).
pub(super) const ANSWERS: TableDefinition<(&str, u64, u64), &[u8]> = TableDefinition::new("answer_cache");
/// [`ANSWERS`] value tags.
const CACHED: u8 = 0;
const EVICTED: u8 = 1;

/// How many bytes of cache changes (its tail) a session record may carry
/// before they move to [`ANSWERS`]: ~55 label-mode steps of an answer in
/// and one out. A commit rewrites whole pages, so changes kept in the
/// record's value cost little beyond the page the record costs anyway,
/// while changes written to [`ANSWERS`] cost the two ends of the owner's
/// range and their branch page: the tail pays those once per ~55 steps
/// instead of once per commit (`BENCHMARKS.md`, issue 27). A record stays
/// under ~5.3 KiB; a change larger than this (an answer with a long
/// published vector) moves at once.
pub(super) const TAIL_BYTES: usize = 4096;

/// Most records folded into one commit.
const MAX_BATCH: usize = 4096;

/// redb's page cache, at most: read cache and write buffer together
/// (redb's own default is 1 GiB). The sessions in memory are
/// authoritative and the hot path only writes, so cached pages mostly
/// duplicate what the sessions hold: with 1 GiB, a restart that reads
/// 100k session records keeps ~170 MB of them cached (+1.6 KiB per idle
/// session, twice the rest of its cost). Group-commit throughput measured
/// the same at 4 MiB, 16 MiB and 1 GiB (`pacpriv bench store --cache-mib`).
pub const DEFAULT_CACHE_BYTES: usize = 16 << 20;

/// How often the writer tries again after a failed commit when no new
/// record arrives to try with.
pub const RETRY_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

struct Write {
    session: String,
    record: SessionRecord,
    change: Change,
    /// Reported after the first attempt; a failed batch is kept without it.
    done: Option<Done>,
}

/// The open redb file, shared by the readers and the writer thread: opened
/// again after a failed commit, and whether the last commit failed.
struct File {
    db: RwLock<Option<Database>>,
    path: PathBuf,
    cache_bytes: usize,
    failed: AtomicBool,
}

impl File {
    fn open(path: &Path, cache_bytes: usize) -> Result<Database, StoreError> {
        Database::builder()
            .set_cache_size(cache_bytes)
            .create(path)
            .map_err(|e| backend(format!("opening {}: {e}", path.display())))
    }

    fn with<T>(&self, f: impl FnOnce(&Database) -> Result<T, StoreError>) -> Result<T, StoreError> {
        let db = self.db.read().unwrap_or_else(PoisonError::into_inner);
        f(db.as_ref().ok_or_else(|| backend(format!("{} could not be opened again", self.path.display())))?)
    }

    fn begin_read(&self) -> Result<redb::ReadTransaction, StoreError> {
        self.with(|db| db.begin_read().map_err(backend))
    }

    fn begin_write(&self) -> Result<redb::WriteTransaction, StoreError> {
        self.with(|db| db.begin_write().map_err(backend))
    }

    /// Closes the file and opens it again (redb recovers what it must).
    fn reopen(&self) -> Result<(), StoreError> {
        let mut db = self.db.write().unwrap_or_else(PoisonError::into_inner);
        // Closed first: the file's lock allows one open at a time.
        *db = None;
        *db = Some(Self::open(&self.path, self.cache_bytes)?);
        Ok(())
    }
}

/// A redb file and its writer thread.
pub struct EmbeddedStore {
    db: Arc<File>,
    path: PathBuf,
    // Both `Option` only so `Drop` can close the queue and then join the
    // writer, releasing the file lock before the store is gone.
    queue: Option<Sender<Write>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        self.queue = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

impl EmbeddedStore {
    /// Opens (or creates) the file, recovering after a crash if needed, and
    /// starts the writer.
    ///
    /// # Errors
    /// The file cannot be created, locked or read.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with(path, StoreMetrics::default())
    }

    /// As [`EmbeddedStore::open`], recording each group commit's latency
    /// and size in `metrics`.
    ///
    /// # Errors
    /// As [`EmbeddedStore::open`].
    pub fn open_with(path: &Path, metrics: StoreMetrics) -> Result<Self, StoreError> {
        Self::open_with_cache(path, metrics, DEFAULT_CACHE_BYTES)
    }

    /// As [`EmbeddedStore::open_with`], with at most `cache_bytes` of redb
    /// page cache (read cache and write buffer together).
    ///
    /// # Errors
    /// As [`EmbeddedStore::open`].
    pub fn open_with_cache(path: &Path, metrics: StoreMetrics, cache_bytes: usize) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| backend(format!("creating {}: {e}", dir.display())))?;
        }
        let db = Arc::new(File {
            db: RwLock::new(Some(File::open(path, cache_bytes)?)),
            path: path.to_owned(),
            cache_bytes,
            failed: AtomicBool::new(false),
        });
        let (queue, rx) = mpsc::channel();
        let writer_db = Arc::clone(&db);
        let writer = std::thread::Builder::new()
            .name("pacpriv-store-writer".into())
            .spawn(move || writer(&writer_db, &rx, &metrics))
            .map_err(backend)?;
        Ok(EmbeddedStore { db, path: path.to_owned(), queue: Some(queue), writer: Some(writer) })
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's absolute path, for messages (so a log line says which
    /// file a relative `store.path` meant).
    pub fn location(&self) -> String {
        std::path::absolute(&self.path).unwrap_or_else(|_| self.path.clone()).display().to_string()
    }

    /// `def` in a fresh read transaction, or `None` if nothing was ever
    /// written to it (redb creates a table on its first write).
    fn read_table<K: redb::Key + 'static, V: redb::Value + 'static>(
        &self,
        def: TableDefinition<K, V>,
    ) -> Result<Option<redb::ReadOnlyTable<K, V>>, StoreError> {
        open_in(&self.db.begin_read()?, def)
    }

    /// A session's latest durable record.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub fn load(&self, session: &str) -> Result<Option<SessionRecord>, StoreError> {
        let Some(table) = self.read_table(SESSIONS)? else { return Ok(None) };
        let Some(bytes) = table.get(session).map_err(backend)? else { return Ok(None) };
        decode::session_record(session, bytes.value()).map(Some)
    }

    /// Bytes of a session's stored record as it is now, cache tail
    /// included (what a commit rewrites for it; `None`: no record).
    ///
    /// # Errors
    /// Backend.
    pub fn stored_len(&self, session: &str) -> Result<Option<usize>, StoreError> {
        let Some(table) = self.read_table(SESSIONS)? else { return Ok(None) };
        Ok(table.get(session).map_err(backend)?.map(|v| v.value().len()))
    }

    /// Every cached answer and remembered eviction of a session (what a
    /// resumed session holds in memory).
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub fn load_cache(&self, session: &str) -> Result<CacheRows, StoreError> {
        let txn = self.db.begin_read()?;
        let corrupt = |reason: &str| StoreError::Corrupt { session: session.into(), reason: reason.into() };
        let (mut entries, mut evicted) = (std::collections::BTreeMap::new(), Vec::new());
        if let Some(table) = open_in(&txn, ANSWERS)? {
            for item in table.range((session, 0, 0)..=(session, u64::MAX, u64::MAX)).map_err(backend)? {
                let (key, value) = item.map_err(backend)?;
                let (_, owner, seq) = key.value();
                match value.value().split_first() {
                    Some((&CACHED, answer)) => {
                        drop(entries.insert((owner, seq), decode::cached_answer(session, answer)?))
                    }
                    Some((&EVICTED, prefix)) => {
                        let prefix = <[u8; 8]>::try_from(prefix).map_err(|_| corrupt("undecodable cached answer"))?;
                        evicted.push((owner, u64::from_le_bytes(prefix)));
                    }
                    _ => return Err(corrupt("undecodable cached answer")),
                }
            }
        }
        // The changes the record carries come after the rows.
        let tail = match open_in(&txn, SESSIONS)? {
            Some(t) => t.get(session).map_err(backend)?.map(|v| stored_tail(session, v.value())).transpose()?,
            None => None,
        };
        for op in tail_ops(session, &tail.unwrap_or_default())? {
            match op {
                CacheWrite::Insert(answer) => drop(entries.insert((answer.owner, answer.seq), answer)),
                CacheWrite::Evict { owner, seq, remember } => {
                    let gone = entries.remove(&(owner, seq)).ok_or_else(|| corrupt("evicted answer missing"))?;
                    if remember {
                        evicted.push((owner, prefix(&gone.digest)));
                    }
                }
                CacheWrite::Remember { owner, prefix, .. } => evicted.push((owner, prefix)),
            }
        }
        let entries = entries.into_values().collect();
        Ok(CacheRows { entries, evicted, probed: None })
    }

    /// Every session key with a record, in order.
    ///
    /// # Errors
    /// Backend.
    pub fn sessions(&self) -> Result<Vec<String>, StoreError> {
        let Some(table) = self.read_table(SESSIONS)? else { return Ok(Vec::new()) };
        table.iter().map_err(backend)?.map(|item| Ok(item.map_err(backend)?.0.value().to_owned())).collect()
    }

    /// A session's record and its journal (entries and events in chain
    /// order), read in one transaction (so a step committing meanwhile is
    /// in both or in neither).
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub fn journal_snapshot(&self, session: &str) -> Result<(Option<SessionRecord>, Vec<Journaled>), StoreError> {
        let txn = self.db.begin_read()?;
        let record = match open_in(&txn, SESSIONS)? {
            Some(t) => {
                t.get(session).map_err(backend)?.map(|b| decode::session_record(session, b.value())).transpose()?
            }
            None => None,
        };
        let journal = match open_in(&txn, JOURNAL)? {
            Some(t) => {
                decode_journal(session, t.range((session, 0)..=(session, u64::MAX)).map_err(backend)?, journal_entry)?
            }
            None => Vec::new(),
        };
        let events = match open_in(&txn, EVENTS)? {
            Some(t) => {
                decode_journal(session, t.range((session, 0)..=(session, u64::MAX)).map_err(backend)?, journal_event)?
            }
            None => Vec::new(),
        };
        Ok((record, chain_order(journal, events)))
    }

    /// A session's journal, in version order.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub fn journal(&self, session: &str) -> Result<Vec<JournalEntry>, StoreError> {
        let Some(table) = self.read_table(JOURNAL)? else { return Ok(Vec::new()) };
        decode_journal(session, table.range((session, 0)..=(session, u64::MAX)).map_err(backend)?, journal_entry)
    }

    /// Whether a step may be taken: not while the last commit has failed
    /// (module documentation). Checked before the step draws.
    ///
    /// # Errors
    /// [`StoreError::CommitsFailing`].
    pub fn writable(&self) -> Result<(), StoreError> {
        if self.db.failed.load(Ordering::Acquire) { Err(StoreError::CommitsFailing) } else { Ok(()) }
    }

    /// Queues `record` and what changed with it (journal entries, events,
    /// cache writes) for the next group commit, all in one transaction.
    /// Call under the session's lock, so a session's records queue in
    /// version order.
    ///
    /// # Errors
    /// [`StoreError::WriterGone`].
    pub fn enqueue(&self, session: &str, record: SessionRecord, change: Change) -> Result<Ticket, StoreError> {
        let (done, wait) = Ticket::new();
        self.queue
            .as_ref()
            .ok_or(StoreError::WriterGone)?
            .send(Write { session: session.to_owned(), record, change, done: Some(done) })
            .map_err(|_| StoreError::WriterGone)?;
        Ok(wait)
    }
}

/// The writer loop: block for one write, take whatever else is queued,
/// commit all of it — after the writes of a failed batch, if one is kept —
/// with one fsync, answer every new ticket. While a failed batch is kept,
/// it also wakes every [`RETRY_EVERY`] to try again on its own.
fn writer(file: &File, queue: &Receiver<Write>, metrics: &StoreMetrics) {
    let mut kept: Vec<Write> = Vec::new();
    loop {
        let first = if kept.is_empty() {
            queue.recv().ok()
        } else {
            match queue.recv_timeout(RETRY_EVERY) {
                Ok(w) => Some(w),
                Err(RecvTimeoutError::Timeout) => None,
                // Shutting down: one last attempt for what is kept.
                Err(RecvTimeoutError::Disconnected) => {
                    attempt(file, &mut kept, metrics);
                    if !kept.is_empty() {
                        let lost: Vec<_> = kept.iter().map(|w| (w.session.as_str(), w.record.version)).collect();
                        tracing::error!(
                            ?lost,
                            "shutting down with records no commit could write (session, version): \
                                                their answers were withheld; these steps are lost"
                        );
                    }
                    return;
                }
            }
        };
        if first.is_none() && kept.is_empty() {
            // The queue closed: shutting down.
            return;
        }
        let mut new = usize::from(first.is_some());
        kept.extend(first);
        while new < MAX_BATCH {
            match queue.try_recv() {
                Ok(w) => kept.push(w),
                Err(_) => break,
            }
            new += 1;
        }
        attempt(file, &mut kept, metrics);
    }
}

/// Commits `batch` (opening the file again first if the last commit
/// failed) and reports to every ticket not yet reported. Emptied once
/// committed; kept, in order, if the commit failed.
fn attempt(file: &File, batch: &mut Vec<Write>, metrics: &StoreMetrics) {
    if batch.is_empty() {
        return;
    }
    let started = std::time::Instant::now();
    let retrying = file.failed.load(Ordering::Acquire);
    let reopened = if retrying { file.reopen() } else { Ok(()) };
    let result = reopened.and_then(|()| file.with(|db| commit(db, batch, retrying))).map_err(|e| e.to_string());
    metrics.commit(started.elapsed().as_secs_f64(), batch.len());
    match &result {
        Ok(()) => {
            if file.failed.swap(false, Ordering::AcqRel) {
                tracing::info!(records = batch.len(), "store commit succeeded again; steps are taken again");
            }
        }
        Err(e) => {
            if !file.failed.swap(true, Ordering::AcqRel) {
                tracing::error!(error = %e, records = batch.len(),
                    "store commit failed; answers withheld and no new step taken until a commit succeeds \
                     (retried every second)");
            }
        }
    }
    for w in batch.iter_mut() {
        if let Some(done) = w.done.take() {
            done.report(&result);
        }
    }
    if result.is_ok() {
        batch.clear();
    }
}

/// How far a session's record has come: its version, then its journal
/// events (a record that changed nothing else still moves one of them, or
/// carries no cache change).
fn progress(record: &SessionRecord) -> (u64, u64) {
    (record.version, record.journal_events)
}

/// Writes `batch` in one transaction. `retrying`: it holds writes of a
/// batch whose commit failed, which may have landed all the same (a
/// failed fsync after the header was written): a session's cache changes
/// are then appended only for writes past its stored record, so that none
/// applies twice (journal entries and events are keyed, and records
/// supersede, so those may be written again).
fn commit(db: &Database, batch: &[Write], retrying: bool) -> Result<(), StoreError> {
    let txn = db.begin_write().map_err(backend)?;
    {
        let mut sessions = txn.open_table(SESSIONS).map_err(backend)?;
        let mut journal = txn.open_table(JOURNAL).map_err(backend)?;
        // Opened only when a tail moves there: redb creates a table when
        // opened for writing.
        let mut answers = None;
        for (key, writes) in by_session(batch) {
            // Later records of a session supersede earlier ones: they
            // arrive in version order. Its cache changes all apply.
            let Some(last) = writes.last() else { continue };
            let value = if last.record.cache_owners.is_empty() && writes.iter().all(|w| w.change.cache.is_empty()) {
                // Never cached anything: no tail to carry.
                last.record.encode()
            } else {
                let stored = sessions.get(key).map_err(backend)?.map(|v| v.value().to_vec());
                let durable = match (&stored, retrying) {
                    (Some(bytes), true) => Some(progress(&decode::session_record(key, bytes)?)),
                    _ => None,
                };
                let mut tail = stored.map(|b| stored_tail(key, &b)).transpose()?.unwrap_or_default();
                let unwritten = writes.iter().filter(|w| durable.is_none_or(|d| progress(&w.record) > d));
                append_ops(unwritten.flat_map(|w| &w.change.cache), &mut tail);
                if tail.len() <= TAIL_BYTES {
                    last.record.encode_with_tail(tail)
                } else {
                    let table = match &mut answers {
                        Some(table) => table,
                        None => answers.insert(txn.open_table(ANSWERS).map_err(backend)?),
                    };
                    write_cache(table, key, &squash(&tail_ops(key, &tail)?))?;
                    last.record.encode()
                }
            };
            sessions.insert(key, value.as_slice()).map_err(backend)?;
            for entry in writes.iter().flat_map(|w| &w.change.journal) {
                journal.insert((key, entry.version), entry.encode().as_slice()).map_err(backend)?;
            }
        }
        // Opened only when there is one: most deployments journal nothing.
        if batch.iter().any(|w| !w.change.events.is_empty()) {
            let mut events = txn.open_table(EVENTS).map_err(backend)?;
            for w in batch {
                for event in &w.change.events {
                    events
                        .insert((w.session.as_str(), event.seq), event.encode_sealed().as_slice())
                        .map_err(backend)?;
                }
            }
        }
    }
    // Default durability is Immediate: commit returns after fsync.
    txn.commit().map_err(backend)
}

/// `batch` by session, in order of first appearance, each session's
/// writes in the order they came.
fn by_session(batch: &[Write]) -> Vec<(&str, Vec<&Write>)> {
    let mut at = HashMap::new();
    let mut out: Vec<(&str, Vec<&Write>)> = Vec::new();
    for w in batch {
        let i = *at.entry(w.session.as_str()).or_insert_with(|| {
            out.push((w.session.as_str(), Vec::new()));
            out.len() - 1
        });
        out[i].1.push(w);
    }
    out
}

/// The cache tail of `session`'s stored record, as stored.
fn stored_tail(session: &str, record: &[u8]) -> Result<Vec<u8>, StoreError> {
    super::record::cache_tail(record)
        .ok_or_else(|| StoreError::Corrupt { session: session.into(), reason: "undecodable record".into() })
}

/// The cache changes in `session`'s stored tail, in order.
fn tail_ops(session: &str, tail: &[u8]) -> Result<Vec<CacheWrite>, StoreError> {
    read_ops(tail)
        .ok_or_else(|| StoreError::Corrupt { session: session.into(), reason: "undecodable cache tail".into() })
}

/// Applies a session's cache changes to [`ANSWERS`] (see
/// [`super::answers::squash`]). An eviction of a row that is not there
/// means the record's spans and the table disagree: the commit fails
/// rather than forget what a repeat must be refused for.
fn write_cache(
    answers: &mut redb::Table<'_, (&'static str, u64, u64), &'static [u8]>,
    session: &str,
    writes: &Squashed,
) -> Result<(), StoreError> {
    let corrupt = |reason: &str| StoreError::Corrupt { session: session.into(), reason: reason.into() };
    let evicted = |prefix: u64| [&[EVICTED][..], &prefix.to_le_bytes()].concat();
    for &(owner, seq, remember) in &writes.evict {
        let gone =
            answers.remove((session, owner, seq)).map_err(backend)?.ok_or_else(|| corrupt("evicted answer missing"))?;
        let Some((&CACHED, answer)) = gone.value().split_first() else { return Err(corrupt("evicted answer missing")) };
        if remember {
            let digest = decode::cached_answer(session, answer)?.digest;
            drop(gone);
            answers.insert((session, owner, seq), evicted(prefix(&digest)).as_slice()).map_err(backend)?;
        }
    }
    for answer in &writes.insert {
        let value = [&[CACHED][..], &answer.encode_to_vec()].concat();
        answers.insert((session, answer.owner, answer.seq), value.as_slice()).map_err(backend)?;
    }
    for &(owner, seq, prefix) in &writes.remember {
        answers.insert((session, owner, seq), evicted(prefix).as_slice()).map_err(backend)?;
    }
    Ok(())
}

/// `def` in `txn`, or `None` if nothing was ever written to it (redb
/// creates a table on its first write).
fn open_in<K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &redb::ReadTransaction,
    def: TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, StoreError> {
    match txn.open_table(def) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(backend(e)),
    }
}

/// The entries of one session's journal range, decoded.
/// Decodes `session`'s journal items in `range` with `decode`
/// (`decode::journal_entry` or `decode::journal_event`).
fn decode_journal<T>(
    session: &str,
    range: redb::Range<'_, (&str, u64), &[u8]>,
    decode: fn(&str, &[u8]) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    range.map(|item| decode(session, item.map_err(backend)?.1.value())).collect()
}
