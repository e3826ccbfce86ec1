//! tollgate as Envoy Gateway runs envoyproxy/ratelimit, end to end: the binary started as
//! `ratelimit` with no arguments and Envoy Gateway's variables (a free port for each), its
//! rules pushed over xDS with mutual TLS by a test ADS server, Redis for the counts, and a real
//! Envoy (examples/envoy/envoy.yaml) in front. Envoy's requests are limited by the pushed
//! rules; a new snapshot changes the limit live; `/healthcheck` answers as Envoy Gateway's
//! readiness probe expects, and its Prometheus scrape (`USE_PROMETHEUS`, its mapping file)
//! gets the reference's series. (Envoy reaches tollgate over plain h2c here: the example's own
//! cluster; Envoy Gateway's TLS on that hop is the gRPC port's TLS, tested in `grpc_tls.rs`.)

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::envoy::TestEnvoy;
use common::redis::TestRedis;
use common::tls::TestCerts;
use common::xds::{TestAds, wait_version};
use common::{
    HttpResponse, envoy_gateway_env, free_port, get, get_with, poll, ratelimit_link, start_clean,
    temp_dir,
};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

/// The example Envoy's `/export` descriptors (tenant, then endpoint=/export) at `per_hour`.
fn export_limit(per_hour: u32) -> Vec<RateLimitConfig> {
    vec![RateLimitConfig {
        name: "default/gateway/edge".into(),
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "tenant".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "endpoint".into(),
                value: "/export".into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Hour as i32,
                    requests_per_unit: per_hour,
                    ..RateLimitPolicy::default()
                }),
                ..RateLimitDescriptor::default()
            }],
            ..RateLimitDescriptor::default()
        }],
    }]
}

