//! The run's state ([`Sim`]), built from the scenario, and the fleet's replicas started and
//! stopped as `serve` starts and stops them.
//!
//! Flow: [`Sim::new`] builds the shared pieces on one manual clock (the simulated store and
//! its per-class counts, the metrics, the ideal limiter, the streams; with `regions:`, one
//! store and one fleet per region and the global store between them) → the driver sizes each
//! fleet ([`Sim::resize`]) at the start and at each of the scenario's changes → each new
//! replica gets its own limiter on its own client of its region's store, with its
//! housekeeping and membership heartbeat as tasks on the clock (and, with regions, its shares
//! of the global limits and their exchange, `regions::run`, as `serve` runs them); a stopped
//! one leaves and gives its leases back.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::Scenario;
use super::regions::{GlobalClient, GlobalModel};
use super::report::Counts;
use super::store::{ClassCalls, ReplicaStore, SimStore};
use super::stream::Stream;
use crate::clock::Clock;
use crate::fleet::{self, MembershipConfig, Replicas};
use crate::limiter::Limiter;
use crate::regions::{GlobalStore, RegionConfig, Shares};
use crate::rules::RuleSet;
use crate::store::{MemoryStore, Store};
use crate::telemetry::Metrics;

/// Where the manual clock's wall reading starts (any fixed instant: the same seed must give the
/// same fixed windows).
const WALL_START_MS: u64 = 1_767_225_600_000;

/// One replica of the simulated fleet.
pub(super) struct SimReplica {
    pub(super) limiter: Arc<Limiter>,
    pub(super) replicas: Arc<Replicas>,
    pub(super) stop: tokio::sync::watch::Sender<bool>,
}

/// One region: its store and its fleet (a scenario without `regions:` has one).
pub(super) struct SimRegion {
    pub(super) store: Arc<SimStore>,
    pub(super) fleet: Vec<SimReplica>,
    /// The next replica's index (in start order, never reused; a partition fault names them).
    next_index: u32,

    /// The ideal's buckets of its limits that are not global (each region enforces those
    /// alone).
    pub(super) ideal_store: MemoryStore,
}

/// The run's state, owned by the driver.
pub(super) struct Sim<'s> {
    pub(super) scenario: &'s Scenario,
    pub(super) clock: Clock,
    pub(super) rules: Arc<RuleSet>,
    pub(super) regions: Vec<SimRegion>,
    /// The global store, with `regions:`.
    pub(super) global: Option<Arc<GlobalModel>>,
    pub(super) class_calls: Arc<ClassCalls>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) ideal: Limiter,
    pub(super) ideal_store: MemoryStore,
    pub(super) counts: Arc<Mutex<Counts>>,
    pub(super) activity: Arc<AtomicU64>,
    pub(super) rng: SmallRng,
    pub(super) streams: Vec<Stream>,
    pub(super) value_buf: String,
    /// Each decision's budget, as `serve` gives one carrying Envoy's `grpc-timeout`: the
    /// scenario's `envoy.timeout_ms` less `decision_margin_ms` (none when Envoy never gives up).
    pub(super) decision_budget: Option<Duration>,
}

