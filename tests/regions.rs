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

use common::ideal;
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
    // Shared: every region heard from, nobody cut off, and every replica agrees.
    tokio::time::sleep(Duration::from_secs(CUT.0 - 2).saturating_sub(start.elapsed())).await;
    for s in &servers {
        let regions = readyz_regions(s);
        assert_eq!(regions["partitioned"], false, "{regions}");
        assert!(
            regions["regions"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["heard_from"] == true),
            "{regions}"
        );
        assert_eq!(regions["disagreements"], serde_json::json!([]), "{regions}");
        assert_eq!(regions["keys"], 1, "{regions}");
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
    // `/readyz` shows it while it lasts, and the log said so, naming the global store.
    for s in &servers {
        let regions = readyz_regions(s);
        assert_eq!(regions["partitioned"], true, "{regions}");
        assert!(
            regions["contact_age_ms"].as_u64().unwrap() > 1_500,
            "{regions}"
        );
        assert!(
            s.log().contains("cut off from the global store"),
            "{}",
            s.log()
        );
    }
    tokio::time::sleep(Duration::from_secs(CUT.1).saturating_sub(start.elapsed())).await;
    proxy.set_delay(Duration::from_millis(80));
    proxy.cut_all();
    for s in senders {
        s.await.unwrap();
    }
    let log = log.lock().unwrap().clone();

    // Every window, the partition and its edges included, against one exact bucket fed the
    // same requests: rounding alone while the shares stand still, and a share's growth worth
    // of the burst at the cut's edges (a cut-off region steps up to its third; shares grow
    // back after).
    let report = windows_within(&log, seconds, &REGIONS);
    let moving = |s: usize| {
        let s = s as u64;
        (CUT.0..=CUT.0 + 4).contains(&s) || (CUT.1..=CUT.1 + 5).contains(&s)
    };
    ideal::check(
        "three regions, a 30 s cut",
        &ideal::windows(&sent(&log, None), ONE_BUCKET, seconds as usize),
        |s| allowed(REGIONS.len(), moving(s)),
    );
    for s in &servers {
        assert_eq!(readyz_regions(s)["partitioned"], false, "back in contact");
        // The log says which region this is, which store is global, and when contact ended
        // and came back.
        let log = s.log();
        for line in [
            "sharing global limits across regions",
            "back in contact with the global store",
        ] {
            assert!(log.contains(line), "no `{line}` in:\n{log}");
        }
        assert!(log.contains(&proxy.url()), "the global store named:\n{log}");
    }
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

/// Prints what each region admitted in each 1 s window of the first `seconds`; the printed
/// table, for later messages.
fn windows_within(log: &[(usize, u64, bool, Duration)], seconds: u64, names: &[&str]) -> String {
    let mut report = String::new();
    for s in 0..seconds {
        let n = window(log, s);
        let total: u64 = n.iter().sum();
        let each: Vec<String> = n[..names.len()].iter().map(|x| format!("{x:>3}")).collect();
        report.push_str(&format!("{s:>2} s: {} = {total:>3}\n", each.join(" ")));
    }
    eprintln!("admitted per 1 s window ({}):\n{report}", names.join(" "));
    report
}

/// The shared limit as one exact bucket: 100 a second, a burst of 10.
const ONE_BUCKET: ideal::Limit = ideal::Limit {
    capacity: BURST as f64,
    refill: LIMIT as f64,
    window_ms: 1_000,
};

/// What `regions` regions may admit in a window over one exact bucket fed the same requests
/// (docs/regions.md, "The bound"): a token a region (a share's burst rounds up to one) and one
/// at each edge of the window, and, in a window where shares grow, the growth's worth of the
/// burst (a region's full bucket is full at its new capacity).
fn allowed(regions: usize, shares_grow: bool) -> u64 {
    regions as u64 + 2 + if shares_grow { BURST } else { 0 }
}

/// Regions on this machine: a global Redis behind a proxy adding `delay_ms` each way, one
/// Redis per region, and `per_region` replicas of each region (replica `i` is in region
/// `i / per_region`) on `rules` (one text for all, or one per region), each set up by
/// `configure(i, settings)` after [`regional`]'s settings.
/// Fields drop in order: the replicas stop before the Redis servers do.
struct Regions {
    servers: Vec<InProcess>,
    _stores: Vec<TestRedis>,
    _proxy: Proxy,
    global: TestRedis,
}

async fn regions(
    names: &[&str],
    per_region: usize,
    delay_ms: u64,
    rules: &[&str],
    configure: impl Fn(usize, &mut tollgate::settings::Settings),
) -> Regions {
    let global = TestRedis::start();
    let proxy = Proxy::start(format!("127.0.0.1:{}", global.port()).parse().unwrap()).await;
    proxy.set_delay(Duration::from_millis(delay_ms));
    let stores: Vec<TestRedis> = names.iter().map(|_| TestRedis::start()).collect();
    let servers = (0..names.len() * per_region)
        .map(|i| {
            let r = i / per_region;
            let rules = rules.get(r).unwrap_or(&rules[0]);
            regional(&stores[r], &proxy, names[r], names, rules, |s| {
                configure(i, s)
            })
        })
        .collect();
    Regions {
        servers,
        _stores: stores,
        _proxy: proxy,
        global,
    }
}

/// The `regions` object of a replica's `/readyz`.
fn readyz_regions(s: &InProcess) -> serde_json::Value {
    let (_, body) = common::get(s.admin, "/readyz");
    let v: serde_json::Value = serde_json::from_str(&body).expect("/readyz is JSON");
    v["regions"].clone()
}

/// A replica of `region` (one of `regions`) on its region's `store`, exchanging through the
/// global store behind `proxy` every 250 ms, with leases of 1.5 s.
fn replica(store: &TestRedis, proxy: &Proxy, region: &str, regions: &[&str]) -> InProcess {
    regional(store, proxy, region, regions, RULES, |s| {
        s.region_exchange_ms = 250;
        s.region_lease_ms = 1_500;
        s.store_timeout_ms = 500;
    })
}

/// A replica of `region` on its region's `store` with `rules`, sharing through the global
/// store behind `proxy`, at the default exchange and lease unless `configure` sets them.
fn regional(
    store: &TestRedis,
    proxy: &Proxy,
    region: &str,
    regions: &[&str],
    rules: &str,
    configure: impl FnOnce(&mut tollgate::settings::Settings),
) -> InProcess {
    InProcess::start(rules, |s| {
        s.store = store.url();
        s.global_store = proxy.url();
        s.region = region.to_string();
        s.regions = regions.join(",");
        configure(s);
    })
}

/// Sends `rate` requests a second through `client` from `from_s` to `to_s` seconds after
/// `start`, for each `(from_s, to_s, rate)`, logging each as region `r`.
fn traffic(
    client: Client,
    r: usize,
    segments: Vec<(u64, u64, u64)>,
    start: Instant,
    log: Log,
) -> tokio::task::JoinHandle<()> {
    let spaced = segments
        .into_iter()
        .map(|(from_s, to_s, rate)| (from_s * 1_000, rate * (to_s - from_s), 1_000_000 / rate))
        .collect();
    spaced_traffic(client, r, ("global", "acme"), spaced, start, log)
}

type Client = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<
    tonic::transport::Channel,
>;

/// Sends, for each `(from_ms, count, every_us)`, `count` requests one every `every_us` from
/// `from_ms` after `start`, for `tenant` in `domain`, logging each as region `r`.
fn spaced_traffic(
    client: Client,
    r: usize,
    (domain, tenant): (&'static str, &'static str),
    segments: Vec<(u64, u64, u64)>,
    start: Instant,
    log: Log,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut calls = Vec::new();
        for (from_ms, count, every_us) in segments {
            tokio::time::sleep(Duration::from_millis(from_ms).saturating_sub(start.elapsed()))
                .await;
            let mut tick = tokio::time::interval(Duration::from_micros(every_us));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            for _ in 0..count {
                tick.tick().await;
                let (mut client, log) = (client.clone(), log.clone());
                calls.push(tokio::spawn(async move {
                    let at = start.elapsed();
                    let sent = Instant::now();
                    let answer = client
                        .should_rate_limit(request(domain, &[&[("tenant", tenant)]]))
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

/// The log as the ideal checker reads it: every request, or one region's.
fn sent(log: &[(usize, u64, bool, Duration)], region: Option<usize>) -> Vec<ideal::Sent> {
    log.iter()
        .filter(|e| region.is_none_or(|r| e.0 == r))
        .map(|&(_, at_ms, admitted, _)| ideal::Sent { at_ms, admitted })
        .collect()
}

/// Two regions of two replicas each, on one Redis per region, at the default exchange and
/// lease; the demand swaps between them halfway. From the third exchange after the swap each
/// region admits within 10 % of its ideal part (max-min fair on what each asks: 20 for the
/// quiet one, the other 80), and every window is within one exact bucket's admissions plus
/// rounding, and a share's growth of the burst in the windows of the swap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shares_follow_the_demand_across_replicas_and_stay_within_one_bucket_while_they_move() {
    let names = ["west", "east"];
    // Replicas 0 and 1 in west, 2 and 3 in east; the default exchange (1 s) and lease (10 s).
    let fleet = regions(&names, 2, 40, &[RULES], |_, s| s.store_timeout_ms = 500).await;
    let servers = &fleet.servers;
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let (swap, seconds) = (8, 16);
    let mut senders = Vec::new();
    for (i, server) in servers.iter().enumerate() {
        // West asks 150 a second, then 20; east the other way round; each region's traffic
        // split evenly over its two replicas.
        let (first, then) = if i < 2 { (75, 10) } else { (10, 75) };
        senders.push(traffic(
            server.client().await,
            i / 2,
            vec![(0, swap, first), (swap, seconds, then)],
            start,
            log.clone(),
        ));
    }
    for s in senders {
        s.await.unwrap();
    }
    let log = log.lock().unwrap().clone();
    let report = windows_within(&log, seconds, &names);
    ideal::check(
        "a demand swap at the defaults",
        &ideal::windows(&sent(&log, None), ONE_BUCKET, seconds as usize),
        |s| {
            allowed(
                names.len(),
                (swap as usize..=swap as usize + 3).contains(&s),
            )
        },
    );
    // Within 10 % of the ideal part from the third exchange on: before the swap from 3 s (the
    // key's first exchanges), after it from 11 s.
    let ideal_part = |busy: bool| if busy { LIMIT - 20 } else { 20 };
    for (range, west_busy) in [(3..swap, true), (swap + 3..seconds, false)] {
        for s in range {
            let n = window(&log, s);
            for (r, busy) in [(0, west_busy), (1, !west_busy)] {
                let want = ideal_part(busy);
                assert!(
                    n[r] * 10 >= want * 9 && n[r] * 10 <= want * 11,
                    "{} admitted {} in window {s} s, its ideal part {want}:\n{report}",
                    names[r],
                    n[r]
                );
            }
        }
    }
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
    let report = windows_within(&log, seconds, &names);
    // The cut replica steps down at once; the others make room for its region a lease and
    // two exchanges after its last beat (~5 s), then forget it (~20 s): shares move there.
    ideal::check(
        "one replica cut off for long",
        &ideal::windows(&sent(&log, None), ONE_BUCKET, seconds as usize),
        |s| allowed(names.len(), (3..=7).contains(&s) || (18..=24).contains(&s)),
    );
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

/// A small global limit (60 a minute, the default burst of 60) asked for sparsely, at the
/// default exchange (1 s) and lease (10 s), the global store 60 ms away: us asks 2 a second,
/// eu one request every 3.3 s (0.3 a second, 18 in the minute). Each region's fair share of
/// the run is half the limit's refill over it (30; the initial burst not counted): each must
/// admit at least 90 % of the smaller of what it asked and that. Demand measured per exchange
/// alone read eu as asking nothing most of the time and held it to its floor (1–2 of 9
/// admitted over 30 s, measured before). The minute's one window stays within one exact
/// bucket; the exchanges run on their interval, start to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sparse_tenant_on_a_small_global_limit_gets_what_it_asks_under_its_share() {
    const SPARSE: &str = "domain: sparse\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 60, global: true}\n";
    let names = ["us", "eu"];
    let fleet = regions(&names, 1, 30, &[SPARSE], |_, _| {}).await;
    let servers = &fleet.servers;
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let senders = vec![
        spaced_traffic(
            servers[0].client().await,
            0,
            ("sparse", "acme"),
            vec![(0, 120, 500_000)],
            start,
            log.clone(),
        ),
        spaced_traffic(
            servers[1].client().await,
            1,
            ("sparse", "acme"),
            vec![(0, 18, 3_333_333)],
            start,
            log.clone(),
        ),
    ];
    for s in senders {
        s.await.unwrap();
    }
    let elapsed = start.elapsed();
    let log = log.lock().unwrap().clone();
    let fair = 30;
    for (r, name) in names.iter().enumerate() {
        let asked = log.iter().filter(|e| e.0 == r).count() as u64;
        let admitted = log.iter().filter(|e| e.0 == r && e.2).count() as u64;
        eprintln!("{name}: admitted {admitted} of {asked}");
        let due = asked.min(fair);
        assert!(
            admitted * 10 >= due * 9,
            "{name} admitted {admitted} of {asked} asked; at least 90 % of {due} due"
        );
    }
    let minute = ideal::Limit {
        capacity: 60.0,
        refill: 60.0,
        window_ms: 60_000,
    };
    let windows = ideal::windows(&sent(&log, None), minute, 1);
    eprintln!("{}", ideal::table(&windows));
    ideal::check("sparse", &windows, |_| names.len() as u64 + 2);
    // Start to start: about one exchange a second (they ran every ~1.25 s when the interval
    // was slept after each one).
    let exchanges = metric_sum(
        servers[0].admin,
        "tollgate_region_exchanges_total",
        &["result=\"ok\""],
    );
    let seconds = elapsed.as_secs_f64();
    eprintln!("us: {exchanges} exchanges in {seconds:.1} s");
    assert!(
        exchanges >= seconds - 3.0 && exchanges <= seconds + 2.0,
        "{exchanges} exchanges in {seconds:.1} s at region_exchange_ms 1000"
    );
    // What the global store ran, per replica and second (docs/regions.md, "What it costs").
    let stats: String = fleet.global.cmd(&["INFO", "commandstats"]);
    eprintln!("global store commands in {seconds:.1} s, 2 replicas, 1 key:\n{stats}");
}

/// A tenant new to every region: nothing is known of it, so its first requests are decided on
/// its region's partition share (half the limit here) and its first exchange, at once, leaves
/// it what the others do not use. Its first second admits at least half of the burst (it
/// admitted 3 of 40 when a new key started at the floor).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_tenant_starts_on_its_partition_share_not_the_floor() {
    const FRESH: &str = "domain: fresh\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 100, global: true}\n";
    let names = ["us", "eu"];
    let fleet = regions(&names, 1, 30, &[FRESH], |_, _| {}).await;
    let servers = &fleet.servers;
    // Both replicas in contact before the tenant's first request.
    let deadline = Instant::now() + Duration::from_secs(10);
    while servers
        .iter()
        .any(|s| readyz_regions(s)["contact_age_ms"].is_null())
    {
        assert!(Instant::now() < deadline, "no heartbeat answered in 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    // 150 requests in the first second, all in us.
    spaced_traffic(
        servers[0].client().await,
        0,
        ("fresh", "newcomer"),
        vec![(0, 150, 6_667)],
        start,
        log.clone(),
    )
    .await
    .unwrap();
    let log = log.lock().unwrap().clone();
    let first_second = log.iter().filter(|e| e.1 < 1_000 && e.2).count();
    eprintln!("admitted {first_second} of 150 in the new tenant's first second");
    assert!(
        first_second >= 50,
        "a new tenant's first second admitted {first_second}; at least half the burst (50) due"
    );
}

/// Two regions whose weights disagree (`a=4,b` on one side, `a,b=4` on the other): before,
/// each took its four fifths and together they admitted 160 a second on a limit of 100. Now
/// each says so (an ERROR naming both sides, `tollgate_region_disagreements`, `/readyz`) and
/// holds the smaller share its own and the other's settings give it: together they admit no
/// more than one exact bucket in any window.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn regions_that_disagree_on_weights_raise_the_alarm_and_over_admit_nothing() {
    let names = ["a", "b"];
    let lists = ["a=4,b", "a,b=4"];
    let fleet = regions(&names, 1, 20, &[RULES], |r, s| {
        s.regions = lists[r].to_string();
        s.region_exchange_ms = 250;
        s.region_lease_ms = 1_500;
    })
    .await;
    let servers = &fleet.servers;
    // Each has heard the other's settings before the tenant's first request (a replica that
    // has heard nothing yet decides a new key on its own partition share: four fifths).
    until_each_sees_a_disagreement(servers).await;
    let seconds = 8;
    let log = each_asks(servers, 150, seconds).await;
    windows_within(&log, seconds, &names);
    ideal::check(
        "weights that disagree",
        &ideal::windows(&sent(&log, None), ONE_BUCKET, seconds as usize),
        |_| allowed(names.len(), false),
    );
    for (r, s) in servers.iter().enumerate() {
        let regions = readyz_regions(s);
        let other = &regions["disagreements"][0];
        assert_eq!(other["region"], names[1 - r], "{regions}");
        assert!(
            other["settings"].as_str().unwrap().contains(if r == 0 {
                "regions=a:1,b:4"
            } else {
                "regions=a:4,b:1"
            }),
            "{regions}"
        );
        assert_eq!(
            metric_sum(s.admin, "tollgate_region_disagreements", &[]),
            1.0
        );
        assert!(
            s.log()
                .contains("regions disagree on how global limits are shared"),
            "{}",
            s.log()
        );
    }
}

/// The checker the cases above are held to: one exact bucket is its own ideal and never over;
/// twice the limit is over in every window and fails the check.
#[test]
fn the_ideal_checker_catches_an_overshoot_and_passes_one_exact_bucket() {
    let even = |rate: u64, seconds: u64| -> Vec<ideal::Sent> {
        (0..rate * seconds)
            .map(|i| ideal::Sent {
                at_ms: i * 1_000 / rate,
                admitted: true,
            })
            .collect()
    };
    let mut exact = ideal::Bucket::new(ONE_BUCKET);
    let sent: Vec<ideal::Sent> = even(200, 3)
        .into_iter()
        .map(|s| ideal::Sent {
            admitted: exact.take(s.at_ms),
            ..s
        })
        .collect();
    let w = ideal::windows(&sent, ONE_BUCKET, 3);
    assert_eq!(
        w[0].ideal, 109,
        "the burst and the refill until the last request at 995 ms"
    );
    assert!((99..=101).contains(&w[1].ideal), "{w:?}");
    assert!(
        w.iter().all(|w| w.over == 0 && w.admitted == w.ideal),
        "{w:?}"
    );
    ideal::check("one exact bucket", &w, |_| 0);
    let twice = ideal::windows(&even(200, 3), ONE_BUCKET, 3);
    assert_eq!(twice[0].over, 91);
    assert!(twice[1].over >= 99, "{twice:?}");
    let caught = std::panic::catch_unwind(|| ideal::check("2x", &twice, |_| allowed(3, true)));
    assert!(caught.is_err());
}

/// Two regions whose rules give the shared limit other numbers (100 a second in one, 120 in
/// the other: a rules rollout half done). Their buckets' keys differ, so neither sees the
/// other's demand, and each, alone on its key, took nearly the whole limit: 95 and 114 a
/// second. Now each sees the other's rules digest differ, says so, and holds its partition
/// share of its own limit: at most half of it (plus its half of the burst) in any window.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn regions_whose_global_limits_differ_hold_their_partition_share() {
    let names = ["a", "b"];
    let other = RULES.replace("requests_per_unit: 100", "requests_per_unit: 120");
    let fleet = regions(&names, 1, 20, &[RULES, &other], |_, s| {
        s.region_exchange_ms = 250;
        s.region_lease_ms = 1_500;
    })
    .await;
    let servers = &fleet.servers;
    until_each_sees_a_disagreement(servers).await;
    let seconds = 6;
    let log = each_asks(servers, 150, seconds).await;
    let report = windows_within(&log, seconds, &names);
    for s in 1..seconds {
        let n = window(&log, s);
        // Half of each region's own limit, and half of its burst of 10.
        assert!(
            n[0] <= 50 + 5 + 2 && n[1] <= 60 + 5 + 2,
            "window {s} s admitted {n:?}:\n{report}"
        );
    }
    for s in servers {
        let settings = readyz_regions(s)["disagreements"][0]["settings"].clone();
        assert!(
            settings.as_str().is_some_and(|t| t.contains("rules=")),
            "{settings}"
        );
    }
}

/// Waits (at most 10 s) until every one of `servers` counts a replica that disagrees.
async fn until_each_sees_a_disagreement(servers: &[InProcess]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while servers
        .iter()
        .any(|s| metric_sum(s.admin, "tollgate_region_disagreements", &[]) < 1.0)
    {
        assert!(Instant::now() < deadline, "no disagreement seen in 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `rate` requests a second for `seconds` through each of `servers` (server `r` logged as
/// region `r`); the log.
async fn each_asks(
    servers: &[InProcess],
    rate: u64,
    seconds: u64,
) -> Vec<(usize, u64, bool, Duration)> {
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut senders = Vec::new();
    for (r, server) in servers.iter().enumerate() {
        senders.push(traffic(
            server.client().await,
            r,
            vec![(0, seconds, rate)],
            start,
            log.clone(),
        ));
    }
    for s in senders {
        s.await.unwrap();
    }
    log.lock().unwrap().clone()
}
