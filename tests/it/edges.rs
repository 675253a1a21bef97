//! Issue 53 §3: the gRPC listeners hold against unauthenticated peers.
//! A peer that opens connections past `server.max_connections` and never
//! sends the HTTP/2 preface holds each slot for `server.header_read_timeout_ms`
//! at most, on the client listener and the health-only one alike; a peer
//! that sends the preface and then only PINGs is closed after
//! `server.idle_timeout_ms`. Authenticated clients are answered
//! meanwhile, within those bounds (each call below carries a deadline of
//! several times them, as a liveness bound, not a measurement).

use crate::util::{Process, client, digit, health_becomes, image, predict, small_demo};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use tonic_health::pb::health_check_response::ServingStatus;

const CAP: usize = 8;
const PREFACE_MS: u64 = 1000;
const IDLE_MS: u64 = 2000;
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn limited() -> Vec<(&'static str, String)> {
    small_demo(&[
        ("PACPRIV__SERVER__MAX_CONNECTIONS", CAP.to_string()),
        ("PACPRIV__SERVER__HEADER_READ_TIMEOUT_MS", PREFACE_MS.to_string()),
        ("PACPRIV__SERVER__IDLE_TIMEOUT_MS", IDLE_MS.to_string()),
        ("PACPRIV__SERVER__HEALTH_LISTEN", "127.0.0.1:0".into()),
    ])
}

