//! A store that flaps: a Redis at `maxmemory` with `noeviction` refuses every script with
//! `OOM` while it still answers `PING`. A breaker that closed on a `PING` reopened three calls
//! later, every `breaker_probe_ms`, and each close started every key's local share full again:
//! for an hourly quota, the whole quota every half second. Here three replicas hammer one key
//! of 100/hour for 10 s against such a Redis: the fallback admits at most one local share per
//! replica in all (100 ÷ 3 = 33 each), and once Redis takes writes again each replica is back
//! on the shared quota within seconds, exact.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::fleet::{admitted, wait_for_replicas};
use common::inproc::InProcess;
use common::load::fallback_decisions;
use common::redis::{TestRedis, unique_prefix};
use common::{get, metric_sum, poll_async, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const LIMIT: usize = 100;
const REPLICAS: usize = 3;
const RULES: &str = "domain: flap\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";

fn fallback_active(server: &InProcess) -> Option<f64> {
    get(server.admin, "/metrics")
        .1
        .lines()
        .find(|l| l.starts_with(r#"tollgate_fallback_active{node="store"}"#))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_refusing_writes_while_it_answers_ping_admits_one_local_share_per_replica() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("flap");
    let servers: Vec<InProcess> = (0..REPLICAS)
        .map(|_| {
            InProcess::start(RULES, |s| {
                s.store = redis.url();
                s.key_prefix = prefix.clone();
                // Only so the three learn of each other quickly; the rest is the defaults.
                s.membership_interval_ms = 200;
            })
        })
        .collect();
    wait_for_replicas(&servers.iter().collect::<Vec<_>>(), REPLICAS as u64);

    // Writes refused with OOM; PING still answers.
    redis.cmd::<()>(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis.cmd::<()>(&["CONFIG", "SET", "maxmemory", "1"]);
    assert_eq!(redis.cmd::<String>(&["PING"]), "PONG");

    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let sent = Arc::new(AtomicUsize::new(0));
    let mut load = Vec::new();
    for server in &servers {
        for _ in 0..2 {
            let mut client = server.client().await;
            let (stop, ok, sent) = (stop.clone(), ok.clone(), sent.clone());
            load.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let r = client
                        .should_rate_limit(request("flap", &[&[("tenant", "hot")]]))
                        .await
                        .expect("every request answered");
                    sent.fetch_add(1, Ordering::Relaxed);
                    if r.get_ref().overall_code == Code::Ok as i32 {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }));
        }
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    let (ok, sent) = (ok.load(Ordering::Relaxed), sent.load(Ordering::Relaxed));
    let logs = servers
        .iter()
        .map(|s| s.log())
        .collect::<Vec<_>>()
        .join("\n----\n");
    eprintln!("{ok} of {sent} admitted in 10 s of OOM");
    // Three shares of 33: the fallback's bound, however often a probe ran.
    assert!(
        ok <= LIMIT,
        "{ok} of {sent} admitted for a limit of {LIMIT}:\n{logs}"
    );
    assert!(
        ok >= REPLICAS * (LIMIT / REPLICAS) - 3,
        "the local shares were not used: {ok} of {sent}:\n{logs}"
    );
    assert!(
        !logs.contains("circuit closed"),
        "a circuit closed while every script was refused:\n{logs}"
    );

    // Writes accepted again: each replica's probe runs a script and closes its circuit.
    redis.cmd::<()>(&["CONFIG", "SET", "maxmemory", "0"]);
    let recovered = Instant::now();
    for s in &servers {
        let closed = poll_async(Duration::from_secs(5), || async {
            (fallback_active(s) == Some(0.0)).then_some(())
        })
        .await;
        assert!(closed.is_some(), "circuit still open:\n{}", s.log());
    }
    eprintln!(
        "every circuit closed {:?} after OOM ended",
        recovered.elapsed()
    );
    // Back on the shared quota, exact: every token the store took is one admission, except
    // where a call's answer was lost (a store error: a timed-out call's token may be spent,
    // an unknown outcome, and the fallback decides its ops, a batch's several at once). On a
    // busy machine a call can fail so; each such op is counted, never taken for granted.
    let errors = || -> f64 {
        servers
            .iter()
            .map(|s| metric_sum(s.admin, "tollgate_store_errors_total", &[]))
            .sum()
    };
    let before: f64 = servers.iter().map(|s| fallback_decisions(s.admin)).sum();
    let errors_before = errors();
    let ok = admitted(&servers, "flap", "after", 100).await;
    let by_fallback = (servers
        .iter()
        .map(|s| fallback_decisions(s.admin))
        .sum::<f64>()
        - before) as usize;
    let lost = (errors() - errors_before) as usize;
    assert!(
        ok <= LIMIT && ok + by_fallback >= LIMIT,
        "{ok} admitted of a limit of {LIMIT} after the recovery, {by_fallback} ops decided by the fallback"
    );
    assert!(
        by_fallback == 0 || lost > 0,
        "the fallback decided {by_fallback} ops after the recovery with no store error"
    );
}
