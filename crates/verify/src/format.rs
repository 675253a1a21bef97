//! The journal export: JSON Lines, what `pacpriv admin export` writes and
//! `pacpriv verify` reads.
//!
//! ```text
//! {"format":"pacpriv-journal-export/2"}
//! {"session":"alice","version":1,"query_id":"…","charge":…,"step":{…},"log_likelihood":[…],"chain":"…"}
//! {"session":"alice","event":1,"after_version":1,"kind":"cache_hit","query_id":"…","step":{…},…,"chain":"…"}
//! …every entry and event of alice, in chain order…
//! {"session":"alice","record":{"version":…,"spent":…,"log_weights":[…] or "weights":[…],"journal_head":"…",…}}
//! …the next session…
//! ```
//!
//! # Invariants
//! - A line converts to and from the store's [`JournalEntry`] without
//!   loss: every float is written in its shortest round-trip form and read
//!   back exactly (serde_json `float_roundtrip`), and −∞ (a saturated
//!   log-weight) is written as the string "-inf". So the chain hash a
//!   verifier recomputes from a line is the one the server computed.

use pacpriv_records::JournalStepRecord;
use pacpriv_records::{JournalEntry, JournalEvent, SessionRecord};
use serde::{Deserialize, Serialize};

/// The first line's `format`: 2 adds each step's `model` and
/// `model_version`; 3 each noisy step's `noise_key` (the commitment to the
/// dataset's noise key its draw came from) and a vector-mode step's
/// `basis` and `rank` (the path Σ was calibrated on); 4 the basis path 3
/// (issue 70: at d > m, the coefficients from K), which a reader of 3
/// would not know — so that such a reader refuses the export rather than
/// audit those steps as journals from before paths; 5 each step's
/// `calibration` rules and the SVD path's rank (issue 70: the SVD keeps
/// only its strong directions), which a reader of 4 would not know.
pub const FORMAT: &str = "pacpriv-journal-export/5";

/// The formats this release reads, oldest first: every one a release has
/// written (1 is 2 without models, 2 is 3 without noise keys: audited
/// statistically; 3 is 4 without basis path 3; 4 is 5 with the SVD
/// keeping all its directions).
pub const READS: [&str; 5] = [
    "pacpriv-journal-export/1",
    "pacpriv-journal-export/2",
    "pacpriv-journal-export/3",
    "pacpriv-journal-export/4",
    FORMAT,
];

/// The first line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// [`FORMAT`].
    pub format: String,
}

/// A session's stored record, after its entries.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionLine {
    /// The session key.
    pub session: String,
    /// The record.
    pub record: RecordLine,
}

/// One line of an export.
#[derive(Debug)]
pub enum Line {
    /// The first line.
    Header(Header),
    /// A journal entry (a step).
    Entry(Box<EntryLine>),
    /// A journal event (a cache hit or a refusal).
    Event(Box<EventLine>),
    /// A session's record.
    Session(SessionLine),
}

impl Line {
    /// Parses one line: an entry (by far the most common, tried first),
    /// an event, a session's record, or the header.
    ///
    /// # Errors
    /// What was wrong with it read as an entry.
    pub fn parse(text: &str) -> Result<Line, serde_json::Error> {
        match serde_json::from_str::<EntryLine>(text) {
            Ok(e) => Ok(Line::Entry(Box::new(e))),
            Err(e) => serde_json::from_str(text)
                .map(|e| Line::Event(Box::new(e)))
                .or_else(|_| serde_json::from_str(text).map(Line::Session))
                .or_else(|_| serde_json::from_str(text).map(Line::Header))
                .map_err(|_| e),
        }
    }
}

/// A journal entry.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntryLine {
    /// The session key.
    pub session: String,
    /// The version the step produced.
    pub version: u64,
    /// The client's query id.
    pub query_id: String,
    /// The charge, nats.
    pub charge: f64,
    /// What the step used and released.
    pub step: StepLine,
    /// The Eq. 4 vector applied (empty: none).
    pub log_likelihood: Vec<f64>,
    /// How the posterior applied it (`UpdateRule` code; absent = 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub update_rule: u32,
    /// The chain hash, hex.
    pub chain: String,
}

