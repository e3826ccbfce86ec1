//! A burst on a healthy Redis, at the default settings: 300 calls at once for one key with a
//! limit of 100/hour admit exactly 100, through one replica and through three, on a standalone
//! Redis and on a 3-primary cluster; the fallback decides nothing and the log has no outage
//! line. The same for a sliding log (`algorithm: sliding_log`, exact by construction) and for a
//! token bucket with `overdraft: true` (every take charged; still exactly the limit admitted).
//!
//! This is the case a fixed per-call timeout got wrong: under a burst, calls queue in
//! tollgate's own connections (this 2-core machine, a debug build, three replicas and the load
//! generator share the cores, as a CPU-throttled pod would), a few passed `store_timeout_ms`,
//! and the fallback admitted them from a full local share while Redis ran their scripts anyway.
//! The store now gives a call up only when its node has been silent for the timeout
//! (`store/redis/call.rs`), and a call that gave up is never admitted from the local share.

mod common;

use common::fleet::burst;
use common::load::fallback_decisions;
use common::redis::{TestCluster, TestRedis, unique_prefix};
use common::{InProcess, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::UInt64Value;

type Client = RateLimitServiceClient<tonic::transport::Channel>;

const LIMIT: usize = 100;
const CALLS: usize = 300;
const RULES: &str = "domain: burst\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";
const SLIDING_LOG: &str = "domain: burst\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_log}\n";
const FIXED_WINDOW: &str = "domain: burst\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: day, requests_per_unit: 100, algorithm: fixed_window}\n";
const OVERDRAFT: &str = "domain: burst\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 100, overdraft: true}\n";
/// gRPC connections per replica the 300 calls are spread over (HTTP/2 streams on each).
const CHANNELS: usize = 4;

/// One test at a time in this process, its store's start included: two at once would
/// measure each other.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `replicas` tollgates at the default settings on `store` (one key prefix of their own), and
/// [`CHANNELS`] warmed-up gRPC clients to each.
async fn replicas_on(
    rules: &str,
    store: &str,
    replicas: usize,
    name: &str,
) -> (Vec<InProcess>, Vec<Client>) {
    let prefix = unique_prefix(name);
    let servers: Vec<InProcess> = (0..replicas)
        .map(|_| {
            InProcess::start(rules, |s| {
                s.store = store.to_string();
                s.key_prefix = prefix.clone();
            })
        })
        .collect();
    let mut clients = Vec::new();
    for server in &servers {
        for _ in 0..CHANNELS {
            let mut client = server.client().await;
            // A first call on each connection, for another tenant: a replica in service has
            // its connections up.
            client
                .should_rate_limit(request("burst", &[&[("tenant", "warm")]]))
                .await
                .expect("answered");
            clients.push(client);
        }
    }
    (servers, clients)
}

/// Starts `replicas` tollgates at the default settings on `store`, sends them 300 concurrent
/// calls for one tenant, and checks: exactly 100 admitted, no fallback decision, no outage line.
async fn burst_through(store: &str, replicas: usize) {
    burst_with(RULES, store, replicas).await
}

/// [`burst_through`] with `rules` (domain `burst`, key `tenant`, 100 an hour).
async fn burst_with(rules: &str, store: &str, replicas: usize) {
    let (servers, clients) = replicas_on(rules, store, replicas, "burst").await;

    let admitted = burst(&clients, "burst", "hot", CALLS).await;

    let logs: Vec<String> = servers.iter().map(InProcess::log).collect();
    let fallback: f64 = servers.iter().map(|s| fallback_decisions(s.admin)).sum();
    let outage_lines: Vec<&str> = logs
        .iter()
        .flat_map(|l| l.lines())
        .filter(|l| {
            l.contains("WARN") || l.contains("circuit open") || l.contains("store calls failing")
        })
        .collect();
    assert_eq!(
        admitted, LIMIT,
        "{CALLS} concurrent calls through {replicas} replica(s) on {store}; fallback decisions: {fallback}; outage lines: {outage_lines:#?}"
    );
    assert_eq!(fallback, 0.0, "the fallback decided on a healthy store");
    assert!(
        outage_lines.is_empty(),
        "outage lines on a healthy store: {outage_lines:#?}"
    );
    // The shared bucket is spent: one more call anywhere is refused.
    let mut client = servers[0].client().await;
    let r = client
        .should_rate_limit(request("burst", &[&[("tenant", "hot")]]))
        .await
        .expect("answered");
    assert_eq!(r.get_ref().overall_code, Code::OverLimit as i32);
}

/// The test's own runtime has one worker: the servers run on their own runtimes, and the
/// 300 client tasks must not take both cores from them more than a load generator would.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_burst_through_one_replica_on_redis_admits_exactly_the_limit() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = TestRedis::start();
    burst_through(&redis.url(), 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_burst_through_three_replicas_on_redis_admits_exactly_the_limit() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = TestRedis::start();
    burst_through(&redis.url(), 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_burst_through_one_replica_on_a_cluster_admits_exactly_the_limit() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let cluster = tokio::task::spawn_blocking(TestCluster::shared)
        .await
        .unwrap();
    burst_through(&cluster.url(), 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_burst_through_three_replicas_on_a_cluster_admits_exactly_the_limit() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let cluster = tokio::task::spawn_blocking(TestCluster::shared)
        .await
        .unwrap();
    burst_through(&cluster.url(), 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_sliding_log_burst_through_one_and_three_replicas_on_redis_admits_exactly_the_limit() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = TestRedis::start();
    burst_with(SLIDING_LOG, &redis.url(), 1).await;
    burst_with(SLIDING_LOG, &redis.url(), 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_sliding_log_burst_through_one_and_three_replicas_on_a_cluster_admits_exactly_the_limit()
{
    let _alone = ONE_AT_A_TIME.lock().await;
    let cluster = tokio::task::spawn_blocking(TestCluster::shared)
        .await
        .unwrap();
    burst_with(SLIDING_LOG, &cluster.url(), 1).await;
    burst_with(SLIDING_LOG, &cluster.url(), 3).await;
}

/// A burst within one day's window (a run in the last minute of a UTC day waits for the next:
/// a window edge in the middle of a burst would rightly admit 100 more).
async fn within_one_day_window() {
    let into_day = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        % 86_400;
    if into_day > 86_400 - 60 {
        tokio::time::sleep(std::time::Duration::from_secs(86_400 - into_day + 1)).await;
    }
}

/// The fixed window counts a refused hit up to the limit (its debt rules, issue 45): a burst
/// still admits exactly the limit, through one and three replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_fixed_window_burst_through_one_and_three_replicas_on_redis_admits_exactly_the_limit() {
    let _alone = ONE_AT_A_TIME.lock().await;
    within_one_day_window().await;
    let redis = TestRedis::start();
    burst_with(FIXED_WINDOW, &redis.url(), 1).await;
    burst_with(FIXED_WINDOW, &redis.url(), 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_fixed_window_burst_through_one_and_three_replicas_on_a_cluster_admits_exactly_the_limit()
{
    let _alone = ONE_AT_A_TIME.lock().await;
    within_one_day_window().await;
    let cluster = tokio::task::spawn_blocking(TestCluster::shared)
        .await
        .unwrap();
    burst_with(FIXED_WINDOW, &cluster.url(), 1).await;
    burst_with(FIXED_WINDOW, &cluster.url(), 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn an_overdraft_burst_through_three_replicas_admits_exactly_the_limit() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = TestRedis::start();
    burst_with(OVERDRAFT, &redis.url(), 3).await;
    let cluster = tokio::task::spawn_blocking(TestCluster::shared)
        .await
        .unwrap();
    burst_with(OVERDRAFT, &cluster.url(), 3).await;
}

/// Refunds (Envoy's `is_negative_hits`) in a burst: the shared bucket is spent first, then
/// 300 takes and 60 refunds of 1 arrive at once, spread over the replicas. A refund gives back
/// exactly one hit and nothing else does (the refill is 100 an hour: under one hit in the few
/// seconds this takes), so the takes admitted in the burst plus what is left after it are
/// exactly the 60 refunded: none lost, none minted, whatever the order they met in Redis.
async fn refunds_in_a_burst(rules: &str, store: &str, replicas: usize) {
    const REFUNDS: usize = 60;
    let (servers, clients) = replicas_on(rules, store, replicas, "refund-burst").await;
    assert_eq!(burst(&clients, "burst", "hot", CALLS).await, LIMIT, "spent");

    let refund = {
        let mut r = request("burst", &[&[("tenant", "hot")]]);
        r.descriptors[0].is_negative_hits = true;
        r
    };
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(CALLS + REFUNDS));
    let tasks: Vec<_> = (0..CALLS + REFUNDS)
        .map(|i| {
            let mut client = clients[i % clients.len()].clone();
            let start = start.clone();
            let req = if i % 6 == 0 && i / 6 < REFUNDS {
                refund.clone()
            } else {
                request("burst", &[&[("tenant", "hot")]])
            };
            let is_refund = req.descriptors[0].is_negative_hits;
            tokio::spawn(async move {
                start.wait().await;
                let r = client.should_rate_limit(req).await.expect("answered");
                let ok = r.get_ref().overall_code == Code::Ok as i32;
                assert!(ok || !is_refund, "a refund was refused");
                (is_refund, ok)
            })
        })
        .collect();
    let (mut admitted, mut refunds) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            (true, _) => refunds += 1,
            (false, ok) => admitted += usize::from(ok),
        }
    }
    assert_eq!(refunds, REFUNDS);
    let mut check = request("burst", &[&[("tenant", "hot")]]);
    check.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    let left = clients[0]
        .clone()
        .should_rate_limit(check)
        .await
        .expect("answered")
        .get_ref()
        .statuses[0]
        .limit_remaining as usize;
    eprintln!(
        "refunds in a burst, {replicas} replica(s) on {store}: {admitted} admitted, {left} left"
    );
    assert_eq!(
        admitted + left,
        REFUNDS,
        "{admitted} admitted + {left} left after {REFUNDS} refunds, through {replicas} replica(s) on {store}"
    );
    let fallback: f64 = servers.iter().map(|s| fallback_decisions(s.admin)).sum();
    assert_eq!(fallback, 0.0, "the fallback decided on a healthy store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn refunds_in_a_burst_are_given_back_exactly_on_redis_and_a_cluster() {
    let _alone = ONE_AT_A_TIME.lock().await;
    within_one_day_window().await;
    let redis = TestRedis::start();
    let cluster = tokio::task::spawn_blocking(TestCluster::shared)
        .await
        .unwrap();
    for store in [redis.url(), cluster.url()] {
        for rules in [RULES, FIXED_WINDOW] {
            refunds_in_a_burst(rules, &store, 1).await;
            refunds_in_a_burst(rules, &store, 3).await;
        }
    }
}

/// Reservations in a burst (the takes of a node a `charge_parent` child settles): 300 at once
/// of 7 hits each on a limit of 100 admit exactly 14 (98 hits), and the refused ones count
/// nothing, so a reservation of 2 still fits afterwards and one more of 1 does not. On a fixed
/// window and a calendar month, through 1 and 3 replicas, on Redis and the cluster.
async fn reservations_in_a_burst(rules: &str, store: &str, replicas: usize) {
    let (servers, clients) = replicas_on(rules, store, replicas, "reserve-burst").await;
    let reserve = |n: u64| {
        let mut r = request("burst", &[&[("tenant", "hot")]]);
        r.descriptors[0].hits_addend = Some(UInt64Value { value: n });
        r
    };
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(CALLS));
    let tasks: Vec<_> = (0..CALLS)
        .map(|i| {
            let (mut client, start, req) = (
                clients[i % clients.len()].clone(),
                start.clone(),
                reserve(7),
            );
            tokio::spawn(async move {
                start.wait().await;
                let r = client.should_rate_limit(req).await.expect("answered");
                r.get_ref().overall_code == Code::Ok as i32
            })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        admitted += usize::from(t.await.unwrap());
    }
    let at = format!("{replicas} replica(s) on {store}");
    assert_eq!(admitted, LIMIT / 7, "reservations of 7 admitted, {at}");
    let mut client = clients[0].clone();
    let code = |r: tonic::Response<_>| {
        let r: &envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse = r.get_ref();
        r.overall_code
    };
    let two = code(
        client
            .should_rate_limit(reserve(2))
            .await
            .expect("answered"),
    );
    assert_eq!(
        two,
        Code::Ok as i32,
        "the refused reservations were counted, {at}"
    );
    let one = code(
        client
            .should_rate_limit(reserve(1))
            .await
            .expect("answered"),
    );
    assert_eq!(one, Code::OverLimit as i32, "{at}");
    let fallback: f64 = servers.iter().map(|s| fallback_decisions(s.admin)).sum();
    assert_eq!(fallback, 0.0, "the fallback decided on a healthy store");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn reservations_in_a_burst_admit_exactly_and_refusals_count_nothing() {
    const FIXED: &str = "domain: burst\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: day, requests_per_unit: 100, algorithm: fixed_window}\n    descriptors:\n      - key: settle\n        charge_parent: true\n";
    const MONTH: &str = "domain: burst\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: month, requests_per_unit: 100, calendar: utc}\n    descriptors:\n      - key: settle\n        charge_parent: true\n";
    let _alone = ONE_AT_A_TIME.lock().await;
    within_one_day_window().await;
    let redis = TestRedis::start();
    let cluster = tokio::task::spawn_blocking(TestCluster::shared)
        .await
        .unwrap();
    for store in [redis.url(), cluster.url()] {
        for rules in [FIXED, MONTH] {
            reservations_in_a_burst(rules, &store, 1).await;
            reservations_in_a_burst(rules, &store, 3).await;
        }
    }
}
