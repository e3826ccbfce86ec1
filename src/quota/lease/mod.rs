//! Token leasing: a replica claims a batch of a hot key's tokens from the store in one call
//! (`lua/lease.lua`) and answers that key's requests from memory until the batch is spent or
//! its TTL passes; only then does it call the store again. The accounting here does not know
//! who holds the leases (a replica's limiter today, `limiter/hot/`); `entry.rs` is one lease.
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
//! since, times half the TTL (so a batch lasts about half its life), at most `max_batch`, and
//! down to nothing extra: a key this replica sees less than about twice per TTL claims only its
//! request's cost. A key's first claim takes only its cost. The store splits what is left of a nearly spent
//! bucket between the live replicas (`share` in `lease.lua`), so one replica cannot hoard it.
//!
//! # Bounds
//!
//! A leased token is taken from the shared bucket before it is spent, so leasing never admits
//! more tokens than the bucket gave; it only moves *when* they are spent. Over any span,
//! admissions exceed the unleased limit by at most the tokens held in leases at its start:
//! replicas × (max_batch + cost). Tokens left when a new batch arrives join it and its TTL; a
//! fixed window's tokens end with their window.
//!
//! # The end of a lease
//!
//! A lease's tokens are spendable for its TTL. Whatever is left then is **given back** to the
//! bucket (`Action::Return`, capped at the capacity): queued when the expiry is seen (the next
//! take of the key, the next claim's answer, or the housekeeping sweep) and sent by the next
//! housekeeping pass ([`Leases::give_backs`]), so a slow token bucket or a fixed window does not
//! lose them until its refill or its window's end. A fixed window's tokens are given back only
//! while their window has more than [`WINDOW_MARGIN_MS`] to run (the give-back counts against the
//! window Redis is in when it arrives); after that they end with their window, which loses
//! nothing. On graceful shutdown every lease is given back ([`Leases::drain`]). Only a killed
//! replica loses what its leases held.
//!
//! # Bounds on memory
//!
//! At most `lease_max_keys` leases are held (split over the table's shards). A key seen when its
//! shard is full first drops the shard's idle leases (no tokens, no claim in flight); if none is
//! idle, the key is not leased: its op goes to the store like an unleased limit's.
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

use super::{ClaimAsk, Op, OpKind, Outcome};

mod entry;

const SHARDS: usize = 16;

/// A fixed window's unspent tokens are given back only while their window has more than this
/// to run: the local estimate of the window's end lags Redis by a round trip, and a give-back
/// that reached Redis in the next window would take hits off that window instead.
pub const WINDOW_MARGIN_MS: u64 = 1_000;

/// The lease parameters of one limit (its `lease:` over the global settings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeasePolicy {
    pub max_batch: u64,
    pub ttl_ms: u64,
}

/// This replica's leases, by bucket (`keys::bucket_id`: all shards of a key share one lease).
#[derive(Debug)]
pub struct Leases {
    shards: Box<[Mutex<HashMap<String, Lease>>]>,
    hasher: RandomState,
    /// Most leases one shard holds: `lease_max_keys` over the shards, at least 1.
    per_shard: usize,
    /// Unspent tokens of ended leases, with their class, until the next housekeeping pass
    /// sends them back ([`Leases::give_backs`]); at most `per_shard × SHARDS` of them.
    returns: Mutex<Vec<(Op, Arc<str>)>>,
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
    /// The lease TTL the last granted claim was made under: how long the rate measured since
    /// the last single-flight claim can still make a batch (see [`Leases::sweep`]).
    ttl_ms: u64,
    /// A fixed window's end as of the last claim (monotonic ms).
    window_end_ms: u64,
    /// Set while a claim for this key is in flight; waiters are woken when it settles.
    claiming: Option<Arc<Notify>>,
    /// Where the last claim went when that is not the lease's own key (a shard's key, for a
    /// sharded limit; `None` keeps a second copy of every key out of the table), its kind and
    /// class: what a give-back needs.
    claim_key: Option<String>,
    kind: OpKind,
    class: Arc<str>,
}

