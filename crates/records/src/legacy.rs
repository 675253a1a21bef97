//! Format 1: the hand-written little-endian codec that releases wrote
//! before the records had a schema (fixtures:
//! `tests/fixtures/store-format-1/`). Read-only: nothing writes it now.
//!
//! A session record was version, spent, limit, answered, charged (8 bytes
//! each), a u32 count and that many f64 log-weights, then — if any bytes
//! remain — the answer cache, itself in one of two layouts: unmarked
//! (entries of the one principal), or marked by a u32 count of 2³² − 1 and
//! a layout byte 2 (entries partitioned by owner).

use crate::principal::{Origin, PrincipalRecord};
use crate::schema;
use pacpriv_privacy::posterior::Form;

/// Reads little-endian values from the front of a byte slice (the rest
/// stays in `.0`); `None` when the bytes run out.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take::<4>().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take::<8>().map(u64::from_le_bytes)
    }

    fn f64(&mut self) -> Option<f64> {
        self.u64().map(f64::from_bits)
    }

    fn floats(&mut self) -> Option<Vec<f64>> {
        let n = self.u32()? as usize;
        // Never trust a count for an allocation: each float needs 8 bytes.
        (n <= self.0.len() / 8).then_some(())?;
        (0..n).map(|_| self.f64()).collect()
    }
}

pub(super) fn session(bytes: &[u8]) -> Option<super::SessionRecord> {
    let mut r = Reader(bytes);
    let mut record = super::SessionRecord {
        version: r.u64()?,
        spent: r.f64()?,
        limit: r.f64()?,
        answered: r.u64()?,
        charged: r.u64()?,
        posterior: Form::Log(r.floats()?),
        cache: None,
        cache_owners: Vec::new(),
        journal_head: None,
        journal_events: 0,
        dataset: None,
    };
    if !r.0.is_empty() {
        record.cache = Some(cache(&mut r)?);
    }
    r.0.is_empty().then_some(record)
}

/// The cache's layout marker (a count no unmarked cache ever had) and the
/// one marked layout.
const CACHE_MARK: u32 = u32::MAX;
const CACHE_PARTITIONED: u8 = 2;

fn cache(r: &mut Reader<'_>) -> Option<schema::AnswerCache> {
    let first = r.u32()?;
    let (unmarked, n) = if first == CACHE_MARK {
        let [layout] = r.take::<1>()?;
        (false, if layout == CACHE_PARTITIONED { r.u32()? } else { return None })
    } else {
        (true, first)
    };
    let mut entries = Vec::with_capacity(n.min(4096) as usize);
    for _ in 0..n {
        let digest = r.take::<32>()?.to_vec();
        let owner = if unmarked { 0 } else { r.u64()? };
        let label = r.u32()?;
        let [flags] = r.take::<1>()?;
        let evidence = if flags & 2 != 0 {
            let min_t = r.f64()?;
            // The unmarked layout's evidence came from the *unrounded*
            // release: round its statistic down to a multiple of 2⁻¹⁰, so
            // repeats no longer give away its low-order bits (only ever
            // less confident than before; docs/assurance/accounting.md §8).
            let min_t = if unmarked { (min_t * 1024.0).floor() / 1024.0 } else { min_t };
            Some(schema::Evidence { min_t, k: r.u32()? })
        } else {
            None
        };
        let published = if flags & 4 != 0 { Some(schema::Published { values: r.floats()? }) } else { None };
        entries.push(schema::CachedAnswer {
            digest,
            owner,
            label,
            unanimous: flags & 1 != 0,
            evidence,
            published,
            seq: 0,
        });
    }
    let m = r.u32()?;
    let evicted = (0..m)
        .map(|_| {
            let owner = if unmarked { 0 } else { r.u64()? };
            Some(schema::Evicted { owner, prefix: r.u64()? })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(schema::AnswerCache { entries, evicted })
}

pub(super) fn journal(bytes: &[u8]) -> Option<super::JournalEntry> {
    let mut r = Reader(bytes);
    let version = r.u64()?;
    let charge = r.f64()?;
    let log_likelihood = r.floats()?;
    let query_id = String::from_utf8(r.0.to_vec()).ok()?;
    Some(super::JournalEntry { version, query_id, charge, log_likelihood, ..Default::default() })
}

/// Key digest, budget, created, revoked (−1: active), origin byte.
pub(super) fn principal(name: &str, bytes: &[u8]) -> Option<PrincipalRecord> {
    let mut r = Reader(bytes);
    let key_sha256 = r.take::<32>()?;
    let budget = r.f64()?;
    let created_unix = r.u64()? as i64;
    let revoked = r.u64()? as i64;
    let origin = match r.0 {
        [0] => Origin::Config,
        [1] => Origin::Admin,
        _ => return None,
    };
    Some(PrincipalRecord {
        name: name.to_owned(),
        key_sha256,
        budget,
        origin,
        created_unix,
        revoked_unix: (revoked >= 0).then_some(revoked),
        dataset_budgets: Default::default(),
    })
}
