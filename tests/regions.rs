//! One quota across regions (`src/regions/`): three "regions" on this machine, each a
//! tollgate on its own Redis, sharing a `global: true` limit through a global Redis behind a
//! proxy that adds 80 ms each way, with traffic skewed 8:1:1. Checked per window of the
//! limit's length (1 s), never as a whole-run total: the regions together admit at most one
//! bucket's worth (its burst plus one window's refill) in every window, before, during and
//! after a partition from the global store; decisions never wait on the global store; the
//! busy region gets most of the limit while it is shared; and partitioned, each region holds
//! its partition share. A second case runs two replicas per region and swaps the demand
//! between the regions: the shares follow it, within the bound stated for moving shares.

mod common;

use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::inproc::InProcess;
use common::proxy::Proxy;
use common::redis::TestRedis;
use common::{metric_sum, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

/// 100 a second, a burst of 10, shared by the regions. Three independent limits would admit
/// up to 100 in the busy region and 20 in each other one: 140 a second.
const LIMIT: u64 = 100;
const BURST: u64 = 10;
const RULES: &str = "domain: global\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 100, burst: 10, global: true}\n";
const REGIONS: [&str; 3] = ["us", "eu", "ap"];
/// Requests per second offered in each region: 8:1:1, 1.6 times the limit.
const OFFERED: [u64; 3] = [160, 20, 20];

/// Every request: which region, when it was sent (ms from the start), whether it was
/// admitted, and how long its answer took.
type Log = Arc<Mutex<Vec<(usize, u64, bool, Duration)>>>;

/// Admitted per region in the 1 s window starting at `from_s` seconds.
fn window(log: &[(usize, u64, bool, Duration)], from_s: u64) -> [u64; 3] {
    let mut n = [0; 3];
    for &(r, at, ok, _) in log {
        if ok && at / 1000 == from_s {
            n[r] += 1;
        }
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_regions_share_one_quota_per_window_without_waiting_on_the_global_store() {
    let global = TestRedis::start();
    let proxy = Proxy::start(format!("127.0.0.1:{}", global.port()).parse().unwrap()).await;
    proxy.set_delay(Duration::from_millis(80));
    let stores: Vec<TestRedis> = REGIONS.iter().map(|_| TestRedis::start()).collect();
    let servers: Vec<InProcess> = REGIONS
        .iter()
        .zip(&stores)
        .map(|(name, store)| replica(store, &proxy, name, &REGIONS))
        .collect();
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    // 20 s of traffic: shared (0-8 s), the global store cut off (8-14 s), back (14-20 s).
    let seconds = 20;
    let mut senders = Vec::new();
    for (r, server) in servers.iter().enumerate() {
        senders.push(traffic(
            server.client().await,
            r,
            vec![(0, seconds, OFFERED[r])],
            start,
            log.clone(),
        ));
    }
    // The partition: every call to the global store hangs, new connections too.
    tokio::time::sleep(Duration::from_secs(8).saturating_sub(start.elapsed())).await;
    proxy.set_delay(Duration::from_secs(600));
    proxy.cut_all();
    tokio::time::sleep(Duration::from_secs(13).saturating_sub(start.elapsed())).await;
    let partitioned: Vec<f64> = servers
        .iter()
        .map(|s| metric_sum(s.admin, "tollgate_region_partitioned", &[]))
        .collect();
    tokio::time::sleep(Duration::from_secs(14).saturating_sub(start.elapsed())).await;
    proxy.set_delay(Duration::from_millis(80));
    proxy.cut_all();
    for s in senders {
        s.await.unwrap();
    }
    let log = log.lock().unwrap().clone();

    // Every window, the partition and its edges included: at most one bucket's worth.
    let report = windows_within(&log, seconds, &REGIONS, BURST + LIMIT);
    // Shared (3-8 s, after the shares settled): the limit is used, most of it where it is
    // asked for.
    let shared: Vec<[u64; 3]> = (3..8).map(|s| window(&log, s)).collect();
    let used: u64 = shared.iter().flatten().sum();
    let busy: u64 = shared.iter().map(|n| n[0]).sum();
    assert!(
        used >= 5 * LIMIT * 7 / 10,
        "only {used} of {} admitted while shared:\n{report}",
        5 * LIMIT
    );
    assert!(
        busy * 2 >= used,
        "the busy region got {busy} of {used}:\n{report}"
    );
    // Partitioned (11-14 s: the lease and two exchanges after the cut): each region at most
    // its third of the limit (and its third of the burst).
    assert_eq!(
        partitioned,
        [1.0, 1.0, 1.0],
        "every region saw the partition"
    );
    for s in 11..14 {
        let n = window(&log, s);
        assert!(
            n[0] <= LIMIT / 3 + BURST / 3 + 1,
            "the busy region admitted {} in window {s} s, partitioned:\n{report}",
            n[0]
        );
    }
    // No decision waited on the global store: a call there takes at least 160 ms (minutes
    // while cut off), so more than 1 % of decisions waiting on it would put the p99 past it.
    let mut took: Vec<Duration> = log.iter().map(|e| e.3).collect();
    took.sort_unstable();
    let p99 = took[took.len() * 99 / 100];
    eprintln!("p99 of a decision: {p99:?}");
    assert!(
        p99 < Duration::from_millis(150),
        "p99 of a decision {p99:?}: decisions waited on the global store"
    );
}

/// Prints what each region admitted in each 1 s window of the first `seconds`, and fails when
/// a window's total passes `bound`; the printed table, for later messages.
fn windows_within(
    log: &[(usize, u64, bool, Duration)],
    seconds: u64,
    names: &[&str],
    bound: u64,
) -> String {
    let mut report = String::new();
    for s in 0..seconds {
        let n = window(log, s);
        let total: u64 = n.iter().sum();
        let each: Vec<String> = n[..names.len()].iter().map(|x| format!("{x:>3}")).collect();
        report.push_str(&format!("{s:>2} s: {} = {total:>3}\n", each.join(" ")));
    }
    eprintln!("admitted per 1 s window ({}):\n{report}", names.join(" "));
    for s in 0..seconds {
        let total: u64 = window(log, s).iter().sum();
        assert!(
            total <= bound,
            "window {s} s admitted {total} > {bound}:\n{report}"
        );
    }
    report
}

/// A replica of `region` (one of `regions`) on its region's `store`, exchanging through the
/// global store behind `proxy` every 250 ms, with leases of 1.5 s.
fn replica(store: &TestRedis, proxy: &Proxy, region: &str, regions: &[&str]) -> InProcess {
    InProcess::start(RULES, |s| {
        s.store = store.url();
        s.global_store = proxy.url();
        s.region = region.to_string();
        s.regions = regions.join(",");
        s.region_exchange_ms = 250;
        s.region_lease_ms = 1_500;
        s.store_timeout_ms = 500;
    })
}

/// Sends `rate` requests a second through `client` from `from_s` to `to_s` seconds after
/// `start`, for each `(from_s, to_s, rate)`, logging each as region `r`.
fn traffic(
    client: envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<
        tonic::transport::Channel,
    >,
    r: usize,
    segments: Vec<(u64, u64, u64)>,
    start: Instant,
    log: Log,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut calls = Vec::new();
        for (from_s, to_s, rate) in segments {
            tokio::time::sleep(Duration::from_secs(from_s).saturating_sub(start.elapsed())).await;
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            for _ in 0..rate * (to_s - from_s) {
                tick.tick().await;
                let (mut client, log) = (client.clone(), log.clone());
                calls.push(tokio::spawn(async move {
                    let at = start.elapsed();
                    let sent = Instant::now();
                    let answer = client
                        .should_rate_limit(request("global", &[&[("tenant", "acme")]]))
                        .await
                        .expect("every request answered");
                    let ok = answer.get_ref().overall_code == Code::Ok as i32;
                    log.lock()
                        .unwrap()
                        .push((r, at.as_millis() as u64, ok, sent.elapsed()));
                }));
            }
        }
        for c in calls {
            c.await.unwrap();
        }
    })
}

/// Two regions of two replicas each, on one Redis per region; the demand swaps between them
/// halfway. Every window stays within what the docs state while shares move (the burst twice
/// plus one window's refill: a growing share's bucket may start full), and once the shares
/// have moved, the busy region has most of the limit again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shares_follow_the_demand_across_replicas_and_stay_within_the_bound_while_they_move() {
    let global = TestRedis::start();
    let proxy = Proxy::start(format!("127.0.0.1:{}", global.port()).parse().unwrap()).await;
    proxy.set_delay(Duration::from_millis(40));
    let names = ["west", "east"];
    let stores: Vec<TestRedis> = names.iter().map(|_| TestRedis::start()).collect();
    // Replicas 0 and 1 in west, 2 and 3 in east.
    let servers: Vec<InProcess> = (0..4)
        .map(|i| replica(&stores[i / 2], &proxy, names[i / 2], &names))
        .collect();
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let seconds = 14;
    let mut senders = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        // West asks 150 a second for 7 s, then 20; east the other way round; each region's
        // traffic split evenly over its two replicas.
        let (first, then) = if i < 2 { (75, 10) } else { (10, 75) };
        senders.push(traffic(
            server.client().await,
            i / 2,
            vec![(0, 7, first), (7, seconds, then)],
            start,
            log.clone(),
        ));
    }
    for s in senders {
        s.await.unwrap();
    }
    let log = log.lock().unwrap().clone();
    let report = windows_within(&log, seconds, &names, 2 * BURST + LIMIT);
    // Settled: west busy (3-7 s), then east (10-14 s).
    let (west, east): (u64, u64) = (3..7)
        .map(|s| window(&log, s))
        .fold((0, 0), |(w, e), n| (w + n[0], e + n[1]));
    assert!(west > 2 * east, "west busy: {west} vs {east}:\n{report}");
    let (west, east): (u64, u64) = (10..14)
        .map(|s| window(&log, s))
        .fold((0, 0), |(w, e), n| (w + n[0], e + n[1]));
    assert!(east > 2 * west, "east busy: {east} vs {west}:\n{report}");
    let used: u64 = (10..14).map(|s| window(&log, s).iter().sum::<u64>()).sum();
    assert!(
        used >= 4 * LIMIT * 7 / 10,
        "only {used} of {} admitted after the swap:\n{report}",
        4 * LIMIT
    );
}
