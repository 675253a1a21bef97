//! `GET /metrics` over plain HTTP/1.1, the Prometheus scrape endpoint (any
//! other path is 404). Separate from the gRPC listeners so a scraper needs
//! neither TLS client certificates nor an API key; bind it where only the
//! monitoring system can reach it.

use super::Metrics;
use crate::net::guard::{Watch, guarded_incoming};
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The OpenMetrics text format `prometheus-client` writes.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

async fn scrape(State(metrics): State<Arc<Metrics>>) -> Response {
    match metrics.encode() {
        Ok(body) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "encoding metrics failed").into_response(),
    }
}

/// Serves `/metrics` on `listener` within `limits` until `stop`.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, limits: crate::net::Limits, stop: CancellationToken) {
    let app = Router::new().route("/metrics", get(scrape)).with_state(metrics);
    let connections = guarded_incoming(listener, limits.slots(), Watch::Nothing, stop.clone());
    crate::net::http::serve(connections, app, &limits, stop).await;
}
