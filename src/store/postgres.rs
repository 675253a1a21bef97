//! The PostgreSQL store, for several replicas behind a load balancer: one
//! row per session, and every step runs in one transaction that locks the
//! row (`SELECT … FOR UPDATE`), computes from the state it read, and writes
//! the next version back with an optimistic check (`WHERE version = v`), so
//! two replicas can never both apply a step to the same version. The answer
//! is released after COMMIT returns (synchronous commit: durable).
//!
//! Plain SQL only (no extensions, no advisory locks), so PostgreSQL-wire
//! compatible distributed engines (CockroachDB, YugabyteDB) work unchanged.
//!
//! An unresponsive server is bounded by [`PgLink::timeout`] on both ends:
//! this side's sockets give up on data left unacknowledged that long
//! (`TCP_USER_TIMEOUT`, keepalives for idle pooled connections), so a
//! replica cut off from the database answers UNAVAILABLE within seconds
//! instead of hanging; and the server ends a transaction left idle that
//! long (`idle_in_transaction_session_timeout`), so a replica that vanished
//! holding a session's row lock stops blocking the other replicas. A
//! server that answers TCP but not the step — a COMMIT waiting for a
//! synchronous standby that is gone, a row lock held by such a COMMIT — is
//! bounded by the same timeout around the whole step. Either way the
//! transaction rolls back (nothing charged) unless COMMIT was already
//! sent, which stays ambiguous ([`StoreError::Unconfirmed`]), and the
//! connection is closed rather than pooled again.
//!
//! On a highly-available PostgreSQL the URL names every node with
//! `target_session_attrs=read-write` (deploy/README.md): each new
//! connection goes to the node that accepts writes, so after a failover
//! the replicas follow the new primary once the old connections fail.

use super::answers::{CacheProbe, CacheRows, Squashed, squash};
use super::cell::Change;
use super::record::{Journaled, chain_order};
use super::{JournalEntry, Meta, Origin, PgTls, PrincipalRecord, SessionRecord, SslMode, StoreError};
use crate::metrics::StoreMetrics;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use prost::Message;
use std::time::Duration;
use tokio_postgres::NoTls;

/// How a replica reaches its database (`store.max_connections`,
/// `store.postgres_sslmode`/`postgres_sslrootcert`, `store.postgres_timeout_ms`).
#[derive(Clone, Debug, PartialEq)]
pub struct PgLink {
    /// Pool size.
    pub max_connections: usize,
    /// TLS to the server.
    pub tls: PgTls,
    /// How long an unresponsive server or connection is waited for (see
    /// the module documentation); at least a second.
    pub timeout: Duration,
}

impl PgLink {
    /// `store.postgres_timeout_ms`'s default.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

    /// `max_connections` plaintext connections, the default timeout.
    #[must_use]
    pub fn plain(max_connections: usize) -> Self {
        PgLink { max_connections, tls: PgTls::DISABLE, timeout: Self::DEFAULT_TIMEOUT }
    }
}

/// The schema, as numbered migrations: applied in order at start-up, each
/// once, each recorded in `pacpriv_schema_migrations` in the transaction
/// that applied it. A shipped migration is never edited: a change is the
/// next number. Migration 1 is the schema releases created before the
/// migrations were numbered (hence `IF NOT EXISTS`: such a database is
/// recorded at 1 and left as it is). Records in `BYTEA` columns carry
/// their own format ([`super::record`]), so a record format change needs
/// no migration.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "meta, sessions, journal and principals",
        "
