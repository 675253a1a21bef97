//! `ExportJournal`: every session's journal and record, streamed one
//! session after another, in the store's own byte form (what `pacpriv
//! admin export` turns into JSON Lines for `pacpriv verify`).
//!
//! Each session is read from one snapshot of the store, so its record
//! matches its last entry even while it keeps answering.

use crate::proto::pacpriv::journaled::Item;
use crate::proto::pacpriv::{JournalChunk, Journaled as JournaledItem};
use crate::server::App;
use crate::server::status::ServiceError;
use pacpriv_store::{Journaled, SessionRecord};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

/// Entries per chunk: keeps a message well under the 4 MiB default limit
/// (an entry of 128 teachers is ~2 KiB; vector mode at d = 1000 ~1 MiB is
/// the exception, sent one per chunk by the same rule).
const CHUNK_BYTES: usize = 1 << 20;

/// The response stream.
pub type ChunkStream = ReceiverStream<Result<JournalChunk, Status>>;

/// Refuses when nothing is journaled: an export would hold records and no
/// steps, and verify could only fail.
///
/// # Errors
/// `FAILED_PRECONDITION` naming the setting.
pub fn parse(app: &App) -> Result<(), Status> {
    if app.sessions.journaled() {
        Ok(())
    } else {
        Err(Status::failed_precondition(
            "the journal is off on this server: set store.journal = true (PACPRIV_STORE__JOURNAL=true); sessions \
             journal from their next step, and `pacpriv verify` needs a session's journal from its first step",
        ))
    }
}

/// Streams every session's chunks.
pub fn apply(app: Arc<App>) -> ChunkStream {
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        if let Err(e) = send_all(&app, &tx).await {
            let _ = tx.send(Err(e.into())).await;
        }
    });
    ReceiverStream::new(rx)
}

async fn send_all(app: &App, tx: &mpsc::Sender<Result<JournalChunk, Status>>) -> Result<(), ServiceError> {
    for key in app.sessions.session_keys().await? {
        let (record, journal) = app.sessions.journal_of(&key).await?;
        let Some(record) = record else { continue };
        let mut chunk = JournalChunk { session: key.clone(), ..Default::default() };
        let mut size = 0;
        for item in journal {
            let item = match item {
                Journaled::Entry(e) if e.version <= record.version => Item::Entry(e.encode()),
                Journaled::Event(e) if e.seq <= record.journal_events => Item::Event(e.encode_sealed()),
                _ => continue,
            };
            let (Item::Entry(bytes) | Item::Event(bytes)) = &item;
            let len = bytes.len();
            if size + len > CHUNK_BYTES && !chunk.journal.is_empty() {
                let full = std::mem::replace(&mut chunk, JournalChunk { session: key.clone(), ..Default::default() });
                if tx.send(Ok(full)).await.is_err() {
                    return Ok(()); // the client went away
                }
                size = 0;
            }
            size += len;
            chunk.journal.push(JournaledItem { item: Some(item) });
        }
        chunk.record = SessionRecord { cache: None, ..record }.encode();
        if tx.send(Ok(chunk)).await.is_err() {
            return Ok(());
        }
    }
    Ok(())
}
