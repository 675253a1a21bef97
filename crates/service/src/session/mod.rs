//! Sessions: who is asking (API key → principal) and the privacy state
//! their answers are charged to (posterior + ledger, in each dataset one
//! per principal or one shared). Applies one step of Algorithm 1 under the
//! session's lock.
//!
//! # Invariants
//! - Principals are provisioned by the operator; a client can never open a
//!   fresh session or reset a budget.
//! - Keys are configured, stored and compared as SHA-256 hashes; the
//!   plaintext key is never stored (see [`registry`]).
//! - A session does not know where its state lives: it reads it once per
//!   query ([`Handle::preflight`]) and steps it ([`Handle::begin`]) through
//!   a [`pacpriv_store::cell::Cell`], which holds it in memory (embedded
//!   store) or in PostgreSQL. A lock is held only around the math
//!   (microseconds), never across the teacher fan-out, nor across the
//!   fsync (early lock release; see the cell).
//! - An answer is reachable only through [`Step::release`]: a charged one
//!   after its record is durable, a cached one whose step was charged
//!   after that step's record ([`cache`]); only an exact unanimous answer
//!   that charged nothing (fresh or cached, under `contested` or
//!   `unanimous_only`, journal off) leaves before its record is written.
//! - A query the session answered before is answered from its [`cache`]:
//!   no charge, no noise, no change; which queries hit depends on the
//!   session's own transcript, never on the secret.
//! - The secret index lives only in the sessions' parameters and is handed
//!   to the mechanism; it is never returned, logged or put in an error.
//! - Noise comes from [`rand::rng`]: a per-thread ChaCha12 CSPRNG seeded
//!   from the OS and reseeded from it every 64 KiB of output.
//!
//! # Files, from the bottom up
//! - `credential`: what a caller presents; `error`: why a session did not
//!   answer; [`cache`]: the answer cache;
//! - `state`: what a cell holds ([`Versioned`]), the session's parameters
//!   and scope; `query`: one row's question and answer;
//! - `journal`: the hash chain's entries and events;
//! - `step`: one request, all or nothing, on a state value alone;
//! - `handle`: the step under the cell's lock, and its durable answers;
//!   `caller`: an authenticated caller's handles, one per dataset;
//! - `unknown_keys`: the short negative cache of key digests no
//!   principal holds;
//! - [`registry`]: principals and their sessions; [`secret`]: s*'s
//!   lifecycle.

pub mod cache;
mod caller;
mod credential;
mod error;
mod handle;
mod journal;
mod query;
pub mod registry;
pub mod secret;
mod state;
mod step;
mod unknown_keys;

pub use caller::{Caller, DEFAULT as DEFAULT_DATASET_INDEX, DatasetIndex};
pub use credential::{Credential, hex, key_digest_hex};
pub use error::SessionError;
pub use handle::{Handle, Preflight, Step};
pub use query::{Asking, ModelTag, Reply};
pub use registry::{Account, DatasetAccount, DatasetTerms, PrincipalConfig, Sessions};
pub use state::{BudgetView, Scope, Session, SessionParams, Terms, Versioned};
pub use unknown_keys::KNOWN_REFRESH;

#[cfg(test)]
mod test;
