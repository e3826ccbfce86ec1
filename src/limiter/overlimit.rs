//! The over-limit cache: once the store has refused a key until time `t`, requests for it that
//! cannot fit before `t` are refused from memory until then, so an abusive tenant hammering a
//! spent key costs no store calls.
//!
//! An entry is recorded from a store refusal that says when the refused cost would fit
//! (`retry_ms`): `until = now + retry_ms`, for costs at least the refused one (a smaller cost may
//! fit sooner, so it still asks the store). While it holds, a request gets OVER_LIMIT with the
//! exact remaining wait (`until - now`) as its `Retry-After`. Entries end at `until`; the
//! cache holds at most `over_limit_cache_max_keys` of them per replica (expired ones are dropped
//! by the limiter's housekeeping and, when the cache is full, before a new one is refused).
//!
//! Exactness: the store computed `retry_ms` on its clock just before answering, and the entry
//! starts when the answer arrives, so the cache refuses at most one round trip longer than the
//! store would; never shorter. Every replica keeps its own cache; a replica that has not seen
//! the refusal asks the store, which refuses it (and so fills that replica's cache).
//!
//! A charge (the take of an `overdraft: true` limit, [`Action::Charge`](crate::quota::Action))
//! is never answered from the cache: its usage must reach the store even while the key's
//! checks are refused (`hot/mod.rs` sends it past the cache).
//!
//! Tokens can come back sooner than the refill would bring them: an ended lease's give-back.
//! The replica that gives them back forgets its entry for the key ([`OverLimitCache::forget`]),
//! so its next request asks the store; other replicas' entries stand until they end (they
//! refuse a little longer than the store would: under-admission, never over).
//!
//! A refund (Envoy's `is_negative_hits`) gives tokens back too, and on a concurrency limit
//! that is how every slot comes back, on whichever replica the stream-done call reaches: an
//! entry kept until the refill (an hour's limit: minutes) would refuse free slots for that
//! long. So a key this replica has seen a refund for is never cached again (its entry ends
//! at the refund): its refusals ask the store. The set of such keys is bounded by
//! `over_limit_cache_max_keys` and starts over when full.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::quota::{Op, OpKind, Outcome};

const SHARDS: usize = 16;

#[derive(Debug)]
pub(super) struct OverLimitCache {
    max_keys: usize,
    len: AtomicUsize,
    /// When a full cache was last swept to make room (monotonic ms).
    last_full_sweep_ms: AtomicU64,
    shards: Box<[Mutex<HashMap<String, Refusal>>]>,
    hasher: RandomState,
    /// Keys this replica has seen refunds for: never cached (see the module doc).
    refunded: Mutex<HashSet<String>>,
}

#[derive(Clone, Copy, Debug)]
struct Refusal {
    /// The bucket's numbers when it refused: a reload that changes the limit (same key)
    /// must not keep refusing by the old numbers.
    kind: OpKind,
    /// Monotonic ms when the refused cost fits again.
    until_ms: u64,
    /// The refused cost (at least 1: a check needs one token).
    need: u64,
    /// Monotonic ms at which the bucket is whole again (its `reset_ms` then).
    reset_at_ms: u64,
}

impl OverLimitCache {
    pub(super) fn new(max_keys: usize) -> Self {
        OverLimitCache {
            max_keys,
            len: AtomicUsize::new(0),
            last_full_sweep_ms: AtomicU64::new(0),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            refunded: Mutex::new(HashSet::new()),
        }
    }

