//! The principal registry's record: who may ask, with which key (hashed)
//! and which budget, and whether they still may.
//!
//! # Invariants
//! - Only the SHA-256 of a key is stored; the key itself exists once, in
//!   the admin response that created it.
//! - A name is never reused: its session (spending) is keyed by the name,
//!   so a new principal under an old name would inherit — or, if the
//!   record were dropped, reset — an account. Revocation keeps the record.
//! - Keys are unique across principals.

use std::collections::BTreeMap;

/// Who provisioned a principal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The configuration file or environment (re-applied at every start:
    /// the configured key and budget win).
    Config,
    /// The admin API (only the admin API changes it).
    Admin,
}

impl Origin {
    /// Its spelling in the store and the admin API.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Config => "config",
            Origin::Admin => "admin",
        }
    }

    /// The origin [`Origin::as_str`] names; `None` for any other string.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "config" => Some(Origin::Config),
            "admin" => Some(Origin::Admin),
            _ => None,
        }
    }
}

/// One provisioned principal.
#[derive(Clone, Debug, PartialEq)]
pub struct PrincipalRecord {
    /// Its name (also its session's key under per-principal scope).
    pub name: String,
    /// SHA-256 of its API key.
    pub key_sha256: [u8; 32],
    /// Its MI budget, nats: its limit in the default dataset and in every
    /// other dataset not in `dataset_budgets`.
    pub budget: f64,
    /// Its limit in some datasets other than the default one, nats, by
    /// dataset name (never the default dataset's: `budget` is the limit
    /// every release reads there). A record with any is written in a
    /// format earlier releases refuse (`record::PRINCIPAL_BUDGETS_FORMAT`).
    pub dataset_budgets: BTreeMap<String, f64>,
    /// Who provisioned it.
    pub origin: Origin,
    /// When it was first provisioned (Unix seconds).
    pub created_unix: i64,
    /// When it was revoked (Unix seconds), if it was.
    pub revoked_unix: Option<i64>,
}

impl PrincipalRecord {
    /// Whether it may still authenticate.
    pub fn active(&self) -> bool {
        self.revoked_unix.is_none()
    }

    /// Its limit in `dataset`, nats.
    pub fn budget_in(&self, dataset: &str) -> f64 {
        self.dataset_budgets.get(dataset).copied().unwrap_or(self.budget)
    }
}

/// What applying the configured principals stored (`pacpriv_store::Store::configure`).
#[derive(Debug, Default)]
pub struct Configured {
    /// The configured records as stored, in the configuration's order.
    pub stored: Vec<PrincipalRecord>,
    /// The config-origin principals the configuration no longer names,
    /// revoked by it.
    pub revoked: Vec<PrincipalRecord>,
}

/// Seconds since the Unix epoch, for provisioning and revocation times.
pub fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
