//! Concurrency limits through a real Envoy running `examples/envoy/concurrency/envoy.yaml`: a
//! request takes a slot of its tenant's limit (3) when it starts, and gives it back with
//! Envoy's `is_negative_hits` when its stream is done, gated on tollgate's dynamic metadata
//! so a refused request gives nothing back. The stand-in backend holds each request 5 s.
//!
//! Held: at most 3 admitted while 3 are in flight, under a burst and while refused requests
//! keep arriving (each refused one's stream ends at once: were its refund sent, it would free a
//! slot it never took); every slot back once the requests end, and once clients hang up
//! mid-stream. On the memory store and on a real Redis (the Lua give-back, with the over-limit
//! cache on).

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::envoy::TestEnvoy;
use common::redis::{TestRedis, unique_prefix};
use common::{InProcess, get_with, get_with_timeout, metric_sum};

const EXAMPLE: &str = "examples/envoy/concurrency/envoy.yaml";

fn rules() -> String {
    std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/envoy/concurrency/rules.yaml"),
    )
    .expect("read examples/envoy/concurrency/rules.yaml")
}

fn envoy(tollgate: &InProcess) -> TestEnvoy {
    TestEnvoy::start_example(
        EXAMPLE,
        tollgate.grpc,
        &[
            // Longer requests: the checks below must all run while the first ones are in flight.
            ("fixed_delay: 1.5s", "fixed_delay: 5s"),
            // A call Envoy gives up on admits without a slot (fail open, the example's
            // choice); a loaded test machine must not turn that into a flaky count.
            ("timeout: 0.02s", "timeout: 1s"),
        ],
    )
}

/// Sends `n` requests for `tenant` at once; their statuses arrive on the channel as they end.
fn burst(front: SocketAddr, tenant: &str, n: usize) -> mpsc::Receiver<u16> {
    let (tx, rx) = mpsc::channel();
    let start = std::sync::Arc::new(std::sync::Barrier::new(n));
    for _ in 0..n {
        let (tx, start, tenant) = (tx.clone(), start.clone(), tenant.to_string());
        std::thread::spawn(move || {
            start.wait();
            // Well past the backend's 5 s: an admitted request is answered after it.
            let status = get_with_timeout(
                front,
                "/work",
                &[("x-tenant", &tenant)],
                Duration::from_secs(30),
            )
            .map_or(0, |r| r.status);
            let _ = tx.send(status);
        });
    }
    rx
}

/// The statuses of `n` requests from `rx`, waiting at most `within` for all of them.
fn collect(rx: &mpsc::Receiver<u16>, n: usize, within: Duration) -> Vec<u16> {
    let deadline = Instant::now() + within;
    let mut out = Vec::new();
    while out.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(s) => out.push(s),
            Err(_) => break,
        }
    }
    out.sort_unstable();
    out
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

/// The scenario, against one tollgate (whatever its store).
fn holds_three_in_flight(tollgate: &InProcess) {
    let envoy = envoy(tollgate);
    let refunds = || {
        metric_sum(
            tollgate.admin,
            "tollgate_decisions_total",
            &[r#"outcome="refund""#],
        )
    };

    // 1. A burst of 8: 3 are admitted and held by the backend, 5 are refused at once.
    let started = Instant::now();
    let rx = burst(envoy.front, "acme", 8);
    let refused = collect(&rx, 5, Duration::from_secs(2));
    assert_eq!(refused, [429; 5], "{}", envoy.log());

    // 2. While the 3 are in flight, refused requests keep coming, one after another: each one's
    //    stream ends at once, and a refund from it would free a slot for the next.
    for i in 0..6 {
        let r = get_with(envoy.front, "/work", &[("x-tenant", "acme")]).expect("envoy answered");
        assert_eq!(r.status, 429, "request {i} while 3 are in flight: {r:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        started.elapsed() < Duration::from_millis(4_500),
        "the checks ran past the first requests' 5 s; the machine is too slow for this test"
    );
    let admitted = collect(&rx, 3, Duration::from_secs(15));
    assert_eq!(admitted, [200; 3], "{}", envoy.log());
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "held by the backend"
    );

    // 3. Their streams are done: the 3 slots are back (and only those: nothing was minted).
    let back = std::time::Instant::now();
    while refunds() < 3.0 && back.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        refunds(),
        3.0,
        "one refund per admitted request, none for the 11 refused"
    );
    let rx = burst(envoy.front, "acme", 6);
    let statuses = collect(&rx, 6, Duration::from_secs(15));
    assert_eq!(
        (count(&statuses, 200), count(&statuses, 429)),
        (3, 3),
        "{statuses:?}"
    );

    // 4. Clients that hang up mid-stream give their slots back too: Envoy sends the refund
    //    when it destroys the stream.
    let wait_refunds = |n: f64| {
        let since = Instant::now();
        while refunds() < n && since.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(refunds(), n, "{}", envoy.log());
    };
    wait_refunds(6.0);
    let decided = || metric_sum(tollgate.admin, "tollgate_requests_total", &[]);
    let before = decided();
    let hung_up: Vec<TcpStream> = (0..3)
        .map(|_| {
            let mut s = TcpStream::connect(envoy.front).expect("connect");
            s.write_all(b"GET /work HTTP/1.1\r\nHost: localhost\r\nx-tenant: globex\r\n\r\n")
                .expect("send");
            s
        })
        .collect();
    // Admitted and at the backend.
    let since = Instant::now();
    while decided() < before + 3.0 && since.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(decided(), before + 3.0, "{}", envoy.log());
    let r = get_with(envoy.front, "/work", &[("x-tenant", "globex")]).expect("envoy answered");
    assert_eq!(
        r.status, 429,
        "the 3 hung-up requests hold the slots: {r:?}"
    );
    drop(hung_up);
    wait_refunds(9.0);
    let rx = burst(envoy.front, "globex", 5);
    let statuses = collect(&rx, 5, Duration::from_secs(15));
    assert_eq!(
        (count(&statuses, 200), count(&statuses, 429)),
        (3, 2),
        "{statuses:?}"
    );
}

#[test]
fn a_concurrency_limit_holds_three_in_flight_on_the_memory_store() {
    let tollgate = InProcess::start(&rules(), |s| s.response_dynamic_metadata = true);
    holds_three_in_flight(&tollgate);
}

#[test]
fn a_concurrency_limit_holds_three_in_flight_on_redis() {
    let redis = TestRedis::start();
    let (url, prefix) = (redis.url(), unique_prefix("concurrency"));
    let tollgate = InProcess::start(&rules(), move |s| {
        s.response_dynamic_metadata = true;
        s.store = url;
        s.key_prefix = prefix;
    });
    holds_three_in_flight(&tollgate);
}
