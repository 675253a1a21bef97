//! Stored bytes back into records, for both backends: corrupt bytes are
//! reported as such, naming the session.

use super::error::StoreError;
use super::record::{self, JournalEntry, JournalEvent, SessionRecord};

/// `session`'s stored record, decoded (both backends; corrupt bytes are
/// reported as such, naming the session).
pub(super) fn session_record(session: &str, bytes: &[u8]) -> Result<SessionRecord, StoreError> {
    SessionRecord::decode(bytes)
        .ok_or_else(|| StoreError::Corrupt { session: session.into(), reason: "undecodable record".into() })
}

/// One of `session`'s stored journal entries, decoded (both backends).
pub(super) fn journal_entry(session: &str, bytes: &[u8]) -> Result<JournalEntry, StoreError> {
    JournalEntry::decode(bytes)
        .ok_or_else(|| StoreError::Corrupt { session: session.into(), reason: "undecodable journal entry".into() })
}

/// One of `session`'s stored journal events, decoded (both backends).
pub(super) fn journal_event(session: &str, bytes: &[u8]) -> Result<JournalEvent, StoreError> {
    JournalEvent::decode_sealed(bytes)
        .ok_or_else(|| StoreError::Corrupt { session: session.into(), reason: "undecodable journal event".into() })
}

/// One of `session`'s stored cached answers, decoded (both backends).
pub(super) fn cached_answer(session: &str, bytes: &[u8]) -> Result<record::CachedAnswerRecord, StoreError> {
    <record::CachedAnswerRecord as prost::Message>::decode(bytes)
        .map_err(|_| StoreError::Corrupt { session: session.into(), reason: "undecodable cached answer".into() })
}
