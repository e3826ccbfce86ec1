//! Hostile gRPC peers against the real binary at its default settings (loopback, bounded):
//!
//! - **Unfinished messages**: 16 connections × 100 streams, each a 64 KiB message sent one
//!   byte short, so tonic would buffer every one of them (100 MiB) waiting for the last byte.
//!   The request-bytes budget (`max_request_bytes_in_flight`, 16 MiB) fails the streams past
//!   it with RESOURCE_EXHAUSTED (counted); the server's RSS grows by less than 64 MiB; a
//!   legitimate request and `/healthz` are answered meanwhile.
//! - **A peer that stops reading** (its connection no longer polled: no frame read, no PING
//!   answered) is disconnected by the HTTP/2 keepalive (1 s + 1 s here), not kept for ever.
//! - **Peers that send requests and never read** (raw frames, past the stream cap) have each
//!   connection closed after 1,024 refused streams: RSS stays bounded while they reconnect,
//!   and legitimate requests and `/healthz` keep answering (p99 under 100 ms on the release
//!   binary, which `make bench` runs this on; 250 ms on the suite's debug binary).
//! - **Time limits**: a request's headers sent a byte at a time are ended by the keepalive, a
//!   body that never finishes by `grpc_request_timeout_ms`.
//! - **A WINDOW_UPDATE flood** leaves legitimate requests a p99 under 100 ms.
//! - **Connections**: past `grpc_max_connections` (or `admin_max_connections`) a new one is
//!   closed at once, counted, while `/healthz` answers; a preface (or an admin request's
//!   headers) sent a byte at a time is closed at the handshake (header) timeout; the server
//!   raises its soft open-files limit to the hard one.
//! - **Codes**: undecodable protobuf and non-UTF-8 strings are INVALID_ARGUMENT; a `/json`
//!   body past `max_message_bytes` is 413.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{TestServer, get, metric_sum, poll_async, request};
use tokio::net::TcpStream;

const RULES: &str = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n";

/// The attacks that load the CPU (and the tests that time legitimate requests during them)
/// take turns: run side by side, each would time the other's attack too.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The largest message the default `max_message_bytes` (64 KiB) lets through.
const MESSAGE: usize = 64 << 10;

fn should_rate_limit(addr: SocketAddr) -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://{addr}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

