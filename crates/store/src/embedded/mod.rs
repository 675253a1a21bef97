//! The embedded store: one redb file and its log, no server to run. A
//! step's record is durable once the writer has appended it to the log
//! with everything else that queued up meanwhile — group commit: one
//! sequential write and one fsync for many sessions — and it reaches the
//! redb file with many other commits' records in one transaction, which
//! the folder commits in the background (`writer`; issue 70 §1: a
//! session's records between two folds cost one page of the file, not one
//! each). Opening the store folds whatever the log holds first (`log`).
//!
//! Early lock release falls out of the queue order: a session enqueues its
//! records under its own lock, so they reach the writer in version order,
//! and a frame and a fold are each written atomically; when a record's
//! ticket resolves, every earlier record of that session is durable too.
//!
//! A failed append (a full disk, a file-size limit, an I/O error)
//! withholds that batch's answers, and from then on no new step is taken
//! ([`EmbeddedStore::writable`], checked before a step draws): the sessions
//! in memory would otherwise go on charging while nothing reaches the
//! disk. The failed batch is kept and appended again, which the writer
//! retries by itself every [`RETRY_EVERY`], so no record, journal entry or
//! cached answer of it is lost and the journal has no gap. A failed fold
//! stops new steps too until one succeeds (its records are durable in the
//! log, which would otherwise grow without bound); the folder retries it
//! after opening the file again (redb refuses every operation after an
//! I/O error). The first success lets steps in again.
//!
//! A reader of the redb file (a session's record, its journal, its cached
//! answers) first waits until every record of that session handed to the
//! store is folded (`Folds::settle`): only sessions that stepped since
//! the last fold wait, and only for one fold.
//!
//! Here: opening the file, the sessions, their journals and caches, and
//! what a fold writes; the datasets' records and the versions' identities
//! are in `meta`, the principals in `principals`.

use super::answers::{CacheRows, CacheWrite, Squashed, append_ops, prefix, read_ops, squash};
use super::change::Change;
use super::decode::{self, journal_entry, journal_event};
use super::error::{StoreError, backend};
use super::record::{JournalEntry, SessionRecord};
use super::record::{Journaled, chain_order};
use super::ticket::{Done, Ticket};
use crate::arrivals::Arrivals;
use crate::metrics::StoreMetrics;
use prost::Message;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, PoisonError, RwLock};
use writer::Folds;

mod log;
mod meta;
mod principals;
#[cfg(test)]
mod test;
mod writer;

pub use writer::{FOLD_EVERY, FOLD_RECORDS, RETRY_EVERY};

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

/// The log's state in the file: under [`FOLDED_KEY`] the number of the
/// last log segment the file has folded (absent: none yet), which a fold
/// records in its own transaction, so a segment that outlived its fold (a
/// crash before its removal) is never folded again over newer records;
/// under [`ID_KEY`] the file's identity, written when the file is first
/// opened by a release with a log, which every segment carries.
const LOG: TableDefinition<&str, u64> = TableDefinition::new("log");
const FOLDED_KEY: &str = "folded";
const ID_KEY: &str = "id";

/// redb's page cache, at most: read cache and write buffer together
/// (redb's own default is 1 GiB). The sessions in memory are
/// authoritative and the hot path only writes, so cached pages mostly
/// duplicate what the sessions hold: with 1 GiB, a restart that reads
/// 100k session records keeps ~170 MB of them cached (+1.6 KiB per idle
/// session, twice the rest of its cost). Group-commit throughput measured
/// the same at 4 MiB, 16 MiB and 1 GiB (`pacpriv bench store --cache-mib`).
pub const DEFAULT_CACHE_BYTES: usize = 16 << 20;

/// One session's record and what changed with it, on its way to the log
/// and the file.
struct Write {
    session: String,
    record: SessionRecord,
    change: Change,
    /// Its number in the queue (`Folds::enqueue`; 0 when read back from
    /// the log).
    seq: u64,
    /// Reported after the first attempt; a failed batch is kept without it.
    done: Option<Done>,
}

/// The open redb file, shared by the readers and the folder: opened again
/// after a failed fold.
struct File {
    db: RwLock<Option<Database>>,
    path: PathBuf,
    cache_bytes: usize,
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

/// A redb file, its log and the threads that write them.
pub struct EmbeddedStore {
    db: Arc<File>,
    path: PathBuf,
    folds: Arc<Folds>,
    /// The writer, then the folder: `Drop` closes the queue and joins them
    /// in that order (the writer hands the folder what the log holds),
    /// releasing the file lock before the store is gone.
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        self.folds.close();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl EmbeddedStore {
    /// Opens (or creates) the file, recovering after a crash if needed and
    /// folding what its log holds, and starts the writer.
    ///
    /// # Errors
    /// The file cannot be created, locked or read.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with(path, StoreMetrics::default(), Arc::default())
    }

