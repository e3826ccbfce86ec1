//! Token leasing: a replica claims a batch of a hot key's tokens from the store in one call
//! (`lua/lease.lua`) and answers that key's requests from memory until the batch is spent or
//! its TTL passes; only then does it call the store again.
//!
//! # How a leased op flows ([`Leases::take`])
//!
//! - The lease covers the cost: spend it here; no store call (`Take::Local`).
//! - It does not, and another request of this replica is already claiming for the key: wait
//!   for that claim, then look again (`Take::Wait`): one claim in flight per key, no stampede.
//! - The lease covers the cost but is down to a quarter of its last batch: spend it, and claim
//!   the next batch ahead (`Take::LocalAndAhead`; on Redis in a task of its own, so nobody
//!   waits for it), so requests keep spending what is left instead of all waiting for a claim
//!   once the lease is empty.
//! - Otherwise claim (`Take::Claim`): what the lease holds is reserved for this request and
//!   the claim asks the store for the rest (`need`) plus a batch to keep (`want`). A claim is
//!   all of `need` or nothing, so a request is admitted only when its whole cost is covered.
//!   [`Leases::settle`] puts the answer in: the extra tokens join the lease, or, on a refusal
//!   or a store failure, the reserved tokens go back to it.
//!
//! # Batch size
//!
//! The batch follows the key's local rate: the tokens spent since the last claim over the time
//! since, times half the TTL (so a batch lasts about half its life), between 1 and `max_batch`.
//! A key's first claim takes only its cost. The store splits what is left of a nearly spent
//! bucket between the live replicas (`share` in `lease.lua`), so one replica cannot hoard it.
//!
//! # Bounds
//!
//! A leased token is taken from the shared bucket before it is spent, so leasing never admits
//! more tokens than the bucket gave; it only moves *when* they are spent. Over any span,
//! admissions exceed the unleased limit by at most the tokens held in leases at its start:
//! replicas × (max_batch + cost). Tokens left when a new batch arrives join it and its TTL; a
//! fixed window's tokens end with their window.
//! Unspent tokens expire with the lease (they are lost to the bucket), and on graceful
//! shutdown they are given back ([`Leases::drain`]).
//!
//! # What a leased answer reports
//!
//! `remaining` is the shared bucket's remaining as of the last claim plus this lease's unspent
//! tokens (capped at the capacity): an estimate at most one TTL old that does not see other
//! replicas' spending since. `reset_ms` is the same estimate's time to full (token bucket) or
//! the window's end (fixed window).

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

use crate::store::{ClaimAsk, Op, OpKind, Outcome};

const SHARDS: usize = 16;

/// The lease parameters of one limit (its `lease:` over the global settings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct LeasePolicy {
    pub(super) max_batch: u64,
    pub(super) ttl_ms: u64,
}

/// This replica's leases, by bucket (`keys::bucket_id`: all shards of a key share one lease).
#[derive(Debug)]
pub(super) struct Leases {
    shards: Box<[Mutex<HashMap<String, Lease>>]>,
    hasher: RandomState,
}

#[derive(Debug)]
struct Lease {
    /// Unspent tokens.
    tokens: u64,
    /// Monotonic ms after which `tokens` are no longer spendable.
    expires_ms: u64,
    /// The shared bucket's remaining tokens after the last claim.
    shared_remaining: u64,
    /// When the last single-flight claim settled (the start of the rate measurement).
    claimed_ms: u64,
    /// Tokens spent from this key since the last claim, for the batch size.
    spent_since_claim: u64,
    /// What the last claim added to the lease: a quarter of it left triggers a claim ahead.
    last_batch: u64,
    /// A fixed window's end as of the last claim (monotonic ms).
    window_end_ms: u64,
    /// Set while a claim for this key is in flight; waiters are woken when it settles.
    claiming: Option<Arc<Notify>>,
    /// Where the last claim went (a shard key for a sharded limit), its kind and class: what a
    /// give-back needs.
    claim_key: String,
    kind: OpKind,
    class: Arc<str>,
}