/// One HTTP/2 connection with `streams` requests, each a gRPC frame that announces a
/// `MESSAGE`-byte message and sends all of it but the last byte. The connection is driven in
/// the background and stays open while the returned handle lives.
async fn unfinished_messages(addr: SocketAddr, streams: usize) -> Vec<h2::SendStream<Bytes>> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = client;
    let mut held = Vec::new();
    let mut frame = vec![0u8; 5 + MESSAGE - 1];
    frame[1..5].copy_from_slice(&(MESSAGE as u32).to_be_bytes());
    let frame = Bytes::from(frame);
    for _ in 0..streams {
        client = client.ready().await.expect("a stream slot");
        let (_response, mut stream) = client
            .send_request(should_rate_limit(addr), false)
            .expect("send headers");
        stream.send_data(frame.clone(), false).expect("send data");
        held.push(stream);
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_messages_are_bounded_by_the_request_bytes_budget() {
    let _turn = HEAVY.lock().await;
    let server = TestServer::builder(RULES).start();
    let mut client = server.client().await;
    client
        .should_rate_limit(request("edge", &[&[("tenant", "warm")]]))
        .await
        .expect("warm-up");
    let before = common::rss_kb(server.pid());
    let mut held = Vec::new();
    for _ in 0..16 {
        held.push(unfinished_messages(server.grpc, 100).await);
    }
    // The server has read what it will: the refusals stop growing and RSS settles.
    let refused = || {
        metric_sum(
            server.admin,
            "tollgate_refused_total",
            &["what=\"request_bytes\""],
        )
    };
    let mut last = (-1.0, 0);
    let settled = poll_async(Duration::from_secs(20), || {
        let now = (refused(), common::rss_kb(server.pid()));
        let stable = now.0 > 0.0 && now.0 == last.0 && now.1.abs_diff(last.1) < 1024;
        last = now;
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            stable.then_some(())
        }
    })
    .await;
    let (refused_streams, after) = (refused(), common::rss_kb(server.pid()));
    let grown_mib = after.saturating_sub(before) as f64 / 1024.0;
    println!(
        "1,600 unfinished 64 KiB messages (100 MiB): {refused_streams} streams refused, RSS {} → {} MiB (+{grown_mib:.1} MiB)",
        before / 1024,
        after / 1024
    );
    assert!(settled.is_some(), "never settled:\n{}", server.log());
    // 16 MiB of budget is 256 messages: most of the 1,600 are refused.
    assert!(refused_streams >= 1_000.0, "{refused_streams} refused");
    // What the budget holds costs about twice its size in RSS (tonic reserves each message
    // whole, the allocator rounds up), plus ~20 MiB for 1,600 streams on 16 connections
    // (measured: +54 to +60 MiB; without the budget, +160 MiB and still growing with the
    // number of streams).
    assert!(grown_mib < 96.0, "RSS grew {grown_mib:.1} MiB");

    // Legitimate traffic is still answered while the attack holds its streams: its messages
    // arrive whole in one frame, so the full budget does not refuse them.
    let mut took = Vec::new();
    for i in 0..40 {
        let started = Instant::now();
        let tenant = format!("t{i}");
        client
            .should_rate_limit(request("edge", &[&[("tenant", tenant.as_str())]]))
            .await
            .expect("a legitimate request during the attack");
        took.push(started.elapsed());
    }
    took.sort();
    let (p95, slowest) = (took[37], took[39]);
    println!("legitimate requests during the attack: p95 {p95:?}, slowest {slowest:?}");
    assert!(p95 < Duration::from_millis(100), "p95 {p95:?}");
    assert!(slowest < Duration::from_secs(1), "slowest {slowest:?}");
    assert_eq!(get(server.admin, "/healthz").0, 200);
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_reading_is_disconnected_by_the_keepalive() {
    let server = TestServer::builder(RULES)
        .arg("grpc-keepalive-interval-ms", "1000")
        .arg("grpc-keepalive-timeout-ms", "1000")
        .start();
    let tcp = TcpStream::connect(server.grpc).await.expect("connect");
    let (client, mut connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    // Drive the connection until the requests are out, then stop reading it (keep it open).
    let (freeze, frozen) = tokio::sync::oneshot::channel::<()>();
    let parked = Arc::new(tokio::sync::Mutex::new(None));
    let park = parked.clone();
    let driver = tokio::spawn(async move {
        tokio::select! {
            _ = &mut connection => {}
            _ = frozen => { *park.lock().await = Some(connection); }
        }
    });
    let mut client = client.ready().await.expect("ready");
    // An empty message (a 5-byte gRPC frame of length 0).
    let body = vec![0u8; 5];
    let (_response, mut stream) = client
        .send_request(should_rate_limit(server.grpc), false)
        .expect("send");
    stream
        .send_data(Bytes::from(body), true)
        .expect("an empty message");
    tokio::time::sleep(Duration::from_millis(200)).await;
    freeze.send(()).unwrap();
    driver.await.unwrap();
    // Not read for longer than the keepalive interval + timeout.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut connection = parked.lock().await.take().expect("parked");
    // Read again: the server has closed the connection (GOAWAY / EOF), so the driver ends.
    let closed = tokio::time::timeout(Duration::from_secs(2), &mut connection).await;
    assert!(
        closed.is_ok(),
        "the server kept a peer that stopped answering PINGs:\n{}",
        server.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_whose_body_never_finishes_is_ended_at_the_request_timeout() {
    let server = TestServer::builder(RULES)
        .arg("grpc-request-timeout-ms", "1000")
        .start();
    let tcp = TcpStream::connect(server.grpc).await.expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = client.ready().await.expect("ready");
    // A gRPC frame that announces 100 bytes and sends 10 (well within the bytes budget), held
    // open: the PINGs are answered, so only the deadline can end it.
    let mut partial = vec![0u8];
    partial.extend_from_slice(&100u32.to_be_bytes());
    partial.extend_from_slice(&[0u8; 10]);
    let started = Instant::now();
    let (response, mut stream) = client
        .send_request(should_rate_limit(server.grpc), false)
        .expect("send");
    stream
        .send_data(Bytes::from(partial), false)
        .expect("part of a message");
    let response = tokio::time::timeout(Duration::from_secs(5), response)
        .await
        .expect("no answer within 5 s")
        .expect("an answer");
    let took = started.elapsed();
    let status = response
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap_or_default().to_string());
    // CANCELLED (1), sent as a trailers-only answer, about a second after the headers.
    assert_eq!(status.as_deref(), Some("1"), "{response:?}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "ended after {took:?}"
    );
    drop(stream);
}

/// The `grpc-status` of a ShouldRateLimit whose message is `payload` (headers of a
/// trailers-only answer, else the trailers).
async fn grpc_status_of(addr: SocketAddr, payload: &[u8]) -> String {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut client = client.ready().await.expect("ready");
    let mut message = vec![0u8];
    message.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    message.extend_from_slice(payload);
    let (response, mut stream) = client
        .send_request(should_rate_limit(addr), false)
        .expect("send");
    stream
        .send_data(Bytes::from(message), true)
        .expect("send data");
    let response = response.await.expect("an answer");
    let status = |h: &http::HeaderMap| {
        h.get("grpc-status")
            .map(|v| v.to_str().unwrap_or_default().to_string())
    };
    if let Some(s) = status(response.headers()) {
        return s;
    }
    let mut body = response.into_body();
    while body.data().await.is_some() {}
    let trailers = body.trailers().await.expect("trailers").unwrap_or_default();
    status(&trailers).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_requests_are_invalid_argument() {
    let server = TestServer::builder(RULES).start();
    // Not protobuf at all (a field with wire type 7).
    assert_eq!(
        grpc_status_of(server.grpc, &[0xff, 0xff, 0xff, 0xff]).await,
        "3"
    );
    // `domain` (field 1, a string) that is not UTF-8.
    assert_eq!(
        grpc_status_of(server.grpc, &[0x0a, 2, 0xff, 0xfe]).await,
        "3"
    );
    // A request that decodes but is wrong keeps its own INVALID_ARGUMENT; a valid one is OK.
    assert_eq!(
        grpc_status_of(server.grpc, &[0x0a, 4, b'e', b'd', b'g', b'e']).await,
        "3"
    );
    let valid = prost::Message::encode_to_vec(&request("edge", &[&[("tenant", "a")]]));
    assert_eq!(grpc_status_of(server.grpc, &valid).await, "0");
    // A descriptor flood: a whole 64 KiB message of empty descriptors (2 bytes each: 32,000
    // of them, past max_descriptors). The message cap bounds what decoding it costs (at the
    // old 1 MiB default: 524,280 descriptors, +47 MB and 100 ms each).
    let mut flood = vec![0x0a, 4, b'e', b'd', b'g', b'e'];
    while flood.len() + 2 <= MESSAGE {
        flood.extend_from_slice(&[0x12, 0]);
    }
    let started = Instant::now();
    assert_eq!(grpc_status_of(server.grpc, &flood).await, "3");
    println!(
        "a 64 KiB descriptor flood refused in {:?}",
        started.elapsed()
    );
}

/// Whether the server closes `tcp` within `within` (EOF or reset on read).
async fn closed_within(tcp: &mut TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // The server's SETTINGS and the like: keep reading.
            Ok(Ok(_)) => {}
        }
    }
}

/// Sends `bytes` to `addr` one at a time, `gap` apart, and then waits a second more; how long
/// until the server closed the connection, or `None` if it never did.
async fn trickle(addr: SocketAddr, bytes: &[u8], gap: Duration) -> Option<Duration> {
    use tokio::io::AsyncWriteExt;
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    let started = Instant::now();
    for &byte in bytes {
        if tcp.write_all(&[byte]).await.is_err() {
            return Some(started.elapsed());
        }
        tokio::time::sleep(gap).await;
    }
    closed_within(&mut tcp, Duration::from_secs(1))
        .await
        .then(|| started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_connections_a_connection_is_closed_at_once_and_healthz_answers() {
    let server = TestServer::builder(RULES)
        .arg("grpc-max-connections", "8")
        .start();
    // Eight HTTP/2 connections, idle but alive.
    let mut held = Vec::new();
    for _ in 0..8 {
        let tcp = TcpStream::connect(server.grpc).await.expect("connect");
        let (client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
        held.push((client, tokio::spawn(connection)));
    }
    let mut ninth = TcpStream::connect(server.grpc)
        .await
        .expect("the kernel accepts");
    assert!(
        closed_within(&mut ninth, Duration::from_secs(2)).await,
        "a ninth connection was kept"
    );
    assert_eq!(get(server.admin, "/healthz").0, 200);
    let refused = metric_sum(
        server.admin,
        "tollgate_refused_total",
        &["what=\"connections\""],
    );
    assert!(refused >= 1.0, "refusal not counted: {refused}");
    // Closing them makes room: a client is served again.
    for (_, driver) in held {
        driver.abort();
    }
    let answered = poll_async(Duration::from_secs(10), || async {
        let mut client = common::client_of(server.grpc).await;
        client
            .should_rate_limit(request("edge", &[&[("tenant", "after")]]))
            .await
            .ok()
    })
    .await;
    assert!(answered.is_some(), "no room after the connections closed");
}

/// The soft limit on open files of `pid`, from /proc.
fn open_files_soft_limit(pid: u32) -> Option<u64> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[test]
fn the_server_raises_its_open_files_limit_to_the_hard_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let ours = getrlimit(Resource::Nofile);
    let Some(hard) = ours.maximum.filter(|&h| h > 1_024) else {
        return; // no room below the hard limit to start the server with
    };
    // The server inherits a soft limit of 1,024 (as a container often does) under our hard one.
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(1_024),
            maximum: Some(hard),
        },
    )
    .expect("lower our soft limit");
    let server = TestServer::builder(RULES).start();
    setrlimit(Resource::Nofile, ours).expect("restore our soft limit");
    assert_eq!(
        open_files_soft_limit(server.pid()),
        Some(hard),
        "{}",
        server.log()
    );
    assert!(
        server.log().contains("raised the open-files limit"),
        "{}",
        server.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_sends_its_preface_a_byte_at_a_time_is_closed() {
    let server = TestServer::builder(RULES)
        .arg("grpc-handshake-timeout-ms", "1000")
        .start();
    // 20 of its 24 bytes over 4 s, never the whole preface (so no protocol error ends it).
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let closed = trickle(server.grpc, &preface[..20], Duration::from_millis(200)).await;
    assert!(
        closed.is_some_and(|t| t < Duration::from_secs(3)),
        "a byte-at-a-time preface was kept: {closed:?}"
    );
    // A normal client is not affected.
    let mut client = common::client_of(server.grpc).await;
    client
        .should_rate_limit(request("edge", &[&[("tenant", "normal")]]))
        .await
        .expect("a normal client");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_headers_sent_a_byte_at_a_time_are_closed_by_the_keepalive() {
    use tokio::io::AsyncWriteExt;
    let server = TestServer::builder(RULES)
        .arg("grpc-keepalive-interval-ms", "1000")
        .arg("grpc-keepalive-timeout-ms", "1000")
        .start();
    // A whole handshake, then a request's HEADERS frame a byte at a time: the peer cannot
    // answer a PING in the middle of a frame (nor between HEADERS and its CONTINUATION), so
    // the keepalive ends it even though the peer is not silent.
    let mut tcp = TcpStream::connect(server.grpc).await.expect("connect");
    tcp.write_all(&raw::preface()).await.expect("preface");
    let message = prost::Message::encode_to_vec(&request("edge", &[&[("tenant", "slow")]]));
    let headers = raw::request(1, &message);
    let started = Instant::now();
    let mut closed = None;
    for &byte in &headers[..headers.len() - 1] {
        if tcp.write_all(&[byte]).await.is_err()
            || closed_within(&mut tcp, Duration::from_millis(200)).await
        {
            closed = Some(started.elapsed());
            break;
        }
    }
    assert!(
        closed.is_some_and(|t| t < Duration::from_secs(4)),
        "request headers sent a byte at a time were kept: {closed:?} of {} bytes sent over {:?}",
        headers.len(),
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_headers_sent_a_byte_at_a_time_are_closed_at_the_header_timeout() {
    let server = TestServer::builder(RULES)
        .arg("admin-header-timeout-ms", "1000")
        .start();
    // 50 bytes of headers over 5 s, never their end.
    let head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaa";
    let closed = trickle(server.admin, head, Duration::from_millis(100)).await;
    assert!(
        closed.is_some_and(|t| t < Duration::from_secs(3)),
        "headers sent a byte at a time were kept: {closed:?}"
    );
    assert_eq!(get(server.admin, "/healthz").0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_admin_max_connections_a_connection_is_closed_and_json_bodies_are_capped() {
    let server = TestServer::builder(RULES)
        .arg("admin-max-connections", "4")
        .start();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Four connections the server has taken: each answered one request and is kept alive (a
    // connection only connected may still wait in the kernel's queue on a busy machine, and
    // the fifth would then be taken before it).
    // A connection the harness's readiness probe closed may still hold its slot for a moment
    // on a loaded machine (its task has not ended yet): a connection closed then is tried
    // again, a few times.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut tries = 0;
        let tcp = loop {
            tries += 1;
            let mut tcp = TcpStream::connect(server.admin).await.expect("connect");
            tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .expect("request");
            let mut answer = [0u8; 12];
            match tokio::time::timeout(Duration::from_secs(10), tcp.read_exact(&mut answer))
                .await
                .expect("answered within 10 s")
            {
                Ok(_) => {
                    assert_eq!(&answer, b"HTTP/1.1 200");
                    break tcp;
                }
                Err(e) if tries < 10 => {
                    eprintln!("connection {} closed ({e}); again", held.len() + 1);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("read: {e}"),
            }
        };
        held.push(tcp);
    }
    let mut fifth = TcpStream::connect(server.admin)
        .await
        .expect("the kernel accepts");
    assert!(
        closed_within(&mut fifth, Duration::from_secs(5)).await,
        "a fifth admin connection was kept"
    );
    drop(held);
    let healthy = poll_async(Duration::from_secs(5), || async {
        (get(server.admin, "/healthz").0 == 200).then_some(())
    })
    .await;
    assert!(healthy.is_some(), "no room after the connections closed");
    let refused = metric_sum(
        server.admin,
        "tollgate_refused_total",
        &["what=\"admin_connections\""],
    );
    assert!(refused >= 1.0, "not counted: {refused}");
    // A /json body past max_message_bytes (64 KiB) is refused unread.
    let big = format!(
        r#"{{"domain":"edge","descriptors":[],"pad":"{}"}}"#,
        "x".repeat(70_000)
    );
    let (status, _) = common::http(server.admin, "POST", "/json", &big).unwrap();
    assert_eq!(status, 413);
}

/// Raw HTTP/2 frames, for peers that break the rules a client library keeps (it would read
/// the server's frames, respect its stream limit, answer its PINGs).
mod raw {
    /// One frame: 9-byte header, then `payload`.
    pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// The client preface, an empty SETTINGS and the ACK of the server's SETTINGS (sent
    /// blind: this peer never reads).
    pub fn preface() -> Vec<u8> {
        let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        out.extend(frame(0x4, 0, 0, &[]));
        out.extend(frame(0x4, 0x1, 0, &[]));
        out
    }

    /// A HEADERS block (HPACK literals, no Huffman, no dynamic table) of a ShouldRateLimit.
    fn headers_block() -> Vec<u8> {
        let mut block = vec![0x83, 0x86]; // :method POST, :scheme http (static table)
        let mut literal = |name: &[u8], value: &[u8]| {
            block.push(0x00);
            block.push(name.len() as u8);
            block.extend_from_slice(name);
            block.push(value.len() as u8);
            block.extend_from_slice(value);
        };
        literal(
            b":path",
            b"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        );
        literal(b":authority", b"tollgate");
        literal(b"content-type", b"application/grpc");
        literal(b"te", b"trailers");
        block
    }

    /// Stream `stream`'s whole request: HEADERS, then DATA with the gRPC frame of `message`
    /// and END_STREAM.
    pub fn request(stream: u32, message: &[u8]) -> Vec<u8> {
        let mut out = frame(0x1, 0x4, stream, &headers_block());
        let mut body = vec![0u8];
        body.extend_from_slice(&(message.len() as u32).to_be_bytes());
        body.extend_from_slice(message);
        out.extend(frame(0x0, 0x1, stream, &body));
        out
    }
}

/// The attacker's own machine: a runtime of its own (one thread), so the attack competes with
/// the legitimate client below only for the CPU, as a peer on another host would for the
/// network, and not for the test runtime's two workers, where it would delay the legitimate
/// client's own sends and reads and be timed as the server's latency. Dropped with
/// `shutdown_background` (a runtime may not be dropped inside another).
fn attacker_machine() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("attacker")
        .enable_all()
        .build()
        .expect("attacker runtime")
}

/// Legitimate requests (a fresh tenant each) and `/healthz` while an attack runs, 20 ms
/// apart: the p99 of each (the slower of the two p99s, and the slowest of all, returned).
async fn legitimate_latency(server: &TestServer, count: usize) -> (Duration, Duration) {
    let mut client = server.client().await;
    let (mut grpc, mut health) = (Vec::new(), Vec::new());
    for i in 0..count {
        let started = Instant::now();
        let tenant = format!("legit{i}");
        client
            .should_rate_limit(request("edge", &[&[("tenant", tenant.as_str())]]))
            .await
            .expect("a legitimate request during the attack");
        grpc.push(started.elapsed());
        let admin = server.admin;
        let started = Instant::now();
        let healthy = tokio::task::spawn_blocking(move || get(admin, "/healthz").0)
            .await
            .unwrap();
        assert_eq!(healthy, 200);
        health.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    grpc.sort();
    health.sort();
    let p99 = |took: &[Duration]| took[count * 99 / 100 - 1];
    (
        p99(&grpc).max(p99(&health)),
        grpc[count - 1].max(health[count - 1]),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_that_send_requests_and_never_read_are_bounded() {
    let _turn = HEAVY.lock().await;
    use tokio::io::AsyncWriteExt;
    let server = TestServer::builder(RULES).start();
    let mut client = server.client().await;
    client
        .should_rate_limit(request("edge", &[&[("tenant", "warm")]]))
        .await
        .expect("warm-up");
    let before = common::rss_kb(server.pid());
    let message = prost::Message::encode_to_vec(&request("edge", &[&[("tenant", "flood")]]));
    // 16 peers, each writing requests as fast as the server reads them and reading nothing
    // back; when the server closes its connection, it opens another and goes on, for as long
    // as the legitimate client below is measured.
    let flooding = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let machine = attacker_machine();
    let mut attackers = Vec::new();
    for _ in 0..16 {
        let addr = server.grpc;
        let message = message.clone();
        let flooding = flooding.clone();
        attackers.push(machine.spawn(async move {
            let (mut connections, mut sent) = (0usize, 0usize);
            while flooding.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok(mut tcp) = TcpStream::connect(addr).await else {
                    continue;
                };
                connections += 1;
                if tcp.write_all(&raw::preface()).await.is_err() {
                    continue;
                }
                let mut stream = 1u32;
                while flooding.load(std::sync::atomic::Ordering::Relaxed) {
                    let mut batch = Vec::new();
                    for _ in 0..64 {
                        batch.extend(raw::request(stream, &message));
                        stream += 2;
                    }
                    // A write the server does not take within 2 s: it stopped reading.
                    match tokio::time::timeout(Duration::from_secs(2), tcp.write_all(&batch)).await
                    {
                        Ok(Ok(())) => sent += 64,
                        Ok(Err(_)) | Err(_) => break,
                    }
                }
            }
            (connections, sent)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (cpu_before, started) = (common::cpu_time(server.pid()), Instant::now());
    let (p99, slowest) = legitimate_latency(&server, 100).await;
    let cpu = (common::cpu_time(server.pid()) - cpu_before).as_secs_f64() * 100.0
        / started.elapsed().as_secs_f64();
    let during = common::rss_kb(server.pid());
    flooding.store(false, std::sync::atomic::Ordering::Relaxed);
    let (mut connections, mut sent) = (0, 0);
    for attacker in attackers {
        let (c, n) = attacker.await.unwrap();
        connections += c;
        sent += n;
    }
    machine.shutdown_background();
    let grown_mib = during.saturating_sub(before) as f64 / 1024.0;
    println!(
        "16 non-reading peers sent {sent} requests on {connections} connections, server CPU {cpu:.0} %: RSS {} → {} MiB (+{grown_mib:.1} MiB); legitimate p99 {p99:?}, slowest {slowest:?}",
        before / 1024,
        during / 1024
    );
    // Each connection is closed (GOAWAY) after 1,024 refused streams; without that, 16 such
    // peers that kept their connections grew the server by 118 MiB in 6 s, and kept growing.
    assert!(connections > 16, "no connection was closed");
    assert!(grown_mib < 64.0, "RSS grew {grown_mib:.1} MiB");
    // Legitimate requests and /healthz keep answering meanwhile. The goal is a p99 under
    // 100 ms for what ships; `make bench` holds the release binary to it (measured there: under
    // 10 ms). This debug binary (its dependencies optimized, its own code not) measured p99
    // 60–86 ms with the server at ~115 % CPU. (When the attack ran on the legitimate client's
    // own runtime, this timed that runtime's queue: p99 0.5 s here, 85 ms even on the release
    // binary.) The suite holds it to `attack_p99_bound`.
    let bound = attack_p99_bound();
    assert!(p99 < bound, "p99 {p99:?}, bound {bound:?}");
}

/// What the suite holds a legitimate p99 under attack to: `TOLLGATE_ATTACK_P99_MS` (`make bench`
/// sets the goal, 100 ms, for the release binary), else 1 s. A starved server answers in
/// seconds or never; the speed goal is the bench's, because here a debug build shares two cores
/// with the attackers, the client, other test binaries and whatever else the machine runs
/// (beside a busy loop per core at nice 10, `make test-soak`, the window-update flood's p99 was
/// 367 ms).
fn attack_p99_bound() -> Duration {
    std::env::var("TOLLGATE_ATTACK_P99_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(Duration::from_secs(1), Duration::from_millis)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_update_flood_does_not_starve_legitimate_requests() {
    let _turn = HEAVY.lock().await;
    use tokio::io::AsyncWriteExt;
    let server = TestServer::builder(RULES).start();
    let cpu_before = common::cpu_time(server.pid());
    let flooding = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let machine = attacker_machine();
    let mut attackers = Vec::new();
    for _ in 0..2 {
        let addr = server.grpc;
        let flooding = flooding.clone();
        attackers.push(machine.spawn(async move {
            let mut tcp = TcpStream::connect(addr).await.expect("connect");
            tcp.write_all(&raw::preface()).await.expect("preface");
            // Connection-level WINDOW_UPDATEs of 1 byte: 2^31 of them before the window
            // overflows, so the flood is legal for as long as it lasts.
            let update = raw::frame(0x8, 0, 0, &1u32.to_be_bytes());
            let batch: Vec<u8> = update
                .iter()
                .copied()
                .cycle()
                .take(update.len() * 4096)
                .collect();
            let mut frames = 0u64;
            while flooding.load(std::sync::atomic::Ordering::Relaxed) {
                if tcp.write_all(&batch).await.is_err() {
                    break;
                }
                frames += 4096;
            }
            frames
        }));
    }
    let started = Instant::now();
    let (p99, slowest) = legitimate_latency(&server, 100).await;
    let spent = common::cpu_time(server.pid()) - cpu_before;
    let elapsed = started.elapsed();
    flooding.store(false, std::sync::atomic::Ordering::Relaxed);
    let mut frames = 0;
    for attacker in attackers {
        frames += attacker.await.unwrap();
    }
    machine.shutdown_background();
    println!(
        "WINDOW_UPDATE flood on 2 connections: {frames} frames in {elapsed:?}, server CPU {:.0} %; legitimate p99 {p99:?}, slowest {slowest:?}",
        spent.as_secs_f64() * 100.0 / elapsed.as_secs_f64()
    );
    let bound = attack_p99_bound();
    assert!(p99 < bound, "p99 {p99:?}, bound {bound:?}");
}
