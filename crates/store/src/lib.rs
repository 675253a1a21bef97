//! pacpriv-store: durable session state, what must survive a crash for
//! the privacy guarantee to survive it (`docs/assurance/accounting.md` §5:
//! an answer released before its record is durable could be charged to
//! nobody).
//!
//! Holds, per session, the posterior log-weights and the ledger with a
//! version; once per dataset, the sealed secret index and a fingerprint
//! of the teacher set it belongs to, and each model version's identity;
//! optionally a journal of every step
//! (charge and the log-likelihood vector applied) and, in the same hash
//! chain, every cache hit and refusal (events), so a transcript can be
//! replayed and audited (`docs/assurance/accounting.md` §9).
//!
//! # Invariants
//! - A record is handed to the store *before* its answer is released, and
//!   a charged answer waits until that record — and so every earlier
//!   record of the same session — is durable ([`Ticket::durable`]). Only
//!   an answer that charged nothing and moved no posterior leaves without
//!   waiting ([`Release`]).
//! - Versions of a session only grow by one per answered query.
//! - The secret index is written once and never changes under an existing
//!   posterior; a start with another teacher set or another index refuses.
//! - The secret index never appears in an error or a log line.
//!
//! Below the service in the crate graph (`docs/architecture.md`,
//! "Crates"): it needs the privacy crate and the records' formats
//! (`pacpriv-records`, re-exported as [`record`] and [`principal`]), and
//! none of the service. `crates/service/tests/module_order.rs` checks the
//! order below.
//!
//! # Files, from the bottom up
//! - [`metrics`], `error`, `meta`, `ticket`: values every backend
//!   shares; `arrivals`: the records on their way, which the embedded
//!   writer gathers into one sync; [`answers`]: cached answers as rows;
//!   `change`: what one step changed; `decode`: stored bytes back into
//!   records; [`pg_tls`]: PostgreSQL's sslmodes;
//! - [`embedded`] (redb, group commit) and [`postgres`] (row-locked
//!   steps), the two backends; `backend`: [`Store`], either of them;
//! - [`cell`]: where a session's state lives, and when a step is durable.

#![forbid(unsafe_code)]

pub mod answers;
mod arrivals;
mod backend;
pub mod cell;
mod change;
mod decode;
pub mod embedded;
mod error;
mod meta;
pub mod metrics;
pub mod pg_tls;
pub mod postgres;
mod ticket;

pub use pacpriv_records as record;
pub use pacpriv_records::principal;

pub use answers::{CacheProbe, CacheRows, CacheWrite};
pub use arrivals::{Arrival, Arrivals};
pub use backend::Store;
pub use change::{Change, Release};
pub use embedded::EmbeddedStore;
pub use error::StoreError;
pub use meta::{DEFAULT_DATASET, GLOBAL_SESSION, LegacyKey, Meta, VersionIdentity, session_key};
pub use metrics::{CommitObserver, StoreMetrics};
pub use pg_tls::{PgTls, SslMode};
pub use postgres::{PgLink, PgStore};
pub use principal::{Configured, Origin, PrincipalRecord};
pub use record::{JournalEntry, JournalEvent, Journaled, SessionRecord};
pub use ticket::Ticket;

#[cfg(test)]
mod test;
