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
//!    tasks run until nothing moves ([`settle`]).
//! 3. Each arrival is decided by its replica's `Limiter::decide` (polled once at once: a lease
//!    hit ends there; otherwise it becomes a task that ends when its store call does), and by
//!    the ideal: one exact bucket per limit on a memory store, at the arrival time.
//! 4. [`report`] turns the counts into the JSON report, CSV and text; [`plot`] draws the
//!    series.

pub mod plot;
pub mod report;
pub mod scenario;
pub mod store;

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, Zipf};

use crate::clock::Clock;
use crate::fleet::{self, MembershipConfig, Replicas};
use crate::limiter::{Code, Decision, Limiter, Request, RequestDescriptor};
use crate::rules::RuleSet;
use crate::store::{MemoryStore, Store, StoreError};
use crate::telemetry::Metrics;
pub use report::Report;
use report::{Counts, Speed};
pub use scenario::Scenario;
use scenario::{Arrivals, Pick, Routing, Traffic};
use store::{ClassCalls, ReplicaStore, SimStore};

/// Where the manual clock's wall reading starts (any fixed instant: the same seed must give the
/// same fixed windows).
const WALL_START_MS: u64 = 1_767_225_600_000;

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

/// The four pictures: admitted against the ideal, store calls, the fallback's share, the
/// replica count.
fn charts(scenario: &Scenario, report: &Report) -> Vec<(&'static str, plot::Chart)> {
    let mut markers: Vec<plot::Marker> = scenario
        .store
        .faults
        .iter()
        .map(|f| plot::Marker {
            at_s: f.at_s,
            until_s: Some(f.at_s + f.for_s),
            label: match f.node {
                Some(n) => format!("{} (node {n})", f.kind.name()),
                None => format!("store {}", f.kind.name()),
            },
        })
        .collect();
    let mut size = scenario.replicas.start;
    for &(at_s, to) in &scenario.replicas.changes {
        markers.push(plot::Marker {
            at_s,
            until_s: None,
            label: format!("{size} → {to} replicas"),
        });
        size = to;
    }
    let points = |f: &dyn Fn(&report::Row) -> f64| -> Vec<(f64, f64)> {
        report
            .series
            .iter()
            .map(|r| (r.t_s as f64 + 0.5, f(r)))
            .collect()
    };
    let series =
        |name: &str, color: &'static str, dashed: bool, f: &dyn Fn(&report::Row) -> f64| {
            plot::Series {
                name: name.to_string(),
                color,
                points: points(f),
                dashed,
            }
        };
    let capacity = scenario.store.ops_per_s * f64::from(scenario.store.nodes);
    vec![
        (
            "admitted.svg",
            plot::Chart {
                title: "Admitted per second against one exact bucket (ideal)".into(),
                x_label: "virtual time (s)".into(),
                y_label: "requests / s".into(),
                series: vec![
                    series("offered", "#9e9e9e", false, &|r| r.offered as f64),
                    series("ideal (one exact bucket)", "#2ca02c", true, &|r| {
                        r.ideal as f64
                    }),
                    series("admitted by the fleet", "#1f77b4", false, &|r| {
                        r.admitted as f64
                    }),
                ],
                markers: markers.clone(),
                y_max: None,
            },
        ),
        (
            "store_calls.svg",
            plot::Chart {
                title: "Store script calls per second (all nodes)".into(),
                x_label: "virtual time (s)".into(),
                y_label: "calls / s".into(),
                series: vec![
                    series("store calls", "#ff7f0e", false, &|r| r.store_calls as f64),
                    series("capacity (ops_per_s × nodes)", "#d62728", true, &|_| {
                        capacity
                    }),
                ],
                markers: markers.clone(),
                y_max: None,
            },
        ),
        (
            "fallback.svg",
            plot::Chart {
                title: "Share of decisions made by the fallback".into(),
                x_label: "virtual time (s)".into(),
                y_label: "share of requests".into(),
                series: vec![series("fallback share", "#d62728", false, &|r| {
                    if r.offered == 0 {
                        0.0
                    } else {
                        r.fallback as f64 / r.offered as f64
                    }
                })],
                markers: markers.clone(),
                y_max: Some(1.05),
            },
        ),
        (
            "replicas.svg",
            plot::Chart {
                title: "Replicas: live, and the count the fallback divides by (mean)".into(),
                x_label: "virtual time (s)".into(),
                y_label: "replicas".into(),
                series: vec![
                    series("live", "#1f77b4", true, &|r| r.replicas as f64),
                    series("believed (membership count)", "#9467bd", false, &|r| {
                        r.replicas_believed
                    }),
                ],
                markers,
                y_max: None,
            },
        ),
    ]
}