    /// As [`EmbeddedStore::open`], recording each group commit's latency
    /// and size in `metrics`, its writer gathering the records `arrivals`
    /// counts on their way ([`Arrivals`]).
    ///
    /// # Errors
    /// As [`EmbeddedStore::open`].
    pub fn open_with(path: &Path, metrics: StoreMetrics, arrivals: Arc<Arrivals>) -> Result<Self, StoreError> {
        Self::open_with_cache(path, metrics, arrivals, DEFAULT_CACHE_BYTES)
    }

    /// As [`EmbeddedStore::open_with`], with at most `cache_bytes` of redb
    /// page cache (read cache and write buffer together).
    ///
    /// # Errors
    /// As [`EmbeddedStore::open`].
    pub fn open_with_cache(
        path: &Path,
        metrics: StoreMetrics,
        arrivals: Arc<Arrivals>,
        cache_bytes: usize,
    ) -> Result<Self, StoreError> {
        Self::open_gathering(path, metrics, arrivals, cache_bytes, writer::Gather::SERVER)
    }

    /// As [`EmbeddedStore::open_with_cache`], the writer waiting for
    /// records on their way within `gather`'s bounds.
    fn open_gathering(
        path: &Path,
        metrics: StoreMetrics,
        arrivals: Arc<Arrivals>,
        cache_bytes: usize,
        gather: writer::Gather,
    ) -> Result<Self, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| backend(format!("creating {}: {e}", dir.display())))?;
        }
        let db = Arc::new(File {
            db: RwLock::new(Some(File::open(path, cache_bytes)?)),
            path: path.to_owned(),
            cache_bytes,
        });
        let (id, last_segment) = writer::recover(&db)?;
        let (queue, rx) = mpsc::channel();
        let (jobs, job_rx) = mpsc::sync_channel(1);
        let folds = Arc::new(Folds::new(queue));
        let (folder_db, folder_folds) = (Arc::clone(&db), Arc::clone(&folds));
        let folder = std::thread::Builder::new()
            .name("pacpriv-store-folder".into())
            .spawn(move || writer::folder(&folder_db, &folder_folds, &job_rx))
            .map_err(backend)?;
        let writer_folds = Arc::clone(&folds);
        let log = log::Log::new(path, id, last_segment);
        let writer = std::thread::Builder::new()
            .name("pacpriv-store-writer".into())
            .spawn(move || writer::writer(&writer_folds, &rx, jobs, log, &metrics, &arrivals, gather))
            .map_err(backend)?;
        Ok(EmbeddedStore { db, path: path.to_owned(), folds, threads: vec![writer, folder] })
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
        self.folds.settle(Some(session))?;
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
        self.folds.settle(Some(session))?;
        let Some(table) = self.read_table(SESSIONS)? else { return Ok(None) };
        Ok(table.get(session).map_err(backend)?.map(|v| v.value().len()))
    }

    /// Every cached answer and remembered eviction of a session (what a
    /// resumed session holds in memory).
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub fn load_cache(&self, session: &str) -> Result<CacheRows, StoreError> {
        self.folds.settle(Some(session))?;
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
        self.folds.settle(None)?;
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
        self.folds.settle(Some(session))?;
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
        self.folds.settle(Some(session))?;
        let Some(table) = self.read_table(JOURNAL)? else { return Ok(Vec::new()) };
        decode_journal(session, table.range((session, 0)..=(session, u64::MAX)).map_err(backend)?, journal_entry)
    }

    /// Whether a step may be taken: not while the last append or fold has
    /// failed (module documentation). Checked before the step draws.
    ///
    /// # Errors
    /// [`StoreError::CommitsFailing`].
    pub fn writable(&self) -> Result<(), StoreError> {
        self.folds.flags.writable()
    }

    /// Queues `record` and what changed with it (journal entries, events,
    /// cache writes) for the next group commit, all in one transaction.
    /// Call under the session's lock, so a session's records queue in
    /// version order.
    ///
    /// # Errors
    /// [`StoreError::WriterGone`].
    pub fn enqueue(&self, session: &str, record: SessionRecord, mut change: Change) -> Result<Ticket, StoreError> {
        let (done, wait) = Ticket::new();
        let arriving = std::mem::take(&mut change.arriving);
        self.folds.enqueue(Write { session: session.to_owned(), record, change, seq: 0, done: Some(done) })?;
        // Queued: the writer, if it waits for these, finds the record.
        drop(arriving);
        Ok(wait)
    }
}

