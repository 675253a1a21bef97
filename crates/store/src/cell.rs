//! Where a session's state lives, and how one step on it becomes durable:
//! the one place that knows the two answers.
//!
//! - **In this process** (embedded store, the only writer): the state is
//!   held in memory and authoritative; a step runs under the session's
//!   lock and queues its record for the next group commit under that lock,
//!   so a session's records reach the disk in order, and the caller waits
//!   for the [`Ticket`] outside the lock (early lock release).
//! - **In the database** (PostgreSQL, shared by replicas): nothing is held;
//!   a read reads the committed row, and a step runs in one transaction
//!   that locks the row, steps from the state it read and writes the next
//!   version back ([`PgStore::step`]); it is durable when it returns.
//!
//! The service's sessions (`pacpriv_service::session`) read and step a [`Cell`] without knowing which.
//!
//! # Invariants
//! - In this process, a step's answers wait for the ticket its
//!   [`Release`] names: a charged step's own record; for a cached answer
//!   of a charged step, nothing if the session's last charged record is
//!   durable, else its own record, which commits after that one (the step
//!   that produced the answer may still be committing, or its commit may
//!   have failed); for a free answer, nothing. In the database
//!   every step is durable when it returns: a cached answer was read from
//!   committed state under the row lock, and unless it is free its
//!   transaction commits too, which waits for the synchronous standby to
//!   have everything committed before (`postgres::step`).
//! - A step's closure runs once, on state no other step of the session
//!   sees half-applied.
//! - Every record handed to the store carries the cache writes made since
//!   the previous one ([`State::record`] returns both), so the two are
//!   always committed together.
//! - In the database, a read or step sees the cached answers of the
//!   queries it names (its probes) and only those; in this process the
//!   state holds them all.

use super::answers::{CacheProbe, CacheRows, CacheWrite};
use super::backend::Store;
use super::change::{Change, Release};
use super::embedded::EmbeddedStore;
use super::error::StoreError;
use super::postgres::PgStore;
use super::record::SessionRecord;
use super::ticket::Ticket;
use std::sync::{Arc, Mutex};

/// A session's state as a cell holds it.
pub trait State: Sized + Send + 'static {
    /// What resuming needs besides the record (configuration).
    type Context: Send + Sync + 'static;
    /// The session layer's error, which a store error converts into.
    type Error: From<StoreError> + Send + 'static;

    /// The state `record` of session `key` and its cached answers `cache`
    /// describe (`None`: fresh).
    ///
    /// # Errors
    /// A record that does not fit the context (corrupt, another m).
    fn resume(
        context: &Self::Context,
        key: &str,
        record: Option<&SessionRecord>,
        cache: CacheRows,
    ) -> Result<Self, Self::Error>;

    /// The record that makes this state durable, and the cache writes made
    /// since the last call (taken: the caller writes them with the record).
    fn record(&mut self) -> (SessionRecord, Vec<CacheWrite>);

    /// Brings a held state in line with a changed `context` (the
    /// configuration was reloaded).
    fn retarget(&mut self, context: &Self::Context);

    /// The error for a lock an earlier panic poisoned (or a step's
    /// blocking thread that panicked): refuse rather than risk a
    /// half-applied step.
    fn poisoned() -> Self::Error;
}

/// What makes `state` durable after a step that made `change`: its
/// record, and the change with the cache writes made since the last
/// record (the one place that pairs them).
fn durable_form<S: State>(state: &mut S, mut change: Change) -> (SessionRecord, Change) {
    let (record, cache) = state.record();
    change.cache = cache;
    (record, change)
}

/// One session's state, where the store keeps it.
pub struct Cell<S: State> {
    key: String,
    context: S::Context,
    place: Place<S>,
}

enum Place<S> {
    Memory(Arc<Held<S>>),
    Database(Arc<PgStore>),
}

/// A state held in this process, and the store that makes it durable.
struct Held<S> {
    state: Mutex<Latest<S>>,
    store: Arc<EmbeddedStore>,
}

/// A held state and the ticket of its last record whose answers had to
/// wait for it: what a cached charged answer waits for, if anything.
struct Latest<S> {
    state: S,
    charged: Option<Ticket>,
}

impl<S: State> Held<S> {
    /// Applies `apply` and queues the result under the lock; returns the
    /// ticket its answers wait for, as the step's [`Release`] says.
    fn step<T>(
        &self,
        key: &str,
        apply: impl FnOnce(&mut S) -> Result<(T, Change), S::Error>,
    ) -> Result<(T, Option<Ticket>), S::Error> {
        let mut latest = self.state.lock().map_err(|_| S::poisoned())?;
        // Before anything is drawn: a store whose last commit failed takes
        // no step (nothing would reach the disk).
        self.store.writable()?;
        let (value, change) = apply(&mut latest.state)?;
        let release = change.release;
        let (record, change) = durable_form(&mut latest.state, change);
        let ticket = self.store.enqueue(key, record, change)?;
        // A durable ticket says nothing any more: dropped here, so a
        // session keeps at most one (~100 B) between its steps.
        if latest.charged.as_ref().is_some_and(Ticket::is_durable) {
            latest.charged = None;
        }
        let wait = match release {
            Release::Durable => {
                latest.charged = Some(ticket.clone());
                Some(ticket)
            }
            // The last charged record is not durable yet (or its commit
            // failed): wait for this one, which commits after it and
            // carries the whole state, charge included.
            Release::AfterCharges if latest.charged.is_some() => {
                latest.charged = Some(ticket.clone());
                Some(ticket)
            }
            Release::AfterCharges | Release::Free => None,
        };
        Ok((value, wait))
    }
}

