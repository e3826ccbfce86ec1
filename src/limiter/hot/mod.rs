//! The hot-key path: what happens to a request's ops between the plan and the fold, so most
//! decisions on a hot key never touch the store.
//!
//! Each op, in turn ([`HotKeys::look`]):
//! 1. **Lease** ([`lease`](crate::quota::lease)), for a leased limit: spend from this replica's lease
//!    (and, when it runs low, claim the next batch ahead), or wait for the key's claim in
//!    flight, or claim.
//! 2. **Over-limit cache** ([`overlimit`](super::overlimit)), before anything goes to the
//!    store: a key the store refused until `t` is refused from memory until `t`. A sharded op
//!    whose shard is cached tries another shard first.
//! 3. Otherwise the op goes to the store as planned.
//!
//! Then one store call carries every op and claim that needs the store ([`HotKeys::round`]),
//! *before* any op waits for another request's claim: an op never waits for a claim that is
//! not on its way. Waiters (bounded by `claim_wait_ms`) look again and, if their lease is still
//! short, claim in a second call. Refusals fill the over-limit cache; a sharded op that found
//! its shard empty tries one other shard ([`shard`](super::shard)) in one more call. Outcomes
//! come back one per op, in op order, as [`Store::apply_each`] gives them, so the fallback and
//! the fold do not change.
//!
//! With no lease, no cache (the memory store) and no sharded limit in the request, the ops go
//! straight to the store. On Redis, ops that go to the store as planned are sent from the plan
//! itself, uncopied.
//!
//! Here: the walk over the ops and the waits. `round.rs`: the store call and what its answers
//! settle (and claims sent ahead); `housekeeping.rs`: sweeps and giving leased tokens back.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use super::overlimit::OverLimitCache;
use super::plan::{Plan, Planned};
use super::{Source, shard};
use crate::clock::Clock;
use crate::keys;
use crate::quota::lease::{Claim, LeasePolicy, Leases, Take, TokenEvents};
use crate::quota::{Action, Op, OpKind, Outcome};
use crate::rules::Limit;
use crate::store::{Store, StoreError};
use crate::telemetry::{ClassLabels, HotKeyMetrics, LeaseTokenLabels, LocalLabels};

mod housekeeping;
mod round;

/// The hot-key settings (see `settings.rs`).
#[derive(Clone, Copy, Debug)]
pub struct HotKeyConfig {
    /// Leasing and the over-limit cache need a shared store: off on the memory store.
    pub shared_store: bool,
    /// `lease_max_batch` / `lease_ttl_ms`: the defaults of every limit's lease.
    pub lease_max_batch: u64,
    pub lease_ttl_ms: u64,
    /// `lease_max_keys`: most leases held at once (past it a new key is not leased).
    pub lease_max_keys: usize,
    /// `over_limit_cache_max_keys` (0: off).
    pub over_limit_cache_max_keys: usize,
    pub shard_retry: bool,
    /// How long an op waits for another request's claim of its key before claiming itself
    /// (a claim is one store call: about `store_timeout_ms`).
    pub claim_wait_ms: u64,
}

impl Default for HotKeyConfig {
    fn default() -> Self {
        HotKeyConfig {
            shared_store: false,
            lease_max_batch: 0,
            lease_ttl_ms: 1_000,
            lease_max_keys: 100_000,
            over_limit_cache_max_keys: 10_000,
            shard_retry: true,
            claim_wait_ms: 50,
        }
    }
}

#[derive(Debug)]
pub(super) struct HotKeys {
    config: HotKeyConfig,
    cache: Option<Arc<OverLimitCache>>,
    leases: Option<Arc<Leases>>,
    clock: Clock,
    metrics: HotKeyMetrics,
}

/// One op on its way: where it stands and what it has tried.
struct Work<'p> {
    planned: &'p Planned,
    /// The op as planned (a sharded limit's first shard already picked).
    planned_op: &'p Op,
    /// The shard in use, for a sharded limit.
    shard: Option<u32>,
    retried: bool,
    /// What answered it without the store (a lease, the over-limit cache), if anything: the
    /// decision's source and the `reason` of `tollgate_local_decisions_total`.
    local: Option<Source>,
    state: State,
}

enum State {
    /// To the store as planned (also the state before the first look): sent without a copy.
    Planned,
    Done(Result<Outcome, StoreError>),
    Send(Op),
    Claim(Op, Claim, LeasePolicy),
    /// Answered from the lease; a claim ahead goes to the store with the others.
    Ahead(Outcome, Op, Claim, LeasePolicy),
    /// The op, and the key's claim in flight to wait for.
    Wait(Op, tokio::sync::futures::OwnedNotified),
    /// Moved out while being worked on; never left behind (an op left so has no answer).
    Taken,
}

impl HotKeys {
    pub(super) fn new(config: HotKeyConfig, clock: Clock, metrics: HotKeyMetrics) -> Self {
        let shared = config.shared_store;
        HotKeys {
            cache: (shared && config.over_limit_cache_max_keys > 0)
                .then(|| Arc::new(OverLimitCache::new(config.over_limit_cache_max_keys))),
            leases: shared.then(|| Leases::new(config.lease_max_keys)),
            config,
            clock,
            metrics,
        }
    }

