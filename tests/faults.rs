//! A Redis that is slow, gone, or never there: tollgate answers UNAVAILABLE within the store
//! timeout (so Envoy's failure mode applies), never stalls or crashes, stays ready, and
//! recovers by itself.

mod common;

use std::time::{Duration, Instant};

use common::redis::{TestRedis, unique_prefix};
use common::{TestServer, get, request};

const RULES: &str =
    "domain: f\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n";

fn server(store: &str) -> TestServer {
    TestServer::builder(RULES)
        .arg("store", store)
        .arg("key-prefix", &unique_prefix("faults"))
        .arg("store-timeout-ms", "100")
        .start()
}

#[tokio::test]
async fn a_paused_redis_gives_unavailable_within_the_timeout_then_recovers() {
    let redis = TestRedis::start();
    let server = server(&redis.url());
    let mut client = server.client().await;
    let req = request("f", &[&[("k", "v")]]);
    client.should_rate_limit(req.clone()).await.expect("warm");
    let _: String = redis.cmd(&["CLIENT", "PAUSE", "1500", "ALL"]);
    let started = Instant::now();
    let err = client.should_rate_limit(req.clone()).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(
        took < Duration::from_millis(1000),
        "answered in {took:?}, before the pause ended"
    );
    // Still ready: a Redis blip must not pull replicas out of the Service.
    assert_eq!(get(server.admin, "/readyz").0, 200);
    assert!(answers_again(&mut client).await, "{}", server.log());
}

/// Polls with a deadline until a request succeeds again.
async fn answers_again(
    client: &mut envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<
        tonic::transport::Channel,
    >,
) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if client
            .should_rate_limit(request("f", &[&[("k", "v")]]))
            .await
            .is_ok()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn a_vanished_redis_gives_unavailable_and_reconnects_when_it_is_back() {
    let mut redis = TestRedis::start();
    let server = server(&redis.url());
    let mut client = server.client().await;
    let req = request("f", &[&[("k", "v")]]);
    client.should_rate_limit(req.clone()).await.expect("warm");
    redis.kill();
    let started = Instant::now();
    let err = client.should_rate_limit(req.clone()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(
        get(server.admin, "/readyz").1.contains("redis"),
        "store state shown"
    );
    redis.restart();
    assert!(
        answers_again(&mut client).await,
        "never reconnected:\n{}",
        server.log()
    );
    let metrics = get(server.admin, "/metrics").1;
    assert!(metrics.contains("tollgate_store_errors_total"), "{metrics}");
}

#[tokio::test]
async fn an_unreachable_redis_at_startup_does_not_stop_tollgate() {
    let port = common::free_port();
    let server = server(&format!("redis://127.0.0.1:{port}"));
    let (code, body) = get(server.admin, "/readyz");
    assert_eq!(code, 200, "ready: tollgate itself is fine");
    assert!(body.contains("disconnected"), "{body}");
    let mut client = server.client().await;
    let started = Instant::now();
    let err = client
        .should_rate_limit(request("f", &[&[("k", "v")]]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(started.elapsed() < Duration::from_secs(1));
    // Redis appears later on that port: tollgate picks it up by itself.
    let _redis = TestRedis::start_on(port);
    let mut ok = false;
    for _ in 0..100 {
        if client
            .should_rate_limit(request("f", &[&[("k", "v")]]))
            .await
            .is_ok()
        {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "{}", server.log());
}

#[test]
fn a_malformed_store_url_stops_startup_with_a_clear_error() {
    let (code, _, err) = common::run_tollgate(
        &[
            "serve",
            "--rules",
            "examples/rules",
            "--store",
            "redis://:pw@",
            "--grpc-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(err.contains("store"), "{err}");
    assert!(!err.contains("pw"), "the password is not printed: {err}");
}

#[test]
fn the_store_password_is_redacted_on_config_and_in_logs() {
    let port = common::free_port();
    let server = server(&format!("redis://user:s3cret@127.0.0.1:{port}/0"));
    let (code, body) = get(server.admin, "/config");
    assert_eq!(code, 200);
    assert!(body.contains("redis://user:***@127.0.0.1"), "{body}");
    assert!(!body.contains("s3cret"), "{body}");
    assert!(!server.log().contains("s3cret"), "{}", server.log());
}