/// What [`Leases::take`] decided for one op.
pub(super) enum Take {
    /// Spent from the lease.
    Local(Outcome),
    /// Spent from the lease, which is running low: also claim the next batch ahead (the
    /// request's answer does not depend on it).
    LocalAndAhead(Outcome, Claim),
    /// Another request is claiming for this key: wait for it, then take again.
    Wait(OwnedNotified),
    /// Claim `ask` from the store; settle the answer with the claim.
    Claim(Claim),
}

/// A claim in flight. Dropped unsettled (the request was cancelled), it gives the reserved
/// tokens back to the lease and wakes the waiters, so no key is left "claiming" for ever.
#[derive(Debug)]
pub(super) struct Claim {
    pub(super) ask: ClaimAsk,
    id: String,
    /// Tokens of the lease set aside for this request (its cost minus `ask.need`).
    reserved: u64,
    cost: u64,
    /// A claim ahead ([`Take::LocalAndAhead`]): everything granted joins the lease.
    ahead: bool,
    /// Whether this claim is the key's single flight (waiters are woken when it settles).
    notify: Option<Arc<Notify>>,
    leases: Option<Arc<Leases>>,
}

/// A leased token's fate, for `tollgate_lease_tokens_total{event}`: what [`Leases::settle`]
/// and [`Leases::take`] report back so the caller counts them with the limit's class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct TokenEvents {
    pub(super) granted: u64,
    pub(super) expired: u64,
}

impl Claim {
    /// The cost of the request this claim is for (0 for a claim ahead).
    pub(super) fn cost(&self) -> u64 {
        self.cost
    }
}