/// Whether the server closes `conn` within `within`, reading (and
/// discarding) whatever it sends meanwhile.
fn closed_within(conn: &mut TcpStream, within: Duration) -> bool {
    let until = Instant::now() + within;
    conn.set_read_timeout(Some(Duration::from_millis(100))).expect("timeout");
    let mut buf = [0u8; 4096];
    while Instant::now() < until {
        match conn.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread")]
async fn silent_connections_past_the_cap_are_closed_and_clients_still_answered() {
    let server = Process::serve(None, &limited());
    let health = server.listener("health");
    for addr in [server.addr.clone(), health.clone()] {
        // Twice the cap, none sending a byte: the first CAP are accepted
        // and closed after the preface deadline, the rest wait and are
        // then accepted and closed in their turn.
        let mut silent: Vec<TcpStream> =
            (0..2 * CAP).map(|_| TcpStream::connect(&addr).expect("the kernel queues the connection")).collect();
        std::thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        if addr == server.addr {
            let answered = tokio::time::timeout(Duration::from_millis(10 * PREFACE_MS), async {
                let mut c = client(&server.addr).await;
                predict(&mut c, "alice-key", image("behind-the-silent", &digit(3))).await
            })
            .await;
            assert!(
                matches!(answered, Ok(Ok(_))),
                "an authenticated client behind {} silent peers: {answered:?}",
                2 * CAP
            );
        } else {
            assert!(health_becomes(&health, ServingStatus::Serving).await, "the health listener answers");
        }
        for conn in &mut silent {
            let left = Duration::from_millis(10 * PREFACE_MS).saturating_sub(started.elapsed());
            assert!(closed_within(conn, left), "a peer that never sent the preface is closed ({addr})");
        }
    }
    assert!(server.logs().contains("no HTTP/2 preface"), "{}", server.logs());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_that_only_pings_is_closed_once_idle() {
    let server = Process::serve(None, &limited());
    let mut conn = TcpStream::connect(&server.addr).expect("connects");
    conn.write_all(PREFACE).expect("preface");
    // An empty SETTINGS frame, then a PING every 300 ms.
    conn.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).expect("settings");
    let started = Instant::now();
    let mut closed = false;
    while started.elapsed() < Duration::from_millis(10 * IDLE_MS) {
        let ping = [0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        if conn.write_all(&ping).is_err() || closed_within(&mut conn, Duration::from_millis(300)) {
            closed = true;
            break;
        }
    }
    assert!(closed, "a connection with PINGs and no request is closed after server.idle_timeout_ms");
    assert!(started.elapsed() >= Duration::from_millis(IDLE_MS), "not before it");
    assert!(server.logs().contains("no request or stream message"), "{}", server.logs());
}

/// Sends each call (path, `authorization` header) to `addr` over one
/// HTTP/2 connection with a gRPC message prefix declaring `prefix`'s
/// length and no more of the body, and asserts each is answered
/// UNAUTHENTICATED from its headers alone, the connection staying usable.
async fn refused_before_the_body(addr: &str, calls: &[(&str, Option<&str>)], prefix: &'static [u8]) {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connects");
    let (h2, connection) = h2::client::handshake(tcp).await.expect("HTTP/2");
    tokio::spawn(connection);
    let mut h2 = h2.ready().await.expect("ready");
    for &(path, token) in calls {
        let mut request = tonic::codegen::http::Request::post(format!("http://{addr}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if let Some(token) = token {
            request = request.header("authorization", token);
        }
        let (response, mut body) = h2.send_request(request.body(()).expect("request"), false).expect("sent");
        // The server may have answered and closed the stream already.
        let _ = body.send_data(tonic::codegen::Bytes::from_static(prefix), false);
        let response = tokio::time::timeout(Duration::from_millis(10 * PREFACE_MS), response)
            .await
            .unwrap_or_else(|_| panic!("{path}: no answer while the body is withheld"))
            .expect("a response");
        let status = response.headers().get("grpc-status").and_then(|v| v.to_str().ok());
        assert_eq!(status, Some("16"), "{path}: UNAUTHENTICATED from the headers alone: {response:?}");
        h2 = h2.ready().await.expect("the connection stays usable");
    }
}

/// A call that needs a credential and names none is answered
/// UNAUTHENTICATED from its headers, while its client has sent 5 bytes of
/// a body it declares to be 60 000: the body is never waited for.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_without_a_key_is_refused_before_its_body_is_read() {
    let server = Process::serve(None, &limited());
    let calls = [("/pacpriv.v1.Privatizer/Predict", None), ("/inference.GRPCInferenceService/ModelInfer", None)];
    // A gRPC message prefix: uncompressed, 60 000 bytes to come.
    refused_before_the_body(&server.addr, &calls, &[0, 0, 0, 0xEA, 0x60]).await;
}

/// Issue 67 §5: the admin listener refuses a call without the admin token
/// from its headers alone, before a byte of its body is read or decoded —
/// the admin API's and the repository's load alike — and the connection
/// stays usable.
#[tokio::test(flavor = "multi_thread")]
async fn an_admin_call_without_the_token_is_refused_before_its_body_is_read() {
    use crate::util::{ADMIN_TOKEN, key_hash};
    let mut env = limited();
    env.push(("PACPRIV__ADMIN__KEY_SHA256", key_hash(ADMIN_TOKEN)));
    let server = Process::serve(None, &env);
    let calls = [
        ("/pacpriv.v1.Admin/CreatePrincipal", None),
        ("/pacpriv.v1.Admin/ExportNoiseKeys", Some("Bearer wrong")),
        ("/inference.GRPCInferenceService/RepositoryModelLoad", None),
    ];
    // A gRPC message prefix announcing 4 MiB that never come.
    refused_before_the_body(&server.listener("admin"), &calls, &[0, 0, 0x40, 0, 0]).await;
}

/// With PostgreSQL, a burst of calls with unknown keys — 40 keys, each
/// sent 20 times — costs the database about one lookup per key (not one
/// per call: the short negative cache; past the peer's bucket of lookups
/// some are refused `KEY_LOOKUPS_LIMITED` without one), and an
/// authenticated client is answered all along; the server's memory grows by far less than the
/// stated bound (the negative cache holds at most 65 536 digests, ~3 MiB).
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_unknown_keys_is_answered_without_a_lookup_each() {
    let pg = crate::util::Postgres::start();
    let mut env = limited();
    env.push(("PACPRIV__STORE__BACKEND", "postgres".to_owned()));
    env.push(("PACPRIV__STORE__POSTGRES_URL", pg.url.clone()));
    env.push(("PACPRIV__STORE__MAX_CONNECTIONS", "4".to_owned()));
    let server = Process::serve(None, &env);
    let (admin, connection) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls).await.expect("psql");
    tokio::spawn(connection);
    // Every statement is logged from here on: the key lookups are counted
    // in the server's log.
    admin.batch_execute("ALTER SYSTEM SET log_statement = 'all'").await.expect("log all");
    admin.batch_execute("SELECT pg_reload_conf()").await.expect("reload");
    let lookups = || pg.log().matches("WHERE key_sha256 = $1").count();
    let rss = || -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").parse().ok())
            .expect("VmRSS")
    };
    let mut c = client(&server.addr).await;
    predict(&mut c, "alice-key", image("warm-up", &digit(0))).await.expect("answered");
    let (before, rss_before) = (lookups(), rss());

    let burst: Vec<_> = (0..40 * 20)
        .map(|i| {
            let mut c = c.clone();
            tokio::spawn(async move { predict(&mut c, &format!("unknown-{}", i % 40), image("x", &digit(1))).await })
        })
        .collect();
    for n in 0..10 {
        let answered = tokio::time::timeout(
            Duration::from_secs(30),
            predict(&mut c, "alice-key", image(&format!("during-{n}"), &digit(n))),
        )
        .await;
        assert!(matches!(answered, Ok(Ok(_))), "alice during the burst: {answered:?}");
    }
    for call in burst {
        let refused = call.await.expect("joins").expect_err("an unknown key");
        let codes = [tonic::Code::Unauthenticated, tonic::Code::ResourceExhausted];
        assert!(codes.contains(&refused.code()), "{refused:?}");
    }
    let spent = lookups() - before;
    assert!(spent < 400, "{spent} principal lookups for 800 calls with 40 unknown keys (and alice's 10)");
    let grown = rss().saturating_sub(rss_before);
    assert!(grown < 64 * 1024, "the server's memory grew by {grown} kB during the burst");
}

/// `pacpriv serve` with its own environment on free loopback ports, run
/// under `prlimit --nofile=SOFT:HARD`.
fn under_descriptor_limit(soft: u64, hard: u64, state: &std::path::Path) -> std::process::Command {
    let mut cmd = std::process::Command::new("prlimit");
    cmd.args([&format!("--nofile={soft}:{hard}"), env!("CARGO_BIN_EXE_pacpriv"), "serve"]);
    for (k, v) in small_demo(&[]) {
        cmd.env(k, v);
    }
    for key in ["PACPRIV__SERVER__LISTEN", "PACPRIV__METRICS__LISTEN", "PACPRIV__SERVER__HTTP_LISTEN"] {
        cmd.env(key, "127.0.0.1:0");
    }
    cmd.env("PACPRIV__STORE__PATH", state.join("state.redb")).env("OPENBLAS_NUM_THREADS", "1");
    cmd
}

/// Start-up provides the file descriptors the configuration may hold
/// (`server.max_connections` per listener and a few more): a soft limit
/// below it is raised, a hard limit below it refuses to start, naming the
/// setting.
#[tokio::test(flavor = "multi_thread")]
async fn start_up_provides_the_file_descriptors_the_caps_need() {
    let dir = tempfile::tempdir().expect("temp dir");
    let refused = under_descriptor_limit(300, 300, dir.path()).output().expect("prlimit (util-linux) runs");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "started with too few descriptors: {said}");
    assert!(said.contains("file descriptors") && said.contains("server.max_connections"), "{said}");

    let mut child = under_descriptor_limit(300, 20_000, dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starts");
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    while !line.starts_with("pacpriv listening on") {
        line.clear();
        assert!(std::io::BufRead::read_line(&mut lines, &mut line).expect("reads") > 0, "exited before listening");
    }
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).expect("limits");
    let _ = child.kill();
    let _ = child.wait();
    let soft: u64 = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("Max open files");
    // Three listeners of 1024 connections, the teachers and 256 more.
    assert!((3 * 1024..20_000).contains(&soft), "the soft limit was raised to the need: {soft}");
}

