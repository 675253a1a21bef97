//! One step's transaction: lock the session's row (`SELECT … FOR
//! UPDATE`), compute the next version from the state read, write it back
//! with the optimistic check (`WHERE version = v`), with its journal items
//! and cache rows, and COMMIT. [`super::PgStore`] bounds it in time and
//! decides what a failure means ([`Failed`]).

use super::connect::durable;
use super::schema::{INSERT_EVENT, INSERT_JOURNAL, PROBE, UPDATE_RECORD, UPDATE_RECORD_AND_CACHE};
use crate::answers::{CacheProbe, CacheRows, Squashed, squash};
use crate::change::Change;
use crate::decode;
use crate::error::{StoreError, backend};
use crate::record::SessionRecord;
use prost::Message;

/// Why [`step_on`] failed: the store, or the caller's `apply`.
pub(super) enum Failed<E> {
    Store(StoreError),
    Apply(E),
}

impl<E> From<StoreError> for Failed<E> {
    fn from(e: StoreError) -> Self {
        Failed::Store(e)
    }
}

/// [`super::PgStore::step`]'s transaction on `client`; `committing` is set once
/// COMMIT is sent (from then on a failure is [`StoreError::Unconfirmed`]).
pub(super) async fn step_on<T, E, F, Fut>(
    client: &mut deadpool_postgres::Object,
    session: &str,
    probes: &[CacheProbe],
    apply: F,
    committing: &mut bool,
) -> Result<T, Failed<E>>
where
    F: FnOnce(Option<SessionRecord>, CacheRows) -> Fut,
    Fut: std::future::Future<Output = Result<(Option<(SessionRecord, Change)>, T), E>>,
{
    pub(super) const LOCK: &str = "SELECT version, record FROM pacpriv_sessions WHERE session = $1 FOR UPDATE";
    let tx = client.transaction().await.map_err(backend)?;
    // The statements of every step, prepared once per connection: a
    // statement given as text costs a round trip to parse it each time.
    let lock = tx.prepare_cached(LOCK).await.map_err(backend)?;
    // The transaction's own durability, sent in the same flight as the
    // lock (tokio-postgres pipelines futures polled together): no round
    // trip of its own.
    let key: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&session];
    let (_, locked) = tokio::try_join!(durable(&tx), tx.query_opt(&lock, &key)).map_err(backend)?;
    let row = match locked {
        Some(row) => row,
        None => {
            // A fresh session: make the row so FOR UPDATE has something
            // to lock; another replica's concurrent insert is fine.
            tx.execute(
                "INSERT INTO pacpriv_sessions (session, version, record) VALUES ($1, 0, '') \
                     ON CONFLICT (session) DO NOTHING",
                &[&session],
            )
            .await
            .map_err(backend)?;
            tx.query_one(&lock, &[&session]).await.map_err(backend)?
        }
    };
    let version: i64 = row.get(0);
    let current = record_of(session, row.get(1))?;
    let cache = if probes.is_empty() {
        CacheRows::none_found(probes)
    } else {
        let (digests, owners, prefixes) = probe_params(probes);
        let probe = tx.prepare_cached(PROBE).await.map_err(backend)?;
        let row = tx.query_one(&probe, &[&session, &digests, &owners, &prefixes]).await.map_err(backend)?;
        cache_rows(session, probes, row.get(0), row.get(1))?
    };
    let (write, result) = apply(current, cache).await.map_err(Failed::Apply)?;
    let Some((next, change)) = write else {
        // Nothing to write or confirm: no answer of this step was paid for.
        return Ok(result);
    };
    if change.is_none() {
        // A cached answer whose step was charged: that step's COMMIT may
        // have been reported unconfirmed and then have landed on this node
        // alone (its wait for the standby cancelled). This COMMIT confirms
        // it: the row lock taken above is WAL-logged and gave this
        // transaction an id, so COMMIT waits until the synchronous standby
        // has flushed the WAL up to here — past that step's commit.
        *committing = true;
        tx.commit().await.map_err(|e| StoreError::Unconfirmed(e.to_string()))?;
        return Ok(result);
    }
    let Change { steps, journal, events, cache, .. } = change;
    let next_version = i64::try_from(next.version).map_err(backend)?;
    if i64::try_from(steps).ok().and_then(|s| version.checked_add(s)) != Some(next_version) {
        return Err(backend(format!("step on {session:?} produced version {next_version} after {version}")).into());
    }
    let record = next.encode();
    let row: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [&session, &next_version, &record, &version];
    let cache = squash(&cache);
    let updated = if cache.is_empty() {
        let update = tx.prepare_cached(UPDATE_RECORD).await.map_err(backend)?;
        tx.execute(&update, &row).await.map_err(backend)?
    } else {
        let update = tx.prepare_cached(UPDATE_RECORD_AND_CACHE).await.map_err(backend)?;
        let params = cache_params(&cache)?;
        tx.execute(&update, &[&row[..], &params.refs()[..]].concat()).await.map_err(backend)?
    };
    if updated != 1 {
        return Err(backend(format!("session {session:?} moved past version {version} concurrently")).into());
    }
    if !journal.is_empty() {
        let insert = tx.prepare_cached(INSERT_JOURNAL).await.map_err(backend)?;
        for entry in journal {
            let entry_version = i64::try_from(entry.version).map_err(backend)?;
            tx.execute(&insert, &[&session, &entry_version, &entry.encode()]).await.map_err(backend)?;
        }
    }
    if !events.is_empty() {
        let insert = tx.prepare_cached(INSERT_EVENT).await.map_err(backend)?;
        for event in events {
            let seq = i64::try_from(event.seq).map_err(backend)?;
            tx.execute(&insert, &[&session, &seq, &event.encode_sealed()]).await.map_err(backend)?;
        }
    }
    // Everything above failed with the transaction rolled back (nothing
    // charged); a failed COMMIT is ambiguous — it may have committed.
    *committing = true;
    tx.commit().await.map_err(|e| StoreError::Unconfirmed(e.to_string()))?;
    Ok(result)
}

