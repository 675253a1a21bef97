//! The embedded store's log: where a group commit's records become durable
//! (issue 70 §1). A commit appends one frame — every record of the batch
//! and what changed with it; several for a batch beyond [`FRAME_BYTES`] —
//! to the active segment file and syncs it: one
//! sequential write and one `fdatasync`, however many sessions the batch
//! touches. The records reach the redb file later, many commits at a time
//! (`writer`'s fold), so a session that stepped a hundred times between
//! two folds costs one leaf page there instead of a hundred.
//!
//! # Files
//! Segments live beside the store file, named `<store file>.log-<number>`
//! (`number` a 20-digit, growing number). A segment is a [`MAGIC`], the
//! store file's identity (u64, little-endian: a random number the file
//! keeps, so that a log left beside a new file is never folded into it),
//! and then frames: payload length (u32, little-endian), CRC-32 of the
//! identity, the segment's number (u64, little-endian) and the payload
//! (u32), payload (length-delimited `LoggedWrite` messages).
//!
//! The last segment a fold covered is kept as `<store file>.log-spare`
//! and becomes the next segment, written over from its start: a sync
//! then writes data blocks the file already has and allocates none (on
//! ext4 on a VM, about a third less time per sync than appending,
//! `BENCHMARKS.md`, "The store's log"). Its old frames fail the checksum
//! under the new number, so a reader never takes them for new ones.
//!
//! # Invariants
//! - A frame is appended and synced before any of its records' tickets
//!   report durable; a frame whose write or sync failed is never
//!   appended to again ([`Log::append`]): its records are written anew to
//!   the next segment.
//! - A reader stops at a segment's first frame that is cut short or fails
//!   its checksum: everything after it was never reported durable (a
//!   crash during the write, or a write that failed). A crash during a
//!   batch of several frames may leave a prefix of it, in queue order:
//!   records never reported durable, as with a sync that did not return.
//! - A segment is removed only after a fold that covered it has committed
//!   and recorded its number in the store file ([`super::commit`]), so a
//!   segment the store file has folded is never read again, and one it has
//!   not is never lost.

use super::Write;
use crate::change::Change;
use crate::decode;
use crate::error::{StoreError, backend};
use crate::record::schema::LoggedWrite;
use prost::Message;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};

/// What a segment starts with.
const MAGIC: &[u8; 16] = b"pacpriv-log/1\n\0\0";

/// The mark and the store file's identity.
const HEADER: usize = MAGIC.len() + 8;

/// A frame's payload is closed once it reaches this size: a batch of
/// large records (long published vectors) spans several frames.
const FRAME_BYTES: usize = 16 << 20;

/// The largest payload a reader accepts (a frame closes at [`FRAME_BYTES`]
/// plus one record; anything larger is a corrupt length).
const MAX_FRAME: usize = 1 << 30;

/// The segments of one store file, and the one being appended to.
pub(super) struct Log {
    store: PathBuf,
    /// The store file's identity.
    id: u64,
    active: Option<Segment>,
    /// The number the next segment gets.
    next: u64,
}

struct Segment {
    number: u64,
    /// For messages.
    path: PathBuf,
    file: File,
    /// Where the next frame goes.
    end: u64,
}

impl Log {
    /// The log of the store file at `store` of identity `id`, its next
    /// segment numbered after `after`.
    pub(super) fn new(store: &Path, id: u64, after: u64) -> Log {
        Log { store: store.to_owned(), id, active: None, next: after + 1 }
    }