/// What [`Leases::take`] decided for one op.
pub enum Take {
    /// Spent from the lease.
    Local(Outcome),
    /// Spent from the lease, which is running low: also claim the next batch ahead (the
    /// request's answer does not depend on it).
    LocalAndAhead(Outcome, Claim),
    /// Another request is claiming for this key: wait for it, then take again.
    Wait(OwnedNotified),
    /// Claim `ask` from the store; settle the answer with the claim.
    Claim(Claim),
    /// The lease table is full (`lease_max_keys`): this op is not leased.
    Unleased,
}

/// A claim in flight. Dropped unsettled (the request was cancelled), it gives the reserved
/// tokens back to the lease and wakes the waiters, so no key is left "claiming" for ever.
#[derive(Debug)]
pub struct Claim {
    pub ask: ClaimAsk,
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
pub struct TokenEvents {
    pub granted: u64,
    /// Unspent tokens that ended without a give-back (a fixed window's, with their window).
    pub expired: u64,
}

impl Claim {
    /// The cost of the request this claim is for (0 for a claim ahead).
    pub fn cost(&self) -> u64 {
        self.cost
    }
}

impl Leases {
    /// A table of at most `max_keys` leases (`lease_max_keys`).
    pub fn new(max_keys: usize) -> Arc<Self> {
        Arc::new(Leases {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            per_shard: max_keys.div_ceil(SHARDS).max(1),
            returns: Mutex::new(Vec::new()),
        })
    }

    /// Queues what an ended lease held: a give-back, or (a fixed window near or past its end)
    /// nothing to give back, reported as expired.
    fn end(&self, id: &str, lease: &mut Lease, now_ms: u64, events: &mut TokenEvents) {
        let tokens = std::mem::take(&mut lease.tokens);
        if tokens == 0 {
            return;
        }
        let window_open = match lease.kind {
            OpKind::FixedWindow { .. } => {
                lease.window_end_ms > now_ms.saturating_add(WINDOW_MARGIN_MS)
            }
            _ => true,
        };
        let mut returns = self.returns.lock().unwrap_or_else(|p| p.into_inner());
        if !window_open || returns.len() >= self.per_shard * SHARDS {
            events.expired += tokens;
            return;
        }
        returns.push((lease.give_back(id, tokens), lease.class.clone()));
    }

