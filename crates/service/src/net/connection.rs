//! What a listener knows of one of its connections while it lives
//! ([`Connection`]), and how a request reaches it ([`Info`], [`of`]):
//! whether a call on it has authenticated, when one last did, and the
//! signal that evicts it.
//!
//! # Invariants
//! - A connection is *authenticated* (protected from eviction) once a
//!   call on it presented a credential that named an active principal (or
//!   the admin token, or the metrics token), while that principal holds
//!   fewer than an eighth of its listener's `server.max_connections` and
//!   all principals together fewer than three quarters ([`Protected`]): a
//!   few keys cannot make every slot unevictable.
//!   Nothing else marks it: health checks, the repository index, metadata
//!   and refused calls leave it a stranger's.
//! - Only an authentication moves [`Connection::touched`]: a stranger's
//!   calls never postpone its idle deadline (`net::guard`, `net::http`).
//! - Eviction is a one-way signal ([`Connection::evict`]); the connection's
//!   reads fail from then on and its slot is given back when it closes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// One accepted connection's state, shared by its slot, its I/O and the
/// requests on it.
#[derive(Debug)]
pub struct Connection {
    /// The peer's address, as its listener's per-peer cap groups it.
    peer: std::net::IpAddr,
    accepted: Instant,
    authenticated: AtomicBool,
    /// Whose authenticated connection it is, once it is one.
    principal: std::sync::OnceLock<Arc<str>>,
    protected: Arc<Protected>,
    /// Whether a call on it authenticated, protected or not.
    used: AtomicBool,
    /// Whether its slot was given back.
    closed: AtomicBool,
    /// Milliseconds from `accepted` to the last authentication.
    touched_ms: AtomicU64,
    evicted: CancellationToken,
}

impl Connection {
    /// A connection from `peer` accepted now, not authenticated, on a
    /// listener whose authenticated connections `protected` counts.
    pub fn new(peer: std::net::IpAddr, protected: Arc<Protected>) -> Arc<Self> {
        Arc::new(Connection {
            peer,
            accepted: Instant::now(),
            authenticated: AtomicBool::new(false),
            principal: std::sync::OnceLock::new(),
            protected,
            used: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            touched_ms: AtomicU64::new(0),
            evicted: CancellationToken::new(),
        })
    }

    /// Its peer: an IPv4 address, or an IPv6 /64's first address
    /// (`net::guard::PeerGroup`).
    pub fn peer(&self) -> std::net::IpAddr {
        self.peer
    }

    /// When it was accepted.
    pub fn accepted(&self) -> Instant {
        self.accepted
    }