    /// Appends `batch` and syncs it, as one frame unless it is larger
    /// than [`FRAME_BYTES`] (then as several, written at once); opens a
    /// segment first if none is active.
    pub(super) fn append(&mut self, batch: &[Write]) -> Result<(), StoreError> {
        // Taken out, and put back only once the frames are synced: after a
        // failed write or sync (whose bytes may be partly there) the next
        // append opens a new segment.
        let mut segment = match self.active.take() {
            Some(s) => s,
            None => self.create()?,
        };
        // Each record is encoded straight into its frame, after room for
        // the frame's header, which is filled in once the frame closes.
        let mut frames = Vec::with_capacity(batch.len() * 1536);
        let mut start = 0;
        for (i, w) in batch.iter().enumerate() {
            if start == frames.len() {
                frames.extend_from_slice(&[0; 8]);
            }
            // Writing into a Vec cannot run out of room.
            let _ = logged(w).encode_length_delimited(&mut frames);
            let payload = frames.len() - start - 8;
            if payload >= FRAME_BYTES || i + 1 == batch.len() {
                let len = u32::try_from(payload).ok().filter(|&l| l as usize <= MAX_FRAME);
                let len = len.ok_or_else(|| backend("a record too large for a log frame"))?;
                let crc = checksum(self.id, segment.number, &frames[start + 8..]);
                frames[start..start + 4].copy_from_slice(&len.to_le_bytes());
                frames[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
                start = frames.len();
            }
        }
        let at = &segment.path;
        let failed = |e: std::io::Error| backend(format!("writing {}: {e}", at.display()));
        segment.file.write_all_at(&frames, segment.end).map_err(failed)?;
        segment.file.sync_data().map_err(failed)?;
        segment.end += frames.len() as u64;
        self.active = Some(segment);
        Ok(())
    }

    /// Closes the active segment for a fold and returns the number of the
    /// last segment opened so far: every record appended until now is in
    /// segments numbered at most that.
    pub(super) fn rotate(&mut self) -> u64 {
        self.active = None;
        self.next - 1
    }

    /// Opens segment `next` — the spare renamed, or a new file — with
    /// its header written and its name made durable. Its number is used
    /// up either way: after a failure the next try opens the next one (the
    /// spare may be gone by then), and the file is removed.
    fn create(&mut self) -> Result<Segment, StoreError> {
        let number = self.next;
        self.next += 1;
        let path = segment_path(&self.store, number);
        let failed = |e: std::io::Error| {
            // It holds no frame: nothing reported durable is lost with it.
            let _ = std::fs::remove_file(&path);
            backend(format!("creating {}: {e}", path.display()))
        };
        let file = match std::fs::rename(spare_path(&self.store), &path) {
            Ok(()) => OpenOptions::new().write(true).open(&path),
            Err(_) => OpenOptions::new().write(true).create_new(true).open(&path),
        }
        .map_err(failed)?;
        file.write_all_at(&header(self.id), 0).map_err(failed)?;
        file.sync_data().map_err(failed)?;
        sync_dir(&self.store).map_err(failed)?;
        Ok(Segment { number, path, file, end: HEADER as u64 })
    }
}

/// Every segment of the store file at `store`, by number.
///
/// # Errors
/// The directory cannot be read.
pub(super) fn segments(store: &Path) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let prefix = segment_prefix(store);
    let dir = directory(store);
    let entries = std::fs::read_dir(&dir).map_err(|e| backend(format!("reading {}: {e}", dir.display())))?;
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| backend(format!("reading {}: {e}", dir.display())))?;
        let name = entry.file_name();
        let number = name.to_str().and_then(|n| n.strip_prefix(&prefix)).and_then(|g| g.parse::<u64>().ok());
        if let Some(number) = number {
            found.push((number, entry.path()));
        }
    }
    found.sort_unstable();
    Ok(found)
}

/// The writes segment `number` at `path` of the store file of identity
/// `id` holds, in order, up to its first frame that is cut short or fails
/// its checksum (module invariants; a spare's old frames fail it too).
/// `None`: the segment belongs to another store file (one that was
/// deleted or replaced beside its log).
///
/// # Errors
/// The file cannot be read, it is not a segment, or a frame whose
/// checksum holds does not decode (a release that wrote something this
/// one cannot read: refused rather than skipped).
pub(super) fn read(id: u64, number: u64, path: &Path) -> Result<Option<Vec<Write>>, StoreError> {
    let bytes = std::fs::read(path).map_err(|e| backend(format!("reading {}: {e}", path.display())))?;
    let corrupt = |what: &str| backend(format!("{}: {what}", path.display()));
    if bytes.len() < HEADER {
        // A segment whose creation was cut short before its header was
        // synced holds nothing reported durable.
        return if MAGIC.starts_with(&bytes[..bytes.len().min(MAGIC.len())]) {
            Ok(Some(Vec::new()))
        } else {
            Err(corrupt("not a pacpriv log segment"))
        };
    }
    let (head, mut rest) = bytes.split_at(HEADER);
    if !head.starts_with(MAGIC) {
        return Err(corrupt("not a pacpriv log segment"));
    }
    if head[MAGIC.len()..] != id.to_le_bytes() {
        return Ok(None);
    }
    let mut writes = Vec::new();
    while let Some((head, after)) = rest.split_first_chunk::<8>() {
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
        let Some(mut payload) = after.get(..len).filter(|_| len <= MAX_FRAME) else { break };
        if checksum(id, number, payload) != crc {
            break;
        }
        rest = &after[len..];
        while !payload.is_empty() {
            let w = LoggedWrite::decode_length_delimited(&mut payload).map_err(|_| corrupt("undecodable write"))?;
            writes.push(unlogged(w)?);
        }
    }
    Ok(Some(writes))
}

