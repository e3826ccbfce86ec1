//! One quota across regions (`src/regions/`): three "regions" on this machine, each a
//! tollgate on its own Redis, sharing a `global: true` limit through a global Redis behind a
//! proxy that adds 80 ms each way, with traffic skewed 8:1:1. Checked per window of the
//! limit's length (1 s), never as a whole-run total: the regions together admit at most one
//! bucket's worth (its burst plus one window's refill) in every window, before, during and
//! after a partition from the global store; decisions never wait on the global store; the
//! busy region gets most of the limit while it is shared; and partitioned for 30 s, each
//! region holds its partition share. The same scenario simulated (`tollgate simulate`'s
//! `regions:`) agrees with the real run per phase. A second case runs two replicas per region
//! and swaps the demand between the regions: the shares follow it, within the bound stated
//! for moving shares. A third cuts one replica of a region off for longer than the others remember
//! its heartbeat while its peer stays in contact: it falls to the floor.

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
    // 44 s of traffic: shared (0-8 s), the global store cut off (8-38 s), back (38-44 s).
    let seconds = SECONDS;
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
    tokio::time::sleep(Duration::from_secs(CUT.0).saturating_sub(start.elapsed())).await;
    proxy.set_delay(Duration::from_secs(600));
    proxy.cut_all();
    tokio::time::sleep(Duration::from_secs(CUT.1 - 1).saturating_sub(start.elapsed())).await;
    let partitioned: Vec<f64> = servers
        .iter()
        .map(|s| metric_sum(s.admin, "tollgate_region_partitioned", &[]))
        .collect();
    tokio::time::sleep(Duration::from_secs(CUT.1).saturating_sub(start.elapsed())).await;
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
    // Partitioned (from the lease and two exchanges after the cut, for the 30 s): each region
    // at most its third of the limit (and its third of the burst).
    assert_eq!(
        partitioned,
        [1.0, 1.0, 1.0],
        "every region saw the partition"
    );
    for s in CUT.0 + 3..CUT.1 {
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
    the_simulation_agrees(&log, &report);
}

/// The first case's length, and when the global store is cut off (from, to: seconds).
const SECONDS: u64 = 44;
const CUT: (u64, u64) = (8, 38);

/// The first case as a `tollgate simulate` scenario: the same rules, settings, traffic (evenly
/// spaced, as the test sends it), round trips and cut.
fn scenario_text() -> String {
    let streams: String = REGIONS
        .iter()
        .zip(OFFERED)
        .map(|(name, rate)| {
            format!("  - {{region: {name}, domain: global, entries: [{{key: tenant, value: acme}}], rate_per_s: {rate}, arrivals: even}}\n")
        })
        .collect();
    format!(
        "duration_s: {SECONDS}\nseed: 1\nrules: rules/\nsettings:\n  region_exchange_ms: 250\n  region_lease_ms: 1500\n  store_timeout_ms: 500\nstore:\n  latency_ms: {{p50: 0.3, p99: 1.0}}\nreplicas: {{start: 1}}\nregions:\n  names: [{}]\n  global_latency_ms: {{p50: 160, p99: 165}}\n  global_faults:\n    - {{at_s: {}, for_s: {}}}\ntraffic:\n{streams}",
        REGIONS.join(", "),
        CUT.0,
        CUT.1 - CUT.0,
    )
}