/// A journal event.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventLine {
    /// The session key.
    pub session: String,
    /// Its sequence number (1, 2, …).
    pub event: u64,
    /// The session's version when it happened.
    pub after_version: u64,
    /// `cache_hit`, or the refusal.
    pub kind: String,
    /// The client's query id.
    pub query_id: String,
    /// The digest and terms; a cache hit's release; a contested query's
    /// teacher outputs.
    pub step: StepLine,
    /// MI spent before it.
    pub spent: f64,
    /// What an exhausted request needed.
    pub need: f64,
    /// The chain hash, hex.
    pub chain: String,
}

/// [`JournalStepRecord`] in JSON.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepLine {
    /// Query digest, hex (empty without the answer cache).
    pub digest: String,
    /// b.
    pub per_query: f64,
    /// The limit.
    pub limit: f64,
    /// The charging policy.
    pub policy: String,
    /// Label mode: d and one label per teacher.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub classes: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    /// Label mode: each teacher's label.
    pub labels: Vec<u32>,
    /// Vector mode: d.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dim: u32,
    /// Vector mode: the m × d outputs, row-major.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vectors: Vec<f64>,
    /// The published release.
    pub published: Vec<f64>,
    /// Its argmax, the released label.
    pub label: u32,
    /// The private model that answered (export format 2; empty in items
    /// written before models were recorded, and in refusals).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    /// Its version.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model_version: String,
    /// SHA-256 commitment to the noise key the step's draw came from, hex
    /// (export format 3; empty for a step drawn before keys existed, a
    /// unanimous step and an event).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub noise_key: String,
    /// Vector mode: the basis path Σ was calibrated on (export format 3;
    /// 0: not recorded, 1: the SVD, 2: a Gram matrix, 3: K with the
    /// coefficients from K, 4: with the orthonormality check from K's G
    /// too; `privacy::vector::Path::code`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub basis: u32,
    /// The directions the path kept (0 for the SVD: all of them, as
    /// before issue 70).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rank: u32,
    /// The calibration rules the server followed (export format 5; 0: not
    /// recorded; `privacy::vector::RULES`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub calibration: u32,
}

fn is_zero(x: &u32) -> bool {
    *x == 0
}

/// A session's stored record (its answer cache left out).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordLine {
    /// Steps taken.
    pub version: u64,
    /// MI spent.
    pub spent: f64,
    /// The limit when written.
    pub limit: f64,
    /// Answers released.
    pub answered: u64,
    /// Answers charged.
    pub charged: u64,
    /// The posterior's log-weights (empty when it is in linear form).
    #[serde(with = "floats")]
    pub log_weights: Vec<f64>,
    /// The posterior's linear weights (absent when it is in log form).
    #[serde(default, with = "floats", skip_serializing_if = "Vec::is_empty")]
    pub weights: Vec<f64>,
    /// The chain hash of the last entry or event, hex (empty: none).
    pub journal_head: String,
    /// Events journaled.
    #[serde(default)]
    pub journal_events: u64,
}

impl EntryLine {
    /// The line of `entry` of `session`.
    pub fn of(session: &str, entry: &JournalEntry) -> Self {
        EntryLine {
            session: session.to_owned(),
            version: entry.version,
            query_id: entry.query_id.clone(),
            charge: entry.charge,
            step: StepLine::of(entry.step.clone().unwrap_or_default()),
            log_likelihood: entry.log_likelihood.clone(),
            update_rule: entry.update_rule,
            chain: hex(&entry.chain),
        }
    }

