//! The Open Inference Protocol over HTTP/REST, as `curl` calls it: JSON
//! tensors in and out, the same keys and accounting as gRPC, and every
//! failure an HTTP code with a JSON body carrying the gRPC status's
//! reason. (tritonclient.http, with binary tensors, is in `interop`.)

use crate::util::{B, Process, budget, client, curl, digit, image, key_hash, predict, request, small_demo};
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread")]
async fn curl_gets_private_labels_and_actionable_errors_over_http() {
    let server = Process::serve(
        None,
        &small_demo(&[
            ("PACPRIV__PRINCIPALS__BROKE__KEY_SHA256", key_hash("broke-key")),
            ("PACPRIV__PRINCIPALS__BROKE__BUDGET_MI", "0".into()),
        ]),
    );
    let base = format!("http://{}", server.listener("http"));
    let alice = "x-api-key: alice-key";

    assert_eq!(curl("GET", &format!("{base}/v2/health/live"), &[], None).code, 200);
    assert_eq!(curl("GET", &format!("{base}/v2/health/ready"), &[], None).code, 200);
    let meta = curl("GET", &format!("{base}/v2/models/private"), &[], None);
    assert_eq!((meta.code, &meta.body["inputs"][0]["shape"]), (200, &json!([-1, 64])));
    assert_eq!(curl("GET", &format!("{base}/v2/models/private/ready"), &[], None).code, 200);
    let unknown = curl("GET", &format!("{base}/v2/models/other"), &[], None);
    assert_eq!((unknown.code, &unknown.body["reason"]), (404, &json!("NOT_FOUND")));

    // Two rows in JSON, answered in JSON; the key as a bearer token works too.
    let infer = format!("{base}/v2/models/private/infer");
    let rows = [digit(1), digit(2)];
    let ok =
        curl("POST", &infer, &["Authorization: Bearer alice-key"], Some(&request(&rows, &["label", "mi_charged"])));
    assert_eq!(ok.code, 200, "{}", ok.body);
    assert_eq!(ok.body["id"], "curl-1");
    let labels = ok.body["outputs"][0]["data"].as_array().expect("labels");
    assert!(labels.len() == 2 && labels.iter().all(|l| l.as_u64().is_some_and(|l| l < 10)), "{}", ok.body);
    assert_eq!(ok.body["outputs"][1]["data"], json!([B, B]));
    assert_eq!(ok.body["parameters"]["budget_spent"].as_f64(), Some(2.0 * B));

    // Each failure: its HTTP code, the gRPC reason, nothing charged.
    let one = request(&[digit(3)], &["label"]);
    let cases: [(&[&str], String, u16, &str); 6] = [
        (&[], one.clone(), 401, "UNAUTHENTICATED"),
        (&["x-api-key: not-a-key"], one.clone(), 401, "UNAUTHENTICATED"),
        (&[alice], request(&[digit(3)[..63].to_vec()], &["label"]), 400, "INVALID_INPUT"),
        (&[alice], "{ not json".into(), 400, "INVALID_INPUT"),
        (&[alice], request(&[digit(3)], &["noisy"]), 412, "NOT_RELEASED"),
        (&["x-api-key: broke-key"], one.clone(), 429, "BUDGET_EXHAUSTED"),
    ];
    for (headers, body, code, reason) in cases {
        let r = curl("POST", &infer, headers, Some(&body));
        assert_eq!(
            (r.code, &r.body["reason"], &r.body["charged"]),
            (code, &json!(reason), &json!(false)),
            "{}",
            r.body
        );
        assert!(r.body["error"].as_str().is_some_and(|m| m.len() > 20), "a message a person can act on: {}", r.body);
    }
    // Larger than server.max_message_bytes: refused before it is read.
    let huge = request(&vec![digit(4); 600], &["label"]);
    let r = curl("POST", &infer, &[alice], Some(&huge));
    assert_eq!(r.code, 413);
    assert!(r.body["error"].as_str().is_some_and(|m| m.contains("server.max_message_bytes")), "{}", r.body);

    let mut c = client(&server.addr).await;
    let account = budget(&mut c, "alice-key").await;
    assert_eq!((account.answered, account.spent), (2, 2.0 * B), "only the two answered rows were charged");
}

#[tokio::test(flavor = "multi_thread")]
async fn over_http_teachers_down_is_503_and_the_rate_limit_is_429_with_retry_after() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = dir.path().join("nowhere.toml");
    let remote: Vec<String> =
        (0..4).map(|i| format!("{{ endpoint = \"http://127.0.0.1:9\", model = \"m{i}\" }}")).collect();
    std::fs::write(&cfg, format!("[teachers]\nsource = \"remote\"\nremote = [{}]\n", remote.join(", ")))
        .expect("write");
    let server = Process::serve(
        Some(&cfg),
        &[
            ("PACPRIV__TEACHERS__DEADLINE_MS", "200".to_owned()),
            ("PACPRIV__SERVER__RATE_LIMIT_PER_SECOND", "1".to_owned()),
        ],
    );
    let base = format!("http://{}", server.listener("http"));
    assert_eq!(curl("GET", &format!("{base}/v2/health/ready"), &[], None).code, 503, "no teacher answers");
    let infer = format!("{base}/v2/models/private/infer");
    let body = request(&[digit(1)], &["label"]);
    let down = curl("POST", &infer, &["x-api-key: demo-key"], Some(&body));
    assert_eq!((down.code, &down.body["reason"]), (503, &json!("TEACHERS_UNAVAILABLE")), "{}", down.body);
    let limited = curl("POST", &infer, &["x-api-key: demo-key"], Some(&body));
    assert_eq!((limited.code, &limited.body["reason"]), (429, &json!("RATE_LIMITED")), "{}", limited.body);
    assert!(limited.headers.contains("retry-after: 1"), "{}", limited.headers);
}

