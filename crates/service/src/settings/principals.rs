//! `[principals.NAME]`: who may ask, each by the SHA-256 of its key and
//! with its own limit.

use super::parse::{SettingsError, err, nats, parse_sha256};
use crate::session::PrincipalConfig;
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPrincipal {
    pub(super) key_sha256: String,
    pub(super) budget_mi: String,
}

pub(super) fn principals(raw: BTreeMap<String, RawPrincipal>) -> Result<Vec<PrincipalConfig>, SettingsError> {
    let mut out: Vec<PrincipalConfig> = Vec::with_capacity(raw.len());
    for (name, p) in raw {
        let key = format!("principals.{name}.key_sha256");
        let hash = parse_sha256(&p.key_sha256)
            .ok_or_else(|| err(&key, "must be 64 hex digits: the SHA-256 of the API key (echo -n KEY | sha256sum)"))?;
        if let Some(other) = out.iter().find(|o| o.key_sha256 == hash) {
            return Err(err(&key, format!("same key as principals.{}; every principal needs its own key", other.name)));
        }
        let budget = nats(&format!("principals.{name}.budget_mi"), &p.budget_mi)?;
        out.push(PrincipalConfig { name, key_sha256: hash, budget });
    }
    Ok(out)
}