    /// The unspent tokens this replica's lease of the bucket with store key `key` holds.
    pub(super) fn leased(&self, key: &str) -> u64 {
        self.leases
            .as_ref()
            .map_or(0, |l| l.held(crate::keys::bucket_id(key)))
    }

    /// How long this replica's over-limit cache goes on refusing a request of `key` (a bucket
    /// of `kind`) without the store, if it holds a refusal of it (`/counters/explain`).
    pub(super) fn cached_refusal(&self, key: &str, kind: OpKind) -> Option<u64> {
        let cache = self.cache.as_ref()?;
        let refusal = cache.check(key, kind, 1, self.clock.mono_ms())?;
        refusal.retry_ms
    }

    /// Forgets what this replica holds of the bucket with store key `key`, which was reset
    /// (the counter API): its over-limit cache entry, and its lease's tokens (dropped, not
    /// given back). How many leased tokens were dropped.
    pub(super) fn forget_bucket(&self, key: &str) -> u64 {
        if let Some(cache) = &self.cache {
            cache.forget(key);
        }
        self.leases
            .as_ref()
            .map_or(0, |l| l.forfeit(crate::keys::bucket_id(key)))
    }

    /// Empties the over-limit cache; how many entries it held.
    pub(super) fn forget_all_cached(&self) -> usize {
        self.cache.as_ref().map_or(0, |c| c.clear())
    }

    /// One outcome (or store error) per op of `plan`, in op order, each with what answered it
    /// without the store, if anything (`None`: the store's answer). `share` is the live replica count, which splits a nearly spent bucket between
    /// claims.
    pub(super) async fn apply(
        &self,
        store: &Arc<Store>,
        plan: &Plan,
        share: u64,
    ) -> Vec<super::Answer> {
        if self.cache.is_none()
            && self.leases.is_none()
            && plan.planned.iter().all(|p| p.shard.is_none())
        {
            return store
                .apply_each(&plan.ops)
                .await
                .into_iter()
                .map(|r| (r, None))
                .collect();
        }
        let now = self.clock.mono_ms();
        let mut work: Vec<Work<'_>> = plan
            .planned
            .iter()
            .zip(&plan.ops)
            .map(|(planned, op)| Work {
                planned,
                planned_op: op,
                shard: planned.shard,
                retried: false,
                local: None,
                state: State::Planned,
            })
            .collect();
        for w in &mut work {
            self.look(w, share, now, true);
        }

        // Everything that can go to the store goes now, this request's own claims included,
        // before any wait: a request must never wait for a claim it has not sent (two of its
        // descriptors on one lease), nor two requests for each other's.
        self.round(store, &plan.ops, &mut work).await;

        // Ops that waited for another request's claim of their key: once it settles (or the
        // wait runs out), look again; a lease still short becomes this op's own claim.
        // The later rounds and the wait are boxed: they are rare, and inline, their state would
        // be part of every request's future (each request waiting on the store holds one).
        if work.iter().any(|w| matches!(w.state, State::Wait(..))) {
            let bound = Duration::from_millis(self.config.claim_wait_ms);
            for w in &mut work {
                if matches!(w.state, State::Wait(..))
                    && let State::Wait(op, wait) = std::mem::replace(&mut w.state, State::Taken)
                {
                    let _ = Box::pin(self.clock.timeout(bound, wait)).await;
                    w.state = State::Send(op);
                    let now = self.clock.mono_ms();
                    self.look(w, share, now, false);
                }
            }
            Box::pin(self.round(store, &plan.ops, &mut work)).await;
        }

        // A sharded op refused by its shard tries one other shard.
        if self.config.shard_retry {
            let mut again = false;
            for w in &mut work {
                let refused = matches!(&w.state, State::Done(Ok(o)) if !o.allowed);
                if refused && w.local.is_none() && w.shard.is_some() && !w.retried {
                    self.switch_shard(w);
                    let now = self.clock.mono_ms();
                    self.look(w, share, now, false);
                    again = true;
                }
            }
            if again {
                Box::pin(self.round(store, &plan.ops, &mut work)).await;
            }
        }

        work.into_iter()
            .map(|w| {
                let local = w.local;
                let class = &w.planned.limit.class;
                if let Some(source) = w.local {
                    self.metrics
                        .local_decisions
                        .get_or_create(&LocalLabels {
                            class: class.clone(),
                            reason: source.label(),
                        })
                        .inc();
                }
                let result = match w.state {
                    State::Done(Ok(mut o)) => {
                        if w.planned.limit.shards > 1 {
                            o.remaining = crate::quota::share::shard_remaining(
                                o.remaining,
                                w.planned.limit.shards,
                                capacity(w.planned.limit.as_ref()),
                            );
                        }
                        Ok(o)
                    }
                    State::Done(Err(e)) => Err(e),
                    // `round` answers every op it was given.
                    _ => Err(StoreError::new(
                        crate::store::StoreErrorKind::Protocol,
                        "an op got no answer",
                    )),
                };
                (result, local)
            })
            .collect()
    }

