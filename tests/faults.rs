//! A Redis that is slow, gone, never there, or has lost its scripts; a store URL that is wrong.
//!
//! Each outage is checked at both layers against the same redis-server: the store
//! (`Store::apply` fails fast with a transient error of the right kind, reports its state and
//! recovers by itself) and tollgate on it (answers UNAVAILABLE within the store timeout, so
//! Envoy's failure mode applies; never stalls or crashes; stays ready and shows the store state
//! on `/readyz`; recovers by itself). What only the binary shows (exit code, stderr) runs the
//! binary.

mod common;

use std::time::{Duration, Instant};

use common::redis::{TestCluster, TestRedis, unique_prefix};
use common::store::{DAY, HOUR, clear_of_window_edge, connect, fw, key, one, sw, tb};
use common::{InProcess, TestServer, free_port, get, poll_async, readyz, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tollgate::quota::Op;
use tollgate::store::{Store, StoreError, StoreErrorKind};
use tonic::transport::Channel;

const RULES: &str =
    "domain: f\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n";

/// tollgate on `store` with the given store timeout and `fallback: error`, so a store failure
/// reaches the client as UNAVAILABLE (the other modes are in `fallback.rs`).
fn server(store: &str, store_timeout_ms: u64) -> InProcess {
    InProcess::start(RULES, |s| {
        s.store = store.to_string();
        s.key_prefix = unique_prefix("faults");
        s.store_timeout_ms = store_timeout_ms;
        s.fallback = tollgate::limiter::FallbackMode::Error;
    })
}

/// Polls with a deadline until a request succeeds again.
async fn answers_again(client: &mut RateLimitServiceClient<Channel>) -> bool {
    poll_async(Duration::from_secs(15), || {
        let mut client = client.clone();
        async move {
            client
                .should_rate_limit(request("f", &[&[("k", "v")]]))
                .await
                .ok()
        }
    })
    .await
    .is_some()
}

/// `/readyz` once it answers 200 with a store state in `want` (polled: the store notices by
/// itself).
async fn readyz_store_state_becomes(server: &InProcess, want: &[&str]) -> serde_json::Value {
    let admin = server.admin;
    poll_async(Duration::from_secs(10), || async move {
        let (code, ready) = readyz(admin);
        let state = ready["store"]["state"].as_str().unwrap_or_default();
        (code == 200 && want.contains(&state)).then_some(ready)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "/readyz never showed the store {want:?}: {:?}\n{}",
            readyz(admin),
            server.log()
        )
    })
}

/// The store timeout while Redis is paused: long enough that one timeout of slack is more
/// than this shared machine's scheduling jitter.
const PAUSED_TIMEOUT_MS: u64 = 300;

/// At least one timeout, and less than two.
fn waited_one_timeout(took: Duration) -> bool {
    let t = Duration::from_millis(PAUSED_TIMEOUT_MS);
    took >= t && took < 2 * t
}

