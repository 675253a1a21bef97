//! pacpriv-records: the store's records and their byte form, what a redb
//! value or a PostgreSQL `BYTEA` column holds, and what an export's lines
//! carry.
//!
//! Below the store (`pacpriv-store`, its two backends) and the offline
//! verifier (`pacpriv-verify`), which reads a journal without linking a
//! server: this crate needs only the privacy crate and prost
//! (`docs/architecture.md`, "Crates").
//!
//! # Owns
//! [`SessionRecord`], [`JournalEntry`], [`JournalEvent`] and the encoding of
//! [`PrincipalRecord`]: the schema is `proto/pacpriv/store/v1/records.proto`
//! (prost messages, [`schema`]), behind an 8-byte [`MARK`].
//!
//! # Invariants
//! - Every value written is [`MARK`] then a message whose `format` field is
//!   [`FORMAT`] ([`SESSION_FORMAT`] for a session record). Decoding reads
//!   the current format and every format a release has written (`legacy`:
//!   the unmarked format 1), and refuses a format it does not know rather
//!   than guess.
//! - Decoding is total: malformed bytes are `None` (the caller reports the
//!   record corrupt), never a panic.
//! - The store never interprets a cached answer: it keeps the schema's
//!   [`CachedAnswerRecord`] as written by the service's sessions, reading
//!   only its owner, number and digest (`pacpriv_store::answers`).

#![forbid(unsafe_code)]

mod legacy;
pub mod principal;

/// The schema of the store's records (`proto/pacpriv/store/v1/records.proto`,
/// compiled by `build.rs`).
#[allow(missing_docs, clippy::all)]
pub mod schema {
    include!(concat!(env!("OUT_DIR"), "/pacpriv.store.v1.rs"));
}

use pacpriv_privacy::ledger::{Ledger, Policy};
use pacpriv_privacy::mechanism::SessionState;
use pacpriv_privacy::posterior::{Form, Posterior};
use pacpriv_privacy::{Nats, PrivacyError};
use principal::{Origin, PrincipalRecord};
use prost::Message;
use sha2::{Digest, Sha256};

pub use schema::JournalEvent;
pub use schema::JournalStep as JournalStepRecord;
pub use schema::{
    AnswerCache as AnswerCacheRecord, CacheOwner as CacheOwnerRecord, CachedAnswer as CachedAnswerRecord,
};
pub use schema::{Evicted as EvictedRecord, Evidence as EvidenceRecord, Published as PublishedRecord};

/// First 8 bytes of every value of the current encoding. A format-1
/// session record or journal entry starts with its version, which never
/// reaches 2⁶⁴ − 1, so none starts with the mark; a format-1 principal
/// record starts with a key digest (which might, with odds of 2⁻⁶⁴), so a
/// principal that does not decode as marked is read as format 1.
pub const MARK: [u8; 8] = [0xFF; 8];

/// The format written now (1 was the unmarked hand-written codec).
pub const FORMAT: u32 = 2;

/// The format of a principal record with per-dataset budgets. A release
/// that knows only [`FORMAT`] refuses it: read as format 2 it would lose
/// them, and a record it rewrote (a key rotated) would give the principal
/// its default budget in every dataset.
pub const PRINCIPAL_BUDGETS_FORMAT: u32 = 3;

/// The format a session record is written in now: 3, the answer cache in
/// its own tables. A release that knows only format 2 refuses such a
/// record (it would read it as a session with an empty cache), so replicas
/// of mixed releases never answer a repeat afresh.
pub const SESSION_FORMAT: u32 = 3;

/// The format of a session record that carries a cache tail (the
/// embedded store's newest cache changes, `pacpriv_store::embedded`); one without
/// is still written as [`SESSION_FORMAT`].
pub const TAIL_FORMAT: u32 = 4;

/// [`MARK`] then `message`.
fn seal(message: &impl Message) -> Vec<u8> {
    let mut out = Vec::with_capacity(MARK.len() + message.encoded_len());
    out.extend_from_slice(&MARK);
    // Writing into a Vec cannot run out of room.
    let _ = message.encode(&mut out);
    out
}

