//! What every accepted connection is held to below its protocol
//! ([`Guarded`]), and the accept loop that hands them out
//! ([`guarded_incoming`]).
//!
//! # Invariants
//! - A connection holds one of its listener's `server.max_connections`
//!   slots for its whole life, handshake included: over the cap, clients
//!   wait unaccepted in the kernel's queue, and no task or buffer is spent
//!   on them ([`Slots`]).
//! - One peer address holds at most `server.max_connections_per_peer` of
//!   them: a connection past its share is closed as soon as it is
//!   accepted, so one peer cannot take every slot and shut the others
//!   out.
//! - An HTTP/2 connection ([`Watch::H2`]) must send the client preface
//!   within `server.header_read_timeout_ms`, and is closed once its client
//!   has sent no request and no stream message (a HEADERS or DATA frame)
//!   for `server.idle_timeout_ms`: PINGs, SETTINGS and window updates keep
//!   nothing open. Frames are followed by their 9-byte headers only; a
//!   payload is skipped as it passes, never buffered.
//! - An HTTP/2 connection whose peer reads nothing written to it for
//!   `server.idle_timeout_ms` (every write, flush or TLS close waiting) is
//!   closed: a stalled socket would otherwise hold its slot for ever,
//!   since neither HTTP/2's keep-alive PING nor a GOAWAY gets through it.
//! - An accept error (EMFILE: out of file descriptors) is logged and
//!   retried after [`ACCEPT_BACKOFF`], never in a spinning loop.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

/// How long the accept loop waits after an accept error before it tries
/// again (as axum's loop does): the error, typically EMFILE, lasts until
/// connections close.
pub const ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// The HTTP/2 client connection preface (RFC 9113 §3.4), 24 bytes.
const PREFACE: usize = 24;
/// An HTTP/2 frame header's size: length (3), type, flags, stream (4).
const FRAME_HEADER: usize = 9;

/// What a connection's bytes are watched for.
#[derive(Clone, Copy, Debug)]
pub enum Watch {
    /// Nothing: the protocol bounds its own waits (HTTP/1.1 has hyper's
    /// header-read timeout, and `net::http` its stalled writes).
    Nothing,
    /// HTTP/2: the preface within `preface`, then a HEADERS or DATA frame
    /// at least every `idle`; and a write (or flush, or TLS close) that
    /// waits `idle` for the peer to read closes the connection.
    H2 {
        /// Deadline for the client preface.
        preface: Duration,
        /// Longest silence between requests and stream messages.
        idle: Duration,
    },
}

/// A listener's connection slots: `server.max_connections` in all, at
/// most `server.max_connections_per_peer` for one peer address.
pub struct Slots {
    total: Arc<Semaphore>,
    per_peer: usize,
    held: Mutex<HashMap<IpAddr, usize>>,
}

impl Slots {
    /// `max` slots, at most `per_peer` of them for one peer.
    pub fn new(max: usize, per_peer: usize) -> Arc<Self> {
        Arc::new(Slots { total: Arc::new(Semaphore::new(max)), per_peer, held: Mutex::default() })
    }

    /// One more connection for `peer`, unless it holds its share.
    fn take(self: &Arc<Self>, peer: IpAddr, total: OwnedSemaphorePermit) -> Option<Slot> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.entry(peer).or_default();
        if *count >= self.per_peer {
            return None;
        }
        *count += 1;
        Some(Slot { slots: Arc::clone(self), peer, _total: total })
    }
}

/// One connection's slot; given back when the connection closes.
pub struct Slot {
    slots: Arc<Slots>,
    peer: IpAddr,
    _total: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.peer);
            }
        }
    }
}

/// An accepted connection, held to its listener's limits (module
/// documentation).
pub struct Guarded<IO> {
    io: IO,
    _slot: Slot,
    watch: Option<H2Watch>,
    writes: Option<WriteWatch>,
}

