//! The embedded store's two threads: the writer, which makes records
//! durable in the log, and the folder, which moves them into the redb
//! file.
//!
//! - **Writer** (group commit): blocks for one record, takes whatever else
//!   queued up meanwhile, appends all of it to the log as one frame and
//!   syncs it ([`Log::append`]), then answers every ticket. A failed
//!   append keeps the batch, in order, withholds its answers and stops new
//!   steps ([`Flags::writable`]); the writer tries again every
//!   [`RETRY_EVERY`] (on a fresh segment) until one succeeds. Before it
//!   appends, it waits while answers that left their fan-out have yet to
//!   queue their records and keep doing so ([`Arrivals::gather`], within
//!   [`Gather`]'s bounds), so that they share the sync.
//! - **Folder**: every [`FOLD_EVERY`] or [`FOLD_RECORDS`] records (sooner
//!   when a reader asks, [`Folds::settle`]), the writer closes the active
//!   segment and hands the folder the records it holds; the folder commits
//!   them to the redb file in one transaction that also records which
//!   segments it covers ([`super::commit`]), then retires those segments
//!   (the last becomes the spare the next segment is written over).
//!   Appends go on meanwhile. A failed fold stops new steps too (the log
//!   would otherwise grow without bound) and is retried every
//!   [`RETRY_EVERY`] after opening the file again; no record is lost, as
//!   the log still holds every one of them. A fold that still fails as
//!   the store closes is left, with every later one, to the next start.
//!
//! A session's records reach the queue, the log and the file in the order
//! it stepped (it enqueues under its own lock, [`Folds::enqueue`] numbers
//! and sends them under one lock), so a ticket that resolves says every
//! earlier record of that session is durable too.

use super::log::{self, Log};
use super::{File, Write, commit};
use crate::arrivals::Arrivals;
use crate::error::StoreError;
use crate::metrics::StoreMetrics;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Most records appended in one frame.
const MAX_BATCH: usize = 4096;

/// How long the writer waits before a sync for answers on their way
/// ([`Arrivals::gather`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Gather {
    /// Once none has landed for this long.
    pub(super) quiet: Duration,
    /// At most this long.
    pub(super) at_most: Duration,
}

impl Gather {
    /// The server's: at most 500 µs, which puts more records in a sync at
    /// saturation (`BENCHMARKS.md`, *Records on their way*) and delays
    /// every answer of that sync by up to that much; and 150 µs after the
    /// last landing, what an answer held far from its step costs a sync
    /// while nothing else lands.
    pub(super) const SERVER: Gather = Gather { quiet: Duration::from_micros(150), at_most: Duration::from_micros(500) };
}

/// How long records wait in the log before the writer hands them to the
/// folder, at most (while the folder is free). Longer folds fewer pages
/// per record (a session's records between two folds cost one leaf) and
/// keeps more in memory and in the log.
pub const FOLD_EVERY: Duration = Duration::from_millis(500);

/// How many records make the writer hand them to the folder before
/// [`FOLD_EVERY`] (~1.5 KiB each in memory: a 128-teacher posterior).
pub const FOLD_RECORDS: usize = 8192;

/// How often the writer tries again after a failed commit when no new
/// record arrives to try with, and the folder after a failed fold.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);

/// What the writer is sent. A write is sent unboxed (an allocation per
/// record would cost more than the rare, small `Fold` wastes).
#[allow(clippy::large_enum_variant)]
pub(super) enum Msg {
    Write(Write),
    /// A reader needs what the log holds in the file (see [`Folds::settle`]).
    Fold,
}

/// Records the writer hands to the folder: everything appended to the
/// segments numbered at most `through` and not folded before.
pub(super) struct Job {
    writes: Vec<Write>,
    through: u64,
}

/// Why steps are stopped (both are checked before a step draws).
#[derive(Default)]
pub(super) struct Flags {
    /// The last append to the log failed.
    append: AtomicBool,
    /// The last fold into the redb file failed.
    fold: AtomicBool,
}

impl Flags {
    /// Whether a step may be taken: not while the last append or the last
    /// fold has failed.
    pub(super) fn writable(&self) -> Result<(), StoreError> {
        if self.append.load(Ordering::Acquire) || self.fold.load(Ordering::Acquire) {
            Err(StoreError::CommitsFailing)
        } else {
            Ok(())
        }
    }
}