/// Requests to `/export` as `tenant` until the first non-200: how many passed, and that one.
async fn until_limited(front: SocketAddr, tenant: &str, max: usize) -> (usize, Option<u16>) {
    let tenant = tenant.to_string();
    tokio::task::spawn_blocking(move || {
        for i in 0..max {
            let r: HttpResponse =
                get_with(front, "/export", &[("x-tenant", &tenant)]).expect("envoy answered");
            if r.status != 200 {
                return (i, Some(r.status));
            }
        }
        (max, None)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_envoy_gateway_runs_it_rules_over_xds_limit_envoys_requests() {
    let certs = TestCerts::generate();
    let redis = TestRedis::start();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ads = TestAds::start(&certs, listener, "1", export_limit(3)).await;
    let dir = temp_dir("envoy-gateway");
    let (grpc_port, http_port, prom_port) = (free_port(), free_port(), free_port());
    let mapping = dir.path().join("conf.yaml");
    std::fs::write(&mapping, common::ENVOY_GATEWAY_MAPPING).unwrap();
    // What Envoy Gateway's rate-limit Deployment sets, with test paths and free ports: its
    // Prometheus telemetry too (statsd off, the exporter's mapping file mounted).
    let mut vars = envoy_gateway_env(redis.port(), &dir.path().join("data"), grpc_port, http_port);
    vars.extend([
        ("USE_PROMETHEUS", "true".to_string()),
        ("PROMETHEUS_ADDR", format!("127.0.0.1:{prom_port}")),
        ("PROMETHEUS_MAPPER_YAML", mapping.display().to_string()),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_string()),
        (
            "CONFIG_GRPC_XDS_SERVER_URL",
            format!("127.0.0.1:{}", ads.addr.port()),
        ),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".to_string()),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".to_string()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", certs.file("client.crt")),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", certs.file("client.key")),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", certs.file("ca.crt")),
    ]);
    let log = dir.path().join("tollgate.log");
    let mut child = start_clean(&ratelimit_link(dir.path()), &vars, &log);
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    let admin: SocketAddr = format!("127.0.0.1:{http_port}").parse().unwrap();
    let healthy = poll(Duration::from_secs(20), || {
        (get(admin, "/healthcheck") == (200, "OK".to_string())).then_some(())
    });
    assert!(healthy.is_some(), "no /healthcheck OK; log:\n{}", text());
    wait_version(admin, "1");

    let grpc: SocketAddr = format!("127.0.0.1:{grpc_port}").parse().unwrap();
    // Envoy waits 1 s for tollgate, not the example's 20 ms: this test holds the counts, not
    // the budget (`deadlines.rs` holds that), and a call answered late fails open, uncounted.
    let envoy = TestEnvoy::start(grpc, &[("timeout: 0.02s", "timeout: 1s")]);
    // A first request for another tenant: a fresh debug process can answer its very first
    // call after Envoy's RLS timeout, and Envoy then fails open.
    until_limited(envoy.front, "warm", 1).await;
    let (passed, limited) = until_limited(envoy.front, "acme", 10).await;
    assert_eq!(
        (passed, limited),
        (3, Some(429)),
        "v1: 3 an hour; envoy:\n{}\ntollgate:\n{}",
        envoy.log(),
        text()
    );
    let keys: Vec<String> = redis.cmd(&["KEYS", "*acme*"]);
    assert!(!keys.is_empty(), "the count is in Redis");
    // Its scrape: the reference's series on the Prometheus port. 5 hits on the rule (the warm
    // one and acme's 4): 3 an hour, near past ⌊3 × 0.8⌋ = 2, so acme's third is near and its
    // fourth over.
    let prom: SocketAddr = format!("127.0.0.1:{prom_port}").parse().unwrap();
    let (code, scraped) = get(prom, "/metrics");
    assert_eq!(code, 200, "{}", text());
    let series = r#"{domain="edge",key1="tenant",key2="endpoint_/export"}"#;
    for (name, value) in [
        ("total_hits", 5),
        ("within_limit", 4),
        ("near_limit", 1),
        ("over_limit", 1),
    ] {
        let line = format!("ratelimit_service_rate_limit_{name}{series} {value}\n");
        assert!(scraped.contains(&line), "{line} not scraped:\n{scraped}");
    }
    assert!(
        scraped.contains("ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 5\n"),
        "{scraped}"
    );
    assert!(
        scraped.contains("\nprocess_resident_memory_bytes "),
        "{scraped}"
    );

    // Envoy Gateway pushes a new limit: it applies at once, without a restart.
    ads.publish("2", export_limit(5));
    wait_version(admin, "2");
    let (passed, limited) = until_limited(envoy.front, "globex", 10).await;
    assert_eq!((passed, limited), (5, Some(429)), "v2: 5 an hour");
    let ack = ads.seen().into_iter().last().unwrap();
    assert_eq!((ack.version_info.as_str(), ack.error_detail), ("2", None));
    let _ = child.kill();
    let _ = child.wait();
}

/// The rules Envoy AI Gateway's controller sends for a QuotaPolicy of `limit` tokens an hour on
/// one model of one backend (its translator's simple case): domain `ai-gateway-quota`,
/// `backend_name` → `model_name_override`, the limit in quota mode.
fn quota_policy(limit: u32) -> Vec<RateLimitConfig> {
    vec![RateLimitConfig {
        name: "ai-gateway-quota".into(),
        domain: "ai-gateway-quota".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "backend_name".into(),
            value: "default/quota-backend".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "model_name_override".into(),
                value: "quota-test-model".into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Hour as i32,
                    requests_per_unit: limit,
                    ..RateLimitPolicy::default()
                }),
                quota_mode: true,
                ..RateLimitDescriptor::default()
            }],
            ..RateLimitDescriptor::default()
        }],
    }]
}