    fn shard(&self, key: &str) -> MutexGuard<'_, HashMap<String, Refusal>> {
        let i = (self.hasher.hash_one(key) as usize) % SHARDS;
        // Plain numbers only: a panic elsewhere cannot leave an entry half-written.
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The refusal of a take of `cost` on `key` (a bucket of `kind`) at `now_ms`, if the
    /// cache holds one.
    pub(super) fn check(&self, key: &str, kind: OpKind, cost: u64, now_ms: u64) -> Option<Outcome> {
        // Nothing refused anywhere (most of the time): no hashing, no lock. An entry recorded
        // at this instant may be missed; then the store answers, as it would have anyway.
        if self.len.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut shard = self.shard(key);
        let r = *shard.get(key)?;
        if now_ms >= r.until_ms || r.kind != kind {
            shard.remove(key);
            self.len.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        (cost.max(1) >= r.need).then(|| Outcome {
            allowed: false,
            remaining: 0,
            reset_ms: r.reset_at_ms.saturating_sub(now_ms),
            retry_ms: Some(r.until_ms - now_ms),
            granted: 0,
            found: None,
        })
    }

    /// Remembers a store refusal of `cost` on `key` that arrived at `now_ms`. Refusals that
    /// never fit (`retry_ms` None) or fit at once are not kept.
    pub(super) fn record(
        &self,
        key: &str,
        kind: OpKind,
        cost: u64,
        outcome: &Outcome,
        now_ms: u64,
    ) {
        let Some(retry_ms) = outcome.retry_ms.filter(|&r| r > 0) else {
            return;
        };
        if outcome.allowed {
            return;
        }
        let refusal = Refusal {
            kind,
            until_ms: now_ms.saturating_add(retry_ms),
            need: cost.max(1),
            reset_at_ms: now_ms.saturating_add(outcome.reset_ms),
        };
        if self.len.load(Ordering::Relaxed) >= self.max_keys {
            // Full: make room from ended entries (at most every 100 ms, so a flood of new
            // keys into a full cache does not sweep it on every refusal), else keep what is
            // there: a key not cached still gets the store's answer.
            let last = self.last_full_sweep_ms.load(Ordering::Relaxed);
            if now_ms.saturating_sub(last) >= 100
                && self
                    .last_full_sweep_ms
                    .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                self.sweep(now_ms);
            }
        }
        let mut shard = self.shard(key);
        if let Some(r) = shard.get_mut(key) {
            *r = refusal;
            return;
        }
        if self.len.load(Ordering::Relaxed) >= self.max_keys {
            return;
        }
        shard.insert(key.to_string(), refusal);
        self.len.fetch_add(1, Ordering::Relaxed);
    }

    /// Drops the entry for `key`, if any: tokens went back to its bucket.
    /// What the store's answer to a request's `op` (a take of `cost`, a claim of it, or a
    /// refund) means for the cache: a refusal is recorded, unless the key takes refunds; a
    /// refund ends the key's entry and keeps it out of the cache from then on.
    pub(super) fn settle(&self, op: &Op, cost: u64, outcome: &Outcome, now_ms: u64) {
        if op.action.is_return() {
            self.forget(&op.key);
            let mut refunded = self.refunded();
            if refunded.len() >= self.max_keys.max(1) && !refunded.contains(&op.key) {
                refunded.clear();
            }
            refunded.insert(op.key.clone());
        } else if !outcome.allowed && !self.refunded().contains(&op.key) {
            // (Admitted answers, nearly all of them, take no lock here.)
            self.record(&op.key, op.kind, cost, outcome, now_ms);
        }
    }

