//! `GET /metrics` over plain HTTP/1.1, the Prometheus scrape endpoint (any
//! other path is 404). Separate from the gRPC listeners so a scraper needs
//! neither TLS client certificates nor an API key. It shows principal
//! names and their spending, so it is bound to loopback unless configured
//! (the image too), and with `metrics.token_sha256` a scrape must send
//! that bearer token: one without it is refused 401, and its connection
//! stays a stranger's (`net::connection`).

use super::Metrics;
use crate::net::connection::Connection;
use crate::net::guard::{Watch, guarded_incoming};
use axum::Router;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The OpenMetrics text format `prometheus-client` writes.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What a scrape is answered with.
struct Scrape {
    metrics: Arc<Metrics>,
    token_sha256: Option<[u8; 32]>,
}

async fn scrape(
    State(scrape): State<Arc<Scrape>>,
    connection: Option<Extension<Arc<Connection>>>,
    headers: HeaderMap,
) -> Response {
    if let Some(token_sha256) = &scrape.token_sha256 {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(|token| <[u8; 32]>::from(Sha256::digest(token.trim().as_bytes())));
        let valid = presented.is_some_and(|p| bool::from(p.ct_eq(token_sha256)));
        if !valid {
            let refusal =
                "this endpoint needs the metrics token (metrics.token_sha256) as `authorization: Bearer <token>`";
            return (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], refusal).into_response();
        }
        if let Some(Extension(connection)) = connection {
            connection.authenticate("(metrics)");
        }
    }
    match scrape.metrics.encode() {
        Ok(body) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "encoding metrics failed").into_response(),
    }
}

/// Serves `/metrics` on `listener` within `limits` until `stop`, to
/// scrapes that send the token hashing to `token_sha256` (if set).
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    token_sha256: Option<[u8; 32]>,
    limits: crate::net::Limits,
    stop: CancellationToken,
) {
    let app = Router::new().route("/metrics", get(scrape)).with_state(Arc::new(Scrape { metrics, token_sha256 }));
    let connections = guarded_incoming(listener, limits.slots(), Watch::Nothing, stop.clone());
    crate::net::http::serve(connections, app, &limits, stop).await;
}