/// How far a session's record has come: its version, then its journal
/// events (a record that changed nothing else still moves one of them, or
/// carries no cache change).
fn progress(record: &SessionRecord) -> (u64, u64) {
    (record.version, record.journal_events)
}

/// Folds `batch` into the file in one transaction, recording that it
/// covers the log's segments numbered at most `through` ([`LOG`]).
/// `retrying`: the batch may be in the file already, in part or whole (a
/// failed fold whose fsync failed after the header was written, or
/// records replayed from the log, where a segment abandoned after a failed
/// sync may repeat the next one's). Each session's writes then apply only
/// past its stored record and each only once, so that no cache change
/// applies twice and no record goes back (journal entries and events are
/// keyed, so those may be written again).
fn commit(db: &Database, batch: &[Write], retrying: bool, through: u64) -> Result<(), StoreError> {
    let txn = db.begin_write().map_err(backend)?;
    {
        let mut sessions = txn.open_table(SESSIONS).map_err(backend)?;
        let mut journal = txn.open_table(JOURNAL).map_err(backend)?;
        // Opened only when a tail moves there: redb creates a table when
        // opened for writing.
        let mut answers = None;
        for (key, writes) in by_session(batch) {
            for entry in writes.iter().flat_map(|w| &w.change.journal) {
                journal.insert((key, entry.version), entry.encode().as_slice()).map_err(backend)?;
            }
            let stored = match sessions.get(key).map_err(backend)? {
                // Read only where it is needed: a tail to append to, or
                // writes that may be there already.
                Some(v) if retrying || !writes_cache_nothing(&writes) => Some(v.value().to_vec()),
                _ => None,
            };
            let writes = if retrying {
                let mut past = match &stored {
                    Some(bytes) => Some(progress(&decode::session_record(key, bytes)?)),
                    None => None,
                };
                writes
                    .into_iter()
                    .filter(|w| {
                        let p = progress(&w.record);
                        let new = past.is_none_or(|d| p > d);
                        if new {
                            past = Some(p);
                        }
                        new
                    })
                    .collect()
            } else {
                writes
            };
            // Later records of a session supersede earlier ones: they
            // arrive in version order. Its cache changes all apply.
            let Some(last) = writes.last() else { continue };
            let value = if writes_cache_nothing(&writes) {
                // Never cached anything: no tail to carry.
                last.record.encode()
            } else {
                let mut tail = stored.map(|b| stored_tail(key, &b)).transpose()?.unwrap_or_default();
                append_ops(writes.iter().flat_map(|w| &w.change.cache), &mut tail);
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
        txn.open_table(LOG).map_err(backend)?.insert(FOLDED_KEY, through).map_err(backend)?;
    }
    // Default durability is Immediate: commit returns after fsync.
    txn.commit().map_err(backend)
}

/// Whether a session's `writes` leave it without cached answers: its last
/// record names no cache owner and none of them changed the cache.
fn writes_cache_nothing(writes: &[&Write]) -> bool {
    writes.last().is_none_or(|w| w.record.cache_owners.is_empty()) && writes.iter().all(|w| w.change.cache.is_empty())
}

/// The file's identity (written now if it has none) and the number of the
/// last log segment it has folded (0: none).
fn log_state(db: &Database) -> Result<(u64, u64), StoreError> {
    let txn = db.begin_read().map_err(backend)?;
    let table = open_in(&txn, LOG)?;
    let get = |key: &str| match &table {
        Some(t) => t.get(key).map_err(backend).map(|v| v.map(|v| v.value())),
        None => Ok(None),
    };
    let folded = get(FOLDED_KEY)?.unwrap_or(0);
    if let Some(id) = get(ID_KEY)? {
        return Ok((id, folded));
    }
    drop(table);
    // Random per file (std's hasher keys come from the OS): what tells
    // this file's log from a log left beside it by a file it replaced.
    use std::hash::{BuildHasher as _, Hasher as _};
    let id = std::collections::hash_map::RandomState::new().build_hasher().finish();
    let txn = db.begin_write().map_err(backend)?;
    txn.open_table(LOG).map_err(backend)?.insert(ID_KEY, id).map_err(backend)?;
    txn.commit().map_err(backend)?;
    Ok((id, folded))
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
