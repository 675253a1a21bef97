//! The principal registry: which credentials name which principal, and the
//! session each principal is charged to in each dataset. Principals come
//! from the configuration (re-applied at every start) and from the admin
//! API; both are kept in the store ([`pacpriv_store::principal`]). A
//! principal's budget is its limit in every dataset but those it has a
//! budget of its own in (never the default dataset).
//!
//! # Invariants
//! - A credential is looked up by the SHA-256 of the key, never by the key:
//!   a lookup's timing can reveal at most how a digest compares, which says
//!   nothing about the key (a map lookup compares digests, not secrets).
//! - Revocation is durable before it takes effect in memory, and takes
//!   effect for every request that authenticates after it returns.
//! - There is no reset: a principal's session is keyed by its name (and
//!   the dataset's, [`session_key`]), names are never reused, and revoking
//!   keeps the spending on record.
//! - With the embedded store this process is the only writer, so the
//!   in-memory registry is authoritative. With PostgreSQL every request
//!   looks its key up in the database, so a principal created or revoked on
//!   one replica is seen by all of them at once.

use super::caller::{Caller, DatasetIndex};
use super::credential::{Credential, Presented, hex};
use super::error::SessionError;
use super::handle::{self, Handle};
use super::state::{BudgetView, Scope, Session, SessionParams, Terms};
use super::unknown_keys::{Lookup, UnknownKeys};
use pacpriv_privacy::Nats;
use pacpriv_store::cell::Cell;
use pacpriv_store::principal::now_unix;
use pacpriv_store::{Configured, GLOBAL_SESSION, Origin, PrincipalRecord, Store, session_key};
use rand::TryRng;
use rand::rngs::SysRng;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

/// Longest principal name.
pub const MAX_NAME_LEN: usize = 64;

/// A provisioned principal.
#[derive(Clone, Debug)]
pub struct PrincipalConfig {
    /// Name, used in logs and responses.
    pub name: String,
    /// SHA-256 of its API key.
    pub key_sha256: [u8; 32],
    /// Its MI budget (its sessions' limit under per-principal scope).
    pub budget: Nats,
    /// Its limit in some datasets other than the default one, by name.
    pub dataset_budgets: BTreeMap<String, Nats>,
}

impl PrincipalConfig {
    /// Its store record, provisioned by the configuration at `now_unix`.
    pub fn record(&self, now_unix: i64) -> pacpriv_store::PrincipalRecord {
        pacpriv_store::PrincipalRecord {
            name: self.name.clone(),
            key_sha256: self.key_sha256,
            budget: self.budget.get(),
            dataset_budgets: in_nats(&self.dataset_budgets),
            origin: pacpriv_store::Origin::Config,
            created_unix: now_unix,
            revoked_unix: None,
        }
    }
}

/// Per-dataset budgets as the store record holds them (nats as `f64`).
fn in_nats(budgets: &BTreeMap<String, Nats>) -> BTreeMap<String, f64> {
    budgets.iter().map(|(dataset, b)| (dataset.clone(), b.get())).collect()
}

/// A principal and its current account in each dataset.
#[derive(Clone, Debug)]
pub struct Account {
    /// The stored principal.
    pub principal: PrincipalRecord,
    /// Its account in each dataset, in the registry's order (the default
    /// dataset first).
    pub datasets: Vec<DatasetAccount>,
}

/// A principal's account in one dataset.
#[derive(Clone, Debug)]
pub struct DatasetAccount {
    /// The dataset's name.
    pub dataset: String,
    /// The dataset's session scope.
    pub scope: Scope,
    /// The session's account (the shared one under global scope).
    pub budget: BudgetView,
}

/// One dataset of the registry: how its sessions are opened.
#[derive(Clone, Debug)]
pub struct DatasetTerms {
    /// Its name ([`DEFAULT_DATASET`](pacpriv_store::DEFAULT_DATASET) first).
    pub name: Arc<str>,
    /// Whose transcript a session bounds.
    pub scope: Scope,
    /// The shared session's limit under global scope.
    pub global_budget: Nats,
    /// What its sessions share (b, policy, m, s*, …): one copy for all
    /// of them.
    pub params: Arc<SessionParams>,
}

