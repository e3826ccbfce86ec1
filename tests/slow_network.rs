//! A slow and broken network between tollgate and Redis (a proxy in the harness that delays
//! every chunk, then cuts every connection, again and again), under load, with real processes.
//! Throughout: every request is answered (the local fallback decides while Redis cannot), none
//! waits much longer than `store_timeout_ms`, no panic or hang; afterwards the shared
//! accounting resumes within seconds.

mod common;

use std::time::{Duration, Instant};

use common::TestServer;
use common::load::{Load, Phase, fallback_decisions, until_fallback_stops};
use common::proxy::Proxy;
use common::redis::{TestRedis, unique_prefix};

const RULES: &str = "domain: net\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n";
const STORE_TIMEOUT_MS: u64 = 200;

/// Script calls Redis has run (`EVALSHA`).
fn script_calls(redis: &TestRedis) -> u64 {
    let stats: String = redis.cmd(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|l| {
            l.strip_prefix("cmdstat_evalsha:calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// The store timeout bounds each request's wait: 99 % of a phase's requests within it (plus
/// 100 ms of scheduling on this shared machine; once the breaker is open most are answered
/// at once), and none stalls (the slowest within twice the timeout plus 500 ms: one slow
/// moment of a loaded host, but not a connect timeout or a hang).
fn assert_waits_bounded(name: &str, p: &Phase) {
    assert!(
        p.p99_ms() < (STORE_TIMEOUT_MS + 100) as f64,
        "{name}: p99 {:.1} ms (store timeout {STORE_TIMEOUT_MS} ms)",
        p.p99_ms()
    );
    assert!(
        p.max_ms() < (2 * STORE_TIMEOUT_MS + 500) as f64,
        "{name}: a request waited {:.1} ms (store timeout {STORE_TIMEOUT_MS} ms)",
        p.max_ms()
    );
}

/// After a recovery: Redis's script calls before and after half a second of load (they grow
/// once Redis decides again), then the last phase of load; the load is stopped and every
/// phase, `after` last, printed.
async fn finish(redis: &TestRedis, load: Load, phases: [(&str, &Phase); 3]) -> (u64, u64, Phase) {
    let calls_before = script_calls(redis);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls_after = script_calls(redis);
    let after = load.take().await;
    load.stop().await;
    for (name, p) in phases.into_iter().chain([("after", &after)]) {
        println!("{}", p.summary(name));
    }
    (calls_before, calls_after, after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_cut_connections_to_redis_never_fail_or_stall_a_request() {
    let redis = TestRedis::start();
    let proxy = Proxy::start(format!("127.0.0.1:{}", redis.port()).parse().unwrap()).await;
    let server = TestServer::builder(RULES)
        .arg("store", &proxy.url())
        .arg("key-prefix", &unique_prefix("net"))
        .arg("store-timeout-ms", &STORE_TIMEOUT_MS.to_string())
        .arg("breaker-probe-ms", "100")
        .start();
    let load = Load::start(server.grpc, "net", 4).await;

    tokio::time::sleep(Duration::from_millis(500)).await;
    let healthy = load.take().await;
    let fallback_before = fallback_decisions(server.admin);

    // Slow: every chunk each way waits twice the store timeout.
    proxy.set_delay(Duration::from_millis(2 * STORE_TIMEOUT_MS));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let slow = load.take().await;

    // Broken: no delay, but every connection cut every 100 ms for 1.5 s.
    proxy.set_delay(Duration::ZERO);
    let cutting_until = Instant::now() + Duration::from_millis(1_500);
    while Instant::now() < cutting_until {
        proxy.cut_all();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let broken = load.take().await;
    let fallback_during = fallback_decisions(server.admin) - fallback_before;

    // Healed: decisions go back to Redis (the fallback stops) within seconds.
    let recovered = until_fallback_stops(server.admin, Duration::from_secs(10))
        .await
        .unwrap_or_else(|| panic!("still falling back 10 s after healing\n{}", server.log()));
    let (calls_before, calls_after, after) = finish(
        &redis,
        load,
        [("healthy", &healthy), ("slow", &slow), ("broken", &broken)],
    )
    .await;
    println!(
        "fallback decisions: {fallback_during} during the faults; shared accounting back {:.1} s after the network healed",
        recovered.as_secs_f64()
    );
    for (name, p) in [("slow", &slow), ("broken", &broken)] {
        assert!(p.requests() > 0, "{name}: no request answered");
        assert_eq!(
            p.errors,
            0,
            "{name}: every request answered\n{}",
            server.log()
        );
        assert_waits_bounded(name, p);
    }
    assert_eq!(healthy.errors + after.errors, 0);
    assert!(
        fallback_during > 0.0,
        "the faults were felt: the fallback decided some requests"
    );
    assert!(
        calls_after > calls_before,
        "no script call after the network healed\n{}",
        server.log()
    );
    assert_eq!(common::readyz(server.admin).0, 200);
}

/// Redis paused, then killed and restarted (empty), under load: the figures of the README's
/// failure section. Every request answered within the store timeout (plus scheduling), the
/// fallback deciding meanwhile, Redis deciding again within seconds of each recovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_then_killed_and_restarted_redis_under_load() {
    let mut redis = TestRedis::start();
    let server = TestServer::builder(RULES)
        .arg("store", &redis.url())
        .arg("key-prefix", &unique_prefix("outage"))
        .arg("store-timeout-ms", &STORE_TIMEOUT_MS.to_string())
        .arg("breaker-probe-ms", "100")
        .start();
    let load = Load::start(server.grpc, "net", 4).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let healthy = load.take().await;

    // Paused for 1.5 s: commands wait, so calls time out until the pause ends.
    let fallback_before = fallback_decisions(server.admin);
    redis.cmd::<()>(&["CLIENT", "PAUSE", "1500", "ALL"]);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let paused = load.take().await;
    let fallback_paused = fallback_decisions(server.admin) - fallback_before;
    let after_pause = until_fallback_stops(server.admin, Duration::from_secs(10))
        .await
        .unwrap_or_else(|| panic!("still falling back 10 s after the pause\n{}", server.log()));
    load.take().await;

    // Killed for 1.5 s, then restarted empty on the same port.
    let fallback_before = fallback_decisions(server.admin);
    redis.kill();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let killed = load.take().await;
    let fallback_killed = fallback_decisions(server.admin) - fallback_before;
    redis.restart();
    let after_restart = until_fallback_stops(server.admin, Duration::from_secs(10))
        .await
        .unwrap_or_else(|| {
            panic!(
                "still falling back 10 s after the restart\n{}",
                server.log()
            )
        });
    let (calls_before, calls_after, after) = finish(
        &redis,
        load,
        [
            ("healthy", &healthy),
            ("paused", &paused),
            ("killed", &killed),
        ],
    )
    .await;
    println!(
        "fallback decisions: {fallback_paused} while paused, {fallback_killed} while killed; shared accounting back {:.1} s after the pause ended and {:.1} s after the restart",
        after_pause.as_secs_f64(),
        after_restart.as_secs_f64()
    );
    // The faults were felt, and the fallback answered while Redis could not.
    assert!(fallback_paused > 0.0, "no fallback decision while paused");
    assert!(fallback_killed > 0.0, "no fallback decision while killed");
    for (name, p) in [("paused", &paused), ("killed", &killed)] {
        assert!(p.requests() > 0, "{name}: no request answered");
        assert_eq!(p.errors, 0, "{name}\n{}", server.log());
        assert_waits_bounded(name, p);
    }
    assert_eq!(healthy.errors + after.errors, 0);
    assert!(
        calls_after > calls_before,
        "Redis decides again\n{}",
        server.log()
    );
    assert_eq!(common::readyz(server.admin).0, 200);
}
