//! `tollgate simulate`: plan a fleet on one virtual clock with the real limiter code.
//!
//! A scenario file ([`scenario`]) names the rules, the settings, a simulated store (nodes,
//! latency, capacity, faults), the fleet size over time and the traffic. The run starts one
//! [`Limiter`] per replica, each with its own leases, over-limit cache, shard picks, local
//! fallback and membership heartbeat, exactly as `serve` builds them (`configs::limiter_config`,
//! `fleet::membership`, `Limiter::housekeeping`), all on one manual [`Clock`] and one
//! single-threaded tokio runtime, so the same seed gives the same result. Only the store is a
//! model ([`store`]: its buckets are the quota core's, its network and queue are drawn).
//!
//! Flow of one run ([`run`]):
//! 1. Arrivals: each traffic stream is a Poisson process at its rate (or evenly spaced); a
//!    request's values come from its templates (`{zipf}`, `{uniform}`), its replica from the
//!    routing.
//! 2. The driver jumps the clock to the next thing due (an arrival, a sleep of a task: a store
//!    reply, a lease expiry, a heartbeat; a scaling event; a second's end) and lets the woken
//!    tasks run until nothing moves (`settle`).
//! 3. Each arrival is decided by its replica's `Limiter::decide` (polled once at once: a lease
//!    hit ends there; otherwise it becomes a task that ends when its store call does), and by
//!    the ideal: one exact bucket per limit on a memory store, at the arrival time.
//! 4. [`report`] turns the counts into the JSON report, CSV and text; [`plot`] draws the
//!    series.
//!
//! With `regions:`, each region has its own store and fleet, every replica runs the real
//! exchange of the global limits' shares (`regions::run`) against a model of the global store
//! ([`regions`]: `lua/regions.lua`'s entries behind a drawn cross-region round trip and the
//! scenario's cuts), each stream reaches its region's replicas, and the ideal is one bucket
//! of a global limit across regions (any other limit: one per region).
//!
//! Here: the command ([`run_cli`], [`run`], [`write_out`]). `state.rs`: the run's state and the
//! replicas' start and stop; `arrivals.rs`: the streams and each arrival (its values, its
//! replica, the ideal's answer, the fleet's decision and its count); `drive.rs`: the loop over
//! virtual time and `settle`; `charts.rs`: the pictures made from the report; `regions.rs`:
//! the global store of a `regions:` scenario.
//!
//! [`Limiter`]: crate::limiter::Limiter
//! [`Clock`]: crate::clock::Clock

mod arrivals;
mod charts;
mod drive;
pub mod plot;
mod regions;
pub mod report;
pub mod scenario;
mod state;
pub mod store;
mod stream;
mod windows;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use charts::charts;
pub use report::Report;
pub use scenario::Scenario;
use state::Sim;
pub use windows::{SideReport, WindowReport, Worst};

/// `tollgate simulate` flags.
#[derive(clap::Args, Clone, Debug)]
pub struct SimulateArgs {
    /// The scenario file (YAML; see docs/simulate.md).
    pub scenario: PathBuf,
    /// Print the report as one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Also write series.csv, report.json and the pictures (SVG) into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Override the scenario's seed.
    #[arg(long)]
    pub seed: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// Every problem of the scenario file (and of the rules it names), with file:line.
    #[error("{}", scenario_problems(.0))]
    Scenario(#[from] crate::rules::RulesError),
    #[error("simulate: {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("simulate: cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error("simulate: the simulation panicked (a bug: please report it with the scenario)")]
    Panicked,
}

fn scenario_problems(e: &crate::rules::RulesError) -> String {
    let n = e.errors.len();
    let mut out = format!("{n} error{} in the scenario", if n == 1 { "" } else { "s" });
    for problem in &e.errors {
        out.push_str(&format!("\n  {problem}"));
    }
    out
}

/// Runs `tollgate simulate`: reads the scenario, simulates it and prints (and writes) the
/// report. Runs on a runtime of its own (one thread, the virtual clock), not the caller's.
pub fn run_cli(args: &SimulateArgs) -> Result<(), SimError> {
    let mut scenario = Scenario::load(&args.scenario)?;
    if let Some(seed) = args.seed {
        scenario.seed = seed;
    }
    if let Some(dir) = &args.out {
        // Before the run: a directory that cannot be made should not cost a whole simulation.
        std::fs::create_dir_all(dir).map_err(|source| SimError::Write {
            path: dir.clone(),
            source,
        })?;
    }
    let progress = std::io::stderr().is_terminal();
    let report = run(&scenario, progress)?;
    if let Some(dir) = &args.out {
        write_out(dir, &scenario, &report)?;
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        );
    } else {
        print!("{}", report.text());
    }
    Ok(())
}