impl DatasetTerms {
    /// The default dataset (the only one of a deployment that declares
    /// none).
    pub fn default_dataset(scope: Scope, global_budget: Nats, params: SessionParams) -> Self {
        DatasetTerms { name: pacpriv_store::DEFAULT_DATASET.into(), scope, global_budget, params: Arc::new(params) }
    }
}

/// A dataset as the registry holds it.
struct Dataset {
    terms: DatasetTerms,
    /// The one session under global scope.
    shared: Option<Arc<Session>>,
}

/// A principal's sessions, one per dataset, in the registry's order.
type PrincipalSessions = Arc<[Arc<Session>]>;

/// The embedded store's in-memory registry.
#[derive(Default)]
struct Local {
    /// Every principal, revoked ones too, with its sessions.
    principals: HashMap<String, (PrincipalRecord, PrincipalSessions)>,
    /// Active principals' names by key digest.
    by_key: HashMap<[u8; 32], String>,
}

impl Local {
    /// `record` in place of the held one of its name (a revocation, a
    /// rotated key), its session kept: the old key no longer names it, the
    /// new one does while it is active.
    fn update(&mut self, record: PrincipalRecord) {
        let Some((held, _)) = self.principals.get_mut(&record.name) else { return };
        if self.by_key.get(&held.key_sha256) == Some(&record.name) {
            self.by_key.remove(&held.key_sha256);
        }
        if record.active() {
            self.by_key.insert(record.key_sha256, record.name.clone());
        }
        *held = record;
    }
}

/// Every provisioned principal and its session in each dataset.
pub struct Sessions {
    /// At least one: the default dataset first.
    datasets: Vec<Dataset>,
    store: Store,
    /// Embedded store only (see the module invariants).
    local: Option<RwLock<Local>>,
    /// PostgreSQL only: key digests that named no principal a moment ago.
    unknown: UnknownKeys,
    /// A key digest refused whoever holds it ([`Sessions::refusing`]).
    refused: Option<[u8; 32]>,
}

impl Sessions {
    /// Provisions the configured principals in one transaction (inserting
    /// new ones, updating the key and budget of earlier configured ones;
    /// on a conflict none is stored), then opens, in each of `datasets`
    /// (the default one first), one session per stored principal, or one
    /// shared session with the dataset's global budget. With the embedded
    /// store each resumes from its latest durable record (or the uniform
    /// prior); with PostgreSQL the state is read per query.
    ///
    /// # Errors
    /// No dataset, an invalid b or budget, an unreadable/corrupt record,
    /// or a configured principal whose name or key an admin-created one
    /// holds.
    pub async fn new(
        configured: &[PrincipalConfig],
        datasets: Vec<DatasetTerms>,
        store: &Store,
    ) -> Result<Self, SessionError> {
        if datasets.is_empty() {
            return Err(SessionError::InvalidPrincipal("no dataset to open sessions in".into()));
        }
        if let Some(p) = configured.iter().find(|p| collides(&p.name, datasets.iter().map(|d| &*d.name))) {
            return Err(colliding(&p.name));
        }
        let now = now_unix();
        let records: Vec<PrincipalRecord> = configured.iter().map(|p| p.record(now)).collect();
        // One transaction for all of them: a configuration with many
        // principals starts in one fsync, and a conflict stores none.
        let applied = store.configure(&records, now).await.map_err(SessionError::Registry)?;
        for stored in &applied.stored {
            if !stored.active() {
                tracing::warn!(principal = %stored.name, "configured principal was revoked through the admin API; it stays revoked");
            }
        }
        log_revoked(&applied.revoked);
        let mut opened = Vec::with_capacity(datasets.len());
        for terms in datasets {
            let shared = match terms.scope {
                Scope::Global => Some(open(store, &terms, GLOBAL_SESSION, terms.global_budget)?),
                Scope::PerPrincipal => None,
            };
            opened.push(Dataset { terms, shared });
        }
        let mut sessions = Sessions {
            datasets: opened,
            store: store.clone(),
            local: None,
            unknown: UnknownKeys::default(),
            refused: None,
        };
        if store.single_writer() {
            let mut local = Local::default();
            for record in store.principals().await.map_err(SessionError::Registry)? {
                if sessions.collides(&record.name) {
                    // Stored by an earlier release's configuration: refused,
                    // never opened on another session's key; the rest serve.
                    tracing::error!(principal = %record.name, "{}", colliding(&record.name));
                    continue;
                }
                sessions.insert_local(&mut local, record)?;
            }
            sessions.local = Some(RwLock::new(local));
        }
        Ok(sessions)
    }

