//! One quota across regions: `global: true` limits, each region's bucket held to the share of
//! the limit its demand earns, the shares agreed through a global store that no decision waits
//! for. Doorman's rate leases, one level above a region's own exact buckets.
//!
//! # How it flows
//!
//! - **A decision** ([`Shares::scale`], from the limiter's plan): a global limit's op goes to
//!   this region's own store as always, its token bucket scaled to this region's share of the
//!   key (`quota::share::region_part`: capacity and refill × share), and its cost is counted as
//!   this replica's demand for the key. Nothing here calls the global store.
//! - **An exchange** ([`run`], every `region_exchange_ms` on every replica): the region's
//!   heartbeat, then, for each global key this replica saw asked for, its demand (over one
//!   window of the limit, as a share of it) written to the global store, and every region's
//!   total demand read back (`lua/regions.lua`). Each replica works out its region's share
//!   from that with the same rule ([`allocate`]), so the replicas of a region agree.
//! - **A share that grows** takes effect one exchange later (the smaller of the last two
//!   answers), so that the regions whose shares shrink, which may exchange up to an interval
//!   later, have shrunk first; a share that shrinks takes effect at once.
//! - **Heartbeats are per replica.** A region is heard from when one of its replicas' beats
//!   is live and none has ended within the last [`MEMORY_LEASES`] leases (a replica that stops
//!   gracefully takes its entry out); otherwise every region counts it at its **partition
//!   share**, `1/R` of the limit, since a replica of it may be serving on that share.
//! - **A replica cut off** (no heartbeat answered of those sent within `region_lease_ms`) first
//!   holds each key at the smaller of its share and `1/R`, which only shrinks; once the others
//!   have seen its beat end and made room (a lease, a call's bound and two exchanges after its
//!   last answered beat was sent) it holds `1/R`. After [`MEMORY_LEASES`] leases the others
//!   forget its ended beat: if a replica of its own region still reaches the global store,
//!   that region is heard from again and shared by demand, so the replica cut off drops to
//!   the floor; if none does (the whole region is cut off), nobody hears from the region and
//!   everyone keeps its `1/R`, which it goes on holding. It learns which from its region's own
//!   store: a replica renews its entry in a set there (`<key_prefix>{regions-contact}`, the
//!   membership script's) at once when a heartbeat is answered and every exchange until it
//!   has been cut off long enough to hold `1/R` itself; one cut off past the memory counts
//!   the others' live entries every quarter exchange ([`Shares::tell_region`]), so it finds a
//!   peer back in contact before the other regions grow into its region's `1/R`. When heard
//!   from again it starts from at most what it held cut off and grows through the exchanges.
//! - **Every key this replica saw asked for within a lease** is exchanged, with its demand
//!   measured over the span its region takes to ask a few requests (`demand.rs`: the last
//!   half-interval for a busy key, on every replica however little of it each sees; up to a
//!   lease for a sparse one, so a tenant seen every few seconds is not counted as asking
//!   nothing), and its share is worked out again from every region's totals, so the replicas
//!   of a region hold the same share whichever of them a key's requests reach. A key not seen
//!   within a lease is forgotten.
//! - **A key first seen** holds its partition share while nothing is known of it, and is
//!   exchanged at once, off the interval ([`run`] is told): the global store's totals give it,
//!   one round trip later, what every region's last exchange already leaves for this region
//!   (its floor and its part of what nobody asks for), which shrinks it at once where other
//!   regions use the key. Its demand is measured from the next exchange on.
//! - **Regions must agree** on the regions, weights, floor and global limits their shares are
//!   computed from: each replica publishes its settings with its heartbeat, and while any live
//!   replica's differ, every share is the smallest any of the views gives (`agree.rs`).
//!
//! # Bounds
//!
//! The shares of a key add up to at most the whole limit at every moment these rules keep
//! (`allocate.rs`; a region not heard from is kept its partition share by everyone, a replica
//! cut off steps down before anyone grows, growth waits an exchange), as long as exchanges run
//! about on time. While they stand still, the regions' buckets together admit over any window
//! of the limit's length at most what one bucket of the limit would: its capacity plus one
//! window's refill. A share that grows can add its growth's part of the capacity once (a bucket
//! with no state counts as full). docs/regions.md states the bound and what a late exchange or
//! a partition adds.
//!
//! # Memory
//!
//! At most [`MAX_KEYS`] keys are tracked per replica; a key past that holds the floor (never
//! more than its due). A key not asked for within a lease is dropped.

mod agree;
mod allocate;
mod demand;

pub use agree::{Disagreement, View};
pub use allocate::{HEADROOM, RegionDemand, WHOLE, allocate, partition_shares};
use demand::{History, Period};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures_util::StreamExt;

use crate::clock::Clock;
use crate::quota::OpKind;
use crate::quota::share::region_part;
use crate::store::redis::RedisStore;
use crate::store::{Store, StoreError};
use crate::telemetry::{RegionMetrics, ResultLabels};

/// Global keys tracked per replica at most.
pub const MAX_KEYS: usize = 100_000;

/// How long, in leases, an ended heartbeat is remembered in the global store: its region is
/// counted at its partition share meanwhile, and a replica cut off that long drops to the floor.
pub const MEMORY_LEASES: u64 = 10;

/// Keys first seen waiting for their first exchange, at most: past it a new key waits for the
/// next exchange on the interval.
const FRESH_MAX: usize = 1_024;

/// Demand calls to the global store in flight at once, per replica.
const DEMAND_CALLS: usize = 64;

/// How a replica takes part in sharing global limits (built from the settings by `configs.rs`).
#[derive(Clone, Debug)]
pub struct RegionConfig {
    /// This region's name, one of `regions`.
    pub region: String,
    /// Every region sharing the global limits.
    pub regions: Vec<String>,
    /// Each region's weight, in the order of `regions` (1 each unless `regions` gives them):
    /// its partition share is its weight's part of the limit.
    pub weights: Vec<f64>,
    /// How often a replica exchanges demand with the global store.
    pub exchange: Duration,
    /// How long a region's shares hold without global contact.
    pub lease: Duration,
    /// The share of its partition share each region always holds (0 to 1).
    pub floor: f64,
    /// Where the regions' heartbeats live in the global store (`<key_prefix>{regions}`).
    pub beat_key: String,
    /// The set in this region's own store of its replicas that reach the global store
    /// (`<key_prefix>{regions-contact}`).
    pub contact_key: String,
    /// This replica's id (host, process, random).
    pub replica: String,
    /// The global store's URL as logs may show it (no password).
    pub global_store: String,
}

/// One replica's heartbeat, as the global store reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct Beat {
    pub region: String,
    pub replica: String,
    /// The ms its beat has left (0 or less: ended).
    pub left_ms: i64,
    /// The settings it published ([`View::text`]; empty from a release that publishes none).
    pub settings: String,
}