/// Where nothing listens: a timeout long enough that a refusal seen before half of it was
/// known at once, not waited for.
const REFUSED_TIMEOUT_MS: u64 = 2_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_times_out_fast_answers_unavailable_then_recovers() {
    let redis = TestRedis::start();
    let store = connect(&redis.url(), PAUSED_TIMEOUT_MS).await;
    let server = server(&redis.url(), PAUSED_TIMEOUT_MS);
    let mut client = server.client().await;
    let req = request("f", &[&[("k", "v")]]);
    let k = key(&unique_prefix("pause"), "k");
    assert_eq!(one(&store, tb(&k, 10, 10, HOUR, 1)).await.remaining, 9);
    client.should_rate_limit(req.clone()).await.expect("warm");

    redis.cmd::<()>(&["CLIENT", "PAUSE", "2000", "ALL"]);
    let paused_at = Instant::now();
    // The store: a timeout, well before the pause ends.
    let err: StoreError = store.apply(&[tb(&k, 10, 10, HOUR, 1)]).await.unwrap_err();
    let took = paused_at.elapsed();
    assert!(
        err.is_transient() && err.kind == StoreErrorKind::Timeout,
        "{err:?}"
    );
    // It waited out the timeout and not much more: a call gives up when its node has been
    // silent for the timeout, plus however late this busy process is to notice. The bound
    // (one timeout of slack) catches a timeout applied twice, not this machine's jitter.
    eprintln!("the store gave up after {took:?}");
    assert!(
        waited_one_timeout(took),
        "gave up after {took:?}; the timeout is {PAUSED_TIMEOUT_MS} ms, the pause 2 s"
    );
    // tollgate: UNAVAILABLE, as fast.
    let started = Instant::now();
    let err = client.should_rate_limit(req.clone()).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    eprintln!("tollgate answered after {took:?}");
    assert!(
        waited_one_timeout(took),
        "answered in {took:?}; the store timeout is {PAUSED_TIMEOUT_MS} ms, the pause 2 s"
    );
    // Still ready: a Redis blip must not pull replicas out of the Service.
    let (code, ready) = readyz(server.admin);
    assert_eq!(code, 200, "{ready}");
    assert_eq!(ready["status"], "ready", "{ready}");
    assert_eq!(ready["store"]["kind"], "redis", "{ready}");

    // Poll with check-only calls: a take that times out here would still run later.
    poll_async(Duration::from_secs(10), || async {
        store.apply(&[tb(&k, 10, 10, HOUR, 0)]).await.ok()
    })
    .await
    .expect("calls succeed again after the pause");
    assert!(
        paused_at.elapsed() >= Duration::from_millis(1_500),
        "it was really paused"
    );
    // The take that timed out on our side still ran once Redis resumed (documented): one
    // before the pause plus the timed-out one.
    let spent = poll_async(Duration::from_secs(5), || async {
        let o = one(&store, tb(&k, 10, 10, HOUR, 0)).await;
        (o.remaining == 8).then_some(())
    })
    .await;
    assert!(spent.is_some(), "the timed-out take ran after the pause");
    let o = one(&store, tb(&k, 10, 10, HOUR, 1)).await;
    assert!(o.allowed && o.remaining == 7, "{o:?}");
    assert_eq!(store.state(), "connected");
    assert!(answers_again(&mut client).await, "{}", server.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_errors_fast_then_reconnects_on_restart() {
    let mut redis = TestRedis::start();
    let store = connect(&redis.url(), REFUSED_TIMEOUT_MS).await;
    let server = server(&redis.url(), REFUSED_TIMEOUT_MS);
    let mut client = server.client().await;
    let req = request("f", &[&[("k", "v")]]);
    let k = key(&unique_prefix("kill"), "k");
    assert!(one(&store, tb(&k, 10, 10, HOUR, 1)).await.allowed);
    assert_eq!(store.state(), "connected");
    client.should_rate_limit(req.clone()).await.expect("warm");
    readyz_store_state_becomes(&server, &["connected"]).await;

    redis.kill();
    for _ in 0..10 {
        let err = store.apply(&[tb(&k, 10, 10, HOUR, 1)]).await.unwrap_err();
        assert!(err.is_transient(), "{err:?}");
    }
    let started = Instant::now();
    let err = client.should_rate_limit(req.clone()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    // A refused connection is known at once: no waiting for the timeout.
    let took = started.elapsed();
    eprintln!("killed: tollgate answered after {took:?}");
    assert!(
        took < Duration::from_millis(REFUSED_TIMEOUT_MS / 2),
        "answered after {took:?}; the timeout is {REFUSED_TIMEOUT_MS} ms"
    );
    let down = poll_async(Duration::from_secs(10), || async {
        (store.state() == "disconnected").then_some(())
    })
    .await;
    assert!(down.is_some(), "state shows the outage: {}", store.state());
    // Still ready, and `/readyz` says which store is in trouble: none of the pool's
    // connections (8 by default, most of them idle) counts as connected once Redis is gone,
    // within a few keeper ticks (the polls' deadlines), in the body and in the gauge alike.
    let ready = readyz_store_state_becomes(&server, &["disconnected"]).await;
    assert_eq!(ready["status"], "ready", "{ready}");
    assert_eq!(ready["store"]["kind"], "redis", "{ready}");
    let gauge = poll_async(Duration::from_secs(5), || async {
        let metrics = get(server.admin, "/metrics").1;
        metrics
            .contains("tollgate_store_connections{state=\"connected\"} 0")
            .then_some(())
    })
    .await;
    assert!(
        gauge.is_some(),
        "the connected gauge still counts dead connections: {}",
        get(server.admin, "/metrics").1
    );

    redis.restart();
    let back = poll_async(Duration::from_secs(15), || async {
        store.apply(&[tb(&k, 10, 10, HOUR, 1)]).await.ok()
    })
    .await
    .expect("reconnected after the restart");
    assert_eq!(back[0].remaining, 9, "a fresh Redis: a fresh bucket");
    assert_eq!(store.state(), "connected");
    assert!(
        answers_again(&mut client).await,
        "never reconnected:\n{}",
        server.log()
    );
    readyz_store_state_becomes(&server, &["connected"]).await;
    let metrics = get(server.admin, "/metrics").1;
    assert!(metrics.contains("tollgate_store_errors_total"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_at_startup_is_no_error_and_is_picked_up_later() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let store = connect(&url, REFUSED_TIMEOUT_MS).await;
    assert_eq!(store.state(), "disconnected");
    let started = Instant::now();
    let err = store
        .apply(&[tb("absent:{k}", 1, 1, HOUR, 1)])
        .await
        .unwrap_err();
    assert!(
        err.is_transient() && err.kind == StoreErrorKind::Connection,
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(REFUSED_TIMEOUT_MS / 2),
        "fails fast: {:?}",
        started.elapsed()
    );
    // tollgate starts, unready until Redis first answers (the default); the body says why.
    let server = InProcess::builder(RULES)
        .settings(|s| {
            s.store = url.clone();
            s.key_prefix = unique_prefix("faults");
            s.store_timeout_ms = REFUSED_TIMEOUT_MS;
            s.fallback = tollgate::limiter::FallbackMode::Error;
        })
        .ready_status(503)
        .start();
    let (code, ready) = readyz(server.admin);
    assert_eq!(
        (code, ready["status"].as_str()),
        (503, Some("store never answered")),
        "{ready}"
    );
    assert_eq!(ready["store"]["state"], "disconnected", "{ready}");
    let mut client = server.client().await;
    let started = Instant::now();
    let err = client
        .should_rate_limit(request("f", &[&[("k", "v")]]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    // Nobody listens: refused at once, without waiting for the timeout.
    let took = started.elapsed();
    eprintln!("unreachable: tollgate answered after {took:?}");
    assert!(
        took < Duration::from_millis(REFUSED_TIMEOUT_MS / 2),
        "answered after {took:?}; the timeout is {REFUSED_TIMEOUT_MS} ms"
    );

    // Redis appears later on that port: both pick it up by themselves.
    let _redis = TestRedis::start_on(port);
    let ok = poll_async(Duration::from_secs(15), || async {
        store.apply(&[tb("absent:{k}", 1, 1, HOUR, 1)]).await.ok()
    })
    .await;
    assert!(ok.is_some(), "connected once Redis came up");
    assert!(answers_again(&mut client).await, "{}", server.log());

    // A cluster URL with no node up constructs too.
    let cluster = connect(&format!("redis+cluster://127.0.0.1:{}", free_port()), 500).await;
    assert!(
        cluster
            .apply(&[tb("absent:{k}", 1, 1, HOUR, 1)])
            .await
            .unwrap_err()
            .is_transient()
    );
}

// ---------------------------------------------------------------------------------------------
// Scripts flushed: NOSCRIPT is recovered, each op runs exactly once.

async fn noscript_is_recovered(store: &Store, flush: impl Fn(), p: &str) {
    // Every script: each must come back after the flush.
    clear_of_window_edge(DAY).await;
    let ops: Vec<Op> = (0..6)
        .map(|i| {
            let k = key(p, &format!("ns{i}"));
            match i % 3 {
                0 => tb(&k, 5, 5, HOUR, 1),
                1 => sw(&k, 5, DAY, 1),
                _ => fw(&k, 5, DAY, 1),
            }
        })
        .collect();
    let first = store.apply(&ops).await.expect("before the flush");
    assert!(first.iter().all(|o| o.allowed && o.remaining == 4));
    flush();
    let second = store.apply(&ops).await.expect("after SCRIPT FLUSH");
    assert!(
        second.iter().all(|o| o.allowed && o.remaining == 3),
        "each op ran exactly once: {second:?}"
    );
    let third = store.apply(&ops).await.expect("scripts cached again");
    assert!(third.iter().all(|o| o.remaining == 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_noscript_is_recovered() {
    let redis = TestRedis::start();
    let store = connect(&redis.url(), 2_000).await;
    noscript_is_recovered(&store, || redis.cmd::<()>(&["SCRIPT", "FLUSH"]), "ns:").await;
    // The request's six ops go as one batch script call (`store_batch_max_ops` > 1, the
    // default): it met NOSCRIPT and was re-sent with EVAL once; after that EVALSHA finds the
    // script again (the third request needed no EVAL).
    let stats: String = redis.cmd(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_eval:calls=1,"), "{stats}");
    // Unbatched, one script call per op: the six that met NOSCRIPT were re-sent with EVAL,
    // once each.
    redis.cmd::<()>(&["CONFIG", "RESETSTAT"]);
    let unbatched = tollgate::settings::Settings {
        store_batch_max_ops: 1,
        ..common::store::settings(&redis.url(), 2_000)
    };
    let store = Store::connect(
        tollgate::configs::store_config(&unbatched),
        tollgate::clock::Clock::system(),
        &tollgate::telemetry::Metrics::new(),
    )
    .await
    .unwrap();
    noscript_is_recovered(&store, || redis.cmd::<()>(&["SCRIPT", "FLUSH"]), "ns1:").await;
    let stats: String = redis.cmd(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_eval:calls=6,"), "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_noscript_is_recovered() {
    // A cluster of its own: SCRIPT FLUSH would disturb the tests sharing one.
    let cluster = TestCluster::start();
    let store = connect(&cluster.url(), 2_000).await;
    noscript_is_recovered(&store, || cluster.cmd_all(&["SCRIPT", "FLUSH"]), "ns:").await;
}

// ---------------------------------------------------------------------------------------------
// A store URL that cannot work stops startup; a password is never shown.

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

/// The binary, because its log is the process's stderr (the store's reconnect warnings
/// included, which name the URL).
#[test]
fn the_store_password_is_redacted_on_config_and_in_logs() {
    let port = free_port();
    let server = TestServer::builder(RULES)
        .arg("store", &format!("redis://user:s3cret@127.0.0.1:{port}/0"))
        .arg("key-prefix", &unique_prefix("faults"))
        .arg("store-timeout-ms", "100")
        .ready_status(503)
        .start();
    let (code, body) = get(server.admin, "/config");
    assert_eq!(code, 200);
    assert!(body.contains("redis://user:***@127.0.0.1"), "{body}");
    assert!(!body.contains("s3cret"), "{body}");
    // The log does name the store (redacted), so the check below is not vacuous.
    let log = server.log();
    assert!(log.contains("redis://user:***@127.0.0.1"), "{log}");
    assert!(!log.contains("s3cret"), "{log}");
}

/// `unready_until_store_answers`, on by default: a wrong Redis address keeps the replica unready (it would
/// otherwise roll out green and decide from its local share for ever); once Redis answers it
/// is ready, and a later outage does not unready it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_store_that_never_answered_keeps_the_replica_unready() {
    let port = free_port();
    let server = InProcess::builder(RULES)
        .settings(|s| {
            s.store = format!("redis://127.0.0.1:{port}");
            s.key_prefix = unique_prefix("gate");
        })
        .ready_status(503)
        .start();
    let (code, body) = readyz(server.admin);
    assert_eq!(
        (code, body["status"].as_str()),
        (503, Some("store never answered")),
        "{body}"
    );
    let mut redis = TestRedis::start_on(port);
    let ready = poll_async(Duration::from_secs(15), || async {
        (readyz(server.admin).0 == 200).then_some(())
    })
    .await;
    assert!(
        ready.is_some(),
        "never ready once Redis answered:\n{}",
        server.log()
    );
    // An outage after that is the fallback's business, not readiness's.
    redis.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(readyz(server.admin).0, 200);
}
