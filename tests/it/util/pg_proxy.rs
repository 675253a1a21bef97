//! A TCP proxy in front of a test's PostgreSQL that sees what pacpriv
//! sends: it counts the statements that read a session row, and, when
//! armed, cuts one connection right after a `COMMIT` has been executed.
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

    /// Statements sent so far that read a session row.
    pub fn session_reads(&self) -> usize {
        self.state.session_reads.load(Ordering::SeqCst)
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
        // The last bytes of the previous read, so a statement split across
        // two reads is still counted once.
        let mut seen: Vec<u8> = Vec::new();
        while let Ok(n) = from_client.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let before = count(&seen, SESSION_READ);
            seen.extend_from_slice(&buf[..n]);
            s.session_reads.fetch_add(count(&seen, SESSION_READ) - before, Ordering::SeqCst);
            seen.drain(..seen.len().saturating_sub(SESSION_READ.len() - 1));
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