/// Simulates the first case and holds it to the real run (`log`) per phase: the mean admitted
/// per window in all and in the busy region, while shared and while cut off, within 10 %
/// (the busy region's within 15 %); and every simulated window within the same bound.
fn the_simulation_agrees(log: &[(usize, u64, bool, Duration)], real_report: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir_all(dir.path().join("rules")).expect("rules dir");
    std::fs::write(dir.path().join("rules/r.yaml"), RULES).expect("rules");
    let file = dir.path().join("regions.yaml");
    std::fs::write(&file, scenario_text()).expect("scenario");
    let scenario = tollgate::sim::Scenario::load(&file).unwrap_or_else(|e| panic!("{e}"));
    let report = tollgate::sim::run(&scenario, false).expect("simulated");
    let regions = &report.regions.as_ref().expect("a regions report").regions;
    let simulated =
        |s: u64| -> [u64; 3] { std::array::from_fn(|r| regions[r].admitted_per_s[s as usize]) };
    let mut table = String::new();
    for s in 0..SECONDS {
        let n = simulated(s);
        table.push_str(&format!(
            "{s:>2} s: {:>3} {:>3} {:>3} = {:>3}\n",
            n[0],
            n[1],
            n[2],
            n.iter().sum::<u64>()
        ));
    }
    eprintln!("simulated, admitted per 1 s window (us eu ap):\n{table}");
    for s in 0..SECONDS {
        let total: u64 = simulated(s).iter().sum();
        assert!(
            total <= BURST + LIMIT,
            "simulated window {s} s admitted {total}:\n{table}"
        );
    }
    // Phases: shared once settled, and cut off once the lease and two exchanges have passed.
    for (phase, range) in [("shared", 3..CUT.0), ("cut off", CUT.0 + 3..CUT.1)] {
        let n = range.end - range.start;
        let mean = |f: &dyn Fn(u64) -> [u64; 3], pick: &dyn Fn([u64; 3]) -> u64| {
            range.clone().map(|s| pick(f(s))).sum::<u64>() as f64 / n as f64
        };
        let real = |s: u64| window(log, s);
        let all = |w: [u64; 3]| w.iter().sum::<u64>();
        let busy = |w: [u64; 3]| w[0];
        let (real_all, sim_all) = (mean(&real, &all), mean(&simulated, &all));
        let (real_busy, sim_busy) = (mean(&real, &busy), mean(&simulated, &busy));
        eprintln!(
            "{phase}: admitted per window real {real_all:.1} simulated {sim_all:.1}; the busy region real {real_busy:.1} simulated {sim_busy:.1}"
        );
        assert!(
            (sim_all - real_all).abs() <= real_all * 0.10,
            "{phase}: simulated {sim_all:.1} per window, real {real_all:.1}:\nreal:\n{real_report}\nsimulated:\n{table}"
        );
        assert!(
            (sim_busy - real_busy).abs() <= real_busy * 0.15,
            "{phase}: the busy region simulated {sim_busy:.1} per window, real {real_busy:.1}:\nreal:\n{real_report}\nsimulated:\n{table}"
        );
    }
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

/// One replica of a region cut off from the global store for longer than the others remember
/// its ended heartbeat (ten leases: 15 s here), while the other replica of its region stays in
/// contact: its region is shared by demand again without it, so it must fall to the floor,
/// not keep its region's partition share (which the others no longer keep for it). Every
/// window stays within `C + L`, and once the others have forgotten its heartbeat the region
/// admits about what its replica in contact earns, not its half.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_replica_cut_off_for_long_falls_to_the_floor_while_its_peer_is_in_contact() {
    let global = TestRedis::start();
    let upstream = format!("127.0.0.1:{}", global.port()).parse().unwrap();
    let names = ["west", "east"];
    let stores: Vec<TestRedis> = names.iter().map(|_| TestRedis::start()).collect();
    // A proxy of its own per replica: replica 2 (east) alone is cut off.
    let mut proxies = Vec::new();
    for _ in 0..4 {
        let p = Proxy::start(upstream).await;
        p.set_delay(Duration::from_millis(40));
        proxies.push(p);
    }
    let servers: Vec<InProcess> = (0..4)
        .map(|i| replica(&stores[i / 2], &proxies[i], names[i / 2], &names))
        .collect();
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let seconds = 32;
    let mut senders = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        // West asks 180 a second, east 40, each split over its two replicas.
        let rate = if i < 2 { 90 } else { 20 };
        senders.push(traffic(
            server.client().await,
            i / 2,
            vec![(0, seconds, rate)],
            start,
            log.clone(),
        ));
    }
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(start.elapsed())).await;
    proxies[2].set_delay(Duration::from_secs(600));
    proxies[2].cut_all();
    for s in senders {
        s.await.unwrap();
    }
    let log = log.lock().unwrap().clone();
    let report = windows_within(&log, seconds, &names, BURST + LIMIT);
    // From 22 s (the lease, then the ten leases of memory after the cut at 3 s, and a few
    // exchanges): east is shared by its replica in contact's demand (20 a second with the
    // headroom) plus the floor of the one cut off; its half would be 50, its ask 40.
    for s in 23..seconds {
        let n = window(&log, s);
        assert!(
            n[1] <= 32,
            "east admitted {} in window {s} s with one replica cut off for long:\n{report}",
            n[1]
        );
    }
    // West gets the rest of the limit meanwhile.
    let west: u64 = (23..seconds).map(|s| window(&log, s)[0]).sum();
    assert!(
        west >= (seconds - 23) * 65,
        "west admitted {west} over 23-{seconds} s:\n{report}"
    );
}