    /// Applies a reloaded configuration's principals: new ones provisioned,
    /// changed keys and budgets of configured ones in force from the next
    /// request (the old key refused; the spending kept, checked against
    /// the new budget), configured principals no longer listed revoked
    /// (for good, as through the admin API). Principals created through the
    /// admin API are left as they are. Returns the names revoked.
    ///
    /// # Errors
    /// As [`Sessions::new`]; on any error — a provisioning conflict, the
    /// store failing midway — nothing changed (one transaction).
    pub async fn reconfigure(&self, configured: &[PrincipalConfig]) -> Result<Vec<String>, SessionError> {
        if let Some(p) = configured.iter().find(|p| self.collides(&p.name)) {
            return Err(colliding(&p.name));
        }
        let now = now_unix();
        let records: Vec<PrincipalRecord> = configured.iter().map(|p| p.record(now)).collect();
        let Configured { stored, revoked } =
            self.store.configure(&records, now).await.map_err(SessionError::Registry)?;
        log_revoked(&revoked);
        for record in &stored {
            self.unknown.forget(&record.key_sha256);
        }
        if let Some(local) = &self.local {
            let mut local = local.write().map_err(|_| SessionError::Poisoned)?;
            for record in &revoked {
                local.update(record.clone());
            }
            for record in stored {
                let Some((old, session)) = local.principals.get(&record.name).cloned() else {
                    self.insert_local(&mut local, record)?;
                    continue;
                };
                let retargeted = self.datasets.iter().zip(session.iter()).map(|(dataset, session)| {
                    let name = &*dataset.terms.name;
                    if dataset.shared.is_some() || old.budget_in(name) == record.budget_in(name) {
                        return Ok(Arc::clone(session));
                    }
                    let limit = Nats::new(record.budget_in(name))?;
                    Ok(Arc::new(session.retarget(Terms { params: Arc::clone(&dataset.terms.params), limit })?))
                });
                let sessions = retargeted.collect::<Result<Vec<_>, SessionError>>()?.into();
                if old.key_sha256 != record.key_sha256 && local.by_key.get(&old.key_sha256) == Some(&record.name) {
                    local.by_key.remove(&old.key_sha256);
                }
                if record.active() {
                    local.by_key.insert(record.key_sha256, record.name.clone());
                }
                local.principals.insert(record.name.clone(), (record, sessions));
            }
        }
        Ok(revoked.into_iter().map(|r| r.name).collect())
    }

    /// The sessions `record` is charged to, one per dataset.
    fn sessions_for(&self, record: &PrincipalRecord) -> Result<PrincipalSessions, SessionError> {
        // A name stored by an earlier release that would name another
        // session is refused, never opened.
        if self.collides(&record.name) {
            return Err(colliding(&record.name));
        }
        let sessions = self.datasets.iter().map(|dataset| match &dataset.shared {
            Some(shared) => Ok(Arc::clone(shared)),
            None => open(&self.store, &dataset.terms, &record.name, Nats::new(record.budget_in(&dataset.terms.name))?),
        });
        Ok(sessions.collect::<Result<Vec<_>, SessionError>>()?.into())
    }

    fn insert_local(&self, local: &mut Local, record: PrincipalRecord) -> Result<(), SessionError> {
        let sessions = self.sessions_for(&record)?;
        if record.active() {
            local.by_key.insert(record.key_sha256, record.name.clone());
        }
        local.principals.insert(record.name.clone(), (record, sessions));
        Ok(())
    }

    fn caller(&self, name: &str, sessions: &PrincipalSessions, presented: Presented) -> Caller {
        let principal: Arc<str> = name.into();
        let handles = self.datasets.iter().zip(sessions.iter()).map(|(dataset, session)| Handle {
            principal: Arc::clone(&principal),
            dataset: Arc::clone(&dataset.terms.name),
            scope: dataset.terms.scope,
            session: Arc::clone(session),
        });
        let handles = handles.collect();
        Caller { principal, presented, handles }
    }

