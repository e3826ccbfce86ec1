//! The embedded store: bucket state in this process's memory.
//!
//! Exact for one replica (and the right choice for a single-replica service or for trying
//! tollgate out); it does not share a quota between replicas. State sits in a fixed number of
//! mutex-guarded shards picked by key hash, so concurrent requests for different keys rarely
//! contend, and the read-decide-write of one key happens under its shard's lock, so
//! concurrent takes on one key are exact. Every entry records when it stops mattering (a token
//! bucket once it has refilled to full, a fixed window once it has ended, a sliding window once
//! its estimate has decayed to 0); [`MemoryStore::sweep`] drops those, so memory follows the
//! number of *active* keys, not of keys ever seen. An entry that already equals a fresh bucket
//! (a check on an unseen sliding window) is not inserted at all.
//!
//! Bounded: at most `max_keys` entries (`memory_max_keys`), split evenly over the shards, so a
//! flood of distinct keys (random tenant ids) cannot grow memory without limit. A new key that
//! finds its shard full first drops the shard's idle entries; if none were idle, it evicts the
//! sixteenth of the shard's entries that matter least: the fewest operations, then the nearest
//! to full again. An evicted entry comes back as a fresh (full) bucket, so eviction can only
//! admit more, never less, and by at most what the evicted entries had spent. A key in use has
//! many operations, so it goes only after every entry of its shard with fewer: under a flood of
//! one-request keys, the flood's.
//!
//! A take hashes its key once: the one keyed hash (std's SipHash, as the keys carry what
//! callers send) picks the shard from its middle bits and finds or inserts the entry in the
//! shard's table.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use hashbrown::HashTable;

use crate::clock::Clock;
use crate::quota::bucket::{
    self, SlidingLog, SlidingWindowState, TokenBucketParams, TokenBucketState, WindowState,
};
use crate::quota::{Action, Op, OpKind, Outcome};

const SHARDS: usize = 64;

/// The hits a sliding-log op takes: no leases on a log (the rules refuse them), so a claim is a
/// take of its cost and a give-back a check.
fn log_cost(op: &Op) -> u64 {
    match op.action {
        Action::Return { .. } => 0,
        Action::Take | Action::Charge | Action::Claim(_) | Action::Reserve => op.cost,
    }
}

/// The default of `memory_max_keys`: about 110 MB of buckets at ~220 bytes each.
pub const DEFAULT_MAX_KEYS: usize = 500_000;

/// A full shard evicts this fraction of its entries at once, so the scan that picks them is
/// paid once per `1/EVICT_FRACTION` of a shard's insertions, not on every one.
const EVICT_FRACTION: usize = 16;

#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    /// The keyed hash of every bucket key, for the shard and within it.
    hasher: RandomState,
    clock: Clock,
    /// Entries one shard may hold.
    shard_max: usize,
    evicted: AtomicU64,
}

/// One shard's buckets, by key. Its methods take the key's hash ([`MemoryStore::locate`]), so
/// a lookup that misses and then inserts hashes the key once, not twice.
#[derive(Debug, Default)]
struct Shard {
    table: HashTable<(String, Entry)>,
}

impl Shard {
    fn get_mut(&mut self, hash: u64, key: &str) -> Option<&mut Entry> {
        self.table.find_mut(hash, |(k, _)| k == key).map(|(_, e)| e)
    }

    /// Inserts an entry for a key not held (the caller's lookup missed, under the same lock).
    fn insert_new(&mut self, hasher: &RandomState, hash: u64, key: String, entry: Entry) {
        self.table
            .insert_unique(hash, (key, entry), |(k, _)| hasher.hash_one(k.as_str()));
    }

    fn remove(&mut self, hash: u64, key: &str) -> bool {
        match self.table.find_entry(hash, |(k, _)| k == key) {
            Ok(found) => {
                found.remove();
                true
            }
            Err(_) => false,
        }
    }

    fn retain(&mut self, mut keep: impl FnMut(&Entry) -> bool) {
        self.table.retain(|(_, e)| keep(e));
    }

    fn len(&self) -> usize {
        self.table.len()
    }
}

#[derive(Clone, Debug)]
struct Entry {
    state: State,
    /// Monotonic ms after which the entry equals a fresh one and can be dropped.
    idle_at_ms: u64,
    /// Operations applied to this entry (saturating): what eviction spares most.
    uses: u32,
}

