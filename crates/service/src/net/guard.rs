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
//!   Until a call on it authenticates, the wait allowed is
//!   `server.header_read_timeout_ms`.
//! - An evicted connection fails its next read *or write* at once: a peer
//!   that stops reading (so the server stops reading it, to flush first)
//!   cannot keep an evicted slot, and the accept loop waits for one at most
//!   [`EVICTION_WAIT`].
//! - An accept error (EMFILE: out of file descriptors) is logged and
//!   retried after [`ACCEPT_BACKOFF`], never in a spinning loop.

use super::connection::{self, Connection};
use std::collections::{BTreeMap, HashMap};
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

/// How long a connection admitted by evicting another waits for the
/// evicted one's slot before it is closed instead: the accept loop takes
/// nothing else meanwhile.
pub const EVICTION_WAIT: Duration = Duration::from_secs(2);

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
/// most `server.max_connections_per_peer` for one peer ([`PeerGroup`]).
pub struct Slots {
    total: Arc<Semaphore>,
    per_peer: usize,
    /// Whether a full listener evicts a stranger's connection for a new
    /// one (listeners whose calls authenticate).
    evicts: bool,
    held: Mutex<Held>,
    protected: Arc<connection::Protected>,
}

/// The connections a listener holds.
#[derive(Default)]
struct Held {
    per_peer: HashMap<PeerGroup, usize>,
    /// By order of acceptance (the key), for eviction oldest first.
    live: BTreeMap<u64, Arc<Connection>>,
    next: u64,
}

/// The peers that share one per-peer cap: an IPv4 address, or an IPv6
/// /64 (what one subscriber, or one cloud instance, is given: counting
/// IPv6 addresses one by one would let one host take every slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerGroup(IpAddr);

impl PeerGroup {
    /// The group of `peer` (an IPv4-mapped IPv6 address is its IPv4 one).
    pub fn of(peer: IpAddr) -> PeerGroup {
        match peer.to_canonical() {
            IpAddr::V6(v6) => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                PeerGroup(IpAddr::V6(prefix.into()))
            }
            v4 => PeerGroup(v4),
        }
    }
}

/// The range a peer's strangers are counted over, for eviction and for
/// key lookups: its IPv4 address, or its IPv6 /48 (a host given a /48 —
/// tunnel brokers hand them out — holds 65 536 /64s; counted one /64 at a
/// time, its connections would each look like a different peer's).
pub fn site(peer: IpAddr) -> IpAddr {
    match peer.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 80) - 1)).into()),
        v4 => v4,
    }
}

impl Slots {
    /// `max` slots, at most `per_peer` of them for one peer; a new
    /// connection waits for a free slot.
    pub fn new(max: usize, per_peer: usize) -> Arc<Self> {
        Self::build(max, per_peer, false)
    }

    /// As [`Slots::new`], but a connection arriving while all are taken
    /// closes the oldest one no call has authenticated on, and takes its
    /// slot: strangers cannot keep a listener full.
    pub fn evicting(max: usize, per_peer: usize) -> Arc<Self> {
        Self::build(max, per_peer, true)
    }