/// Issue 40 §2: a client that opens many connections and never finishes
/// them — idle, half a header, or an authenticated body trickled a byte at
/// a time — holds each only until its timeout, and never keeps other
/// clients out: gRPC is not touched, and an HTTP query waits at most for
/// slots to free. A body whose credential names no one is refused unread,
/// however large it says it is.
#[tokio::test(flavor = "multi_thread")]
async fn slow_and_hostile_connections_are_closed_and_other_clients_still_answered() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    let server = Process::serve(
        None,
        &small_demo(&[
            ("PACPRIV__SERVER__MAX_CONNECTIONS", "8".into()),
            ("PACPRIV__SERVER__HEADER_READ_TIMEOUT_MS", "1000".into()),
            ("PACPRIV__SERVER__REQUEST_TIMEOUT_MS", "2000".into()),
        ]),
    );
    let http = server.listener("http");
    let infer = "POST /v2/models/private/infer HTTP/1.1\r\nHost: pacpriv\r\n";

    // An unauthenticated body of 1 GB: the 401 comes back at once, with
    // not one byte of the body sent, and the connection is closed.
    let mut unknown = TcpStream::connect(&http).await.expect("connect");
    let head =
        format!("{infer}x-api-key: not-a-key\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n");
    unknown.write_all(head.as_bytes()).await.expect("headers sent");
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), unknown.read_to_end(&mut reply))
        .await
        .expect("answered and closed without the body")
        .expect("read");
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 401"), "{reply}");
    assert!(reply.contains("UNAUTHENTICATED"), "{reply}");

    // Three times the connection cap of hostile connections.
    let mut hostile = Vec::new();
    for n in 0..24 {
        let mut s = TcpStream::connect(&http).await.expect("connect");
        match n % 3 {
            0 => {} // idle
            1 => s.write_all(format!("{infer}x-api-key: alice").as_bytes()).await.expect("half a header"),
            _ => {
                let head = format!("{infer}x-api-key: alice-key\r\nContent-Length: 1000\r\n\r\n{{");
                s.write_all(head.as_bytes()).await.expect("headers and a byte");
            }
        }
        hostile.push(s);
    }
    // gRPC is answered at once; HTTP once the hostile connections' time is up.
    let mut c = client(&server.addr).await;
    predict(&mut c, "alice-key", image("grpc-meanwhile", &digit(7))).await.expect("gRPC answered");
    let base = format!("http://{http}");
    let started = std::time::Instant::now();
    let ok = tokio::task::spawn_blocking(move || {
        curl(
            "POST",
            &format!("{base}/v2/models/private/infer"),
            &["x-api-key: alice-key"],
            Some(&request(&[digit(8)], &["label"])),
        )
    })
    .await
    .expect("curl");
    assert_eq!(ok.code, 200, "{}", ok.body);
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());

    // Every hostile connection was closed by the server (EOF, perhaps
    // after a 408), while the client was still holding it open and the
    // trickling ones still sending a byte every 200 ms.
    let mut timed_out = 0;
    for (n, mut s) in hostile.into_iter().enumerate() {
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(15), async {
            loop {
                if n % 3 == 2 && s.write_all(b" ").await.is_err() {
                    return;
                }
                match tokio::time::timeout(Duration::from_millis(200), s.read_buf(&mut rest)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => return,
                    _ => {}
                }
            }
        })
        .await;
        if closed.is_err() {
            timed_out += 1;
        }
        let said = String::from_utf8_lossy(&rest);
        // A trickled body times out (408), or its connection, past alice's
        // share of protected connections, is evicted for a newer one while
        // the body is read (the read fails: 400, nothing charged).
        if n % 3 == 2 {
            let evicted = said.starts_with("HTTP/1.1 400");
            assert!(said.is_empty() || said.starts_with("HTTP/1.1 408") || evicted, "connection {n}: {said}");
        }
    }
    assert_eq!(timed_out, 0, "hostile connections the server left open");

    // A client that pipelines requests and never reads the answers: once
    // its window is full the server's writes stall, and after the header
    // timeout the connection is closed (the writes below fail) instead of
    // holding its slot for good.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("small window");
    let mut greedy = socket.connect(http.parse().expect("addr")).await.expect("connect");
    let get = "GET /v2/health/live HTTP/1.1\r\nHost: pacpriv\r\n\r\n".repeat(1000);
    let closed = tokio::time::timeout(Duration::from_secs(30), async {
        for _ in 0..2000 {
            if greedy.write_all(get.as_bytes()).await.is_err() {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(closed, Ok(true), "a client that never reads is disconnected");
    let mut c = client(&server.addr).await;
    assert_eq!(budget(&mut c, "alice-key").await.answered, 2, "only the two real queries were charged");
}
