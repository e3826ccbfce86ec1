//! The RateLimitService over real gRPC and the admin port over real HTTP, as Envoy and an
//! operator see them, served in-process (`common::InProcess`). What only the binary shows
//! (flags, environment, exit codes, signals) is in `cli.rs`.

mod common;

use std::time::Duration;

use common::{InProcess, get, poll, readyz, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use tollgate::clock::Clock;

/// The small `edge` rule set both suites use (tests/common).
const RULES: &str = common::EDGE_RULES;

#[tokio::test]
async fn limits_count_down_to_over_limit_per_descriptor_in_order() {
    // A clock that moves only when told: the times below are exact.
    let server = InProcess::builder(RULES)
        .clock(Clock::manual(1_700_000_000_000))
        .start();
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

    // A minute later the 1/minute (tenant, /search) limit has a token again.
    server.clock.advance_ms(60_000);
    let third = client.should_rate_limit(req).await.unwrap().into_inner();
    assert_eq!(third.overall_code, Code::Ok as i32, "{third:?}");
    assert_eq!(third.statuses[1].code, Code::Ok as i32, "{third:?}");
}

#[tokio::test]
async fn bad_requests_are_invalid_argument_with_a_message() {
    let server = InProcess::start(RULES, |s| {
        s.max_entries = 2;
        s.max_value_bytes = 64;
    });
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
    let server = InProcess::start(RULES, |_| {});
    assert_eq!(get(server.admin, "/healthz"), (200, "ok\n".to_string()));
    let (code, ready) = readyz(server.admin);
    assert_eq!(code, 200);
    assert_eq!(ready["status"], "ready", "{ready}");
    assert_eq!(ready["store"]["kind"], "memory", "{ready}");
    assert_eq!(ready["store"]["state"], "connected", "{ready}");
    assert_eq!(ready["rules"]["domains"], 1, "{ready}");
    // tenant, tenant/endpoint, downstream=payments.
    assert_eq!(ready["rules"]["limits"], 3, "{ready}");
    let mut client = server.client().await;
    let req = request("edge", &[&[("downstream", "payments")]]);
    for _ in 0..2 {
        client.should_rate_limit(req.clone()).await.unwrap();
    }
    let (code, text) = get(server.admin, "/metrics");
    assert_eq!(code, 200);
    assert!(
        // The limit is 1 in its window: its one admitted hit is past ⌊1 × 0.8⌋, near the limit.
        text.contains(
            r#"tollgate_decisions_total{domain="edge",class="downstream",outcome="near_limit"} 1"#
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

/// `grpc.health.v1` as Envoy's gRPC health checks and Kubernetes' `grpc:` probes read it, for
/// the server (`""`) and each service: `(service, status)`, 1 SERVING, 2 NOT_SERVING.
async fn health(grpc: std::net::SocketAddr) -> Vec<(&'static str, i32)> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let mut out = Vec::new();
    for service in [
        "",
        "envoy.service.ratelimit.v3.RateLimitService",
        "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
    ] {
        let status = client
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status;
        out.push((service, status));
    }
    out
}

fn all(status: i32) -> Vec<(&'static str, i32)> {
    [
        "",
        "envoy.service.ratelimit.v3.RateLimitService",
        "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
    ]
    .into_iter()
    .map(|s| (s, status))
    .collect()
}

const SERVING: i32 = 1;
const NOT_SERVING: i32 = 2;

#[tokio::test]
async fn grpc_health_service_reports_serving() {
    let server = InProcess::start(RULES, |_| {});
    assert_eq!(health(server.grpc).await, all(SERVING));
}

/// The gRPC health status says what `/readyz` says: NOT_SERVING while the store has never
/// answered (a replica on a Redis it cannot reach must not roll out green through a `grpc:`
/// probe), SERVING once it has, and NOT_SERVING from the first moment of a drain, while the
/// replica still answers decisions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_follows_readiness_and_the_drain() {
    let mut redis = common::redis::TestRedis::start();
    let url = redis.url();
    redis.kill();
    let server = InProcess::builder(RULES)
        .settings(|s| {
            s.store = url;
            s.drain_ms = 3_000;
        })
        .ready_status(503)
        .start();
    assert_eq!(readyz(server.admin).0, 503);
    assert_eq!(
        health(server.grpc).await,
        all(NOT_SERVING),
        "store never answered"
    );

    redis.restart();
    let serving = common::poll_async(Duration::from_secs(10), || async {
        (health(server.grpc).await == all(SERVING)).then_some(())
    })
    .await;
    assert!(
        serving.is_some(),
        "SERVING once the store answered: {:?}",
        health(server.grpc).await
    );
    assert_eq!(readyz(server.admin).0, 200);

    let mut client = server.client().await;
    let grpc = server.grpc;
    let admin = server.admin;
    let drained = std::thread::spawn(move || server.shutdown());
    let unready = poll(Duration::from_secs(2), || {
        (readyz(admin).0 == 503).then_some(())
    });
    assert!(unready.is_some(), "the drain began");
    // Within the drain's first moments (it lasts 3 s), the health service already says so...
    assert_eq!(health(grpc).await, all(NOT_SERVING), "draining");
    // ...while decisions are still answered.
    let r = client
        .should_rate_limit(request("edge", &[&[("tenant", "drain")]]))
        .await;
    assert!(r.is_ok(), "still serving while draining: {r:?}");
    assert_eq!(
        tokio::task::spawn_blocking(move || drained.join().unwrap())
            .await
            .unwrap(),
        Ok(())
    );
}

#[tokio::test]
async fn rules_reload_when_files_change_and_bad_ones_are_refused() {
    let server = InProcess::start(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
        |s| s.reload_interval_ms = 100,
    );
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

#[tokio::test]
async fn concurrent_clients_on_one_key_are_admitted_exactly_the_limit() {
    let server = InProcess::start(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 50}\n",
        |_| {},
    );
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

/// The reference's rule fields over the real service: a `quota_mode` limit reports
/// OVER_LIMIT without refusing the request until every quota-mode limit is over, and the
/// passing descriptors' `metadata` comes back as the response's dynamic metadata.
#[tokio::test]
async fn quota_mode_refuses_only_when_every_budget_is_spent_and_metadata_comes_back() {
    const QUOTA_RULES: &str = r#"
domain: budgets
descriptors:
  - key: user
    quota_mode: true
    metadata: {tier: gold, owner: {team: search}}
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: team
    quota_mode: true
    metadata: {tier: silver, cost_center: c7}
    rate_limit: {unit: hour, requests_per_unit: 2}
"#;
    let server = InProcess::builder(QUOTA_RULES)
        .clock(Clock::manual(1_700_000_000_000))
        .settings(|s| s.response_dynamic_metadata = true)
        .start();
    let mut client = server.client().await;
    let req = request("budgets", &[&[("user", "u1")], &[("team", "t1")]]);
    let mut answers = Vec::new();
    for _ in 0..3 {
        let r = client
            .should_rate_limit(req.clone())
            .await
            .unwrap()
            .into_inner();
        let codes: Vec<i32> = r.statuses.iter().map(|s| s.code).collect();
        answers.push((r.overall_code, codes, r.dynamic_metadata));
    }
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!((answers[0].0, &answers[0].1), (ok, &vec![ok, ok]));
    // The user's budget is spent, the team's is not: OK overall, the user's status says so.
    assert_eq!((answers[1].0, &answers[1].1), (ok, &vec![over, ok]));
    // Both spent: refused.
    assert_eq!((answers[2].0, &answers[2].1), (over, &vec![over, over]));

    let json = |m: &Option<envoy_types::pb::google::protobuf::Struct>| {
        tollgate::structpb::from_struct(m.as_ref().expect("dynamic metadata is on"))
    };
    let first = json(&answers[0].2);
    assert_eq!(first["domain"], "budgets");
    assert_eq!(first["descriptors"][0]["entries"][0], "user=u1");
    // Both passed: merged, the first descriptor's value wins where both have a key.
    assert_eq!(first["metadata"]["tier"], "gold");
    assert_eq!(first["metadata"]["owner"]["team"], "search");
    assert_eq!(first["metadata"]["cost_center"], "c7");
    // Only the team's descriptor passed the second time.
    let second = json(&answers[1].2);
    assert_eq!(second["metadata"]["tier"], "silver");
    assert!(second["metadata"].get("owner").is_none());
    // Nothing passed the third time: no `metadata`, the request is still described.
    let third = json(&answers[2].2);
    assert!(third.get("metadata").is_none());
    assert_eq!(third["descriptors"][1]["entries"][0], "team=t1");
}
