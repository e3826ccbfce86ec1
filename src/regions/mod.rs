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
//! - **Every key this replica saw asked for within a lease** is exchanged, with the demand it
//!   saw since the last exchange (0 when it saw none: with many replicas in a region, each
//!   sees a quiet key now and then while the region as a whole asks for it steadily), and
//!   its share is worked out again from every region's totals, so the replicas of a region
//!   hold the same share whichever of them a key's requests reach. A key not seen within a
//!   lease is forgotten; a key first seen holds the floor (`region_floor` × `1/R`) until its
//!   exchanges say more.
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

mod allocate;

pub use allocate::{HEADROOM, RegionDemand, WHOLE, allocate, partition_shares};

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
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

/// Demand above this (parts per million of the limit: a million times the limit) is counted as
/// this: the global store sums it in Lua's doubles.
const MAX_DEMAND_PPM: u64 = 1_000_000_000_000;

/// `KeyShare::asked_before` of a key not tracked in the exchange before.
const NONE: u64 = u64::MAX;

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
}

/// The global store's three calls (`lua/regions.lua`): a Redis in `serve`, a model of one on
/// the virtual clock in `tollgate simulate` (`sim/regions.rs`). An exchange is a few calls a
/// second per replica, never on a decision's path, so its futures are boxed.
pub trait GlobalStore: std::fmt::Debug + Send + Sync {
    /// Writes `replica`'s heartbeat (lasting `ttl_ms`) and returns every replica's region with
    /// the ms its beat has left (0 or less: ended), for beats ended within `memory_ms`.
    fn beat<'a>(
        &'a self,
        key: &'a str,
        who: (&'a str, &'a str),
        ttl_ms: u64,
        memory_ms: u64,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Vec<(String, i64)>, StoreError>>;

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
        timeout: Duration,
    ) -> BoxFuture<'a, Result<Vec<(String, i64)>, StoreError>> {
        Box::pin(self.region_beat(key, who, ttl_ms, memory_ms, timeout))
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

/// This replica's view of its region's shares of the global keys.
#[derive(Debug)]
pub struct Shares {
    config: RegionConfig,
    clock: Clock,
    keys: RwLock<HashMap<String, Arc<KeyShare>>>,
    /// When the last heartbeat the global store answered was sent (monotonic ms).
    contact_ms: AtomicU64,
    /// When the demand was last taken (monotonic ms): demand is asked over the time since.
    counted_ms: AtomicU64,
    /// How long the period before the last one was (ms): demand is measured over both.
    counted_before_ms: AtomicU64,
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
}

