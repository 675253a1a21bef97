//! The PostgreSQL store, for several replicas behind a load balancer: one
//! row per session, and every step runs in one transaction that locks the
//! row (`SELECT … FOR UPDATE`), computes from the state it read, and writes
//! the next version back with an optimistic check (`WHERE version = v`), so
//! two replicas can never both apply a step to the same version. The answer
//! is released after COMMIT returns, and a COMMIT returns only once the
//! synchronous standbys have the step (`connect`: `synchronous_commit` is
//! pinned, and a cancelled wait counts as unconfirmed). A cached answer of
//! a charged step is confirmed the same way before it is released again.
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
use super::answers::{CacheProbe, CacheRows};
use super::change::Change;
use super::decode;
use super::error::{StoreError, backend};
use super::meta::{DEFAULT_DATASET, LegacyKey, Meta, VersionIdentity};
use super::pg_tls::{PgTls, SslMode};
use super::principal::{Configured, Origin, PrincipalRecord};
use super::record::{JournalEntry, SessionRecord};
use super::record::{Journaled, chain_order};
use crate::metrics::StoreMetrics;
use connect::{Connector, pinned, session_options};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use reach::pg;
use std::time::Duration;
use tokio_postgres::{NoTls, Row};

mod connect;
mod reach;
mod schema;
mod step;

pub use schema::SCHEMA_VERSION;

use schema::{LOAD_EVENTS, LOAD_JOURNAL, LOAD_PROBED, LOAD_RECORD, migrate};
use step::{Failed, cache_rows, probe_params, record_of, step_on};

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

/// A principal query: the columns [`principal_of`] reads, then `$tail`.
/// (A literal, not a `format!`, because the key lookup runs per request.)
macro_rules! select_principals {
    ($tail:literal) => {
        concat!("SELECT ", principal_columns!(), " FROM pacpriv_principals", $tail)
    };
}

/// The columns [`principal_of`] reads, in its order.
macro_rules! principal_columns {
    () => {
        "name, key_sha256, budget, origin, created_unix, revoked_unix, budget_datasets, budget_values"
    };
}

/// Connections to one database, in two pools: steps and everything else,
/// and credential lookups on their own.
pub struct PgStore {
    pool: Pool,
    /// [`LOOKUP_CONNECTIONS`] for looking up keys not seen naming a
    /// principal lately: a peer sending unknown keys costs these, never a
    /// step's connection or a known key's lookup.
    lookups: Pool,
    /// Hosts/database for messages (no password).
    location: String,
    /// How long a step's transaction may take, COMMIT included.
    timeout: Duration,
    metrics: StoreMetrics,
}

/// The lookups of unfamiliar keys' own connections (beside
/// `store.max_connections`).
pub const LOOKUP_CONNECTIONS: usize = 2;

impl PgStore {
    /// Connects as `link` says and applies the migrations the database
    /// lacks (`schema::migrate`).
    ///
    /// # Errors
    /// An unparsable URL, an unreachable server (or one whose certificate
    /// `link.tls` refuses), failed migrations.
    pub async fn connect(url: &str, link: &PgLink) -> Result<Self, StoreError> {
        let tls = &link.tls;
        let url = tls.url_for(url).map_err(backend)?;
        let mut config: tokio_postgres::Config =
            url.parse().map_err(|e| backend(format!("store.postgres_url: {e}")))?;
        session_options(&mut config, link.timeout);
        let hosts: Vec<String> = config.get_hosts().iter().map(|h| format!("{h:?}")).collect();
        let location = format!("postgres {}/{}", hosts.join(","), config.get_dbname().unwrap_or(""));
        let client_tls = tls.client_config()?;
        let pool = |size: usize| {
            let mut config = config.clone();
            let recycling = ManagerConfig { recycling_method: RecyclingMethod::Fast };
            let manager = match &client_tls {
                None => {
                    config.ssl_mode(tokio_postgres::config::SslMode::Disable);
                    Manager::from_connect(config, Connector(NoTls), recycling)
                }
                Some(client) => {
                    // Encrypted or nothing: never a silent plaintext fallback.
                    config.ssl_mode(tokio_postgres::config::SslMode::Require);
                    Manager::from_connect(
                        config,
                        Connector(tokio_postgres_rustls::MakeRustlsConnect::new(client.clone())),
                        recycling,
                    )
                }
            };
            Pool::builder(manager)
                .max_size(size)
                .runtime(Runtime::Tokio1)
                .wait_timeout(Some(link.timeout))
                .create_timeout(Some(link.timeout))
                .post_create(pinned())
                .build()
                .map_err(backend)
        };
        let (lookups, pool) = (pool(LOOKUP_CONNECTIONS)?, pool(link.max_connections)?);
        let mut client = pool.get().await.map_err(|e| {
            let hint = match tls.mode {
                SslMode::Disable => String::new(),
                mode => format!(" (store.postgres_sslmode = {})", mode.as_str()),
            };
            reach::pool(&e, format!("connecting to {location}{hint}: {}", error_chain(&e)))
        })?;
        migrate(&mut client).await.map_err(|e| e.within(format_args!("migrations on {location}")))?;
        warn_without_standby(&client, &location, hosts.len()).await;
        Ok(PgStore { pool, lookups, location, timeout: link.timeout, metrics: StoreMetrics::default() })
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
        self.pool.get().await.map_err(|e| reach::pool(&e, format!("{}: {e}", self.location)))
    }

