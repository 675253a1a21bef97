//! A session's cached answers as the store keeps them: in their own
//! tables beside the session record, not inside it, so a step writes what
//! it changed — one answer in, one out — however long the session has
//! lived (issue 27; `docs/assurance/accounting.md` §5).
//!
//! # Owns
//! [`CacheWrite`] (one change to a session's cached answers),
//! [`CacheProbe`] (a query a read looks for) and [`CacheRows`] (what a
//! read found), [`squash`], the one form both backends write, and the
//! tail form ([`append_ops`], [`read_ops`]) in which the embedded store
//! keeps a session's newest changes inside its record.
//!
//! # Invariants
//! - Cache writes are committed in the transaction of the session record
//!   they came with: a cached answer is never durable without the step
//!   that released it, and a step never without the answer it cached.
//! - Each owner's answers are numbered in the order they were answered;
//!   the session record keeps each owner's span (oldest … next − 1), so
//!   the rows of a session are exactly its spans, once its tail (if any)
//!   is applied after them in order. The store reads only an answer's
//!   owner, number and digest; what was released is the session's.
//! - Under `refuse`, an evicted answer leaves `(owner, first 8 bytes of its
//!   digest)` behind for the life of the session, under its number (the
//!   embedded store overwrites the answer's row with it; a database that
//!   looks evictions up by digest keys it by prefix).

use super::record::CachedAnswerRecord;
use crate::record::schema::{TailEviction, TailOp, TailRemembered, tail_op::Op};
use prost::Message;

/// One change to a session's cached answers.
#[derive(Clone, Debug, PartialEq)]
pub enum CacheWrite {
    /// A new answer (its owner, number and digest inside).
    Insert(CachedAnswerRecord),
    /// The owner's answer number `seq` leaves the cache; `remember`: its
    /// owner and digest prefix are kept (`refuse`).
    Evict {
        /// The owner.
        owner: u64,
        /// The answer's number.
        seq: u64,
        /// Whether a repeat is refused from now on.
        remember: bool,
    },
    /// An eviction a format-2 record remembered, moved to its table (and
    /// numbered before the record's cached answers).
    Remember {
        /// The owner.
        owner: u64,
        /// The number it is given.
        seq: u64,
        /// The evicted digest's first 8 bytes, little-endian.
        prefix: u64,
    },
}

/// A query a read looks for: its owner and digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheProbe {
    /// The owner it counts against.
    pub owner: u64,
    /// Its digest.
    pub digest: [u8; 32],
}

impl CacheProbe {
    /// The digest's first 8 bytes, little-endian: what an eviction leaves.
    pub fn prefix(&self) -> u64 {
        prefix(&self.digest)
    }
}

/// A digest's first 8 bytes, little-endian (0 for a digest shorter than 8
/// bytes, which a decoded answer never has).
pub fn prefix(digest: &[u8]) -> u64 {
    digest.get(..8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes)
}

/// What a read found of a session's cached answers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CacheRows {
    /// Answers found.
    pub entries: Vec<CachedAnswerRecord>,
    /// Evictions found: (owner, digest prefix).
    pub evicted: Vec<(u64, u64)>,
    /// `None`: every row the session has (the embedded store's resume);
    /// `Some`: only the rows of these probes were looked for.
    pub probed: Option<Vec<CacheProbe>>,
}

impl CacheRows {
    /// Nothing found of `probes`.
    pub fn none_found(probes: &[CacheProbe]) -> CacheRows {
        CacheRows { probed: Some(probes.to_vec()), ..CacheRows::default() }
    }
}

/// One step's cache writes in the form the backends apply: evictions
/// first, then inserts, then remembered prefixes. An answer inserted and
/// evicted by the same write (a multi-row request under a small
/// capacity) is never written; its prefix is remembered directly.
#[derive(Debug, Default, PartialEq)]
pub struct Squashed {
    /// (owner, seq, remember) of rows to delete.
    pub evict: Vec<(u64, u64, bool)>,
    /// Answers to insert.
    pub insert: Vec<CachedAnswerRecord>,
    /// (owner, seq, prefix) to remember besides the evicted rows'.
    pub remember: Vec<(u64, u64, u64)>,
}

impl Squashed {
    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.evict.is_empty() && self.insert.is_empty() && self.remember.is_empty()
    }
}