impl Leases {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Leases {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
        })
    }

    fn shard(&self, id: &str) -> MutexGuard<'_, HashMap<String, Lease>> {
        let i = (self.hasher.hash_one(id) as usize) % SHARDS;
        // Plain numbers only: a panic elsewhere cannot leave a lease half-written.
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Spends `op.cost` (> 0) of bucket `id` from the lease, or says how to get it. `may_wait`
    /// is false on the second look after a wait: then the request claims for itself.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn take(
        self: &Arc<Self>,
        id: &str,
        op: &Op,
        class: &Arc<str>,
        policy: LeasePolicy,
        share: u64,
        now_ms: u64,
        may_wait: bool,
    ) -> (Take, TokenEvents) {
        let mut events = TokenEvents::default();
        let mut shard = self.shard(id);
        // The id is copied only for a key's first lease (`entry` would copy it every time).
        if !shard.contains_key(id) {
            shard.insert(id.to_string(), Lease::new(op, class, now_ms));
        }
        let Some(lease) = shard.get_mut(id) else {
            // Inserted just above, under the same lock.
            unreachable!("lease {id} vanished under its lock")
        };
        if lease.tokens > 0 && now_ms >= lease.expires_ms {
            events.expired = lease.tokens;
            lease.tokens = 0;
        }
        if lease.tokens >= op.cost {
            lease.tokens -= op.cost;
            lease.spent_since_claim += op.cost;
            let outcome = lease.estimate(now_ms, op.cost);
            // Claim ahead: at a quarter of the last batch left, this request also claims the
            // next one, while the others keep spending what is left instead of all waiting
            // for a claim once the lease is empty.
            if lease.claiming.is_none()
                && lease.last_batch >= 4
                && lease.tokens * 4 <= lease.last_batch
            {
                let want = lease
                    .batch(policy, now_ms)
                    .saturating_sub(lease.tokens)
                    .max(1);
                let n = Arc::new(Notify::new());
                lease.claiming = Some(n.clone());
                let claim = Claim {
                    ask: ClaimAsk {
                        need: 1,
                        want,
                        share: share.max(1),
                    },
                    id: id.to_string(),
                    reserved: 0,
                    cost: 0,
                    ahead: true,
                    notify: Some(n),
                    leases: Some(self.clone()),
                };
                return (Take::LocalAndAhead(outcome, claim), events);
            }
            return (Take::Local(outcome), events);
        }
        if may_wait && let Some(n) = &lease.claiming {
            // Registered now, under the lock: the settle that wakes it takes the lock too.
            return (Take::Wait(n.clone().notified_owned()), events);
        }
        // Claim: reserve what the lease holds, ask for the rest plus a batch.
        let reserved = lease.tokens;
        lease.tokens = 0;
        let need = op.cost - reserved;
        let single_flight = lease.claiming.is_none();
        let batch = if single_flight {
            lease.batch(policy, now_ms)
        } else {
            0
        };
        let notify = single_flight.then(|| {
            let n = Arc::new(Notify::new());
            lease.claiming = Some(n.clone());
            n
        });
        let claim = Claim {
            ask: ClaimAsk {
                need,
                want: need.saturating_add(batch),
                share: share.max(1),
            },
            id: id.to_string(),
            reserved,
            cost: op.cost,
            ahead: false,
            notify,
            leases: Some(self.clone()),
        };
        (Take::Claim(claim), events)
    }

    /// Puts a claim's answer into the lease and returns the request's outcome: allowed when
    /// the claim was granted (its extra joins the lease), else the store's refusal. `op` is
    /// the op the claim was sent as (its key: where a give-back goes).
    pub(super) fn settle(
        &self,
        mut claim: Claim,
        op: &Op,
        answer: &Outcome,
        policy: LeasePolicy,
        now_ms: u64,
    ) -> (Outcome, TokenEvents) {
        let mut events = TokenEvents::default();
        let mut shard = self.shard(&claim.id);
        let outcome = match shard.get_mut(&claim.id) {
            // Swept meanwhile (idle for a long time): answer from the claim alone.
            None => *answer,
            Some(lease) if answer.allowed => {
                events.granted = answer.granted;
                // A request's claim keeps its need; a claim ahead keeps everything.
                let extra = if claim.ahead {
                    answer.granted
                } else {
                    answer.granted.saturating_sub(claim.ask.need)
                };
                // What the lease still holds joins the new batch and its TTL (a token
                // bucket's tokens are the same whenever they were taken), except a fixed
                // window's tokens from a window that has ended: those end with it.
                let expired = now_ms >= lease.expires_ms
                    || match op.kind {
                        OpKind::FixedWindow { window_ms, .. } => {
                            now_ms + answer.reset_ms > lease.window_end_ms + window_ms / 2
                        }
                        _ => false,
                    };
                if lease.tokens > 0 && expired {
                    events.expired = lease.tokens;
                    lease.tokens = 0;
                }
                lease.tokens += extra;
                // A fixed window's tokens end with their window.
                let ttl = match op.kind {
                    OpKind::FixedWindow { .. } => policy.ttl_ms.min(answer.reset_ms),
                    _ => policy.ttl_ms,
                };
                lease.expires_ms = now_ms + ttl;
                lease.window_end_ms = now_ms + answer.reset_ms;
                lease.shared_remaining = answer.remaining;
                lease.kind = op.kind;
                lease.claim_key.clone_from(&op.key);
                // The key's rate is measured between single-flight claims only: a waiter's
                // own claim (no batch) must not reset it.
                if claim.notify.is_some() {
                    lease.claimed_ms = now_ms;
                    lease.spent_since_claim = claim.cost;
                    lease.last_batch = extra;
                }
                lease.estimate(now_ms, 0)
            }
            Some(lease) => {
                lease.tokens += claim.reserved;
                *answer
            }
        };
        claim.reserved = 0;
        if let Some(lease) = shard.get_mut(&claim.id) {
            lease.release(&claim);
        }
        claim.leases = None;
        (outcome, events)
    }

    /// Takes every unspent, unexpired token out of the leases (graceful shutdown): one
    /// give-back op per lease, with its class, for the caller to send.
    pub(super) fn drain(&self, now_ms: u64) -> Vec<(Op, Arc<str>)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            for lease in shard.values_mut() {
                if lease.tokens > 0 && now_ms < lease.expires_ms {
                    out.push((
                        Op {
                            key: lease.claim_key.clone(),
                            kind: lease.kind,
                            cost: lease.tokens,
                            action: crate::store::Action::Return,
                        },
                        lease.class.clone(),
                    ));
                }
                lease.tokens = 0;
            }
        }
        out
    }

    /// Drops leases that are spent or expired and idle, with no claim in flight; returns the
    /// expired unspent tokens by class, for the metrics.
    pub(super) fn sweep(&self, now_ms: u64) -> Vec<(Arc<str>, u64)> {
        let mut expired = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            shard.retain(|_, lease| {
                if now_ms < lease.expires_ms || lease.claiming.is_some() {
                    return true;
                }
                if lease.tokens > 0 {
                    expired.push((lease.class.clone(), std::mem::take(&mut lease.tokens)));
                }
                // Keep a recently used key's rate history a little longer than its lease.
                now_ms < lease.claimed_ms.saturating_add(10_000)
            });
        }
        expired
    }
}