    /// `dataset`'s record, if any: the default dataset's in `pacpriv_meta`
    /// (where releases before datasets kept it), another's in
    /// `pacpriv_dataset_meta`.
    ///
    /// # Errors
    /// Backend.
    pub async fn meta(&self, dataset: &str) -> Result<Option<Meta>, StoreError> {
        let row = self.dataset_row("secret, teachers", dataset).await?;
        row.map(|r| {
            let secret: i64 = r.get(0);
            Ok(Meta {
                secret: usize::try_from(secret).map_err(|_| backend("stored secret index out of range"))?,
                teachers: r.get(1),
            })
        })
        .transpose()
    }

    /// `columns` of `dataset`'s record, if it has one: the default
    /// dataset's row of `pacpriv_meta`, another's of `pacpriv_dataset_meta`.
    ///
    /// # Errors
    /// Backend.
    async fn dataset_row(&self, columns: &'static str, dataset: &str) -> Result<Option<Row>, StoreError> {
        let client = self.client().await?;
        if dataset == DEFAULT_DATASET {
            client.query_opt(&format!("SELECT {columns} FROM pacpriv_meta WHERE id = 1"), &[]).await
        } else {
            client
                .query_opt(&format!("SELECT {columns} FROM pacpriv_dataset_meta WHERE dataset = $1"), &[&dataset])
                .await
        }
        .map_err(pg)
    }

