//! Redis behind Sentinel (`redis+sentinel://`): a primary, a replica and three Sentinels on
//! loopback. Three tollgates share one quota through it exactly; a forced failover under load
//! loses no request (the fallback answers the gap) and, within seconds of the Sentinels naming
//! the new primary (before the old one is demoted), the quota is exact again in it. The same
//! over mutual TLS (`rediss+sentinel://`): Sentinels, primary and replica all TLS-only to
//! tollgate.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::InProcess;
use common::load::fallback_decisions;
use common::redis::unique_prefix;
use common::request;
use common::sentinel::TestSentinels;
use common::tls::TestCerts;

const LIMIT: usize = 60;
const RULES: &str = "domain: s\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 60}\n";

/// 2 × LIMIT concurrent requests for `tenant` split unevenly over `servers`; how many were
/// admitted. The uneven split tells the shared quota (LIMIT) from a fleet on the fallback's
/// local shares (less than LIMIT): see `fleet::admitted_unevenly`.
async fn admitted(servers: &[InProcess], tenant: &str) -> usize {
    common::fleet::admitted_unevenly(servers, "s", tenant, 2 * LIMIT).await
}

/// Fallback decisions summed over `servers`.
fn fallback(servers: &[InProcess]) -> f64 {
    servers.iter().map(|s| fallback_decisions(s.admin)).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_share_one_quota_through_sentinel_and_survive_a_failover() {
    let set = TestSentinels::start();
    let prefix = unique_prefix("sentinel");
    let servers: Vec<InProcess> = (0..3)
        .map(|_| {
            InProcess::start(RULES, |s| {
                s.store = set.url();
                s.key_prefix = prefix.clone();
                s.store_timeout_ms = 500;
                s.breaker_probe_ms = 100;
            })
        })
        .collect();
    assert_eq!(admitted(&servers, "before").await, LIMIT);
    assert_eq!(
        fallback(&servers),
        0.0,
        "the fallback decided before the failover"
    );

    // Load on other tenants while the Sentinels move the primary: every request answered.
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for server in &servers {
        let mut client = server.client().await;
        let (stop, answered) = (stop.clone(), answered.clone());
        load.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                client
                    .should_rate_limit(request("s", &[&[("tenant", &format!("load{}", i % 50))]]))
                    .await
                    .expect("every request answered during the failover");
                answered.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let failover_started = Instant::now();
    let (set, old) = tokio::task::spawn_blocking(move || {
        let old = set.failover();
        (set, old)
    })
    .await
    .unwrap();
    let new = set.primary_port();
    assert_ne!(new, old);
    eprintln!("new primary named after {:?}", failover_started.elapsed());

    // tollgate moves to the new primary as soon as the Sentinels name it, before the old one
    // is demoted (until then the old one still takes writes, which it would lose): the quota
    // is exact again, in the new primary, within seconds.
    let promoted = Instant::now();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let tenant = format!("after{attempt}");
        let n = admitted(&servers[..1], &tenant).await;
        let keys: Vec<String> =
            common::redis::command(new, &["KEYS", &format!("{prefix}*tenant={tenant}|*")]).unwrap();
        if n == LIMIT && !keys.is_empty() {
            break;
        }
        assert!(
            promoted.elapsed() < Duration::from_secs(8),
            "not exact on the new primary {:?} after it was named (last: {n} of {LIMIT}, in it: {})",
            promoted.elapsed(),
            !keys.is_empty()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "exact on the new primary {:?} after it was named ({attempt} tries)",
        promoted.elapsed()
    );
    let set = tokio::task::spawn_blocking(move || {
        set.wait_demoted(old);
        set
    })
    .await
    .unwrap();
    stop.store(true, Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    let before = fallback(&servers);
    assert_eq!(admitted(&servers, "demoted").await, LIMIT);
    assert_eq!(
        fallback(&servers),
        before,
        "the fallback decided after the old primary was demoted"
    );
    assert!(answered.load(Ordering::Relaxed) > 0);
    // The new primary holds the buckets.
    let keys: Vec<String> = common::redis::command(
        set.primary_port(),
        &["KEYS", &format!("{prefix}*after{attempt}*")],
    )
    .unwrap();
    assert!(!keys.is_empty(), "the new primary has the bucket");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sentinel_over_mutual_tls_shares_one_quota_and_follows_a_failover() {
    let certs = TestCerts::generate();
    let set = TestSentinels::start_tls(&certs);
    let prefix = unique_prefix("sentinel-tls");
    let servers: Vec<InProcess> = (0..2)
        .map(|_| {
            InProcess::start(RULES, |s| {
                s.store = set.url();
                s.store_tls_ca = certs.file("ca.crt");
                s.store_tls_cert = certs.file("client.crt");
                s.store_tls_key = certs.file("client.key");
                s.key_prefix = prefix.clone();
                s.store_timeout_ms = 500;
                s.breaker_probe_ms = 100;
            })
        })
        .collect();
    assert!(set.url().starts_with("rediss+sentinel://"));
    assert_eq!(admitted(&servers, "before").await, LIMIT);
    assert_eq!(
        fallback(&servers),
        0.0,
        "the fallback decided before the failover"
    );
    let keys: Vec<String> = common::redis::command(
        set.primary_port(),
        &["KEYS", &format!("{prefix}*tenant=before|*")],
    )
    .unwrap();
    assert!(!keys.is_empty(), "the primary holds the bucket");

    let (set, old) = tokio::task::spawn_blocking(move || {
        let old = set.failover();
        (set, old)
    })
    .await
    .unwrap();
    let new = set.primary_port();
    assert_ne!(new, old);
    let promoted = Instant::now();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let tenant = format!("after{attempt}");
        let n = admitted(&servers, &tenant).await;
        let keys: Vec<String> =
            common::redis::command(new, &["KEYS", &format!("{prefix}*tenant={tenant}|*")]).unwrap();
        if n == LIMIT && !keys.is_empty() {
            break;
        }
        assert!(
            promoted.elapsed() < Duration::from_secs(8),
            "not exact on the new primary over TLS {:?} after it was named (last: {n} of {LIMIT})",
            promoted.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "over TLS: exact on the new primary {:?} after it was named",
        promoted.elapsed()
    );
}