/// How long a write may wait for the peer to read, and since when the
/// current one has.
struct WriteWatch {
    stall: Duration,
    stalled: Pin<Box<Sleep>>,
    /// Whether `stalled` runs: a write is waiting.
    armed: bool,
}

impl WriteWatch {
    /// `write` (a poll of the connection's writing side) unless it has
    /// waited `stall` for the peer: progress clears the clock, waiting
    /// starts it, and a wait past it is an error that closes the
    /// connection.
    fn watch<T>(&mut self, cx: &mut Context<'_>, write: Poll<std::io::Result<T>>) -> Poll<std::io::Result<T>> {
        if write.is_ready() {
            self.armed = false;
            return write;
        }
        if !self.armed {
            self.armed = true;
            self.stalled.as_mut().reset(Instant::now() + self.stall);
        }
        if self.stalled.as_mut().poll(cx).is_ready() {
            let e = std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the peer read nothing written to it for server.idle_timeout_ms",
            );
            tracing::info!(reason = %e, "closing a connection");
            return Poll::Ready(Err(e));
        }
        write
    }
}

/// `write` as `writes` (if any) lets it through ([`WriteWatch::watch`]).
fn watched<T>(
    writes: &mut Option<WriteWatch>,
    cx: &mut Context<'_>,
    write: Poll<std::io::Result<T>>,
) -> Poll<std::io::Result<T>> {
    match writes {
        Some(writes) => writes.watch(cx, write),
        None => write,
    }
}

/// Where the reader is in the client's HTTP/2 byte stream, and when the
/// connection times out unless the client does something.
struct H2Watch {
    idle: Duration,
    at: At,
    deadline: Pin<Box<Sleep>>,
}

enum At {
    /// Bytes of the preface still to come.
    Preface(usize),
    /// A frame header, `have` bytes of it read.
    Header { bytes: [u8; FRAME_HEADER], have: usize },
    /// Bytes of a payload still to skip.
    Payload(usize),
}

impl At {
    /// The start of the next frame.
    const NEXT_FRAME: At = At::Header { bytes: [0; FRAME_HEADER], have: 0 };
}

impl H2Watch {
    /// Follows `bytes` read from the client; whether they completed a
    /// HEADERS or DATA frame's header (or the preface).
    fn feed(&mut self, mut bytes: &[u8]) -> bool {
        let mut active = false;
        while !bytes.is_empty() {
            match &mut self.at {
                At::Preface(left) => {
                    let n = (*left).min(bytes.len());
                    *left -= n;
                    bytes = &bytes[n..];
                    if *left == 0 {
                        self.at = At::NEXT_FRAME;
                        active = true;
                    }
                }
                At::Header { bytes: header, have } => {
                    let n = (FRAME_HEADER - *have).min(bytes.len());
                    header[*have..*have + n].copy_from_slice(&bytes[..n]);
                    *have += n;
                    bytes = &bytes[n..];
                    if *have == FRAME_HEADER {
                        let length =
                            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
                        // DATA (0x0) and HEADERS (0x1): a request, a stream message.
                        active |= header[3] <= 1;
                        self.at = if length == 0 { At::NEXT_FRAME } else { At::Payload(length) };
                    }
                }
                At::Payload(left) => {
                    let n = (*left).min(bytes.len());
                    *left -= n;
                    bytes = &bytes[n..];
                    if *left == 0 {
                        self.at = At::NEXT_FRAME;
                    }
                }
            }
        }
        active
    }

    fn timed_out(&self) -> std::io::Error {
        let what = match self.at {
            At::Preface(_) => "no HTTP/2 preface within server.header_read_timeout_ms",
            _ => "no request or stream message within server.idle_timeout_ms",
        };
        std::io::Error::new(std::io::ErrorKind::TimedOut, what)
    }
}

