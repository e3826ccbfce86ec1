//! End to end through a real Envoy: examples/envoy/envoy.yaml in front of tollgate serving
//! examples/rules/, over plain HTTP, as a user's client would see it.

mod common;

use std::time::Instant;

use common::envoy::TestEnvoy;
use common::{HttpResponse, TestServer, get, get_with};

fn example_rules() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/rules/edge.yaml"
    ))
    .unwrap()
}

fn tollgate() -> TestServer {
    TestServer::builder(&example_rules())
        .arg("response-headers", "true")
        .start()
}

/// Envoy's wait for tollgate in these tests: 1 s, not the example's 20 ms. What they hold is
/// what tollgate answers (limits, headers, health, failure modes), not Envoy's 20 ms budget:
/// `deadlines.rs` holds that with the machine to itself (`scripts/test_run.py`, EXCLUSIVE), and
/// `make bench` on the release binary. At 20 ms a debug build sharing two cores with two other
/// test binaries sometimes answers a call late, and Envoy then fails open (a 200 with no
/// rate-limit headers, counted by nobody): seen twice in the runs that introduced the runner,
/// once after Envoy's connection to tollgate was already open.
const NOT_THE_BUDGET: (&str, &str) = ("timeout: 0.02s", "timeout: 1s");

/// Envoy in front of `grpc`: the example config, waiting [`NOT_THE_BUDGET`] for tollgate.
fn envoy_for(grpc: std::net::SocketAddr) -> TestEnvoy {
    TestEnvoy::start(grpc, &[NOT_THE_BUDGET])
}

fn send(envoy: &TestEnvoy, path: &str, tenant: &str) -> HttpResponse {
    get_with(envoy.front, path, &[("x-tenant", tenant)]).expect("envoy answered")
}

/// Sends requests until the first non-200; returns (how many got 200, that response).
fn until_limited(
    envoy: &TestEnvoy,
    path: &str,
    tenant: &str,
    max: usize,
) -> (usize, Option<HttpResponse>) {
    for i in 0..max {
        let r = send(envoy, path, tenant);
        if r.status != 200 {
            return (i, Some(r));
        }
    }
    (max, None)
}

#[test]
fn tenants_get_429_with_retry_after_and_rate_limit_headers_independently() {
    let server = tollgate();
    let envoy = envoy_for(server.grpc);
    let ok = send(&envoy, "/", "alpha");
    assert_eq!(ok.status, 200, "{ok:?}\n{}", envoy.log());
    assert!(ok.body.contains("hello from upstream"));
    assert_eq!(
        ok.header("x-ratelimit-limit").map(|v| v.starts_with("100")),
        Some(true),
        "{ok:?}"
    );
    assert_eq!(ok.header("x-ratelimit-remaining"), Some("99"));
    // The tenant rule: 100/minute. 99 more pass, then 429 (plus one per 0.6 s the requests
    // took: the token bucket refills smoothly while they run).
    let started = Instant::now();
    let (passed, limited) = until_limited(&envoy, "/", "alpha", 150);
    let refill = (started.elapsed().as_secs_f64() * 100.0 / 60.0).floor() as usize;
    assert!(
        (99..=99 + refill).contains(&passed),
        "passed {passed}, refill {refill}"
    );
    let limited = limited.unwrap();
    assert_eq!(limited.status, 429, "{limited:?}");
    assert_eq!(limited.header("x-ratelimit-remaining"), Some("0"));
    assert!(limited.header("x-ratelimit-reset").is_some(), "{limited:?}");
    let retry: u64 = limited
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!(
        (1..=1).contains(&retry),
        "one token of 100/minute refills in 0.6 s: {retry}"
    );
    // Another tenant is unaffected.
    assert_eq!(send(&envoy, "/", "beta").status, 200);
}

#[test]
fn per_tenant_endpoint_limit_is_two_levels_deep() {
    let server = tollgate();
    let envoy = envoy_for(server.grpc);
    // (tenant, endpoint=/export): 10/hour per tenant.
    let (passed, limited) = until_limited(&envoy, "/export", "gamma", 20);
    assert_eq!(passed, 10);
    assert_eq!(limited.unwrap().status, 429);
    assert_eq!(send(&envoy, "/export", "delta").status, 200);
}

