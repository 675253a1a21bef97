//! A TCP proxy in front of a test's PostgreSQL that sees what pacpriv
//! sends: it counts the statements that read a session row (executions,
//! whether sent as text or as a prepared statement bound again), and the
//! writing transactions' COMMITs with and without a `SET LOCAL
//! synchronous_commit = on` of their own; and, when armed, cuts one
//! connection right after a `COMMIT` has been executed.
//! It runs on a runtime of its own thread: a test's runtime may block
//! while `pacpriv serve` starts, and that start goes through the proxy.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The SQL every read of a session row contains (the preflight's and the
/// step's locked read alike).
const SESSION_READ: &[u8] = b"FROM pacpriv_sessions WHERE session";

/// The proxy; stops when dropped.
pub struct PgProxy {
    /// `url` with the proxy's port in place of PostgreSQL's.
    pub url: String,
    state: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

#[derive(Default)]
struct Shared {
    armed: AtomicBool,
    cuts: AtomicUsize,
    session_reads: AtomicUsize,
    guarded_commits: AtomicUsize,
    unguarded_commits: AtomicUsize,
}

impl PgProxy {
    /// A proxy for the PostgreSQL at `url` (`postgres://…@127.0.0.1:PORT/db`).
    pub fn start(url: &str) -> PgProxy {
        let port = url.rsplit(':').next().and_then(|s| s.split('/').next()).expect("a port in the URL").to_owned();
        let upstream = format!("127.0.0.1:{port}");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("proxy listens");
        listener.set_nonblocking(true).expect("non-blocking");
        let own = listener.local_addr().expect("address").port();
        let state = Arc::new(Shared::default());
        let shared = Arc::clone(&state);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("proxy runtime");
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).expect("tokio listener");
                let accept = async {
                    while let Ok((conn, _)) = listener.accept().await {
                        let Ok(server) = TcpStream::connect(&upstream).await else { continue };
                        tokio::spawn(relay(conn, server, Arc::clone(&shared)));
                    }
                };
                tokio::select! { () = accept => {}, _ = stopped => {} }
            });
        });
        PgProxy { url: url.replace(&format!(":{port}/"), &format!(":{own}/")), state, stop: Some(stop) }
    }

    /// Cut the connection that carries the next COMMIT, once it is done.
    pub fn arm(&self) {
        self.state.armed.store(true, Ordering::SeqCst);
    }

    /// Connections cut so far.
    pub fn cuts(&self) -> usize {
        self.state.cuts.load(Ordering::SeqCst)
    }

    /// Executions so far of statements that read a session row.
    pub fn session_reads(&self) -> usize {
        self.state.session_reads.load(Ordering::SeqCst)
    }

    /// COMMITs so far of transactions that wrote (an INSERT or UPDATE):
    /// with `SET LOCAL synchronous_commit = on` earlier in the same
    /// transaction, and without.
    pub fn writing_commits(&self) -> (usize, usize) {
        (self.state.guarded_commits.load(Ordering::SeqCst), self.state.unguarded_commits.load(Ordering::SeqCst))
    }
}

impl Drop for PgProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// How often `needle` occurs in `haystack`.
fn count(haystack: &[u8], needle: &[u8]) -> usize {
    haystack.windows(needle.len()).filter(|w| *w == needle).count()
}

/// The client's side of the wire protocol, message by message: counts the
/// executions of statements that read a session row — a simple query
/// ('Q') by its text, an extended-protocol execution by the statement its
/// Bind ('B') names, whose text came in a Parse ('P'), perhaps long before
/// — and follows each transaction (`START TRANSACTION` or BEGIN …
/// COMMIT, as simple queries):
/// whether it wrote, and whether it set `synchronous_commit` for itself.
#[derive(Default)]
struct Frontend {
    buffered: Vec<u8>,
    started: bool,
    /// Prepared statement name → (whether it reads a session row, whether
    /// it writes).
    statements: std::collections::HashMap<Vec<u8>, (bool, bool)>,
    /// Whether a transaction is open; in it, whether it wrote, and set
    /// `synchronous_commit` locally.
    in_transaction: bool,
    wrote: bool,
    durable: bool,
}

/// What a feed of bytes completed.
#[derive(Default)]
struct Fed {
    reads: usize,
    guarded: usize,
    unguarded: usize,
}