/// The global store's three calls (`lua/regions.lua`): a Redis in `serve`, a model of one on
/// the virtual clock in `tollgate simulate` (`sim/regions.rs`). An exchange is a few calls a
/// second per replica, never on a decision's path, so its futures are boxed.
pub trait GlobalStore: std::fmt::Debug + Send + Sync {
    /// Writes `replica`'s heartbeat (lasting `ttl_ms`) with the `settings` it shares by, and
    /// returns every replica's beat, for beats ended within `memory_ms`.
    fn beat<'a>(
        &'a self,
        key: &'a str,
        who: (&'a str, &'a str),
        ttl_ms: u64,
        memory_ms: u64,
        settings: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Vec<Beat>, StoreError>>;

    /// Takes `replica`'s heartbeat out (a graceful stop).
    fn leave<'a>(
        &'a self,
        key: &'a str,
        who: (&'a str, &'a str),
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Writes `replica`'s demand for one global key (lasting `ttl_ms`) and returns each
    /// region's total of the entries that have not ended.
    fn demand<'a>(
        &'a self,
        key: &'a str,
        who: (&'a str, &'a str),
        demand_ppm: u64,
        ttl_ms: u64,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Vec<(String, u64)>, StoreError>>;
}

type BoxFuture<'a, T> = futures_util::future::BoxFuture<'a, T>;

impl GlobalStore for RedisStore {
    fn beat<'a>(
        &'a self,
        key: &'a str,
        who: (&'a str, &'a str),
        ttl_ms: u64,
        memory_ms: u64,
        settings: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Vec<Beat>, StoreError>> {
        Box::pin(async move {
            let beats = self
                .region_beat(key, who, ttl_ms, memory_ms, settings, timeout)
                .await?;
            Ok(beats
                .into_iter()
                .map(|(field, left_ms, settings)| {
                    let (region, replica) = field.split_once('|').unwrap_or((&field, ""));
                    Beat {
                        region: region.to_string(),
                        replica: replica.to_string(),
                        left_ms,
                        settings,
                    }
                })
                .collect())
        })
    }

    fn leave<'a>(
        &'a self,
        key: &'a str,
        who: (&'a str, &'a str),
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.region_leave(key, who, timeout))
    }

    fn demand<'a>(
        &'a self,
        key: &'a str,
        (region, replica): (&'a str, &'a str),
        demand_ppm: u64,
        ttl_ms: u64,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Vec<(String, u64)>, StoreError>> {
        Box::pin(self.region_demand(key, region, replica, demand_ppm, ttl_ms, timeout))
    }
}

/// This replica's view of its region's shares of the global keys. Its locks (`keys`, `heard`,
/// `fresh`, `rules`) are never held two at a time, except a key's `history` under `keys`, so
/// no order among them can deadlock.
#[derive(Debug)]
pub struct Shares {
    config: RegionConfig,
    clock: Clock,
    keys: RwLock<HashMap<String, Arc<KeyShare>>>,
    /// When the last heartbeat the global store answered was sent (monotonic ms).
    contact_ms: AtomicU64,
    /// When the demand was last taken (monotonic ms): demand is asked over the time since.
    counted_ms: AtomicU64,
    partition_ppm: u32,
    floor_ppm: u32,
    metrics: RegionMetrics,
    /// Said once: a heartbeat from a region not in `regions`.
    warned_unknown: std::sync::atomic::AtomicBool,
    /// Whether, at the last look while cut off, another replica of this region reached the
    /// global store (or the region's store could not say): then, past the memory, the floor.
    peers_in_contact: std::sync::atomic::AtomicBool,
    /// Whether the global store has ever answered this replica's heartbeat (a replica started
    /// during a cut claims no contact it never had).
    answered: std::sync::atomic::AtomicBool,
    /// How long the last exchange took (ms): the others' take about as long to make room.
    last_exchange_ms: AtomicU64,
    /// Keys first seen, waiting for their first exchange (off the interval).
    fresh: Mutex<Vec<String>>,
    /// Told when a key is first seen.
    fresh_ready: tokio::sync::Notify,
    /// What the last answered heartbeat said: who is heard from, under which views.
    heard: RwLock<Heard>,
    /// `RuleSet::global_digest` of the rules in force (set by [`run`]'s caller).
    rules: Mutex<String>,
    /// Whether this replica was cut off at the last look (its log says when that changes).
    was_partitioned: AtomicBool,
}

/// What the last answered heartbeat said.
#[derive(Debug, Default)]
struct Heard {
    /// Every view shares are computed under, this replica's first, each with which of its
    /// regions are heard from; more than one while some live replica's settings differ.
    views: Vec<(View, Vec<bool>)>,
    /// The live replicas whose settings differ from this one's.
    disagreements: Vec<Disagreement>,
    /// Per region of this replica's `regions`: heard from, and the ms since its freshest
    /// beat was written (`None`: no beat within the memory).
    regions: Vec<(bool, Option<u64>)>,
    /// Whether any heartbeat was answered yet.
    answered: bool,
}

#[derive(Debug)]
struct KeyShare {
    /// The share in force (parts per million).
    effective: AtomicU32,
    /// The last share worked out: a larger one takes effect only when it is worked out twice.
    computed: AtomicU32,
    /// Tokens asked for since the last exchange.
    asked: AtomicU64,
    /// Requests that asked them.
    hits: AtomicU64,
    /// The periods between the exchanges of the last lease: what its demand is measured over.
    history: Mutex<History>,
    /// This region's total demand for it at the last exchange (ppm): how long a span its
    /// demand is measured over (`demand.rs`).
    region_ppm: AtomicU64,
    /// The limit: its refill per window (what a share is a share of).
    refill: u64,
    window_ms: u64,
    /// When it was last asked for (monotonic ms).
    seen_ms: AtomicU64,
}

impl Shares {
    pub fn new(config: RegionConfig, clock: Clock, metrics: RegionMetrics) -> Shares {
        let partitions = partition_shares(&config.weights);
        let partition_ppm = config
            .regions
            .iter()
            .position(|r| *r == config.region)
            .and_then(|i| partitions.get(i))
            .map_or(0, |&p| p as u32);
        let floor_ppm = (f64::from(partition_ppm) * config.floor.clamp(0.0, 1.0)).floor() as u32;
        let now = clock.mono_ms();
        Shares {
            config,
            clock,
            keys: RwLock::new(HashMap::new()),
            contact_ms: AtomicU64::new(now),
            counted_ms: AtomicU64::new(now),
            partition_ppm,
            floor_ppm,
            metrics,
            warned_unknown: false.into(),
            peers_in_contact: true.into(),
            answered: false.into(),
            last_exchange_ms: AtomicU64::new(0),
            fresh: Mutex::new(Vec::new()),
            fresh_ready: tokio::sync::Notify::new(),
            heard: RwLock::new(Heard::default()),
            rules: Mutex::new("none".into()),
            was_partitioned: false.into(),
        }
    }

    /// Sets the digest of the global limits in force (`RuleSet::global_digest`), published
    /// with the next heartbeat.
    pub fn set_rules_digest(&self, digest: String) {
        *lock(&self.rules) = digest;
    }

    /// This replica's view: what its shares are computed from.
    pub fn view(&self) -> View {
        let cfg = &self.config;
        View {
            regions: cfg.regions.clone(),
            weights: cfg.weights.clone(),
            floor: cfg.floor,
            lease_ms: cfg.lease.as_millis() as u64,
            rules: lock(&self.rules).clone(),
        }
    }