#[test]
fn endpoint_and_downstream_limits_apply_across_tenants() {
    let server = tollgate();
    let envoy = envoy_for(server.grpc);
    // /search: burst 10 at 5/s for everyone together; each request from a new tenant.
    let started = Instant::now();
    let mut admitted = 0;
    let mut limited = 0;
    for i in 0..40 {
        match send(&envoy, "/search", &format!("s{i}")).status {
            200 => admitted += 1,
            429 => limited += 1,
            other => panic!("unexpected {other}"),
        }
    }
    let refill = (started.elapsed().as_secs_f64() * 5.0).ceil() as usize;
    assert!(limited > 0, "the endpoint limit never applied");
    assert!(
        (10..=10 + refill).contains(&admitted),
        "admitted {admitted}, refill {refill}"
    );

    // /payments: 50/s in total for the payments partner, whatever the tenant.
    let started = Instant::now();
    let statuses: Vec<u16> = (0..120)
        .map(|i| send(&envoy, "/payments", &format!("p{i}")).status)
        .collect();
    let refill = (started.elapsed().as_secs_f64() * 50.0).ceil() as usize;
    let admitted = statuses.iter().filter(|&&s| s == 200).count();
    assert!(
        statuses.contains(&429),
        "the downstream limit never applied"
    );
    assert!(
        (50..=50 + refill).contains(&admitted),
        "admitted {admitted}, refill {refill}"
    );
}