    /// The give-backs queued since the last call, for the caller to send.
    pub fn give_backs(&self) -> Vec<(Op, Arc<str>)> {
        std::mem::take(&mut *self.returns.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn shard(&self, id: &str) -> MutexGuard<'_, HashMap<String, Lease>> {
        let i = (self.hasher.hash_one(id) as usize) % SHARDS;
        // Plain numbers only: a panic elsewhere cannot leave a lease half-written.
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Spends `op.cost` (> 0) of bucket `id` from the lease, or says how to get it. `may_wait`
    /// is false on the second look after a wait: then the request claims for itself.
    #[allow(clippy::too_many_arguments)]
    pub fn take(
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
            if shard.len() >= self.per_shard {
                // Full: idle leases make room; if none is idle, this key is not leased.
                shard.retain(|_, l| l.tokens > 0 || l.claiming.is_some());
                if shard.len() >= self.per_shard {
                    return (Take::Unleased, events);
                }
            }
            shard.insert(id.to_string(), Lease::new(id, op, class, now_ms));
        }
        let Some(lease) = shard.get_mut(id) else {
            // Inserted just above, under the same lock.
            unreachable!("lease {id} vanished under its lock")
        };
        if lease.tokens > 0 && now_ms >= lease.expires_ms {
            self.end(id, lease, now_ms, &mut events);
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
    pub fn settle(
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
                    self.end(&claim.id, lease, now_ms, &mut events);
                }
                lease.tokens += extra;
                // A fixed window's tokens end with their window.
                let ttl = match op.kind {
                    OpKind::FixedWindow { .. } => policy.ttl_ms.min(answer.reset_ms),
                    _ => policy.ttl_ms,
                };
                lease.expires_ms = now_ms + ttl;
                lease.ttl_ms = policy.ttl_ms;
                lease.window_end_ms = now_ms + answer.reset_ms;
                lease.shared_remaining = answer.remaining;
                lease.kind = op.kind;
                lease.set_claim_key(&claim.id, &op.key);
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

    /// The unspent tokens this replica's lease of bucket `id` holds (0 when none).
    pub fn held(&self, id: &str) -> u64 {
        self.shard(id).get(id).map_or(0, |lease| lease.tokens)
    }

    /// Drops the unspent tokens of the lease of bucket `id` without giving them back: the
    /// bucket was reset (the counter API), and they were claimed from its old count. A claim
    /// in flight still settles into the lease (its tokens come from the bucket as it is now).
    /// How many were dropped.
    pub fn forfeit(&self, id: &str) -> u64 {
        self.shard(id)
            .get_mut(id)
            .map_or(0, |lease| std::mem::take(&mut lease.tokens))
    }

    /// Takes every unspent token out of the leases (graceful shutdown): the queued
    /// give-backs and one more per lease that holds tokens, with its class, for the caller to
    /// send.
    pub fn drain(&self, now_ms: u64) -> Vec<(Op, Arc<str>)> {
        let mut events = TokenEvents::default();
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            for (id, lease) in shard.iter_mut() {
                self.end(id, lease, now_ms, &mut events);
            }
        }
        self.give_backs()
    }

    /// Ends expired leases (their tokens queued for a give-back) and drops leases that are
    /// spent and idle, with no claim in flight, once their rate history no longer makes a
    /// batch (a new lease's first claim asks for none either, so dropping one changes no
    /// decision; at most 10 s after its last claim); returns the unspent tokens that ended
    /// without a give-back, by class, for the metrics. A key seen less than about twice per
    /// TTL so leaves the table about one TTL after its claim: a fleet's long tail of keys
    /// costs a replica the keys of one TTL, not of ten seconds.
    pub fn sweep(&self, now_ms: u64) -> Vec<(Arc<str>, u64)> {
        let mut expired = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            shard.retain(|id, lease| {
                if now_ms < lease.expires_ms || lease.claiming.is_some() {
                    return true;
                }
                let mut events = TokenEvents::default();
                self.end(id, lease, now_ms, &mut events);
                if events.expired > 0 {
                    expired.push((lease.class.clone(), events.expired));
                }
                // Keep a recently used key's rate history while it still makes a batch.
                now_ms < lease.claimed_ms.saturating_add(10_000) && lease.makes_a_batch(now_ms)
            });
            // Give memory back after a burst of keys (a long tail's keys come and go), as the
            // memory store's sweep does, instead of keeping the peak capacity forever.
            let len = shard.len();
            if shard.capacity() > 64 && len < shard.capacity() / 4 {
                shard.shrink_to(len * 2);
            }
        }
        expired
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
            found: None,
        }
    }

    fn claim(t: (Take, TokenEvents)) -> Claim {
        match t.0 {
            Take::Claim(c) => c,
            Take::Local(_) | Take::LocalAndAhead(..) => panic!("spent locally"),
            Take::Wait(_) => panic!("waits"),
            Take::Unleased => panic!("not leased"),
        }
    }

    #[test]
    fn first_claim_takes_the_cost_then_batches_follow_the_rate() {
        let l = Leases::new(1_000);
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
        // A slow key claims only its cost: 1 token in 900 ms is < 1 per half TTL.
        let c = claim(l.take("slow", &op(1), &class, POLICY, 1, 0, true));
        l.settle(c, &op(1), &granted(1, 10), POLICY, 0);
        let c = claim(l.take("slow", &op(1), &class, POLICY, 1, 900, true));
        assert_eq!(c.ask.want, 1, "nothing extra");
        // 1 token in 400 ms is 1 per half TTL: one extra.
        l.settle(c, &op(1), &granted(1, 10), POLICY, 900);
        let c = claim(l.take("slow", &op(1), &class, POLICY, 1, 1_300, true));
        assert_eq!(c.ask.want, 2);
    }