    /// Every dataset's record, by dataset name.
    ///
    /// # Errors
    /// Backend.
    pub async fn metas(&self) -> Result<Vec<(String, Meta)>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT $1::text, secret, teachers FROM pacpriv_meta \
                 UNION ALL SELECT dataset, secret, teachers FROM pacpriv_dataset_meta",
                &[&DEFAULT_DATASET],
            )
            .await
            .map_err(pg)?;
        rows.iter()
            .map(|r| {
                let secret: i64 = r.get(1);
                let secret = usize::try_from(secret).map_err(|_| backend("stored secret index out of range"))?;
                Ok((r.get(0), Meta { secret, teachers: r.get(2) }))
            })
            .collect()
    }

    /// Writes `meta`, marked keyed by identities, unless another replica
    /// already wrote one; returns what is stored (the first writer wins).
    ///
    /// # Errors
    /// Backend.
    pub async fn init_meta(&self, dataset: &str, meta: &Meta) -> Result<Meta, StoreError> {
        let secret = i64::try_from(meta.secret).map_err(|_| backend("secret index out of range"))?;
        if dataset == DEFAULT_DATASET {
            self.write_durably(
                "INSERT INTO pacpriv_meta (id, secret, teachers, identity_keyed) VALUES (1, $1, $2, true) \
                 ON CONFLICT (id) DO NOTHING",
                &[&secret, &meta.teachers],
                pg,
            )
            .await
        } else {
            self.write_durably(
                "INSERT INTO pacpriv_dataset_meta (dataset, secret, teachers, identity_keyed) \
                 VALUES ($1, $2, $3, true) ON CONFLICT (dataset) DO NOTHING",
                &[&dataset, &secret, &meta.teachers],
                pg,
            )
            .await
        }?;
        self.meta(dataset).await?.ok_or_else(|| backend("meta row missing after insert"))
    }

    /// Runs the one writing statement `sql` in a transaction of its own
    /// that sets `synchronous_commit` for itself ([`connect::durable`]);
    /// the rows it wrote.
    ///
    /// # Errors
    /// The pool's, or the server's as `error` maps it.
    async fn write_durably(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        error: impl Fn(tokio_postgres::Error) -> StoreError,
    ) -> Result<u64, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(&error)?;
        connect::durable(&tx).await.map_err(&error)?;
        let written = tx.execute(sql, params).await.map_err(&error)?;
        tx.commit().await.map_err(&error)?;
        Ok(written)
    }

    /// Whether `dataset`'s versions are keyed by their identities (its
    /// record's `identity_keyed`; false where there is no record).
    ///
    /// # Errors
    /// Backend.
    pub async fn identity_keyed(&self, dataset: &str) -> Result<bool, StoreError> {
        let row = self.dataset_row("identity_keyed", dataset).await?;
        row.map_or(Ok(false), |r| r.try_get(0).map_err(pg))
    }

    /// Marks `dataset`'s versions keyed by their identities, durably.
    ///
    /// # Errors
    /// Backend.
    pub async fn mark_identity_keyed(&self, dataset: &str) -> Result<(), StoreError> {
        if dataset == DEFAULT_DATASET {
            self.write_durably("UPDATE pacpriv_meta SET identity_keyed = true WHERE id = 1", &[], pg).await
        } else {
            self.write_durably(
                "UPDATE pacpriv_dataset_meta SET identity_keyed = true WHERE dataset = $1",
                &[&dataset],
                pg,
            )
            .await
        }
        .map(drop)
    }

    /// `candidate` as `model` at `version`'s identity in `dataset` unless
    /// another replica (or an earlier start) wrote one first; returns what
    /// is stored.
    ///
    /// # Errors
    /// Backend.
    pub async fn claim_version(
        &self,
        dataset: &str,
        model: &str,
        version: &str,
        candidate: &VersionIdentity,
    ) -> Result<VersionIdentity, StoreError> {
        let legacy = candidate.legacy.map(|key| match key {
            LegacyKey::InputOnly => "input",
            LegacyKey::NameAndVersion => "model",
        });
        self.write_durably(
            "INSERT INTO pacpriv_model_versions (dataset, model, version, teachers, legacy_key) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (dataset, model, version) DO NOTHING",
            &[&dataset, &model, &version, &candidate.teachers, &legacy],
            pg,
        )
        .await?;
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT teachers, legacy_key FROM pacpriv_model_versions \
                 WHERE dataset = $1 AND model = $2 AND version = $3",
                &[&dataset, &model, &version],
            )
            .await
            .map_err(pg)?;
        let legacy = match row.try_get::<_, Option<&str>>(1).map_err(pg)? {
            None => None,
            Some("input") => Some(LegacyKey::InputOnly),
            Some("model") => Some(LegacyKey::NameAndVersion),
            Some(other) => return Err(backend(format!("model {model:?} version {version}: legacy key {other:?}"))),
        };
        Ok(VersionIdentity { teachers: row.try_get(0).map_err(pg)?, legacy })
    }

    /// `dataset`'s noise key: `candidate` unless another replica wrote one
    /// first; returns what is stored.
    ///
    /// # Errors
    /// Backend, or a stored key that is not 32 bytes.
    pub async fn init_noise_key(&self, dataset: &str, candidate: &[u8; 32]) -> Result<[u8; 32], StoreError> {
        self.write_durably(
            "INSERT INTO pacpriv_noise_key (dataset, key) VALUES ($1, $2) ON CONFLICT (dataset) DO NOTHING",
            &[&dataset, &candidate.as_slice()],
            pg,
        )
        .await?;
        let client = self.client().await?;
        let row =
            client.query_one("SELECT key FROM pacpriv_noise_key WHERE dataset = $1", &[&dataset]).await.map_err(pg)?;
        let key: Vec<u8> = row.try_get(0).map_err(pg)?;
        <[u8; 32]>::try_from(key.as_slice()).map_err(|_| backend("stored noise key is not 32 bytes"))
    }

    /// A session's latest record.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn load(&self, session: &str) -> Result<Option<SessionRecord>, StoreError> {
        let client = self.client().await?;
        let row = client.query_opt(LOAD_RECORD, &[&session]).await.map_err(pg)?;
        row.map(|r| decode::session_record(session, r.get(0))).transpose()
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
        let statement = client.prepare_cached(LOAD_PROBED).await.map_err(pg)?;
        let row = client.query_opt(&statement, &[&session, &digests, &owners, &prefixes]).await.map_err(pg)?;
        let Some(row) = row else { return Ok((None, CacheRows::none_found(probes))) };
        Ok((record_of(session, row.get(0))?, cache_rows(session, probes, row.get(1), row.get(2))?))
    }

    /// Every session key with a record, in order.
    ///
    /// # Errors
    /// Backend.
    pub async fn sessions(&self) -> Result<Vec<String>, StoreError> {
        let client = self.client().await?;
        let rows = client.query("SELECT session FROM pacpriv_sessions ORDER BY session", &[]).await.map_err(pg)?;
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
            .map_err(pg)?;
        let record = tx
            .query_opt(LOAD_RECORD, &[&session])
            .await
            .map_err(pg)?
            .map(|r| decode::session_record(session, r.get(0)))
            .transpose()?;
        let entries = tx.query(LOAD_JOURNAL, &[&session]).await.map_err(pg)?;
        let events = tx.query(LOAD_EVENTS, &[&session]).await.map_err(pg)?;
        tx.commit().await.map_err(pg)?;
        let entries = decode_journal(session, &entries, decode::journal_entry)?;
        Ok((record, chain_order(entries, decode_journal(session, &events, decode::journal_event)?)))
    }

    /// A session's journal, in version order.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn journal(&self, session: &str) -> Result<Vec<JournalEntry>, StoreError> {
        let client = self.client().await?;
        let rows = client.query(LOAD_JOURNAL, &[&session]).await.map_err(pg)?;
        decode_journal(session, &rows, decode::journal_entry)
    }

    /// Every principal, by name.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn principals(&self) -> Result<Vec<PrincipalRecord>, StoreError> {
        let client = self.client().await?;
        let rows = client.query(select_principals!(" ORDER BY name"), &[]).await.map_err(pg)?;
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
        self.one_principal(&self.pool, select_principals!(" WHERE key_sha256 = $1"), &key).await
    }

    /// [`PgStore::principal_by_key`] for a key not seen naming a principal
    /// lately (perhaps a scan's): on the lookups' own connections, so that
    /// a flood of them waits there, never in front of a step or of a known
    /// key's lookup.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn principal_by_unfamiliar_key(
        &self,
        key_sha256: &[u8; 32],
    ) -> Result<Option<PrincipalRecord>, StoreError> {
        let key: &[u8] = key_sha256;
        self.one_principal(&self.lookups, select_principals!(" WHERE key_sha256 = $1"), &key).await
    }

    /// The principal called `name`.
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn principal(&self, name: &str) -> Result<Option<PrincipalRecord>, StoreError> {
        self.one_principal(&self.pool, select_principals!(" WHERE name = $1"), &name).await
    }

    async fn one_principal(
        &self,
        pool: &Pool,
        sql: &str,
        param: &(dyn tokio_postgres::types::ToSql + Sync),
    ) -> Result<Option<PrincipalRecord>, StoreError> {
        let client = pool.get().await.map_err(|e| reach::pool(&e, format!("{}: {e}", self.location)))?;
        // Bounded as a step is: a lookup hung on a lost primary gives its
        // connection up (dropped, not returned to the pool).
        let row = match tokio::time::timeout(self.timeout, client.query_opt(sql, &[param])).await {
            Ok(row) => row.map_err(pg)?,
            Err(_) => {
                drop(deadpool_postgres::Object::take(client));
                return Err(backend(format!("{}: no reply within {:?}", self.location, self.timeout)));
            }
        };
        row.as_ref().map(principal_of).transpose()
    }

    /// See [`super::Store::provision_all`]: one transaction, one
    /// `provision_in` per record, serialised across replicas by a table
    /// lock that excludes other writers (readers go on, as for
    /// `schema::migrate`). Without it, replicas starting
    /// together on a fresh database insert the same principal at once, and
    /// `ON CONFLICT (name)` covers only the name: the second insert fails
    /// on the key's unique index as if another principal held the key.
    ///
    /// # Errors
    /// As [`super::Store::provision_all`].
    pub async fn provision_all(&self, records: &[PrincipalRecord]) -> Result<Vec<PrincipalRecord>, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let stored = provision_locked(&tx, records).await?;
        tx.commit().await.map_err(pg)?;
        Ok(stored)
    }

    /// See [`super::Store::configure`]: [`PgStore::provision_all`]'s
    /// transaction, with the revocations in it.
    ///
    /// # Errors
    /// As [`super::Store::configure`].
    pub async fn configure(&self, records: &[PrincipalRecord], at_unix: i64) -> Result<Configured, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg)?;
        let stored = provision_locked(&tx, records).await?;
        let listed: Vec<&str> = records.iter().map(|r| r.name.as_str()).collect();
        let rows = tx
            .query(
                concat!(
                    "UPDATE pacpriv_principals SET revoked_unix = $2 ",
                    "WHERE origin = 'config' AND revoked_unix IS NULL AND NOT (name = ANY($1)) RETURNING ",
                    principal_columns!()
                ),
                &[&listed, &at_unix],
            )
            .await
            .map_err(pg)?;
        let revoked = rows.iter().map(principal_of).collect::<Result<_, _>>()?;
        tx.commit().await.map_err(pg)?;
        Ok(Configured { stored, revoked })
    }

    /// See [`super::Store::rotate_key`].
    ///
    /// # Errors
    /// As [`super::Store::rotate_key`].
    pub async fn rotate_key(&self, name: &str, key_sha256: &[u8; 32]) -> Result<Option<PrincipalRecord>, StoreError> {
        let key: &[u8] = key_sha256;
        self.write_durably(
            "UPDATE pacpriv_principals SET key_sha256 = $2 \
             WHERE name = $1 AND origin = 'admin' AND revoked_unix IS NULL",
            &[&name, &key],
            |e| key_in_use(name, e),
        )
        .await?;
        self.principal(name).await
    }

    /// See [`super::Store::revoke`].
    ///
    /// # Errors
    /// Backend or corrupt data.
    pub async fn revoke(&self, name: &str, at_unix: i64) -> Result<Option<PrincipalRecord>, StoreError> {
        self.write_durably(
            "UPDATE pacpriv_principals SET revoked_unix = $2 WHERE name = $1 AND revoked_unix IS NULL",
            &[&name, &at_unix],
            pg,
        )
        .await?;
        self.principal(name).await
    }

    /// One step on `session`, serialised across replicas: locks the row,
    /// hands the current record (`None`: fresh session) and the cache rows
    /// of `probes` to `apply`, writes back the record `apply` returns, if
    /// any, with what changed (its version must be `steps` more; the
    /// journal entries, events and cache writes), and commits; a record
    /// whose change is empty is not written, but the transaction still
    /// commits, which confirms that everything before it reached the
    /// synchronous standby (`step::step_on`). Only a
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
        self.lookups.retain(|_, _| false);
        Err(failure.into())
    }
}