/// The message after [`MARK`], if `bytes` carry one whose format
/// `known` accepts; `Err(bytes)` for an unmarked (format-1) value.
fn open<M: Message + Default>(bytes: &[u8], known: impl Fn(&M) -> bool) -> Result<Option<M>, &[u8]> {
    let Some(body) = bytes.strip_prefix(&MARK) else { return Err(bytes) };
    Ok(M::decode(body).ok().filter(known))
}

/// One session's durable state after `version` answered queries.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionRecord {
    /// Answered queries so far (0: fresh).
    pub version: u64,
    /// The posterior, in the form the session holds it.
    pub posterior: Form,
    /// MI spent.
    pub spent: f64,
    /// Session limit when written.
    pub limit: f64,
    /// Answers released.
    pub answered: u64,
    /// Answers charged.
    pub charged: u64,
    /// A format-2 record's inline answer cache, as the session wrote it
    /// (`None`: none, and always in format 3, which keeps cached answers
    /// in their own tables).
    pub cache: Option<AnswerCacheRecord>,
    /// Format 3: each cache owner's span of numbered answers.
    pub cache_owners: Vec<CacheOwnerRecord>,
    /// The chain hash of the session's last journal entry (`None`: no
    /// entry yet, or none journaled).
    pub journal_head: Option<[u8; 32]>,
    /// Journal events (cache hits, refusals) so far.
    pub journal_events: u64,
    /// The commitment to the noise key of the dataset whose secret the
    /// posterior is about (`None` in records written before it was kept):
    /// the session resumes in that dataset only.
    pub dataset: Option<[u8; 32]>,
}

impl SessionRecord {
    /// Snapshot of `state` at `version` with its cache owners' spans.
    pub fn of(state: &SessionState, cache_owners: Vec<CacheOwnerRecord>, version: u64) -> Self {
        SessionRecord {
            journal_head: None,
            journal_events: 0,
            dataset: None,
            version,
            posterior: state.posterior.form().clone(),
            spent: state.ledger.spent().get(),
            limit: state.ledger.limit().get(),
            answered: state.ledger.answered(),
            charged: state.ledger.charged(),
            cache: None,
            cache_owners,
        }
    }

    /// Back to a session state, with the configured b, policy and limit
    /// (the operator may change the limit; spending is never forgotten).
    ///
    /// # Errors
    /// Values outside their domain (a corrupt record).
    pub fn restore(&self, per_query: Nats, limit: Nats, policy: Policy) -> Result<SessionState, PrivacyError> {
        Ok(SessionState {
            posterior: Posterior::restore(self.posterior.clone())?,
            ledger: Ledger::restore(per_query, limit, policy, Nats::new(self.spent)?, self.answered, self.charged)?,
        })
    }

    /// The byte form ([`MARK`], format [`SESSION_FORMAT`]).
    pub fn encode(&self) -> Vec<u8> {
        self.encode_with_tail(Vec::new())
    }

    /// The byte form carrying `tail` (cache changes in the form of
    /// `pacpriv_store::answers::append_ops`): format [`TAIL_FORMAT`] if there
    /// are any, else as [`SessionRecord::encode`]. Read it back with
    /// [`cache_tail`]; [`SessionRecord::decode`] skips it.
    pub fn encode_with_tail(&self, tail: Vec<u8>) -> Vec<u8> {
        let (log_weights, weights) = self.posterior.to_fields();
        seal(&schema::SessionRecord {
            format: if tail.is_empty() { SESSION_FORMAT } else { TAIL_FORMAT },
            cache_tail: tail,
            version: self.version,
            spent: self.spent,
            limit: self.limit,
            answered: self.answered,
            charged: self.charged,
            log_weights,
            weights,
            cache: self.cache.clone(),
            journal_head: self.journal_head.map(|h| h.to_vec()).unwrap_or_default(),
            journal_events: self.journal_events,
            cache_owners: self.cache_owners.clone(),
            dataset: self.dataset.map(|d| d.to_vec()).unwrap_or_default(),
        })
    }

