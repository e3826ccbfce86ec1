//! The global store of a `regions:` scenario: what `lua/regions.lua` keeps (every replica's
//! heartbeat, every replica's demand per global key), on the virtual clock, across a drawn
//! cross-region round trip and the scenario's cuts. The replicas' exchanges are the real code
//! (`regions::run`, `Shares::exchange`); only this store is a model.
//!
//! Flow of one call ([`GlobalClient`], one per replica, its [`GlobalStore`]): a round
//! trip drawn from the scenario's `global_latency_ms` → half of it to reach the store; a
//! region cut off then gets no answer → the store applies the call at that moment
//! ([`GlobalModel`]: the same entries, expiries and totals as the script) → half back (a cut
//! that began meanwhile loses the answer) → the caller gives up at its own bound, as the real
//! client does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::scenario::RegionsModel;
use super::store::round_trip_us;
use crate::clock::Clock;
use crate::regions::{Beat, GlobalStore};
use crate::store::{StoreError, StoreErrorKind};

/// The global store: heartbeats and demand, as `lua/regions.lua` holds them.
#[derive(Debug)]
pub(super) struct GlobalModel {
    model: RegionsModel,
    clock: Clock,
    rng: Mutex<SmallRng>,
    /// Heartbeat sets: `'<region>|<replica>'` → the ms its beat lasts until, and the settings
    /// it published.
    beats: Mutex<HashMap<String, Beats>>,
    /// Demand per global key.
    demand: Mutex<HashMap<String, Entries>>,
    /// Calls the store ran, per virtual second.
    calls: Mutex<Vec<u64>>,
}

impl GlobalModel {
    pub(super) fn new(model: &RegionsModel, clock: Clock, seed: u64, seconds: u64) -> Self {
        GlobalModel {
            model: model.clone(),
            clock,
            rng: Mutex::new(SmallRng::seed_from_u64(seed ^ 0x474c_4f42_414c)),
            beats: Mutex::default(),
            demand: Mutex::default(),
            calls: Mutex::new(vec![0; seconds as usize + 2]),
        }
    }

    /// Calls the store ran in each virtual second.
    pub(super) fn calls_per_second(&self) -> Vec<u64> {
        lock(&self.calls).clone()
    }

    fn now_ms(&self) -> i64 {
        self.clock.mono_ms() as i64
    }

    fn ran(&self) {
        let second = (self.clock.mono_us() / 1_000_000) as usize;
        if let Some(n) = lock(&self.calls).get_mut(second) {
            *n += 1;
        }
    }

    /// `beat`: the replica's entry until now + `ttl_ms`; every entry ended within `memory_ms`
    /// kept, older ones dropped; each kept entry's region and the ms it has left.
    fn beat(
        &self,
        key: &str,
        field: String,
        ttl_ms: u64,
        memory_ms: u64,
        settings: &str,
    ) -> Vec<Beat> {
        let now = self.now_ms();
        let mut beats = lock(&self.beats);
        let set = beats.entry(key.to_string()).or_default();
        set.insert(field, (now + ttl_ms as i64, settings.to_string()));
        set.retain(|_, (until, _)| *until - now >= -(memory_ms as i64));
        set.iter()
            .map(|(field, (until, settings))| {
                let (region, replica) = field.split_once('|').unwrap_or((field, ""));
                Beat {
                    region: region.to_string(),
                    replica: replica.to_string(),
                    left_ms: *until - now,
                    settings: settings.clone(),
                }
            })
            .collect()
    }

    fn leave(&self, key: &str, field: &str) {
        if let Some(set) = lock(&self.beats).get_mut(key) {
            set.remove(field);
        }
    }