    pub fn config(&self) -> &RegionConfig {
        &self.config
    }

    /// Whether this replica is cut off: no heartbeat answered of those sent within a lease.
    pub fn partitioned(&self) -> bool {
        self.partitioned_at(self.clock.mono_ms())
    }

    fn partitioned_at(&self, now: u64) -> bool {
        self.contact_age(now) > self.config.lease.as_millis() as u64
    }

    fn contact_age(&self, now: u64) -> u64 {
        now.saturating_sub(self.contact_ms.load(Ordering::Relaxed))
    }

    /// A key's share held now, from the share the exchanges gave it (`effective`): as given
    /// while in contact; cut off, the smaller of it and the partition share until the others
    /// have made room, then the partition share; once the others forget this replica's ended
    /// beat, the floor if another replica of its region reaches the global store (its region
    /// is shared by demand again), else still the partition share (nobody hears from its
    /// region, so everyone keeps that for it).
    fn held(&self, effective: u32, now: u64) -> u32 {
        let age = self.contact_age(now);
        let cfg = &self.config;
        let lease = cfg.lease.as_millis() as u64;
        if age <= lease {
            return effective;
        }
        if age <= self.room() {
            effective.min(self.partition_ppm)
        } else if age <= MEMORY_LEASES * lease || !self.peers_in_contact.load(Ordering::Relaxed) {
            self.partition_ppm
        } else {
            self.floor_ppm
        }
    }

    /// How long after its last answered heartbeat was sent a replica cut off waits before it
    /// holds its partition share: the others have seen its beat end and made room by then (a
    /// lease, a call's bound and two exchanges, each as long as the interval or as the last
    /// exchange took: an exchange of many keys takes several round trips).
    fn room(&self) -> u64 {
        let cfg = &self.config;
        let exchange =
            (cfg.exchange.as_millis() as u64).max(self.last_exchange_ms.load(Ordering::Relaxed));
        cfg.lease.as_millis() as u64 + self.bound().as_millis() as u64 + 2 * exchange
    }

    /// How long one call of an exchange may take (the interval, at least a second): a global
    /// store that does not answer must not hold the next exchange up.
    fn bound(&self) -> Duration {
        self.config.exchange.max(Duration::from_secs(1))
    }

    /// The op kind of global bucket `key` in this region (`kind` scaled to the region's share),
    /// counting `cost` as this replica's demand for it.
    pub fn scale(&self, key: &str, kind: OpKind, cost: u64) -> OpKind {
        let now = self.clock.mono_ms();
        let ppm = self.share_of(key, kind, cost, now);
        region_part(kind, ppm)
    }

    /// What this region holds of global bucket `key` now, read without counting it as demand
    /// nor tracking a key never seen (the counter API's read and explain): the op kind scaled
    /// to the share, and the share in ppm (a key not tracked here: the share a request would
    /// start it on).
    pub fn peek(&self, key: &str, kind: OpKind) -> (OpKind, u32) {
        let now = self.clock.mono_ms();
        let tracked = read(&self.keys)
            .get(key)
            .map(|e| e.effective.load(Ordering::Relaxed));
        let ppm = match tracked {
            Some(ppm) => self.held(ppm, now),
            None if !matches!(kind, OpKind::TokenBucket { .. }) => WHOLE as u32,
            None if self.partitioned_at(now) => self.held(self.floor_ppm, now),
            None => self.held(self.start_share(), now),
        };
        (region_part(kind, ppm), ppm)
    }

    /// The floor, in ppm: what a region holds of a key at the least.
    pub fn floor_ppm(&self) -> u32 {
        self.floor_ppm
    }

    fn share_of(&self, key: &str, kind: OpKind, cost: u64, now: u64) -> u32 {
        let found = read(&self.keys).get(key).cloned();
        let entry = match found {
            Some(e) => Some(e),
            None => {
                let OpKind::TokenBucket {
                    refill, window_ms, ..
                } = kind
                else {
                    return WHOLE as u32;
                };
                // Cut off, the others may not have made room yet: the floor, as for any key
                // (`held` lets it reach the partition share once they have). Worked out before
                // the keys' lock is taken: no lock of `heard` is taken under it.
                let start = if self.partitioned_at(now) {
                    self.floor_ppm
                } else {
                    self.start_share()
                };
                let mut keys = write(&self.keys);
                if keys.len() >= MAX_KEYS && !keys.contains_key(key) {
                    None
                } else {
                    let mut first = false;
                    let e = keys
                        .entry(key.to_string())
                        .or_insert_with(|| {
                            first = true;
                            // Nothing known of it yet: its partition share, until its first
                            // exchange (queued below, run at once) says what is left for it.
                            Arc::new(KeyShare {
                                effective: AtomicU32::new(start),
                                computed: AtomicU32::new(start),
                                asked: AtomicU64::new(0),
                                hits: AtomicU64::new(0),
                                history: Mutex::new(History::default()),
                                region_ppm: AtomicU64::new(0),
                                refill,
                                window_ms,
                                seen_ms: AtomicU64::new(now),
                            })
                        })
                        .clone();
                    drop(keys);
                    if first {
                        let mut fresh = lock(&self.fresh);
                        if fresh.len() < FRESH_MAX {
                            fresh.push(key.to_string());
                            drop(fresh);
                            self.fresh_ready.notify_one();
                        }
                    }
                    Some(e)
                }
            }
        };
        let Some(e) = entry else {
            return self.held(self.floor_ppm, now);
        };
        e.asked.fetch_add(cost, Ordering::Relaxed);
        e.hits.fetch_add(1, Ordering::Relaxed);
        e.seen_ms.store(now, Ordering::Relaxed);
        self.held(e.effective.load(Ordering::Relaxed), now)
    }

    /// One exchange with the global store: the heartbeat with this replica's settings (once
    /// answered, this replica's entry in its region's contact set, in `region`, renewed at
    /// once), then each key asked for within a lease. Errors leave the shares as they were
    /// (until the cut-off rule takes over).
    pub async fn exchange(&self, global: &dyn GlobalStore, region: &Store) {
        let now = self.clock.mono_ms();
        if self.partitioned_at(now) {
            // Held at most at what it holds cut off meanwhile: never more than that once
            // contact is back, until the exchanges have let it grow again.
            let most = self.held(self.partition_ppm, now);
            for e in read(&self.keys).values() {
                e.effective.fetch_min(most, Ordering::Relaxed);
                e.computed.fetch_min(most, Ordering::Relaxed);
            }
        }
        if !self.beat(global, region, now).await {
            return;
        }
        // Every key asked for within a lease, by this replica, is exchanged: its demand over
        // the span its history needs (`demand.rs`), 0 once it has not been asked for in a
        // lease here (its region's other replicas may still earn it a share), and its share
        // worked out again from every region's.
        let asked = self.close_periods(now);
        let answers = self.demand_calls(global, &asked).await;
        for (i, answer) in answers {
            match answer {
                Ok(totals) => self.settle(&asked[i].1, &totals, false),
                Err(_) => self.count(false),
            }
        }
        self.observe(self.clock.mono_ms());
    }