impl Lease {
    /// An empty lease for `op`'s bucket: its first take claims.
    fn new(op: &Op, class: &Arc<str>, now_ms: u64) -> Self {
        Lease {
            tokens: 0,
            expires_ms: 0,
            shared_remaining: 0,
            claimed_ms: now_ms,
            spent_since_claim: 0,
            last_batch: 0,
            window_end_ms: 0,
            claiming: None,
            claim_key: op.key.clone(),
            kind: op.kind,
            class: class.clone(),
        }
    }

    /// The next batch: about half a TTL's worth of this key's recent rate, within 1..=max.
    fn batch(&self, policy: LeasePolicy, now_ms: u64) -> u64 {
        if self.expires_ms == 0 {
            // The key's first claim: no rate known yet, take only the cost.
            return 0;
        }
        let elapsed = now_ms.saturating_sub(self.claimed_ms).max(1);
        let per_half_ttl = self.spent_since_claim.saturating_mul(policy.ttl_ms) / (2 * elapsed);
        per_half_ttl.clamp(1, policy.max_batch.max(1))
    }

    /// A leased answer (see the module doc): allowed, `spent` just taken.
    fn estimate(&self, now_ms: u64, spent: u64) -> Outcome {
        let (remaining, reset_ms) = match self.kind {
            OpKind::TokenBucket {
                capacity,
                refill,
                window_ms,
            } => {
                let remaining = (self.shared_remaining + self.tokens).min(capacity);
                let missing = capacity - remaining;
                let reset = if refill == 0 {
                    window_ms
                } else {
                    (missing.saturating_mul(window_ms)).div_ceil(refill)
                };
                (remaining, reset)
            }
            OpKind::FixedWindow { limit, .. } | OpKind::SlidingWindow { limit, .. } => (
                (self.shared_remaining + self.tokens).min(limit),
                self.window_end_ms.saturating_sub(now_ms),
            ),
        };
        Outcome {
            allowed: true,
            remaining,
            reset_ms,
            retry_ms: Some(0),
            granted: spent,
        }
    }