/// Retires every segment numbered at most `through` (a fold that covered
/// them has committed): the last becomes the spare, the others are
/// removed. A segment that stays is skipped at the next start, where the
/// store file's recorded number says it was folded.
pub(super) fn retire_through(store: &Path, through: u64) {
    match segments(store) {
        Ok(found) => {
            let mut folded: Vec<_> = found.into_iter().filter(|(number, _)| *number <= through).collect();
            let last = folded.pop();
            for (_, path) in folded {
                if let Err(e) = std::fs::remove_file(&path) {
                    tracing::warn!(segment = %path.display(), error = %e, "a folded log segment could not be removed");
                }
            }
            if let Some((_, path)) = last
                && let Err(e) = std::fs::rename(&path, spare_path(store))
            {
                tracing::warn!(segment = %path.display(), error = %e, "a folded log segment could not be kept as the spare");
            }
        }
        Err(e) => tracing::warn!(error = %e, "folded log segments could not be listed"),
    }
}

/// A segment's first bytes.
fn header(id: u64) -> [u8; HEADER] {
    let mut h = [0; HEADER];
    h[..MAGIC.len()].copy_from_slice(MAGIC);
    h[MAGIC.len()..].copy_from_slice(&id.to_le_bytes());
    h
}

/// CRC-32 of a frame's payload in segment `number` of the store file of
/// identity `id`.
fn checksum(id: u64, number: u64, payload: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&id.to_le_bytes());
    crc.update(&number.to_le_bytes());
    crc.update(payload);
    crc.finalize()
}

/// A write in the log's form.
fn logged(w: &Write) -> LoggedWrite {
    let mut cache = Vec::new();
    crate::answers::append_ops(&w.change.cache, &mut cache);
    LoggedWrite {
        session: w.session.clone(),
        record: w.record.encode(),
        journal: w.change.journal.iter().map(|e| e.encode()).collect(),
        events: w.change.events.iter().map(|e| e.encode_sealed()).collect(),
        cache,
    }
}

/// A logged write back into a write (with no ticket: it was reported when
/// it was appended).
fn unlogged(w: LoggedWrite) -> Result<Write, StoreError> {
    let s = w.session.as_str();
    let record = decode::session_record(s, &w.record)?;
    let journal = w.journal.iter().map(|e| decode::journal_entry(s, e)).collect::<Result<_, _>>()?;
    let events = w.events.iter().map(|e| decode::journal_event(s, e)).collect::<Result<_, _>>()?;
    let cache = crate::answers::read_ops(&w.cache)
        .ok_or_else(|| StoreError::Corrupt { session: s.into(), reason: "undecodable logged cache writes".into() })?;
    let change = Change { journal, events, cache, ..Change::default() };
    Ok(Write { session: w.session, record, change, seq: 0, done: None })
}

fn segment_prefix(store: &Path) -> String {
    let name = store.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    format!("{name}.log-")
}

fn spare_path(store: &Path) -> PathBuf {
    directory(store).join(format!("{}spare", segment_prefix(store)))
}

fn segment_path(store: &Path, number: u64) -> PathBuf {
    directory(store).join(format!("{}{number:020}", segment_prefix(store)))
}

fn directory(store: &Path) -> PathBuf {
    match store.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// Makes a new file's name in the store's directory durable.
fn sync_dir(store: &Path) -> std::io::Result<()> {
    File::open(directory(store))?.sync_all()
}
