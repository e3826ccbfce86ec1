//! The run's state ([`Sim`]), built from the scenario, and the fleet's replicas started and
//! stopped as `serve` starts and stops them.
//!
//! Flow: [`Sim::new`] builds the shared pieces on one manual clock (the simulated store and
//! its per-class counts, the metrics, the ideal limiter, the streams) → the driver sizes the
//! fleet ([`Sim::resize`]) at the start and at each of the scenario's changes → each new
//! replica gets its own limiter on its own client of the store, with its housekeeping and
//! membership heartbeat as tasks on the clock; a stopped one leaves and gives its leases back.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::Scenario;
use super::report::Counts;
use super::store::{ClassCalls, ReplicaStore, SimStore};
use super::stream::Stream;
use crate::clock::Clock;
use crate::fleet::{self, MembershipConfig, Replicas};
use crate::limiter::Limiter;
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

/// The run's state, owned by the driver.
pub(super) struct Sim<'s> {
    pub(super) scenario: &'s Scenario,
    pub(super) clock: Clock,
    pub(super) rules: Arc<RuleSet>,
    pub(super) store: Arc<SimStore>,
    pub(super) class_calls: Arc<ClassCalls>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) fleet: Vec<SimReplica>,
    pub(super) next_index: u32,
    pub(super) ideal: Limiter,
    pub(super) ideal_store: MemoryStore,
    pub(super) counts: Arc<Mutex<Counts>>,
    pub(super) activity: Arc<AtomicU64>,
    pub(super) rng: SmallRng,
    pub(super) streams: Vec<Stream>,
    pub(super) value_buf: String,
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
            .map(|t| Stream::new(t, &mut rng))
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

    pub(super) fn resize(&mut self, to: u32) {
        while (self.fleet.len() as u32) < to {
            self.start_replica();
        }
        while (self.fleet.len() as u32) > to {
            self.stop_replica();
        }
    }
}