/// Appends `writes` to `out` as length-delimited `TailOp` messages (the
/// form of a session record's cache tail, which grows by appending).
pub fn append_ops<'a>(writes: impl IntoIterator<Item = &'a CacheWrite>, out: &mut Vec<u8>) {
    for w in writes {
        let op = match w {
            CacheWrite::Insert(answer) => Op::Insert(answer.clone()),
            &CacheWrite::Evict { owner, seq, remember } => Op::Evict(TailEviction { owner, seq, remember }),
            &CacheWrite::Remember { owner, seq, prefix } => Op::Remember(TailRemembered { owner, seq, prefix }),
        };
        // Writing into a Vec cannot run out of room.
        let _ = TailOp { op: Some(op) }.encode_length_delimited(out);
    }
}

/// The writes [`append_ops`] appended, in order; `None` for malformed
/// bytes.
pub fn read_ops(mut bytes: &[u8]) -> Option<Vec<CacheWrite>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        out.push(match TailOp::decode_length_delimited(&mut bytes).ok()?.op? {
            Op::Insert(answer) => CacheWrite::Insert(answer),
            Op::Evict(TailEviction { owner, seq, remember }) => CacheWrite::Evict { owner, seq, remember },
            Op::Remember(TailRemembered { owner, seq, prefix }) => CacheWrite::Remember { owner, seq, prefix },
        });
    }
    Some(out)
}

/// `writes` (in the order they happened) as [`Squashed`].
pub fn squash(writes: &[CacheWrite]) -> Squashed {
    let mut out = Squashed::default();
    for w in writes {
        match w {
            CacheWrite::Insert(answer) => out.insert.push(answer.clone()),
            &CacheWrite::Evict { owner, seq, remember } => {
                if let Some(at) = out.insert.iter().position(|a| a.owner == owner && a.seq == seq) {
                    let gone = out.insert.remove(at);
                    if remember {
                        out.remember.push((owner, seq, prefix(&gone.digest)));
                    }
                } else {
                    out.evict.push((owner, seq, remember));
                }
            }
            &CacheWrite::Remember { owner, seq, prefix } => out.remember.push((owner, seq, prefix)),
        }
    }
    out
}

#[cfg(test)]
mod test {
    use super::*;

    fn answer(owner: u64, seq: u64, d: u8) -> CachedAnswerRecord {
        CachedAnswerRecord { digest: vec![d; 32], owner, seq, ..Default::default() }
    }

    #[test]
    fn an_answer_inserted_and_evicted_in_one_write_is_only_remembered() {
        let writes = [
            CacheWrite::Insert(answer(1, 5, 7)),
            CacheWrite::Evict { owner: 1, seq: 4, remember: true },
            CacheWrite::Insert(answer(1, 6, 8)),
            CacheWrite::Evict { owner: 1, seq: 5, remember: true },
            CacheWrite::Remember { owner: 2, seq: 0, prefix: 9 },
        ];
        let s = squash(&writes);
        assert_eq!(s.evict, [(1, 4, true)]);
        assert_eq!(s.insert, [answer(1, 6, 8)]);
        assert_eq!(s.remember, [(1, 5, u64::from_le_bytes([7; 8])), (2, 0, 9)]);
        let forgotten =
            squash(&[CacheWrite::Insert(answer(1, 5, 7)), CacheWrite::Evict { owner: 1, seq: 5, remember: false }]);
        assert!(forgotten.is_empty(), "{forgotten:?}");
    }

    #[test]
    fn a_tail_reads_back_the_writes_appended_in_order_and_refuses_garbage() {
        let first = [CacheWrite::Remember { owner: 2, seq: 0, prefix: u64::MAX }, CacheWrite::Insert(answer(1, 5, 7))];
        let second = [CacheWrite::Evict { owner: 1, seq: 5, remember: true }, CacheWrite::Insert(answer(1, 6, 8))];
        let mut tail = Vec::new();
        append_ops(&first, &mut tail);
        append_ops(&second, &mut tail);
        assert_eq!(read_ops(&tail), Some([first, second].concat()));
        assert_eq!(read_ops(&[]), Some(Vec::new()));
        assert_eq!(read_ops(&tail[..tail.len() - 1]), None, "a cut tail");
        assert_eq!(read_ops(&[0x02, 0xFF, 0xFF]), None);
        assert_eq!(read_ops(&[0x00]), None, "an op that is none of the three");
    }
}