/// The record in a session row's `record` column: none in a row just made
/// for a fresh session (one with journal events only is at version 0 and
/// has one).
pub(super) fn record_of(session: &str, bytes: &[u8]) -> Result<Option<SessionRecord>, StoreError> {
    if bytes.is_empty() { Ok(None) } else { decode::session_record(session, bytes).map(Some) }
}

/// The probes as `probed!` (`schema.rs`)'s parameters: digests, owners, prefixes.
pub(super) fn probe_params(probes: &[CacheProbe]) -> (Vec<&[u8]>, Vec<i64>, Vec<&[u8]>) {
    let digests = probes.iter().map(|p| p.digest.as_slice()).collect();
    // Owners and prefixes are u64s kept bit for bit in BIGINT / 8 bytes.
    let owners = probes.iter().map(|p| p.owner as i64).collect();
    let prefixes = probes.iter().map(|p| &p.digest[..8]).collect();
    (digests, owners, prefixes)
}

/// What `probed!` (`schema.rs`) returned for `probes`: the answers found and the
/// evictions at the positions found.
pub(super) fn cache_rows(
    session: &str,
    probes: &[CacheProbe],
    answers: Vec<Vec<u8>>,
    evicted_at: Vec<i64>,
) -> Result<CacheRows, StoreError> {
    let entries = answers.iter().map(|a| decode::cached_answer(session, a)).collect::<Result<_, _>>()?;
    let evicted = evicted_at
        .iter()
        .map(|&i| {
            let p = usize::try_from(i - 1)
                .ok()
                .and_then(|i| probes.get(i))
                .ok_or_else(|| StoreError::Corrupt { session: session.into(), reason: "probe out of range".into() })?;
            Ok((p.owner, p.prefix()))
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(CacheRows { entries, evicted, probed: Some(probes.to_vec()) })
}

/// [`UPDATE_RECORD_AND_CACHE`]'s cache parameters ($5 on), one array per
/// column. Owners, and prefixes, are u64s kept bit for bit in BIGINT /
/// 8 bytes.
pub(super) struct CacheParams {
    pub(super) evict_owner: Vec<i64>,
    pub(super) evict_seq: Vec<i64>,
    pub(super) evict_remember: Vec<bool>,
    pub(super) insert_owner: Vec<i64>,
    pub(super) insert_seq: Vec<i64>,
    pub(super) insert_digest: Vec<Vec<u8>>,
    pub(super) insert_answer: Vec<Vec<u8>>,
    pub(super) remember_owner: Vec<i64>,
    pub(super) remember_prefix: Vec<Vec<u8>>,
}

impl CacheParams {
    pub(super) fn refs(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 9] {
        [
            &self.evict_owner,
            &self.evict_seq,
            &self.evict_remember,
            &self.insert_owner,
            &self.insert_seq,
            &self.insert_digest,
            &self.insert_answer,
            &self.remember_owner,
            &self.remember_prefix,
        ]
    }
}

pub(super) fn cache_params(c: &Squashed) -> Result<CacheParams, StoreError> {
    let seq = |s: u64| i64::try_from(s).map_err(backend);
    Ok(CacheParams {
        evict_owner: c.evict.iter().map(|e| e.0 as i64).collect(),
        evict_seq: c.evict.iter().map(|e| seq(e.1)).collect::<Result<_, _>>()?,
        evict_remember: c.evict.iter().map(|e| e.2).collect(),
        insert_owner: c.insert.iter().map(|a| a.owner as i64).collect(),
        insert_seq: c.insert.iter().map(|a| seq(a.seq)).collect::<Result<_, _>>()?,
        insert_digest: c.insert.iter().map(|a| a.digest.clone()).collect(),
        insert_answer: c.insert.iter().map(Message::encode_to_vec).collect(),
        remember_owner: c.remember.iter().map(|r| r.0 as i64).collect(),
        remember_prefix: c.remember.iter().map(|r| r.2.to_le_bytes().to_vec()).collect(),
    })
}