#[derive(Clone, Debug)]
enum State {
    Token(TokenBucketState),
    Window(WindowState),
    Sliding(SlidingWindowState),
    /// Boxed: a log holds up to its limit of hits, the other states a few numbers.
    Log(Box<SlidingLog>),
}

impl MemoryStore {
    /// A store of at most [`DEFAULT_MAX_KEYS`] buckets.
    pub fn new(clock: Clock) -> Self {
        Self::with_max_keys(clock, DEFAULT_MAX_KEYS)
    }

    /// A store of at most about `max_keys` buckets (rounded up to a multiple of the shard
    /// count; at least one per shard).
    pub fn with_max_keys(clock: Clock, max_keys: usize) -> Self {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::new(),
            clock,
            shard_max: max_keys.div_ceil(SHARDS).max(1),
            evicted: AtomicU64::new(0),
        }
    }

    /// Entries evicted so far because their shard was full (not counting idle ones dropped).
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// `key`'s hash and its shard, locked. The shard comes from the hash's middle bits: the
    /// table inside uses the low bits (the slot) and the top seven (the tag), which would
    /// otherwise be alike for every key of a shard.
    fn locate(&self, key: &str) -> (u64, MutexGuard<'_, Shard>) {
        let hash = self.hasher.hash_one(key);
        let i = (hash >> 32) as usize % SHARDS;
        // A poisoned shard only means another thread panicked mid-update of plain numbers;
        // the map itself is intact, so keep serving.
        (
            hash,
            self.shards[i].lock().unwrap_or_else(|p| p.into_inner()),
        )
    }

    /// Applies one op atomically with respect to every other op on the same key.
    pub fn apply(&self, op: &Op) -> Outcome {
        if let OpKind::SlidingLog { limit, window_ms } = op.kind {
            return self.apply_log(op, limit, window_ms);
        }
        let mono = self.clock.mono_ms();
        let (hash, mut shard) = self.locate(&op.key);
        // One look-up on a hit: the entry is updated in place.
        let existing = shard.get_mut(hash, &op.key);
        // A few numbers (a log, whose copy would cost more, is updated in place by `apply_log`).
        let old = existing.as_ref().map(|e| e.state.clone());
        let uses = existing.as_ref().map_or(1, |e| e.uses.saturating_add(1));
        let (entry, outcome) = match op.kind {
            OpKind::TokenBucket {
                capacity,
                refill,
                window_ms,
            } => {
                let p = TokenBucketParams {
                    capacity,
                    refill,
                    window_ms,
                };
                let prev = match old {
                    Some(State::Token(s)) => Some(s),
                    _ => None,
                };
                let (s, o) = match op.action {
                    // A refused take takes nothing from a token bucket: a reservation is one.
                    Action::Take | Action::Reserve => {
                        bucket::take_token(prev, mono, p, op.cost, false)
                    }
                    Action::Charge => bucket::take_token(prev, mono, p, op.cost, true),
                    Action::Claim(ask) => bucket::claim_token(prev, mono, p, ask),
                    // A receipt's take time is on the wall clock; the bucket's own, monotonic.
                    Action::Return { receipt_ms } => bucket::return_token(
                        prev,
                        mono,
                        p,
                        op.cost,
                        receipt_ms.map(|at| self.clock.wall_ms().saturating_sub(at)),
                    ),
                };
                let idle_at_ms = mono.saturating_add(bucket::token_idle_after_ms(s, p));
                (
                    Entry {
                        state: State::Token(s),
                        idle_at_ms,
                        uses,
                    },
                    o,
                )
            }
            OpKind::FixedWindow { limit, window_ms } => {
                let prev = match old {
                    Some(State::Window(s)) => Some(s),
                    _ => None,
                };
                let now = self.clock.wall_ms();
                let (s, o) = match op.action {
                    Action::Take => {
                        bucket::take_window(prev, now, limit, window_ms, op.cost, false)
                    }
                    Action::Reserve => bucket::reserve_windows(
                        prev,
                        now,
                        limit,
                        bucket::Windows::Every(window_ms),
                        op.cost,
                    ),
                    Action::Charge => {
                        bucket::take_window(prev, now, limit, window_ms, op.cost, true)
                    }
                    Action::Claim(ask) => bucket::claim_window(prev, now, limit, window_ms, ask),
                    Action::Return { receipt_ms } => {
                        bucket::return_window(prev, now, limit, window_ms, op.cost, receipt_ms)
                    }
                };
                (
                    Entry {
                        state: State::Window(s),
                        idle_at_ms: mono.saturating_add(o.reset_ms),
                        uses,
                    },
                    o,
                )
            }
            OpKind::CalendarWindow {
                limit, calendar, ..
            } => {
                let prev = match old {
                    Some(State::Window(s)) => Some(s),
                    _ => None,
                };
                let now = self.clock.wall_ms();
                let windows = bucket::Windows::Calendar(calendar);
                // A calendar window has no leases (the rules refuse them): a claim is a take
                // of its cost; a give-back is a refund.
                let (s, o) = match op.action {
                    Action::Take | Action::Claim(_) => {
                        bucket::take_windows(prev, now, limit, windows, op.cost, false)
                    }
                    Action::Reserve => bucket::reserve_windows(prev, now, limit, windows, op.cost),
                    Action::Charge => {
                        bucket::take_windows(prev, now, limit, windows, op.cost, true)
                    }
                    Action::Return { receipt_ms } => {
                        bucket::return_windows(prev, now, limit, windows, op.cost, receipt_ms)
                    }
                };
                (
                    Entry {
                        state: State::Window(s),
                        idle_at_ms: mono.saturating_add(o.reset_ms),
                        uses,
                    },
                    o,
                )
            }
            OpKind::SlidingLog { limit, window_ms } => {
                // `apply` sends logs to `apply_log`; this copy is the same take, slower.
                let mut log = match old {
                    Some(State::Log(log)) => log,
                    _ => Box::default(),
                };
                let o = bucket::take_log(
                    &mut log,
                    self.clock.wall_ms(),
                    limit,
                    window_ms,
                    log_cost(op),
                );
                (
                    Entry {
                        state: State::Log(log),
                        idle_at_ms: mono.saturating_add(o.reset_ms),
                        uses,
                    },
                    o,
                )
            }
            OpKind::SlidingWindow { limit, window_ms } => {
                let prev = match old {
                    Some(State::Sliding(s)) => Some(s),
                    _ => None,
                };
                // A sliding window has no leases (the rules refuse them): a claim is a take of
                // its cost; a give-back is a refund.
                let overdraft = op.action == Action::Charge;
                let now = self.clock.wall_ms();
                let (s, o) = match op.action {
                    Action::Return { receipt_ms } => {
                        bucket::give_back_sliding(prev, now, limit, window_ms, op.cost, receipt_ms)
                    }
                    _ => bucket::take_sliding(prev, now, limit, window_ms, op.cost, overdraft),
                };
                // reset_ms is when the estimate has decayed to 0 (0 for an empty state).
                (
                    Entry {
                        state: State::Sliding(s),
                        idle_at_ms: mono.saturating_add(o.reset_ms),
                        uses,
                    },
                    o,
                )
            }
        };
        match existing {
            Some(e) => *e = entry,
            // Already idle: equal to a fresh bucket, so storing it would only cost memory.
            None if entry.idle_at_ms <= mono => {}
            None => {
                if shard.len() >= self.shard_max {
                    self.make_room(&mut shard, mono);
                }
                shard.insert_new(&self.hasher, hash, op.key.clone(), entry);
            }
        }
        outcome
    }

    /// A sliding-log op, on the stored log in place (see [`bucket::take_log`]).
    fn apply_log(&self, op: &Op, limit: u64, window_ms: u64) -> Outcome {
        let (mono, now) = (self.clock.mono_ms(), self.clock.wall_ms());
        let (hash, mut shard) = self.locate(&op.key);
        if let Some(e) = shard.get_mut(hash, &op.key)
            && let State::Log(log) = &mut e.state
        {
            let o = bucket::take_log(log, now, limit, window_ms, log_cost(op));
            e.idle_at_ms = mono.saturating_add(o.reset_ms);
            e.uses = e.uses.saturating_add(1);
            return o;
        }
        let mut log = Box::<SlidingLog>::default();
        let o = bucket::take_log(&mut log, now, limit, window_ms, log_cost(op));
        if !log.is_empty() {
            if shard.len() >= self.shard_max {
                self.make_room(&mut shard, mono);
            }
            let entry = Entry {
                state: State::Log(log),
                idle_at_ms: mono.saturating_add(o.reset_ms),
                uses: 1,
            };
            shard.insert_new(&self.hasher, hash, op.key.clone(), entry);
        }
        o
    }

    /// Frees at least one slot in a full shard: its idle entries if it has any, else the
    /// `1/EVICT_FRACTION` of its entries that matter least (fewest uses, then nearest to idle).
    fn make_room(&self, shard: &mut Shard, mono: u64) {
        shard.retain(|e| e.idle_at_ms > mono);
        if shard.len() < self.shard_max {
            return;
        }
        let mut ranks: Vec<(u32, u64)> = (shard.table.iter())
            .map(|(_, e)| (e.uses, e.idle_at_ms))
            .collect();
        let n = (ranks.len() / EVICT_FRACTION).max(1);
        let (_, &mut cut, _) = ranks.select_nth_unstable(n - 1);
        // Everything ranked at or below the n-th lowest goes (ties included, so possibly a few
        // more than n).
        let before = shard.len();
        shard.retain(|e| (e.uses, e.idle_at_ms) > cut);
        self.evicted
            .fetch_add((before - shard.len()) as u64, Ordering::Relaxed);
    }

    /// Forgets the buckets `keys` (the counter API's reset: each starts over, full);
    /// how many were held.
    pub fn remove(&self, keys: &[String]) -> u64 {
        keys.iter()
            .map(|k| {
                let (hash, mut shard) = self.locate(k);
                u64::from(shard.remove(hash, k))
            })
            .sum()
    }

    /// Drops entries that no longer differ from a fresh bucket. Returns how many were dropped.
    /// Holds one shard's lock at a time, so requests on other shards go on meanwhile.
    pub fn sweep(&self) -> usize {
        let now = self.clock.mono_ms();
        let mut dropped = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            let before = shard.len();
            shard.retain(|e| e.idle_at_ms > now);
            dropped += before - shard.len();
            // Give memory back after a spike instead of keeping the peak capacity forever.
            let (len, capacity) = (shard.len(), shard.table.capacity());
            if capacity > 64 && len < capacity / 4 {
                let hasher = &self.hasher;
                (shard.table).shrink_to(len * 2, |(k, _)| hasher.hash_one(k.as_str()));
            }
        }
        dropped
    }

    /// Number of buckets held.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn tb(key: &str, cost: u64, capacity: u64, window_ms: u64) -> Op {
        Op {
            key: key.to_string(),
            kind: OpKind::TokenBucket {
                capacity,
                refill: capacity,
                window_ms,
            },
            cost,
            action: Default::default(),
        }
    }

    #[test]
    fn keys_are_independent() {
        let store = MemoryStore::new(Clock::manual(0));
        assert!(store.apply(&tb("a", 1, 1, 1000)).allowed);
        assert!(!store.apply(&tb("a", 1, 1, 1000)).allowed);
        assert!(store.apply(&tb("b", 1, 1, 1000)).allowed);
    }

    #[test]
    fn concurrent_takes_on_one_key_are_exact() {
        let store = Arc::new(MemoryStore::new(Clock::system()));
        let limit = 1000;
        let admitted: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let store = &store;
                    s.spawn(move || {
                        (0..400)
                            .filter(|_| store.apply(&tb("hot", 1, limit, 3_600_000)).allowed)
                            .count()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(
            admitted as u64, limit,
            "3,200 attempts on an hour-long limit of 1,000"
        );
    }

    #[test]
    fn sweep_drops_only_idle_buckets_and_bounds_memory() {
        let clock = Clock::manual(1_000_000);
        let store = MemoryStore::new(clock.clone());
        for i in 0..100_000 {
            store.apply(&tb(&format!("k{i}"), 1, 10, 1000));
        }
        store.apply(&tb("slow", 1, 10, 3_600_000));
        let fw = Op {
            key: "win".into(),
            kind: OpKind::FixedWindow {
                limit: 5,
                window_ms: 60_000,
            },
            cost: 1,
            action: Default::default(),
        };
        store.apply(&fw);
        assert_eq!(store.len(), 100_002);
        clock.advance_ms(200); // 1 token of 10 refills in 100 ms: the first ones are full again
        assert_eq!(store.sweep(), 100_000);
        assert_eq!(store.len(), 2, "the hour-long bucket and the window remain");
        clock.advance_ms(3_600_000);
        store.sweep();
        assert!(store.is_empty());
        // Swept buckets come back full: dropping them changed no decision.
        assert_eq!(store.apply(&tb("k1", 0, 10, 1000)).remaining, 10);
    }

    #[test]
    fn a_flood_of_new_keys_stays_bounded_and_never_resets_a_key_in_use() {
        let clock = Clock::manual(1_000_000);
        let store = MemoryStore::with_max_keys(clock.clone(), 64 * 16);
        const LONG: u64 = 3_600_000_000;
        // The hot key is in use (two takes) before the flood starts. (A key with a single use
        // ranks with the flood's one-use keys and can be evicted like them, which forgets that
        // one use.)
        let mut hot_admitted = 0;
        for _ in 0..2 {
            hot_admitted += u32::from(store.apply(&tb("hot", 1, 100, LONG)).allowed);
        }
        // 100 per 1,000 hours for the hot key and for each flood key: nothing refills or goes
        // idle within the test's 200 s, so only eviction can make room.
        for i in 0..200_000 {
            store.apply(&tb(&format!("flood{i}"), 1, 100, LONG));
            if i % 1_000 == 0 && store.apply(&tb("hot", 1, 100, LONG)).allowed {
                hot_admitted += 1;
            }
            clock.advance_ms(1);
        }
        assert!(store.len() <= 64 * 16, "{} entries", store.len());
        assert!(store.evicted() >= 200_000 - 64 * 16, "{}", store.evicted());
        // 202 attempts, 100 admitted, then refused throughout: the hot bucket was never
        // evicted (an evicted bucket comes back full and would admit again).
        assert_eq!(hot_admitted, 100);
        assert!(!store.apply(&tb("hot", 1, 100, LONG)).allowed);
    }

    #[test]
    fn a_full_shard_drops_idle_entries_before_evicting_any() {
        let clock = Clock::manual(1_000_000);
        let store = MemoryStore::with_max_keys(clock.clone(), 64 * 64);
        // One token of 10 per second: each entry is full again 100 ms after its take. A round
        // of 512 keys puts about 8 in each shard of 64 (far from 64, whatever the hashing).
        for round in 0..50 {
            for i in 0..512 {
                store.apply(&tb(&format!("r{round}-{i}"), 1, 10, 1000));
            }
            clock.advance_ms(150);
        }
        assert_eq!(store.evicted(), 0, "idle entries made the room");
        assert!(store.len() <= 64 * 64);
    }

    fn sw(key: &str, cost: u64, limit: u64, window_ms: u64) -> Op {
        Op {
            key: key.to_string(),
            kind: OpKind::SlidingWindow { limit, window_ms },
            cost,
            action: Default::default(),
        }
    }

    #[test]
    fn sliding_windows_slide_and_expire_when_decayed() {
        // 20 s into a minute.
        let clock = Clock::manual(1_700_000_000_000);
        let store = MemoryStore::new(clock.clone());
        assert!(store.apply(&sw("s", 0, 4, 60_000)).allowed);
        assert!(store.is_empty(), "a check on an unseen key stores nothing");
        assert!(store.apply(&sw("s", 4, 4, 60_000)).allowed);
        let o = store.apply(&sw("s", 1, 4, 60_000));
        assert!(!o.allowed);
        assert_eq!(
            (o.retry_ms, o.reset_ms),
            (Some(55_000), 100_000),
            "1 unit frees 15 s into the next minute; all 4 at its end"
        );
        // The next window, 30 s in: 4 * 0.5 = 2 left.
        clock.advance_ms(70_000);
        let o = store.apply(&sw("s", 0, 4, 60_000));
        assert_eq!((o.remaining, o.reset_ms), (2, 30_000));
        store.sweep();
        assert_eq!(store.len(), 1, "not decayed yet");
        clock.advance_ms(30_000);
        assert_eq!(store.sweep(), 1, "decayed to 0: dropped");
        assert_eq!(store.apply(&sw("s", 0, 4, 60_000)).remaining, 4);
        // The algorithms' states never mix, even on one key.
        assert!(store.apply(&tb("s", 1, 1, 1000)).allowed);
        assert_eq!(store.apply(&sw("s", 1, 4, 60_000)).remaining, 3);
    }
}