#[test]
fn shadow_mode_rules_never_429_but_are_counted() {
    let server = tollgate();
    let envoy = envoy_for(server.grpc);
    for _ in 0..10 {
        assert_eq!(send(&envoy, "/search-index", "x").status, 200);
    }
    let metrics = get(server.admin, "/metrics").1;
    assert!(
        metrics.contains(r#"class="downstream-search-index",outcome="shadow""#),
        "{metrics}"
    );
}

#[test]
fn with_tollgate_down_envoy_follows_failure_mode_deny() {
    // The example fails open: requests pass unlimited while tollgate is unreachable.
    let mut server = tollgate();
    let envoy = envoy_for(server.grpc);
    assert_eq!(send(&envoy, "/", "open").status, 200);
    server.terminate();
    for _ in 0..3 {
        assert_eq!(send(&envoy, "/", "open").status, 200);
    }
    // Flipped to deny, Envoy answers its status_on_error (500), not 429.
    let mut server = tollgate();
    let envoy = TestEnvoy::start(
        server.grpc,
        &[
            ("failure_mode_deny: false", "failure_mode_deny: true"),
            NOT_THE_BUDGET,
        ],
    );
    assert_eq!(send(&envoy, "/", "closed").status, 200);
    server.terminate();
    let r = send(&envoy, "/", "closed");
    assert_eq!(r.status, 500, "{r:?}");
}

#[test]
fn through_envoy_on_the_redis_store_the_limit_is_exact() {
    let redis = common::redis::TestRedis::start();
    let server = TestServer::builder(&example_rules())
        .arg("response-headers", "true")
        .arg("store", &redis.url())
        .arg("key-prefix", &common::redis::unique_prefix("envoy"))
        .arg("store-timeout-ms", "200")
        .start();
    let envoy = envoy_for(server.grpc);
    // (tenant, /export): 10/hour per tenant, counted in Redis.
    let (passed, limited) = until_limited(&envoy, "/export", "redis-tenant", 20);
    assert_eq!(passed, 10, "{}", envoy.log());
    let limited = limited.unwrap();
    assert_eq!(limited.status, 429);
    assert!(limited.header("retry-after").is_some(), "{limited:?}");
    // The bucket really is in Redis: a second tollgate on the same Redis sees it spent.
    let second = TestServer::builder(&example_rules())
        .arg("store", &redis.url())
        .arg("key-prefix", &server_prefix(&server))
        .start();
    let envoy2 = envoy_for(second.grpc);
    // One request first, for another tenant: a fresh debug process on a loaded CI host can
    // answer its very first call after Envoy's RLS timeout, and Envoy then fails open (200).
    send(&envoy2, "/export", "warm-tenant");
    assert_eq!(send(&envoy2, "/export", "redis-tenant").status, 429);
    assert_eq!(send(&envoy2, "/export", "other-tenant").status, 200);
}

/// The key prefix a running server was started with (from its /config).
fn server_prefix(server: &TestServer) -> String {
    let v: serde_json::Value = serde_json::from_str(&get(server.admin, "/config").1).unwrap();
    v["settings"]["key_prefix"].as_str().unwrap().to_string()
}

/// The first number of a header (`x-ratelimit-limit: 5, 5;w=1` → 5).
fn number(r: &HttpResponse, name: &str) -> u64 {
    r.header(name)
        .and_then(|v| v.split([',', ';']).next())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no number in {name}: {r:?}"))
}

#[test]
fn rate_limit_headers_tell_one_story() {
    let server = tollgate();
    let envoy = envoy_for(server.grpc);
    // /search: 5/s with burst 10 (and 5000/hour): remaining is never above the limit, in
    // tollgate's RateLimit-* and in Envoy's x-ratelimit-* alike.
    for i in 0..3 {
        let r = send(&envoy, "/search", &format!("h{i}"));
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(number(&r, "ratelimit-limit"), 10, "the burst: {r:?}");
        assert!(number(&r, "ratelimit-remaining") <= 10, "{r:?}");
        assert_eq!(
            r.header("ratelimit-policy"),
            Some("5;w=1;burst=10"),
            "{r:?}"
        );
        assert!(
            number(&r, "x-ratelimit-remaining") <= number(&r, "x-ratelimit-limit"),
            "{r:?}"
        );
    }
    // A spent 10/hour key: Retry-After, RateLimit-Reset and x-ratelimit-reset all say when
    // the next request fits (6 minutes), not when the bucket is full (an hour).
    let (passed, limited) = until_limited(&envoy, "/export", "spent", 20);
    assert_eq!(passed, 10);
    let r = limited.expect("limited");
    assert_eq!(r.status, 429, "{r:?}");
    let retry = number(&r, "retry-after");
    assert!((359..=360).contains(&retry), "{r:?}");
    assert_eq!(number(&r, "ratelimit-reset"), retry, "{r:?}");
    assert_eq!(number(&r, "x-ratelimit-reset"), retry, "{r:?}");
    assert_eq!(number(&r, "ratelimit-remaining"), 0, "{r:?}");
}

#[test]
fn the_service_upstream_sees_its_callers_quota_and_a_client_cannot_forge_it() {
    let server = TestServer::builder(&example_rules())
        .arg("response-headers", "true")
        .arg("request-headers", "true")
        .arg("headers-for-every-limit", "true")
        .start();
    let envoy = envoy_for(server.grpc);
    // The client sends its own copies; the example's header_mutation filter drops them before
    // the rate limit filter adds tollgate's.
    let forged = [
        ("x-tenant", "acme"),
        ("ratelimit-remaining", "999999"),
        ("ratelimit", "\"forged\";r=999999"),
    ];
    let r = get_with(envoy.front, "/search", &forged).expect("envoy answered");
    assert_eq!(r.status, 200, "{r:?}\n{}", envoy.log());
    // /search for acme: its tenant limit (1000/minute, named tenant-acme) and the endpoint's
    // 5/s with a burst of 10, the tightest (9 left).
    assert_eq!(r.header("ratelimit-remaining"), Some("9"), "{r:?}");
    assert_eq!(
        r.header("x-upstream-saw-ratelimit-remaining"),
        Some("9"),
        "the backend read tollgate's number, once: {r:?}"
    );
    let every = r.header("ratelimit").expect("the list of every limit");
    assert!(every.contains("\"tenant-acme\";r=999;t="), "{r:?}");
    assert!(every.contains("\"descriptor-1\";r=9;t="), "{r:?}");
    assert_eq!(r.header("x-upstream-saw-ratelimit"), Some(every), "{r:?}");
    let policy = r.header("ratelimit-policy").expect("policies");
    assert!(policy.contains("\"tenant-acme\";q=1000;w=60"), "{policy}");
    assert!(
        policy.contains("\"descriptor-1\";q=5;w=1;burst=10"),
        "{policy}"
    );
    // Envoy's own x-ratelimit-* still come from the statuses.
    assert_eq!(r.header("x-ratelimit-remaining"), Some("5"), "{r:?}");
}

#[test]
fn with_redis_killed_a_tenant_still_gets_429_once_its_local_share_is_spent() {
    let mut redis = common::redis::TestRedis::start();
    let server = TestServer::builder(&example_rules())
        .arg("store", &redis.url())
        .arg("key-prefix", &common::redis::unique_prefix("envoy-fb"))
        .arg("store-timeout-ms", "200")
        .start();
    // The example Envoy fails open (failure_mode_deny: false): before the fallback, a Redis
    // outage let every request through.
    let envoy = envoy_for(server.grpc);
    assert_eq!(send(&envoy, "/export", "warm").status, 200);
    redis.kill();
    // One replica: its local share of (tenant, /export) 10/hour is all of it.
    let (passed, limited) = until_limited(&envoy, "/export", "outage-tenant", 20);
    assert_eq!(passed, 10, "{}\n{}", envoy.log(), server.log());
    let limited = limited.expect("limited during the outage");
    assert_eq!(limited.status, 429, "{limited:?}");
    let metrics = get(server.admin, "/metrics").1;
    assert!(
        metrics.contains(r#"outcome="fallback_over_limit"}"#),
        "{metrics}"
    );
}

/// Leasing and sharding end to end: two tollgate replicas on the 3-primary cluster, each
/// behind its own Envoy, one tenant limit split over 2 shards and leased 10 at a time (a TTL
/// of a minute, so a slow machine cannot expire leased tokens mid-test). The
/// requests alternate between the two Envoys: together they admit exactly the limit, and the
/// refusals are 429s with Retry-After.
#[test]
fn through_envoy_leased_and_sharded_limits_still_hold() {
    let cluster = common::redis::TestCluster::shared();
    let prefix = common::redis::unique_prefix("envoy-hot");
    let rules = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 40, shards: 2, lease: {max_batch: 10, ttl_ms: 60000}}\n";
    let start = || {
        TestServer::builder(rules)
            .arg("response-headers", "true")
            .arg("store", &cluster.url())
            .arg("key-prefix", &prefix)
            .arg("store-timeout-ms", "500")
            .start()
    };
    let (a, b) = (start(), start());
    let (envoy_a, envoy_b) = (envoy_for(a.grpc), envoy_for(b.grpc));
    let (mut admitted, mut refused_in_a_row) = (0, 0);
    for i in 0..150 {
        let envoy = if i % 2 == 0 { &envoy_a } else { &envoy_b };
        let r = send(envoy, "/", "hot-tenant");
        match r.status {
            200 => {
                admitted += 1;
                refused_in_a_row = 0;
            }
            429 => {
                assert!(r.header("retry-after").is_some(), "{r:?}");
                refused_in_a_row += 1;
                if refused_in_a_row == 20 {
                    break;
                }
            }
            other => panic!("unexpected {other}: {r:?}\n{}", envoy.log()),
        }
    }
    assert_eq!(admitted, 40, "{}\n{}", a.log(), b.log());
    // Both replicas leased, and each answered from its lease.
    for server in [&a, &b] {
        let (_, metrics) = get(server.admin, "/metrics");
        assert!(
            metrics.contains("tollgate_local_decisions_total{class=\"tenant\",reason=\"lease\"}"),
            "{metrics}"
        );
    }
}

/// Envoy → tollgate over mutual TLS: the rate-limit cluster of the example gets a TLS
/// transport socket with a client certificate, tollgate serves its gRPC port with TLS and
/// requires client certificates from the test CA; the limits apply as over plain HTTP/2.
#[test]
fn through_envoy_over_mutual_tls_the_limits_apply() {
    let certs = common::tls::TestCerts::generate();
    let server = TestServer::builder(&example_rules())
        .arg("response-headers", "true")
        .arg("grpc-tls-cert", &certs.file("server.crt"))
        .arg("grpc-tls-key", &certs.file("server.key"))
        .arg("grpc-tls-client-ca", &certs.file("ca.crt"))
        .start();
    let tls = format!(
        r#"      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
          sni: localhost
          common_tls_context:
            alpn_protocols: [h2]
            tls_certificates:
              - certificate_chain: {{ filename: {cert} }}
                private_key: {{ filename: {key} }}
            validation_context:
              trusted_ca: {{ filename: {ca} }}
      # gRPC needs HTTP/2 to the rate-limit service.
"#,
        cert = certs.file("client.crt"),
        key = certs.file("client.key"),
        ca = certs.file("ca.crt"),
    );
    // What this test holds is the limits over mutual TLS, not Envoy's 20 ms budget: on a
    // loaded CI host a debug tollgate's first calls (the TLS handshake among them) can outrun
    // it, and Envoy then fails open (a clean-clone run once passed 11 of 10). The budget is
    // held by the other tests and by `make bench`.
    let envoy = TestEnvoy::start(
        server.grpc,
        &[
            (
                "      # gRPC needs HTTP/2 to the rate-limit service.\n",
                &tls,
            ),
            ("timeout: 0.02s", "timeout: 2s"),
        ],
    );
    // (tenant, /export): 10/hour per tenant.
    let (passed, limited) = until_limited(&envoy, "/export", "tls-tenant", 20);
    assert_eq!(passed, 10, "{}\n{}", envoy.log(), server.log());
    let limited = limited.unwrap();
    assert_eq!(limited.status, 429, "{limited:?}");
    assert!(limited.header("retry-after").is_some(), "{limited:?}");
}

/// Envoy's active gRPC health checks on a rate-limit cluster of two replicas, one on a Redis it
/// cannot reach (`/readyz` 503: its store never answered) and one healthy: the broken replica
/// answers NOT_SERVING on `grpc.health.v1`, Envoy takes it out of the cluster, and every
/// decision goes to the healthy one. (Two hosts, one healthy, is at Envoy's default panic
/// threshold of 50 %, not under it: with a single unhealthy host Envoy would send it traffic
/// anyway.)
#[test]
fn envoy_health_checks_keep_decisions_off_a_replica_whose_store_never_answered() {
    let healthy = tollgate();
    let broken = TestServer::builder(&example_rules())
        .arg(
            "store",
            &format!("redis://127.0.0.1:{}", common::free_port()),
        )
        .ready_status(503)
        .start();
    let endpoint = format!(
        "socket_address: {{ address: 127.0.0.1, port_value: {} }}",
        healthy.grpc.port()
    );
    let two_endpoints = format!(
        "{endpoint}\n              - endpoint:\n                  address:\n                    socket_address: {{ address: 127.0.0.1, port_value: {} }}",
        broken.grpc.port()
    );
    let health_checks = "connect_timeout: 0.25s\n      health_checks:\n        - timeout: 1s\n          interval: 0.2s\n          unhealthy_threshold: 1\n          healthy_threshold: 1\n          grpc_health_check: { service_name: envoy.service.ratelimit.v3.RateLimitService }\n      # gRPC needs HTTP/2";
    let envoy = TestEnvoy::start(
        healthy.grpc,
        &[
            (endpoint.as_str(), two_endpoints.as_str()),
            (
                "connect_timeout: 0.25s\n      # gRPC needs HTTP/2",
                health_checks,
            ),
            NOT_THE_BUDGET,
        ],
    );
    // Envoy's view of the cluster: the broken replica marked by its failed health check.
    let broken_addr = format!("127.0.0.1:{}", broken.grpc.port());
    let marked = common::poll(std::time::Duration::from_secs(10), || {
        let (_, clusters) = get(envoy.admin, "/clusters");
        clusters
            .lines()
            .any(|l| {
                l.starts_with(&format!("tollgate::{broken_addr}::health_flags::"))
                    && l.contains("failed_active_hc")
            })
            .then_some(())
    });
    assert!(
        marked.is_some(),
        "Envoy never marked {broken_addr} unhealthy:\n{}",
        get(envoy.admin, "/clusters").1
    );
    let decided = |s: &TestServer| common::metric_sum(s.admin, "tollgate_requests_total", &[]);
    let (healthy_before, broken_before) = (decided(&healthy), decided(&broken));
    for i in 0..20 {
        assert_eq!(send(&envoy, "/", &format!("hc-{i}")).status, 200);
    }
    let (to_healthy, to_broken) = (
        decided(&healthy) - healthy_before,
        decided(&broken) - broken_before,
    );
    assert_eq!(
        to_broken, 0.0,
        "the replica whose store never answered got decisions"
    );
    assert_eq!(
        to_healthy, 20.0,
        "every decision went to the healthy replica"
    );
}