    #[test]
    fn the_sweep_drops_a_lease_whose_rate_makes_no_batch_which_then_claims_as_before() {
        let l = Leases::new(1_000);
        let class: Arc<str> = "c".into();
        let held = |key: &str| l.shard(key).contains_key(key);
        // A slow key: 1 token claimed at 0 and spent. 1 token per 1,000 ms is no batch.
        let c = claim(l.take("slow", &op(1), &class, POLICY, 1, 0, true));
        l.settle(c, &op(1), &granted(1, 10), POLICY, 0);
        assert!(l.sweep(400).is_empty() && held("slow"), "its lease is live");
        let c = claim(l.take("slow", &op(1), &class, POLICY, 1, 1_000, true));
        assert_eq!(c.ask.want, 1, "held, it would claim only its cost");
        drop(c);
        l.sweep(1_000);
        assert!(!held("slow"), "dropped once its rate makes no batch");
        let c = claim(l.take("slow", &op(1), &class, POLICY, 1, 1_000, true));
        assert_eq!(c.ask.want, 1, "new, it claims the same");
        drop(c);
        // A busy key: 51 tokens since its claim at 2 ms keep making a batch for 25 s, but
        // its history is kept at most 10 s.
        let c = claim(l.take("busy", &op(1), &class, POLICY, 1, 0, true));
        l.settle(c, &op(1), &granted(1, 999), POLICY, 0);
        let c = claim(l.take("busy", &op(1), &class, POLICY, 1, 2, true));
        l.settle(c, &op(1), &granted(51, 948), POLICY, 2);
        for now in 3..53 {
            let _ = l.take("busy", &op(1), &class, POLICY, 1, now, true);
        }
        l.sweep(5_000);
        assert!(held("busy"), "5 s after its claim it still makes a batch");
        l.sweep(10_002);
        assert!(!held("busy"), "10 s after its claim");
    }

    #[test]
    fn the_sweep_gives_back_the_memory_of_a_burst_of_keys() {
        let l = Leases::new(1_000_000);
        let class: Arc<str> = "c".into();
        let capacity = |l: &Leases| {
            l.shards
                .iter()
                .map(|s| s.lock().unwrap().capacity())
                .sum::<usize>()
        };
        // A long tail's burst: 20,000 keys seen once each (a claim of their cost).
        for i in 0..20_000 {
            let key = format!("k{i}");
            let c = claim(l.take(&key, &op(1), &class, POLICY, 1, 0, true));
            l.settle(c, &op(1), &granted(1, 10), POLICY, 0);
        }
        let peak = capacity(&l);
        assert!(peak >= 20_000, "{peak}");
        // Spent and past their TTL, with no rate to make a batch: dropped, and the table
        // shrinks instead of keeping room for 20,000.
        l.sweep(2_000);
        let after = capacity(&l);
        assert!(after < peak / 4, "capacity {peak} -> {after}");
        // And it grows again when keys come back.
        let c = claim(l.take("k1", &op(1), &class, POLICY, 1, 2_000, true));
        l.settle(c, &op(1), &granted(1, 10), POLICY, 2_000);
        assert!(l.shard("k1").contains_key("k1"));
    }

    #[test]
    fn one_claim_in_flight_per_key_and_cancellation_releases_it() {
        let l = Leases::new(1_000);
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
        let l = Leases::new(1_000);
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
        // Expired tokens are not spent: they are queued to go back to the bucket.
        let c = claim(l.take("k", &op(1), &class, POLICY, 1, 30, true));
        l.settle(c, &op(1), &granted(10, 500), POLICY, 30); // 9 kept until 1030
        let (t, ev) = l.take("k", &op(1), &class, POLICY, 1, 1_030, true);
        assert!(matches!(t, Take::Claim(_)));
        assert_eq!(ev.expired, 0, "given back, not lost");
        let back = l.give_backs();
        assert_eq!(
            back.iter()
                .map(|(o, _)| (o.cost, o.action))
                .collect::<Vec<_>>(),
            [(9, crate::quota::ops::Action::RETURN)]
        );
        assert!(l.give_backs().is_empty(), "handed out once");
    }