#[derive(Debug)]
struct KeyShare {
    /// The share in force (parts per million).
    effective: AtomicU32,
    /// The last share worked out: a larger one takes effect only when it is worked out twice.
    computed: AtomicU32,
    /// Tokens asked for since the last exchange.
    asked: AtomicU64,
    /// Tokens asked for in the exchange before (`NONE`: the key was not tracked then).
    asked_before: AtomicU64,
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
            counted_before_ms: AtomicU64::new(0),
            partition_ppm,
            floor_ppm,
            metrics,
            warned_unknown: false.into(),
            peers_in_contact: true.into(),
            answered: false.into(),
            last_exchange_ms: AtomicU64::new(0),
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
                let mut keys = write(&self.keys);
                if keys.len() >= MAX_KEYS && !keys.contains_key(key) {
                    None
                } else {
                    Some(
                        keys.entry(key.to_string())
                            .or_insert_with(|| {
                                Arc::new(KeyShare {
                                    effective: AtomicU32::new(self.floor_ppm),
                                    computed: AtomicU32::new(self.floor_ppm),
                                    asked: AtomicU64::new(0),
                                    asked_before: AtomicU64::new(NONE),
                                    refill,
                                    window_ms,
                                    seen_ms: AtomicU64::new(now),
                                })
                            })
                            .clone(),
                    )
                }
            }
        };
        let Some(e) = entry else {
            return self.held(self.floor_ppm, now);
        };
        e.asked.fetch_add(cost, Ordering::Relaxed);
        e.seen_ms.store(now, Ordering::Relaxed);
        self.held(e.effective.load(Ordering::Relaxed), now)
    }

    /// One exchange with the global store: the heartbeat (once answered, this replica's entry
    /// in its region's contact set, in `region`, renewed at once), then each key asked for
    /// within a lease. Errors leave the shares as they were (until the cut-off rule takes
    /// over).
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
        let cfg = &self.config;
        let lease_ms = cfg.lease.as_millis() as u64;
        let beat = global
            .beat(
                &cfg.beat_key,
                (&cfg.region, &cfg.replica),
                lease_ms,
                MEMORY_LEASES * lease_ms,
                self.bound(),
            )
            .await;
        let beats = match beat {
            Ok(beats) => {
                // From when it was sent: the global store wrote it after that.
                self.contact_ms.fetch_max(now, Ordering::Relaxed);
                self.answered.store(true, Ordering::Relaxed);
                self.count(true);
                // At once: a replica of this region cut off for long holds its partition share
                // only while no other replica is in contact, and the other regions may count
                // this region heard from again as soon as this beat is read.
                self.tell_region(region).await;
                beats
            }
            Err(e) => {
                self.count(false);
                tracing::debug!(error = %e, "region heartbeat failed");
                self.observe(self.clock.mono_ms());
                return;
            }
        };
        let reachable = self.reachable(&beats);
        // Every key asked for within a lease, by this replica, is exchanged: its demand over
        // the last two periods between exchanges (one, for a key new since), and its share
        // worked out again from every region's. Two periods, because one is a count of a few
        // requests: a region asking 20 a second over two replicas exchanging every 450 ms was
        // measured at 16 to 21, and its share (with the headroom) at times below what it
        // asked. 0 for a key it did not see meanwhile, whose share its region's other replicas
        // may still earn. A key not asked for within a lease is forgotten (seen again, it
        // starts from the floor).
        let mut asked: Vec<(String, Arc<KeyShare>, u64, u64)> = Vec::new();
        let (over_ms, before_ms);
        {
            let mut keys = write(&self.keys);
            let taken = self.clock.mono_ms();
            over_ms = taken
                .saturating_sub(self.counted_ms.swap(taken, Ordering::Relaxed))
                .max(1);
            before_ms = self.counted_before_ms.swap(over_ms, Ordering::Relaxed);
            keys.retain(|key, e| {
                let n = e.asked.swap(0, Ordering::Relaxed);
                let keep =
                    n > 0 || now.saturating_sub(e.seen_ms.load(Ordering::Relaxed)) <= lease_ms;
                if keep {
                    // Over both periods, or this one alone for a key new since the last.
                    let (tokens, ms) = match e.asked_before.swap(n, Ordering::Relaxed) {
                        NONE => (n, over_ms),
                        b => (n.saturating_add(b), over_ms + before_ms),
                    };
                    asked.push((key.clone(), e.clone(), tokens, ms));
                }
                keep
            });
        }
        let bound = self.bound();
        // Owned inputs: the calls' futures borrow nothing of `asked`.
        let calls: Vec<(usize, String, u64)> = asked
            .iter()
            .enumerate()
            .map(|(i, (key, e, n, ms))| {
                // Tokens asked over one window of the limit, as parts per million of its refill.
                let per_window =
                    u128::from(*n) * u128::from(e.window_ms) / u128::from((*ms).max(1));
                let demand = (per_window * u128::from(WHOLE) / u128::from(e.refill.max(1)))
                    .min(u128::from(MAX_DEMAND_PPM)) as u64;
                (i, format!("{key}|regions"), demand)
            })
            .collect();
        let (region, replica) = (cfg.region.as_str(), cfg.replica.as_str());
        let answers: Vec<_> = futures_util::stream::iter(calls)
            .map(|(i, demand_key, demand)| async move {
                let answer = global
                    .demand(&demand_key, (region, replica), demand, lease_ms, bound)
                    .await;
                (i, answer)
            })
            .buffer_unordered(DEMAND_CALLS)
            .collect()
            .await;
        for (i, answer) in answers {
            match answer {
                Ok(totals) => self.settle(&asked[i].1, &reachable, &totals),
                Err(_) => self.count(false),
            }
        }
        self.observe(self.clock.mono_ms());
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

    /// Whether each region of `regions` is heard from: one of its replicas' beats live, and
    /// none ended within the memory.
    fn reachable(&self, beats: &[(String, i64)]) -> Vec<bool> {
        let cfg = &self.config;
        if let Some((unknown, _)) = beats.iter().find(|(r, _)| !cfg.regions.contains(r))
            && !self.warned_unknown.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                region = %unknown,
                regions = ?cfg.regions,
                "a region not in this replica's `regions` shares the global store: every region must list the same regions, or their partition shares do not add up"
            );
        }
        cfg.regions
            .iter()
            .map(|name| {
                let mine = beats.iter().filter(|(r, _)| r == name);
                let live = mine.clone().any(|(_, left)| *left > 0);
                let ended = mine.clone().any(|(_, left)| *left <= 0);
                live && !ended
            })
            .collect()
    }

    /// Puts one key's exchange in: its region's share from every region's demand (`totals`)
    /// and which regions are heard from (`reachable`, in the order of `regions`). Growth waits
    /// one exchange; shrinking is at once.
    fn settle(&self, e: &KeyShare, reachable: &[bool], totals: &[(String, u64)]) {
        let cfg = &self.config;
        let views: Vec<RegionDemand> = cfg
            .regions
            .iter()
            .zip(reachable)
            .zip(&cfg.weights)
            .map(|((name, &reachable), &weight)| RegionDemand {
                reachable,
                weight,
                demand_ppm: totals
                    .iter()
                    .find(|(r, _)| r == name)
                    .map_or(0, |(_, d)| *d),
            })
            .collect();
        let shares = allocate(&views, cfg.floor);
        let mine = cfg
            .regions
            .iter()
            .position(|r| *r == cfg.region)
            .map_or(self.floor_ppm, |i| shares[i]);
        let before = e.computed.swap(mine, Ordering::Relaxed);
        e.effective.store(mine.min(before), Ordering::Relaxed);
        self.metrics
            .share
            .observe(f64::from(mine.min(before)) / WHOLE as f64);
    }

    fn count(&self, ok: bool) {
        self.metrics
            .exchanges
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "error" },
            })
            .inc();
    }

    fn observe(&self, now: u64) {
        let age = now.saturating_sub(self.contact_ms.load(Ordering::Relaxed));
        self.metrics.contact_age.set(age as f64 / 1000.0);
        self.metrics
            .partitioned
            .set(i64::from(self.partitioned_at(now)));
        self.metrics.keys.set(read(&self.keys).len() as i64);
    }
}