/// Which records are only in the log: what a reader of the redb file
/// waits for ([`Folds::settle`]).
pub(super) struct Folds {
    queue: Mutex<Queue>,
    /// Every record numbered at most this is in the redb file.
    folded: Mutex<u64>,
    folded_changed: Condvar,
    /// The folder holds a job (the writer hands it the next one after).
    folding: AtomicBool,
    pub(super) flags: Flags,
}

/// The queue's sending end and the numbers it gave.
struct Queue {
    /// `None` once the store is closing.
    tx: Option<Sender<Msg>>,
    /// The number the last record sent got (records are numbered from 1).
    last: u64,
    /// Per session with records not yet folded, its last record's number.
    unfolded: HashMap<String, u64>,
}

impl Folds {
    pub(super) fn new(tx: Sender<Msg>) -> Folds {
        Folds {
            queue: Mutex::new(Queue { tx: Some(tx), last: 0, unfolded: HashMap::new() }),
            folded: Mutex::new(0),
            folded_changed: Condvar::new(),
            folding: AtomicBool::new(false),
            flags: Flags::default(),
        }
    }

    /// Numbers `w` and sends it to the writer, under one lock, so that the
    /// queue holds records in the order of their numbers.
    pub(super) fn enqueue(&self, mut w: Write) -> Result<(), StoreError> {
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let seq = q.last + 1;
        w.seq = seq;
        let session = w.session.as_str();
        match q.unfolded.get_mut(session) {
            Some(last) => *last = seq,
            None => drop(q.unfolded.insert(session.to_owned(), seq)),
        }
        q.tx.as_ref().ok_or(StoreError::WriterGone)?.send(Msg::Write(w)).map_err(|_| StoreError::WriterGone)?;
        q.last = seq;
        Ok(())
    }

    /// Waits until every record of `session` (of every session: `None`)
    /// handed to the store so far is in the redb file, asking the writer
    /// to fold now if it is not.
    ///
    /// # Errors
    /// [`StoreError::CommitsFailing`] while appends or folds fail (the
    /// records are in the log, or kept for it, and reach the file once
    /// they succeed); [`StoreError::WriterGone`] after shutdown.
    pub(super) fn settle(&self, session: Option<&str>) -> Result<(), StoreError> {
        let target = {
            let q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            match session {
                Some(s) => q.unfolded.get(s).copied(),
                None => (!q.unfolded.is_empty()).then_some(q.last),
            }
        };
        let Some(target) = target else { return Ok(()) };
        let mut folded = self.folded.lock().unwrap_or_else(PoisonError::into_inner);
        if *folded >= target {
            return Ok(());
        }
        {
            let q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            q.tx.as_ref().ok_or(StoreError::WriterGone)?.send(Msg::Fold).map_err(|_| StoreError::WriterGone)?;
        }
        while *folded < target {
            self.flags.writable()?;
            folded = self
                .folded_changed
                .wait_timeout(folded, Duration::from_millis(50))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        Ok(())
    }

    /// Closes the queue: the writer appends what it holds, hands it to the
    /// folder and stops.
    pub(super) fn close(&self) {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner).tx = None;
    }

    /// Every record numbered at most `through` is in the redb file.
    fn folded(&self, through: u64) {
        {
            let mut folded = self.folded.lock().unwrap_or_else(PoisonError::into_inner);
            *folded = (*folded).max(through);
        }
        self.folded_changed.notify_all();
        let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        q.unfolded.retain(|_, last| *last > through);
    }
}

