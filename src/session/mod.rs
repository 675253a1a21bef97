//! Sessions: who is asking (API key → principal) and the privacy state
//! their answers are charged to (posterior + ledger, one per principal or
//! one shared). Applies one step of Algorithm 1 under the session's lock.
//!
//! # Invariants
//! - Principals are provisioned by the operator; a client can never open a
//!   fresh session or reset a budget.
//! - Keys are configured and compared as SHA-256 hashes; the plaintext key
//!   is never stored.
//! - A session's lock is held only around the math (microseconds), never
//!   across the teacher fan-out.
//! - The secret index lives only inside [`Session`] and is handed to the
//!   mechanism; it is never returned, logged or put in an error.
//! - Noise comes from [`rand::rng`]: a per-thread ChaCha12 CSPRNG seeded
//!   from the OS and reseeded from it every 64 KiB of output.

use crate::privacy::ledger::{Ledger, Policy};
use crate::privacy::mechanism::{self, Answer, SecretIndex, SessionState, TeacherOutputs};
use crate::privacy::posterior::Posterior;
use crate::privacy::{Nats, PrivacyError, report};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub mod secret;

/// Whose transcript a session bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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

/// Why a session refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// No key, or one that names no principal.
    #[error("unknown or missing API key")]
    Unauthenticated,
    /// The budget cannot pay for this answer.
    #[error("MI budget exhausted: spent {spent} of {limit} nats; an answer costs {charge} nats")]
    Exhausted {
        /// MI spent.
        spent: f64,
        /// The limit.
        limit: f64,
        /// This answer's charge.
        charge: f64,
    },
    /// The privacy core refused (shapes, calibration); nothing released.
    #[error(transparent)]
    Privacy(PrivacyError),
    /// An earlier panic left the session lock poisoned; the session refuses
    /// to answer rather than risk a half-applied step.
    #[error("session state unavailable after an internal failure; refusing to answer")]
    Poisoned,
}

impl From<PrivacyError> for SessionError {
    fn from(e: PrivacyError) -> Self {
        match e {
            PrivacyError::BudgetExhausted { spent, budget, charge } => {
                SessionError::Exhausted { spent: spent.get(), limit: budget.get(), charge: charge.get() }
            }
            other => SessionError::Privacy(other),
        }
    }
}

/// A session's public account, as reported to its principal.
#[derive(Clone, Debug, PartialEq)]
pub struct BudgetView {
    /// MI spent, nats.
    pub spent: f64,
    /// Limit, nats.
    pub limit: f64,
    /// limit − spent, nats.
    pub remaining: f64,
    /// b, nats.
    pub per_query: f64,
    /// Answers released.
    pub answered: u64,
    /// Answers charged.
    pub charged: u64,
    /// MIA success bound at `spent`.
    pub mia_bound: f64,
    /// Charging policy.
    pub policy: Policy,
}

impl BudgetView {
    fn of(ledger: &Ledger) -> Self {
        BudgetView {
            spent: ledger.spent().get(),
            limit: ledger.limit().get(),
            remaining: ledger.remaining(),
            per_query: ledger.per_query().get(),
            answered: ledger.answered(),
            charged: ledger.charged(),
            mia_bound: report::mia_bound(ledger.spent()),
            policy: ledger.policy(),
        }
    }
}

/// One privacy session.
pub struct Session {
    state: Mutex<SessionState>,
    secret: SecretIndex,
}

impl Session {
    fn new(m: usize, per_query: Nats, limit: Nats, policy: Policy, secret: SecretIndex) -> Result<Self, PrivacyError> {
        let state = SessionState { posterior: Posterior::uniform(m)?, ledger: Ledger::new(per_query, limit, policy)? };
        Ok(Session { state: Mutex::new(state), secret })
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, SessionState>, SessionError> {
        self.state.lock().map_err(|_| SessionError::Poisoned)
    }
}

/// An authenticated caller and the session it is charged to.
#[derive(Clone)]
pub struct Handle {
    principal: Arc<str>,
    scope: Scope,
    session: Arc<Session>,
}

impl Handle {
    /// The principal's name.
    pub fn principal(&self) -> &str {
        &self.principal
    }

    /// The session scope.
    pub fn scope(&self) -> Scope {
        self.scope
    }

    /// The current account.
    ///
    /// # Errors
    /// [`SessionError::Poisoned`].
    pub fn budget(&self) -> Result<BudgetView, SessionError> {
        Ok(BudgetView::of(&self.session.lock()?.ledger))
    }

    /// Refuses early — before any teacher is asked — when even the
    /// cheapest possible answer (a free unanimous one under `contested`,
    /// b otherwise) no longer fits. Depends on public state only.
    ///
    /// # Errors
    /// [`SessionError::Exhausted`].
    pub fn ensure_can_pay(&self) -> Result<(), SessionError> {
        let state = self.session.lock()?;
        let cheapest = state.ledger.charge_for(true);
        state.ledger.check(cheapest)?;
        Ok(())
    }

    /// One step of Algorithm 1 on this session: budget check, calibration,
    /// noise, posterior and ledger update — atomically, under the lock.
    /// Blocking (LAPACK in vector mode): call from a blocking thread.
    ///
    /// # Errors
    /// [`SessionError::Exhausted`] or the core's refusal; on error nothing
    /// changed and nothing may be released.
    pub fn answer(&self, outputs: &TeacherOutputs, alpha: Option<f64>) -> Result<(Answer, BudgetView), SessionError> {
        let mut state = self.session.lock()?;
        let answer = mechanism::answer(&mut state, outputs, self.session.secret, alpha, &mut rand::rng())?;
        Ok((answer, BudgetView::of(&state.ledger)))
    }
}

/// Every provisioned principal and its session.
pub struct Sessions {
    by_key: HashMap<[u8; 32], Handle>,
}

impl Sessions {
    /// One session per principal (each with its own budget), or one shared
    /// session with `global_budget`; all over m subsets, uniform prior.
    ///
    /// # Errors
    /// An invalid b, budget or m.
    pub fn new(
        principals: &[PrincipalConfig],
        scope: Scope,
        global_budget: Nats,
        per_query: Nats,
        policy: Policy,
        m: usize,
        secret: SecretIndex,
    ) -> Result<Self, PrivacyError> {
        let shared = match scope {
            Scope::Global => Some(Arc::new(Session::new(m, per_query, global_budget, policy, secret)?)),
            Scope::PerPrincipal => None,
        };
        let mut by_key = HashMap::with_capacity(principals.len());
        for p in principals {
            let session = match &shared {
                Some(s) => Arc::clone(s),
                None => Arc::new(Session::new(m, per_query, p.budget, policy, secret)?),
            };
            by_key.insert(p.key_sha256, Handle { principal: p.name.as_str().into(), scope, session });
        }
        Ok(Sessions { by_key })
    }

    /// The principal whose key this is.
    ///
    /// # Errors
    /// [`SessionError::Unauthenticated`].
    pub fn authenticate(&self, api_key: &str) -> Result<Handle, SessionError> {
        // Looking up the hash, not the key: timing reveals at most how a
        // SHA-256 digest compares, which says nothing about the key.
        let digest: [u8; 32] = Sha256::digest(api_key.as_bytes()).into();
        self.by_key.get(&digest).cloned().ok_or(SessionError::Unauthenticated)
    }
}

/// SHA-256 of a key as 64 lowercase hex digits, the form `key_sha256`
/// takes in the configuration.
pub fn key_digest_hex(api_key: &str) -> String {
    Sha256::digest(api_key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod test;
