//! One store call for a request's ops ([`HotKeys::round`]): what needs the store goes in one
//! [`Store::apply_each`], and the answers settle lease claims and fill the over-limit cache.
//! A claim sent ahead (a lease running low) goes in a task of its own on Redis, so the
//! request is answered without waiting for it; a round that claims runs its store call in a
//! task too, which the request waits for, so a cancelled request's claim still settles into the
//! lease ([`HotKeys::call_detached`]).

use std::sync::Arc;

use super::{HotKeys, State, Work, count_tokens};
use crate::quota::lease::{Claim, LeasePolicy};
use crate::quota::{Action, Op, Outcome};
use crate::store::{Store, StoreError, StoreErrorKind};

impl HotKeys {
    /// One store call for every op and claim that needs the store; their answers settle the
    /// claims and fill the over-limit cache. When every op goes as planned (nothing leased,
    /// cached or moved to another shard), the plan's ops are sent as they are, uncopied.
    pub(super) async fn round(
        &self,
        store: &Arc<Store>,
        planned_ops: &[Op],
        work: &mut [Work<'_>],
    ) {
        let as_planned = work.len() == planned_ops.len()
            && work.iter().all(|w| matches!(w.state, State::Planned));
        // Sized once (a first push would reserve four): both live as long as the store call.
        let mut pending: Vec<(usize, Pending)> = Vec::with_capacity(work.len());
        let mut ops: Vec<Op> = Vec::with_capacity(if as_planned { 0 } else { work.len() });
        if as_planned {
            pending.extend((0..work.len()).map(|i| (i, Pending::Op)));
        } else {
            for (i, w) in work.iter_mut().enumerate() {
                match std::mem::replace(&mut w.state, State::Taken) {
                    State::Planned => {
                        ops.push(w.planned_op.clone());
                        pending.push((i, Pending::Op));
                    }
                    State::Send(op) => {
                        ops.push(op);
                        pending.push((i, Pending::Op));
                    }
                    State::Claim(op, claim, policy) => {
                        ops.push(claim_op(op, &claim));
                        pending.push((i, Pending::Claim(claim, policy)));
                    }
                    // The memory store answers at once (no I/O): inline. Redis: in the
                    // background, so the request is answered without waiting for it.
                    State::Ahead(outcome, op, claim, policy) => {
                        if matches!(**store, Store::Memory(_)) {
                            ops.push(claim_op(op, &claim));
                            pending.push((i, Pending::Ahead(outcome, claim, policy)));
                        } else {
                            let class = w.planned.limit.class.clone();
                            self.spawn_ahead(
                                store.clone(),
                                claim_op(op, &claim),
                                claim,
                                policy,
                                class,
                            );
                            w.state = State::Done(Ok(outcome));
                        }
                    }
                    other => w.state = other,
                }
            }
        }
        if !as_planned && claims(store, &pending) {
            let claims = take_claims(work, &mut pending);
            let outcomes = self.call_detached(store.clone(), ops, claims).await;
            for ((i, _), outcome) in pending.into_iter().zip(outcomes) {
                work[i].state = State::Done(outcome);
            }
            return;
        }
        let sent: &[Op] = if as_planned { planned_ops } else { &ops };
        if sent.is_empty() {
            return;
        }
        let results = store.apply_each(sent).await;
        self.settle(work, pending, sent, results);
    }

    /// The store's answers of a round: they settle its claims, fill the over-limit cache and
    /// become the ops' outcomes.
    fn settle(
        &self,
        work: &mut [Work<'_>],
        pending: Vec<(usize, Pending)>,
        sent: &[Op],
        results: Vec<Result<Outcome, StoreError>>,
    ) {
        let now = self.clock.mono_ms();
        for (((i, pending), op), result) in pending.into_iter().zip(sent).zip(results) {
            let w = &mut work[i];
            let class = &w.planned.limit.class;
            // A refused claim is cached for its request's whole cost: a smaller request may
            // still be covered by what the lease holds.
            let cost = match &pending {
                Pending::Claim(claim, _) => claim.cost(),
                _ => op.cost,
            };
            let outcome = match (pending, result, &self.leases) {
                (Pending::Claim(claim, policy), Ok(answer), Some(leases)) => {
                    let (o, events) = leases.settle(claim, op, &answer, policy, now);
                    self.count_tokens(class, events);
                    Ok(o)
                }
                // The request was answered from the lease; the claim only refills it (and a
                // refused one must not enter the over-limit cache: the lease may still hold
                // tokens).
                (Pending::Ahead(outcome, claim, policy), result, leases) => {
                    if let (Ok(answer), Some(leases)) = (result, leases) {
                        let (_, events) = leases.settle(claim, op, &answer, policy, now);
                        self.count_tokens(class, events);
                    }
                    w.state = State::Done(Ok(outcome));
                    continue;
                }
                // A failed claim's reserved tokens go back to the lease as the claim drops.
                (_, result, _) => result,
            };
            if let (Some(cache), Ok(o)) = (&self.cache, &outcome) {
                cache.settle(op, cost, o, now);
            }
            w.state = State::Done(outcome);
        }
    }

    /// The store call of a round that claims, in a task of its own that also settles its
    /// answers (`claims`: per op, its claim if it is one): the claims into the lease, the
    /// refusals into the over-limit cache, in that order, as [`HotKeys::settle`] does. The
    /// request waits for the task's outcomes, one per op; if the request is cancelled meanwhile
    /// (Envoy's `timeout` passed: it resets the call and tonic drops the decision), the task
    /// still settles, so what the store granted joins the lease. Left to the request, a batch
    /// would be spent in the shared bucket and lost, and behind an overloaded store every
    /// replica would claim again, and lose it again.
    async fn call_detached(
        &self,
        store: Arc<Store>,
        ops: Vec<Op>,
        claims: Vec<Option<(Claim, LeasePolicy, Arc<str>)>>,
    ) -> Vec<Result<Outcome, StoreError>> {
        let n = ops.len();
        let (leases, cache) = (self.leases.clone(), self.cache.clone());
        let (metrics, clock) = (self.metrics.clone(), self.clock.clone());
        let task = tokio::spawn(async move {
            let results = store.apply_each(&ops).await;
            let now = clock.mono_ms();
            let mut outcomes = Vec::with_capacity(ops.len());
            for ((result, claim), op) in results.into_iter().zip(claims).zip(&ops) {
                let (outcome, cost) = match (claim, result, &leases) {
                    (Some((claim, policy, class)), Ok(answer), Some(leases)) => {
                        let cost = claim.cost();
                        let (o, events) = leases.settle(claim, op, &answer, policy, now);
                        count_tokens(&metrics, &class, events);
                        (Ok(o), cost)
                    }
                    // A failed claim's reserved tokens go back to the lease as it drops.
                    (Some((claim, ..)), result, _) => (result, claim.cost()),
                    (None, result, _) => (result, op.cost),
                };
                if let (Some(cache), Ok(o)) = (&cache, &outcome) {
                    cache.settle(op, cost, o, now);
                }
                outcomes.push(outcome);
            }
            outcomes
        });
        match task.await {
            Ok(outcomes) => outcomes,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down.
            Err(_) => (0..n)
                .map(|_| {
                    Err(StoreError::new(
                        StoreErrorKind::Unavailable,
                        "the store call was cancelled (shutting down)",
                    ))
                })
                .collect(),
        }
    }

    /// Sends a claim ahead in a task of its own: the request that triggered it has its
    /// answer already. Its result refills the lease; a failure (or a runtime shutting down)
    /// drops the claim, which wakes the key's waiters.
    fn spawn_ahead(
        &self,
        store: Arc<Store>,
        op: Op,
        claim: Claim,
        policy: LeasePolicy,
        class: Arc<str>,
    ) {
        let Some(leases) = self.leases.clone() else {
            return;
        };
        let (metrics, clock) = (self.metrics.clone(), self.clock.clone());
        self.clock.spawn(async move {
            let answer = store.apply_each(std::slice::from_ref(&op)).await.pop();
            if let Some(Ok(answer)) = answer {
                let (_, events) = leases.settle(claim, &op, &answer, policy, clock.mono_ms());
                count_tokens(&metrics, &class, events);
            }
        });
    }
}

/// What [`HotKeys::round`] does with the answer of each op it sent.
enum Pending {
    Op,
    Claim(Claim, LeasePolicy),
    Ahead(Outcome, Claim, LeasePolicy),
}

/// Whether a round's store call must outlive its request: it carries a claim, on a store with
/// I/O (the memory store answers at once). Even a claim of only the request's cost: settling
/// it starts the key's rate measurement (what sizes the next batch) and wakes the key's
/// waiters; lost with every cancelled request, a key behind a slow store would start over
/// each time and never be leased (`tollgate simulate`'s fleet-500 cold start took 8 s to
/// recover with only batch claims kept, 3 s with every claim). Leasing is off by default, so
/// the task costs nothing unless a limit is leased.
fn claims(store: &Store, pending: &[(usize, Pending)]) -> bool {
    !matches!(store, Store::Memory(_))
        && pending.iter().any(|(_, p)| matches!(p, Pending::Claim(..)))
}

/// The round's claims, taken out of `pending` (each left as [`Pending::Op`]) for the store
/// call's task to settle: per op, its claim, policy and limit class.
fn take_claims(
    work: &[Work<'_>],
    pending: &mut [(usize, Pending)],
) -> Vec<Option<(Claim, LeasePolicy, Arc<str>)>> {
    pending
        .iter_mut()
        .map(|(i, p)| match std::mem::replace(p, Pending::Op) {
            Pending::Claim(claim, policy) => {
                Some((claim, policy, work[*i].planned.limit.class.clone()))
            }
            other => {
                *p = other;
                None
            }
        })
        .collect()
}

/// The store op of a claim: the op's bucket, the claim's ask.
fn claim_op(mut op: Op, claim: &Claim) -> Op {
    op.action = Action::Claim(claim.ask);
    op.cost = claim.ask.need;
    op
}