/// Whether `sql` writes a row.
fn writes(sql: &[u8]) -> bool {
    count(sql, b"INSERT ") + count(sql, b"UPDATE ") > 0
}

impl Frontend {
    /// A statement that `wrote` (or not) was executed: outside a
    /// transaction it committed at once, on the connection's setting.
    fn wrote(&mut self, wrote: bool, fed: &mut Fed) {
        if wrote && !self.in_transaction {
            fed.unguarded += 1;
        }
        self.wrote |= wrote;
    }

    /// Feeds bytes from the client; returns what they completed.
    fn feed(&mut self, bytes: &[u8]) -> Fed {
        self.buffered.extend_from_slice(bytes);
        let mut fed = Fed::default();
        loop {
            // Before the startup message: no type byte (an SSL or GSS
            // request, 8 bytes, comes first and keeps us waiting).
            let header = if self.started { 5 } else { 4 };
            if self.buffered.len() < header {
                return fed;
            }
            let len_at = header - 4;
            let len = u32::from_be_bytes(self.buffered[len_at..header].try_into().expect("4 bytes")) as usize;
            let end = len_at + len;
            if self.buffered.len() < end {
                return fed;
            }
            let message: Vec<u8> = self.buffered.drain(..end).collect();
            if !self.started {
                self.started = len != 8;
                continue;
            }
            let body = &message[5..];
            let mut fields = body.split(|&b| b == 0);
            match message[0] {
                b'Q' if body.starts_with(b"BEGIN") || body.starts_with(b"START TRANSACTION") => {
                    (self.in_transaction, self.wrote, self.durable) = (true, false, false);
                }
                b'Q' if body.starts_with(b"COMMIT") || body.starts_with(b"ROLLBACK") => {
                    if self.wrote && body.starts_with(b"COMMIT") {
                        *(if self.durable { &mut fed.guarded } else { &mut fed.unguarded }) += 1;
                    }
                    (self.in_transaction, self.wrote, self.durable) = (false, false, false);
                }
                b'Q' => {
                    fed.reads += count(body, SESSION_READ);
                    self.wrote(writes(body), &mut fed);
                    self.durable |= count(body, b"SET LOCAL synchronous_commit = on") > 0;
                }
                b'P' => {
                    let name = fields.next().unwrap_or_default().to_vec();
                    let query = fields.next().unwrap_or_default();
                    self.statements.insert(name, (count(query, SESSION_READ) > 0, writes(query)));
                }
                b'B' => {
                    let _portal = fields.next();
                    let name = fields.next().unwrap_or_default();
                    let (reads, wrote) = self.statements.get(name).copied().unwrap_or_default();
                    fed.reads += usize::from(reads);
                    self.wrote(wrote, &mut fed);
                }
                _ => {}
            }
        }
    }
}

/// Relays one connection, counting session reads; after forwarding an
/// armed `COMMIT` (a simple query: 'Q', length, "COMMIT\0"), PostgreSQL's
/// reply that carries its `CommandComplete` ("COMMIT\0") means it has
/// committed — that reply is dropped and both sides closed. (Bytes that
/// arrive before it, such as the end of the previous statement's reply,
/// are relayed: cutting on them could stop the COMMIT from ever running.)
async fn relay(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let pending = Arc::new(AtomicBool::new(false));
    let p = Arc::clone(&pending);
    let s = Arc::clone(&shared);
    let upstream = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut frontend = Frontend::default();
        while let Ok(n) = from_client.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let fed = frontend.feed(&buf[..n]);
            s.session_reads.fetch_add(fed.reads, Ordering::SeqCst);
            s.guarded_commits.fetch_add(fed.guarded, Ordering::SeqCst);
            s.unguarded_commits.fetch_add(fed.unguarded, Ordering::SeqCst);
            // Armed before the COMMIT leaves, so its reply cannot slip
            // through; only that reply is cut (see above).
            if buf[..n].windows(7).any(|w| w == b"COMMIT\0") && s.armed.swap(false, Ordering::SeqCst) {
                p.store(true, Ordering::SeqCst);
            }
            if to_server.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n) = from_server.read(&mut buf).await {
        if n == 0 {
            break;
        }
        if pending.load(Ordering::SeqCst) && buf[..n].windows(7).any(|w| w == b"COMMIT\0") {
            shared.cuts.fetch_add(1, Ordering::SeqCst);
            break;
        }
        if to_client.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    upstream.abort();
}