    fn build(max: usize, per_peer: usize, evicts: bool) -> Arc<Self> {
        let protected = connection::Protected::new(max);
        Arc::new(Slots { total: Arc::new(Semaphore::new(max)), per_peer, evicts, held: Mutex::default(), protected })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `peer` holds its share.
    fn full_for(&self, peer: PeerGroup) -> bool {
        self.held().per_peer.get(&peer).is_some_and(|&n| n >= self.per_peer)
    }

    /// One more connection for `peer`, unless it holds its share.
    fn take(self: &Arc<Self>, peer: IpAddr, total: OwnedSemaphorePermit) -> Option<Slot> {
        let group = PeerGroup::of(peer);
        let mut held = self.held();
        let count = held.per_peer.entry(group).or_default();
        if *count >= self.per_peer {
            return None;
        }
        *count += 1;
        let (id, connection) = (held.next, Connection::new(group.0, Arc::clone(&self.protected)));
        held.next += 1;
        held.live.insert(id, Arc::clone(&connection));
        Some(Slot { slots: Arc::clone(self), group, id, connection, _total: total })
    }

    /// Evicts a connection no call has authenticated on (and not already
    /// evicted): one no credential was ever presented on before one whose
    /// principal is past its share, and among them the oldest of the
    /// [`site`] that holds the most, so a peer churning connections evicts
    /// its own before anyone else's; whether there was one.
    fn evict_a_stranger(&self) -> bool {
        let held = self.held();
        let unprotected = |c: &&Arc<Connection>| !c.is_authenticated() && !c.is_evicted();
        let never_used = held.live.values().filter(unprotected).any(|c| !c.was_used());
        let strangers = || held.live.values().filter(unprotected).filter(move |c| !never_used || !c.was_used());
        let mut per_site: HashMap<IpAddr, usize> = HashMap::new();
        for c in strangers() {
            *per_site.entry(site(c.peer())).or_default() += 1;
        }
        let Some(most) = per_site.values().copied().max() else { return false };
        // `live` is in order of acceptance: the first is the oldest.
        let stranger = strangers().find(|c| per_site.get(&site(c.peer())) == Some(&most));
        stranger.inspect(|c| c.evict()).is_some()
    }
}

/// One connection's slot; given back when the connection closes.
pub struct Slot {
    slots: Arc<Slots>,
    group: PeerGroup,
    id: u64,
    connection: Arc<Connection>,
    _total: OwnedSemaphorePermit,
}

impl Slot {
    /// The connection holding it.
    pub fn connection(&self) -> &Arc<Connection> {
        &self.connection
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.connection.release();
        let mut held = self.slots.held();
        held.live.remove(&self.id);
        if let Some(count) = held.per_peer.get_mut(&self.group) {
            *count -= 1;
            if *count == 0 {
                held.per_peer.remove(&self.group);
            }
        }
    }
}

/// An accepted connection, held to its listener's limits (module
/// documentation).
pub struct Guarded<IO> {
    io: IO,
    slot: Slot,
    evicted: Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>,
    watch: Option<H2Watch>,
    writes: Option<WriteWatch>,
}

/// How long a write may wait for the peer to read, and since when the
/// current one has.
struct WriteWatch {
    stall: Duration,
    /// The wait allowed while no call on the connection has authenticated.
    stranger_stall: Duration,
    stalled: Pin<Box<Sleep>>,
    /// Since when a write has waited (`stalled` runs), if one is.
    since: Option<Instant>,
}

impl WriteWatch {
    /// `write` (a poll of the connection's writing side) unless it has
    /// waited `stall` for the peer: progress clears the clock, waiting
    /// starts it, and a wait past it is an error that closes the
    /// connection.
    /// The allowance is decided when the clock fires: `used` (a call on
    /// the connection has authenticated, protected or not) then gives it
    /// the longer one, however the wait began.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        used: impl Fn() -> bool,
        write: Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>> {
        if write.is_ready() {
            self.since = None;
            return write;
        }
        let since = match self.since {
            Some(since) => since,
            None => {
                let now = Instant::now();
                self.stalled.as_mut().reset(now + self.stall.min(self.stranger_stall));
                *self.since.insert(now)
            }
        };
        while self.stalled.as_mut().poll(cx).is_ready() {
            let used = used();
            let allowed = if used { self.stall } else { self.stranger_stall };
            if since + allowed > Instant::now() {
                self.stalled.as_mut().reset(since + allowed);
                continue;
            }
            let e = std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                if used {
                    "the peer read nothing written to it for server.idle_timeout_ms"
                } else {
                    "the peer, unauthenticated, read nothing written to it for server.header_read_timeout_ms"
                },
            );
            tracing::info!(reason = %e, "closing a connection");
            return Poll::Ready(Err(e));
        }
        write
    }
}

