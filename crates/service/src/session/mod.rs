//! Sessions: who is asking (API key → principal) and the privacy state
//! their answers are charged to (posterior + ledger, one per principal or
//! one shared). Applies one step of Algorithm 1 under the session's lock.
//!
//! # Invariants
//! - Principals are provisioned by the operator; a client can never open a
//!   fresh session or reset a budget.
//! - Keys are configured, stored and compared as SHA-256 hashes; the
//!   plaintext key is never stored (see [`registry`]).
//! - A session does not know where its state lives: it reads it once per
//!   query ([`Handle::preflight`]) and steps it ([`Handle::begin`]) through
//!   a [`crate::store::cell::Cell`], which holds it in memory (embedded
//!   store) or in PostgreSQL. A lock is held only around the math
//!   (microseconds), never across the teacher fan-out, nor across the
//!   fsync (early lock release; see the cell).
//! - An answer is reachable only through [`Step::durable`], after its
//!   record is durable — a cached answer too, after the step that produced
//!   it ([`cache`]).
//! - A query the session answered before is answered from its [`cache`]:
//!   no charge, no noise, no change; which queries hit depends on the
//!   session's own transcript, never on the secret.
//! - The secret index lives only in the sessions' parameters and is handed
//!   to the mechanism; it is never returned, logged or put in an error.
//! - Noise comes from [`rand::rng`]: a per-thread ChaCha12 CSPRNG seeded
//!   from the OS and reseeded from it every 64 KiB of output.
use pacpriv_privacy::Nats;
use sha2::{Digest, Sha256};

pub mod cache;
mod error;
mod handle;
mod journal;
pub mod registry;
pub mod secret;
mod state;
mod step;

pub use error::SessionError;
pub use handle::{Handle, Preflight, Step};
pub use registry::{Account, Credential, GLOBAL_SESSION, Sessions};
pub use state::{BudgetView, Session, Terms, Versioned};
pub use step::{Asking, Reply, SessionParams};

/// Whose transcript a session bounds (`privacy.scope`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// One session per principal.
    PerPrincipal,
    /// One session shared by every principal (holds against collusion).
    Global,
}

impl Scope {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::PerPrincipal => "per_principal",
            Scope::Global => "global",
        }
    }
}

/// A provisioned principal.
#[derive(Clone, Debug)]
pub struct PrincipalConfig {
    /// Name, used in logs and responses.
    pub name: String,
    /// SHA-256 of its API key.
    pub key_sha256: [u8; 32],
    /// Its MI budget (its session's limit under per-principal scope).
    pub budget: Nats,
}

impl PrincipalConfig {
    /// Its store record, provisioned by the configuration at `now_unix`.
    pub fn record(&self, now_unix: i64) -> crate::store::PrincipalRecord {
        crate::store::PrincipalRecord {
            name: self.name.clone(),
            key_sha256: self.key_sha256,
            budget: self.budget.get(),
            origin: crate::store::Origin::Config,
            created_unix: now_unix,
            revoked_unix: None,
        }
    }
}

/// SHA-256 of a key as 64 lowercase hex digits, the form `key_sha256`
/// takes in the configuration.
pub fn key_digest_hex(api_key: &str) -> String {
    hex(&Sha256::digest(api_key.as_bytes()))
}

/// Lowercase hex, two digits per byte.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod test;
