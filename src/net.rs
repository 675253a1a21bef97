//! Listening sockets, the same way for every gRPC server pacpriv runs
//! (its own listeners, the demo teachers, the benchmark's proxy).

use std::net::SocketAddr;
use tokio::net::TcpListener;

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