    /// Reads any format a release has written; `None` for malformed bytes.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        match open(bytes, |m: &schema::SessionRecord| [FORMAT, SESSION_FORMAT, TAIL_FORMAT].contains(&m.format)) {
            Ok(m) => m.and_then(|m| {
                Some(SessionRecord {
                    version: m.version,
                    posterior: Form::from_fields(m.log_weights, m.weights)?,
                    spent: m.spent,
                    limit: m.limit,
                    answered: m.answered,
                    charged: m.charged,
                    cache: m.cache,
                    journal_head: m.journal_head.as_slice().try_into().ok(),
                    journal_events: m.journal_events,
                    cache_owners: m.cache_owners,
                    dataset: m.dataset.as_slice().try_into().ok(),
                })
            }),
            Err(unmarked) => legacy::session(unmarked),
        }
    }
}

/// The cache tail of a session record's bytes (empty for a record without
/// one, of any format), without decoding the rest; `None` for malformed
/// bytes.
pub fn cache_tail(bytes: &[u8]) -> Option<Vec<u8>> {
    match open(bytes, |_: &schema::SessionRecordTail| true) {
        Ok(m) => m.map(|m| m.cache_tail),
        Err(_unmarked) => Some(Vec::new()),
    }
}

/// One answered query, as journaled (when enabled).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JournalEntry {
    /// The session version this answer produced.
    pub version: u64,
    /// The client's query id.
    pub query_id: String,
    /// MI charged.
    pub charge: f64,
    /// The log-likelihood vector applied to the posterior (empty for an
    /// exact unanimous answer, which leaves the posterior unchanged).
    pub log_likelihood: Vec<f64>,
    /// How the posterior applied it: an
    /// [`UpdateRule`](pacpriv_privacy::posterior::UpdateRule) code (0 in
    /// entries written before the grouped rule existed).
    pub update_rule: u32,
    /// What the step used and released (`None` in entries written before
    /// steps were journaled in full).
    pub step: Option<JournalStepRecord>,
    /// The entry's chain hash ([`JournalEntry::chained`]); empty in
    /// entries written before the chain existed.
    pub chain: Vec<u8>,
}

/// Domain separation for the journal's hash chain.
const CHAIN_DOMAIN: &[u8] = b"pacpriv-journal/1";

impl JournalEntry {
    /// The chain hash a session starts from: a function of its key alone,
    /// so an export cannot splice one session's entries onto another's.
    pub fn genesis(session: &str) -> [u8; 32] {
        Sha256::new().chain_update(CHAIN_DOMAIN).chain_update(b" genesis ").chain_update(session).finalize().into()
    }

    /// This entry's chain hash after `prev` (the previous entry's, or
    /// [`JournalEntry::genesis`]): SHA-256 of the domain, `prev` and the
    /// entry's encoding with `chain` left empty. Changing, dropping,
    /// reordering or inserting an entry changes every later hash.
    pub fn chained(&self, prev: &[u8; 32]) -> [u8; 32] {
        let body = JournalEntry { chain: Vec::new(), ..self.clone() }.encode();
        Sha256::new().chain_update(CHAIN_DOMAIN).chain_update(prev).chain_update(&body).finalize().into()
    }

    /// The byte form ([`MARK`], format [`FORMAT`]).
    pub fn encode(&self) -> Vec<u8> {
        seal(&schema::JournalEntry {
            format: FORMAT,
            version: self.version,
            query_id: self.query_id.clone(),
            charge: self.charge,
            log_likelihood: self.log_likelihood.clone(),
            step: self.step.clone(),
            chain: self.chain.clone(),
            update_rule: self.update_rule,
        })
    }

    /// Reads any format a release has written; `None` for malformed bytes.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        match open(bytes, |m: &schema::JournalEntry| m.format == FORMAT) {
            Ok(m) => m.map(|m| JournalEntry {
                version: m.version,
                query_id: m.query_id,
                charge: m.charge,
                log_likelihood: m.log_likelihood,
                update_rule: m.update_rule,
                step: m.step,
                chain: m.chain,
            }),
            Err(unmarked) => legacy::journal(unmarked),
        }
    }
}

/// Domain separation for the events in the journal's hash chain.
const EVENT_DOMAIN: &[u8] = b"pacpriv-journal-event/1";

/// What a journal event was: a query answered from the cache, or refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The session's earlier answer, released again (free).
    CacheHit,
    /// The budget could not pay for the request.
    Exhausted,
    /// Not unanimous under the `unanimous_only` policy.
    Contested,
    /// A repeat whose cached answer was evicted, under `refuse`.
    EvictedRepeat,
    /// A repeat asking for a noisy vector that was not kept.
    NoisyNotKept,
}