/// Issue 53 §4: one peer's slow-but-valid connections cannot shut other
/// peers out of an HTTP listener. Past `server.max_connections_per_peer`
/// its connections are closed as soon as they are accepted, so a second
/// peer (another loopback address) is answered while the first holds all
/// it may; and a kept-alive connection older than
/// `server.max_connection_age_ms` is closed after its request.
#[tokio::test(flavor = "multi_thread")]
async fn one_peer_cannot_take_every_http_slot() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Process::serve(
        None,
        &small_demo(&[
            ("PACPRIV__SERVER__MAX_CONNECTIONS", CAP.to_string()),
            ("PACPRIV__SERVER__MAX_CONNECTIONS_PER_PEER", "2".into()),
            ("PACPRIV__SERVER__HEADER_READ_TIMEOUT_MS", "60000".into()),
            ("PACPRIV__SERVER__MAX_CONNECTION_AGE_MS", "1500".into()),
        ]),
    );
    let metrics: std::net::SocketAddr = server.listener("metrics").parse().expect("address");
    // The first peer opens every slot's worth and sends nothing yet (as a
    // slow client would); all but its share are closed at once.
    let mut first: Vec<TcpStream> = (0..CAP).map(|_| TcpStream::connect(metrics).expect("connects")).collect();
    let closed = first.iter_mut().map(|c| closed_within(c, Duration::from_millis(500))).filter(|&gone| gone).count();
    assert_eq!(closed, CAP - 2, "the first peer keeps its share of {CAP} slots, 2");

    let from_second_peer = || async {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind("127.0.0.2:0".parse().expect("address")).expect("binds 127.0.0.2");
        socket.connect(metrics).await.expect("connects")
    };
    let mut second = tokio::time::timeout(Duration::from_secs(10), from_second_peer()).await.expect("accepted");
    second.write_all(b"GET /metrics HTTP/1.1\r\nHost: pacpriv\r\n\r\n").await.expect("request");
    let mut head = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(10), second.read_exact(&mut head))
        .await
        .expect("the second peer is answered while the first holds its share")
        .expect("reads");
    assert_eq!(&head, b"HTTP/1.1 200");

    // Kept alive, the second peer's connection is closed once it is older
    // than the maximum age (the header-read deadline is a minute).
    let mut rest = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), second.read_to_end(&mut rest)).await;
    assert!(matches!(ended, Ok(Ok(_))), "closed after server.max_connection_age_ms: {ended:?}");
}

