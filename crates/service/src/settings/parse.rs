//! What every section's validation shares: the error that names the key
//! ([`SettingsError`]) and the parsers of the value types keys take
//! (nats, addresses, files, SHA-256 digests, enumerated choices).

use pacpriv_privacy::Nats;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;

/// A configuration problem, naming the key.
#[derive(Debug, thiserror::Error)]
#[error("config key `{key}`: {message}")]
pub struct SettingsError {
    /// Dotted key, e.g. `privacy.per_query_mi`.
    pub key: String,
    /// What is wrong and what is expected.
    pub message: String,
}

pub(super) fn err(key: &str, message: impl Into<String>) -> SettingsError {
    SettingsError { key: key.to_owned(), message: message.into() }
}

/// An enumerated key: read as a string, then parsed into its enum, so a
/// value outside the choices is refused with serde's message, which names
/// the value and every choice (the `config` crate's own enum reading
/// names neither).
pub(super) fn choice<'de, D: serde::Deserializer<'de>, T: serde::de::DeserializeOwned>(d: D) -> Result<T, D::Error> {
    use serde::de::{Error, IntoDeserializer};
    let value = String::deserialize(d)?;
    T::deserialize(value.as_str().into_deserializer()).map_err(|e: serde::de::value::Error| D::Error::custom(e))
}

pub(super) fn nats(key: &str, s: &str) -> Result<Nats, SettingsError> {
    s.parse::<Nats>().map_err(|e| err(key, e.to_string()))
}

pub(super) fn addr(key: &str, s: &str) -> Result<SocketAddr, SettingsError> {
    s.parse().map_err(|_| err(key, format!("{s:?} is not an IP:port address such as 127.0.0.1:50051")))
}

/// An address, or `None` for the empty string (listener disabled).
pub(super) fn optional_addr(key: &str, s: &str) -> Result<Option<SocketAddr>, SettingsError> {
    if s.trim().is_empty() { Ok(None) } else { addr(key, s).map(Some) }
}

/// A file that must exist now (so a typo fails at start-up, not at the
/// first handshake); `None` for the empty string.
pub(super) fn optional_file(key: &str, s: &str) -> Result<Option<PathBuf>, SettingsError> {
    if s.trim().is_empty() {
        return Ok(None);
    }
    let path = PathBuf::from(s);
    if !path.is_file() {
        return Err(err(key, format!("{s:?} is not a readable file")));
    }
    Ok(Some(path))
}

pub(super) fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The top-level section `section` of `config` (the merged
/// configuration) with `own` over it, key by key; errors name `key`
/// (where `own` was written: `models.NAME.teachers`, `datasets.NAME`). A key's
/// value is replaced whole: a list such as `teachers.remote`, and a table
/// such as `teachers.stacked` too — so that a model's own endpoint never
/// inherits the default's credentials (its headers, client certificate,
/// CA).
pub(super) fn overlay<T: serde::de::DeserializeOwned>(
    config: &config::Config,
    section: &str,
    own: std::collections::BTreeMap<String, config::Value>,
    key: &str,
) -> Result<T, SettingsError> {
    let mut table = config.get_table(section).map_err(|e| err(key, e.to_string()))?;
    table.extend(own);
    config::Value::new(None, config::ValueKind::Table(table)).try_deserialize().map_err(|e| err(key, e.to_string()))
}