CREATE TABLE IF NOT EXISTS pacpriv_meta (
    id        INT PRIMARY KEY CHECK (id = 1),
    secret    BIGINT NOT NULL,
    teachers  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS pacpriv_sessions (
    session   TEXT PRIMARY KEY,
    version   BIGINT NOT NULL,
    record    BYTEA NOT NULL
);
CREATE TABLE IF NOT EXISTS pacpriv_journal (
    session   TEXT NOT NULL,
    version   BIGINT NOT NULL,
    entry     BYTEA NOT NULL,
    PRIMARY KEY (session, version)
);
CREATE TABLE IF NOT EXISTS pacpriv_principals (
    name          TEXT PRIMARY KEY,
    key_sha256    BYTEA NOT NULL UNIQUE,
    budget        DOUBLE PRECISION NOT NULL,
    origin        TEXT NOT NULL,
    created_unix  BIGINT NOT NULL,
    revoked_unix  BIGINT
);
",
    ),
    (
        2,
        "journal events (cache hits and refusals)",
        "
CREATE TABLE IF NOT EXISTS pacpriv_journal_events (
    session   TEXT NOT NULL,
    seq       BIGINT NOT NULL,
    event     BYTEA NOT NULL,
    PRIMARY KEY (session, seq)
);
",
    ),
    (
        3,
        "answer cache in its own tables",
        "
CREATE TABLE IF NOT EXISTS pacpriv_answer_cache (
    session   TEXT NOT NULL,
    owner     BIGINT NOT NULL,
    seq       BIGINT NOT NULL,
    digest    BYTEA NOT NULL,
    answer    BYTEA NOT NULL,
    PRIMARY KEY (session, owner, seq)
);
CREATE INDEX IF NOT EXISTS pacpriv_answer_cache_digest ON pacpriv_answer_cache (session, digest);
CREATE TABLE IF NOT EXISTS pacpriv_answer_cache_evicted (
    session   TEXT NOT NULL,
    owner     BIGINT NOT NULL,
    prefix    BYTEA NOT NULL,
    PRIMARY KEY (session, owner, prefix)
);
",
    ),
];

/// A session's record.
const LOAD_RECORD: &str = "SELECT record FROM pacpriv_sessions WHERE session = $1";

/// The cached answers and remembered evictions of the probes `$2`
/// (digests), `$3` (owners) and `$4` (digest prefixes) in session `$1`:
/// the answers, and the (1-based) positions of the probes found evicted.
macro_rules! probed {
    () => {
        "ARRAY(SELECT c.answer FROM pacpriv_answer_cache c WHERE c.session = $1 AND c.digest = ANY($2::bytea[])), \
         ARRAY(SELECT p.i FROM unnest($3::bigint[], $4::bytea[]) WITH ORDINALITY AS p(owner, prefix, i) \
               WHERE EXISTS (SELECT 1 FROM pacpriv_answer_cache_evicted e \
                             WHERE e.session = $1 AND e.owner = p.owner AND e.prefix = p.prefix))"
    };
}

/// A session's record with the cache rows of some probes: the preflight's
/// one read.
const LOAD_PROBED: &str = concat!("SELECT record, ", probed!(), " FROM pacpriv_sessions WHERE session = $1");

/// The cache rows of some probes, read under the session's row lock.
const PROBE: &str = concat!("SELECT ", probed!());

/// A step's new record, if the row is still at the version it read.
macro_rules! update_record {
    () => {
        "UPDATE pacpriv_sessions SET version = $2, record = $3 WHERE session = $1 AND version = $4"
    };
}

/// [`update_record!`] alone, for a step without cache changes.
const UPDATE_RECORD: &str = update_record!();

/// [`update_record!`] with the step's cache writes (see [`squash`]) in
/// the same statement, one round trip: evicted rows deleted, their
/// prefixes remembered where asked, new answers inserted, migrated
/// evictions remembered. Its row count is the UPDATE's.
const UPDATE_RECORD_AND_CACHE: &str = concat!(
    "
WITH gone AS (
    DELETE FROM pacpriv_answer_cache c
    USING unnest($5::bigint[], $6::bigint[], $7::bool[]) AS e(owner, seq, remember)
    WHERE c.session = $1 AND c.owner = e.owner AND c.seq = e.seq
    RETURNING c.owner, substring(c.digest FROM 1 FOR 8) AS prefix, e.remember
), kept AS (
    INSERT INTO pacpriv_answer_cache (session, owner, seq, digest, answer)
    SELECT $1, owner, seq, digest, answer FROM unnest($8::bigint[], $9::bigint[], $10::bytea[], $11::bytea[])
        AS a(owner, seq, digest, answer)
), remembered AS (
    INSERT INTO pacpriv_answer_cache_evicted (session, owner, prefix)
    SELECT $1, owner, prefix FROM gone WHERE remember
    UNION SELECT $1, owner, prefix FROM unnest($12::bigint[], $13::bytea[]) AS r(owner, prefix)
    ON CONFLICT DO NOTHING
)
",
    update_record!()
);

/// One journal entry.
const INSERT_JOURNAL: &str = "INSERT INTO pacpriv_journal (session, version, entry) VALUES ($1, $2, $3)";