/// One replica of the simulated fleet.
struct SimReplica {
    limiter: Arc<Limiter>,
    replicas: Arc<Replicas>,
    stop: tokio::sync::watch::Sender<bool>,
}

/// One traffic stream's state: its next arrival and its pickers.
struct Stream {
    traffic: Traffic,
    domain: Arc<str>,
    keys: Vec<Arc<str>>,
    next_us: f64,
    /// Exponential gaps (Poisson arrivals), or `None` for even ones.
    gap: Option<Exp<f64>>,
    zipf: Option<Zipf<f64>>,
    round_robin: usize,
}

/// The run's state, owned by the driver.
struct Sim<'s> {
    scenario: &'s Scenario,
    clock: Clock,
    rules: Arc<RuleSet>,
    store: Arc<SimStore>,
    class_calls: Arc<ClassCalls>,
    metrics: Arc<Metrics>,
    fleet: Vec<SimReplica>,
    next_index: u32,
    ideal: Limiter,
    ideal_store: MemoryStore,
    counts: Arc<Mutex<Counts>>,
    activity: Arc<AtomicU64>,
    rng: SmallRng,
    streams: Vec<Stream>,
    value_buf: String,
}

/// A decision in progress, and what to count when it ends.
type Pending = Pin<Box<dyn Future<Output = ()> + Send>>;

impl<'s> Sim<'s> {
    fn new(scenario: &'s Scenario) -> Self {
        let clock = Clock::manual(WALL_START_MS);
        let s = &scenario.settings;
        let activity = Arc::new(AtomicU64::new(0));
        let policy = crate::store::breaker::Policy::new(
            Duration::from_millis(s.store_timeout_ms),
            Duration::from_millis(s.store_connect_timeout_ms),
            s.breaker_failures,
            Duration::from_millis(s.breaker_probe_ms),
        );
        let class_calls = Arc::new(ClassCalls::new(scenario.duration_s));
        let store = Arc::new(SimStore::new(
            &scenario.store,
            policy,
            clock.clone(),
            scenario.seed,
            scenario.duration_s,
            activity.clone(),
            class_calls.clone(),
        ));
        let metrics = Arc::new(Metrics::new());
        let ideal = Limiter::new(
            Store::Memory(MemoryStore::new(clock.clone())),
            crate::configs::limiter_config(s, Arc::new(Replicas::new(0, 1)), clock.clone(), false),
            Arc::new(Metrics::new()),
        );
        let mut rng = SmallRng::seed_from_u64(scenario.seed);
        let streams = scenario
            .traffic
            .iter()
            .map(|t| {
                // The scenario check keeps rate_per_s positive and finite, so `Exp::new` takes it.
                let gap = match t.arrivals {
                    Arrivals::Poisson => Exp::new(t.rate_per_s / 1e6).ok(),
                    Arrivals::Even => None,
                };
                let first = match &gap {
                    Some(g) => g.sample(&mut rng),
                    None => 1e6 / t.rate_per_s / 2.0,
                };
                Stream {
                    domain: t.domain.as_str().into(),
                    keys: t.entries.iter().map(|(k, _)| k.as_str().into()).collect(),
                    next_us: first,
                    gap,
                    zipf: Zipf::new(t.tenants as f64, t.zipf_exponent).ok(),
                    round_robin: 0,
                    traffic: t.clone(),
                }
            })
            .collect();
        Sim {
            scenario,
            rules: Arc::new(scenario.rules.clone()),
            ideal_store: MemoryStore::with_max_keys(clock.clone(), usize::MAX),
            clock,
            store,
            class_calls,
            metrics,
            fleet: Vec::new(),
            next_index: 0,
            ideal,
            counts: Arc::new(Mutex::new(Counts::new(scenario.duration_s))),
            activity,
            rng,
            streams,
            value_buf: String::new(),
        }
    }

