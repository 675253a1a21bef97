//! Issue 67 §3: peers with no credential cannot hold a listener's slots.
//! Four loopback addresses (127.0.0.2–5), each at its share of a listener
//! of 8 slots, poll health on kept-alive connections, and an
//! authenticated client on 127.0.0.1 is still answered, over gRPC and
//! HTTP: the full listener evicts the oldest connection no call has
//! authenticated on, even one that stopped reading. A stranger's polls do
//! not postpone its connection's idle deadline, and a `Health/Watch` or a
//! reflection stream ends at the connection's maximum age; and the metrics endpoint, once given a token, shows nothing
//! without it. (Deadlines below are liveness bounds, several times the
//! configured ones, not measurements.)

use crate::util::{Process, client, digit, image, predict, request, small_demo};
use pacpriv_service::proto::pacpriv::privatizer_client::PrivatizerClient;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;

const CAP: usize = 8;
const PER_PEER: usize = 2;
const STRANGERS: [&str; 4] = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"];

fn capped(extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("PACPRIV__SERVER__MAX_CONNECTIONS", CAP.to_string()),
        ("PACPRIV__SERVER__MAX_CONNECTIONS_PER_PEER", PER_PEER.to_string()),
    ];
    env.extend_from_slice(extra);
    small_demo(&env)
}

/// A TCP connection from `ip` to `to`.
async fn connect_from(ip: &str, to: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket.bind(SocketAddr::new(ip.parse().expect("an address"), 0)).expect("binds a loopback address");
    socket.connect(to).await.expect("connects")
}

/// A gRPC channel from `ip` to `addr`, connected.
async fn channel_from(ip: &str, addr: &str) -> tonic::transport::Channel {
    let local: IpAddr = ip.parse().expect("an address");
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("a URI")
        .local_address(Some(local))
        .connect()
        .await
        .expect("connects")
}

/// Polls `Health/Check` on `channel` every `every` until `until`; how many
/// checks were answered.
async fn poll_health(channel: tonic::transport::Channel, every: Duration, until: Instant) -> usize {
    let mut health = HealthClient::new(channel);
    let mut answered = 0;
    while Instant::now() < until {
        if health.check(HealthCheckRequest { service: String::new() }).await.is_ok() {
            answered += 1;
        }
        tokio::time::sleep(every).await;
    }
    answered
}