/// Says at start-up when the server has no synchronous standby: a COMMIT
/// then returns once this one node has the step, and a failover to an
/// asynchronous standby can lose the charges of answers already released
/// (docs/operations/configuration.md, `store.postgres_url`). A warning for a
/// URL naming several hosts, which promises failover; a note for one.
async fn warn_without_standby(client: &tokio_postgres::Client, location: &str, hosts: usize) {
    // A PostgreSQL-compatible engine without the setting replicates its
    // own way: nothing to say.
    let Ok(row) = client.query_one("SHOW synchronous_standby_names", &[]).await else { return };
    let names: String = row.get(0);
    if names.trim().is_empty() {
        let says = "has no synchronous standby (synchronous_standby_names is empty): a charge is acknowledged once \
                    this node has it, and is lost with it";
        if hosts > 1 {
            tracing::warn!(
                "store: {location} {says}; a failover to a standby may lose charges of answers already \
                            released. Run PostgreSQL with a synchronous standby (Patroni: synchronous_mode_strict)"
            );
        } else {
            tracing::info!("store: {location} {says}");
        }
    }
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

/// Provisions `records` inside `tx`, under the table lock that serialises
/// provisioning across replicas ([`PgStore::provision_all`]). An error
/// leaves `tx` to be dropped, which rolls back: all or nothing.
async fn provision_locked(
    tx: &deadpool_postgres::Transaction<'_>,
    records: &[PrincipalRecord],
) -> Result<Vec<PrincipalRecord>, StoreError> {
    connect::durable(tx).await.map_err(pg)?;
    tx.batch_execute("LOCK TABLE pacpriv_principals IN SHARE ROW EXCLUSIVE MODE").await.map_err(pg)?;
    let mut stored = Vec::with_capacity(records.len());
    for record in records {
        stored.push(provision_in(tx, record).await?);
    }
    Ok(stored)
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
    let unique = |e| key_in_use(&record.name, e);
    let (datasets, budgets): (Vec<&str>, Vec<f64>) =
        record.dataset_budgets.iter().map(|(d, b)| (d.as_str(), *b)).unzip();
    let inserted = tx
        .execute(
            "INSERT INTO pacpriv_principals \
             (name, key_sha256, budget, origin, created_unix, revoked_unix, budget_datasets, budget_values) \
             VALUES ($1, $2, $3, $4, $5, NULL, $6, $7) ON CONFLICT (name) DO NOTHING",
            &[&record.name, &key, &record.budget, &origin, &record.created_unix, &datasets, &budgets],
        )
        .await
        .map_err(unique)?;
    let current = async || -> Result<Option<PrincipalRecord>, StoreError> {
        let row = tx.query_opt(select_principals!(" WHERE name = $1"), &[&record.name]).await.map_err(pg)?;
        row.as_ref().map(principal_of).transpose()
    };
    if inserted == 0 {
        let updated = match record.origin {
            Origin::Admin => 0,
            Origin::Config => tx
                .execute(
                    "UPDATE pacpriv_principals SET key_sha256 = $2, budget = $3, budget_datasets = $4, budget_values = $5 \
                     WHERE name = $1 AND origin = 'config'",
                    &[&record.name, &key, &record.budget, &datasets, &budgets],
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

/// `e` as [`StoreError::KeyInUse`] when it violates the key's unique
/// index (another principal holds the key `name` was to get), else as a
/// backend error.
fn key_in_use(name: &str, e: tokio_postgres::Error) -> StoreError {
    if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) {
        StoreError::KeyInUse { name: name.to_owned() }
    } else {
        pg(e)
    }
}

fn principal_of(row: &tokio_postgres::Row) -> Result<PrincipalRecord, StoreError> {
    let name: String = row.get(0);
    let corrupt = |reason: &str| StoreError::Corrupt { session: format!("(principal {name})"), reason: reason.into() };
    let key: &[u8] = row.get(1);
    let origin: &str = row.get(3);
    let datasets: Vec<String> = row.try_get(6).map_err(|_| corrupt("budget_datasets is not a list of names"))?;
    let budgets: Vec<f64> = row.try_get(7).map_err(|_| corrupt("budget_values is not a list of numbers"))?;
    if datasets.len() != budgets.len() {
        return Err(corrupt("budget_datasets and budget_values differ in length"));
    }
    let named = datasets.len();
    let dataset_budgets: std::collections::BTreeMap<String, f64> = datasets.into_iter().zip(budgets).collect();
    if dataset_budgets.len() != named {
        return Err(corrupt("budget_datasets names a dataset twice"));
    }
    Ok(PrincipalRecord {
        dataset_budgets,
        key_sha256: key.try_into().map_err(|_| corrupt("key_sha256 is not 32 bytes"))?,
        budget: row.get(2),
        origin: Origin::parse(origin).ok_or_else(|| corrupt("unknown origin"))?,
        created_unix: row.get(4),
        revoked_unix: row.get(5),
        name,
    })
}

/// Decodes `session`'s journal items in `rows` (one BYTEA column) with
/// `decode` (`decode::journal_entry` or `decode::journal_event`).
fn decode_journal<T>(
    session: &str,
    rows: &[tokio_postgres::Row],
    decode: fn(&str, &[u8]) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    rows.iter().map(|r| decode(session, r.get(0))).collect()
}
