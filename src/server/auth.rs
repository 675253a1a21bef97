//! Reads the API key from request metadata and finds its session.

use super::status::ServiceError;
use crate::session::{Handle, SessionError, Sessions};
use tonic::metadata::MetadataMap;

/// The key from `x-api-key`, or from `authorization: Bearer <key>`.
fn api_key(metadata: &MetadataMap) -> Option<&str> {
    if let Some(v) = metadata.get("x-api-key") {
        return v.to_str().ok();
    }
    let auth = metadata.get("authorization")?.to_str().ok()?;
    auth.strip_prefix("Bearer ").or_else(|| auth.strip_prefix("bearer ")).map(str::trim)
}

/// The caller's session.
///
/// # Errors
/// Unauthenticated when the key is absent or names no principal.
pub fn authenticate(sessions: &Sessions, metadata: &MetadataMap) -> Result<Handle, ServiceError> {
    let key = api_key(metadata).ok_or(SessionError::Unauthenticated)?;
    Ok(sessions.authenticate(key)?)
}