    /// Back to the store's entry (`None`: a hex field is not hex).
    pub fn entry(&self) -> Option<JournalEntry> {
        Some(JournalEntry {
            version: self.version,
            query_id: self.query_id.clone(),
            charge: self.charge,
            log_likelihood: self.log_likelihood.clone(),
            update_rule: self.update_rule,
            step: Some(self.step.record()?),
            chain: unhex(&self.chain)?,
        })
    }
}

impl EventLine {
    /// The line of `event` of `session`.
    pub fn of(session: &str, event: &JournalEvent) -> Self {
        EventLine {
            session: session.to_owned(),
            event: event.seq,
            after_version: event.after_version,
            kind: event.kind.clone(),
            query_id: event.query_id.clone(),
            step: StepLine::of(event.step.clone().unwrap_or_default()),
            spent: event.spent,
            need: event.need,
            chain: hex(&event.chain),
        }
    }

    /// Back to the store's event (`None`: a hex field is not hex).
    pub fn event(&self) -> Option<JournalEvent> {
        Some(JournalEvent {
            format: 0,
            seq: self.event,
            after_version: self.after_version,
            query_id: self.query_id.clone(),
            kind: self.kind.clone(),
            step: Some(self.step.record()?),
            spent: self.spent,
            need: self.need,
            chain: unhex(&self.chain)?,
        })
    }
}

impl StepLine {
    fn of(step: JournalStepRecord) -> Self {
        StepLine {
            digest: hex(&step.digest),
            per_query: step.per_query,
            limit: step.limit,
            policy: step.policy,
            classes: step.classes,
            labels: step.labels,
            dim: step.dim,
            vectors: step.vectors,
            published: step.published,
            label: step.label,
            model: step.model,
            model_version: step.model_version,
            noise_key: hex(&step.noise_key),
            basis: step.basis,
            rank: step.rank,
            calibration: step.calibration,
        }
    }

    /// Back to the store's form (`None`: the digest is not hex).
    fn record(&self) -> Option<JournalStepRecord> {
        Some(JournalStepRecord {
            digest: unhex(&self.digest)?,
            per_query: self.per_query,
            limit: self.limit,
            policy: self.policy.clone(),
            classes: self.classes,
            labels: self.labels.clone(),
            dim: self.dim,
            vectors: self.vectors.clone(),
            published: self.published.clone(),
            label: self.label,
            model: self.model.clone(),
            model_version: self.model_version.clone(),
            noise_key: unhex(&self.noise_key)?,
            basis: self.basis,
            rank: self.rank,
            calibration: self.calibration,
        })
    }
}

impl RecordLine {
    /// The line of `record`.
    pub fn of(record: &SessionRecord) -> Self {
        let (log_weights, weights) = record.posterior.to_fields();
        RecordLine {
            version: record.version,
            spent: record.spent,
            limit: record.limit,
            answered: record.answered,
            charged: record.charged,
            log_weights,
            weights,
            journal_head: record.journal_head.map(|h| hex(&h)).unwrap_or_default(),
            journal_events: record.journal_events,
        }
    }
}

/// Lowercase hex, two digits per byte.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of lowercase or uppercase hex; `None` for anything else.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// Floats that may be infinite: numbers, or the strings "inf" / "-inf".
mod floats {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Float {
        Number(f64),
        Text(String),
    }

    pub fn serialize<S: Serializer>(values: &[f64], s: S) -> Result<S::Ok, S::Error> {
        let out: Vec<Float> = values
            .iter()
            .map(|&v| if v.is_finite() { Float::Number(v) } else { Float::Text(format!("{v}")) })
            .collect();
        out.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        Vec::<Float>::deserialize(d)?
            .into_iter()
            .map(|f| match f {
                Float::Number(v) => Ok(v),
                Float::Text(t) if t == "-inf" => Ok(f64::NEG_INFINITY),
                Float::Text(t) if t == "inf" => Ok(f64::INFINITY),
                Float::Text(t) => Err(serde::de::Error::custom(format!("{t:?} is not a number"))),
            })
            .collect()
    }
}