    fn read_local(local: &RwLock<Local>) -> Result<std::sync::RwLockReadGuard<'_, Local>, SessionError> {
        local.read().map_err(|_| SessionError::Poisoned)
    }

    /// The active principal a credential names.
    ///
    /// # Errors
    /// [`SessionError::Unauthenticated`] (unknown, revoked), or
    /// [`SessionError::Registry`] when PostgreSQL cannot be asked.
    pub async fn authenticate(&self, credential: Credential<'_>) -> Result<Caller, SessionError> {
        self.lookup(Presented::from(credential), None).await
    }

    /// [`Sessions::authenticate`] for a credential `peer` presented: on
    /// PostgreSQL, a peer that has looked up too many unknown keys of late
    /// is refused any key this replica has not seen name a principal
    /// recently, without a lookup ([`UnknownKeys`]).
    ///
    /// # Errors
    /// As [`Sessions::authenticate`].
    pub async fn authenticate_from(
        &self,
        credential: Credential<'_>,
        peer: Option<std::net::IpAddr>,
    ) -> Result<Caller, SessionError> {
        self.lookup(Presented::from(credential), peer).await
    }

    /// `caller` (authenticated earlier, e.g. when its stream opened) as the
    /// registry has it now: its credential must still name the same active
    /// principal — a rotated or removed key, or a revoked principal, stops
    /// an open stream at its next query — and the sessions come with the
    /// principal's current budget, so a cut reaches the stream too.
    ///
    /// # Errors
    /// [`SessionError::Unauthenticated`] when the credential no longer
    /// names this principal, or [`SessionError::Registry`] when PostgreSQL
    /// cannot be asked.
    pub async fn recheck(&self, caller: &Caller) -> Result<Caller, SessionError> {
        let now = self.lookup(caller.presented.clone(), None).await?;
        if now.principal != caller.principal {
            return Err(SessionError::Unauthenticated);
        }
        Ok(now)
    }

    /// Marks every active principal's key as seen lately, from the store
    /// (PostgreSQL; the embedded registry is in memory and looks nothing
    /// up): after a restart, or for a principal created on another
    /// replica, a real principal's key never draws on its peer's lookup
    /// bucket, whatever a flood from the same address (a proxy, a NAT)
    /// does. Start-up runs it, then every [`super::KNOWN_REFRESH`].
    /// A key marked so is still looked up on every call.
    ///
    /// # Errors
    /// [`SessionError::Registry`] when the store cannot be read.
    pub async fn learn_active_keys(&self) -> Result<(), SessionError> {
        if self.local.is_some() {
            return Ok(());
        }
        for record in self.store.principals().await.map_err(SessionError::Registry)? {
            if record.active() && Some(record.key_sha256) != self.refused {
                self.unknown.forget(&record.key_sha256);
                self.unknown.known(&record.key_sha256);
            }
        }
        Ok(())
    }

    /// These sessions, refusing the key whose digest is `refused` (the
    /// published demo key on a server listening off loopback) whoever
    /// stored a principal with it: another replica's configuration, or an
    /// earlier release's.
    pub fn refusing(self, refused: Option<[u8; 32]>) -> Self {
        Sessions { refused, ..self }
    }

    async fn lookup(&self, presented: Presented, peer: Option<std::net::IpAddr>) -> Result<Caller, SessionError> {
        if let (Some(refused), Presented::Key(digest)) = (&self.refused, &presented)
            && digest == refused
        {
            return Err(SessionError::Unauthenticated);
        }
        if let Some(local) = &self.local {
            let local = Self::read_local(local)?;
            let name = match &presented {
                Presented::Key(digest) => local.by_key.get(digest).map(String::as_str),
                Presented::Certificate(cn) => Some(&**cn),
            };
            return match name.and_then(|n| local.principals.get(n)) {
                Some((record, sessions)) if record.active() => Ok(self.caller(&record.name, sessions, presented)),
                _ => Err(SessionError::Unauthenticated),
            };
        }
        let record = match &presented {
            Presented::Key(digest) => match self.unknown.classify(digest, peer) {
                Lookup::Unknown => return Err(SessionError::Unauthenticated),
                Lookup::Limited => return Err(SessionError::LookupsLimited),
                Lookup::Familiar => self.store.principal_by_key(digest).await,
                Lookup::Unfamiliar => self.store.principal_by_unfamiliar_key(digest).await,
            },
            Presented::Certificate(cn) => self.store.principal(cn).await,
        }
        .map_err(SessionError::Registry)?;
        match record {
            Some(r) if r.active() => {
                if let Presented::Key(digest) = &presented {
                    self.unknown.known(digest);
                }
                Ok(self.caller(&r.name, &self.sessions_for(&r)?, presented))
            }
            Some(_) => Err(SessionError::Unauthenticated),
            None => {
                if let Presented::Key(digest) = presented {
                    self.unknown.insert(digest);
                }
                Err(SessionError::Unauthenticated)
            }
        }
    }

    /// Provisions a new principal with `budget` (and `dataset_budgets` in
    /// those datasets) and a fresh random API key, durably; returns the
    /// record and the key (shown once, stored only as its hash).
    ///
    /// # Errors
    /// [`SessionError::InvalidPrincipal`] for a bad name or a dataset
    /// budget for the default dataset or one this registry does not have,
    /// [`SessionError::Registry`] for a taken name or a store failure.
    pub async fn create(
        &self,
        name: &str,
        budget: Nats,
        dataset_budgets: &BTreeMap<String, Nats>,
    ) -> Result<(Account, String), SessionError> {
        check_name(name)?;
        // Its own budgets are for further datasets of per-principal scope
        // (under global scope every principal shares one session).
        let further = || self.datasets.iter().skip(1).filter(|d| d.shared.is_none()).map(|d| &*d.terms.name);
        if let Some(dataset) = dataset_budgets.keys().find(|d| !further().any(|f| f == d.as_str())) {
            let known: Vec<_> = further().collect();
            return Err(SessionError::InvalidPrincipal(format!(
                "no budget for dataset {dataset:?}: a principal's own budgets are for datasets other than the \
                 default one (whose limit is its budget_mi) and not of global scope; this server has {known:?}"
            )));
        }
        let key = new_api_key()?;
        let record = PrincipalRecord {
            name: name.to_owned(),
            key_sha256: Sha256::digest(key.as_bytes()).into(),
            budget: budget.get(),
            dataset_budgets: in_nats(dataset_budgets),
            origin: Origin::Admin,
            created_unix: now_unix(),
            revoked_unix: None,
        };
        let stored = self.store.provision(&record).await.map_err(SessionError::Registry)?;
        self.unknown.forget(&stored.key_sha256);
        if let Some(local) = &self.local {
            let mut local = local.write().map_err(|_| SessionError::Poisoned)?;
            self.insert_local(&mut local, stored.clone())?;
        }
        tracing::info!(principal = %name, budget = budget.get(), "principal created");
        Ok((self.account(stored).await?, key))
    }

    /// Every principal with its account, by name.
    ///
    /// # Errors
    /// Store failures.
    pub async fn list(&self) -> Result<Vec<Account>, SessionError> {
        self.accounts(|_| true).await
    }

    /// The accounts of the principals `keep` selects, by name in byte
    /// order (whatever a database's collation would say).
    async fn accounts(&self, keep: impl Fn(&PrincipalRecord) -> bool) -> Result<Vec<Account>, SessionError> {
        let mut records = self.store.principals().await.map_err(SessionError::Registry)?;
        records.sort_by(|a, b| a.name.cmp(&b.name));
        let mut out = Vec::new();
        for record in records.into_iter().filter(|r| keep(r)) {
            out.push(self.account(record).await?);
        }
        Ok(out)
    }

    /// One principal with its account.
    ///
    /// # Errors
    /// [`SessionError::UnknownPrincipal`], store failures.
    pub async fn inspect(&self, name: &str) -> Result<Account, SessionError> {
        let record = self.store.principal(name).await.map_err(SessionError::Registry)?;
        self.account(record.ok_or_else(|| SessionError::UnknownPrincipal(name.to_owned()))?).await
    }

    /// Gives the admin-created principal `name` a fresh random API key,
    /// durably; returns its account and the key (shown once, stored only
    /// as its hash). The old key is refused from the next request on — an
    /// open stream's too, at its next query ([`Sessions::recheck`]) — and
    /// the session, with its spending, stays the principal's.
    ///
    /// # Errors
    /// [`SessionError::UnknownPrincipal`], [`SessionError::NotRotatable`]
    /// (a configured or revoked principal), [`SessionError::Registry`].
    pub async fn rotate(&self, name: &str) -> Result<(Account, String), SessionError> {
        let key = new_api_key()?;
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let record = self.store.rotate_key(name, &digest).await.map_err(SessionError::Registry)?;
        let record = record.ok_or_else(|| SessionError::UnknownPrincipal(name.to_owned()))?;
        let why = match (record.origin, record.active()) {
            (_, false) => Some("revoked"),
            (Origin::Config, true) => Some("configured"),
            (Origin::Admin, true) => None,
        };
        if let Some(why) = why {
            return Err(SessionError::NotRotatable { name: name.to_owned(), why });
        }
        self.unknown.forget(&digest);
        if let Some(local) = &self.local {
            local.write().map_err(|_| SessionError::Poisoned)?.update(record.clone());
        }
        tracing::info!(principal = %name, "principal's API key rotated");
        Ok((self.account(record).await?, key))
    }

    /// Revokes `name`: durably first, then in memory, so no request that
    /// authenticates after this returns is answered. Its spending stays on
    /// record; revoking twice is harmless.
    ///
    /// # Errors
    /// [`SessionError::UnknownPrincipal`], store failures.
    pub async fn revoke(&self, name: &str) -> Result<Account, SessionError> {
        let record = self.store.revoke(name, now_unix()).await.map_err(SessionError::Registry)?;
        let record = record.ok_or_else(|| SessionError::UnknownPrincipal(name.to_owned()))?;
        if let Some(local) = &self.local {
            local.write().map_err(|_| SessionError::Poisoned)?.update(record.clone());
        }
        tracing::info!(principal = %name, "principal revoked");
        self.account(record).await
    }

    /// `record` with its sessions' current accounts.
    async fn account(&self, principal: PrincipalRecord) -> Result<Account, SessionError> {
        let cached = match &self.local {
            Some(local) => Self::read_local(local)?.principals.get(&principal.name).map(|(_, s)| Arc::clone(s)),
            None => None,
        };
        let sessions = match cached {
            Some(s) => s,
            None => self.sessions_for(&principal)?,
        };
        let mut datasets = Vec::with_capacity(self.datasets.len());
        for (dataset, session) in self.datasets.iter().zip(sessions.iter()) {
            datasets.push(DatasetAccount {
                dataset: dataset.terms.name.to_string(),
                scope: dataset.terms.scope,
                budget: handle::account_of(session).await?,
            });
        }
        Ok(Account { datasets, principal })
    }

    /// Every active principal's name and current account (for the budget
    /// gauges at start-up).
    ///
    /// # Errors
    /// Store failures.
    pub async fn active_accounts(&self) -> Result<Vec<Account>, SessionError> {
        self.accounts(PrincipalRecord::active).await
    }

    /// How many principals may authenticate (no account is read).
    ///
    /// # Errors
    /// Store failures.
    pub async fn active_count(&self) -> Result<usize, SessionError> {
        match &self.local {
            Some(local) => Ok(Self::read_local(local)?.by_key.len()),
            None => {
                Ok(self.store.principals().await.map_err(SessionError::Registry)?.iter().filter(|p| p.active()).count())
            }
        }
    }

    /// Whether every step is journaled (`store.journal`, the same in
    /// every dataset).
    pub fn journaled(&self) -> bool {
        self.datasets.iter().any(|d| d.terms.params.journal)
    }

    /// Each dataset's name and noise key, in order: what `pacpriv admin
    /// export --noise-key` hands an auditor (the admin API only).
    pub fn noise_keys(&self) -> impl Iterator<Item = (&str, &pacpriv_privacy::keyed::NoiseKey)> {
        self.datasets.iter().map(|d| (&*d.terms.name, &d.terms.params.noise))
    }

    /// The datasets' names, in order: what a [`DatasetIndex`] indexes.
    pub fn datasets(&self) -> impl Iterator<Item = &str> {
        self.datasets.iter().map(|d| &*d.terms.name)
    }

    /// Whether principal `name`'s session key would be another session's
    /// here ([`collides`]).
    fn collides(&self, name: &str) -> bool {
        collides(name, self.datasets.iter().map(|d| &*d.terms.name))
    }

    /// The position of the dataset `name`.
    pub fn dataset_index(&self, name: &str) -> Option<DatasetIndex> {
        self.datasets.iter().position(|d| &*d.terms.name == name)
    }

    /// The store the sessions are kept in (a reload claims the identity
    /// of a model version it builds there: `start::identity`).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The key of every session the store holds a record for.
    ///
    /// # Errors
    /// The store could not be read.
    pub async fn session_keys(&self) -> Result<Vec<String>, SessionError> {
        self.store.sessions().await.map_err(SessionError::Store)
    }

    /// Session `key`'s durable record and journal, from one snapshot of
    /// the store (an answer is released only once durable, so a step still
    /// in flight is in neither).
    ///
    /// # Errors
    /// The store could not be read, or holds corrupt data.
    pub async fn journal_of(
        &self,
        key: &str,
    ) -> Result<(Option<pacpriv_store::SessionRecord>, Vec<pacpriv_store::Journaled>), SessionError> {
        self.store.journal_snapshot(key).await.map_err(SessionError::Store)
    }
}