/// tollgate as Envoy AI Gateway's second rate-limit Deployment runs the reference for
/// QuotaPolicy: `/bin/ratelimit` with the controller's argument (which the reference ignores),
/// rules from the controller's plain-text xDS (node `envoy-ai-gateway-ratelimit`), Redis for
/// the counts, and a real Envoy configured as the controller configures it
/// (examples/envoy/ai-gateway/envoy.yaml): each request is checked on the way in (1 hit) and
/// charged its tokens from dynamic metadata when its stream is done. 10 tokens an hour at 1 + 4
/// a request: two requests pass, the third gets 429, and Redis holds the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_envoy_ai_gateway_runs_it_quota_policies_charge_tokens_from_metadata() {
    let redis = TestRedis::start();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ads = TestAds::start_plaintext(listener, "1", quota_policy(10)).await;
    let dir = temp_dir("ai-gateway");
    std::fs::create_dir_all(dir.path().join("data/ratelimit")).unwrap();
    let (grpc_port, http_port) = (free_port(), free_port());
    // The Deployment of AI Gateway's QuotaPolicy guide and e2e test, with free ports.
    let vars = vec![
        ("LOG_LEVEL", "debug".to_string()),
        ("REDIS_SOCKET_TYPE", "tcp".to_string()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port())),
        (
            "RUNTIME_ROOT",
            dir.path().join("data").display().to_string(),
        ),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".to_string()),
        ("USE_STATSD", "false".to_string()),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_string()),
        (
            "CONFIG_GRPC_XDS_NODE_ID",
            "envoy-ai-gateway-ratelimit".to_string(),
        ),
        (
            "CONFIG_GRPC_XDS_SERVER_URL",
            format!("127.0.0.1:{}", ads.addr.port()),
        ),
        ("GRPC_HOST", "127.0.0.1".to_string()),
        ("GRPC_PORT", grpc_port.to_string()),
        ("HOST", "127.0.0.1".to_string()),
        ("PORT", http_port.to_string()),
    ];
    let log = dir.path().join("tollgate.log");
    let link = ratelimit_link(dir.path());
    let mut child = common::start_clean_with(
        &link,
        &["--quotaRateLimitServiceAddr=envoy-ai-gateway-ratelimit.envoy-gateway-system"],
        &vars,
        &log,
    );
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    let admin: SocketAddr = format!("127.0.0.1:{http_port}").parse().unwrap();
    let healthy = poll(Duration::from_secs(20), || {
        (get(admin, "/healthcheck") == (200, "OK".to_string())).then_some(())
    });
    assert!(healthy.is_some(), "no /healthcheck OK; log:\n{}", text());
    wait_version(admin, "1");

    let grpc: SocketAddr = format!("127.0.0.1:{grpc_port}").parse().unwrap();
    let envoy = TestEnvoy::start_example("examples/envoy/ai-gateway/envoy.yaml", grpc, &[]);
    let front = envoy.front;
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let r = tokio::task::spawn_blocking(move || {
            get_with(front, "/v1/chat/completions", &[]).expect("envoy answered")
        })
        .await
        .unwrap();
        statuses.push(r.status);
        // The stream-done charge is sent after the response: let it land.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let keys: Vec<String> = redis.cmd(&["KEYS", "*quota-test-model*"]);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        statuses,
        [200, 200, 429],
        "10 tokens, 5 a request; envoy:\n{}\ntollgate:\n{}",
        envoy.log(),
        text()
    );
    assert!(!keys.is_empty(), "the count is in Redis");
    let ack = ads.seen().into_iter().last().unwrap();
    assert_eq!((ack.version_info.as_str(), ack.error_detail), ("1", None));
    // LOG_LEVEL=debug (as the Deployment sets it) is tollgate's own debug lines: none of h2's
    // frames, which buried everything else (~450 lines in a few seconds).
    let log = text();
    assert!(
        !log.lines()
            .any(|l| l.contains(" h2::") || l.contains("\"h2::")),
        "h2 frames at LOG_LEVEL=debug:\n{log}"
    );
    // And the decision log's lines: one per decision, each naming what answered it.
    let decisions = log
        .lines()
        .filter(|l| l.contains("decision") && l.contains(" by store"))
        .count();
    assert!(
        decisions >= 3,
        "{decisions} decision lines at LOG_LEVEL=debug:\n{log}"
    );
}