/// One journal event.
const INSERT_EVENT: &str = "INSERT INTO pacpriv_journal_events (session, seq, event) VALUES ($1, $2, $3)";

/// A session's journal, in version order.
const LOAD_JOURNAL: &str = "SELECT entry FROM pacpriv_journal WHERE session = $1 ORDER BY version";

/// A session's journal events, in sequence order.
const LOAD_EVENTS: &str = "SELECT event FROM pacpriv_journal_events WHERE session = $1 ORDER BY seq";

/// The table that records applied migrations.
const MIGRATIONS_TABLE: &str = "
CREATE TABLE IF NOT EXISTS pacpriv_schema_migrations (
    version      INT PRIMARY KEY,
    description  TEXT NOT NULL,
    applied_at   TIMESTAMPTZ NOT NULL DEFAULT now()
)";

/// Applies the migrations `client`'s database lacks, in one transaction
/// that holds a lock on the migrations table, so replicas starting
/// together apply each migration once.
///
/// # Errors
/// The database's schema is newer than this release knows (it was
/// migrated by a later release), or a migration failed (then none of this
/// call's migrations is applied).
async fn migrate(client: &mut tokio_postgres::Client) -> Result<(), StoreError> {
    // Two replicas creating the table at the same instant can collide in
    // PostgreSQL's catalog (a unique violation on the type name); the
    // loser finds the table there on its second try.
    if client.batch_execute(MIGRATIONS_TABLE).await.is_err() {
        client.batch_execute(MIGRATIONS_TABLE).await.map_err(backend)?;
    }
    let tx = client.transaction().await.map_err(backend)?;
    tx.batch_execute("LOCK TABLE pacpriv_schema_migrations IN SHARE ROW EXCLUSIVE MODE").await.map_err(backend)?;
    let row = tx.query_one("SELECT COALESCE(MAX(version), 0) FROM pacpriv_schema_migrations", &[]).await;
    let applied: i32 = row.map_err(backend)?.get(0);
    let known = MIGRATIONS.last().map_or(0, |m| m.0);
    if applied > known {
        return Err(backend(format!(
            "the database schema is at migration {applied}, newer than this release knows ({known}); \
             run the release that migrated it, or a later one"
        )));
    }
    for &(version, description, sql) in MIGRATIONS.iter().filter(|m| m.0 > applied) {
        tx.batch_execute(sql).await.map_err(|e| backend(format!("migration {version} ({description}): {e}")))?;
        tx.execute(
            "INSERT INTO pacpriv_schema_migrations (version, description) VALUES ($1, $2)",
            &[&version, &description],
        )
        .await
        .map_err(backend)?;
        tracing::info!(version, description, "schema migration applied");
    }
    tx.commit().await.map_err(backend)
}