    /// Starts one replica as `serve` would: its limiter on its own client of the store, its
    /// housekeeping and its membership heartbeat on the virtual clock.
    fn start_replica(&mut self) {
        let s = &self.scenario.settings;
        let index = self.next_index;
        self.next_index += 1;
        let backend = Arc::new(ReplicaStore::new(
            self.store.clone(),
            index,
            self.metrics.store.clone(),
        ));
        let replicas = Arc::new(Replicas::new(s.fallback_replicas, s.fallback_min_replicas));
        let config = crate::configs::limiter_config(s, replicas.clone(), self.clock.clone(), true);
        let limiter = Arc::new(Limiter::on_shared_store(
            Arc::new(Store::Custom(backend)),
            config,
            self.metrics.clone(),
        ));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let until_stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        self.clock.spawn({
            let (l, stop) = (limiter.clone(), until_stopped(stopped.clone()));
            async move { l.housekeeping(stop).await }
        });
        self.clock.spawn({
            let (l, r, m, c) = (
                limiter.clone(),
                replicas.clone(),
                self.metrics.clone(),
                self.clock.clone(),
            );
            let cfg = MembershipConfig {
                key: format!("{}{{members}}", s.key_prefix),
                replica: format!("sim-replica-{index}"),
                interval: Duration::from_millis(s.membership_interval_ms.max(1)),
            };
            let stop = until_stopped(stopped);
            async move { fleet::membership(l.store(), &r, &m, cfg, &c, stop).await }
        });
        self.fleet.push(SimReplica {
            limiter,
            replicas,
            stop,
        });
    }

    /// Stops the newest replica as `serve` stops on SIGTERM: heartbeats end (it leaves the
    /// membership set) and its unspent leased tokens go back.
    fn stop_replica(&mut self) {
        if let Some(r) = self.fleet.pop() {
            let _ = r.stop.send(true);
            let limiter = r.limiter;
            self.clock.spawn(async move {
                limiter.return_leases().await;
            });
        }
    }

    fn resize(&mut self, to: u32) {
        while (self.fleet.len() as u32) < to {
            self.start_replica();
        }
        while (self.fleet.len() as u32) > to {
            self.stop_replica();
        }
    }

    /// The replica for a request of `stream` whose values hash to `hash`.
    fn route(&mut self, stream: usize, hash: u64) -> usize {
        let n = self.fleet.len();
        match self.streams[stream].traffic.routing {
            Routing::Even => {
                let s = &mut self.streams[stream];
                s.round_robin = (s.round_robin + 1) % n;
                s.round_robin
            }
            Routing::Sticky => (hash % n as u64) as usize,
            Routing::Random => self.rng.random_range(0..n),
        }
    }

    /// Issues the next arrival of `stream` (due now): its ideal answer at once, its fleet
    /// decision started (and finished, if it needs no store call).
    fn arrive(&mut self, stream: usize, cx: &mut std::task::Context<'_>) {
        let now = self.clock.mono_us();
        let second = now / 1_000_000;
        let (domain, keys, cost) = {
            let s = &self.streams[stream];
            (s.domain.clone(), s.keys.clone(), s.traffic.cost)
        };
        let mut values = Vec::with_capacity(keys.len());
        let mut hasher = std::hash::DefaultHasher::new();
        for i in 0..keys.len() {
            let template = &self.streams[stream].traffic.entries[i].1;
            let index = match template.pick() {
                None => 0,
                Some(Pick::Uniform) => self
                    .rng
                    .random_range(0..self.streams[stream].traffic.tenants),
                Some(Pick::Zipf) => match &self.streams[stream].zipf {
                    Some(z) => (z.sample(&mut self.rng) as u64).saturating_sub(1),
                    None => 0,
                },
            };
            template.render(index, &mut self.value_buf);
            self.value_buf.hash(&mut hasher);
            values.push(self.value_buf.clone());
        }
        let replica = self.route(stream, hasher.finish());
        let request = one_descriptor(&domain, &keys, &values, cost);

        // The ideal: one exact bucket per limit, now. A descriptor is admitted when all its
        // limits are (every one is charged, as the fleet charges them), and each of its
        // buckets counts the descriptor's answer, as the fleet's side counts its status.
        let mut buckets = Vec::new();
        {
            let ideal = self.ideal.ideal_ops(&self.rules, &request);
            let allowed: Vec<bool> = ideal
                .iter()
                .map(|(_, _, op)| self.ideal_store.apply(op).allowed)
                .collect();
            let descriptor_ok = |d: usize| {
                ideal
                    .iter()
                    .zip(&allowed)
                    .all(|((_, desc, _), ok)| *desc != d || *ok)
            };
            let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
            for (class, desc, op) in &ideal {
                let known = counts.buckets.len();
                let b = counts.bucket(&op.key, class);
                if b == known {
                    self.class_calls.name(&op.key, counts.buckets[b].class);
                }
                let bucket = &mut counts.buckets[b];
                bucket.offered += op.cost;
                bucket.ideal += if descriptor_ok(*desc) { op.cost } else { 0 };
                buckets.push((b, op.cost, *desc));
            }
            counts.arrived(second, allowed.iter().all(|&ok| ok));
        }

        let limiter = self.fleet[replica].limiter.clone();
        let rules = self.rules.clone();
        let counts = self.counts.clone();
        let clock = self.clock.clone();
        let activity = self.activity.clone();
        let mut pending: Pending = Box::pin(async move {
            let request = one_descriptor(&domain, &keys, &values, cost);
            let decision = limiter.decide(&rules, &request).await;
            let latency = clock.mono_us() - now;
            record(&counts, second, latency, &decision, &buckets);
            activity.fetch_add(1, Ordering::Relaxed);
        });
        // Most decisions end here (a lease or the over-limit cache answered): no task.
        if pending.as_mut().poll(cx).is_pending() {
            tokio::spawn(pending);
        }
    }