    /// Ends `claim`'s single flight, if it is this lease's, and wakes its waiters.
    fn release(&mut self, claim: &Claim) {
        if let (Some(mine), Some(current)) = (&claim.notify, &self.claiming)
            && Arc::ptr_eq(mine, current)
        {
            self.claiming = None;
            mine.notify_waiters();
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let Some(leases) = self.leases.take() else {
            return;
        };
        let mut shard = leases.shard(&self.id);
        if let Some(lease) = shard.get_mut(&self.id) {
            lease.tokens += self.reserved;
            lease.release(self);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: LeasePolicy = LeasePolicy {
        max_batch: 50,
        ttl_ms: 1_000,
    };

    fn op(cost: u64) -> Op {
        Op::take(
            "k".into(),
            OpKind::TokenBucket {
                capacity: 1_000,
                refill: 1_000,
                window_ms: 60_000,
            },
            cost,
        )
    }

    fn granted(n: u64, remaining: u64) -> Outcome {
        Outcome {
            allowed: true,
            remaining,
            reset_ms: 0,
            retry_ms: Some(0),
            granted: n,
        }
    }

    fn claim(t: (Take, TokenEvents)) -> Claim {
        match t.0 {
            Take::Claim(c) => c,
            Take::Local(_) | Take::LocalAndAhead(..) => panic!("spent locally"),
            Take::Wait(_) => panic!("waits"),
        }
    }

    #[test]
    fn first_claim_takes_the_cost_then_batches_follow_the_rate() {
        let l = Leases::new();
        let class: Arc<str> = "c".into();
        let c = claim(l.take("k", &op(1), &class, POLICY, 1, 0, true));
        assert_eq!((c.ask.need, c.ask.want), (1, 1), "no rate known yet");
        let (o, ev) = l.settle(c, &op(1), &granted(1, 999), POLICY, 0);
        assert!(o.allowed);
        assert_eq!(ev.granted, 1);
        // 1 token in 2 ms is 250 per half TTL: capped at the max.
        let c = claim(l.take("k", &op(1), &class, POLICY, 1, 2, true));
        assert_eq!((c.ask.need, c.ask.want), (1, 51));
        l.settle(c, &op(1), &granted(51, 948), POLICY, 2);
        for now in 3..53 {
            let (t, _) = l.take("k", &op(1), &class, POLICY, 1, now, true);
            let (Take::Local(o) | Take::LocalAndAhead(o, _)) = t else {
                panic!("leased")
            };
            assert!(o.allowed && o.remaining <= 1_000);
        }
        // Spent: the next claim again. 50 tokens over 51 ms is still the max.
        let c = claim(l.take("k", &op(1), &class, POLICY, 1, 53, true));
        assert_eq!(c.ask.want, 51);
        drop(c);
        // A slow key gets small batches: 1 token in 900 ms is < 1 per half TTL.
        let c = claim(l.take("slow", &op(1), &class, POLICY, 1, 0, true));
        l.settle(c, &op(1), &granted(1, 10), POLICY, 0);
        let c = claim(l.take("slow", &op(1), &class, POLICY, 1, 900, true));
        assert_eq!(c.ask.want, 2);
    }

    #[test]
    fn one_claim_in_flight_per_key_and_cancellation_releases_it() {
        let l = Leases::new();
        let class: Arc<str> = "c".into();
        let first = claim(l.take("k", &op(1), &class, POLICY, 3, 0, true));
        assert_eq!(first.ask.share, 3);
        assert!(matches!(
            l.take("k", &op(1), &class, POLICY, 3, 0, true).0,
            Take::Wait(_)
        ));
        // On the second look a waiter claims for itself, without a batch.
        let own = claim(l.take("k", &op(2), &class, POLICY, 3, 0, false));
        assert_eq!((own.ask.need, own.ask.want), (2, 2));
        drop(own);
        drop(first);
        assert!(
            matches!(
                l.take("k", &op(1), &class, POLICY, 3, 0, true).0,
                Take::Claim(_)
            ),
            "a dropped claim no longer blocks the key"
        );
    }

    #[test]
    fn partial_cover_is_reserved_refusals_give_it_back_and_leases_expire() {
        let l = Leases::new();
        let class: Arc<str> = "c".into();
        let c = claim(l.take("k", &op(1), &class, POLICY, 1, 0, true));
        l.settle(c, &op(1), &granted(4, 500), POLICY, 0); // 3 kept
        let c = claim(l.take("k", &op(5), &class, POLICY, 1, 10, true));
        assert_eq!(c.ask.need, 2, "3 from the lease, 2 claimed");
        let refused = Outcome {
            allowed: false,
            granted: 0,
            retry_ms: Some(7),
            ..granted(0, 0)
        };
        let (o, _) = l.settle(c, &op(5), &refused, POLICY, 10);
        assert_eq!((o.allowed, o.retry_ms), (false, Some(7)));
        let (t, _) = l.take("k", &op(3), &class, POLICY, 1, 20, true);
        assert!(matches!(t, Take::Local(_)), "the 3 came back");
        // Expired tokens are not spent, and are reported.
        let c = claim(l.take("k", &op(1), &class, POLICY, 1, 30, true));
        l.settle(c, &op(1), &granted(10, 500), POLICY, 30); // 9 kept until 1030
        let (t, ev) = l.take("k", &op(1), &class, POLICY, 1, 1_030, true);
        assert!(matches!(t, Take::Claim(_)));
        assert_eq!(ev.expired, 9);
    }

    #[test]
    fn drain_gives_back_live_tokens_once() {
        let l = Leases::new();
        let class: Arc<str> = "c".into();
        let c = claim(l.take("k", &op(1), &class, POLICY, 1, 0, true));
        let mut sent = op(1);
        sent.key = "k-shard".into();
        l.settle(c, &sent, &granted(6, 100), POLICY, 0);
        let back = l.drain(10);
        assert_eq!(back.len(), 1);
        assert_eq!(
            (back[0].0.key.as_str(), back[0].0.cost, back[0].0.action),
            ("k-shard", 5, crate::store::Action::Return)
        );
        assert!(l.drain(10).is_empty());
    }
}
