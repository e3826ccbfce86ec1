//! The real binary, over real gRPC and HTTP: what Envoy and an operator see.

mod common;

use std::time::Duration;

use common::{TestServer, get, poll, request, run_tollgate};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;

const RULES: &str = r#"
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 3}
    descriptors:
      - key: endpoint
        value: /search
        rate_limit: {unit: minute, requests_per_unit: 1, name: search}
  - key: downstream
    value: payments
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
"#;

#[tokio::test]
async fn limits_count_down_to_over_limit_per_descriptor_in_order() {
    let server = TestServer::builder(RULES).start();
    let mut client = server.client().await;
    let req = request(
        "edge",
        &[
            &[("tenant", "a")],
            &[("tenant", "a"), ("endpoint", "/search")],
            &[("nobody", "x")],
        ],
    );
    let first = client
        .should_rate_limit(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.overall_code, Code::Ok as i32);
    assert_eq!(first.statuses.len(), 3);
    let tenant = &first.statuses[0];
    assert_eq!(tenant.limit_remaining, 2);
    let limit = tenant.current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (3, Unit::Hour as i32)
    );
    assert_eq!(
        tenant.duration_until_reset.unwrap().seconds,
        1200,
        "one of 3/hour refills in 20 min"
    );
    assert_eq!(
        first.statuses[1].current_limit.as_ref().unwrap().name,
        "search"
    );
    assert!(
        first.statuses[2].current_limit.is_none(),
        "no rule: OK without a limit"
    );

    let second = client
        .should_rate_limit(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.overall_code, Code::OverLimit as i32);
    let codes: Vec<i32> = second.statuses.iter().map(|s| s.code).collect();
    assert_eq!(
        codes,
        [Code::Ok as i32, Code::OverLimit as i32, Code::Ok as i32]
    );

    // Another tenant has its own bucket.
    let other = client
        .should_rate_limit(request("edge", &[&[("tenant", "b")]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(other.statuses[0].limit_remaining, 2);
}

#[tokio::test]
async fn bad_requests_are_invalid_argument_with_a_message() {
    let server = TestServer::builder(RULES)
        .arg("max-entries", "2")
        .arg("max-value-bytes", "64")
        .start();
    let mut client = server.client().await;
    let err = client
        .should_rate_limit(request("", &[&[("tenant", "a")]]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("domain"), "{}", err.message());
    let err = client
        .should_rate_limit(request("edge", &[]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("descriptor"), "{}", err.message());
    let err = client
        .should_rate_limit(request("edge", &[&[("a", "1"), ("b", "2"), ("c", "3")]]))
        .await
        .unwrap_err();
    assert!(err.message().contains("max_entries"), "{}", err.message());
    let huge = "v".repeat(65);
    let err = client
        .should_rate_limit(request("edge", &[&[("tenant", &huge)]]))
        .await
        .unwrap_err();
    assert!(
        err.message().contains("max_value_bytes"),
        "{}",
        err.message()
    );
    // The server is still fine afterwards.
    assert!(
        client
            .should_rate_limit(request("edge", &[&[("tenant", "ok")]]))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn admin_port_health_readiness_and_metrics() {
    let server = TestServer::builder(RULES).start();
    assert_eq!(get(server.admin, "/healthz"), (200, "ok\n".to_string()));
    let (code, body) = get(server.admin, "/readyz");
    assert_eq!(code, 200);
    let ready: serde_json::Value = serde_json::from_str(&body).expect("/readyz is JSON");
    assert_eq!(ready["status"], "ready", "{body}");
    assert_eq!(ready["store"]["kind"], "memory", "{body}");
    assert_eq!(ready["store"]["state"], "connected", "{body}");
    assert_eq!(ready["rules"]["domains"], 1, "{body}");
    assert!(ready["rules"]["limits"].as_u64().unwrap_or(0) > 0, "{body}");
    let mut client = server.client().await;
    let req = request("edge", &[&[("downstream", "payments")]]);
    for _ in 0..2 {
        client.should_rate_limit(req.clone()).await.unwrap();
    }
    let (code, text) = get(server.admin, "/metrics");
    assert_eq!(code, 200);
    assert!(
        text.contains(
            r#"tollgate_decisions_total{domain="edge",class="downstream",outcome="ok"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"tollgate_decisions_total{domain="edge",class="downstream",outcome="shadow"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains("tollgate_request_duration_seconds_count 2"),
        "{text}"
    );
    assert_eq!(get(server.admin, "/nope").0, 404);
}

#[tokio::test]
async fn grpc_health_service_reports_serving() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let server = TestServer::builder(RULES).start();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let resp = health
        .check(HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.status, 1, "SERVING");
}

#[tokio::test]
async fn settings_from_env_and_flags_with_flags_winning() {
    // Kubernetes-style service variables must not break startup; env turns shadow mode on.
    let server = TestServer::builder(RULES)
        .env("TOLLGATE_PORT", "tcp://10.0.0.1:8081")
        .env("TOLLGATE_SERVICE_HOST", "10.0.0.1")
        .env("TOLLGATE_SHADOW_MODE", "true")
        .start();
    let mut client = server.client().await;
    let req = request("edge", &[&[("tenant", "s"), ("endpoint", "/search")]]);
    client.should_rate_limit(req.clone()).await.unwrap();
    let r = client
        .should_rate_limit(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.overall_code,
        Code::Ok as i32,
        "global shadow mode from the environment"
    );
    assert_eq!(
        r.statuses[0].code,
        Code::OverLimit as i32,
        "statuses stay as decided"
    );

    let server = TestServer::builder(RULES)
        .env("TOLLGATE_SHADOW_MODE", "true")
        .arg("shadow-mode", "false")
        .start();
    let mut client = server.client().await;
    client.should_rate_limit(req.clone()).await.unwrap();
    let r = client.should_rate_limit(req).await.unwrap().into_inner();
    assert_eq!(
        r.overall_code,
        Code::OverLimit as i32,
        "the flag overrides the environment"
    );
}

#[tokio::test]
async fn fixed_window_default_algorithm_from_a_settings_file() {
    let dir = common::TempDir::new("settings");
    let file = dir.path().join("tollgate.yaml");
    std::fs::write(&file, "default_algorithm: fixed_window\n").unwrap();
    let server = TestServer::builder("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")
        .arg("config", file.to_str().unwrap())
        .start();
    let mut client = server.client().await;
    let r = client
        .should_rate_limit(request("d", &[&[("k", "v")]]))
        .await
        .unwrap()
        .into_inner();
    // A fixed window resets at the minute boundary: at most 60 s away, unlike a token
    // bucket's 30 s for one of 2/minute.
    let reset = r.statuses[0].duration_until_reset.unwrap().seconds;
    assert!((1..=60).contains(&reset), "{reset}");
    let text = get(server.admin, "/metrics").1;
    assert!(text.contains("outcome=\"ok\""), "{text}");
}

#[test]
fn check_prints_a_summary_or_every_error_with_file_and_line() {
    let (code, out, _) = run_tollgate(&["check", "examples/rules"], &[]);
    assert_eq!(code, 0);
    assert!(out.contains("1 domain(s) [edge]"), "{out}");
    let dir = common::TempDir::new("check");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - key: b\n    colour: red\n").unwrap();
    let (code, _, err) = run_tollgate(&["check", bad.to_str().unwrap()], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("2 errors"), "{err}");
    assert!(err.contains("bad.yaml:4:"), "{err}");
    assert!(err.contains("bad.yaml:6:"), "{err}");
    assert!(err.contains("fortnight"), "{err}");
}

#[test]
fn serve_refuses_broken_rules_and_bad_settings_before_binding() {
    let dir = common::TempDir::new("broken");
    std::fs::write(dir.path().join("r.yaml"), "domain: \"\"\n").unwrap();
    let rules = dir.path().to_str().unwrap();
    let (code, _, err) = run_tollgate(
        &[
            "serve",
            "--rules",
            rules,
            "--grpc-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("r.yaml:1:") && err.contains("must not be empty"),
        "{err}"
    );
    let (code, _, err) = run_tollgate(
        &["serve", "--rules", rules],
        &[("TOLLGATE_STORE_TIMEOUT_MS", "zero")],
    );
    assert_eq!(code, 1);
    assert!(err.contains("store_timeout_ms"), "{err}");
}

#[tokio::test]
async fn rules_reload_when_files_change_and_bad_ones_are_refused() {
    let server = TestServer::builder(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .arg("reload-interval-ms", "100")
    .start();
    let mut client = server.client().await;
    let limit_of = |r: envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse| {
        r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit)
    };
    let req = request("d", &[&[("k", "v")]]);
    assert_eq!(
        limit_of(
            client
                .should_rate_limit(req.clone())
                .await
                .unwrap()
                .into_inner()
        ),
        Some(1)
    );
    let file = server.rules_dir().join("rules.yaml");
    // A broken edit is refused; the rules in force stay.
    std::fs::write(
        &file,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour}\n",
    )
    .unwrap();
    let refused = poll(Duration::from_secs(10), || {
        server.log().contains("rules not reloaded").then_some(())
    });
    assert!(refused.is_some(), "{}", server.log());
    assert_eq!(
        limit_of(
            client
                .should_rate_limit(req.clone())
                .await
                .unwrap()
                .into_inner()
        ),
        Some(1)
    );
    std::fs::write(
        &file,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 7}\n",
    )
    .unwrap();
    let mut seen = None;
    for _ in 0..100 {
        seen = limit_of(
            client
                .should_rate_limit(req.clone())
                .await
                .unwrap()
                .into_inner(),
        );
        if seen == Some(7) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen, Some(7), "{}", server.log());
}

#[test]
fn sigterm_drains_and_exits_cleanly() {
    let mut server = TestServer::builder(RULES).start();
    let status = server.terminate();
    assert!(status.success(), "{status}: {}", server.log());
    assert!(server.log().contains("stopped"), "{}", server.log());
}

#[tokio::test]
async fn concurrent_clients_on_one_key_are_admitted_exactly_the_limit() {
    let server = TestServer::builder("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 50}\n").start();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        // One connection per task: the requests really race on the server.
        let mut client = server.client().await;
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            for _ in 0..25 {
                let r = client
                    .should_rate_limit(request("d", &[&[("k", "hot")]]))
                    .await
                    .unwrap()
                    .into_inner();
                admitted += usize::from(r.overall_code == Code::Ok as i32);
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.unwrap();
    }
    assert_eq!(admitted, 50, "200 requests on a 50/hour key");
}

// Multi-threaded: the client must handle the server's GOAWAY while this thread waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_drain_ms_sigterm_unreadies_first_and_keeps_serving() {
    let mut server = TestServer::builder(RULES).arg("drain-ms", "1500").start();
    let mut client = server.client().await;
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(server.pid().to_string())
        .status();
    let unready = poll(Duration::from_secs(5), || {
        (get(server.admin, "/readyz").0 == 503).then_some(())
    });
    assert!(unready.is_some(), "{}", server.log());
    // Still answering while unready.
    let r = client
        .should_rate_limit(request("edge", &[&[("tenant", "drain")]]))
        .await;
    assert!(r.is_ok(), "{r:?}");
    let status = server.terminate();
    assert!(status.success(), "{}", server.log());
}