impl<IO> Guarded<IO> {
    /// `io`, holding `slot` for its life, watched as `watch` says.
    pub fn new(io: IO, slot: Slot, watch: Watch) -> Self {
        let (watch, writes) = match watch {
            Watch::Nothing => (None, None),
            Watch::H2 { preface, idle } => {
                let deadline = Box::pin(tokio::time::sleep(preface));
                let writes = WriteWatch { stall: idle, stalled: Box::pin(tokio::time::sleep(idle)), armed: false };
                (Some(H2Watch { idle, at: At::Preface(PREFACE), deadline }), Some(writes))
            }
        };
        Guarded { io, _slot: slot, watch, writes }
    }

    /// The connection itself.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        let Some(watch) = &mut this.watch else { return read };
        if let Poll::Ready(Ok(())) = &read
            && watch.feed(&buf.filled()[before..])
        {
            let idle = watch.idle;
            watch.deadline.as_mut().reset(Instant::now() + idle);
            return read;
        }
        // Reads that keep nothing open (PINGs, window updates) do not
        // postpone the deadline; nor does waiting.
        if watch.deadline.as_mut().poll(cx).is_ready() {
            let e = watch.timed_out();
            tracing::info!(reason = %e, "closing a connection");
            return Poll::Ready(Err(e));
        }
        read
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let write = Pin::new(&mut this.io).poll_write(cx, buf);
        watched(&mut this.writes, cx, write)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let write = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        watched(&mut this.writes, cx, write)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let flush = Pin::new(&mut this.io).poll_flush(cx);
        watched(&mut this.writes, cx, flush)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // Through TLS a close writes close_notify, which a stalled peer
        // never takes either.
        let this = &mut *self;
        let shutdown = Pin::new(&mut this.io).poll_shutdown(cx);
        watched(&mut this.writes, cx, shutdown)
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for Guarded<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// The next connection of `listener` once one of `slots` is free, or
/// `None` once `stop` is cancelled. A connection from a peer that holds
/// its share is closed at once; an accept error is logged and retried
/// after [`ACCEPT_BACKOFF`].
pub async fn accept(
    listener: &TcpListener,
    slots: &Arc<Slots>,
    stop: &CancellationToken,
) -> Option<(TcpStream, std::net::SocketAddr, Slot)> {
    loop {
        // A slot first: over the cap, clients wait unaccepted.
        let total = tokio::select! {
            () = stop.cancelled() => return None,
            total = Arc::clone(&slots.total).acquire_owned() => total.ok()?,
        };
        let (tcp, peer) = accept_tcp(listener, stop).await?;
        match slots.take(peer.ip(), total) {
            Some(slot) => {
                let _ = tcp.set_nodelay(true);
                return Some((tcp, peer, slot));
            }
            // Dropped, with its slot.
            None => tracing::debug!(%peer, "connection past the peer's share of server.max_connections: closed"),
        }
    }
}

/// The next connection of `listener`, or `None` once `stop` is cancelled;
/// an accept error is logged and retried after [`ACCEPT_BACKOFF`].
async fn accept_tcp(listener: &TcpListener, stop: &CancellationToken) -> Option<(TcpStream, std::net::SocketAddr)> {
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return None,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok(accepted) => return Some(accepted),
            Err(e) => {
                tracing::warn!(error = %e, "accepting a connection failed; trying again in a second");
                tokio::select! {
                    () = stop.cancelled() => return None,
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                }
            }
        }
    }
}

/// Connections of `listener`, each [`Guarded`] with one of `slots` and
/// `watch`, until `stop` (a stream for tonic's `serve_with_incoming`, or
/// [`super::http::serve`]).
pub fn guarded_incoming(
    listener: TcpListener,
    slots: Arc<Slots>,
    watch: Watch,
    stop: CancellationToken,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<Guarded<TcpStream>>> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        while let Some((tcp, _, slot)) = accept(&listener, &slots, &stop).await {
            if tx.send(Ok(Guarded::new(tcp, slot, watch))).await.is_err() {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