/// A principal query: the columns [`principal_of`] reads, then `$tail`.
/// (A literal, not a `format!`, because the key lookup runs per request.)
macro_rules! select_principals {
    ($tail:literal) => {
        concat!("SELECT name, key_sha256, budget, origin, created_unix, revoked_unix FROM pacpriv_principals", $tail)
    };
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// A connection pool to one database.
pub struct PgStore {
    pool: Pool,
    /// Hosts/database for messages (no password).
    location: String,
    /// How long a step's transaction may take, COMMIT included.
    timeout: Duration,
    metrics: StoreMetrics,
}

impl PgStore {
    /// Connects as `link` says and applies the migrations the database
    /// lacks ([`migrate`]).
    ///
    /// # Errors
    /// An unparsable URL, an unreachable server (or one whose certificate
    /// `link.tls` refuses), failed migrations.
    pub async fn connect(url: &str, link: &PgLink) -> Result<Self, StoreError> {
        let tls = &link.tls;
        let url = tls.url_for(url).map_err(backend)?;
        let mut config: tokio_postgres::Config =
            url.parse().map_err(|e| backend(format!("store.postgres_url: {e}")))?;
        bound_waits(&mut config, link.timeout);
        let hosts: Vec<String> = config.get_hosts().iter().map(|h| format!("{h:?}")).collect();
        let location = format!("postgres {}/{}", hosts.join(","), config.get_dbname().unwrap_or(""));
        let recycling = ManagerConfig { recycling_method: RecyclingMethod::Fast };
        let manager = match tls.client_config()? {
            None => {
                config.ssl_mode(tokio_postgres::config::SslMode::Disable);
                Manager::from_config(config, NoTls, recycling)
            }
            Some(client) => {
                // Encrypted or nothing: never a silent plaintext fallback.
                config.ssl_mode(tokio_postgres::config::SslMode::Require);
                Manager::from_config(config, tokio_postgres_rustls::MakeRustlsConnect::new(client), recycling)
            }
        };
        let pool = Pool::builder(manager)
            .max_size(link.max_connections)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(link.timeout))
            .create_timeout(Some(link.timeout))
            .build()
            .map_err(backend)?;
        let mut client = pool.get().await.map_err(|e| {
            let hint = match tls.mode {
                SslMode::Disable => String::new(),
                mode => format!(" (store.postgres_sslmode = {})", mode.as_str()),
            };
            backend(format!("connecting to {location}{hint}: {}", error_chain(&e)))
        })?;
        migrate(&mut client).await.map_err(|e| backend(format!("migrations on {location}: {e}")))?;
        Ok(PgStore { pool, location, timeout: link.timeout, metrics: StoreMetrics::default() })
    }

    /// Records each step's transaction (latency, one record) in `metrics`.
    #[must_use]
    pub fn observed(mut self, metrics: StoreMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// Where the data is, for messages.
    pub fn location(&self) -> &str {
        &self.location
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(|e| backend(format!("{}: {e}", self.location)))
    }

    /// The deployment record, if any.
    ///
    /// # Errors
    /// Backend.
    pub async fn meta(&self) -> Result<Option<Meta>, StoreError> {
        let client = self.client().await?;
        let row =
            client.query_opt("SELECT secret, teachers FROM pacpriv_meta WHERE id = 1", &[]).await.map_err(backend)?;
        row.map(|r| {
            let secret: i64 = r.get(0);
            Ok(Meta {
                secret: usize::try_from(secret).map_err(|_| backend("stored secret index out of range"))?,
                teachers: r.get(1),
            })
        })
        .transpose()
    }

    /// Writes `meta` unless another replica already did; returns what is
    /// stored (the first writer wins).
    ///
    /// # Errors
    /// Backend.
    pub async fn init_meta(&self, meta: &Meta) -> Result<Meta, StoreError> {
        let client = self.client().await?;
        let secret = i64::try_from(meta.secret).map_err(|_| backend("secret index out of range"))?;
        client
            .execute(
                "INSERT INTO pacpriv_meta (id, secret, teachers) VALUES (1, $1, $2) ON CONFLICT (id) DO NOTHING",
                &[&secret, &meta.teachers],
            )
            .await
            .map_err(backend)?;
        self.meta().await?.ok_or_else(|| backend("meta row missing after insert"))
    }

    /// A session's latest record.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn load(&self, session: &str) -> Result<Option<SessionRecord>, StoreError> {
        let client = self.client().await?;
        let row = client.query_opt(LOAD_RECORD, &[&session]).await.map_err(backend)?;
        row.map(|r| super::session_record(session, r.get(0))).transpose()
    }

    /// A session's latest record and the cached answers and remembered
    /// evictions of `probes`, in one statement.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn load_probed(
        &self,
        session: &str,
        probes: &[CacheProbe],
    ) -> Result<(Option<SessionRecord>, CacheRows), StoreError> {
        let client = self.client().await?;
        let (digests, owners, prefixes) = probe_params(probes);
        let statement = client.prepare_cached(LOAD_PROBED).await.map_err(backend)?;
        let row = client.query_opt(&statement, &[&session, &digests, &owners, &prefixes]).await.map_err(backend)?;
        let Some(row) = row else { return Ok((None, CacheRows::none_found(probes))) };
        Ok((record_of(session, row.get(0))?, cache_rows(session, probes, row.get(1), row.get(2))?))
    }

    /// Every session key with a record, in order.
    ///
    /// # Errors
    /// Backend.
    pub async fn sessions(&self) -> Result<Vec<String>, StoreError> {
        let client = self.client().await?;
        let rows = client.query("SELECT session FROM pacpriv_sessions ORDER BY session", &[]).await.map_err(backend)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// A session's record and its journal (entries and events in chain
    /// order), in one snapshot (a read-only REPEATABLE READ transaction).
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn journal_snapshot(&self, session: &str) -> Result<(Option<SessionRecord>, Vec<Journaled>), StoreError> {
        let mut client = self.client().await?;
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(backend)?;
        let record = tx
            .query_opt(LOAD_RECORD, &[&session])
            .await
            .map_err(backend)?
            .map(|r| super::session_record(session, r.get(0)))
            .transpose()?;
        let entries = tx.query(LOAD_JOURNAL, &[&session]).await.map_err(backend)?;
        let events = tx.query(LOAD_EVENTS, &[&session]).await.map_err(backend)?;
        tx.commit().await.map_err(backend)?;
        let entries = decode_journal(session, &entries, super::journal_entry)?;
        Ok((record, chain_order(entries, decode_journal(session, &events, super::journal_event)?)))
    }

    /// A session's journal, in version order.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn journal(&self, session: &str) -> Result<Vec<JournalEntry>, StoreError> {
        let client = self.client().await?;
        let rows = client.query(LOAD_JOURNAL, &[&session]).await.map_err(backend)?;
        decode_journal(session, &rows, super::journal_entry)
    }

    /// Every principal, by name.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn principals(&self) -> Result<Vec<PrincipalRecord>, StoreError> {
        let client = self.client().await?;
        let rows = client.query(select_principals!(" ORDER BY name"), &[]).await.map_err(backend)?;
        rows.iter().map(principal_of).collect()
    }

    /// The principal whose key hashes to `key_sha256` (one indexed lookup:
    /// this runs per request, so that principals created or revoked on any
    /// replica take effect on every replica at once).
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn principal_by_key(&self, key_sha256: &[u8; 32]) -> Result<Option<PrincipalRecord>, StoreError> {
        let key: &[u8] = key_sha256;
        self.one_principal(select_principals!(" WHERE key_sha256 = $1"), &key).await
    }

    /// The principal called `name`.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn principal(&self, name: &str) -> Result<Option<PrincipalRecord>, StoreError> {
        self.one_principal(select_principals!(" WHERE name = $1"), &name).await
    }

    async fn one_principal(
        &self,
        sql: &str,
        param: &(dyn tokio_postgres::types::ToSql + Sync),
    ) -> Result<Option<PrincipalRecord>, StoreError> {
        let client = self.client().await?;
        client.query_opt(sql, &[param]).await.map_err(backend)?.as_ref().map(principal_of).transpose()
    }

    /// See [`super::Store::provision_all`]: one transaction, one
    /// `provision_in` per record, serialised across replicas by a table
    /// lock that excludes other writers (readers go on, as for
    /// [`migrate`]). Without it, replicas starting
    /// together on a fresh database insert the same principal at once, and
    /// `ON CONFLICT (name)` covers only the name: the second insert fails
    /// on the key's unique index as if another principal held the key.
    ///
    /// # Errors
    /// As [`super::Store::provision_all`].
    pub async fn provision_all(&self, records: &[PrincipalRecord]) -> Result<Vec<PrincipalRecord>, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(backend)?;
        tx.batch_execute("LOCK TABLE pacpriv_principals IN SHARE ROW EXCLUSIVE MODE").await.map_err(backend)?;
        let mut stored = Vec::with_capacity(records.len());
        for record in records {
            // An error drops `tx`, which rolls back: all or nothing.
            stored.push(provision_in(&tx, record).await?);
        }
        tx.commit().await.map_err(backend)?;
        Ok(stored)
    }

    /// See [`super::Store::revoke`].
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn revoke(&self, name: &str, at_unix: i64) -> Result<Option<PrincipalRecord>, StoreError> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE pacpriv_principals SET revoked_unix = $2 WHERE name = $1 AND revoked_unix IS NULL",
                &[&name, &at_unix],
            )
            .await
            .map_err(backend)?;
        self.principal(name).await
    }

    /// One step on `session`, serialised across replicas: locks the row,
    /// hands the current record (`None`: fresh session) and the cache rows
    /// of `probes` to `apply`, writes back the record `apply` returns, if
    /// any, with what changed (its version must be `steps` more; the
    /// journal entries, events and cache writes), and commits. Only a
    /// committed step's result is returned; if `apply` fails, nothing is
    /// written. The row is locked by the first statement (it is created
    /// only for a fresh session) and the probes are read by the next (so
    /// they see every step committed before the lock was granted): a step
    /// is two reads, one write of the record with its cache changes, one
    /// per journal entry and event, and the commit — each a prepared
    /// statement, one round trip.
    ///
    /// # Errors
    /// `apply`'s error, or the store's (then nothing may be released).
    pub async fn step<T, E, F, Fut>(&self, session: &str, probes: &[CacheProbe], apply: F) -> Result<T, E>
    where
        E: From<StoreError>,
        F: FnOnce(Option<SessionRecord>, CacheRows) -> Fut,
        Fut: std::future::Future<Output = Result<(Option<(SessionRecord, Change)>, T), E>>,
    {
        let started = std::time::Instant::now();
        let mut client = self.client().await?;
        let mut committing = false;
        let transaction = step_on(&mut client, session, probes, apply, &mut committing);
        let failure = match tokio::time::timeout(self.timeout, transaction).await {
            Ok(Ok(result)) => {
                self.metrics.commit(started.elapsed().as_secs_f64(), 1);
                return Ok(result);
            }
            Ok(Err(Failed::Apply(e))) => return Err(e),
            Ok(Err(Failed::Store(e))) => e,
            // A server that answers TCP but not the transaction: a lock
            // held by a step that cannot commit, or a COMMIT waiting for a
            // synchronous standby that is gone (deploy/README.md).
            Err(_) if committing => StoreError::Unconfirmed(format!("no reply to COMMIT within {:?}", self.timeout)),
            Err(_) => backend(format!("{}: no reply within {:?}", self.location, self.timeout)),
        };
        // Neither this connection nor the idle ones are reused: this one
        // may still be waiting for the reply given up on above, and all of
        // them lead to a server that just failed a step — after a failover,
        // the old primary, which may hold them open but never commit again.
        // New connections go to whichever host accepts writes now.
        drop(deadpool_postgres::Object::take(client));
        self.pool.retain(|_, _| false);
        Err(failure.into())
    }
}