/// The writer loop (module documentation): runs until the queue closes,
/// then hands what the log holds to the folder (`jobs`) and returns.
pub(super) fn writer(
    folds: &Folds,
    queue: &Receiver<Msg>,
    jobs: SyncSender<Job>,
    mut log: Log,
    metrics: &StoreMetrics,
    arrivals: &Arrivals,
    gather: Gather,
) {
    let mut state =
        Appending { kept: Vec::new(), unfolded: Vec::new(), due: Instant::now() + FOLD_EVERY, asked: false };
    loop {
        let wait = if !state.kept.is_empty() {
            Some(RETRY_EVERY)
        } else if state.asked && !state.unfolded.is_empty() {
            // A reader waits for a fold while the folder is busy.
            Some(Duration::from_millis(5))
        } else if !state.unfolded.is_empty() {
            Some(state.due.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)))
        } else {
            None
        };
        let first = match wait {
            None => queue.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some(wait) => queue.recv_timeout(wait),
        };
        match first {
            Ok(Msg::Write(w)) => state.kept.push(w),
            Ok(Msg::Fold) => state.asked = true,
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                // Shutting down: one last append for what is kept, then
                // everything to the folder.
                state.append(&mut log, folds, metrics);
                if !state.kept.is_empty() {
                    let lost: Vec<_> = state.kept.iter().map(|w| (w.session.as_str(), w.record.version)).collect();
                    tracing::error!(
                        ?lost,
                        "shutting down with records no commit could write (session, version): their answers \
                         were withheld; these steps are lost"
                    );
                }
                if !state.unfolded.is_empty() {
                    let writes = std::mem::take(&mut state.unfolded);
                    let _ = jobs.send(Job { writes, through: log.rotate() });
                }
                break;
            }
        }
        state.take_queued(queue);
        // Not while appends fail (what is kept is retried at once), with a
        // full frame, or while a reader waits for a fold.
        let gathering = !state.kept.is_empty()
            && state.kept.len() < MAX_BATCH
            && !state.asked
            && !folds.flags.append.load(Ordering::Acquire);
        if gathering && arrivals.gather(gather.quiet, gather.at_most) {
            state.take_queued(queue);
        }
        state.append(&mut log, folds, metrics);
        let due = state.asked || state.unfolded.len() >= FOLD_RECORDS || Instant::now() >= state.due;
        // Only with nothing kept: a fold covers every record numbered
        // up to its last, and a kept record is not in the log yet.
        if due && state.kept.is_empty() && !state.unfolded.is_empty() && !folds.folding.load(Ordering::Acquire) {
            folds.folding.store(true, Ordering::Release);
            let writes = std::mem::take(&mut state.unfolded);
            // Never full: the folder empties the channel before it
            // clears `folding`.
            if jobs.try_send(Job { writes, through: log.rotate() }).is_err() {
                // The folder is gone: what the log holds is folded at
                // the next start; until then nothing is taken that
                // would only grow it.
                folds.flags.fold.store(true, Ordering::Release);
                tracing::error!("the store's folder is not running; records stay in the log, no new step is taken");
            }
            state.due = Instant::now() + FOLD_EVERY;
            state.asked = false;
        } else if state.unfolded.is_empty() {
            // Nothing to fold: whatever a reader waits for is folded,
            // being folded, or kept (and its reader refused).
            state.asked = false;
        }
    }
}

/// What the writer holds between loops.
struct Appending {
    /// Records not yet in the log (a failed append keeps them, in order).
    kept: Vec<Write>,
    /// Records in the log and not yet handed to the folder.
    unfolded: Vec<Write>,
    /// When the next fold is due.
    due: Instant,
    /// A reader waits for a fold.
    asked: bool,
}

impl Appending {
    /// Takes what is queued, up to a frame's [`MAX_BATCH`].
    fn take_queued(&mut self, queue: &Receiver<Msg>) {
        while self.kept.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(Msg::Write(w)) => self.kept.push(w),
                Ok(Msg::Fold) => self.asked = true,
                Err(_) => break,
            }
        }
    }

    /// Appends what is kept as one frame and reports to every ticket not
    /// yet reported; moved to `unfolded` once appended.
    fn append(&mut self, log: &mut Log, folds: &Folds, metrics: &StoreMetrics) {
        if self.kept.is_empty() {
            return;
        }
        let started = Instant::now();
        let result = log.append(&self.kept).map_err(|e| e.to_string());
        metrics.commit(started.elapsed().as_secs_f64(), self.kept.len());
        match &result {
            Ok(()) => {
                if folds.flags.append.swap(false, Ordering::AcqRel) {
                    tracing::info!(records = self.kept.len(), "store commit succeeded again; steps are taken again");
                }
            }
            Err(e) => {
                if !folds.flags.append.swap(true, Ordering::AcqRel) {
                    tracing::error!(error = %e, records = self.kept.len(),
                        "store commit failed; answers withheld and no new step taken until a commit succeeds \
                         (retried every second)");
                }
            }
        }
        for w in &mut self.kept {
            if let Some(done) = w.done.take() {
                done.report(&result);
            }
        }
        if result.is_ok() {
            self.unfolded.append(&mut self.kept);
        }
    }
}

