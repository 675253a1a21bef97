//! HTTP/1.1 serving for pacpriv's HTTP listeners (the Open Inference
//! Protocol's REST binding, `/metrics`), with the limits a hostile client
//! meets ([`Limits`]) in place of `axum::serve`, which has none:
//!
//! - at most `max_connections` connections at once: further clients wait
//!   in the kernel's accept queue until one closes (no task, no buffer is
//!   spent on them);
//! - each request's headers must arrive within `header_read` of the
//!   connection becoming ready for them (hyper's header-read timeout, which
//!   also closes an idle kept-alive connection), or the connection is
//!   closed: a client trickling a partial header holds its slot no longer;
//! - one request in flight per connection (HTTP/1.1 answers a connection's
//!   requests in order; pipelined requests wait for the one before).
//!
//! Bodies are bounded where they are read (the request timeout and size
//! limit of `server::inference::http`), after the credential is checked.

use super::Limits;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Serves `router` on `listener` within `limits` until `stop` is
/// cancelled; then each connection finishes the request it is answering
/// and closes, and this returns once all have.
pub async fn serve<L>(mut listener: L, router: axum::Router, limits: &Limits, stop: CancellationToken)
where
    L: axum::serve::Listener,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let connections = TaskTracker::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(limits.header_read).keep_alive(true);
    loop {
        // A slot first: over the cap, clients wait unaccepted.
        let slot = tokio::select! {
            () = stop.cancelled() => break,
            slot = Arc::clone(&slots).acquire_owned() => slot,
        };
        let Ok(slot) = slot else { break };
        let io = tokio::select! {
            () = stop.cancelled() => break,
            (io, _) = listener.accept() => io,
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let connection = http.serve_connection(hyper_util::rt::TokioIo::new(io), service);
        let stop = stop.clone();
        connections.spawn(async move {
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                () = stop.cancelled() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            drop(slot);
        });
    }
    connections.close();
    connections.wait().await;
}
