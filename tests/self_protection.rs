//! Self-protection on a real server: a cap on requests decided at once (past it, an immediate
//! RESOURCE_EXHAUSTED, counted), `admin_json: false` turning off the one admin route that
//! spends tokens, and no secret on any admin page or in the log.

mod common;

use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::redis::TestRedis;
use common::{TestServer, get, http, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

const RULES: &str = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n";

/// The value of one sample line of `/metrics` (0 when absent).
fn metric(admin: std::net::SocketAddr, series: &str) -> f64 {
    let (_, body) = get(admin, "/metrics");
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Four requests hold the four slots while a stalled network to Redis keeps them waiting; the
/// sixteen others, sent once the four are seen reaching the store, are refused at once, not
/// queued behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_concurrent_requests_a_request_is_refused_at_once() {
    let redis = TestRedis::start();
    let proxy = Proxy::start(format!("127.0.0.1:{}", redis.port()).parse().unwrap()).await;
    let server = TestServer::builder(RULES)
        .arg("store", &proxy.url())
        .arg("key-prefix", &common::redis::unique_prefix("cap"))
        .arg("store-timeout-ms", "2000")
        .arg("max-concurrent-requests", "4")
        // All four go on the wire at once (batching would queue two of them in tollgate, where
        // they hold their slots all the same but the proxy cannot see them arrive).
        .arg("store-batch-in-flight", "4")
        .start();
    let client = server.client().await;
    let ask = |tenant: &str| request("edge", &[&[("tenant", tenant)]]);
    client
        .clone()
        .should_rate_limit(ask("warm"))
        .await
        .expect("a first request, before the stall");
    // Every chunk to Redis now waits 3 s: the four admitted requests wait for the store
    // timeout. Their key's value is counted as it reaches the proxy.
    proxy.count_sent("held-in-slot");
    proxy.set_delay(Duration::from_millis(3_000));
    let started = Instant::now();
    let mut tasks = Vec::new();
    let spawn = |client: &RateLimitServiceClient<Channel>, tenant: &'static str| {
        let (mut client, req) = (client.clone(), ask(tenant));
        tokio::spawn(async move {
            let sent = Instant::now();
            let r = client.should_rate_limit(req).await;
            (r.map(|_| ()).map_err(|s| s.code()), sent.elapsed())
        })
    };
    for _ in 0..4 {
        tasks.push(spawn(&client, "held-in-slot"));
    }
    let holding = common::poll_async(Duration::from_secs(10), || async {
        (proxy.seen() >= 4).then_some(())
    })
    .await;
    assert!(
        holding.is_some(),
        "the four requests never reached the store ({} seen)\n{}",
        proxy.seen(),
        server.log()
    );
    for _ in 0..16 {
        tasks.push(spawn(&client, "refused"));
    }
    let mut refused = Vec::new();
    let mut answered = 0;
    for t in tasks {
        match t.await.unwrap() {
            (Err(tonic::Code::ResourceExhausted), took) => refused.push(took),
            (Ok(()), _) => answered += 1,
            (Err(other), _) => panic!("unexpected {other:?}\n{}", server.log()),
        }
    }
    assert_eq!(
        (answered, refused.len()),
        (4, 16),
        "4 admitted, 16 refused\n{}",
        server.log()
    );
    let slowest_refusal = refused.iter().max().unwrap();
    assert!(
        *slowest_refusal < Duration::from_millis(500),
        "refused at once, not after the store: {slowest_refusal:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "the admitted ones did wait on the paused store"
    );
    assert_eq!(
        metric(server.admin, "tollgate_requests_total{code=\"overloaded\"}"),
        16.0
    );
    // The slots free up when the requests end: the next one is decided normally.
    proxy.set_delay(Duration::ZERO);
    let mut client = client.clone();
    client
        .should_rate_limit(request("edge", &[&[("tenant", "acme")]]))
        .await
        .expect("admitted once the slots are free");
}

#[test]
fn admin_json_false_turns_off_the_one_admin_route_that_spends_tokens() {
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"tenant","value":"acme"}]}]}"#;
    let on = TestServer::builder(RULES).start();
    let (status, text) = http(on.admin, "POST", "/json", body).unwrap();
    assert_eq!(status, 200, "{text}");
    let off = TestServer::builder(RULES)
        .env("TOLLGATE_ADMIN_JSON", "false")
        .start();
    let (status, text) = http(off.admin, "POST", "/json", body).unwrap();
    assert_eq!(status, 404, "{text}");
    assert!(text.contains("admin_json: false"), "{text}");
    // Nothing was spent: the decision never ran.
    assert_eq!(
        metric(off.admin, "tollgate_requests_total{code=\"ok\"}"),
        0.0
    );
    // The rest of the admin port is unchanged.
    for path in ["/healthz", "/readyz", "/metrics", "/config"] {
        assert_eq!(get(off.admin, path).0, 200, "{path}");
    }
    let (_, config) = get(off.admin, "/config");
    assert!(config.contains("\"admin_json\":false"), "{config}");
}