/// Where the reader is in the client's HTTP/2 byte stream, and when the
/// connection times out unless the client does something.
struct H2Watch {
    idle: Duration,
    at: At,
    /// The preface's deadline, then the idle one; moved on lazily, when it
    /// fires ([`H2Watch::idle_from`]).
    deadline: Pin<Box<Sleep>>,
    /// When the preface, or a request or stream message, last arrived.
    active: Instant,
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

    /// Since when the connection has been idle, once its preface is in
    /// (none before): requests and stream messages count only once a call
    /// on it has authenticated, so a stranger's health checks and metadata
    /// calls keep nothing open; an authentication counts always.
    fn idle_from(&self, connection: &Connection) -> Option<Instant> {
        if matches!(self.at, At::Preface(_)) {
            return None;
        }
        let active = if connection.is_authenticated() { self.active } else { connection.accepted() };
        Some(active.max(connection.touched()))
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
                let stalled = Box::pin(tokio::time::sleep(idle));
                let writes = WriteWatch { stall: idle, stranger_stall: preface, stalled, since: None };
                let watch = H2Watch { idle, at: At::Preface(PREFACE), deadline, active: Instant::now() };
                (Some(watch), Some(writes))
            }
        };
        let evicted = Box::pin(slot.connection().evicted());
        Guarded { io, slot, evicted, watch, writes }
    }

    /// The connection's state.
    pub fn connection(&self) -> &Arc<Connection> {
        self.slot.connection()
    }

    /// The connection itself.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// An error once the connection is evicted (and registers `cx` to be
    /// woken when it is).
    fn evicted(&mut self, cx: &mut Context<'_>) -> Option<std::io::Error> {
        self.evicted.as_mut().poll(cx).is_ready().then(|| {
            let e =
                std::io::Error::other("evicted: the listener was full and no call on this connection authenticated");
            tracing::info!(reason = %e, "closing a connection");
            e
        })
    }

    /// A poll of the writing side: an error once evicted, else `write`
    /// as the write watch (if any) lets it through ([`WriteWatch::watch`]).
    fn write_side<T>(
        &mut self,
        cx: &mut Context<'_>,
        write: impl FnOnce(Pin<&mut IO>, &mut Context<'_>) -> Poll<std::io::Result<T>>,
    ) -> Poll<std::io::Result<T>>
    where
        IO: Unpin,
    {
        if let Some(e) = self.evicted(cx) {
            return Poll::Ready(Err(e));
        }
        let polled = write(Pin::new(&mut self.io), cx);
        let connection = self.slot.connection();
        match &mut self.writes {
            Some(writes) => writes.watch(cx, || connection.was_used(), polled),
            None => polled,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        if let Some(e) = this.evicted(cx) {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        let Some(watch) = &mut this.watch else { return read };
        if let Poll::Ready(Ok(())) = &read
            && watch.feed(&buf.filled()[before..])
        {
            watch.active = Instant::now();
        }
        // Reads that keep nothing open (PINGs, window updates) do not
        // postpone the deadline; nor does waiting.
        while watch.deadline.as_mut().poll(cx).is_ready() {
            match watch.idle_from(this.slot.connection()) {
                Some(since) if since + watch.idle > Instant::now() => {
                    watch.deadline.as_mut().reset(since + watch.idle);
                }
                _ => {
                    let e = watch.timed_out();
                    tracing::info!(reason = %e, "closing a connection");
                    return Poll::Ready(Err(e));
                }
            }
        }
        read
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.write_side(cx, |io, cx| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.write_side(cx, |io, cx| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.write_side(cx, |io, cx| io.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // Through TLS a close writes close_notify, which a stalled peer
        // never takes either.
        self.write_side(cx, |io, cx| io.poll_shutdown(cx))
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for Guarded<IO> {
    type ConnectInfo = connection::Info<IO::ConnectInfo>;

    fn connect_info(&self) -> Self::ConnectInfo {
        connection::Info { inner: self.io.connect_info(), connection: Arc::clone(self.slot.connection()) }
    }
}

/// The next connection of `listener` once one of `slots` is free, or
/// `None` once `stop` is cancelled. A connection from a peer that holds
/// its share is closed at once; an accept error is logged and retried
/// after [`ACCEPT_BACKOFF`]. On an evicting listener ([`Slots::evicting`])
/// that is full, a new connection evicts the oldest stranger's and waits
/// (alone: no other is accepted meanwhile) at most [`EVICTION_WAIT`] for
/// its slot, else is closed.
pub async fn accept(
    listener: &TcpListener,
    slots: &Arc<Slots>,
    stop: &CancellationToken,
) -> Option<(TcpStream, std::net::SocketAddr, Slot)> {
    loop {
        let free = Arc::clone(&slots.total).try_acquire_owned();
        let (total, (tcp, peer)) = match free {
            Ok(total) => (total, accept_tcp(listener, stop).await?),
            // Full, and nothing to evict for: clients wait unaccepted.
            Err(_) if !slots.evicts => {
                let total = acquire(slots, stop).await?;
                (total, accept_tcp(listener, stop).await?)
            }
            Err(_) => {
                let total = tokio::select! {
                    total = acquire(slots, stop) => total?,
                    accepted = accept_tcp(listener, stop) => {
                        let (tcp, peer) = accepted?;
                        if slots.full_for(PeerGroup::of(peer.ip())) {
                            tracing::debug!(%peer, "connection past the peer's share of server.max_connections: closed");
                            continue;
                        }
                        let total = if slots.evict_a_stranger() {
                            tracing::debug!(%peer, "listener full: a connection no call authenticated on is evicted for a new one");
                            match tokio::time::timeout(EVICTION_WAIT, acquire(slots, stop)).await {
                                Ok(total) => total?,
                                Err(_) => {
                                    tracing::debug!(%peer, "the evicted connection held its slot; the new one is closed");
                                    continue;
                                }
                            }
                        } else {
                            acquire(slots, stop).await?
                        };
                        match admit(slots, tcp, peer, total) {
                            Some(admitted) => return Some(admitted),
                            None => continue,
                        }
                    }
                };
                (total, accept_tcp(listener, stop).await?)
            }
        };
        if let Some(admitted) = admit(slots, tcp, peer, total) {
            return Some(admitted);
        }
    }
}

/// One of `slots`'s slots once free, or `None` once `stop` is cancelled.
async fn acquire(slots: &Slots, stop: &CancellationToken) -> Option<OwnedSemaphorePermit> {
    tokio::select! {
        () = stop.cancelled() => None,
        total = Arc::clone(&slots.total).acquire_owned() => total.ok(),
    }
}

/// `tcp` with its slot, unless its peer holds its share (then it is
/// dropped, with its slot).
fn admit(
    slots: &Arc<Slots>,
    tcp: TcpStream,
    peer: std::net::SocketAddr,
    total: OwnedSemaphorePermit,
) -> Option<(TcpStream, std::net::SocketAddr, Slot)> {
    match slots.take(peer.ip(), total) {
        Some(slot) => {
            let _ = tcp.set_nodelay(true);
            Some((tcp, peer, slot))
        }
        None => {
            tracing::debug!(%peer, "connection past the peer's share of server.max_connections: closed");
            None
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

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn ipv6_peers_share_a_cap_per_64_and_mapped_ipv4_is_ipv4() {
        let group = |a: &str| PeerGroup::of(a.parse().expect("an address"));
        assert_eq!(group("2001:db8:1:2::1"), group("2001:db8:1:2:ffff:ffff:ffff:ffff"));
        assert_ne!(group("2001:db8:1:2::1"), group("2001:db8:1:3::1"));
        assert_eq!(group("::ffff:192.0.2.7"), group("192.0.2.7"));
        assert_ne!(group("192.0.2.7"), group("192.0.2.8"));
    }

    #[test]
    fn a_full_listener_evicts_its_oldest_stranger_never_an_authenticated_connection() {
        let slots = Slots::evicting(4, 3);
        let peer: IpAddr = "2001:db8::1".parse().expect("an address");
        let take = || {
            let permit = Arc::clone(&slots.total).try_acquire_owned().expect("a free slot");
            slots.take(peer, permit).expect("within the peer's share")
        };
        let (client, stranger, newer) = (take(), take(), take());
        client.connection().authenticate("alice");
        assert!(slots.evict_a_stranger());
        assert!(stranger.connection().is_evicted(), "the oldest stranger goes");
        assert!(!client.connection().is_evicted() && !newer.connection().is_evicted());
        assert!(slots.evict_a_stranger());
        assert!(newer.connection().is_evicted());
        assert!(!slots.evict_a_stranger(), "an authenticated connection is never evicted");
        drop((stranger, newer));
        assert_eq!(slots.total.available_permits(), 3);
        // Other addresses of the same /64 count against the same share.
        let from = |peer: &str| {
            let permit = Arc::clone(&slots.total).try_acquire_owned().expect("a free slot");
            slots.take(peer.parse().expect("an address"), permit)
        };
        let held = [from("2001:db8::2"), from("2001:db8::3")];
        assert!(held.iter().all(Option::is_some));
        assert!(from("2001:db8::4").is_none(), "past the /64's share");
        assert!(from("2001:db8:0:1::4").is_some(), "another /64 has its own");
        drop(client);
    }

    #[test]
    fn strangers_are_evicted_from_the_peer_holding_most_and_a_principal_protects_only_its_share() {
        let slots = Slots::evicting(8, 3);
        let take = |peer: &str| {
            let permit = Arc::clone(&slots.total).try_acquire_owned().expect("a free slot");
            slots.take(peer.parse().expect("an address"), permit).expect("within the peer's share")
        };
        // A client arrives first, then a churning peer takes two slots.
        let client = take("192.0.2.1");
        let churn = [take("192.0.2.66"), take("192.0.2.66")];
        assert!(slots.evict_a_stranger());
        assert!(churn[0].connection().is_evicted() && !client.connection().is_evicted(), "the churner evicts its own");
        // A peer spreading its connections over the /64s of its /48 is
        // one peer to eviction.
        let spread = [take("2001:db8:7:1::1"), take("2001:db8:7:2::1")];
        let v6_client = take("2001:db8:8::1");
        assert!(slots.evict_a_stranger() && spread[0].connection().is_evicted(), "its /48 holds the most");
        assert!(!client.connection().is_evicted() && !v6_client.connection().is_evicted());
        drop((spread, v6_client));

        // One principal authenticates on three connections: one (its share,
        // an eighth of 8) is protected, the others stay evictable, and are
        // evicted after any connection no credential was presented on.
        let mallory: Vec<Slot> = (0..1).map(|i| take(&format!("198.51.100.{i}"))).collect();
        let extra = take("198.51.100.9");
        for c in mallory.iter().chain([&extra]) {
            c.connection().authenticate("mallory");
        }
        assert!(mallory.iter().all(|c| c.connection().is_authenticated()));
        assert!(!extra.connection().is_authenticated(), "past mallory's share of protected connections");
        let fresh = take("203.0.113.5");
        // The three connections no credential was presented on go first.
        for _ in 0..3 {
            assert!(slots.evict_a_stranger());
            assert!(!extra.connection().is_evicted(), "a used connection before a never-used one");
        }
        assert!([&client, &churn[1], &fresh].iter().all(|c| c.connection().is_evicted()));
        assert!(slots.evict_a_stranger() && extra.connection().is_evicted(), "then those past their share");
        drop(mallory);
        let later = take("198.51.100.10");
        later.connection().authenticate("mallory");
        assert!(later.connection().is_authenticated(), "a closed connection gives its share back");
    }
}