/// Says which configured principals the configuration no longer names
/// were revoked (at start-up or on reload).
fn log_revoked(revoked: &[PrincipalRecord]) {
    for r in revoked {
        tracing::warn!(principal = %r.name, "configured principal no longer in the configuration: revoked");
    }
}

/// A session object for principal `name` (or [`GLOBAL_SESSION`]) in the
/// dataset `terms` describes, with `limit`: resumed from the embedded
/// store, or a handle on the PostgreSQL row.
fn open(store: &Store, terms: &DatasetTerms, name: &str, limit: Nats) -> Result<Arc<Session>, SessionError> {
    let key = session_key(&terms.name, name);
    Ok(Arc::new(Cell::open(store, &key, Terms { params: Arc::clone(&terms.params), limit })?))
}

/// Whether principal `name`'s session key would be another session's
/// among `datasets` ([`session_key`]): the shared session's
/// ([`GLOBAL_SESSION`]), or one of another dataset's (`DATASET/…`). Names
/// the admin API creates never do ([`check_name`]); configured names
/// (which earlier releases did not restrict) are checked when the
/// configuration loads and when the registry opens, stored ones when their
/// sessions open.
pub fn collides<'a>(name: &str, mut datasets: impl Iterator<Item = &'a str>) -> bool {
    name == GLOBAL_SESSION || name.split_once('/').is_some_and(|(prefix, _)| datasets.any(|d| d == prefix))
}

