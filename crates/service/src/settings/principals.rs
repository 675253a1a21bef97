//! `[principals.NAME]`: who may ask, each by the SHA-256 of its key and
//! with its own limit: `budget_mi` in the default dataset and every other
//! one, but those `dataset_budget_mi` names.

use super::parse::{SettingsError, err, nats, parse_sha256};
use super::privacy::DatasetSettings;
use crate::session::{PrincipalConfig, Scope};
use serde::Deserialize;
use std::collections::BTreeMap;

/// SHA-256 of "demo-key", the demo principal's key that the README, the
/// book and the examples publish: accepted only by a server whose client
/// listeners are all on loopback ([`published_key_off_loopback`]).
pub const PUBLISHED_DEMO_KEY_SHA256: &str = "c48a01f49fd0f2cc404bc3cbbc80e91457a3d41bb429a695243de4c61794155c";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPrincipal {
    /// `false` removes a principal an earlier layer defines (the compiled-in
    /// defaults' `demo`): a layered file cannot delete a table.
    #[serde(default = "enabled")]
    pub(super) enabled: bool,
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
    for (name, p) in raw.into_iter().filter(|(_, p)| p.enabled) {
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

fn enabled() -> bool {
    true
}

/// With a client listener among `listeners` (each named by its key) off
/// loopback, the published demo key's digest, which the registry then
/// refuses whoever stored it (another replica's configuration, an earlier
/// release); `None` on loopback.
///
/// # Errors
/// A configured principal holds the published key while a listener is off
/// loopback: anyone who can reach it would spend that principal's budget
/// (issue 67 §1).
pub(super) fn published_key_off_loopback(
    principals: &[PrincipalConfig],
    listeners: &[(&str, std::net::SocketAddr)],
) -> Result<Option<[u8; 32]>, SettingsError> {
    let Some((listener, addr)) = listeners.iter().find(|(_, a)| !a.ip().is_loopback()) else {
        return Ok(None);
    };
    let published = parse_sha256(PUBLISHED_DEMO_KEY_SHA256);
    let Some(p) = principals.iter().find(|p| Some(p.key_sha256) == published) else {
        return Ok(published);
    };
    Err(err(
        &format!("principals.{}.key_sha256", p.name),
        format!(
            "is the SHA-256 of the published demo key \"demo-key\", and {listener} = {addr} is off loopback: \
             anyone who can reach it could spend principal {name:?}'s budget. Give it a key of your own \
             (PACPRIV__PRINCIPALS__{upper}__KEY_SHA256=$(printf %s \"$KEY\" | sha256sum | cut -d' ' -f1)), remove \
             it (principals.{name}.enabled = false, PACPRIV__PRINCIPALS__{upper}__ENABLED=false), or listen on \
             loopback only",
            name = p.name,
            upper = p.name.to_uppercase(),
        ),
    ))
}