    /// Runs the scenario to its end.
    async fn drive(mut self, progress: bool) -> Report {
        let started = Instant::now();
        let end_us = self.scenario.duration_s * 1_000_000;
        self.resize(self.scenario.replicas.start);
        // The replicas' first heartbeats and housekeeping sleeps start at 0.
        settle(&self.activity, &self.clock).await;
        let mut changes = self.scenario.replicas.changes.iter().peekable();
        let mut next_second = 1_000_000u64;
        let mut last_progress = Instant::now();
        let tasks = tokio::runtime::Handle::current().metrics();
        let mut alive = tasks.num_alive_tasks();
        loop {
            // A task spawned since the last settle (a decision waiting on the store, a claim
            // sent ahead, a new replica's heartbeat) must register its first sleep before the
            // next thing due is known.
            if tasks.num_alive_tasks() > alive {
                settle(&self.activity, &self.clock).await;
            }
            let now = self.clock.mono_us();
            let arrival = self
                .streams
                .iter()
                .enumerate()
                .min_by(|a, b| a.1.next_us.total_cmp(&b.1.next_us))
                .map(|(i, s)| (i, s.next_us.ceil() as u64));
            let change_us = changes.peek().map(|c| (c.0 * 1e6).round() as u64);
            let next = [
                arrival.map(|a| a.1),
                self.clock.next_deadline_us(),
                change_us,
                Some(next_second),
                Some(end_us),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(end_us)
            .max(now);
            if next > now && self.clock.advance_us(next - now) > 0 {
                settle(&self.activity, &self.clock).await;
            }
            alive = tasks.num_alive_tasks();
            if next >= end_us {
                break;
            }
            if next == next_second {
                self.sample_second(next_second / 1_000_000 - 1);
                next_second += 1_000_000;
                if progress && last_progress.elapsed() >= Duration::from_secs(1) {
                    last_progress = Instant::now();
                    let decided = self.counts.lock().map(|c| c.decided).unwrap_or(0);
                    eprint!(
                        "\rsimulate: {} / {} s virtual, {} decisions ({:.0}/s)   ",
                        next / 1_000_000,
                        self.scenario.duration_s,
                        decided,
                        decided as f64 / started.elapsed().as_secs_f64()
                    );
                    let _ = std::io::stderr().flush();
                }
            }
            if change_us == Some(next)
                && let Some(&(_, to)) = changes.next()
            {
                self.resize(to);
            }
            if let Some((stream, at)) = arrival
                && at == next
            {
                let gap = match &self.streams[stream].gap {
                    Some(g) => g.sample(&mut self.rng),
                    None => 1e6 / self.streams[stream].traffic.rate_per_s,
                };
                self.streams[stream].next_us += gap;
                std::future::poll_fn(|cx| {
                    self.arrive(stream, cx);
                    Poll::Ready(())
                })
                .await;
            }
        }
        self.sample_second(self.scenario.duration_s - 1);
        // Stop the fleet's background tasks, then let the decisions still waiting on the
        // store end (a reply, or a timeout), within a bound of virtual time.
        for r in std::mem::take(&mut self.fleet) {
            let _ = r.stop.send(true);
        }
        settle(&self.activity, &self.clock).await;
        let s = &self.scenario.settings;
        let drain_until = end_us
            .saturating_add(
                s.store_connect_timeout_ms
                    .max(s.store_timeout_ms)
                    .saturating_mul(1_000),
            )
            .saturating_add(s.store_timeout_ms.saturating_mul(2_000))
            .saturating_add(2_000_000);
        while let Some(d) = self.clock.next_deadline_us() {
            if d > drain_until {
                break;
            }
            let now = self.clock.mono_us();
            self.clock.advance_us(d.saturating_sub(now));
            settle(&self.activity, &self.clock).await;
        }
        if progress {
            eprintln!();
        }
        let wall_s = started.elapsed().as_secs_f64();
        let calls = self.store.calls_per_second();
        let class_calls = self.class_calls.per_second();
        let counts = std::mem::replace(
            &mut *self.counts.lock().unwrap_or_else(|p| p.into_inner()),
            Counts::new(0),
        );
        let decisions = counts.decided;
        counts.report(
            self.scenario.file.display().to_string(),
            self.scenario.seed,
            self.scenario.duration_s,
            &calls,
            &class_calls,
            Speed {
                decisions,
                wall_s: report::round(wall_s, 2),
                decisions_per_s: report::round(decisions as f64 / wall_s.max(1e-9), 0),
            },
        )
    }

    /// The fleet's size and belief at the end of virtual second `t`.
    fn sample_second(&mut self, t: u64) {
        let live = self.fleet.len() as u64;
        let believed = if live == 0 {
            0.0
        } else {
            self.fleet
                .iter()
                .map(|r| r.replicas.count() as f64)
                .sum::<f64>()
                / live as f64
        };
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(row) = counts.rows.get_mut(t as usize) {
            row.replicas = live;
            row.replicas_believed = report::round(believed, 2);
        }
    }
}

/// A request of one descriptor: `keys` with `values`, `cost` hits.
fn one_descriptor<'a>(
    domain: &'a str,
    keys: &'a [Arc<str>],
    values: &'a [String],
    cost: u64,
) -> Request<'a> {
    Request {
        domain,
        descriptors: vec![RequestDescriptor {
            entries: keys
                .iter()
                .map(|k| &**k)
                .zip(values.iter().map(String::as_str))
                .collect(),
            hits_addend: None,
            limit_override: None,
        }],
        hits_addend: cost,
    }
}

