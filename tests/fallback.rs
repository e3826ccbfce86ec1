//! When Redis fails: the local fallback (quota ÷ live replicas), the other modes, the circuit
//! breaker (per node on a cluster) and fleet membership, against real redis-servers and
//! several tollgate replicas.

mod common;

use std::time::Duration;

use common::fleet::wait_for_replicas;
use common::inproc::InProcess;
use common::redis::{TestCluster, TestRedis, unique_prefix};
use common::{TestServer, get, poll_async, readyz, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate::limiter::FallbackMode;

const RULES: &str = "domain: fb
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 30}
  - key: open
    rate_limit: {unit: hour, requests_per_unit: 1, fallback: open}
  - key: closed
    rate_limit: {unit: hour, requests_per_unit: 1000, fallback: closed}
  - key: err
    rate_limit: {unit: hour, requests_per_unit: 1000, fallback: error}
";

fn replica(url: &str, prefix: &str) -> InProcess {
    InProcess::start(RULES, |s| {
        s.store = url.to_string();
        s.key_prefix = prefix.to_string();
        s.store_timeout_ms = 100;
        s.membership_interval_ms = 200;
        s.breaker_probe_ms = 100;
    })
}

/// Sends `n` requests for one descriptor; returns (admitted, refused, failed RPCs).
async fn send(server: &InProcess, key: &str, value: &str, n: usize) -> (usize, usize, usize) {
    let mut client = server.client().await;
    let (mut ok, mut over, mut failed) = (0, 0, 0);
    for _ in 0..n {
        match client
            .should_rate_limit(request("fb", &[&[(key, value)]]))
            .await
        {
            Ok(r) if r.get_ref().overall_code == Code::Ok as i32 => ok += 1,
            Ok(_) => over += 1,
            Err(_) => failed += 1,
        }
    }
    (ok, over, failed)
}

