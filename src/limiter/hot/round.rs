//! One store call for a request's ops ([`HotKeys::round`]): what needs the store goes in one
//! [`Store::apply_each`], and the answers settle lease claims and fill the over-limit cache.
//! A claim sent ahead (a lease running low) goes in a task of its own on Redis, so the
//! request is answered without waiting for it.

use std::sync::Arc;

use super::{HotKeys, State, Work, count_tokens};
use crate::quota::lease::{Claim, LeasePolicy};
use crate::quota::{Action, Op, Outcome};
use crate::store::Store;

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
        let sent: &[Op] = if as_planned { planned_ops } else { &ops };
        if sent.is_empty() {
            return;
        }
        let results = store.apply_each(sent).await;
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
                cache.record(&op.key, op.kind, cost, o, now);
            }
            w.state = State::Done(outcome);
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

/// The store op of a claim: the op's bucket, the claim's ask.
fn claim_op(mut op: Op, claim: &Claim) -> Op {
    op.action = Action::Claim(claim.ask);
    op.cost = claim.ask.need;
    op
}