    /// Decides what `w` needs: a leased answer, a wait, a cached refusal, a claim, or the
    /// store (see the module doc). The lease comes first: tokens this replica already holds
    /// are spent even while the over-limit cache holds a refusal of a larger claim.
    fn look(&self, w: &mut Work<'_>, share: u64, now: u64, may_wait: bool) {
        // Borrowed until the op must be sent: a lease hit or a cached refusal copies nothing.
        let op: Cow<'_, Op> = match std::mem::replace(&mut w.state, State::Taken) {
            State::Send(op) => Cow::Owned(op),
            _ => Cow::Borrowed(w.planned_op),
        };
        let limit = &w.planned.limit;
        let leased = match (&self.leases, self.policy(limit, &op)) {
            (Some(leases), Some(policy)) => Some((leases, policy)),
            _ => None,
        };
        let Some((leases, policy)) = leased else {
            return self.unleased(w, op, share, now, may_wait);
        };
        let id = if w.shard.is_some() {
            keys::bucket_id(&op.key)
        } else {
            &op.key
        };
        let (take, events) = leases.take(id, &op, &limit.class, policy, share, now, may_wait);
        self.count_tokens(&limit.class, events);
        w.state = match take {
            Take::Local(o) => {
                w.local = Some(Source::Lease);
                State::Done(Ok(o))
            }
            Take::LocalAndAhead(o, claim) => {
                w.local = Some(Source::Lease);
                self.count_claim(&limit.class);
                State::Ahead(o, op.into_owned(), claim, policy)
            }
            Take::Wait(wait) => State::Wait(op.into_owned(), wait),
            // The lease table is full: as if the limit were not leased.
            Take::Unleased => return self.unleased(w, op, share, now, may_wait),
            Take::Claim(claim) => {
                // The lease is short: before claiming, a refusal the store gave this key.
                // Dropping the claim gives its reservation back and wakes the key's waiters.
                let cached = self
                    .cache
                    .as_ref()
                    .is_some_and(|c| c.check(&op.key, op.kind, claim.cost(), now).is_some());
                if cached {
                    drop(claim);
                    if self.refused_from_cache(w, &op, now) {
                        return;
                    }
                    if let State::Send(moved) = std::mem::replace(&mut w.state, State::Taken) {
                        w.state = State::Send(moved);
                        return self.look(w, share, now, false);
                    }
                    // The entry ended in between: claim after all.
                    w.state = State::Send(op.into_owned());
                    return self.look(w, share, now, false);
                }
                self.count_claim(&limit.class);
                State::Claim(op.into_owned(), claim, policy)
            }
        };
    }

    /// An op that is not leased: a cached refusal, or the store.
    fn unleased(&self, w: &mut Work<'_>, op: Cow<'_, Op>, share: u64, now: u64, may_wait: bool) {
        if self.refused_from_cache(w, &op, now) {
            return;
        }
        if let State::Send(moved) = std::mem::replace(&mut w.state, State::Taken) {
            // Moved to another shard by the cache check: look at that shard instead.
            w.state = State::Send(moved);
            return self.look(w, share, now, may_wait);
        }
        w.state = match op {
            Cow::Borrowed(_) => State::Planned,
            Cow::Owned(op) => State::Send(op),
        };
    }

    /// Whether the over-limit cache refuses `op`: then `w` is done (its shard retry used
    /// first: a sharded op whose shard is cached moves to another shard, left in `w` as
    /// `State::Send` for the caller to look at).
    fn refused_from_cache(&self, w: &mut Work<'_>, op: &Op, now: u64) -> bool {
        let Some(cache) = &self.cache else {
            return false;
        };
        // A charge (overdraft) always reaches the store: refusing it from memory would
        // drop usage that must be counted. A refund is never refused.
        if (op.action == Action::Charge && op.cost > 0) || op.action.is_return() {
            return false;
        }
        let Some(o) = cache.check(&op.key, op.kind, op.cost, now) else {
            return false;
        };
        if w.shard.is_some() && self.config.shard_retry && !w.retried {
            self.switch_shard(w);
            return false;
        }
        w.local = Some(Source::OverLimitCache);
        w.state = State::Done(Ok(o));
        true
    }

    /// Moves a sharded op to another shard (once) and counts the retry.
    fn switch_shard(&self, w: &mut Work<'_>) {
        let (Some(current), Some(rate)) = (w.shard, w.planned.limit.rate) else {
            return;
        };
        let shards = w.planned.limit.shards;
        let next = shard::other(shards, current);
        w.shard = Some(next);
        w.retried = true;
        w.local = None;
        w.state = State::Send(Op::take(
            keys::with_shard(&w.planned_op.key, next),
            crate::quota::share::shard_part(OpKind::from(rate), shards, next),
            w.planned_op.cost,
        ));
        self.metrics
            .shard_retries
            .get_or_create(&ClassLabels {
                class: w.planned.limit.class.clone(),
            })
            .inc();
    }

    /// The lease of `limit` (its `lease:` over the global settings), if `op` is leased here:
    /// a token bucket or fixed window, and a cost that can fit at all (a cost above the
    /// capacity goes to the store, which refuses it for good, instead of tying up the lease).
    fn policy(&self, limit: &Limit, op: &Op) -> Option<LeasePolicy> {
        // Leased tokens cannot go into debt: an overdraft limit, and a charge (a
        // `charge_parent` node's, on a limit whose takes may be leased), are never leased, nor
        // is a fixed window's reservation (its refusal must count nothing: its own script). A
        // refund goes to the shared bucket, where the tokens it gives back were taken (a lease
        // holds tokens already out of it). A global limit's share moves with the regions'
        // demand, and leased tokens would outlast a share that shrinks.
        if limit.overdraft
            || limit.global
            || matches!(
                op.action,
                Action::Return { .. } | Action::Charge | Action::Reserve
            )
        {
            return None;
        }
        let capacity = match op.kind {
            OpKind::TokenBucket { capacity, .. } => capacity,
            OpKind::FixedWindow { limit, .. } => limit,
            // A calendar window is never leased: a lease's window half is the epoch-aligned
            // one (`lease.lua`).
            OpKind::SlidingWindow { .. }
            | OpKind::SlidingLog { .. }
            | OpKind::CalendarWindow { .. } => return None,
        };
        if op.cost == 0 || op.cost > capacity {
            return None;
        }
        let rule = limit.lease.unwrap_or(crate::rules::LeaseRule {
            max_batch: None,
            ttl_ms: None,
        });
        let max_batch = rule.max_batch.unwrap_or(self.config.lease_max_batch);
        (max_batch > 0).then(|| LeasePolicy {
            max_batch,
            ttl_ms: rule.ttl_ms.unwrap_or(self.config.lease_ttl_ms),
        })
    }

    fn count_claim(&self, class: &Arc<str>) {
        self.metrics
            .lease_claims
            .get_or_create(&ClassLabels {
                class: class.clone(),
            })
            .inc();
    }

    fn count_tokens(&self, class: &Arc<str>, events: TokenEvents) {
        count_tokens(&self.metrics, class, events);
    }

    fn count_token_event(&self, class: &Arc<str>, event: &'static str, n: u64) {
        count_token_event(&self.metrics, class, event, n);
    }
}

