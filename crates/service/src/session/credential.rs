//! How a caller says who they are ([`Credential`]), and what is kept of
//! it after authentication ([`Presented`]): the key's SHA-256, never the
//! key, or the verified certificate's CN.

use sha2::{Digest, Sha256};
use std::sync::Arc;

/// How a caller says who they are.
#[derive(Clone, Copy, Debug)]
pub enum Credential<'a> {
    /// An API key (`x-api-key` or a bearer token).
    ApiKey(&'a str),
    /// The subject CN of a client certificate the TLS layer verified.
    Certificate(&'a str),
}

/// A credential as kept after authentication: the key's digest (never the
/// key), or the certificate's CN.
#[derive(Clone, Debug)]
pub(super) enum Presented {
    /// SHA-256 of the API key.
    Key([u8; 32]),
    /// The verified client certificate's subject CN.
    Certificate(Arc<str>),
}

impl From<Credential<'_>> for Presented {
    fn from(credential: Credential<'_>) -> Self {
        match credential {
            Credential::ApiKey(key) => Presented::Key(Sha256::digest(key.as_bytes()).into()),
            Credential::Certificate(cn) => Presented::Certificate(cn.into()),
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