fn metric(server: &InProcess, line_start: &str) -> Option<f64> {
    get(server.admin, "/metrics")
        .1
        .lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Store calls that failed (not the keeper's connection attempts).
fn failed_calls(server: &InProcess) -> f64 {
    common::metric_sum(server.admin, "tollgate_store_errors_total", &[])
        - common::metric_sum(
            server.admin,
            "tollgate_store_errors_total",
            &["kind=\"connect\""],
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_killed_each_replica_admits_its_share_then_the_shared_quota_resumes() {
    let mut redis = TestRedis::start();
    let prefix = unique_prefix("fb-kill");
    let servers = [
        replica(&redis.url(), &prefix),
        replica(&redis.url(), &prefix),
        replica(&redis.url(), &prefix),
    ];
    let all: Vec<&InProcess> = servers.iter().collect();
    wait_for_replicas(&all, 3);

    redis.kill();
    // 30/hour across 3 live replicas: 10 each, decided in memory; no RPC fails.
    for s in &servers {
        let (ok, over, failed) = send(s, "tenant", "a", 20).await;
        assert_eq!(failed, 0, "{}", s.log());
        assert_eq!((ok, over), (10, 10), "{}", readyz(s.admin).1);
        let (_, body) = readyz(s.admin);
        assert_eq!(
            body["status"], "ready",
            "an outage does not unready: {body}"
        );
        assert_eq!(body["fallback"]["open_circuits"][0], "store", "{body}");
        assert_eq!(
            metric(s, r#"tollgate_fallback_active{node="store"}"#),
            Some(1.0)
        );
        // The circuit opened at the first refused call: the other 19 never touched Redis.
        assert!(failed_calls(s) <= 3.0, "{}", failed_calls(s));
        // Its log line says what happens meanwhile, whatever the rule's fallback is.
        let log = s.log();
        assert!(
            log.contains("store circuit open: no request is sent to this node until a probe's script runs on it; meanwhile each rule's fallback decides its requests")
                && !log.contains("go to the fallback"),
            "{log}"
        );
        let text = get(s.admin, "/metrics").1;
        assert!(text.contains(r#"outcome="fallback_ok"} 10"#), "{text}");
        assert!(
            text.contains(r#"outcome="fallback_over_limit"} 10"#),
            "{text}"
        );
    }

    redis.restart();
    for s in &servers {
        let closed = poll_async(Duration::from_secs(10), || async {
            (metric(s, r#"tollgate_fallback_active{node="store"}"#) == Some(0.0)).then_some(())
        })
        .await;
        assert!(closed.is_some(), "circuit never closed:\n{}", s.log());
    }
    // Back on one shared quota (a fresh Redis: a fresh bucket): 30 in total.
    let mut admitted = Vec::new();
    for s in &servers {
        let (ok, _, failed) = send(s, "tenant", "b", 15).await;
        assert_eq!(failed, 0);
        admitted.push(ok);
    }
    assert_eq!(
        admitted.iter().sum::<usize>(),
        30,
        "{admitted:?}\n{}",
        servers
            .iter()
            .map(|s| s.log())
            .collect::<Vec<_>>()
            .join("\n----\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_falls_back_through_timeouts_and_the_modes_answer_as_documented() {
    let redis = TestRedis::start();
    let server = replica(&redis.url(), &unique_prefix("fb-pause"));
    wait_for_replicas(&[&server], 1);
    redis.cmd::<()>(&["CLIENT", "PAUSE", "3000", "ALL"]);
    // Three timeouts open the circuit; every request is answered, none fails. A timed-out
    // call was sent (Redis runs it when the pause ends): its outcome is unknown, so it is
    // refused, not admitted from the local share; after the circuit opened, the share decides.
    let (ok, over, failed) = send(&server, "tenant", "p", 10).await;
    let timeouts = metric(&server, r#"tollgate_store_errors_total{kind="timeout"}"#).unwrap_or(0.0);
    assert_eq!((ok + over, failed), (10, 0), "{}", server.log());
    assert_eq!(
        over as f64,
        timeouts,
        "exactly the timed-out calls are refused: {}",
        server.log()
    );
    assert!(
        (1.0..=3.0).contains(&timeouts),
        "after the circuit opened no request waited for the timeout: {timeouts}"
    );
    assert_eq!(
        metric(&server, r#"tollgate_fallback_active{node="store"}"#),
        Some(1.0)
    );
    // Per-rule modes: open admits, closed refuses, error fails the request (Envoy decides).
    assert_eq!(send(&server, "open", "x", 3).await, (3, 0, 0));
    assert_eq!(send(&server, "closed", "x", 2).await, (0, 2, 0));
    assert_eq!(send(&server, "err", "x", 2).await, (0, 0, 2));
    let closed = poll_async(Duration::from_secs(10), || async {
        (metric(&server, r#"tollgate_fallback_active{node="store"}"#) == Some(0.0)).then_some(())
    })
    .await;
    assert!(closed.is_some(), "circuit never closed after the pause");
    assert_eq!(send(&server, "closed", "x", 1).await, (1, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_mode_applies_where_a_rule_names_none() {
    let mut redis = TestRedis::start();
    let prefix = unique_prefix("fb-modes");
    for (mode, expected) in [
        (FallbackMode::Open, (3, 0, 0)),
        (FallbackMode::Closed, (0, 3, 0)),
        (FallbackMode::Error, (0, 0, 3)),
    ] {
        let server = InProcess::start(RULES, |s| {
            s.store = redis.url();
            s.key_prefix = prefix.clone();
            s.store_timeout_ms = 100;
            s.fallback = mode;
        });
        redis.kill();
        assert_eq!(send(&server, "tenant", "g", 3).await, expected, "{mode:?}");
        assert_eq!(readyz(server.admin).1["fallback"]["mode"], mode.name());
        redis.restart();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_only_the_stopped_nodes_keys_fall_back() {
    let mut cluster = TestCluster::start();
    let prefix = unique_prefix("fb-node");
    let a = replica(&cluster.url(), &prefix);
    let b = replica(&cluster.url(), &prefix);
    wait_for_replicas(&[&a, &b], 2);
    // Two tenants whose buckets live on different nodes.
    let key = |t: &str| format!("{prefix}{{fb|tenant={t}|tb:3600000:0}}");
    let ports = cluster.ports();
    let tenants: Vec<String> = (0..200).map(|i| format!("t{i}")).collect();
    let on = |port: u16| {
        tenants
            .iter()
            .find(|t| cluster.port_of(&key(t)) == port)
            .cloned()
            .expect("a tenant on every node")
    };
    let (down_tenant, up_tenant) = (on(ports[0]), on(ports[1]));
    cluster.nodes_mut()[0].kill();

    // The stopped node's tenant: each replica spends its own share (30 ÷ 2).
    assert_eq!(send(&a, "tenant", &down_tenant, 20).await, (15, 5, 0));
    assert_eq!(send(&b, "tenant", &down_tenant, 20).await, (15, 5, 0));
    let node = format!("127.0.0.1:{}", ports[0]);
    assert_eq!(
        readyz(a.admin).1["fallback"]["open_circuits"][0],
        node.as_str()
    );
    // A tenant on a live node keeps the one shared quota: 30 in total.
    let (first, _, f1) = send(&a, "tenant", &up_tenant, 20).await;
    let (second, _, f2) = send(&b, "tenant", &up_tenant, 20).await;
    assert_eq!((f1, f2), (0, 0));
    assert_eq!((first, second), (20, 10), "shared, not split");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_follows_replicas_that_leave_or_die() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("fb-members");
    let a = replica(&redis.url(), &prefix);
    let b = replica(&redis.url(), &prefix);
    let killed = TestServer::builder(RULES)
        .arg("store", &redis.url())
        .arg("key-prefix", &prefix)
        .arg("membership-interval-ms", "200")
        .start();
    wait_for_replicas(&[&a, &b], 3);
    // A graceful stop leaves the set at once: by the time the stop returns, its member is
    // gone from the set in Redis (ageing out would take three intervals, 600 ms, longer).
    let set = format!("{prefix}{{members}}");
    let members = || redis.cmd::<u64>(&["ZCARD", &set]);
    assert_eq!(members(), 3);
    b.shutdown().expect("graceful stop");
    assert_eq!(members(), 2, "the stopped replica is still in the set");
    wait_for_replicas(&[&a], 2);
    // A killed replica ages out after three intervals.
    drop(killed);
    wait_for_replicas(&[&a], 1);
    assert_eq!(metric(&a, "tollgate_replicas "), Some(1.0));
    assert_eq!(metric(&a, "tollgate_replicas_from_membership "), Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_starts_with_redis_down_uses_the_floor_and_says_so() {
    let port = common::free_port();
    let server = InProcess::start(RULES, |s| {
        s.store = format!("redis://127.0.0.1:{port}");
        s.key_prefix = unique_prefix("fb-floor");
        s.fallback_min_replicas = 2;
        // Ready before Redis first answered: the fallback decides from the start.
        s.unready_until_store_answers = false;
    });
    let (_, body) = readyz(server.admin);
    assert_eq!(body["fallback"]["replicas"], 2, "{body}");
    assert_eq!(body["fallback"]["replicas_source"], "floor", "{body}");
    assert_eq!(
        metric(&server, "tollgate_replicas_from_membership "),
        Some(0.0)
    );
    // 30 ÷ 2 from memory.
    assert_eq!(send(&server, "tenant", "f", 20).await, (15, 5, 0));
}