    /// `demand`: the replica's entry until now + `ttl_ms`; ended entries dropped; each
    /// region's total of the others, in the order regions first appear.
    fn demand(&self, key: &str, field: String, ppm: u64, ttl_ms: u64) -> Vec<(String, u64)> {
        let now = self.now_ms();
        let mut all = lock(&self.demand);
        let set = all.entry(key.to_string()).or_default();
        set.insert(field, (ppm, now + ttl_ms as i64));
        set.retain(|_, (_, until)| *until > now);
        let mut totals: Vec<(String, u64)> = Vec::new();
        for (field, (d, _)) in set.iter() {
            let region = region_of(field);
            match totals.iter_mut().find(|(r, _)| r == region) {
                Some((_, t)) => *t += d,
                None => totals.push((region.to_string(), *d)),
            }
        }
        totals
    }
}

/// One heartbeat set: `'<region>|<replica>'` → (the ms its beat lasts until, its settings).
type Beats = HashMap<String, (i64, String)>;

/// One global key's demand: `'<region>|<replica>'` → (demand, the ms it lasts until).
type Entries = HashMap<String, (u64, i64)>;

/// The region of a `'<region>|<replica>'` field.
fn region_of(field: &str) -> &str {
    field.split('|').next().unwrap_or_default()
}

/// One replica's way to the global store: its round trips and its cuts.
#[derive(Debug)]
pub(super) struct GlobalClient {
    pub(super) store: Arc<GlobalModel>,
    pub(super) region: usize,
    /// The replica's index in its region (start order).
    pub(super) replica: u32,
}

impl GlobalClient {
    /// Runs `apply` on the store after half a drawn round trip, answers half a round trip
    /// later; no answer while this region is cut off; the caller gives up after `timeout`.
    async fn call<T>(
        &self,
        timeout: Duration,
        what: &str,
        apply: impl FnOnce(&GlobalModel) -> T,
    ) -> Result<T, StoreError> {
        let g = &self.store;
        let clock = &g.clock;
        let half =
            Duration::from_secs_f64(round_trip_us(g.model.global_latency, &mut lock(&g.rng)) / 2e6);
        let answered = async {
            clock.sleep(half).await;
            if g.model.cut_off(self.region, self.replica, clock.mono_us()) {
                return None;
            }
            g.ran();
            let out = apply(g);
            clock.sleep(half).await;
            (!g.model.cut_off(self.region, self.replica, clock.mono_us())).then_some(out)
        };
        let timed_out = || StoreError::new(StoreErrorKind::Timeout, format!("{what}: timed out"));
        tokio::select! {
            out = answered => match out {
                Some(out) => Ok(out),
                // Unanswered: the caller waits out its bound, as for a silent Redis.
                None => {
                    clock.sleep(timeout.saturating_sub(half * 2)).await;
                    Err(timed_out())
                }
            },
            () = clock.sleep(timeout) => Err(timed_out()),
        }
    }
}

impl GlobalStore for GlobalClient {
    fn beat<'a>(
        &'a self,
        key: &'a str,
        (region, replica): (&'a str, &'a str),
        ttl_ms: u64,
        memory_ms: u64,
        settings: &'a str,
        timeout: Duration,
    ) -> futures_util::future::BoxFuture<'a, Result<Vec<Beat>, StoreError>> {
        let field = format!("{region}|{replica}");
        Box::pin(self.call(timeout, "the regions' heartbeat", move |g| {
            g.beat(key, field, ttl_ms, memory_ms, settings)
        }))
    }

    fn leave<'a>(
        &'a self,
        key: &'a str,
        (region, replica): (&'a str, &'a str),
        timeout: Duration,
    ) -> futures_util::future::BoxFuture<'a, Result<(), StoreError>> {
        let field = format!("{region}|{replica}");
        Box::pin(
            self.call(timeout, "leaving the regions' heartbeat", move |g| {
                g.leave(key, &field)
            }),
        )
    }

    fn demand<'a>(
        &'a self,
        key: &'a str,
        (region, replica): (&'a str, &'a str),
        demand_ppm: u64,
        ttl_ms: u64,
        timeout: Duration,
    ) -> futures_util::future::BoxFuture<'a, Result<Vec<(String, u64)>, StoreError>> {
        let field = format!("{region}|{replica}");
        Box::pin(self.call(timeout, "a global key's demand", move |g| {
            g.demand(key, field, demand_ppm, ttl_ms)
        }))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
