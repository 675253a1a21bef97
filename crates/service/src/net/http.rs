//! HTTP/1.1 serving for pacpriv's HTTP listeners (the Open Inference
//! Protocol's REST binding, `/metrics`), with the limits a hostile client
//! meets ([`Limits`]) in place of `axum::serve`, which has none:
//!
//! - at most `max_connections` connections at once, and
//!   `max_connections_per_peer` of one peer address ([`super::guard`],
//!   which hands the connections over): further clients wait in the
//!   kernel's accept queue until one closes (no task, no buffer is spent
//!   on them);
//! - a connection older than `max_connection_age`, or with no
//!   authenticated request for `idle` (`server.idle_timeout_ms`;
//!   a stranger's health polls and metadata reads do not count), is closed
//!   once the request in progress is answered, so neither a
//!   slow-but-valid client nor a stranger polling keeps its slot longer;
//! - each request's headers must arrive within `header_read` of the
//!   connection becoming ready for them (hyper's header-read timeout, which
//!   also closes an idle kept-alive connection), or the connection is
//!   closed: a client trickling a partial header holds its slot no longer;
//! - one request in flight per connection (HTTP/1.1 answers a connection's
//!   requests in order; pipelined requests wait for the one before);
//! - a response the client does not read for `header_read` (its window
//!   closed, the write stalled) ends the connection ([`Stall`]): a client
//!   that pipelines requests and never reads the answers holds its slot no
//!   longer than one that never finishes its headers.
//!
//! Bodies are bounded where they are read (the request timeout and size
//! limit of `server::inference::http`), after the credential is checked.

use super::Limits;
use super::guard::Guarded;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Serves `router` on the `connections` handed over (each holding its
/// slot, [`super::guard`]) within `limits` until `stop` is cancelled; then
/// each connection finishes the request it is answering and closes, and
/// this returns once all have.
pub async fn serve<IO, S>(mut connections: S, router: axum::Router, limits: &Limits, stop: CancellationToken)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: futures_util::Stream<Item = std::io::Result<Guarded<IO>>> + Unpin,
{
    use futures_util::StreamExt;
    let tasks = TaskTracker::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(limits.header_read).keep_alive(true);
    loop {
        let io = tokio::select! {
            () = stop.cancelled() => break,
            next = connections.next() => match next {
                Some(Ok(io)) => io,
                Some(Err(_)) => continue,
                None => break,
            },
        };
        // Handlers mark the connection authenticated through it.
        let state = Arc::clone(io.connection());
        let router = router.clone().layer(axum::Extension(Arc::clone(&state)));
        let service = hyper_util::service::TowerToHyperService::new(router);
        let io = Stall { io, limit: limits.header_read, since: None };
        let connection = http.serve_connection(hyper_util::rt::TokioIo::new(io), service);
        let (stop, age, idle) = (stop.clone(), limits.max_connection_age, limits.idle);
        tasks.spawn(async move {
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                // Dropped at once: its handler may be waiting on
                // something other than the socket (a lookup, a body it
                // has not begun to read), which a failed read never reaches.
                () = state.evicted() => return,
                () = stop.cancelled() => {}
                () = tokio::time::sleep_until(state.accepted() + age) => {}
                () = state.idled(idle) => {}
            }
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        });
    }
    tasks.close();
    tasks.wait().await;
}

/// A connection whose writes fail once they have been stalled (the peer
/// not reading) for `limit`.
struct Stall<IO> {
    io: IO,
    limit: Duration,
    /// When the current stall ends the connection.
    since: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<IO> Stall<IO> {
    /// `ready` as is, clearing the stall; or, while pending, an error once
    /// the stall has lasted `limit`.
    fn watch<T>(&mut self, cx: &mut Context<'_>, ready: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        if ready.is_ready() {
            self.since = None;
            return ready;
        }
        let limit = self.limit;
        let since = self.since.get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match since.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client stopped reading its responses",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Stall<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Stall<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let ready = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, ready)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let ready = Pin::new(&mut self.io).poll_flush(cx);
        self.watch(cx, ready)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let ready = Pin::new(&mut self.io).poll_shutdown(cx);
        self.watch(cx, ready)
    }
}