/// Counts one ended decision.
fn record(
    counts: &Mutex<Counts>,
    second: u64,
    latency_us: u64,
    decision: &Result<Decision, StoreError>,
    buckets: &[(usize, u64, usize)],
) {
    let mut counts = counts.lock().unwrap_or_else(|p| p.into_inner());
    let (admitted, fallback, error) = match decision {
        Ok(d) => (d.overall == Code::Ok, d.from_fallback, false),
        // The `error` mode: the request failed (Envoy's failure mode decides), counted apart.
        Err(_) => (false, false, true),
    };
    let per_bucket: Vec<(usize, u64, bool)> = buckets
        .iter()
        .map(|&(b, hits, desc)| {
            let ok = match decision {
                Ok(d) => d.statuses.get(desc).is_some_and(|s| s.code == Code::Ok),
                Err(_) => false,
            };
            (b, hits, ok)
        })
        .collect();
    counts.decided(second, latency_us, admitted, fallback, error, &per_bucket);
}

/// Lets the tasks the clock woke run, and the ones they wake or spawn, until nothing moves:
/// two turns of the scheduler in which no store script ran, no reply came, no decision ended,
/// no task started or ended and none went back to sleep (a turn runs at most 61 tasks).
async fn settle(activity: &AtomicU64, clock: &Clock) {
    let tasks = tokio::runtime::Handle::current().metrics();
    let progress = || {
        (
            activity.load(Ordering::Relaxed),
            tasks.num_alive_tasks(),
            clock.sleeps_registered(),
        )
    };
    loop {
        let before = progress();
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        if progress() == before {
            return;
        }
    }
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
}