/// The refusal of a principal whose name [`collides`].
fn colliding(name: &str) -> SessionError {
    SessionError::InvalidPrincipal(format!(
        "principal {name:?}: its session would be another's (the shared session, or another dataset's, \
         DATASET/NAME); such a principal is not served"
    ))
}

/// Principals' names, configured or created by the admin API, are 1–64 of
/// `[A-Za-z0-9_.-]`: safe in logs, metric labels and store keys, and
/// never [`collides`] with any dataset, present or added later.
///
/// # Errors
/// [`SessionError::InvalidPrincipal`] naming the rule.
pub fn check_name(name: &str) -> Result<(), SessionError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(SessionError::InvalidPrincipal(format!(
            "principal name {name:?}: use 1 to {MAX_NAME_LEN} letters, digits, '_', '.' or '-'"
        )))
    }
}

/// 256 bits from the OS CSPRNG, hex, with a recognisable prefix (so a
/// leaked key is easy to grep for in code and logs).
fn new_api_key() -> Result<String, SessionError> {
    let mut bytes = [0u8; 32];
    SysRng.try_fill_bytes(&mut bytes).map_err(|e| SessionError::InvalidPrincipal(format!("OS random source: {e}")))?;
    Ok(format!("ppk_{}", hex(&bytes)))
}