impl<'s> Sim<'s> {
    pub(super) fn new(scenario: &'s Scenario) -> Self {
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
        let global = scenario.regions.as_ref().map(|r| {
            Arc::new(GlobalModel::new(
                r,
                clock.clone(),
                scenario.seed,
                scenario.duration_s,
            ))
        });
        let region_count = scenario.regions.as_ref().map_or(1, |r| r.names.len());
        let regions = (0..region_count)
            .map(|r| SimRegion {
                // Each region's own draws; the first region's are a scenario's without regions.
                store: Arc::new(SimStore::new(
                    &scenario.store,
                    policy,
                    clock.clone(),
                    scenario.seed.wrapping_add(r as u64),
                    scenario.duration_s,
                    activity.clone(),
                    class_calls.clone(),
                )),
                fleet: Vec::new(),
                next_index: 0,
                ideal_store: MemoryStore::with_max_keys(clock.clone(), usize::MAX),
            })
            .collect();
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
                let region = match (&scenario.regions, &t.region) {
                    (Some(r), Some(name)) => r.names.iter().position(|n| n == name).unwrap_or(0),
                    _ => 0,
                };
                Stream::new(t, region, &mut rng)
            })
            .collect();
        Sim {
            scenario,
            rules: Arc::new(scenario.rules.clone()),
            ideal_store: MemoryStore::with_max_keys(clock.clone(), usize::MAX),
            clock,
            regions,
            global,
            class_calls,
            metrics,
            ideal,
            counts: Arc::new(Mutex::new(Counts::new(scenario.duration_s, region_count))),
            activity,
            rng,
            streams,
            value_buf: String::new(),
            decision_budget: scenario.envoy.timeout_ms.map(|ms| {
                Duration::from_millis(ms.saturating_sub(scenario.settings.decision_margin_ms))
            }),
        }
    }

    /// Starts one replica of region `r` as `serve` would: its limiter on its own client of
    /// the region's store, its housekeeping and its membership heartbeat on the virtual clock;
    /// with regions, its shares of the global limits and their exchange with the global store.
    fn start_replica(&mut self, r: usize) {
        let s = &self.scenario.settings;
        let region = &mut self.regions[r];
        let index = region.next_index;
        region.next_index += 1;
        let backend = Arc::new(ReplicaStore::new(
            region.store.clone(),
            index,
            self.metrics.store.clone(),
        ));
        let store = Arc::new(Store::Custom(backend));
        let replicas = Arc::new(Replicas::new(s.fallback_replicas, s.fallback_min_replicas));
        let mut config =
            crate::configs::limiter_config(s, replicas.clone(), self.clock.clone(), true);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let until_stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let name = match &self.scenario.regions {
            Some(model) => format!("sim-{}-{index}", model.names[r]),
            None => format!("sim-replica-{index}"),
        };
        if let (Some(model), Some(global)) = (&self.scenario.regions, &self.global) {
            let shares = Arc::new(Shares::new(
                RegionConfig {
                    region: model.names[r].clone(),
                    regions: model.names.clone(),
                    weights: model.weights.clone(),
                    exchange: Duration::from_millis(s.region_exchange_ms),
                    lease: Duration::from_millis(s.region_lease_ms),
                    floor: s.region_floor,
                    beat_key: format!("{}{{regions}}", s.key_prefix),
                    contact_key: format!("{}{{regions-contact}}", s.key_prefix),
                    replica: name.clone(),
                    global_store: "the simulated global store".into(),
                },
                self.clock.clone(),
                self.metrics.regions.clone(),
            ));
            config.regions = Some(shares.clone());
            let global: Arc<dyn GlobalStore> = Arc::new(GlobalClient {
                store: global.clone(),
                region: r,
                replica: index,
            });
            let (clock, stop) = (self.clock.clone(), until_stopped(stopped.clone()));
            let store = store.clone();
            let digest = self.rules.global_digest();
            self.clock.spawn(async move {
                crate::regions::run(shares, global, store, move || digest.clone(), clock, stop)
                    .await
            });
        }
        let limiter = Arc::new(Limiter::on_shared_store(
            store,
            config,
            self.metrics.clone(),
        ));
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
                replica: name,
                interval: Duration::from_millis(s.membership_interval_ms.max(1)),
            };
            let stop = until_stopped(stopped);
            async move { fleet::membership(l.store(), &r, &m, cfg, &c, stop).await }
        });
        self.regions[r].fleet.push(SimReplica {
            limiter,
            replicas,
            stop,
        });
    }

    /// Stops the newest replica of region `r` as `serve` stops on SIGTERM: heartbeats end (it
    /// leaves the membership set, and the regions' heartbeat) and its unspent leased tokens go
    /// back.
    fn stop_replica(&mut self, r: usize) {
        if let Some(replica) = self.regions[r].fleet.pop() {
            let _ = replica.stop.send(true);
            let limiter = replica.limiter;
            self.clock.spawn(async move {
                limiter.return_leases().await;
            });
        }
    }

    /// Sizes every region's fleet to `to` replicas.
    pub(super) fn resize(&mut self, to: u32) {
        for r in 0..self.regions.len() {
            while (self.regions[r].fleet.len() as u32) < to {
                self.start_replica(r);
            }
            while (self.regions[r].fleet.len() as u32) > to {
                self.stop_replica(r);
            }
        }
    }

    /// Every live replica, of every region.
    pub(super) fn replicas(&self) -> impl Iterator<Item = &SimReplica> {
        self.regions.iter().flat_map(|r| r.fleet.iter())
    }
}
