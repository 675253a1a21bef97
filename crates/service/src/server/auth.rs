//! Who is calling: the API key from request metadata, or — with mTLS and
//! `tls.principal_from_cert` — the verified client certificate's subject
//! CN; then the principal and session it names ([`Sessions::authenticate`]).

use super::App;
use super::status::ServiceError;
use crate::metrics::Outcome;
use crate::net::connection;
use crate::session::{Caller, Credential, SessionError, Sessions};
use tonic::codegen::http::HeaderMap;
use tonic::{Request, Status};

/// The key from `x-api-key`, or from `authorization: Bearer <key>`, in a
/// request's headers (its metadata's, `MetadataMap::as_ref`).
pub fn api_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get("x-api-key") {
        return v.to_str().ok();
    }
    let auth = headers.get("authorization")?.to_str().ok()?;
    auth.strip_prefix("Bearer ").or_else(|| auth.strip_prefix("bearer ")).map(str::trim)
}

/// The subject CN of the client certificate the TLS handshake verified
/// (the first of `certs` is the client's own).
fn certificate_cn(certs: &[tonic::transport::CertificateDer<'static>]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(certs.first()?.as_ref()).ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?.to_owned();
    Some(cn)
}

/// The caller: the one [`CredentialFirst`] found, or else
/// looked up now. An API key, when sent, is the credential (even with a
/// client certificate); the certificate names the principal only when
/// `from_cert` and no key was sent.
///
/// # Errors
/// Unauthenticated when no credential names an active principal.
pub async fn authenticate<T>(
    sessions: &Sessions,
    request: &Request<T>,
    from_cert: bool,
) -> Result<Caller, ServiceError> {
    if let Some(Authenticated(caller)) = request.extensions().get::<Authenticated>() {
        return Ok(caller.clone());
    }
    let certs = connection::peer_certs(request.extensions());
    let peer = connection::of(request.extensions()).map(|c| c.peer());
    from_credential(sessions, request.metadata().as_ref(), certs.as_deref().map(Vec::as_slice), from_cert, peer).await
}

/// The caller the credential in `headers` (or, with `from_cert`, the
/// client certificate `certs`) names, presented by `peer` (whose lookups
/// of unknown keys are capped).
async fn from_credential(
    sessions: &Sessions,
    headers: &HeaderMap,
    certs: Option<&[tonic::transport::CertificateDer<'static>]>,
    from_cert: bool,
    peer: Option<std::net::IpAddr>,
) -> Result<Caller, ServiceError> {
    if let Some(key) = api_key(headers) {
        return Ok(sessions.authenticate_from(Credential::ApiKey(key), peer).await?);
    }
    let cn = if from_cert { certs.and_then(certificate_cn) } else { None };
    match cn {
        Some(cn) => Ok(sessions.authenticate_from(Credential::Certificate(&cn), peer).await?),
        None => Err(SessionError::Unauthenticated.into()),
    }
}

/// A caller who is about to ask a query; a refusal is
/// counted as that query's outcome.
///
/// # Errors
/// Unauthenticated, as a status.
pub async fn querier<T>(app: &App, request: &Request<T>) -> Result<Caller, Status> {
    authenticate(&app.sessions, request, app.principal_from_cert).await.map_err(|e| {
        app.metrics.service.query(Outcome::Unauthenticated);
        Status::from(e)
    })
}

/// The caller a call was authenticated as from its headers, before its
/// body was read ([`CredentialFirst`]); the handler takes it from the
/// request's extensions instead of looking the credential up again.
#[derive(Clone)]
pub struct Authenticated(pub Caller);

/// Whether a call on `path` needs a credential: every `Privatizer` call,
/// `ModelInfer` and `ModelStatistics` (the inference protocol's metadata
/// and liveness calls are open).
fn needs_credential(path: &str) -> bool {
    path.starts_with("/pacpriv.v1.Privatizer/") || path == MODEL_INFER || path == MODEL_STATISTICS
}

const MODEL_INFER: &str = "/inference.GRPCInferenceService/ModelInfer";
const MODEL_STATISTICS: &str = "/inference.GRPCInferenceService/ModelStatistics";

/// A gRPC service whose calls are authenticated from their headers — the
/// API key, or with `tls.principal_from_cert` the verified client
/// certificate — before any of the body is read: tonic decodes a unary
/// request's whole body before the handler runs, so without this a peer
/// with no key could make every call cost a body of up to
/// `server.max_message_bytes`, trickled for `server.request_timeout_ms`.
/// A call with no credential, or one naming no active principal, is
/// answered UNAUTHENTICATED at once; one that authenticates marks its
/// connection so ([`connection::Connection::authenticate`]).
#[derive(Clone)]
pub struct CredentialFirst<S> {
    inner: S,
    app: std::sync::Arc<App>,
}

impl<S> CredentialFirst<S> {
    /// `inner`, its calls authenticated first against `app`'s principals.
    pub fn new(app: std::sync::Arc<App>, inner: S) -> Self {
        CredentialFirst { inner, app }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for CredentialFirst<S> {
    const NAME: &'static str = S::NAME;
}

type HttpRequest = tonic::codegen::http::Request<tonic::body::Body>;
type HttpResponse = tonic::codegen::http::Response<tonic::body::Body>;

impl<S> tonic::codegen::Service<HttpRequest> for CredentialFirst<S>
where
    S: tonic::codegen::Service<HttpRequest, Response = HttpResponse, Error = std::convert::Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = HttpResponse;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<HttpResponse, std::convert::Infallible>;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: HttpRequest) -> Self::Future {
        // The service polled ready is the one that takes the call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let app = std::sync::Arc::clone(&self.app);
        Box::pin(async move {
            let path = request.uri().path();
            if !needs_credential(path) {
                return inner.call(request).await;
            }
            let is_query = !path.ends_with("/GetBudget") && path != MODEL_STATISTICS;
            let certs = connection::peer_certs(request.extensions());
            let peer = connection::of(request.extensions()).map(|c| c.peer());
            match from_credential(
                &app.sessions,
                request.headers(),
                certs.as_deref().map(Vec::as_slice),
                app.principal_from_cert,
                peer,
            )
            .await
            {
                Ok(caller) => {
                    connection::authenticated(request.extensions(), caller.principal());
                    request.extensions_mut().insert(Authenticated(caller));
                    inner.call(request).await
                }
                Err(e) => {
                    if is_query {
                        app.metrics.service.query(Outcome::Unauthenticated);
                    }
                    Ok(Status::from(e).into_http())
                }
            }
        })
    }
}
