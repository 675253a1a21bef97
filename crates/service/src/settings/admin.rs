//! `[admin]` and `[metrics]`: the admin API's listener and token, and the
//! Prometheus listener.

use super::parse::{SettingsError, addr, err, optional_addr, parse_sha256};
use serde::Deserialize;
use std::net::SocketAddr;

/// The `pacpriv.v1.Admin` listener.
#[derive(Clone, Debug, PartialEq)]
pub struct AdminSettings {
    /// Where it listens.
    pub listen: SocketAddr,
    /// SHA-256 of the admin token.
    pub key_sha256: [u8; 32],
}

/// The Prometheus `/metrics` endpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsSettings {
    /// HTTP listen address; `None`: no endpoint.
    pub listen: Option<SocketAddr>,
    /// SHA-256 of the bearer token a scrape must send; `None`: none.
    pub token_sha256: Option<[u8; 32]>,
    /// Principals with their own budget series at most (bounds the
    /// cardinality a scrape can reach).
    pub max_principal_series: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    pub(super) listen: String,
    pub(super) key_sha256: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    pub(super) listen: String,
    pub(super) token_sha256: String,
    pub(super) max_principal_series: usize,
}

impl RawAdmin {
    pub(super) fn validate(self) -> Result<Option<AdminSettings>, SettingsError> {
        match self.key_sha256.trim() {
            "" => Ok(None),
            hex => Ok(Some(AdminSettings {
                listen: addr("admin.listen", &self.listen)?,
                key_sha256: parse_sha256(hex).ok_or_else(|| {
                    err("admin.key_sha256", "must be 64 hex digits: the SHA-256 of the admin token (or empty)")
                })?,
            })),
        }
    }
}

impl RawMetrics {
    pub(super) fn validate(self) -> Result<MetricsSettings, SettingsError> {
        if self.max_principal_series == 0 {
            return Err(err("metrics.max_principal_series", "must be at least 1"));
        }
        let token_sha256 = match self.token_sha256.trim() {
            "" => None,
            hex => Some(parse_sha256(hex).ok_or_else(|| {
                err(
                    "metrics.token_sha256",
                    "must be 64 hex digits: the SHA-256 of the scrape's bearer token (or empty)",
                )
            })?),
        };
        Ok(MetricsSettings {
            listen: optional_addr("metrics.listen", &self.listen)?,
            token_sha256,
            max_principal_series: self.max_principal_series,
        })
    }
}