    /// Closes the period of every key tracked (what it was asked since the last close goes
    /// into its history: [`run`] closes one at each exchange and one halfway between, so a
    /// change of demand is read from the half-interval after it) and forgets each key not
    /// asked for within a lease (seen again, it starts over as a key first seen). Each key
    /// kept, with its demand.
    fn close_periods(&self, now: u64) -> Vec<(String, Arc<KeyShare>, u64)> {
        let lease_ms = self.config.lease.as_millis() as u64;
        let mut asked = Vec::new();
        let mut keys = write(&self.keys);
        let taken = self.clock.mono_ms();
        let over_ms = taken
            .saturating_sub(self.counted_ms.swap(taken, Ordering::Relaxed))
            .max(1);
        keys.retain(|key, e| {
            let period = Period {
                tokens: e.asked.swap(0, Ordering::Relaxed),
                hits: e.hits.swap(0, Ordering::Relaxed),
                ms: over_ms,
            };
            let keep = period.hits > 0
                || now.saturating_sub(e.seen_ms.load(Ordering::Relaxed)) <= lease_ms;
            if keep {
                let mut history = lock(&e.history);
                history.push(period, lease_ms);
                let region = e.region_ppm.load(Ordering::Relaxed);
                let demand = history.demand_ppm(e.refill, e.window_ms, region);
                asked.push((key.clone(), e.clone(), demand));
            }
            keep
        });
        asked
    }

    /// The heartbeat: sends this replica's settings, reads who is heard from and under which
    /// views (`agree.rs`). False when the global store did not answer.
    async fn beat(&self, global: &dyn GlobalStore, region: &Store, now: u64) -> bool {
        let cfg = &self.config;
        let lease_ms = cfg.lease.as_millis() as u64;
        let mine = self.view();
        let settings = mine.text();
        let beat = global
            .beat(
                &cfg.beat_key,
                (&cfg.region, &cfg.replica),
                lease_ms,
                MEMORY_LEASES * lease_ms,
                &settings,
                self.bound(),
            )
            .await;
        match beat {
            Ok(beats) => {
                // From when it was sent: the global store wrote it after that.
                self.contact_ms.fetch_max(now, Ordering::Relaxed);
                self.answered.store(true, Ordering::Relaxed);
                self.count(true);
                // At once: a replica of this region cut off for long holds its partition share
                // only while no other replica is in contact, and the other regions may count
                // this region heard from again as soon as this beat is read.
                self.tell_region(region).await;
                self.hear(mine, &beats);
                true
            }
            Err(e) => {
                self.count(false);
                tracing::debug!(error = %e, global_store = %cfg.global_store, "region heartbeat failed");
                self.observe(self.clock.mono_ms());
                false
            }
        }
    }

    /// One demand call per key of `asked` (its demand, ppm), 64 at a time: each one's index in
    /// `asked` with every region's totals.
    async fn demand_calls(
        &self,
        global: &dyn GlobalStore,
        asked: &[(String, Arc<KeyShare>, u64)],
    ) -> Vec<(usize, Result<Vec<(String, u64)>, StoreError>)> {
        let cfg = &self.config;
        let (bound, lease_ms) = (self.bound(), cfg.lease.as_millis() as u64);
        // Owned inputs: the calls' futures borrow nothing of `asked`.
        let calls: Vec<(usize, String, u64)> = asked
            .iter()
            .enumerate()
            .map(|(i, (key, _, demand))| (i, format!("{key}|regions"), *demand))
            .collect();
        let (region, replica) = (cfg.region.as_str(), cfg.replica.as_str());
        futures_util::stream::iter(calls)
            .map(|(i, demand_key, demand)| async move {
                let answer = global
                    .demand(&demand_key, (region, replica), demand, lease_ms, bound)
                    .await;
                (i, answer)
            })
            .buffer_unordered(DEMAND_CALLS)
            .collect()
            .await
    }

    /// The first exchange of the keys first seen since the last look, off the interval: each
    /// one's demand call (0: none measured yet) and its share from the totals it answers. Not
    /// while cut off, nor before any heartbeat was answered (who is heard from is unknown):
    /// those keys wait for the exchange on the interval, at their partition share.
    pub async fn exchange_fresh(&self, global: &dyn GlobalStore) {
        let keys: Vec<String> = std::mem::take(&mut *lock(&self.fresh));
        let now = self.clock.mono_ms();
        if keys.is_empty() || !read(&self.heard).answered || self.partitioned_at(now) {
            return;
        }
        let asked: Vec<(String, Arc<KeyShare>, u64)> = {
            let tracked = read(&self.keys);
            keys.into_iter()
                .filter_map(|k| tracked.get(&k).cloned().map(|e| (k, e, 0)))
                .collect()
        };
        for (i, answer) in self.demand_calls(global, &asked).await {
            match answer {
                Ok(totals) => self.settle(&asked[i].1, &totals, true),
                Err(_) => self.count(false),
            }
        }
    }

    /// Tells this region's own store whether this replica reaches the global store. Its
    /// entry in the region's contact set is renewed for a lease while its last answered
    /// heartbeat is at most [`Shares::room`] old: in contact, and for as long as it cut off
    /// holds no more than the smaller of its share and its partition share (a replica of its
    /// region cut off for long must not take its partition share before the others have made
    /// room for the region). After that, or before any heartbeat was answered, its entry goes
    /// and the others' live entries are counted (none: the whole region is cut off). A store
    /// that does not answer counts as a peer in contact (the floor: never more).
    pub async fn tell_region(&self, store: &Store) {
        let cfg = &self.config;
        let now = self.clock.mono_ms();
        if self.answered.load(Ordering::Relaxed) && self.contact_age(now) <= self.room() {
            let _ = store
                .heartbeat(&cfg.contact_key, &cfg.replica, cfg.lease)
                .await;
            self.peers_in_contact.store(true, Ordering::Relaxed);
        } else {
            let peers = store.leave(&cfg.contact_key, &cfg.replica).await;
            self.peers_in_contact
                .store(!matches!(peers, Ok(0)), Ordering::Relaxed);
        }
    }

    /// While cut off past the memory, reads the region's contact set every quarter exchange
    /// (a peer back in contact is found before the other regions, an exchange after they
    /// first read its beat, grow into this region's partition share). Never ends.
    async fn watch_region(&self, store: &Store) {
        let cfg = &self.config;
        let every = (cfg.exchange / 4).max(Duration::from_millis(25));
        loop {
            self.clock.sleep(every).await;
            let age = self.contact_age(self.clock.mono_ms());
            if age > MEMORY_LEASES * cfg.lease.as_millis() as u64 {
                self.tell_region(store).await;
            }
        }
    }

