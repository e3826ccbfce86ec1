//! A tollgate replica SIGKILLed under load and started again, with real processes: three
//! replicas leasing from one redis-server, every replica hammered by its own clients. The
//! other two never notice (no error, no fallback decision, no slow answer); the new process
//! answers from the shared bucket at once; and what the killed one held (its lease: tokens
//! taken from the bucket and never spent) is all the fleet loses.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::load::fallback_decisions;
use common::redis::{TestRedis, unique_prefix};
use common::{TestServer, get, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

/// 100 per hour (no refill to speak of within the test); leases of at most 10.
const RULES: &str = "domain: kill\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";
const LIMIT: u64 = 100;
const MAX_BATCH: u64 = 10;

fn replica(redis: &TestRedis, prefix: &str) -> TestServer {
    TestServer::builder(RULES)
        .arg("store", &redis.url())
        .arg("key-prefix", prefix)
        .arg("store-timeout-ms", "500")
        .arg("lease-max-batch", &MAX_BATCH.to_string())
        .arg("lease-ttl-ms", "1000")
        .start()
}

/// What one replica's clients saw.
#[derive(Default)]
struct Seen {
    admitted: AtomicU64,
    refused: AtomicU64,
    errors: AtomicU64,
    latencies_us: std::sync::Mutex<Vec<u64>>,
}

impl Seen {
    /// (p99, slowest) latency in ms.
    fn latency_ms(&self) -> (f64, f64) {
        let mut l = self.latencies_us.lock().unwrap().clone();
        l.sort_unstable();
        let at = |i: usize| l.get(i).map_or(0.0, |&us| us as f64 / 1000.0);
        (
            at((l.len() * 99 / 100).min(l.len().saturating_sub(1))),
            at(l.len().saturating_sub(1)),
        )
    }
}

/// Four clients sending one request at a time to `addr` until `stop`.
fn hammer(
    addr: SocketAddr,
    seen: Arc<Seen>,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..4)
        .map(|_| {
            let (seen, stop) = (seen.clone(), stop.clone());
            tokio::spawn(async move {
                let mut client = common::client_of(addr).await;
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let r = client
                        .should_rate_limit(request("kill", &[&[("tenant", "hot")]]))
                        .await;
                    seen.latencies_us
                        .lock()
                        .unwrap()
                        .push(started.elapsed().as_micros() as u64);
                    match r {
                        Ok(r) if r.get_ref().overall_code == Code::Ok as i32 => &seen.admitted,
                        Ok(_) => &seen.refused,
                        Err(_) => {
                            seen.errors.fetch_add(1, Ordering::Relaxed);
                            // A killed server: stop rather than spin on a dead connection.
                            return;
                        }
                    }
                    .fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_under_load_costs_the_others_nothing_and_the_fleet_only_its_lease() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("kill");
    let (a, b) = (replica(&redis, &prefix), replica(&redis, &prefix));
    let mut c = replica(&redis, &prefix);
    let stop = Arc::new(AtomicBool::new(false));
    let (seen_a, seen_b, seen_c) = (
        Arc::new(Seen::default()),
        Arc::new(Seen::default()),
        Arc::new(Seen::default()),
    );
    let mut tasks = hammer(a.grpc, seen_a.clone(), stop.clone());
    tasks.extend(hammer(b.grpc, seen_b.clone(), stop.clone()));
    let c_tasks = hammer(c.grpc, seen_c.clone(), stop.clone());

    // Kill C once the fleet has spent about a third of the limit (C then holds a lease).
    let admitted =
        |s: &[&Arc<Seen>]| -> u64 { s.iter().map(|s| s.admitted.load(Ordering::Relaxed)).sum() };
    let deadline = Instant::now() + Duration::from_secs(10);
    while admitted(&[&seen_a, &seen_b, &seen_c]) < 30 {
        assert!(Instant::now() < deadline, "the fleet admitted too little");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let c_leases = {
        let (_, text) = get(c.admin, "/metrics");
        text.lines()
            .find(|l| l.starts_with("tollgate_lease_tokens_total{") && l.contains("granted"))
            .map(str::to_string)
            .unwrap_or_default()
    };
    let at_kill = admitted(&[&seen_a, &seen_b, &seen_c]);
    let status = std::process::Command::new("kill")
        .args(["-KILL", &c.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let killed_at = Instant::now();
    for t in c_tasks {
        let _ = t.await;
    }
    drop(c);

    // A new process in its place: its first answer comes from the shared bucket.
    c = replica(&redis, &prefix);
    let seen_c2 = Arc::new(Seen::default());
    let mut first = common::client_of(c.grpc).await;
    let started = Instant::now();
    let r = first
        .should_rate_limit(request("kill", &[&[("tenant", "hot")]]))
        .await
        .expect("the restarted replica answers");
    let first_answer = started.elapsed();
    match r.get_ref().overall_code {
        c if c == Code::Ok as i32 => seen_c2.admitted.fetch_add(1, Ordering::Relaxed),
        _ => seen_c2.refused.fetch_add(1, Ordering::Relaxed),
    };
    tasks.extend(hammer(c.grpc, seen_c2.clone(), stop.clone()));

    // Until everything is spent, and a little more: every replica refusing.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let refused_now = [&seen_a, &seen_b, &seen_c2].map(|s| s.refused.load(Ordering::Relaxed));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let refused_later = [&seen_a, &seen_b, &seen_c2].map(|s| s.refused.load(Ordering::Relaxed));
        let all_refusing = (0..3).all(|i| refused_later[i] > refused_now[i]);
        let spent = admitted(&[&seen_a, &seen_b, &seen_c, &seen_c2]);
        if all_refusing && Instant::now() > killed_at + Duration::from_secs(2) {
            break;
        }
        assert!(Instant::now() < deadline, "never spent: {spent} admitted");
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }

    let total = admitted(&[&seen_a, &seen_b, &seen_c, &seen_c2]);
    let slowest_ms = |s: &Seen| s.latency_ms().1;
    println!(
        "killed C after {} admitted; fleet admitted {total} of {LIMIT}; A: {} ok {} refused {} errors, slowest {:.1} ms; B: {} ok {} refused {} errors, slowest {:.1} ms; new C: first answer in {:.1} ms, {} ok {} refused {} errors; C's lease counter before the kill: {c_leases}",
        at_kill,
        seen_a.admitted.load(Ordering::Relaxed),
        seen_a.refused.load(Ordering::Relaxed),
        seen_a.errors.load(Ordering::Relaxed),
        slowest_ms(&seen_a),
        seen_b.admitted.load(Ordering::Relaxed),
        seen_b.refused.load(Ordering::Relaxed),
        seen_b.errors.load(Ordering::Relaxed),
        slowest_ms(&seen_b),
        first_answer.as_secs_f64() * 1e3,
        seen_c2.admitted.load(Ordering::Relaxed),
        seen_c2.refused.load(Ordering::Relaxed),
        seen_c2.errors.load(Ordering::Relaxed),
    );
    // The others never noticed: no error, no fallback, nothing near the store timeout.
    for (name, seen, server) in [("A", &seen_a, &a), ("B", &seen_b, &b)] {
        assert_eq!(seen.errors.load(Ordering::Relaxed), 0, "{name}");
        assert_eq!(
            fallback_decisions(server.admin),
            0.0,
            "{name}: {}",
            server.log()
        );
        // No call waited for the store timeout (500 ms): that would be a fallback decision,
        // checked above; and 99 % were answered well within it (this machine is shared with
        // five processes under load: the slowest single answer is its scheduler's, not ours).
        let (p99, slowest) = seen.latency_ms();
        assert!(
            p99 < 100.0,
            "{name}: p99 {p99:.1} ms (slowest {slowest:.1} ms)"
        );
    }
    assert_eq!(seen_c2.errors.load(Ordering::Relaxed), 0);
    assert!(first_answer < Duration::from_secs(1), "{first_answer:?}");
    // Never more than the limit; less by at most what the killed process held: one lease of
    // at most MAX_BATCH plus the one request's cost it was claiming for.
    assert!(total <= LIMIT, "{total} admitted");
    assert!(total >= LIMIT - (MAX_BATCH + 1), "{total} admitted");
}