impl<S: State> Cell<S> {
    /// The cell of session `key` in `store`: resumed from its latest
    /// durable record when the state lives in this process, a handle on
    /// its row when it lives in the database.
    ///
    /// # Errors
    /// The record cannot be read or resumed.
    pub fn open(store: &Store, key: &str, context: S::Context) -> Result<Self, S::Error> {
        let place = match store {
            Store::Embedded(e) => {
                let record = e.load(key)?;
                // A session that never cached anything has no cache rows.
                let cache = match &record {
                    Some(r) if !r.cache_owners.is_empty() => e.load_cache(key)?,
                    _ => CacheRows::default(),
                };
                let state = S::resume(&context, key, record.as_ref(), cache)?;
                Place::Memory(Arc::new(Held {
                    state: Mutex::new(Latest { state, charged: None }),
                    store: Arc::clone(e),
                }))
            }
            Store::Postgres(p) => Place::Database(Arc::clone(p)),
        };
        Ok(Cell { key: key.to_owned(), context, place })
    }

    /// The session's key in the store.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// What resuming this cell's state needs.
    pub fn context(&self) -> &S::Context {
        &self.context
    }

    /// The same session under `context` (a reloaded configuration): a
    /// state held in memory is adjusted in place, under its lock, and
    /// shared with this cell; one in the database is read with `context`
    /// from the next step on.
    ///
    /// # Errors
    /// A poisoned lock.
    pub fn retarget(&self, context: S::Context) -> Result<Self, S::Error> {
        let place = match &self.place {
            Place::Memory(held) => {
                held.state.lock().map_err(|_| S::poisoned())?.state.retarget(&context);
                Place::Memory(Arc::clone(held))
            }
            Place::Database(store) => Place::Database(Arc::clone(store)),
        };
        Ok(Cell { key: self.key.clone(), context, place })
    }

    /// `look` applied to the current committed state, with the cached
    /// answers of `probes`: one read.
    ///
    /// # Errors
    /// The state cannot be read.
    pub async fn read<T>(&self, probes: &[CacheProbe], look: impl FnOnce(&S) -> T) -> Result<T, S::Error> {
        match &self.place {
            Place::Memory(held) => Ok(look(&held.state.lock().map_err(|_| S::poisoned())?.state)),
            Place::Database(store) => {
                let (record, cache) = store.load_probed(&self.key, probes).await?;
                Ok(look(&S::resume(&self.context, &self.key, record.as_ref(), cache)?))
            }
        }
    }

    /// One step: `apply` on the state (which holds the cached answers of
    /// `probes` at least), atomically with making its result
    /// durable. Returns `apply`'s value and, for a state held in memory,
    /// the ticket to wait on before releasing anything (`None`: durable
    /// already). `blocking`: `apply` is heavy (LAPACK) and runs on a
    /// blocking thread.
    ///
    /// # Errors
    /// `apply`'s error (nothing changed), or the store's.
    pub async fn step<T, F>(
        self: &Arc<Self>,
        blocking: bool,
        probes: Vec<CacheProbe>,
        apply: F,
    ) -> Result<(T, Option<Ticket>), S::Error>
    where
        T: Send + 'static,
        F: FnOnce(&mut S) -> Result<(T, Change), S::Error> + Send + 'static,
    {
        match &self.place {
            Place::Memory(held) if blocking => {
                let (held, cell) = (Arc::clone(held), Arc::clone(self));
                tokio::task::spawn_blocking(move || held.step(&cell.key, apply)).await.map_err(|_| S::poisoned())?
            }
            Place::Memory(held) => held.step(&self.key, apply),
            Place::Database(store) => {
                let cell = Arc::clone(self);
                let run = move |record: Option<SessionRecord>, cache: CacheRows| {
                    let mut state = S::resume(&cell.context, &cell.key, record.as_ref(), cache)?;
                    let (value, change) = apply(&mut state)?;
                    let (record, change) = durable_form(&mut state, change);
                    // An answer that waits for charges has them confirmed
                    // (replicated) even when there is nothing to write.
                    let write = (!change.is_none() || change.release > Release::Free).then_some((record, change));
                    Ok::<_, S::Error>((write, value))
                };
                let value = store
                    .step(&self.key, &probes, move |record, cache| async move {
                        if blocking {
                            tokio::task::spawn_blocking(move || run(record, cache)).await.map_err(|_| S::poisoned())?
                        } else {
                            run(record, cache)
                        }
                    })
                    .await?;
                Ok((value, None))
            }
        }
    }
}
