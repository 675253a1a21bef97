//! The PostgreSQL schema: the numbered migrations that make it (each
//! applied once, in order, recorded in `pacpriv_schema_migrations`;
//! [`migrate`] applies the pending ones in one transaction) and the
//! statements the store runs on it.
//!
//! # Invariants
//! - A migration, once released, is never edited: a change is a new one.
//! - Statements touch only the tables the migrations create.

use super::reach::pg;
use crate::error::{StoreError, backend};

/// The schema version this release migrates a database to: the last
/// migration's number (`pacpriv --version` names it).
pub const SCHEMA_VERSION: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// The schema, as numbered migrations: applied in order at start-up, each
/// once, each recorded in `pacpriv_schema_migrations` in the transaction
/// that applied it. A shipped migration is never edited: a change is the
/// next number. Migration 1 is the schema releases created before the
/// migrations were numbered (hence `IF NOT EXISTS`: such a database is
/// recorded at 1 and left as it is). Records in `BYTEA` columns carry
/// their own format ([`crate::record`]), so a record format change needs
/// no migration.
pub(super) const MIGRATIONS: &[(i32, &str, &str)] = &[
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
    (
        4,
        "datasets besides the default one: each its secret index and teacher set",
        "
CREATE TABLE pacpriv_dataset_meta (
    dataset   TEXT PRIMARY KEY,
    secret    BIGINT NOT NULL,
    teachers  TEXT NOT NULL
);
",
    ),
    (
        5,
        "principals' budgets in datasets other than the default one",
        "
ALTER TABLE pacpriv_principals
    ADD COLUMN budget_datasets TEXT[] NOT NULL DEFAULT '{}',
    ADD COLUMN budget_values DOUBLE PRECISION[] NOT NULL DEFAULT '{}';
",
    ),
    (
        6,
        "each dataset's noise key (committed noise, issue 66)",
        "
CREATE TABLE pacpriv_noise_key (
    dataset   TEXT PRIMARY KEY,
    key       BYTEA NOT NULL CHECK (length(key) = 32)
);
",
    ),
    (
        7,
        "each model version's identity (its teachers' digest) per dataset",
        "
CREATE TABLE pacpriv_model_versions (
    dataset     TEXT NOT NULL,
    model       TEXT NOT NULL,
    version     TEXT NOT NULL,
    teachers    TEXT NOT NULL,
    legacy_key  TEXT CHECK (legacy_key IN ('input', 'model')),
    PRIMARY KEY (dataset, model, version)
);
ALTER TABLE pacpriv_meta ADD COLUMN identity_keyed BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE pacpriv_dataset_meta ADD COLUMN identity_keyed BOOLEAN NOT NULL DEFAULT false;
",
    ),
];

/// A session's record.
pub(super) const LOAD_RECORD: &str = "SELECT record FROM pacpriv_sessions WHERE session = $1";

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
pub(super) const LOAD_PROBED: &str = concat!("SELECT record, ", probed!(), " FROM pacpriv_sessions WHERE session = $1");

/// The cache rows of some probes, read under the session's row lock.
pub(super) const PROBE: &str = concat!("SELECT ", probed!());

/// A step's new record, if the row is still at the version it read.
macro_rules! update_record {
    () => {
        "UPDATE pacpriv_sessions SET version = $2, record = $3 WHERE session = $1 AND version = $4"
    };
}

/// [`update_record!`] alone, for a step without cache changes.
pub(super) const UPDATE_RECORD: &str = update_record!();

/// [`update_record!`] with the step's cache writes (see [`squash`](crate::answers::squash)) in
/// the same statement, one round trip: evicted rows deleted, their
/// prefixes remembered where asked, new answers inserted, migrated
/// evictions remembered. Its row count is the UPDATE's.
pub(super) const UPDATE_RECORD_AND_CACHE: &str = concat!(
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
pub(super) const INSERT_JOURNAL: &str = "INSERT INTO pacpriv_journal (session, version, entry) VALUES ($1, $2, $3)";

/// One journal event.
pub(super) const INSERT_EVENT: &str = "INSERT INTO pacpriv_journal_events (session, seq, event) VALUES ($1, $2, $3)";

/// A session's journal, in version order.
pub(super) const LOAD_JOURNAL: &str = "SELECT entry FROM pacpriv_journal WHERE session = $1 ORDER BY version";

/// A session's journal events, in sequence order.
pub(super) const LOAD_EVENTS: &str = "SELECT event FROM pacpriv_journal_events WHERE session = $1 ORDER BY seq";

/// The table that records applied migrations.
pub(super) const MIGRATIONS_TABLE: &str = "
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
pub(super) async fn migrate(client: &mut tokio_postgres::Client) -> Result<(), StoreError> {
    // Two replicas creating the table at the same instant can collide in
    // PostgreSQL's catalog (a unique violation on the type name); the
    // loser finds the table there on its second try.
    if client.batch_execute(MIGRATIONS_TABLE).await.is_err() {
        client.batch_execute(MIGRATIONS_TABLE).await.map_err(pg)?;
    }
    let tx = client.transaction().await.map_err(pg)?;
    super::connect::durable(&tx).await.map_err(pg)?;
    tx.batch_execute("LOCK TABLE pacpriv_schema_migrations IN SHARE ROW EXCLUSIVE MODE").await.map_err(pg)?;
    let row = tx.query_one("SELECT COALESCE(MAX(version), 0) FROM pacpriv_schema_migrations", &[]).await;
    let applied: i32 = row.map_err(pg)?.get(0);
    let known = SCHEMA_VERSION;
    if applied > known {
        return Err(backend(format!(
            "the database schema is at migration {applied}, newer than this release knows ({known}); \
             run the release that migrated it, or a later one"
        )));
    }
    for &(version, description, sql) in MIGRATIONS.iter().filter(|m| m.0 > applied) {
        tx.batch_execute(sql).await.map_err(|e| pg(e).within(format_args!("migration {version} ({description})")))?;
        tx.execute(
            "INSERT INTO pacpriv_schema_migrations (version, description) VALUES ($1, $2)",
            &[&version, &description],
        )
        .await
        .map_err(pg)?;
        tracing::info!(version, description, "schema migration applied");
    }
    tx.commit().await.map_err(pg)
}