fn count_tokens(metrics: &HotKeyMetrics, class: &Arc<str>, events: TokenEvents) {
    for (event, n) in [("granted", events.granted), ("expired", events.expired)] {
        count_token_event(metrics, class, event, n);
    }
}

fn count_token_event(metrics: &HotKeyMetrics, class: &Arc<str>, event: &'static str, n: u64) {
    if n > 0 {
        metrics
            .lease_tokens
            .get_or_create(&LeaseTokenLabels {
                class: class.clone(),
                event,
            })
            .inc_by(n);
    }
}

/// The most a limit's bucket holds: the token bucket's burst, a window's limit.
fn capacity(limit: &Limit) -> u64 {
    limit.rate.map_or(0, |r| match OpKind::from(r) {
        OpKind::TokenBucket { capacity, .. } => capacity,
        OpKind::FixedWindow { limit, .. }
        | OpKind::SlidingWindow { limit, .. }
        | OpKind::SlidingLog { limit, .. }
        | OpKind::CalendarWindow { limit, .. } => limit,
    })
}

#[cfg(test)]
mod tests {
    use super::super::Code;
    use super::super::fixture::{block_on, req, with_hot_keys, with_store};
    use super::*;
    use crate::store::{Backend, MemoryStore};
    use futures_util::future::BoxFuture;
    use std::future::Future;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Poll;

    /// A store whose scripts run at once and whose replies wait for a permit: a request can
    /// be cancelled after its claim was spent in the bucket and before the reply came.
    #[derive(Debug)]
    struct SlowReplies {
        buckets: MemoryStore,
        replies: tokio::sync::Semaphore,
        calls: AtomicUsize,
    }

