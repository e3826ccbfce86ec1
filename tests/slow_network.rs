//! A slow and broken network between tollgate and Redis (a proxy in the harness that delays
//! every chunk, then cuts every connection, again and again), under load, with real processes.
//! Throughout: every request is answered (the local fallback decides while Redis cannot), none
//! waits much longer than `store_timeout_ms`, no panic or hang; afterwards the shared
//! accounting resumes within seconds.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::redis::{TestRedis, unique_prefix};
use common::{TestServer, get, request};
use tokio::sync::Mutex;

const RULES: &str = "domain: net\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n";
const STORE_TIMEOUT_MS: u64 = 200;

fn metric_sum(admin: std::net::SocketAddr, prefix: &str, part: &str) -> f64 {
    let (_, text) = get(admin, "/metrics");
    text.lines()
        .filter(|l| l.starts_with(prefix) && l.contains(part))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Latencies (µs) and errors of one phase.
#[derive(Default)]
struct Phase {
    latencies_us: Vec<u64>,
    errors: u64,
}

impl Phase {
    fn p99_ms(&self) -> f64 {
        let mut l = self.latencies_us.clone();
        l.sort_unstable();
        l.get((l.len() * 99 / 100).min(l.len().saturating_sub(1)))
            .map_or(0.0, |&us| us as f64 / 1000.0)
    }
    fn max_ms(&self) -> f64 {
        self.latencies_us
            .iter()
            .max()
            .map_or(0.0, |&us| us as f64 / 1000.0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_cut_connections_to_redis_never_fail_or_stall_a_request() {
    let redis = TestRedis::start();
    let proxy = Proxy::start(format!("127.0.0.1:{}", redis.port()).parse().unwrap()).await;
    let prefix = unique_prefix("net");
    let server = TestServer::builder(RULES)
        .arg("store", &proxy.url())
        .arg("key-prefix", &prefix)
        .arg("store-timeout-ms", &STORE_TIMEOUT_MS.to_string())
        .arg("breaker-probe-ms", "100")
        .start();

    // Load: four clients, one request at a time, each recorded into the current phase.
    let phase = Arc::new(Mutex::new(Phase::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let (phase, stop) = (phase.clone(), stop.clone());
        let mut client = server.client().await;
        tasks.push(tokio::spawn(async move {
            let tenant = format!("t{i}");
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                let r = client
                    .should_rate_limit(request("net", &[&[("tenant", tenant.as_str())]]))
                    .await;
                let took = started.elapsed().as_micros() as u64;
                let mut p = phase.lock().await;
                p.latencies_us.push(took);
                p.errors += u64::from(r.is_err());
                drop(p);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }));
    }
    let take_phase = || async { std::mem::take(&mut *phase.lock().await) };

    tokio::time::sleep(Duration::from_millis(500)).await;
    let healthy = take_phase().await;
    let fallback_before = metric_sum(server.admin, "tollgate_decisions_total{", "fallback");

    // Slow: every chunk each way waits twice the store timeout.
    proxy.set_delay(Duration::from_millis(2 * STORE_TIMEOUT_MS));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let slow = take_phase().await;

    // Broken: no delay, but every connection cut every 100 ms for 1.5 s.
    proxy.set_delay(Duration::ZERO);
    let cutting_until = Instant::now() + Duration::from_millis(1_500);
    while Instant::now() < cutting_until {
        proxy.cut_all();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let broken = take_phase().await;
    let fallback_during = metric_sum(server.admin, "tollgate_decisions_total{", "fallback");

    // Healed: decisions go back to Redis (no more fallback decisions) within seconds.
    let healed_at = Instant::now();
    let mut last = metric_sum(server.admin, "tollgate_decisions_total{", "fallback");
    let recovered = loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = metric_sum(server.admin, "tollgate_decisions_total{", "fallback");
        if now == last {
            break healed_at.elapsed();
        }
        last = now;
        assert!(
            healed_at.elapsed() < Duration::from_secs(10),
            "still deciding by the fallback 10 s after the network healed\n{}",
            server.log()
        );
    };
    let scripts_before: String = redis.cmd(&["INFO", "commandstats"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let scripts_after: String = redis.cmd(&["INFO", "commandstats"]);
    let after = take_phase().await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("a client task panicked");
    }

    for (name, p) in [
        ("healthy", &healthy),
        ("slow", &slow),
        ("broken", &broken),
        ("after", &after),
    ] {
        println!(
            "{name}: {} requests, {} errors, p99 {:.1} ms, max {:.1} ms",
            p.latencies_us.len(),
            p.errors,
            p.p99_ms(),
            p.max_ms()
        );
    }
    println!(
        "fallback decisions: {} during the faults; shared accounting back {:.1} s after the network healed",
        fallback_during - fallback_before,
        recovered.as_secs_f64()
    );
    for (name, p) in [("slow", &slow), ("broken", &broken)] {
        assert!(!p.latencies_us.is_empty(), "{name}: no request answered");
        assert_eq!(
            p.errors,
            0,
            "{name}: every request answered\n{}",
            server.log()
        );
        // The store timeout bounds each store call; the margin covers this shared machine.
        assert!(
            p.max_ms() < (STORE_TIMEOUT_MS + 300) as f64,
            "{name}: a request waited {:.1} ms (store timeout {STORE_TIMEOUT_MS} ms)",
            p.max_ms()
        );
    }
    assert_eq!(healthy.errors + after.errors, 0);
    assert!(
        fallback_during > fallback_before,
        "the faults were felt: the fallback decided some requests"
    );
    // Redis decides again: its script counter moves while the load goes on.
    let calls = |s: &str| -> u64 {
        s.lines()
            .find_map(|l| {
                l.strip_prefix("cmdstat_evalsha:calls=")?
                    .split(',')
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    };
    assert!(
        calls(&scripts_after) > calls(&scripts_before),
        "no script call after the network healed\n{}",
        server.log()
    );
    let (code, _) = common::readyz(server.admin);
    assert_eq!(code, 200);
}
