//! `[principals.NAME]`: who may ask, each by the SHA-256 of its key and
//! with its own limit: `budget_mi` in the default dataset and every other
//! one, but those `dataset_budget_mi` names.

use super::parse::{SettingsError, err, nats, parse_sha256};
use super::privacy::DatasetSettings;
use crate::session::{PrincipalConfig, Scope};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPrincipal {
    pub(super) key_sha256: String,
    pub(super) budget_mi: String,
    /// Its limit in some datasets other than the default one.
    #[serde(default)]
    pub(super) dataset_budget_mi: BTreeMap<String, String>,
}

/// `raw` validated; `further` are the datasets besides the default one,
/// the only ones `dataset_budget_mi` may name (and not one under global
/// scope, whose one session every principal shares).
pub(super) fn principals<'a>(
    raw: BTreeMap<String, RawPrincipal>,
    further: impl Iterator<Item = &'a DatasetSettings> + Clone,
) -> Result<Vec<PrincipalConfig>, SettingsError> {
    let mut out: Vec<PrincipalConfig> = Vec::with_capacity(raw.len());
    for (name, p) in raw {
        let key = format!("principals.{name}.key_sha256");
        let hash = parse_sha256(&p.key_sha256)
            .ok_or_else(|| err(&key, "must be 64 hex digits: the SHA-256 of the API key (echo -n KEY | sha256sum)"))?;
        if let Some(other) = out.iter().find(|o| o.key_sha256 == hash) {
            return Err(err(&key, format!("same key as principals.{}; every principal needs its own key", other.name)));
        }
        let budget = nats(&format!("principals.{name}.budget_mi"), &p.budget_mi)?;
        let mut dataset_budgets = BTreeMap::new();
        for (dataset, value) in p.dataset_budget_mi {
            let key = format!("principals.{name}.dataset_budget_mi.{dataset}");
            let Some(found) = further.clone().find(|d| d.name == dataset) else {
                let known: Vec<_> = further.clone().map(|d| d.name.as_str()).collect();
                return Err(err(
                    &key,
                    format!(
                        "names no dataset besides the default one (declared: {known:?}); the default dataset's \
                         limit is principals.{name}.budget_mi"
                    ),
                ));
            };
            if found.scope == Scope::Global {
                return Err(err(
                    &key,
                    format!(
                        "dataset {dataset:?} has scope = \"global\": every principal shares its one session, whose \
                         limit is its global_budget_mi"
                    ),
                ));
            }
            dataset_budgets.insert(dataset, nats(&key, &value)?);
        }
        out.push(PrincipalConfig { name, key_sha256: hash, budget, dataset_budgets });
    }
    Ok(out)
}