    /// Takes in what the heartbeat answered: which regions are heard from under this
    /// replica's view and under every other view a live replica published (`agree.rs`), the
    /// disagreements (logged when they change), and each region's contact.
    fn hear(&self, mine: View, beats: &[Beat]) {
        let cfg = &self.config;
        if let Some(unknown) = beats.iter().find(|b| !cfg.regions.contains(&b.region))
            && !self.warned_unknown.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                region = %unknown.region,
                regions = ?cfg.regions,
                global_store = %cfg.global_store,
                "a region not in this replica's `regions` shares the global store: every region must list the same regions, or their partition shares do not add up"
            );
        }
        let text = mine.text();
        let mut disagreements = Vec::new();
        let mut others: Vec<View> = Vec::new();
        for b in beats.iter().filter(|b| b.left_ms > 0) {
            if b.settings.is_empty() || b.settings == text {
                continue;
            }
            disagreements.push(Disagreement {
                region: b.region.clone(),
                replica: b.replica.clone(),
                settings: b.settings.clone(),
            });
            if let Some(view) = View::parse(&b.settings)
                && mine.shares_differ(&view)
                && !others.contains(&view)
            {
                others.push(view);
            }
        }
        disagreements.sort_by(|a, b| (&a.region, &a.replica).cmp(&(&b.region, &b.replica)));
        let lease_ms = cfg.lease.as_millis() as i64;
        let regions = cfg
            .regions
            .iter()
            .map(|name| {
                let mine = beats.iter().filter(|b| b.region == *name);
                let heard = heard_from(name, beats);
                let age = mine.map(|b| (lease_ms - b.left_ms).max(0) as u64).min();
                (heard, age)
            })
            .collect();
        let mut views = vec![(mine.clone(), reachable(&mine.regions, beats))];
        views.extend(others.into_iter().map(|v| {
            let heard = reachable(&v.regions, beats);
            (v, heard)
        }));
        let mut heard = write(&self.heard);
        if heard.disagreements != disagreements {
            for d in disagreements
                .iter()
                .filter(|d| !heard.disagreements.contains(d))
            {
                tracing::error!(
                    region = %d.region,
                    replica = %d.replica,
                    theirs = %d.settings,
                    ours = %text,
                    this_region = %cfg.region,
                    global_store = %cfg.global_store,
                    "regions disagree on how global limits are shared: every region must list the same regions, weights, floor and lease, and load the same global limits; until they do, each region holds the smallest share any of the settings gives it"
                );
            }
            if disagreements.is_empty() {
                tracing::info!(global_store = %cfg.global_store, "the regions agree again on how global limits are shared");
            }
        }
        self.metrics.disagreements.set(disagreements.len() as i64);
        *heard = Heard {
            views,
            disagreements,
            regions,
            answered: true,
        };
    }

    /// Puts one key's exchange in: its region's share from every region's demand (`totals`),
    /// the smallest any view gives. Growth waits one exchange; shrinking is at once. A key's
    /// `first` exchange (off the interval) takes its share at once, but only ever down from
    /// the partition share it started at: it is what the others' last exchanges leave for
    /// this region, with this replica asking nothing yet.
    fn settle(&self, e: &KeyShare, totals: &[(String, u64)], first: bool) {
        let region = totals
            .iter()
            .find(|(r, _)| *r == self.config.region)
            .map_or(0, |(_, d)| *d);
        e.region_ppm.store(region, Ordering::Relaxed);
        let mine = {
            let heard = read(&self.heard);
            self.share_under(&heard.views, totals)
        };
        let held = if first {
            e.computed.store(mine, Ordering::Relaxed);
            e.effective.fetch_min(mine, Ordering::Relaxed).min(mine)
        } else {
            let before = e.computed.swap(mine, Ordering::Relaxed);
            e.effective.store(mine.min(before), Ordering::Relaxed);
            mine.min(before)
        };
        self.metrics.share.observe(f64::from(held) / WHOLE as f64);
    }

    /// A key's share before its first exchange: this region's partition share, the smallest
    /// any view heard gives it (a view that does not list it gives it nothing).
    fn start_share(&self) -> u32 {
        let heard = read(&self.heard);
        let region = &self.config.region;
        heard
            .views
            .iter()
            .skip(1)
            .map(|(view, _)| {
                view.regions
                    .iter()
                    .position(|r| r == region)
                    .map_or(0, |at| partition_shares(&view.weights)[at] as u32)
            })
            .fold(self.partition_ppm, u32::min)
    }

    /// This region's share of a key under every view (this replica's first): the smallest.
    /// Under a view whose global limits differ from this replica's, every region is held to
    /// its partition share (the regions do not see each other's demand); a view that does not
    /// list this region gives it nothing.
    fn share_under(&self, views: &[(View, Vec<bool>)], totals: &[(String, u64)]) -> u32 {
        let cfg = &self.config;
        let Some((mine, _)) = views.first() else {
            return self.floor_ppm;
        };
        let mut least = u32::MAX;
        for (view, reachable) in views {
            let Some(at) = view.regions.iter().position(|r| *r == cfg.region) else {
                return 0;
            };
            let share = if view.rules != mine.rules {
                partition_shares(&view.weights)[at] as u32
            } else {
                let demands: Vec<RegionDemand> = view
                    .regions
                    .iter()
                    .zip(reachable)
                    .zip(&view.weights)
                    .map(|((name, &reachable), &weight)| RegionDemand {
                        reachable,
                        weight,
                        demand_ppm: totals
                            .iter()
                            .find(|(r, _)| r == name)
                            .map_or(0, |(_, d)| *d),
                    })
                    .collect();
                allocate(&demands, view.floor)[at]
            };
            least = least.min(share);
        }
        least
    }

    /// What `/readyz` and `/config` show of the regions: this region, who is heard from and
    /// how lately, whether this replica is cut off, the disagreements, and the shares held now
    /// of at most `most` global keys (by name; `keys` counts them all).
    pub fn report(&self, most: usize) -> serde_json::Value {
        let cfg = &self.config;
        let now = self.clock.mono_ms();
        // Read and let go before the keys' lock is taken: the two are never held together.
        let (heard_regions, heard_disagreements, answered) = {
            let heard = read(&self.heard);
            (
                heard.regions.clone(),
                heard.disagreements.clone(),
                heard.answered,
            )
        };
        let regions: Vec<serde_json::Value> = cfg
            .regions
            .iter()
            .zip(&cfg.weights)
            .enumerate()
            .map(|(i, (name, weight))| {
                let (heard_from, age) = heard_regions.get(i).copied().unwrap_or((false, None));
                serde_json::json!({
                    "name": name,
                    "weight": weight,
                    "heard_from": heard_from,
                    "last_beat_age_ms": age,
                })
            })
            .collect();
        let disagreements: Vec<serde_json::Value> = heard_disagreements
            .iter()
            .map(|d| serde_json::json!({"region": d.region, "replica": d.replica, "settings": d.settings}))
            .collect();
        let settings = self.view().text();
        let keys = read(&self.keys);
        let mut names: Vec<&String> = keys.keys().collect();
        names.sort_unstable();
        let shares: Vec<serde_json::Value> = names
            .iter()
            .take(most)
            .map(|k| {
                let e = &keys[*k];
                let held = self.held(e.effective.load(Ordering::Relaxed), now);
                serde_json::json!({"key": k, "share": f64::from(held) / WHOLE as f64})
            })
            .collect();
        serde_json::json!({
            "region": cfg.region,
            "global_store": cfg.global_store,
            "regions": regions,
            "contact_age_ms": answered.then(|| self.contact_age(now)),
            "partitioned": self.partitioned_at(now),
            "settings": settings,
            "disagreements": disagreements,
            "keys": keys.len(),
            "shares": shares,
        })
    }

    fn count(&self, ok: bool) {
        self.metrics
            .exchanges
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "error" },
            })
            .inc();
    }

    /// Updates the gauges, and says so in the log when this replica is cut off from the
    /// global store or back in contact.
    fn observe(&self, now: u64) {
        let age = self.contact_age(now);
        let partitioned = self.partitioned_at(now);
        self.metrics.contact_age.set(age as f64 / 1000.0);
        self.metrics.partitioned.set(i64::from(partitioned));
        self.metrics.keys.set(read(&self.keys).len() as i64);
        let cfg = &self.config;
        if partitioned != self.was_partitioned.swap(partitioned, Ordering::Relaxed) {
            if partitioned {
                tracing::warn!(
                    region = %cfg.region,
                    global_store = %cfg.global_store,
                    contact_age_ms = age,
                    "cut off from the global store: no heartbeat answered within region_lease_ms; each global limit is held at most at this region's partition share until contact is back"
                );
            } else {
                tracing::info!(
                    region = %cfg.region,
                    global_store = %cfg.global_store,
                    "back in contact with the global store; global limits' shares grow again through the exchanges"
                );
            }
        }
    }
}