    /// A call on it authenticated now as `principal`: its idle clock
    /// starts again, and it is authenticated from now on unless
    /// `principal` holds its share of the listener's authenticated
    /// connections already.
    pub fn authenticate(&self, principal: &str) {
        let ms = u64::try_from(self.accepted.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.touched_ms.fetch_max(ms, Ordering::Relaxed);
        if self.is_authenticated() {
            return;
        }
        self.used.store(true, Ordering::Relaxed);
        let mut held = self.protected.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Closed already (a lookup that finished after the connection
        // went), or the listener's protected connections at their cap.
        if self.closed.load(Ordering::Relaxed) || held.total >= self.protected.total {
            return;
        }
        let name: Arc<str> = principal.into();
        let count = held.per_principal.get(&name).copied().unwrap_or(0);
        if count >= self.protected.per_principal || self.principal.set(Arc::clone(&name)).is_err() {
            return;
        }
        held.per_principal.insert(name, count + 1);
        held.total += 1;
        self.authenticated.store(true, Ordering::Relaxed);
    }

    /// Whether any call on it has authenticated, protected or not.
    pub fn was_used(&self) -> bool {
        self.used.load(Ordering::Relaxed)
    }

    /// Gives back its principal's share (it closed); it is never
    /// protected again.
    pub(super) fn release(&self) {
        let mut held = self.protected.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.closed.store(true, Ordering::Relaxed);
        let Some(principal) = self.principal.get() else { return };
        if let Some(count) = held.per_principal.get_mut(principal) {
            *count -= 1;
            if *count == 0 {
                held.per_principal.remove(principal);
            }
            held.total -= 1;
        }
    }

    /// Whether it is authenticated: protected from eviction, a call on it
    /// having authenticated within its principal's share.
    pub fn is_authenticated(&self) -> bool {
        self.authenticated.load(Ordering::Relaxed)
    }

    /// When a call on it last authenticated (when it was accepted, if none
    /// has).
    pub fn touched(&self) -> Instant {
        self.accepted + Duration::from_millis(self.touched_ms.load(Ordering::Relaxed))
    }

    /// When it is idle: `idle` after [`Self::touched`].
    pub fn idle_at(&self, idle: Duration) -> Instant {
        self.touched() + idle
    }

    /// Completes once `idle` has passed since the last authentication
    /// (however many there are meanwhile).
    pub async fn idled(&self, idle: Duration) {
        loop {
            let at = self.idle_at(idle);
            if at <= Instant::now() {
                return;
            }
            tokio::time::sleep_until(at).await;
        }
    }

    /// Closes it to free its slot for another (the listener is full).
    pub fn evict(&self) {
        self.evicted.cancel();
    }

    /// Completes once it is evicted.
    pub fn evicted(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.evicted.clone().cancelled_owned()
    }

    /// Whether it is evicted.
    pub fn is_evicted(&self) -> bool {
        self.evicted.is_cancelled()
    }
}

/// A listener's authenticated (protected) connections per principal, how
/// many one principal may hold, and how many all may hold together.
#[derive(Debug)]
pub struct Protected {
    per_principal: usize,
    total: usize,
    held: std::sync::Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    per_principal: std::collections::HashMap<Arc<str>, usize>,
    total: usize,
}

impl Protected {
    /// Of a listener of `max` connections, at most an eighth per
    /// principal, and three quarters in all: the last quarter always
    /// turns over, so a new client can get in whoever holds the rest.
    pub fn new(max: usize) -> Arc<Self> {
        let per_principal = (max / 8).max(1);
        let total = (max - max / 4).max(1);
        Arc::new(Protected { per_principal, total, held: std::sync::Mutex::default() })
    }
}

/// tonic's connect info for a guarded connection: the transport's own
/// (`inner`) and the [`Connection`].
#[derive(Clone, Debug)]
pub struct Info<T> {
    /// The transport's connect info (addresses; the TLS peer's
    /// certificates).
    pub inner: T,
    /// The connection's state.
    pub connection: Arc<Connection>,
}

type Tcp = tonic::transport::server::TcpConnectInfo;
type Tls = tonic::transport::server::TlsConnectInfo<Tcp>;

/// The connection a request arrived on, from its extensions (tonic's
/// connect info, or the extension the HTTP server inserts); none for a
/// request that did not come through a guarded listener.
pub fn of(extensions: &axum::http::Extensions) -> Option<&Arc<Connection>> {
    if let Some(info) = extensions.get::<Info<Tcp>>() {
        return Some(&info.connection);
    }
    if let Some(info) = extensions.get::<Info<Tls>>() {
        return Some(&info.connection);
    }
    extensions.get::<Arc<Connection>>()
}

/// Marks the connection a request arrived on authenticated as
/// `principal` ([`Connection::authenticate`]).
pub fn authenticated(extensions: &axum::http::Extensions, principal: &str) {
    if let Some(connection) = of(extensions) {
        connection.authenticate(principal);
    }
}

/// The verified client certificates of the TLS connection a request
/// arrived on.
pub fn peer_certs(extensions: &axum::http::Extensions) -> Option<Arc<Vec<tonic::transport::CertificateDer<'static>>>> {
    extensions.get::<Info<Tls>>().and_then(|info| info.inner.peer_certs())
}