/// Simulates `scenario` on a fresh single-threaded runtime, on a thread of its own (a
/// runtime cannot start inside the caller's, and the seeded shard picks stay on that thread).
pub fn run(scenario: &Scenario, progress: bool) -> Result<Report, SimError> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .map_err(SimError::Runtime)?;
                crate::limiter::seed_shard_picks(Some(scenario.seed));
                Ok(runtime.block_on(Sim::new(scenario).drive(progress)))
            })
            .join()
            .unwrap_or(Err(SimError::Panicked))
    })
}

/// Writes `report.json`, `series.csv` and the pictures into `dir`.
pub fn write_out(dir: &Path, scenario: &Scenario, report: &Report) -> Result<(), SimError> {
    let write = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|source| SimError::Write { path, source })
    };
    std::fs::create_dir_all(dir).map_err(|source| SimError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    write(
        "report.json",
        serde_json::to_string_pretty(report).unwrap_or_default(),
    )?;
    write("series.csv", report.csv())?;
    for (name, chart) in charts(scenario, report) {
        write(name, plot::svg(&chart))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scenario in a temporary directory, with one rules file.
    pub(super) fn scenario(rules: &str, body: &str) -> (tempfile::TempDir, Scenario) {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("rules")).expect("rules dir");
        std::fs::write(dir.path().join("rules/r.yaml"), rules).expect("rules");
        let file = dir.path().join("s.yaml");
        std::fs::write(&file, format!("rules: rules/\n{body}")).expect("scenario");
        let s = Scenario::load(&file).unwrap_or_else(|e| panic!("{e}"));
        (dir, s)
    }

    const WIDE: &str = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 1000}\n";

    #[test]
    fn a_decision_on_the_store_takes_one_round_trip() {
        let (_dir, s) = scenario(
            WIDE,
            "duration_s: 5\nstore:\n  latency_ms: {p50: 1.0, p99: 1.0}\nreplicas: {start: 1}\ntraffic:\n  - {domain: edge, entries: [{key: tenant, value: \"t{uniform}\"}], tenants: 100, rate_per_s: 50}\n",
        );
        let r = run(&s, false).expect("ran");
        assert_eq!(r.total.admitted, r.total.offered);
        // One round trip (1 ms) and one script (10 µs at 100,000 a second).
        assert!(
            (1.0..1.1).contains(&r.total.latency_ms.p50) && r.total.latency_ms.p99 < 1.1,
            "{:?}",
            r.total.latency_ms
        );
    }

    const SHARED: &str = "domain: g\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 100, burst: 10, global: true}\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 100}\n";

    /// Two regions, `rate_us` and `rate_eu` a second on `key`, the global store 100 ms away
    /// and cut off from 20 s to 30 s.
    fn two_regions(key: &str, rate_us: u32, rate_eu: u32) -> Report {
        two_regions_weighing(key, rate_us, rate_eu, [1, 1])
    }

    /// The same, the regions weighing `weights`.
    fn two_regions_weighing(key: &str, rate_us: u32, rate_eu: u32, weights: [u32; 2]) -> Report {
        let [w_us, w_eu] = weights;
        let (_dir, s) = scenario(
            SHARED,
            &format!(
                "duration_s: 30\nsettings: {{region_exchange_ms: 250, region_lease_ms: 1500}}\nstore: {{}}\nreplicas: {{start: 2}}\nregions:\n  names: [us, eu]\n  weights: [{w_us}, {w_eu}]\n  global_latency_ms: {{p50: 100, p99: 120}}\n  global_faults: [{{at_s: 20, for_s: 10}}]\ntraffic:\n  - {{region: us, domain: g, entries: [{{key: {key}, value: a}}], rate_per_s: {rate_us}, arrivals: even}}\n  - {{region: eu, domain: g, entries: [{{key: {key}, value: a}}], rate_per_s: {rate_eu}, arrivals: even}}\n"
            ),
        );
        run(&s, false).expect("ran")
    }

    #[test]
    fn regions_share_a_global_limit_by_demand_and_each_holds_its_half_when_cut_off() {
        let r = two_regions("tenant", 180, 20);
        let regions = &r.regions.as_ref().expect("regions").regions;
        let window = |t: usize| [regions[0].admitted_per_s[t], regions[1].admitted_per_s[t]];
        for t in 0..30 {
            let [us, eu] = window(t);
            assert!(us + eu <= 110, "window {t} s: {us} + {eu}");
        }
        // Shared, settled: the busy region has most of the limit, the other what it asks.
        for t in 5..20 {
            let [us, eu] = window(t);
            assert!(
                us >= 60 && eu >= 18 && us + eu >= 85,
                "window {t} s: {us} + {eu}"
            );
        }
        // Cut off (after the lease and two exchanges): each at most its half.
        for t in 24..30 {
            let [us, _] = window(t);
            assert!((40..=56).contains(&us), "window {t} s: us {us}");
        }
        // The global store ran the replicas' heartbeats and demand (not while cut off).
        let g = &r
            .regions
            .as_ref()
            .expect("regions")
            .global_store_calls_per_s;
        assert!(g.mean > 5.0, "{g:?}");
        assert!(
            r.total.windows.over.hits <= 10,
            "{:?}",
            r.total.windows.over
        );
    }

    #[test]
    fn cut_off_each_region_holds_its_weights_part() {
        // us weighs 3 of 4: cut off, it holds 75 a second of the 100, eu 25 (both ask 200).
        let r = two_regions_weighing("tenant", 200, 200, [3, 1]);
        let regions = &r.regions.as_ref().expect("regions").regions;
        for t in 24..30 {
            let (us, eu) = (regions[0].admitted_per_s[t], regions[1].admitted_per_s[t]);
            assert!(
                (72..=78).contains(&us) && (23..=27).contains(&eu),
                "{t} s: {us} + {eu}"
            );
        }
    }

    #[test]
    fn one_replica_cut_off_for_long_holds_the_floor_and_a_whole_region_its_half() {
        // eu's replica 0 is cut off from 5 s to 40 s while replica 1 stays in contact; then
        // both, from 45 s to 75 s. Leases of 1.5 s: the others forget an ended heartbeat
        // after 15 s, well inside both cuts.
        let (_dir, s) = scenario(
            SHARED,
            "duration_s: 80\nsettings: {region_exchange_ms: 250, region_lease_ms: 1500}\nstore: {}\nreplicas: {start: 2}\nregions:\n  names: [us, eu]\n  global_latency_ms: {p50: 100, p99: 120}\n  global_faults:\n    - {at_s: 5, for_s: 35, regions: [eu], replicas: [0, 1]}\n    - {at_s: 45, for_s: 30, regions: [eu]}\ntraffic:\n  - {region: us, domain: g, entries: [{key: tenant, value: a}], rate_per_s: 180, arrivals: even}\n  - {region: eu, domain: g, entries: [{key: tenant, value: a}], rate_per_s: 40, arrivals: even}\n",
        );
        let r = run(&s, false).expect("ran");
        let regions = &r.regions.as_ref().expect("regions").regions;
        let window = |t: usize| [regions[0].admitted_per_s[t], regions[1].admitted_per_s[t]];
        let table: Vec<[u64; 2]> = (0..80).map(window).collect();
        for (t, [us, eu]) in table.iter().enumerate() {
            assert!(us + eu <= 110, "window {t} s: {us} + {eu}\n{table:?}");
        }
        // Past the memory with a peer in contact: eu is shared by its peer's demand (20 a
        // second, with the headroom), the replica cut off holds the floor (5 a second), and us
        // gets the rest. Were it to keep its half, eu would admit its 40 and the total pass 110.
        for t in 25..40 {
            let [us, eu] = window(t);
            assert!(eu <= 32 && us >= 65, "window {t} s: {us} + {eu}\n{table:?}");
        }
        // The whole region cut off: its half for the whole cut, past the memory too.
        for t in 50..75 {
            let [us, eu] = window(t);
            assert!(
                (38..=41).contains(&eu) && us <= 56,
                "window {t} s: {us} + {eu}\n{table:?}"
            );
        }
    }

    #[test]
    fn a_limit_that_is_not_global_is_each_regions_own_in_the_ideal_too() {
        let r = two_regions("user", 200, 200);
        // Each region admits its own 100 a second (and its first bucket), and the ideal agrees
        // (one bucket each).
        assert!(
            (5_800..=6_200).contains(&r.total.admitted),
            "{}",
            r.total.admitted
        );
        assert!(
            r.total.false_rejected_pct < 1.0,
            "{}",
            r.total.false_rejected_pct
        );
        assert!(r.total.windows.over.hits <= 2, "{:?}", r.total.windows.over);
    }
}
