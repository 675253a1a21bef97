//! Who is calling: the API key from request metadata, or — with mTLS and
//! `tls.principal_from_cert` — the verified client certificate's subject
//! CN; then the principal and session it names ([`Sessions::authenticate`]).

use super::App;
use super::status::ServiceError;
use crate::metrics::Outcome;
use crate::session::{Credential, Handle, SessionError, Sessions};
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

/// The key from `x-api-key`, or from `authorization: Bearer <key>`.
pub fn api_key(metadata: &MetadataMap) -> Option<&str> {
    if let Some(v) = metadata.get("x-api-key") {
        return v.to_str().ok();
    }
    let auth = metadata.get("authorization")?.to_str().ok()?;
    auth.strip_prefix("Bearer ").or_else(|| auth.strip_prefix("bearer ")).map(str::trim)
}

/// The subject CN of the client certificate the TLS handshake verified
/// (the first of the chain is the client's own).
fn certificate_cn<T>(request: &Request<T>) -> Option<String> {
    let certs = request.peer_certs()?;
    let (_, cert) = x509_parser::parse_x509_certificate(certs.first()?.as_ref()).ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?.to_owned();
    Some(cn)
}

/// The caller's session. An API key, when sent, is the credential (even
/// with a client certificate); the certificate names the principal only
/// when `from_cert` and no key was sent.
///
/// # Errors
/// Unauthenticated when no credential names an active principal.
pub async fn authenticate<T>(
    sessions: &Sessions,
    request: &Request<T>,
    from_cert: bool,
) -> Result<Handle, ServiceError> {
    if let Some(key) = api_key(request.metadata()) {
        return Ok(sessions.authenticate(Credential::ApiKey(key)).await?);
    }
    let cn = if from_cert { certificate_cn(request) } else { None };
    match cn {
        Some(cn) => Ok(sessions.authenticate(Credential::Certificate(&cn)).await?),
        None => Err(SessionError::Unauthenticated.into()),
    }
}

/// The session of a caller who is about to ask a query; a refusal is
/// counted as that query's outcome.
///
/// # Errors
/// Unauthenticated, as a status.
pub async fn querier<T>(app: &App, request: &Request<T>) -> Result<Handle, Status> {
    authenticate(&app.sessions, request, app.principal_from_cert).await.map_err(|e| {
        app.metrics.service.query(Outcome::Unauthenticated);
        Status::from(e)
    })
}