/// Every setting that can carry a secret, each with a distinct marker: none may appear on
/// `/config`, `/readyz`, `/metrics` or in the log, whether the store is reachable or not.
#[test]
fn no_admin_page_and_no_log_line_shows_a_secret() {
    let dir = common::temp_dir("secrets");
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, "file-secret-4\n").unwrap();
    let closed = common::free_port();
    let servers = [
        (
            TestServer::builder(RULES)
                .arg(
                    "store",
                    &format!("redis+sentinel://u:url-secret-1@127.0.0.1:{closed}/primary"),
                )
                .env("TOLLGATE_STORE_SENTINEL_PASSWORD", "sentinel-secret-2")
                .ready_status(503)
                .start(),
            vec!["url-secret-1", "sentinel-secret-2"],
        ),
        (
            TestServer::builder(RULES)
                .arg("store", &format!("redis://127.0.0.1:{closed}"))
                .env("TOLLGATE_STORE_PASSWORD", "password-secret-3")
                .ready_status(503)
                .start(),
            vec!["password-secret-3"],
        ),
        (
            TestServer::builder(RULES)
                .arg(
                    "store",
                    &format!("rediss+cluster://u:url-secret-5@127.0.0.1:{closed}"),
                )
                .ready_status(503)
                .start(),
            vec!["url-secret-5"],
        ),
        (
            TestServer::builder(RULES)
                .arg("store", &format!("redis://127.0.0.1:{closed}"))
                .arg("store-password-file", password_file.to_str().unwrap())
                .ready_status(503)
                .start(),
            vec!["file-secret-4"],
        ),
    ];
    for (server, secrets) in &servers {
        // The lines that would carry a secret are written: the failed connection attempt,
        // naming the (redacted) URL.
        let reported = common::poll(Duration::from_secs(10), || {
            let log = server.log();
            log.lines()
                .any(|l| {
                    l.contains("store unreachable") && l.contains(&format!("127.0.0.1:{closed}"))
                })
                .then_some(())
        });
        assert!(
            reported.is_some(),
            "no 'store unreachable' line naming the URL:\n{}",
            server.log()
        );
        let (_, config) = get(server.admin, "/config");
        let pages = [
            ("/config", config.clone()),
            ("/readyz", get(server.admin, "/readyz").1),
            ("/metrics", get(server.admin, "/metrics").1),
            ("the log", server.log()),
        ];
        for secret in secrets {
            for (page, text) in &pages {
                assert!(!text.contains(secret), "{secret} on {page}:\n{text}");
            }
        }
        assert!(
            config.contains("***") || secrets == &vec!["file-secret-4"],
            "the redacted value is shown as ***: {config}"
        );
    }
}

/// `detailed_metric` puts request values (caller input) in a label: at most
/// `detailed_metric_max_series` of them per limit, then one overflow series.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detailed_metric_series_are_capped_per_limit_with_an_overflow_series() {
    let rules = "domain: edge\ndescriptors:\n  - key: tenant\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n";
    let server = TestServer::builder(rules)
        .env("TOLLGATE_DETAILED_METRIC_MAX_SERIES", "3")
        .start();
    let mut client = server.client().await;
    for i in 0..10 {
        let tenant = format!("t{i}");
        client
            .should_rate_limit(request("edge", &[&[("tenant", tenant.as_str())]]))
            .await
            .unwrap();
    }
    let (_, body) = get(server.admin, "/metrics");
    let mut classes: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("tollgate_decisions_total{"))
        .filter_map(|l| l.split("class=\"").nth(1)?.split('"').next())
        .collect();
    classes.sort();
    classes.dedup();
    assert_eq!(
        classes,
        [
            "tenant.(overflow)",
            "tenant.tenant_t0",
            "tenant.tenant_t1",
            "tenant.tenant_t2"
        ],
        "{body}"
    );
    // Every decision is still counted: 3 in their own series, 7 in the overflow.
    let overflow: f64 = body
        .lines()
        .filter(|l| l.starts_with("tollgate_decisions_total{") && l.contains("(overflow)"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(overflow, 7.0, "{body}");
}