/// Sends `GET /v2/health/live` on `conn` and reads the reply; whether it
/// was answered 200 with the connection kept alive.
async fn live(conn: &mut BufReader<TcpStream>) -> bool {
    if conn.get_mut().write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: pacpriv\r\n\r\n").await.is_err() {
        return false;
    }
    let (mut status, mut length) = (String::new(), 0usize);
    if conn.read_line(&mut status).await.unwrap_or(0) == 0 {
        return false;
    }
    loop {
        let mut line = String::new();
        if conn.read_line(&mut line).await.unwrap_or(0) == 0 {
            return false;
        }
        if line == "\r\n" {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    conn.read_exact(&mut body).await.is_ok() && status.starts_with("HTTP/1.1 200")
}

/// An authenticated OIP inference over HTTP/1.1 from 127.0.0.1; its status
/// line.
async fn infer_over_http(to: SocketAddr) -> String {
    let body = request(&[digit(4)], &["label"]);
    let mut conn = BufReader::new(connect_from("127.0.0.1", to).await);
    let head = format!(
        "POST /v2/models/private/infer HTTP/1.1\r\nHost: pacpriv\r\nx-api-key: alice-key\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    conn.get_mut().write_all(head.as_bytes()).await.expect("request head");
    conn.get_mut().write_all(body.as_bytes()).await.expect("request body");
    let mut status = String::new();
    conn.read_line(&mut status).await.expect("a status line");
    status
}

#[tokio::test(flavor = "multi_thread")]
async fn strangers_polling_health_cannot_keep_a_client_out() {
    let server = Process::serve(None, &capped(&[]));
    let polling = Instant::now() + Duration::from_secs(30);

    // gRPC: every slot held by strangers' channels polling Health/Check.
    let mut pollers = tokio::task::JoinSet::new();
    for ip in STRANGERS {
        for _ in 0..PER_PEER {
            let channel = channel_from(ip, &server.addr).await;
            pollers.spawn(poll_health(channel, Duration::from_secs(1), polling));
        }
    }
    let answered = tokio::time::timeout(Duration::from_secs(10), async {
        let mut c = client(&server.addr).await;
        predict(&mut c, "alice-key", image("past-the-strangers", &digit(3))).await
    })
    .await;
    assert!(matches!(answered, Ok(Ok(_))), "a client behind {CAP} strangers' health polls over gRPC: {answered:?}");

    // HTTP: every slot held by strangers' kept-alive connections polling
    // GET /v2/health/live.
    let http: SocketAddr = server.listener("http").parse().expect("an address");
    let mut strangers = Vec::new();
    for ip in STRANGERS {
        for _ in 0..PER_PEER {
            let mut conn = BufReader::new(connect_from(ip, http).await);
            assert!(live(&mut conn).await, "a stranger's first poll is answered");
            strangers.push(conn);
        }
    }
    let polls = tokio::spawn(async move {
        let mut closed = 0;
        for _ in 0..10 {
            for conn in &mut strangers {
                if !live(conn).await {
                    closed += 1;
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        closed
    });
    let status = tokio::time::timeout(Duration::from_secs(10), infer_over_http(http)).await;
    assert!(
        status.as_ref().is_ok_and(|s| s.starts_with("HTTP/1.1 200")),
        "a client behind {CAP} strangers' health polls over HTTP: {status:?}"
    );
    assert!(polls.await.expect("the polls") > 0, "a stranger's connection was evicted for the client");
    pollers.abort_all();
    assert!(server.logs().contains("evicted"), "{}", server.logs());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_strangers_polls_keep_nothing_open() {
    const IDLE_MS: u64 = 1500;
    let server = Process::serve(
        None,
        &capped(&[
            ("PACPRIV__SERVER__IDLE_TIMEOUT_MS", IDLE_MS.to_string()),
            ("PACPRIV__SERVER__REQUEST_TIMEOUT_MS", IDLE_MS.to_string()),
        ]),
    );
    // Over gRPC, a stranger polling every 200 ms loses its connection to the
    // idle timeout (the channel then reconnects: the log tells).
    let mut health = HealthClient::new(channel_from("127.0.0.2", &server.addr).await);
    let started = Instant::now();
    while !server.logs().contains("no request or stream message") {
        assert!(
            started.elapsed() < Duration::from_millis(10 * IDLE_MS),
            "a stranger's health polls kept its connection open past server.idle_timeout_ms"
        );
        let _ = health.check(HealthCheckRequest { service: String::new() }).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Over HTTP, a kept-alive connection polling liveness is closed once it
    // has had no authenticated request for the idle time.
    let http: SocketAddr = server.listener("http").parse().expect("an address");
    let mut conn = BufReader::new(connect_from("127.0.0.2", http).await);
    let started = Instant::now();
    while live(&mut conn).await {
        assert!(started.elapsed() < Duration::from_millis(10 * IDLE_MS), "HTTP polls kept a stranger's connection");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // An index request whose announced body never comes is answered 408
    // at server.request_timeout_ms.
    let mut conn = BufReader::new(connect_from("127.0.0.2", http).await);
    let ask = "POST /v2/repository/index HTTP/1.1\r\nHost: pacpriv\r\nContent-Length: 100\r\n\r\n";
    conn.get_mut().write_all(ask.as_bytes()).await.expect("sent");
    let mut status = String::new();
    let read = tokio::time::timeout(Duration::from_millis(10 * IDLE_MS), conn.read_line(&mut status)).await;
    assert!(matches!(read, Ok(Ok(_))), "{read:?}");
    assert!(status.starts_with("HTTP/1.1 408"), "{status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_health_watch_ends_at_the_maximum_connection_age() {
    // Idle for longer than the age: only the age can end the watch.
    let server = Process::serve(
        None,
        &capped(&[
            ("PACPRIV__SERVER__IDLE_TIMEOUT_MS", "600000".into()),
            ("PACPRIV__SERVER__MAX_CONNECTION_AGE_MS", "2000".into()),
        ]),
    );
    let channel = channel_from("127.0.0.3", &server.addr).await;
    let mut health = HealthClient::new(channel.clone());
    let mut watch = health.watch(HealthCheckRequest { service: String::new() }).await.expect("watching").into_inner();
    // A reflection stream kept open (its requests never end) on the same
    // connection.
    let (ask, asks) = tokio::sync::mpsc::channel(1);
    ask.send(ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    })
    .await
    .expect("queued");
    let mut reflection = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::wrappers::ReceiverStream::new(asks))
        .await
        .expect("reflecting")
        .into_inner();
    reflection.message().await.expect("a reply").expect("the services");
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Ok(Some(_)) = watch.message().await {}
        while let Ok(Some(_)) = reflection.message().await {}
    })
    .await;
    assert!(ended.is_ok(), "a Health/Watch or a reflection stream outlived server.max_connection_age_ms");
    drop(ask);
}

/// A stranger that stops reading what the server writes (a flood of PINGs,
/// whose acknowledgements it never reads) stops the server reading it too:
/// HTTP/2 flushes before it reads on. Eight such connections fill the
/// listener, their deadlines far off; a client is still answered at once,
/// since an evicted connection fails its next write as well as its next
/// read.
#[tokio::test(flavor = "multi_thread")]
async fn strangers_that_stop_reading_cannot_keep_their_slots() {
    let server = Process::serve(
        None,
        &capped(&[
            ("PACPRIV__SERVER__IDLE_TIMEOUT_MS", "600000".into()),
            ("PACPRIV__SERVER__HEADER_READ_TIMEOUT_MS", "600000".into()),
        ]),
    );
    let to: SocketAddr = server.addr.parse().expect("an address");
    let mut stalled = Vec::new();
    for ip in STRANGERS {
        for _ in 0..PER_PEER {
            stalled.push(stop_reading(ip, to).await);
        }
    }
    let answered = tokio::time::timeout(Duration::from_secs(30), async {
        let mut alice = client(&server.addr).await;
        predict(&mut alice, "alice-key", image("past-the-stalled", &digit(3))).await
    })
    .await;
    assert!(matches!(answered, Ok(Ok(_))), "alice beside strangers that stopped reading: {answered:?}");
    drop(stalled);
}

/// An HTTP/2 connection from `ip` to `to` that sends PINGs without reading
/// their acknowledgements until the server stops reading it (a write waits
/// half a second), then holds it.
async fn stop_reading(ip: &str, to: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket.set_recv_buffer_size(4096).expect("a small receive buffer");
    socket.bind(SocketAddr::new(ip.parse().expect("an address"), 0)).expect("binds a loopback address");
    let mut conn = socket.connect(to).await.expect("connects");
    let mut hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    hello.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // SETTINGS, empty
    conn.write_all(&hello).await.expect("the preface");
    let ping: [u8; 17] = [0, 0, 8, 6, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
    let pings = ping.repeat(1024);
    for _ in 0..4096 {
        match tokio::time::timeout(Duration::from_millis(500), conn.write_all(&pings)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("{ip}: the server closed a connection still within its deadlines: {e}"),
            Err(_) => return conn,
        }
    }
    panic!("{ip}: the server went on reading 70 MB of PINGs whose acknowledgements were never read")
}

/// Issue 67 §5: with `metrics.token_sha256` set, a scrape without the
/// token learns nothing (401, no series); with it, the usual series.
#[tokio::test(flavor = "multi_thread")]
async fn the_metrics_endpoint_wants_its_token_once_one_is_set() {
    let server =
        Process::serve(None, &capped(&[("PACPRIV__METRICS__TOKEN_SHA256", crate::util::key_hash("scrape-token"))]));
    let mut c = client(&server.addr).await;
    predict(&mut c, "alice-key", image("spent", &digit(5))).await.expect("answered");
    let url = format!("http://{}/metrics", server.listener("metrics"));
    for headers in [&[][..], &["Authorization: Bearer not-the-token"][..]] {
        let refused = crate::util::curl("GET", &url, headers, None);
        assert_eq!(refused.code, 401, "{}", refused.body);
        let body = refused.body.to_string();
        assert!(!body.contains("alice") && !body.contains("pacpriv_"), "a refused scrape shows {body}");
    }
    let scraped = crate::util::curl("GET", &url, &["Authorization: Bearer scrape-token"], None);
    assert_eq!(scraped.code, 200);
    assert!(scraped.body.to_string().contains("pacpriv_budget_spent_nats"), "{}", scraped.body);
}

/// Issue 67 §4: on PostgreSQL, a peer sending ever new random keys costs
/// the database at most its bucket of lookups (a burst of 40, then 20 a
/// second), on the unfamiliar keys' own connections, and past it is told
/// `KEY_LOOKUPS_LIMITED`, while a client with a known key goes on being
/// answered — from another address, and from the flooding address too (a
/// key seen naming a principal, or held by an active principal in the
/// store, is still looked up for it).
#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_random_keys_costs_its_peer_a_bounded_number_of_lookups() {
    let pg = crate::util::Postgres::start();
    let server = Process::serve(
        None,
        &capped(&[
            ("PACPRIV__STORE__BACKEND", "postgres".to_owned()),
            ("PACPRIV__STORE__POSTGRES_URL", pg.url.clone()),
            ("PACPRIV__SERVER__MAX_CONNECTIONS", "64".to_owned()),
            ("PACPRIV__PRINCIPALS__BOB__KEY_SHA256", crate::util::key_hash("bob-key")),
            ("PACPRIV__PRINCIPALS__BOB__BUDGET_MI", "1".to_owned()),
        ]),
    );
    let (admin, connection) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls).await.expect("psql");
    tokio::spawn(connection);
    admin.batch_execute("ALTER SYSTEM SET log_statement = 'all'").await.expect("log all");
    admin.batch_execute("SELECT pg_reload_conf()").await.expect("reload");
    let lookups = || pg.log().matches("WHERE key_sha256 = $1").count();
    let mut alice = client(&server.addr).await;
    predict(&mut alice, "alice-key", image("warm-up", &digit(0))).await.expect("answered");
    let flooder = PrivatizerClient::new(channel_from("127.0.0.2", &server.addr).await);
    let mut alice_there = flooder.clone();
    predict(&mut alice_there, "alice-key", image("from-the-flood", &digit(1))).await.expect("answered");
    let (before, started) = (lookups(), Instant::now());

    const FLOOD: usize = 2000;
    // At most half the listener's streams in flight on the one connection:
    // a client at the server's stream limit races h2's accounting of the
    // streams just closed and is sometimes refused `REFUSED_STREAM` by the
    // transport, which is not what this test is about.
    let in_flight = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
    let flood: Vec<_> = (0..FLOOD)
        .map(|i| {
            let (mut c, in_flight) = (flooder.clone(), in_flight.clone());
            tokio::spawn(async move {
                let _slot = in_flight.acquire_owned().await.expect("never closed");
                predict(&mut c, &format!("random-{i}"), image("x", &digit(2))).await
            })
        })
        .collect();
    for n in 0..5 {
        for (c, name) in [(&mut alice, "alice"), (&mut alice_there, "alice on the flood's address")] {
            let answered = tokio::time::timeout(
                Duration::from_secs(30),
                predict(c, "alice-key", image(&format!("{name}-{n}"), &digit(10 + n))),
            )
            .await;
            assert!(matches!(answered, Ok(Ok(_))), "{name} during the flood: {answered:?}");
        }
    }
    let mut limited = 0;
    for call in flood {
        let refused = call.await.expect("joins").expect_err("a random key");
        match refused.code() {
            tonic::Code::Unauthenticated => {}
            tonic::Code::ResourceExhausted => {
                let details = tonic_types::StatusExt::get_error_details(&refused);
                let reason = details.error_info().map(|i| i.reason.clone());
                assert_eq!(reason.as_deref(), Some("KEY_LOOKUPS_LIMITED"), "{refused:?}");
                limited += 1;
            }
            _ => panic!("a random key: {refused:?}"),
        }
    }
    assert!(limited > FLOOD / 2, "{limited} of {FLOOD} random keys were refused for the peer's lookups");
    // Bob's key, which no call has presented to this replica yet, from the
    // flood's own address the moment its bucket is empty: the replica
    // knows it from the store (`Sessions::learn_active_keys`), so it is
    // looked up, not refused.
    let mut c = flooder.clone();
    let mut drained = false;
    for i in 0..200 {
        let refused = predict(&mut c, &format!("drain-{i}"), image("x", &digit(2))).await.expect_err("a random key");
        if refused.code() == tonic::Code::ResourceExhausted {
            drained = true;
            break;
        }
    }
    assert!(drained, "the flood's bucket empties");
    predict(&mut alice_there, "bob-key", image("bob-during", &digit(20))).await.expect("bob's first call, there");
    let seconds = started.elapsed().as_secs() + 1;
    let spent = lookups() - before;
    // The peer's bucket, and alice's and bob's own: eleven calls, each
    // looked up once and again before its charge.
    let bound = 40 + 20 * seconds as usize + 2 * 11 + 2;
    assert!(spent <= bound, "{spent} lookups for {FLOOD} random keys in {seconds} s (bound {bound})");
}