/// A peer that asks and asks but reads nothing: once the server's writes
/// to it stall (its receive window and the socket buffers full), the
/// connection is closed after `server.idle_timeout_ms`, not held for
/// ever — unread responses free no slot, and HTTP/2's own keep-alive
/// PING cannot be sent through a stalled socket either. The peer
/// authenticates first (a `GetBudget` with alice's key), so that its
/// requests keep the connection open and only the stall can close it.
#[tokio::test(flavor = "multi_thread")]
async fn a_peer_that_reads_nothing_is_closed_once_writes_to_it_stall() {
    let server = Process::serve(None, &limited());
    let client_listener: std::net::SocketAddr = server.addr.parse().expect("an address");
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let conn = socket.connect(client_listener).await.expect("connects").into_std().expect("a std stream");
    conn.set_nonblocking(false).expect("blocking");
    let (port, ours) = (client_listener.port(), conn.local_addr().expect("bound").port());
    let accepted = Instant::now() + Duration::from_secs(10);
    while !holds(server.pid(), port, ours) {
        assert!(Instant::now() < accepted, "the server never held the connection");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut writer = conn.try_clone().expect("a second handle");
    // Health checks, as fast as the server takes them, never reading a
    // reply; the window is opened wide so nothing but the socket stalls.
    let asking = std::thread::spawn(move || {
        writer.set_write_timeout(Some(Duration::from_secs(1))).expect("timeout");
        let mut start = PREFACE.to_vec();
        start.extend(frame(0x4, 0, 0, &[0, 4, 0x7f, 0xff, 0xff, 0xff])); // SETTINGS_INITIAL_WINDOW_SIZE
        start.extend(frame(0x8, 0, 0, &(0x7fff_ffff_u32 - 65_535).to_be_bytes())); // WINDOW_UPDATE
        let budget = call_headers("/pacpriv.v1.Privatizer/GetBudget", &[("x-api-key", "alice-key")]);
        start.extend(frame(0x1, 0x4, 1, &budget));
        start.extend(frame(0x0, 0x1, 1, &[0; 5]));
        if writer.write_all(&start).is_err() {
            return (0, true);
        }
        // Until a write blocks for its timeout (or fails): not a fixed
        // count, since the server's receive buffer may grow to tens of MB
        // (tcp_rmem) before its writes stall when it reads fast at first.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut asked = 0;
        for stream in (3..i32::MAX as u32).step_by(2) {
            let mut request = frame(0x1, 0x4, stream, &health_check_headers());
            request.extend(frame(0x0, 0x1, stream, &[0; 5]));
            if writer.write_all(&request).is_err() {
                return (asked, true);
            }
            asked += 1;
            if Instant::now() > deadline {
                break;
            }
        }
        (asked, false)
    });
    let (asked, stalled) =
        tokio::task::spawn_blocking(move || asking.join().expect("the asking thread")).await.expect("joined");
    // The server stopped reading once its writes stalled (the last write
    // above failed or timed out); it must let go of the connection within
    // the idle bound, with room to spare. Reading would unstall it, so the
    // server's own socket table is asked instead.
    let until = Instant::now() + Duration::from_millis(3 * IDLE_MS) + Duration::from_secs(10);
    assert!(stalled, "{asked} requests in 60 s were all taken: the server's writes never stalled");
    while holds(server.pid(), port, ours) {
        assert!(Instant::now() < until, "a connection whose peer read nothing ({asked} requests sent) is still held");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Closed for its stalled writes, not for another reason (a protocol
    // error, too many resets, the read side's idle deadline).
    assert!(server.logs().contains("the peer read nothing written to it"), "{}", server.logs());
    drop(conn);
}

/// Whether process `pid` holds the TCP socket of its port `local` whose
/// peer is the loopback port `peer` (`/proc/net/tcp`'s inode among its
/// descriptors; a socket it closed is orphaned, inode 0).
fn holds(pid: u32, local: u16, peer: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let port = |address: &str| address.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
    let Some(inode) = table.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        (cols.len() > 9 && port(cols[1]) == Some(local) && port(cols[2]) == Some(peer)).then(|| cols[9].to_owned())
    }) else {
        return false;
    };
    let socket = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the server's descriptors")
        .filter_map(Result::ok)
        .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target.to_string_lossy() == socket))
}

/// An HTTP/2 frame: its 9-byte header, then `payload`.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("a small frame").to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend(stream.to_be_bytes());
    f.extend(payload);
    f
}

/// A `grpc.health.v1.Health/Check` request's header block, as HPACK
/// literals without indexing (no table, no Huffman).
fn health_check_headers() -> Vec<u8> {
    call_headers("/grpc.health.v1.Health/Check", &[])
}

/// A gRPC call's header block for `path` with `more` headers, as HPACK
/// literals without indexing (no table, no Huffman).
fn call_headers(path: &str, more: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    let common = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", "pacpriv"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ];
    for &(name, value) in common.iter().chain(more) {
        block.push(0);
        for text in [name, value] {
            block.push(u8::try_from(text.len()).expect("short"));
            block.extend(text.as_bytes());
        }
    }
    block
}