    #[test]
    fn the_sweep_gives_expired_tokens_back_but_a_fixed_window_s_end_with_it() {
        let l = Leases::new(1_000);
        let class: Arc<str> = "c".into();
        let c = claim(l.take("tb", &op(1), &class, POLICY, 1, 0, true));
        l.settle(c, &op(1), &granted(5, 100), POLICY, 0);
        let fw = Op::take(
            "fw".into(),
            OpKind::FixedWindow {
                limit: 100,
                window_ms: 60_000,
            },
            1,
        );
        // Claimed with 1.5 s of its window left: the lease ends with the TTL (1 s), 0.5 s
        // before the window does, inside the give-back margin.
        let c = claim(l.take("fw", &fw, &class, POLICY, 1, 0, true));
        let answer = Outcome {
            reset_ms: 1_500,
            ..granted(4, 50)
        };
        l.settle(c, &fw, &answer, POLICY, 0);
        assert!(l.sweep(500).is_empty() && l.give_backs().is_empty(), "live");
        let expired = l.sweep(1_000);
        assert_eq!(
            expired.iter().map(|(_, n)| *n).collect::<Vec<_>>(),
            [3],
            "the window's 3 end with it"
        );
        let back = l.give_backs();
        assert_eq!(back.len(), 1);
        assert_eq!((back[0].0.key.as_str(), back[0].0.cost), ("k", 4));
    }

    #[test]
    fn the_table_is_bounded_and_idle_leases_make_room() {
        // 16 shards of 1: a second key on a shard whose lease holds tokens is not leased.
        let l = Leases::new(16);
        let class: Arc<str> = "c".into();
        let mut unleased = 0;
        for i in 0..200 {
            let key = format!("k{i}");
            let mut o = op(1);
            o.key.clone_from(&key);
            match l.take(&key, &o, &class, POLICY, 1, 0, true).0 {
                Take::Claim(c) => {
                    l.settle(c, &o, &granted(3, 100), POLICY, 0);
                }
                Take::Unleased => unleased += 1,
                _ => panic!("a new key claims or is not leased"),
            }
        }
        let held: usize = l.shards.iter().map(|s| s.lock().unwrap().len()).sum();
        assert_eq!(held, 16, "one lease per shard");
        assert_eq!(unleased, 200 - 16);
        // Spent leases are idle: a new key takes the place of one.
        for i in 0..200 {
            let key = format!("k{i}");
            let mut o = op(2);
            o.key.clone_from(&key);
            // Spends a leased key's 2; a key that was not leased may take an idle place
            // (its claim dropped unsent).
            let _ = l.take(&key, &o, &class, POLICY, 1, 1, true);
        }
        let mut o = op(1);
        o.key = "new".into();
        assert!(matches!(
            l.take("new", &o, &class, POLICY, 1, 2, true).0,
            Take::Claim(_)
        ));
    }

    #[test]
    fn drain_gives_back_live_tokens_once() {
        let l = Leases::new(1_000);
        let class: Arc<str> = "c".into();
        let c = claim(l.take("k", &op(1), &class, POLICY, 1, 0, true));
        let mut sent = op(1);
        sent.key = "k-shard".into();
        l.settle(c, &sent, &granted(6, 100), POLICY, 0);
        let back = l.drain(10);
        assert_eq!(back.len(), 1);
        assert_eq!(
            (back[0].0.key.as_str(), back[0].0.cost, back[0].0.action),
            ("k-shard", 5, crate::quota::ops::Action::RETURN)
        );
        assert!(l.drain(10).is_empty());
    }
}