/// Whether each region of `regions` is heard from: one of its replicas' beats live, and none
/// ended within the memory.
fn reachable(regions: &[String], beats: &[Beat]) -> Vec<bool> {
    regions.iter().map(|name| heard_from(name, beats)).collect()
}

fn heard_from(region: &str, beats: &[Beat]) -> bool {
    let mut mine = beats.iter().filter(|b| b.region == region);
    let live = mine.clone().any(|b| b.left_ms > 0);
    let ended = mine.any(|b| b.left_ms <= 0);
    live && !ended
}

/// Exchanges every `region_exchange_ms` (from start to start) until `stop`, tells this
/// region's own store (`region`) each time whether this replica reaches the global store, and
/// between two exchanges exchanges the keys first seen at once. `rules` gives the digest of
/// the global limits in force (`RuleSet::global_digest`), published with each heartbeat.
pub async fn run(
    shares: Arc<Shares>,
    global: Arc<dyn GlobalStore>,
    region: Arc<Store>,
    mut rules: impl FnMut() -> String,
    clock: Clock,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    let interval = shares.config.exchange.as_millis() as u64;
    loop {
        shares.set_rules_digest(rules());
        let turn = async {
            let started = clock.mono_ms();
            shares.exchange(&*global, &region).await;
            shares
                .last_exchange_ms
                .store(clock.mono_ms().saturating_sub(started), Ordering::Relaxed);
            shares.tell_region(&region).await;
            // The next exchange starts an interval after this one started (one that ran past
            // the interval is followed at once); halfway, every key's period is closed (its
            // demand is read at half an interval's grain); keys first seen meanwhile are
            // exchanged now.
            let mut halved = false;
            loop {
                let now = clock.mono_ms();
                if !halved && now >= started + interval / 2 {
                    shares.close_periods(now);
                    halved = true;
                }
                let until = started + if halved { interval } else { interval / 2 };
                let left = until.saturating_sub(now);
                if left == 0 {
                    if halved {
                        break;
                    }
                    continue;
                }
                tokio::select! {
                    () = clock.sleep(Duration::from_millis(left)) => {}
                    () = shares.fresh_ready.notified() => shares.exchange_fresh(&*global).await,
                }
            }
        };
        tokio::select! {
            _ = &mut stop => break,
            () = turn => {}
            () = shares.watch_region(&region) => {}
        }
    }

    // A graceful stop: this replica's beat goes, so its region is not counted as one whose
    // replica fell silent (which keeps its partition share for it).
    let cfg = &shares.config;
    let _ = region.leave(&cfg.contact_key, &cfg.replica).await;
    if let Err(e) = global
        .leave(&cfg.beat_key, (&cfg.region, &cfg.replica), shares.bound())
        .await
    {
        tracing::debug!(error = %e, "could not leave the regions' heartbeat");
    }
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // Every change under this lock is one step: a panic leaves it consistent.
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

fn lock<T>(l: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    l.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Metrics;

    const KEY: &str = "t:{d|tenant=a|tb:1000:100}";

    fn shares(clock: &Clock) -> Shares {
        Shares::new(
            RegionConfig {
                region: "eu".into(),
                regions: vec!["us".into(), "eu".into(), "ap".into()],
                weights: vec![1.0; 3],
                exchange: Duration::from_millis(1_000),
                lease: Duration::from_millis(10_000),
                floor: 0.1,
                beat_key: "t:{regions}".into(),
                contact_key: "t:{regions-contact}".into(),
                replica: "r1".into(),
                global_store: "redis://global".into(),
            },
            clock.clone(),
            Metrics::new().regions.clone(),
        )
    }

    fn bucket() -> OpKind {
        OpKind::TokenBucket {
            capacity: 100,
            refill: 100,
            window_ms: 1_000,
        }
    }

    fn capacity(kind: OpKind) -> u64 {
        match kind {
            OpKind::TokenBucket { capacity, .. } => capacity,
            _ => unreachable!(),
        }
    }

    const ALL: [bool; 3] = [true, true, true];

    /// As if the last heartbeat had answered that `reachable` regions are heard from, every
    /// replica agreeing; then one exchange of `e` with `totals`.
    fn settle(s: &Shares, e: &KeyShare, reachable: &[bool], totals: &[(String, u64)]) {
        *write(&s.heard) = Heard {
            views: vec![(s.view(), reachable.to_vec())],
            answered: true,
            ..Heard::default()
        };
        s.settle(e, totals, false);
    }

    fn beat(region: &str, left_ms: i64) -> Beat {
        Beat {
            region: region.into(),
            replica: format!("{region}-1"),
            left_ms,
            settings: String::new(),
        }
    }

    #[test]
    fn a_new_key_holds_its_partition_share_until_its_first_exchange_and_growth_waits_one() {
        let clock = Clock::manual(1_700_000_000_000);
        let s = shares(&clock);
        // Nothing known of it: its third, and it is queued for an exchange at once.
        assert_eq!(capacity(s.scale(KEY, bucket(), 1)), 33);
        assert_eq!(*lock(&s.fresh), [KEY.to_string()]);
        let e = read(&s.keys).get(KEY).cloned().unwrap();
        assert_eq!(e.asked.load(Ordering::Relaxed), 1);
        // Its first exchange: us asks for everything, so what is left for eu is its floor
        // (a tenth of a third), taken at once.
        *write(&s.heard) = Heard {
            views: vec![(s.view(), ALL.to_vec())],
            answered: true,
            ..Heard::default()
        };
        s.settle(&e, &[("us".to_string(), 5_000_000)], true);
        assert_eq!(capacity(s.scale(KEY, bucket(), 1)), 3);
        // Only eu asks: what it asks (with the headroom) and a third of what nobody asks for,
        // one exchange later: 33,333 + 566,667 + 111,111.
        let totals = [("eu".to_string(), 500_000)];
        settle(&s, &e, &ALL, &totals);
        assert_eq!(capacity(s.scale(KEY, bucket(), 1)), 3, "growth waits");
        settle(&s, &e, &ALL, &totals);
        assert_eq!(capacity(s.scale(KEY, bucket(), 1)), 71);
        // us asks for far more: the two split what is past the floors, and eu shrinks at once.
        let totals = [("eu".to_string(), 500_000), ("us".to_string(), 5_000_000)];
        settle(&s, &e, &ALL, &totals);
        assert_eq!(capacity(s.scale(KEY, bucket(), 1)), 48);
    }

    #[test]
    fn a_region_not_heard_from_is_kept_its_third_and_a_replica_cut_off_steps_down_then_to_it() {
        let clock = Clock::manual(1_700_000_000_000);
        let s = shares(&clock);
        s.scale(KEY, bucket(), 1);
        let e = read(&s.keys).get(KEY).cloned().unwrap();
        // ap is not heard from: a third kept for it; us and eu ask for everything.
        let totals = [("us".to_string(), 5_000_000), ("eu".to_string(), 5_000_000)];
        let heard = [true, true, false];
        settle(&s, &e, &heard, &totals);
        settle(&s, &e, &heard, &totals);
        assert_eq!(capacity(s.scale(KEY, bucket(), 1)), 33);
        let new_key = "t:{d|tenant=b|tb:1000:100}";
        // Cut off (no beat answered of those sent within the lease): first the smaller of its
        // share and a third, a new key the floor…
        clock.advance_ms(9_900);
        assert!(!s.partitioned());
        clock.advance_ms(200);
        assert!(s.partitioned());
        assert_eq!(capacity(s.scale(KEY, bucket(), 1)), 33);
        assert_eq!(capacity(s.scale(new_key, bucket(), 1)), 3);
        // …once the others have made room (a lease, a call's bound, two exchanges), a third…
        clock.advance_ms(3_000);
        assert_eq!(capacity(s.scale(new_key, bucket(), 1)), 33);
        // …and, once the others forget its ended beat, the floor while another replica of its
        // region reaches the global store (its region is shared by demand again)…
        clock.advance_ms(MEMORY_LEASES * 10_000);
        assert_eq!(capacity(s.scale(KEY, bucket(), 1)), 3);
    }

    #[tokio::test]
    async fn a_whole_region_cut_off_keeps_its_third_past_the_memory() {
        let clock = Clock::manual(1_700_000_000_000);
        let s = shares(&clock);
        let region = Store::Memory(crate::store::MemoryStore::new(clock.clone()));
        s.tell_region(&region).await;
        clock.advance_ms(MEMORY_LEASES * 10_000 + 1);
        assert!(s.partitioned());
        // Its region's store counts no other replica in contact: nobody hears from the
        // region, everyone keeps its third for it, and so does it.
        s.tell_region(&region).await;
        assert_eq!(capacity(s.scale(KEY, bucket(), 1)), 33);
    }

    #[test]
    fn a_region_is_heard_from_while_a_beat_lives_and_none_ended_lately() {
        let clock = Clock::manual(1_700_000_000_000);
        let s = shares(&clock);
        let beats = [
            beat("us", 900),
            beat("us", 4_000),
            beat("eu", 800),
            beat("eu", -50),
            beat("mars", 500),
        ];
        // eu has a replica whose beat ended: counted at its partition share; ap is silent.
        assert_eq!(reachable(&s.config.regions, &beats), [true, false, false]);
    }

    #[test]
    fn while_a_live_replica_shares_by_other_settings_each_region_holds_the_smallest_share() {
        let clock = Clock::manual(1_700_000_000_000);
        let s = shares(&clock);
        s.set_rules_digest("00000000000000aa".into());
        s.scale(KEY, bucket(), 1);
        let e = read(&s.keys).get(KEY).cloned().unwrap();
        let mine = s.view();
        let live = |region: &str, settings: &str| Beat {
            settings: settings.into(),
            ..beat(region, 5_000)
        };
        // eu asks for everything, nobody else asks: eu's share is all but the others' floors.
        let totals = [("eu".to_string(), 5_000_000)];
        let agree = [
            live("us", &mine.text()),
            live("eu", ""),
            live("ap", &mine.text()),
        ];
        s.hear(mine.clone(), &agree);
        s.settle(&e, &totals, true);
        assert_eq!(e.computed.load(Ordering::Relaxed), 933_334);
        assert!(read(&s.heard).disagreements.is_empty());
        // A us replica weighs us 4 of 6: under its view eu's floor is a tenth of a sixth and
        // the others' floors are larger; eu takes the smaller share of the two views.
        let heavy = View {
            weights: vec![4.0, 1.0, 1.0],
            ..mine.clone()
        };
        let eu = live("eu", &mine.text());
        s.hear(
            mine.clone(),
            &[live("us", &heavy.text()), eu.clone(), live("ap", "")],
        );
        s.settle(&e, &totals, true);
        assert_eq!(e.computed.load(Ordering::Relaxed), 916_668);
        let heard = read(&s.heard);
        assert_eq!(heard.disagreements.len(), 1);
        assert_eq!(heard.disagreements[0].settings, heavy.text());
        assert_eq!(s.metrics.disagreements.get(), 1);
        drop(heard);
        // Other global limits: no region sees the other's demand, so each holds its
        // partition share at most.
        let other_rules = View {
            rules: "00000000000000bb".into(),
            ..mine.clone()
        };
        s.hear(
            mine.clone(),
            &[live("us", ""), eu.clone(), live("ap", &other_rules.text())],
        );
        s.settle(&e, &totals, true);
        assert_eq!(e.computed.load(Ordering::Relaxed), 333_333);
        // A view that does not list eu gives it nothing.
        let without_eu = View {
            regions: vec!["us".into(), "ap".into()],
            weights: vec![1.0, 1.0],
            ..mine.clone()
        };
        s.hear(
            mine.clone(),
            &[live("us", &without_eu.text()), eu.clone(), live("ap", "")],
        );
        s.settle(&e, &totals, true);
        assert_eq!(e.computed.load(Ordering::Relaxed), 0);
        // A lease that differs is reported, and changes no share.
        let lease = View {
            lease_ms: 20_000,
            ..mine.clone()
        };
        s.hear(
            mine.clone(),
            &[live("us", &lease.text()), eu.clone(), live("ap", "")],
        );
        s.settle(&e, &totals, false);
        assert_eq!(e.computed.load(Ordering::Relaxed), 933_334);
        assert_eq!(read(&s.heard).disagreements.len(), 1);
        // Agreeing again: nothing reported.
        s.hear(mine.clone(), &[live("us", &mine.text())]);
        assert!(read(&s.heard).disagreements.is_empty());
        assert_eq!(s.metrics.disagreements.get(), 0);
    }

    #[test]
    fn past_the_key_cap_a_key_holds_the_floor_untracked() {
        let clock = Clock::manual(1_700_000_000_000);
        let s = shares(&clock);
        {
            let mut keys = write(&s.keys);
            for i in 0..MAX_KEYS {
                keys.insert(
                    format!("k{i}"),
                    Arc::new(KeyShare {
                        effective: AtomicU32::new(0),
                        computed: AtomicU32::new(0),
                        asked: AtomicU64::new(0),
                        hits: AtomicU64::new(0),
                        history: Mutex::new(History::default()),
                        region_ppm: AtomicU64::new(0),
                        refill: 1,
                        window_ms: 1,
                        seen_ms: AtomicU64::new(0),
                    }),
                );
            }
        }
        assert_eq!(capacity(s.scale(KEY, bucket(), 1)), 3);
        assert!(!read(&s.keys).contains_key(KEY));
    }

    /// A global store whose replicas can be cut off one by one: a cut-off replica's calls fail
    /// at once; every region is reported heard from, nobody asks for anything.
    #[derive(Debug, Default)]
    struct Global {
        cut: std::sync::Mutex<Vec<String>>,
    }

    impl Global {
        fn set_cut(&self, replica: &str, cut: bool) {
            let mut list = self.cut.lock().unwrap();
            list.retain(|r| r != replica);
            if cut {
                list.push(replica.to_string());
            }
        }

        fn answers(&self, replica: &str) -> Result<(), StoreError> {
            if self.cut.lock().unwrap().iter().any(|r| r == replica) {
                Err(StoreError::new(
                    crate::store::StoreErrorKind::Timeout,
                    "cut",
                ))
            } else {
                Ok(())
            }
        }
    }

    impl GlobalStore for Global {
        fn beat<'a>(
            &'a self,
            _key: &'a str,
            (_, replica): (&'a str, &'a str),
            _ttl_ms: u64,
            _memory_ms: u64,
            _settings: &'a str,
            _timeout: Duration,
        ) -> BoxFuture<'a, Result<Vec<Beat>, StoreError>> {
            let beats = ["us", "eu", "ap"].map(|r| beat(r, 5_000)).to_vec();
            Box::pin(async move { self.answers(replica).map(|()| beats) })
        }

        fn leave<'a>(
            &'a self,
            _key: &'a str,
            _who: (&'a str, &'a str),
            _timeout: Duration,
        ) -> BoxFuture<'a, Result<(), StoreError>> {
            Box::pin(async { Ok(()) })
        }

        fn demand<'a>(
            &'a self,
            _key: &'a str,
            (_, replica): (&'a str, &'a str),
            _demand_ppm: u64,
            _ttl_ms: u64,
            _timeout: Duration,
        ) -> BoxFuture<'a, Result<Vec<(String, u64)>, StoreError>> {
            Box::pin(async move { self.answers(replica).map(|()| Vec::new()) })
        }
    }

    /// A region's store that keeps only the membership sets (as `lua/membership.lua` does).
    #[derive(Debug)]
    struct Members {
        clock: Clock,
        sets: std::sync::Mutex<HashMap<String, HashMap<String, u64>>>,
    }

    impl Members {
        fn change(&self, key: &str, replica: &str, ttl: Option<Duration>) -> u64 {
            let now = self.clock.mono_ms();
            let mut sets = self.sets.lock().unwrap();
            let set = sets.entry(key.to_string()).or_default();
            set.retain(|_, until| *until > now);
            match ttl {
                Some(ttl) => set.insert(replica.to_string(), now + ttl.as_millis() as u64),
                None => set.remove(replica),
            };
            set.len() as u64
        }
    }

    impl crate::store::Backend for Members {
        fn apply_each<'a>(
            &'a self,
            _ops: &'a [crate::quota::Op],
        ) -> BoxFuture<'a, Vec<Result<crate::quota::Outcome, StoreError>>> {
            Box::pin(async { Vec::new() })
        }

        fn heartbeat<'a>(
            &'a self,
            key: &'a str,
            replica: &'a str,
            ttl: Duration,
        ) -> BoxFuture<'a, Result<u64, StoreError>> {
            Box::pin(async move { Ok(self.change(key, replica, Some(ttl))) })
        }

        fn leave<'a>(
            &'a self,
            key: &'a str,
            replica: &'a str,
        ) -> BoxFuture<'a, Result<u64, StoreError>> {
            Box::pin(async move { Ok(self.change(key, replica, None)) })
        }

        fn name(&self) -> &'static str {
            "members"
        }
    }

    fn replica_of_eu(clock: &Clock, name: &str) -> Shares {
        let mut s = shares(clock);
        s.config.replica = name.into();
        s
    }

    /// Both replicas of eu run one exchange (and say what they know to their region's store),
    /// then the clock moves a second.
    async fn second(a: &Shares, b: &Shares, global: &Global, region: &Store, clock: &Clock) {
        for s in [a, b] {
            s.exchange(global, region).await;
            s.tell_region(region).await;
        }
        clock.advance_ms(1_000);
    }

    #[tokio::test]
    async fn a_replica_cut_off_for_long_holds_the_floor_while_a_peer_is_in_contact() {
        let clock = Clock::manual(1_700_000_000_000);
        let (a, b) = (replica_of_eu(&clock, "a"), replica_of_eu(&clock, "b"));
        let global = Global::default();
        let region = Store::Custom(Arc::new(Members {
            clock: clock.clone(),
            sets: Default::default(),
        }));
        for s in [&a, &b] {
            s.scale(KEY, bucket(), 1);
        }
        second(&a, &b, &global, &region, &clock).await;
        // a is cut off; b stays in contact: past the memory, a holds the floor.
        global.set_cut("a", true);
        for _ in 0..(MEMORY_LEASES * 10 + 2) {
            second(&a, &b, &global, &region, &clock).await;
        }
        assert!(a.partitioned() && !b.partitioned());
        assert_eq!(capacity(a.scale(KEY, bucket(), 1)), 3, "a peer in contact");
        // b is cut off too. Until b has been cut off long enough to hold its third itself
        // (the others have made room for eu by then), a still sees b in the contact set.
        global.set_cut("b", true);
        for _ in 0..12 {
            second(&a, &b, &global, &region, &clock).await;
        }
        assert!(b.partitioned());
        assert_eq!(
            capacity(a.scale(KEY, bucket(), 1)),
            3,
            "b not yet past its room"
        );
        // Once b's entry has lapsed (a lease after b stopped renewing it), a keeps its third.
        for _ in 0..12 {
            second(&a, &b, &global, &region, &clock).await;
        }
        assert_eq!(
            capacity(a.scale(KEY, bucket(), 1)),
            33,
            "the whole region cut off"
        );
        // b is back: its entry is written as soon as its beat is answered, so a drops to the
        // floor at its next look, before another region can grow into eu's third.
        global.set_cut("b", false);
        b.exchange(&global, &region).await;
        a.tell_region(&region).await;
        assert_eq!(capacity(a.scale(KEY, bucket(), 1)), 3, "b back in contact");
    }
}
