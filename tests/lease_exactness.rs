//! Leases lose no tokens. A replica leasing a key takes tokens from the shared bucket before it
//! spends them; what it has not spent when the lease's TTL ends goes back to the bucket (it
//! used to expire, lost until the refill or the window's end, so the fleet refused well under
//! its quota), and a key a replica sees rarely claims only its request's cost (every claim
//! used to take one extra token, which then expired: a leased fixed window admitted about half
//! its limit). Three replicas on one Redis, real processes.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::fleet::{burst, wait_for_replicas};
use common::inproc::InProcess;
use common::redis::{TestRedis, unique_prefix};
use common::request;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const REPLICAS: usize = 3;

/// One test at a time: each runs three replicas and bursts of 300 calls, and two at once on
/// this 2-core machine measure each other's CPU starvation, not leases.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn replicas(redis: &TestRedis, rules: &str, lease_max_batch: u64) -> Vec<InProcess> {
    let prefix = unique_prefix("lease");
    let servers: Vec<InProcess> = (0..REPLICAS)
        .map(|_| {
            InProcess::start(rules, |s| {
                s.store = redis.url();
                s.key_prefix = prefix.clone();
                s.lease_max_batch = lease_max_batch;
                s.membership_interval_ms = 200;
                // These tests count leased tokens; a call given up for a busy host (an unknown
                // outcome, refused) is `tests/burst_exactness.rs`'s subject, not theirs.
                s.store_timeout_ms = 200;
            })
        })
        .collect();
    wait_for_replicas(&servers.iter().collect::<Vec<_>>(), REPLICAS as u64);
    servers
}

/// 300 concurrent calls for `tenant`, 100 through each server; how many were admitted.
async fn burst_of_300(servers: &[InProcess], domain: &str, tenant: &str) -> usize {
    let mut clients = Vec::new();
    for s in servers {
        for _ in 0..4 {
            clients.push(s.client().await);
        }
    }
    burst(&clients, domain, tenant, 300).await
}

/// Bursts of 300 for `tenant`, a lease TTL and a housekeeping pass apart, until one admits
/// nothing (at most five): what each admitted. A burst can end while a replica's lease holds
/// tokens that arrived after its last request was answered (a single-flight claim settling
/// after the waiters claimed for themselves); they go back a TTL later and the next burst
/// spends them. So the sum is the accounting's test, whatever each burst's share of it.
async fn bursts_until_spent(servers: &[InProcess], domain: &str, tenant: &str) -> Vec<usize> {
    let mut admitted = Vec::new();
    for _ in 0..5 {
        // The leases' TTL (1 s) passes, and the housekeeping pass after it gives back what
        // they still held.
        tokio::time::sleep(Duration::from_millis(3_000)).await;
        let n = burst_of_300(servers, domain, tenant).await;
        admitted.push(n);
        if n == 0 {
            break;
        }
    }
    admitted
}

/// Each server's leased tokens by fate, then its log: what a failure needs to say where the
/// tokens went.
fn logs(servers: &[InProcess]) -> String {
    servers
        .iter()
        .map(|s| {
            let events: Vec<String> = ["granted", "returned", "expired"]
                .iter()
                .map(|e| {
                    let label = format!("event=\"{e}\"");
                    let n = common::metric_sum(s.admin, "tollgate_lease_tokens_total", &[&label]);
                    format!("{e} {n}")
                })
                .collect();
            format!("leased tokens: {}\n{}", events.join(", "), s.log())
        })
        .collect::<Vec<_>>()
        .join("\n----\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_a_lease_ttl_apart_admit_exactly_the_limit() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = TestRedis::start();
    let rules = "domain: lease\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";
    let servers = replicas(&redis, rules, 10);
    let first = burst_of_300(&servers, "lease", "hot").await;
    let later = bursts_until_spent(&servers, "lease", "hot").await;
    eprintln!("admitted {first}, then {later:?}");
    assert!(first <= 100, "{first} admitted of 100");
    assert_eq!(
        first + later.iter().sum::<usize>(),
        100,
        "{first} in the first burst, {later:?} in the next ones:\n{}",
        logs(&servers)
    );
}

/// Leased tokens granted so far, summed over the servers.
fn granted(servers: &[InProcess]) -> f64 {
    servers
        .iter()
        .map(|s| {
            common::metric_sum(
                s.admin,
                "tollgate_lease_tokens_total",
                &["event=\"granted\""],
            )
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_lease_holds_when_its_ttl_ends_goes_back_to_the_bucket() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let redis = TestRedis::start();
    let rules = "domain: lease\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";
    let servers = replicas(&redis, rules, 10);
    let mut clients = Vec::new();
    for s in &servers {
        clients.push(s.client().await);
    }
    // 75 requests, the replicas in turn, quickly enough that the batches grow: each replica
    // ends holding part of a batch it will not spend.
    let mut first = 0;
    for i in 0..75 {
        let r = clients[i % REPLICAS]
            .should_rate_limit(request("lease", &[&[("tenant", "held")]]))
            .await
            .expect("answered");
        first += usize::from(r.get_ref().overall_code == Code::Ok as i32);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let held = granted(&servers) - first as f64;
    assert_eq!(first, 75);
    assert!(
        held > 0.0,
        "no lease holds tokens: this test would prove nothing"
    );
    let later = bursts_until_spent(&servers, "lease", "held").await;
    eprintln!("admitted {first}, then {later:?} ({held} held in leases after the first part)");
    assert_eq!(
        first + later.iter().sum::<usize>(),
        100,
        "{held} tokens were held in leases when their TTL ended:\n{}",
        logs(&servers)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_taking_turns_on_a_leased_fixed_window_admit_its_limit() {
    let _alone = ONE_AT_A_TIME.lock().await;
    // The window is the clock's hour: do not straddle its end (the count would reset).
    let into_hour = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        % 3_600;
    if into_hour > 3_600 - 30 {
        tokio::time::sleep(Duration::from_secs(3_600 - into_hour + 1)).await;
    }
    let redis = TestRedis::start();
    let rules = "domain: turns\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 20, algorithm: fixed_window, lease: {max_batch: 5, ttl_ms: 1000}}\n";
    let servers = replicas(&redis, rules, 0);
    let mut clients = Vec::new();
    for s in &servers {
        clients.push(s.client().await);
    }
    let mut admitted = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    for i in 0..40 {
        tick.tick().await;
        let r = clients[i % REPLICAS]
            .should_rate_limit(request("turns", &[&[("tenant", "t")]]))
            .await
            .expect("answered");
        admitted += usize::from(r.get_ref().overall_code == Code::Ok as i32);
    }
    assert_eq!(
        admitted,
        20,
        "40 requests over 20 s, a window of 20:\n{}",
        logs(&servers)
    );
}