impl EventKind {
    const ALL: [EventKind; 5] = [
        EventKind::CacheHit,
        EventKind::Exhausted,
        EventKind::Contested,
        EventKind::EvictedRepeat,
        EventKind::NoisyNotKept,
    ];

    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::CacheHit => "cache_hit",
            EventKind::Exhausted => "exhausted",
            EventKind::Contested => "contested",
            EventKind::EvictedRepeat => "evicted_repeat",
            EventKind::NoisyNotKept => "noisy_not_kept",
        }
    }

    /// The kind spelled `s`, if any.
    pub fn parse(s: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl JournalEvent {
    /// This event's chain hash after `prev` (the chain hash of whatever
    /// the session journaled last, entry or event, or its genesis).
    pub fn chained(&self, prev: &[u8; 32]) -> [u8; 32] {
        let body = seal(&JournalEvent { chain: Vec::new(), format: FORMAT, ..self.clone() });
        Sha256::new().chain_update(EVENT_DOMAIN).chain_update(prev).chain_update(&body).finalize().into()
    }

    /// The byte form ([`MARK`], format [`FORMAT`]).
    pub fn encode_sealed(&self) -> Vec<u8> {
        seal(&JournalEvent { format: FORMAT, ..self.clone() })
    }

    /// Reads the byte form; `None` for malformed bytes or another format.
    pub fn decode_sealed(bytes: &[u8]) -> Option<Self> {
        open(bytes, |m: &JournalEvent| m.format == FORMAT).ok().flatten()
    }

    /// Its kind (`None`: a kind this release does not know).
    pub fn event_kind(&self) -> Option<EventKind> {
        EventKind::parse(&self.kind)
    }
}

/// One item of a session's journal.
#[derive(Clone, Debug, PartialEq)]
pub enum Journaled {
    /// A step.
    Entry(JournalEntry),
    /// A cache hit or a refusal.
    Event(JournalEvent),
}

/// A session's entries (version order) and events (sequence order) in
/// the order they were chained: an event after the entry of its
/// `after_version`, before the next.
pub fn chain_order(entries: Vec<JournalEntry>, events: Vec<JournalEvent>) -> Vec<Journaled> {
    let mut out = Vec::with_capacity(entries.len() + events.len());
    let mut events = events.into_iter().peekable();
    for entry in entries {
        while let Some(e) = events.next_if(|e| e.after_version < entry.version) {
            out.push(Journaled::Event(e));
        }
        out.push(Journaled::Entry(entry));
    }
    out.extend(events.map(Journaled::Event));
    out
}

/// A principal's byte form in the embedded store (PostgreSQL keeps
/// columns; the name is the key, not part of the value).
pub fn encode_principal(p: &PrincipalRecord) -> Vec<u8> {
    seal(&schema::PrincipalRecord {
        format: if p.dataset_budgets.is_empty() { FORMAT } else { PRINCIPAL_BUDGETS_FORMAT },
        key_sha256: p.key_sha256.to_vec(),
        budget: p.budget,
        origin: p.origin.as_str().to_owned(),
        created_unix: p.created_unix,
        revoked_unix: p.revoked_unix,
        dataset_budgets: p.dataset_budgets.clone(),
    })
}

/// Reads a principal called `name` in any format a release has written;
/// `None` for malformed bytes.
pub fn decode_principal(name: &str, bytes: &[u8]) -> Option<PrincipalRecord> {
    let known = |m: &schema::PrincipalRecord| m.format == FORMAT || m.format == PRINCIPAL_BUDGETS_FORMAT;
    let marked = open(bytes, known).ok().flatten().and_then(|m| {
        Some(PrincipalRecord {
            name: name.to_owned(),
            key_sha256: m.key_sha256.as_slice().try_into().ok()?,
            budget: m.budget,
            origin: Origin::parse(&m.origin)?,
            created_unix: m.created_unix,
            revoked_unix: m.revoked_unix,
            dataset_budgets: m.dataset_budgets,
        })
    });
    marked.or_else(|| legacy::principal(name, bytes))
}

#[cfg(test)]
mod test;
