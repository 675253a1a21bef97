//! Listening sockets, the same way for every server pacpriv runs (its own
//! listeners, the demo teachers, the benchmark's proxy), in plaintext or
//! through [`tls`]; and the limits every listener gets ([`Limits`]): per
//! connection through [`guard`], gRPC through [`builder`], HTTP through
//! [`http::serve`].

pub mod aged;
pub mod connection;
pub mod guard;
pub mod http;
pub mod tls;

use guard::{Guarded, Slots, Watch};

use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;

/// What one client may hold of a listener (`server.*` settings; the
/// configuration reference says why each default is what it is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// gRPC: calls in flight on one connection (HTTP/2
    /// SETTINGS_MAX_CONCURRENT_STREAMS); further calls wait.
    pub max_concurrent_streams: u32,
    /// Every listener: connections open at once; further clients wait
    /// unaccepted.
    pub max_connections: usize,
    /// Every listener: connections one peer address may hold of them.
    pub max_connections_per_peer: usize,
    /// HTTP: how long a request's headers may take to arrive (and how long
    /// a kept-alive connection may idle); gRPC: how long the HTTP/2
    /// preface may take.
    pub header_read: Duration,
    /// gRPC: how long a connection may go without a request or a stream
    /// message before it is closed.
    pub idle: Duration,
    /// How long a connection may live: gRPC ones are then told to go away
    /// (GOAWAY: no new calls) and close once their calls in flight end;
    /// HTTP ones are closed after the request in progress. Clients
    /// reconnect — under a rotated client CA, for instance — and a peer
    /// cannot keep its slots for ever.
    pub max_connection_age: Duration,
    /// gRPC: how long a call may take to produce its response; HTTP: how
    /// long an authenticated request's body may take to arrive.
    pub request: Duration,
    /// gRPC: how often an HTTP/2 PING checks an idle connection's peer…
    pub keepalive_interval: Duration,
    /// …and how long its answer may take before the connection is closed.
    pub keepalive_timeout: Duration,
}

/// A listener could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {reason}")]
pub struct BindError {
    /// The address.
    pub addr: SocketAddr,
    /// The OS error.
    pub reason: String,
}

/// A listener on `addr` and the address it got (the port, when `addr`'s
/// is 0).
///
/// # Errors
/// [`BindError`], naming the address.
pub async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), BindError> {
    let error = |e: std::io::Error| BindError { addr, reason: e.to_string() };
    let listener = TcpListener::bind(addr).await.map_err(error)?;
    let bound = listener.local_addr().map_err(error)?;
    Ok((listener, bound))
}

/// Accepted connections of `listener`, with Nagle's algorithm off: gRPC
/// replies are small and latency-bound, and with Nagle a reply can wait for
/// the peer's delayed ACK (BENCHMARKS.md measured 2.4× throughput with it
/// off).
pub fn incoming(listener: TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// A gRPC server builder with `limits`: calls in flight per connection,
/// HTTP/2 keep-alive (a peer that stops answering PINGs is disconnected)
/// and the per-call timeout (DEADLINE_EXCEEDED; a client's shorter
/// `grpc-timeout` still wins). TLS, when configured, is the listener's
/// ([`tls_incoming`]).
pub fn builder(limits: &Limits) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(limits.max_concurrent_streams)
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        // No grace: with one, tonic 0.14 skips the GOAWAY and cuts the
        // connection at age + grace, calls in flight included.
        .max_connection_age(limits.max_connection_age)
        .timeout(limits.request)
}

impl Limits {
    /// A listener's connection slots; when full, a new connection evicts
    /// a stranger's ([`guard::Slots::evicting`]).
    pub fn slots(&self) -> std::sync::Arc<guard::Slots> {
        guard::Slots::evicting(self.max_connections, self.max_connections_per_peer)
    }

    /// What an HTTP/2 (gRPC) connection's bytes are watched for.
    pub fn h2_watch(&self) -> Watch {
        Watch::H2 { preface: self.header_read, idle: self.idle }
    }
}

/// How long a client may take to complete the TLS handshake.
const HANDSHAKE: std::time::Duration = std::time::Duration::from_secs(10);

/// A TLS connection, handshake done, held to its listener's limits.
pub type TlsConnection = Guarded<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>;

/// Connections of `listener`, each through the TLS handshake `tls` offers
/// for `alpn` at the time it is accepted, until `stop`. Each holds one of
/// `slots` from before it is accepted until it closes (beyond that,
/// clients wait unaccepted) and is [`Guarded`] with `watch` once its
/// handshake is done. Handshakes run concurrently (a slow client holds up
/// no one) and fail alone: a client with a wrong certificate is dropped
/// and logged, the listener goes on.
pub fn tls_incoming(
    listener: TcpListener,
    tls: std::sync::Arc<tls::ServerTls>,
    alpn: tls::Alpn,
    stop: tokio_util::sync::CancellationToken,
    slots: std::sync::Arc<Slots>,
    watch: Watch,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<TlsConnection>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        while let Some((tcp, peer, slot)) = guard::accept(&listener, &slots, &stop).await {
            let (acceptor, tx) = (tls.acceptor(alpn), tx.clone());
            tokio::spawn(async move {
                let handshake = tokio::select! {
                    handshake = tokio::time::timeout(HANDSHAKE, acceptor.accept(tcp)) => handshake,
                    () = slot.connection().evicted() => {
                        return tracing::info!(%peer, "TLS handshake evicted: the listener was full");
                    }
                };
                match handshake {
                    Ok(Ok(connection)) => {
                        let _ = tx.send(Ok(Guarded::new(connection, slot, watch))).await;
                    }
                    Ok(Err(e)) => tracing::info!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::info!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