/// The folder loop: folds each job into the redb file, retrying a failed
/// fold until it succeeds, then retires the segments it covered. Returns
/// once the writer has stopped and every job is done — or, when a fold
/// still fails as the store closes, at once: a later job's commit would
/// record its segments, and with them the failed job's, as folded.
pub(super) fn folder(file: &File, folds: &Folds, jobs: &Receiver<Job>) {
    // A folder that panics stops new steps and wakes the readers (which
    // then see the flag) instead of leaving them waiting for a fold.
    let _stopped = StopsSteps(folds);
    while let Ok(job) = jobs.recv() {
        let last = job.writes.last().map_or(0, |w| w.seq);
        let mut retrying = false;
        loop {
            let reopened = if retrying { file.reopen() } else { Ok(()) };
            let result = reopened.and_then(|()| file.with(|db| commit(db, &job.writes, retrying, job.through)));
            match result {
                Ok(()) => {
                    if folds.flags.fold.swap(false, Ordering::AcqRel) {
                        tracing::info!(records = job.writes.len(), "store fold succeeded again; steps are taken again");
                    }
                    log::retire_through(&file.path, job.through);
                    folds.folded(last);
                    break;
                }
                Err(e) => {
                    if !folds.flags.fold.swap(true, Ordering::AcqRel) {
                        tracing::error!(error = %e, records = job.writes.len(),
                            "store commit failed (folding the log into the store file); no new step taken until \
                             one succeeds (retried every second; the log keeps every record)");
                    }
                    retrying = true;
                    if closing(folds) {
                        tracing::warn!(
                            records = job.writes.len(),
                            "shutting down with records only in the log; they are folded at the next start"
                        );
                        return;
                    }
                    std::thread::sleep(RETRY_EVERY);
                }
            }
        }
        folds.folding.store(false, Ordering::Release);
    }
}

/// Stops new steps if the folder ends by a panic.
struct StopsSteps<'a>(&'a Folds);

impl Drop for StopsSteps<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.flags.fold.store(true, Ordering::Release);
            self.0.folded_changed.notify_all();
            tracing::error!("the store's folder stopped; records stay in the log, no new step is taken");
        }
    }
}

/// Whether the store is closing (its queue closed).
fn closing(folds: &Folds) -> bool {
    folds.queue.lock().unwrap_or_else(PoisonError::into_inner).tx.is_none()
}

/// Folds every segment of the store file that it has not folded yet
/// (after a crash, or a stop whose last fold failed), in order, and
/// retires them; returns the file's identity and the number of the last
/// segment there was.
///
/// # Errors
/// A segment cannot be read or does not decode, or the fold fails.
pub(super) fn recover(file: &File) -> Result<(u64, u64), StoreError> {
    let path: &PathBuf = &file.path;
    let (id, folded) = file.with(super::log_state)?;
    let segments = log::segments(path)?;
    let last = segments.last().map_or(folded, |(number, _)| (*number).max(folded));
    let mut writes = Vec::new();
    for (number, segment) in segments.iter().filter(|(number, _)| *number > folded) {
        match log::read(id, *number, segment)? {
            Some(w) => writes.extend(w),
            None => tracing::warn!(
                segment = %segment.display(),
                "a log segment of another store file (one deleted or replaced beside its log): not folded, removed"
            ),
        }
    }
    if !writes.is_empty() {
        tracing::info!(records = writes.len(), "folding the store's log into the store file");
    }
    if last > folded {
        // Replayed writes may be in the file already (a segment abandoned
        // after a failed sync may repeat the next one's): folded as a
        // retry, which applies each record's changes once.
        file.with(|db| commit(db, &writes, true, last))?;
    }
    log::retire_through(path, last);
    Ok((id, last))
}