    fn refunded(&self) -> MutexGuard<'_, HashSet<String>> {
        self.refunded.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn forget(&self, key: &str) {
        if self.shard(key).remove(key).is_some() {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Drops every entry (the counter API's reset log lost some resets); how many there were.
    pub(super) fn clear(&self) -> usize {
        let mut dropped = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            dropped += shard.len();
            self.len.fetch_sub(shard.len(), Ordering::Relaxed);
            shard.clear();
        }
        dropped
    }

    /// Drops ended entries; returns how many are left.
    pub(super) fn sweep(&self, now_ms: u64) -> usize {
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            let before = shard.len();
            shard.retain(|_, r| r.until_ms > now_ms);
            self.len.fetch_sub(before - shard.len(), Ordering::Relaxed);
        }
        self.len.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: OpKind = OpKind::TokenBucket {
        capacity: 10,
        refill: 1,
        window_ms: 1_000,
    };

    fn refused(retry_ms: Option<u64>) -> Outcome {
        Outcome {
            allowed: false,
            remaining: 0,
            reset_ms: 9_000,
            retry_ms,
            granted: 0,
            found: None,
        }
    }

    #[test]
    fn refuses_until_the_cost_fits_with_the_exact_wait() {
        let c = OverLimitCache::new(10);
        c.record("k", K, 2, &refused(Some(1_000)), 100);
        let o = c.check("k", K, 2, 400).expect("cached");
        assert_eq!(
            (o.allowed, o.retry_ms, o.reset_ms),
            (false, Some(700), 8_700)
        );
        assert!(
            c.check("k", K, 5, 400).is_some(),
            "a larger cost cannot fit sooner"
        );
        assert!(
            c.check("k", K, 1, 400).is_none(),
            "a smaller cost may: ask the store"
        );
        assert!(c.check("other", K, 2, 400).is_none());
        let raised = OpKind::TokenBucket {
            capacity: 100,
            refill: 1,
            window_ms: 1_000,
        };
        assert!(
            c.check("k", raised, 2, 400).is_none(),
            "a reloaded limit asks the store"
        );
        assert!(c.check("k", K, 2, 1_100).is_none(), "fits at `until`");
        assert_eq!(c.sweep(1_100), 0);
    }

    #[test]
    fn a_key_that_took_a_refund_is_never_cached_again() {
        let c = OverLimitCache::new(2);
        let take = |key: &str| crate::quota::Op::take(key.into(), K, 1);
        let back = |key: &str| crate::quota::Op::give_back(key.into(), K, 1);
        let given = Outcome {
            allowed: true,
            ..refused(Some(0))
        };
        c.settle(&take("k"), 1, &refused(Some(1_000)), 100);
        assert!(c.check("k", K, 1, 200).is_some());
        c.settle(&back("k"), 1, &given, 300);
        assert!(c.check("k", K, 1, 300).is_none(), "the refund ended it");
        c.settle(&take("k"), 1, &refused(Some(1_000)), 400);
        assert!(c.check("k", K, 1, 500).is_none(), "and keeps it out");
        // Other keys are cached as before; the set of refunded keys stays bounded.
        c.settle(&take("other"), 1, &refused(Some(1_000)), 400);
        assert!(c.check("other", K, 1, 500).is_some());
        c.settle(&back("a"), 1, &given, 600);
        c.settle(&back("b"), 1, &given, 600);
        assert!(c.refunded().len() <= 2);
    }

    #[test]
    fn a_forgotten_key_asks_the_store_again() {
        let cache = OverLimitCache::new(10);
        cache.record("k", K, 1, &refused(Some(5_000)), 0);
        assert!(cache.check("k", K, 1, 10).is_some());
        cache.forget("k");
        assert!(cache.check("k", K, 1, 10).is_none());
        // Forgetting an absent key changes nothing (the count stays right).
        cache.forget("k");
        assert_eq!(cache.sweep(10), 0);
    }

    #[test]
    fn keeps_only_refusals_that_can_end_and_stays_bounded() {
        let c = OverLimitCache::new(2);
        c.record("never", K, 1, &refused(None), 0);
        c.record("now", K, 1, &refused(Some(0)), 0);
        assert_eq!(c.sweep(0), 0);
        c.record("a", K, 1, &refused(Some(100)), 0);
        c.record("b", K, 1, &refused(Some(200)), 0);
        c.record("c", K, 1, &refused(Some(200)), 0);
        assert!(c.check("c", K, 1, 1).is_none(), "full: not kept");
        c.record("a", K, 1, &refused(Some(500)), 0);
        assert!(
            c.check("a", K, 1, 300).is_some(),
            "an entry is renewed in place"
        );
        // Once `b` has ended, a new key takes its room.
        c.record("c", K, 1, &refused(Some(400)), 250);
        assert!(c.check("b", K, 1, 250).is_none(), "ended");
        assert!(c.check("c", K, 1, 300).is_some());
        assert_eq!(c.sweep(10_000), 0);
    }
}