/// Why [`step_on`] failed: the store, or the caller's `apply`.
enum Failed<E> {
    Store(StoreError),
    Apply(E),
}

impl<E> From<StoreError> for Failed<E> {
    fn from(e: StoreError) -> Self {
        Failed::Store(e)
    }
}

/// [`PgStore::step`]'s transaction on `client`; `committing` is set once
/// COMMIT is sent (from then on a failure is [`StoreError::Unconfirmed`]).
async fn step_on<T, E, F, Fut>(
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
    const LOCK: &str = "SELECT version, record FROM pacpriv_sessions WHERE session = $1 FOR UPDATE";
    let tx = client.transaction().await.map_err(backend)?;
    // The statements of every step, prepared once per connection: a
    // statement given as text costs a round trip to parse it each time.
    let lock = tx.prepare_cached(LOCK).await.map_err(backend)?;
    let row = match tx.query_opt(&lock, &[&session]).await.map_err(backend)? {
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
    let Some((next, Change { steps, journal, events, cache })) = write else {
        // Nothing to write (a cached answer read under the lock):
        // committed state, released as it is.
        return Ok(result);
    };
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
fn record_of(session: &str, bytes: &[u8]) -> Result<Option<SessionRecord>, StoreError> {
    if bytes.is_empty() { Ok(None) } else { super::session_record(session, bytes).map(Some) }
}

/// The probes as [`probed!`]'s parameters: digests, owners, prefixes.
fn probe_params(probes: &[CacheProbe]) -> (Vec<&[u8]>, Vec<i64>, Vec<&[u8]>) {
    let digests = probes.iter().map(|p| p.digest.as_slice()).collect();
    // Owners and prefixes are u64s kept bit for bit in BIGINT / 8 bytes.
    let owners = probes.iter().map(|p| p.owner as i64).collect();
    let prefixes = probes.iter().map(|p| &p.digest[..8]).collect();
    (digests, owners, prefixes)
}

/// What [`probed!`] returned for `probes`: the answers found and the
/// evictions at the positions found.
fn cache_rows(
    session: &str,
    probes: &[CacheProbe],
    answers: Vec<Vec<u8>>,
    evicted_at: Vec<i64>,
) -> Result<CacheRows, StoreError> {
    let entries = answers.iter().map(|a| super::cached_answer(session, a)).collect::<Result<_, _>>()?;
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
struct CacheParams {
    evict_owner: Vec<i64>,
    evict_seq: Vec<i64>,
    evict_remember: Vec<bool>,
    insert_owner: Vec<i64>,
    insert_seq: Vec<i64>,
    insert_digest: Vec<Vec<u8>>,
    insert_answer: Vec<Vec<u8>>,
    remember_owner: Vec<i64>,
    remember_prefix: Vec<Vec<u8>>,
}

impl CacheParams {
    fn refs(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 9] {
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

fn cache_params(c: &Squashed) -> Result<CacheParams, StoreError> {
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

/// Bounds every wait on the server by `timeout` (module documentation).
/// The session option is appended to any the URL gives.
fn bound_waits(config: &mut tokio_postgres::Config, timeout: Duration) {
    let ms = timeout.as_millis();
    let options = match config.get_options() {
        Some(given) if !given.trim().is_empty() => format!("{given} -c idle_in_transaction_session_timeout={ms}"),
        _ => format!("-c idle_in_transaction_session_timeout={ms}"),
    };
    // A URL's own connect_timeout stands: with several hosts it bounds
    // each, and the pool's create timeout (`timeout`) bounds them all.
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(timeout);
    }
    config
        .options(options)
        .tcp_user_timeout(timeout)
        .keepalives(true)
        .keepalives_idle(timeout)
        .keepalives_interval((timeout / 4).max(Duration::from_secs(1)))
        .keepalives_retries(3);
}

/// `e` and its sources, so a TLS failure says which check failed.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

/// Provisions one record inside `tx` (the semantics of
/// [`super::Store::provision`]): an insert that loses to an existing name,
/// then (config origin only) an update of the config-origin row. A unique
/// violation (another principal's key) aborts the transaction, which the
/// caller then drops.
async fn provision_in(
    tx: &deadpool_postgres::Transaction<'_>,
    record: &PrincipalRecord,
) -> Result<PrincipalRecord, StoreError> {
    let key: &[u8] = &record.key_sha256;
    let origin = record.origin.as_str();
    let unique = |e: tokio_postgres::Error| {
        if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) {
            StoreError::KeyInUse { name: record.name.clone() }
        } else {
            backend(e)
        }
    };
    let inserted = tx
        .execute(
            "INSERT INTO pacpriv_principals (name, key_sha256, budget, origin, created_unix, revoked_unix) \
             VALUES ($1, $2, $3, $4, $5, NULL) ON CONFLICT (name) DO NOTHING",
            &[&record.name, &key, &record.budget, &origin, &record.created_unix],
        )
        .await
        .map_err(unique)?;
    let current = async || -> Result<Option<PrincipalRecord>, StoreError> {
        let row = tx.query_opt(select_principals!(" WHERE name = $1"), &[&record.name]).await.map_err(backend)?;
        row.as_ref().map(principal_of).transpose()
    };
    if inserted == 0 {
        let updated = match record.origin {
            Origin::Admin => 0,
            Origin::Config => tx
                .execute(
                    "UPDATE pacpriv_principals SET key_sha256 = $2, budget = $3 WHERE name = $1 AND origin = 'config'",
                    &[&record.name, &key, &record.budget],
                )
                .await
                .map_err(unique)?,
        };
        if updated == 0 {
            let origin = current().await?.map_or(Origin::Admin, |p| p.origin).as_str();
            return Err(StoreError::PrincipalExists { name: record.name.clone(), origin });
        }
    }
    current().await?.ok_or_else(|| backend("principal row missing after insert"))
}

fn principal_of(row: &tokio_postgres::Row) -> Result<PrincipalRecord, StoreError> {
    let name: String = row.get(0);
    let corrupt = |reason: &str| StoreError::Corrupt { session: format!("(principal {name})"), reason: reason.into() };
    let key: &[u8] = row.get(1);
    let origin: &str = row.get(3);
    Ok(PrincipalRecord {
        key_sha256: key.try_into().map_err(|_| corrupt("key_sha256 is not 32 bytes"))?,
        budget: row.get(2),
        origin: Origin::parse(origin).ok_or_else(|| corrupt("unknown origin"))?,
        created_unix: row.get(4),
        revoked_unix: row.get(5),
        name,
    })
}

/// Decodes `session`'s journal items in `rows` (one BYTEA column) with
/// `decode` ([`super::journal_entry`] or [`super::journal_event`]).
fn decode_journal<T>(
    session: &str,
    rows: &[tokio_postgres::Row],
    decode: fn(&str, &[u8]) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    rows.iter().map(|r| decode(session, r.get(0))).collect()
}
