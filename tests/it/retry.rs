//! Issue 21 §5: a charge always ends in an answer, and retries are safe.
//!
//! PostgreSQL is reached through a proxy that, when armed, lets the next
//! `COMMIT` through, waits until PostgreSQL has answered it — the step is
//! durable, its charge stands — and then cuts the connection instead of
//! relaying the answer. pacpriv cannot tell whether its step committed:
//! it withholds the answer with `UNAVAILABLE`, ErrorInfo
//! `STORE_UNAVAILABLE`, `charged = "true"`. A real grpcio client with a
//! retry policy (service config) then retries by itself and must receive
//! the answer the charge paid for, charged once.

use crate::util::{Postgres, Process, budget, client, digit, image, interop_python, predict, small_demo};
use pacpriv::proto::pacpriv::PredictResponse;
use pacpriv::session::cache::{AnswerCache, Lookup, QueryDigest};
use pacpriv::store::PgStore;
use prost::Message;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::Code;
use tonic_types::StatusExt;

/// A TCP proxy in front of PostgreSQL that can cut one connection right
/// after a COMMIT has been executed.
/// It runs on a runtime of its own thread: the test's runtime blocks while
/// `pacpriv serve` starts, and that start goes through the proxy.
struct CommitCutter {
    port: u16,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl CommitCutter {
    fn start(upstream: String) -> CommitCutter {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("proxy listens");
        listener.set_nonblocking(true).expect("non-blocking");
        let port = listener.local_addr().expect("address").port();
        let (armed, cuts) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let (a, c) = (Arc::clone(&armed), Arc::clone(&cuts));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("proxy runtime");
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).expect("tokio listener");
                let accept = async {
                    while let Ok((conn, _)) = listener.accept().await {
                        let Ok(server) = TcpStream::connect(&upstream).await else { continue };
                        tokio::spawn(relay(conn, server, Arc::clone(&a), Arc::clone(&c)));
                    }
                };
                tokio::select! { () = accept => {}, _ = stopped => {} }
            });
        });
        CommitCutter { port, armed, cuts, stop: Some(stop) }
    }

    /// Cut the connection that carries the next COMMIT, once it is done.
    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}

impl Drop for CommitCutter {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Relays one connection; after forwarding an armed `COMMIT` (a simple
/// query: 'Q', length, "COMMIT\0"), PostgreSQL's first reply bytes mean it
/// has committed — they are dropped and both sides closed.
async fn relay(client: TcpStream, server: TcpStream, armed: Arc<AtomicBool>, cuts: Arc<AtomicUsize>) {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    let pending = Arc::new(AtomicBool::new(false));
    let p = Arc::clone(&pending);
    let upstream = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from_client.read(&mut buf).await {
            if n == 0 {
                break;
            }
            if buf[..n].windows(7).any(|w| w == b"COMMIT\0") && armed.swap(false, Ordering::SeqCst) {
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
        if pending.load(Ordering::SeqCst) {
            cuts.fetch_add(1, Ordering::SeqCst);
            break;
        }
        if to_client.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    upstream.abort();
}

fn key_of(pixels: &[f32]) -> QueryDigest {
    QueryDigest::of(&pixels.iter().map(|&x| f64::from(x)).collect::<Vec<_>>())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_withheld_answer_is_retried_to_the_same_answer_with_one_charge() {
    let pg = Postgres::start();
    let port = pg.url.rsplit(':').next().and_then(|s| s.split('/').next()).expect("a port").to_owned();
    let cutter = CommitCutter::start(format!("127.0.0.1:{port}"));
    let url = pg.url.replace(&format!(":{port}/"), &format!(":{}/", cutter.port));
    let env = small_demo(&[
        ("PACPRIV__STORE__BACKEND", "postgres".to_owned()),
        ("PACPRIV__STORE__POSTGRES_URL", url),
        ("PACPRIV__PRIVACY__POLICY", "paper".to_owned()),
    ]);
    let server = Process::serve(None, &env);
    let mut c = client(&server.addr).await;
    predict(&mut c, "alice-key", image("warm-up", &digit(0))).await.expect("answered");

    // A client without retries sees the withheld answer as UNAVAILABLE,
    // STORE_UNAVAILABLE, charged = "true" ...
    cutter.arm();
    let first = predict(&mut c, "alice-key", image("q1", &digit(1))).await.expect_err("the commit was cut");
    assert_eq!(cutter.cuts(), 1);
    assert_eq!(first.code(), Code::Unavailable, "{first:?}");
    let info = first.get_error_details().error_info().cloned().expect("ErrorInfo");
    assert_eq!((info.reason.as_str(), info.domain.as_str()), ("STORE_UNAVAILABLE", "pacpriv"));
    assert_eq!(info.metadata.get("charged").map(String::as_str), Some("true"), "{info:?}");
    assert!(first.message().contains("retry the same query"), "{}", first.message());
    assert_eq!(budget(&mut c, "alice-key").await.charged, 2, "the cut step committed: its charge stands");
    // ... and asking again gets the answer that charge paid for, free.
    let again = predict(&mut c, "alice-key", image("q1", &digit(1))).await.expect("answered on retry");
    assert!(again.cached && again.mi_charged == 0.0, "{again:?}");
    assert_eq!(budget(&mut c, "alice-key").await.charged, 2);

    // A real grpcio client with a retry policy does the same by itself.
    cutter.arm();
    let request = hex_of(image("q2", &digit(2)));
    let out = std::process::Command::new(interop_python())
        .args([concat!(env!("CARGO_MANIFEST_DIR"), "/tests/retry_client.py"), &server.addr, "alice-key", &request])
        .output()
        .expect("python runs");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("retry_client.py: {e}\n{}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(cutter.cuts(), 2, "the grpcio client's first attempt was cut after its COMMIT");
    assert_eq!(doc["ok"], true, "{doc}");
    let hex = doc["response"].as_str().expect("response bytes");
    let bytes: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex")).collect();
    let answer = PredictResponse::decode(bytes.as_slice()).expect("a PredictResponse");
    assert!(answer.cached && answer.mi_charged == 0.0, "the retry received the stored answer: {answer:?}");
    let account = budget(&mut c, "alice-key").await;
    assert_eq!((account.charged, account.answered), (3, 3), "one charge per query, none for the retries");

    // The answer received is the one recorded with the charge.
    let store = PgStore::connect(&pg.url, 1).await.expect("connects");
    let record = store.load("alice").await.expect("load").expect("alice's session");
    assert_eq!(record.version, 3, "three steps: warm-up, q1, q2");
    let cache = record.cache.as_ref().and_then(AnswerCache::from_record).expect("alice's answer cache");
    match cache.lookup(&key_of(&digit(2)).into()) {
        Lookup::Hit(kept) => assert_eq!(kept.label, answer.label as usize),
        other => panic!("q2's answer is not kept with the session: {other:?}"),
    }
}

/// `request` serialized as hex, for the Python client (which sends the key
/// as metadata itself).
fn hex_of(request: pacpriv::proto::pacpriv::PredictRequest) -> String {
    request.encode_to_vec().iter().map(|b| format!("{b:02x}")).collect()
}
