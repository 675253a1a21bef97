//! `[privacy]`: the default dataset's per-query and global budgets, the
//! charging policy, the session scope, the secret index file, the
//! noisy-vector release and the answer cache — and, read again with each
//! `[datasets.NAME]`'s own keys over it, every other dataset's
//! ([`super::datasets`]).

use super::parse::{SettingsError, choice, err, nats};
use crate::session::Scope;
use crate::session::cache::{CacheSettings, OnEvicted};
use pacpriv_privacy::Nats;
use pacpriv_privacy::ledger::Policy;
use pacpriv_privacy::noise::MIN_PER_QUERY;
use serde::Deserialize;
use std::path::PathBuf;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPrivacy {
    pub(super) per_query_mi: String,
    #[serde(deserialize_with = "choice")]
    pub(super) policy: Policy,
    #[serde(deserialize_with = "choice")]
    pub(super) scope: Scope,
    pub(super) global_budget_mi: String,
    pub(super) secret_index_file: String,
    pub(super) release_noisy_vector: bool,
    pub(super) answer_cache_entries: usize,
    #[serde(deserialize_with = "choice")]
    pub(super) answer_cache_evicted: OnEvicted,
}

/// Largest `privacy.answer_cache_entries`.
pub(super) const MAX_CACHE_ENTRIES: usize = 4096;

impl RawPrivacy {
    /// The dataset `name` these keys describe; errors name the key under
    /// `within` (`privacy`, or `datasets.NAME`).
    pub(super) fn validate(self, name: &str, within: &str) -> Result<DatasetSettings, SettingsError> {
        let key = |k: &str| format!("{within}.{k}");
        let per_query = nats(&key("per_query_mi"), &self.per_query_mi)?;
        if per_query.get() < MIN_PER_QUERY {
            return Err(err(&key("per_query_mi"), format!("must be at least {MIN_PER_QUERY:e} nats")));
        }
        if self.answer_cache_entries > MAX_CACHE_ENTRIES {
            return Err(err(
                &key("answer_cache_entries"),
                format!("at most {MAX_CACHE_ENTRIES}: the cache is part of every step's durable record"),
            ));
        }
        if self.answer_cache_entries == 0 {
            return Err(err(
                &key("answer_cache_entries"),
                "at least 1: the cache keeps each answer with the session, which is what lets a client retry a \
                 query whose answer was withheld without being charged twice",
            ));
        }
        let secret = self.secret_index_file;
        Ok(DatasetSettings {
            name: name.to_owned(),
            per_query,
            policy: self.policy,
            scope: self.scope,
            global_budget: nats(&key("global_budget_mi"), &self.global_budget_mi)?,
            secret_index_file: (!secret.is_empty()).then(|| PathBuf::from(secret)),
            release_noisy_vector: self.release_noisy_vector,
            cache: CacheSettings { capacity: self.answer_cache_entries, on_evicted: self.answer_cache_evicted },
        })
    }
}

/// One dataset — a secret space: m subsets and the secret index s* over
/// them — with its privacy parameters. `[privacy]` is the default
/// dataset's; `[datasets.NAME]` another's.
#[derive(Clone, Debug, PartialEq)]
pub struct DatasetSettings {
    /// Its name (`default` for `[privacy]`'s).
    pub name: String,
    /// b, nats.
    pub per_query: Nats,
    /// Charging policy.
    pub policy: Policy,
    /// Whose transcript a session bounds.
    pub scope: Scope,
    /// The shared session's limit under global scope.
    pub global_budget: Nats,
    /// The operator's s* for this dataset (else drawn on first start).
    pub secret_index_file: Option<PathBuf>,
    /// Whether a client may ask for the noisy vector.
    pub release_noisy_vector: bool,
    /// The answer cache.
    pub cache: CacheSettings,
}