    impl Backend for SlowReplies {
        fn apply_each<'a>(
            &'a self,
            ops: &'a [Op],
        ) -> BoxFuture<'a, Vec<Result<Outcome, StoreError>>> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            let outcomes: Vec<_> = ops.iter().map(|op| Ok(self.buckets.apply(op))).collect();
            Box::pin(async move {
                // One permit, one reply.
                if let Ok(permit) = self.replies.acquire().await {
                    permit.forget();
                }
                outcomes
            })
        }
        fn heartbeat<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
            _: Duration,
        ) -> BoxFuture<'a, Result<u64, StoreError>> {
            Box::pin(async { Ok(1) })
        }
        fn leave<'a>(&'a self, _: &'a str, _: &'a str) -> BoxFuture<'a, Result<u64, StoreError>> {
            Box::pin(async { Ok(0) })
        }
        fn name(&self) -> &'static str {
            "slow-replies"
        }
    }

    /// A fixture with hot-key settings `hot` on a [`SlowReplies`] store, and that store. Its
    /// buckets have a clock of their own, never advanced: a spent bucket does not refill.
    fn on_slow_replies(hot: HotKeyConfig) -> (Arc<SlowReplies>, super::super::fixture::Fixture) {
        let store = Arc::new(SlowReplies {
            buckets: MemoryStore::new(Clock::manual(0)),
            replies: tokio::sync::Semaphore::new(0),
            calls: AtomicUsize::new(0),
        });
        let backend = store.clone();
        let f = with_store(|_| Store::Custom(backend), |c| c.hot = hot);
        (store, f)
    }

    #[test]
    fn a_batch_claimed_by_a_cancelled_request_still_joins_the_lease() {
        let (store, f) = on_slow_replies(hot());
        let r = req("edge", &[&[("leased", "a")]]);
        block_on(async {
            // The first claim takes the request's 1 (no rate yet); the second 1 + a batch.
            store.replies.add_permits(1);
            let first = f.limiter.decide(&f.rules, &r).await.unwrap();
            assert_eq!(first.overall, Code::Ok);
            let mut second = Box::pin(f.limiter.decide(&f.rules, &r));
            let polled = std::future::poll_fn(|cx| Poll::Ready(second.as_mut().poll(cx))).await;
            assert!(polled.is_pending(), "waits for the store's reply");
            // Envoy's timeout: the request is dropped with its claim spent in the bucket.
            drop(second);
            store.replies.add_permits(100);
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            assert_eq!(store.calls.load(Ordering::Relaxed), 2, "the claim was sent");
            // The batch joined the lease: the next requests are answered from it.
            for _ in 0..5 {
                let d = f.limiter.decide(&f.rules, &r).await.unwrap();
                assert_eq!(d.overall, Code::Ok);
            }
            assert_eq!(
                store.calls.load(Ordering::Relaxed),
                2,
                "no claim after the cancelled one: its batch was not lost"
            );
        });
    }

    #[test]
    fn a_waiter_on_a_refused_claim_is_refused_from_the_cache_not_the_store() {
        // The claim's own task settles the claim (waking the key's waiters) and records the
        // refusal in the over-limit cache in one step: a waiter that looks again finds the
        // refusal there. Recorded later, by the claiming request, the waiter went to the store.
        let (store, f) = on_slow_replies(HotKeyConfig {
            lease_max_batch: 10,
            ..hot()
        });
        let f = Arc::new(f);
        let r = req("edge", &[&[("tenant", "w")]]);
        block_on(async {
            // Spend the bucket (2 an hour) until the store refuses.
            let mut refused = false;
            for _ in 0..10 {
                store.replies.add_permits(1);
                if f.limiter.decide(&f.rules, &r).await.unwrap().overall == Code::OverLimit {
                    refused = true;
                    break;
                }
            }
            assert!(refused, "the store refused once the bucket was spent");
            // The refusal's cache entry ends; the store's bucket stays empty.
            f.clock.advance_ms(3_600_000);
            let before = store.calls.load(Ordering::Relaxed);
            // Two requests of their own (tasks, as tonic runs them): one claims, the other
            // waits for that claim. Each runs until it waits.
            let decide = |f: Arc<super::super::fixture::Fixture>| {
                tokio::spawn(async move {
                    let r = req("edge", &[&[("tenant", "w")]]);
                    f.limiter.decide(&f.rules, &r).await.unwrap().overall
                })
            };
            let claiming = decide(f.clone());
            tokio::task::yield_now().await;
            let waiting = decide(f.clone());
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
            // Room for two replies: a second call would be the waiter's own claim.
            store.replies.add_permits(2);
            assert_eq!(claiming.await.unwrap(), Code::OverLimit);
            assert_eq!(waiting.await.unwrap(), Code::OverLimit);
            assert_eq!(
                store.calls.load(Ordering::Relaxed) - before,
                1,
                "one claim; the waiter was refused from the cache"
            );
        });
    }

    fn hot() -> HotKeyConfig {
        HotKeyConfig {
            shared_store: true,
            ..HotKeyConfig::default()
        }
    }

    #[test]
    fn a_lease_answers_from_memory_and_the_bucket_counts_every_leased_token() {
        let f = with_hot_keys(false, hot());
        let r = req("edge", &[&[("leased", "a")]]);
        for _ in 0..12 {
            assert_eq!(f.codes(&r), [Code::Ok]);
        }
        let text = f.metrics.render();
        // The first claim took 1 (no rate yet), the second 1 + a batch of 10; with 2 of those
        // left, a claim ahead took 8 more while the lease kept answering: 20 granted, ten
        // decisions answered from memory.
        assert!(
            text.contains(r#"tollgate_lease_claims_total{class="leased"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"tollgate_local_decisions_total{class="leased",reason="lease"} 10"#),
            "{text}"
        );
        assert!(
            text.contains(r#"tollgate_lease_tokens_total{class="leased",event="granted"} 20"#),
            "{text}"
        );
        // The shared bucket gave exactly the 20 tokens: the estimate is its 80 plus the 8 the
        // lease still holds, less this request's.
        let d = f.decide(&r);
        assert_eq!(d.statuses[0].remaining, 87);
        // Past the TTL the 7 unspent tokens go back to the bucket (the next housekeeping
        // pass), and are counted: the bucket holds 87 again, and the next claim sees it.
        f.clock.advance_ms(1_000);
        f.limiter.maintain();
        assert_eq!(block_on(f.limiter.return_ended_leases()), 7);
        let text = f.metrics.render();
        assert!(
            text.contains(r#"tollgate_lease_tokens_total{class="leased",event="returned"} 7"#),
            "{text}"
        );
        assert!(!text.contains(r#"event="expired""#), "{text}");
        assert_eq!(f.decide(&r).statuses[0].remaining, 86);
    }

    #[test]
    fn two_descriptors_on_one_lease_never_wait_for_each_other() {
        // The first op's claim is in flight when the second finds the lease short: the claim
        // must be sent before the second op waits for it (it used to wait for ever).
        let f = with_hot_keys(false, hot());
        let r = req("edge", &[&[("leased", "twice")], &[("leased", "twice")]]);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        for _ in 0..3 {
            let d = rt
                .block_on(async {
                    tokio::time::timeout(
                        std::time::Duration::from_secs(5),
                        f.limiter.decide(&f.rules, &r),
                    )
                    .await
                })
                .expect("decided without waiting for itself")
                .unwrap();
            assert_eq!(d.overall, Code::Ok);
        }
    }

    #[test]
    fn a_cached_refusal_under_one_limit_override_does_not_refuse_a_higher_one() {
        // The reference's issue #1077: its over-limit cache is keyed by the descriptor alone,
        // so a request arriving with a higher per-request `limit` than the one that filled
        // the cache was refused. Here the cache is keyed by the bucket and the limit's
        // numbers, so a higher override is decided by the store (the bucket, shared by
        // overrides of any size, keeps what was spent).
        use super::super::{LimitOverride, Request, RequestDescriptor};
        let f = with_hot_keys(false, hot());
        let with_limit = |requests_per_unit: u32| Request {
            domain: "edge",
            descriptors: vec![RequestDescriptor {
                entries: vec![("tenant", "plan-change")],
                hits_addend: None,
                limit_override: Some(LimitOverride {
                    requests_per_unit,
                    unit: crate::rules::model::Unit::Hour,
                }),
                refund: false,
            }],
            hits_addend: 0,
        };
        let (low, high) = (with_limit(1), with_limit(3));
        assert_eq!(f.codes(&low), [Code::Ok]);
        assert_eq!(f.codes(&low), [Code::OverLimit], "refused by the store");
        assert_eq!(f.codes(&low), [Code::OverLimit], "refused from the cache");
        assert!(f.metrics.render().contains(
            r#"tollgate_local_decisions_total{class="envoy_override",reason="over_limit_cache"} 1"#
        ));
        // The tenant's plan changed: the higher limit is not refused from the lower one's
        // cache entry, and keeps what was spent (one bucket per descriptor and window,
        // whatever the override's size): 2 more of 3, then refused.
        for _ in 0..2 {
            assert_eq!(f.codes(&high), [Code::Ok]);
        }
        assert_eq!(f.codes(&high), [Code::OverLimit]);
        // And the lower limit's entry still stands for requests that carry it.
        assert_eq!(f.codes(&low), [Code::OverLimit]);
    }

    #[test]
    fn a_refund_ends_a_cached_refusal_and_goes_past_the_lease_to_the_bucket() {
        let f = with_hot_keys(false, hot());
        let r = req("edge", &[&[("tenant", "back")]]);
        let mut back = r.clone();
        back.descriptors[0].refund = true;
        f.decide(&r);
        f.decide(&r);
        assert_eq!(f.codes(&r), [Code::OverLimit]);
        assert_eq!(f.codes(&r), [Code::OverLimit], "from the cache");
        let given = f.decide(&back).statuses[0].clone();
        assert_eq!((given.code, given.remaining), (Code::Ok, 1));
        // The cached refusal ended with the refund: the store is asked, and admits.
        assert_eq!(f.codes(&r), [Code::Ok]);
        assert_eq!(f.codes(&r), [Code::OverLimit]);
        let m = f.metrics.render();
        assert!(
            m.contains(
                r#"tollgate_local_decisions_total{class="tenant",reason="over_limit_cache"} 1"#
            ),
            "{m}"
        );

        // A leased key: the refund is neither spent from this replica's lease nor added to
        // it; the shared bucket gets the tokens, where they were taken from.
        let l = req("edge", &[&[("leased", "r")]]);
        for _ in 0..3 {
            assert_eq!(f.codes(&l), [Code::Ok]);
        }
        let mut check = l.clone();
        check.descriptors[0].hits_addend = Some(0);
        let in_bucket = f.decide(&check).statuses[0].remaining;
        let leased_before = f.metrics.render();
        let mut five = l.clone();
        five.descriptors[0].refund = true;
        five.descriptors[0].hits_addend = Some(5);
        let s = f.decide(&five).statuses[0].clone();
        assert_eq!((s.code, s.remaining), (Code::Ok, in_bucket + 5));
        let lease_lines = |text: &str| -> Vec<String> {
            text.lines()
                .filter(|l| l.contains("class=\"leased\"") && l.starts_with("tollgate_l"))
                .map(str::to_string)
                .collect()
        };
        assert_eq!(
            lease_lines(&f.metrics.render()),
            lease_lines(&leased_before),
            "the lease did not move"
        );

        // A `charge_parent` settlement on the leased key goes to the shared bucket too: its
        // charge is never spent from the lease (which cannot go into debt).
        let mut settle = req("edge", &[&[("leased", "r"), ("settle", "x")]]);
        settle.descriptors[0].hits_addend = Some(7);
        let s = f.decide(&settle).statuses[0].clone();
        assert_eq!((s.code, s.remaining), (Code::Ok, in_bucket + 5 - 7));
        assert_eq!(
            lease_lines(&f.metrics.render()),
            lease_lines(&leased_before),
            "the lease did not move"
        );
    }

    #[test]
    fn a_spent_key_is_refused_from_memory_with_the_wait_counting_down() {
        let f = with_hot_keys(false, hot());
        let r = req("edge", &[&[("tenant", "spent")]]);
        f.decide(&r);
        f.decide(&r);
        let first = f.decide(&r).statuses[0].clone();
        assert_eq!(
            (first.code, first.retry_ms),
            (Code::OverLimit, Some(1_800_000))
        );
        f.clock.advance_ms(600_000);
        let cached = f.decide(&r).statuses[0].clone();
        assert_eq!(
            (cached.code, cached.retry_ms),
            (Code::OverLimit, Some(1_200_000))
        );
        assert!(f.metrics.render().contains(
            r#"tollgate_local_decisions_total{class="tenant",reason="over_limit_cache"} 1"#
        ));
        // Decisions are still counted as over_limit.
        assert!(f.metrics.render().contains(
            r#"tollgate_decisions_total{domain="edge",class="tenant",outcome="over_limit"} 2"#
        ));
        // At the wait's end the store is asked again and admits.
        f.clock.advance_ms(1_200_000);
        assert_eq!(f.codes(&r), [Code::Ok]);
    }

    #[test]
    fn a_sharded_limit_admits_its_limit_and_no_more() {
        for retry in [true, false] {
            let f = with_hot_keys(
                false,
                HotKeyConfig {
                    shard_retry: retry,
                    ..HotKeyConfig::default()
                },
            );
            let r = req("edge", &[&[("sharded", "s")]]);
            let admitted = (0..200).filter(|_| f.codes(&r) == [Code::Ok]).count();
            assert_eq!(admitted, 8, "retry {retry}");
            let text = f.metrics.render();
            assert_eq!(
                text.contains(r#"tollgate_shard_retries_total{class="sharded"}"#),
                retry,
                "{text}"
            );
        }
    }

    /// Leasing over random interleavings: three replicas on one store, each request a random
    /// cost on a leased limit (10 per second, leases of at most 5, 1 s TTL), far more demand
    /// than the limit, with time passing (refills, leases expire), housekeeping, and replicas
    /// stopped gracefully (leases given back) or killed (leases lost) and replaced. Over the
    /// whole run, no more than the bucket gave: 10 + what refilled. Over every span, at most
    /// the bound of docs/hot-keys.md: capacity + refill × span + replicas × (max_batch + cost). And
    /// from below: a request the store refused (not one the over-limit cache refused from
    /// memory) was refused because the shared bucket could not pay its cost. Tokens held in
    /// other replicas' leases may be why, but never tokens the bucket still has: a limiter
    /// that refuses too much fails here.
    mod leasing_property {
        use std::sync::Arc;

        use proptest::prelude::*;

        use super::super::super::fixture::rules;
        use super::super::super::{Code, Limiter, LimiterConfig, Request, RequestDescriptor};
        use super::super::HotKeyConfig;
        use super::hot;
        use crate::clock::Clock;
        use crate::store::{MemoryStore, Store};
        use crate::telemetry::Metrics;

        const CAPACITY: u64 = 10;
        const PER_MS: f64 = 10.0 / 1_000.0;
        const MAX_BATCH: u64 = 5;
        const MAX_COST: u64 = 3;
        const REPLICAS: usize = 3;

        #[derive(Clone, Debug)]
        enum Step {
            Request { replica: usize, cost: u64 },
            Advance(u64),
            Maintain(usize),
            Stop { replica: usize, graceful: bool },
        }

        fn step() -> impl Strategy<Value = Step> {
            prop_oneof![
                8 => (0..REPLICAS, 1..=MAX_COST).prop_map(|(replica, cost)| Step::Request { replica, cost }),
                2 => (1..400u64).prop_map(Step::Advance),
                1 => (0..REPLICAS).prop_map(Step::Maintain),
                1 => (0..REPLICAS, any::<bool>()).prop_map(|(replica, graceful)| Step::Stop { replica, graceful }),
            ]
        }

        /// A replica, and its metrics (to tell a refusal from the over-limit cache).
        fn new_replica(store: &Arc<Store>, clock: &Clock) -> (Limiter, Arc<Metrics>) {
            let config = LimiterConfig {
                key_prefix: "t:".into(),
                hot: hot(),
                ..LimiterConfig::new(clock.clone())
            };
            let metrics = Arc::new(Metrics::new());
            (
                Limiter::on_shared_store(store.clone(), config, metrics.clone()),
                metrics,
            )
        }

        /// Refusals a replica made from its over-limit cache so far.
        fn cached_refusals(metrics: &Metrics) -> u64 {
            metrics
                .render()
                .lines()
                .find(|l| {
                    l.starts_with("tollgate_local_decisions_total{")
                        && l.contains("reason=\"over_limit_cache\"")
                })
                .and_then(|l| l.rsplit(' ').next()?.parse().ok())
                .unwrap_or(0)
        }

        /// Whole tokens in the shared bucket now, read by a limiter with no lease and no
        /// cache (a check: it takes nothing).
        async fn balance(probe: &Limiter, rules: &crate::rules::RuleSet) -> u64 {
            let req = Request {
                domain: "edge",
                descriptors: vec![RequestDescriptor {
                    entries: vec![("leased_fast", "k")],
                    hits_addend: Some(0),
                    limit_override: None,
                    refund: false,
                }],
                hits_addend: 0,
            };
            u64::from(probe.decide(rules, &req).await.unwrap().statuses[0].remaining)
        }

        proptest! {
            #![proptest_config(crate::testing::proptest_config(64))]

            #[test]
            fn leased_admissions_stay_within_the_bound(steps in prop::collection::vec(step(), 1..300)) {
                let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
                let rules = rules();
                let clock = Clock::manual(1_700_000_000_000);
                let store = Arc::new(Store::Memory(MemoryStore::new(clock.clone())));
                let mut replicas: Vec<(Limiter, Arc<Metrics>)> = (0..REPLICAS).map(|_| new_replica(&store, &clock)).collect();
                let probe = Limiter::on_shared_store(
                    store.clone(),
                    LimiterConfig {
                        key_prefix: "t:".into(),
                        hot: HotKeyConfig::default(),
                        ..LimiterConfig::new(clock.clone())
                    },
                    Arc::new(Metrics::new()),
                );
                let start = clock.mono_ms();

                // (time, cost) of every admitted request.
                let mut admitted: Vec<(u64, u64)> = Vec::new();
                rt.block_on(async {
                    for step in &steps {
                        match *step {
                            Step::Request { replica, cost } => {
                                let req = Request {
                                    domain: "edge",
                                    descriptors: vec![RequestDescriptor {
                                        entries: vec![("leased_fast", "k")],
                                        hits_addend: Some(cost),
                                        limit_override: None,
                                        refund: false,
                                    }],
                                    hits_addend: 0,
                                };
                                let (limiter, metrics) = &replicas[replica];
                                let cached_before = cached_refusals(metrics);
                                let d = limiter.decide(&rules, &req).await.unwrap();
                                if d.statuses[0].code == Code::Ok {
                                    admitted.push((clock.mono_ms(), cost));
                                } else if cached_refusals(metrics) == cached_before {
                                    // The clock stands still and nothing is given back
                                    // between the refusal and this look (claims sent ahead
                                    // only take more), so the bucket is as the store saw it
                                    // or emptier.
                                    let left = balance(&probe, &rules).await;
                                    if left >= cost {
                                        return Err(format!("replica {replica} refused a cost of {cost} with {left} tokens in the bucket"));
                                    }
                                }
                            }
                            Step::Advance(ms) => clock.advance_ms(ms),
                            Step::Maintain(replica) => {
                                replicas[replica].0.maintain();
                                replicas[replica].0.return_ended_leases().await;
                            }
                            Step::Stop { replica, graceful } => {
                                if graceful {
                                    replicas[replica].0.return_leases().await;
                                }
                                replicas[replica] = new_replica(&store, &clock);
                            }
                        }
                        // Let claims sent ahead in the background land.
                        tokio::task::yield_now().await;
                    }
                    Ok(())
                }).map_err(TestCaseError::fail)?;
                let end = clock.mono_ms();
                let total: u64 = admitted.iter().map(|&(_, c)| c).sum();
                let refilled = (end - start) as f64 * PER_MS;
                prop_assert!(
                    total as f64 <= CAPACITY as f64 + refilled + 1e-9,
                    "admitted {} > {} + {:.3} over the run", total, CAPACITY, refilled
                );
                // Every span [t_i, t_j] of admissions.
                for (i, &(from, _)) in admitted.iter().enumerate() {
                    let mut sum = 0;
                    for &(to, cost) in &admitted[i..] {
                        sum += cost;
                        let bound = CAPACITY as f64
                            + (to - from) as f64 * PER_MS
                            + (REPLICAS as u64 * (MAX_BATCH + MAX_COST)) as f64;
                        prop_assert!(sum as f64 <= bound, "{} admitted in [{}, {}] > {:.1}", sum, from, to, bound);
                    }
                }
            }
        }
    }
}