/// Exchanges every `region_exchange_ms` until `stop`, and tells this region's own store
/// (`region`) each time whether this replica reaches the global store.
pub async fn run(
    shares: Arc<Shares>,
    global: Arc<dyn GlobalStore>,
    region: Arc<Store>,
    clock: Clock,
    stop: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stop);
    loop {
        let turn = async {
            let started = clock.mono_ms();
            shares.exchange(&*global, &region).await;
            shares
                .last_exchange_ms
                .store(clock.mono_ms().saturating_sub(started), Ordering::Relaxed);
            shares.tell_region(&region).await;
            clock.sleep(shares.config.exchange).await;
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

    #[test]
    fn a_new_key_holds_the_floor_and_a_larger_share_waits_one_exchange() {
        let clock = Clock::manual(1_700_000_000_000);
        let s = shares(&clock);
        // Floor: a tenth of a third.
        assert_eq!(capacity(s.scale(KEY, bucket(), 1)), 3);
        let e = read(&s.keys).get(KEY).cloned().unwrap();
        assert_eq!(e.asked.load(Ordering::Relaxed), 1);
        // Only eu asks: what it asks (with the headroom) and a third of what nobody asks for,
        // one exchange later: 33,333 + 566,667 + 111,111.
        let totals = [("eu".to_string(), 500_000)];
        s.settle(&e, &ALL, &totals);
        assert_eq!(capacity(s.scale(KEY, bucket(), 1)), 3, "growth waits");
        s.settle(&e, &ALL, &totals);
        assert_eq!(capacity(s.scale(KEY, bucket(), 1)), 71);
        // us asks for far more: the two split what is past the floors, and eu shrinks at once.
        let totals = [("eu".to_string(), 500_000), ("us".to_string(), 5_000_000)];
        s.settle(&e, &ALL, &totals);
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
        s.settle(&e, &heard, &totals);
        s.settle(&e, &heard, &totals);
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
            ("us".to_string(), 900),
            ("us".to_string(), 4_000),
            ("eu".to_string(), 800),
            ("eu".to_string(), -50),
            ("mars".to_string(), 500),
        ];
        // eu has a replica whose beat ended: counted at its partition share; ap is silent.
        assert_eq!(s.reachable(&beats), [true, false, false]);
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
                        asked_before: AtomicU64::new(NONE),
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
            _timeout: Duration,
        ) -> BoxFuture<'a, Result<Vec<(String, i64)>, StoreError>> {
            let beats = ["us", "eu", "ap"].map(|r| (r.to_string(), 5_000)).to_vec();
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
