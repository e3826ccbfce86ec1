//! Decisions batched per node (a standalone Redis, Sentinel's primary, each primary of a
//! cluster). While a replica has `store_batch_in_flight` calls in flight to a node, the
//! decisions that arrive for it wait, and go together as one script call (`batch_script.rs`)
//! when a call returns. There is no timer: a
//! batch forms only while the node is busy, so a quiet replica keeps one round trip per
//! decision and adds no wait, and a busy one pays Redis's per-call work (the command, the
//! script's setup, `TIME`, the reply) once for up to `store_batch_max_ops` ops.
//!
//! Flow: [`RedisStore::apply_on`] asks the node's [`Batching`] ([`Batchings::of`]) for a turn
//! ([`Batching::enter`]) → a free slot: the
//! request's ops go now, as its own call, holding the slot ([`Slot`]) → else they queue
//! ([`Waiter`]) and the caller waits for its answer. When a slot's call returns (or its caller
//! gives up), the slot passes to the queue ([`Batching::next_batch`]): the oldest waiters, up to
//! the most ops a batch carries, go as one call in a task of its own, which holds the slot, so
//! no caller's cancellation (Envoy's timeout) takes the others' answers with it. A waiter whose
//! caller gave up before its batch went is dropped unsent: its decision is gone, so nothing of
//! it is spent.
//!
//! Each op keeps its own answer (`lua/batch.lua` answers per op), and a batch gives up by the
//! same rule as a call, counting the node's silence and the hard limit from when its oldest
//! waiter queued ([`crate::store::breaker::Breakers::wait_since`]): a batch that gave up is an
//! unknown outcome for each of its ops, as a call that gave up is.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::RedisStore;
use super::scripts::OpResults;
use crate::quota::Op;
use crate::store::{StoreError, StoreErrorKind};

/// Every node's batching state, for one replica: one for a standalone Redis, one per primary a
/// cluster's slot map has named (a handful; a node that left keeps its idle entry).
#[derive(Debug)]
pub(super) struct Batchings {
    in_flight: usize,
    max_ops: usize,
    nodes: std::sync::RwLock<Vec<Arc<Batching>>>,
}

impl Batchings {
    pub(super) fn new(in_flight: usize, max_ops: usize) -> Self {
        Batchings {
            in_flight,
            max_ops,
            nodes: Default::default(),
        }
    }

    /// Whether ops are batched at all (`store_batch_max_ops` above 1).
    pub(super) fn enabled(&self) -> bool {
        self.max_ops > 1
    }

    /// `node`'s batching state, made on first use.
    pub(super) fn of(&self, node: &Arc<str>) -> Arc<Batching> {
        let found = |nodes: &[Arc<Batching>]| nodes.iter().find(|b| *b.node == **node).cloned();
        if let Some(b) = found(&self.nodes.read().unwrap_or_else(|p| p.into_inner())) {
            return b;
        }
        let mut nodes = self.nodes.write().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = found(&nodes) {
            return b;
        }
        let b = Arc::new(Batching::new(node.clone(), self.in_flight, self.max_ops));
        nodes.push(b.clone());
        b
    }
}

/// The batching state of one node, for one replica.
#[derive(Debug)]
pub(super) struct Batching {
    /// The node's name (`store`, or a cluster primary's `host:port`).
    node: Arc<str>,
    /// Calls in flight before new ones queue (`store_batch_in_flight`).
    in_flight: usize,
    /// The most ops one batch carries (`store_batch_max_ops`); 1 turns batching off.
    max_ops: usize,
    queue: Mutex<Queue>,
}

#[derive(Debug, Default)]
struct Queue {
    /// Slots held: calls in flight, and batch tasks about to send.
    busy: usize,
    waiting: VecDeque<Waiter>,
}

/// A request's ops waiting for a batch.
#[derive(Debug)]
pub(super) struct Waiter {
    ops: Vec<Op>,
    /// When it queued (µs on the breakers' clock).
    since_us: u64,
    answer: oneshot::Sender<OpResults>,
}

/// What [`Batching::enter`] gives a request: a slot to call now, or a place in the queue.
pub(super) enum Turn {
    Now,
    Queued(oneshot::Receiver<OpResults>),
}

impl Batching {
    pub(super) fn new(node: Arc<str>, in_flight: usize, max_ops: usize) -> Self {
        Batching {
            node,
            in_flight: in_flight.max(1),
            max_ops: max_ops.max(1),
            queue: Mutex::new(Queue::default()),
        }
    }

    /// A slot to call now when fewer than `in_flight` are held, else a place in the queue.
    pub(super) fn enter(&self, ops: &[Op], now_us: u64) -> Turn {
        let mut q = lock(&self.queue);
        if q.busy < self.in_flight {
            q.busy += 1;
            return Turn::Now;
        }
        let (answer, wait) = oneshot::channel();
        q.waiting.push_back(Waiter {
            ops: ops.to_vec(),
            since_us: now_us,
            answer,
        });
        Turn::Queued(wait)
    }

    /// A slot's call is done: the next batch for it (the oldest waiters whose caller still
    /// waits, up to `max_ops` ops, at least one waiter), or `None` and the slot is freed.
    pub(super) fn next_batch(&self) -> Option<Vec<Waiter>> {
        let mut q = lock(&self.queue);
        let mut batch: Vec<Waiter> = Vec::new();
        let mut ops = 0;
        while let Some(first) = q.waiting.front() {
            if first.answer.is_closed() {
                // Its caller gave up (Envoy's timeout): nothing to send for it.
                q.waiting.pop_front();
                continue;
            }
            if !batch.is_empty() && ops + first.ops.len() > self.max_ops {
                break;
            }
            ops += first.ops.len();
            batch.extend(q.waiting.pop_front());
        }
        if batch.is_empty() {
            q.busy = q.busy.saturating_sub(1);
            None
        } else {
            Some(batch)
        }
    }

    /// Decisions waiting for a batch now.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        lock(&self.queue).waiting.len()
    }
}

/// A held call slot of one node: dropped when its call is done, or when its caller gives up
/// mid-call, it passes to the node's queue ([`RedisStore::hand_over`]).
pub(super) struct Slot {
    pub(super) store: Arc<RedisStore>,
    pub(super) batching: Arc<Batching>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.store.hand_over(&self.batching);
    }
}

impl RedisStore {
    /// The slot of a call to `batching`'s node is free: the next batch goes out on it, in a task
    /// of its own (holding the slot until it is done), or the slot is released.
    pub(super) fn hand_over(self: &Arc<Self>, batching: &Arc<Batching>) {
        let Some(batch) = batching.next_batch() else {
            return;
        };
        let slot = Slot {
            store: self.clone(),
            batching: batching.clone(),
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(run_batch(slot, batch));
            }
            // No runtime (a shutdown dropping the last caller): the waiters' answers are
            // dropped with them, and each hears that its call ended unanswered.
            Err(_) => drop(batch),
        }
    }
}

/// One batch on its slot: every waiter's ops as one call, each waiter answered with its own.
async fn run_batch(slot: Slot, batch: Vec<Waiter>) {
    let since = batch.iter().map(|w| w.since_us).min().unwrap_or(0);
    let results = {
        let ops: Vec<&Op> = batch.iter().flat_map(|w| w.ops.iter()).collect();
        slot.store.metrics.batch_ops.observe(ops.len() as f64);
        slot.store.apply_now(&slot.batching.node, &ops, since).await
    };
    let mut results = results.into_iter();
    for waiter in batch {
        let mine: OpResults = results.by_ref().take(waiter.ops.len()).collect();
        // A caller that gave up meanwhile no longer listens.
        let _ = waiter.answer.send(mine);
    }
    drop(slot);
}

/// The answer of a waiter whose batch ended without one (its task was dropped): it may have
/// been sent, so its outcome is unknown, as a call's that gave up.
pub(super) fn unanswered(ops: usize) -> OpResults {
    let e = StoreError::new(
        StoreErrorKind::Timeout,
        "the batched store call ended without an answer",
    );
    vec![Err(e); ops]
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding this lock leaves a consistent queue (every change is one step).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::OpKind;

    fn op(key: &str) -> Op {
        Op::take(
            key.into(),
            OpKind::TokenBucket {
                capacity: 1,
                refill: 1,
                window_ms: 1_000,
            },
            1,
        )
    }

    #[test]
    fn calls_go_at_once_until_the_slots_are_held_then_queue_and_leave_in_batches() {
        let b = Batching::new("store".into(), 2, 3);
        assert!(matches!(b.enter(&[op("a")], 0), Turn::Now));
        assert!(matches!(b.enter(&[op("b")], 0), Turn::Now));
        let mut waits = Vec::new();
        for (i, n) in [1, 2, 1, 1].into_iter().enumerate() {
            let ops: Vec<Op> = (0..n).map(|j| op(&format!("q{i}.{j}"))).collect();
            match b.enter(&ops, i as u64) {
                Turn::Queued(rx) => waits.push(rx),
                Turn::Now => panic!("both slots are held"),
            }
        }
        assert_eq!(b.waiting(), 4);
        // The third waiter's caller gave up: dropped unsent.
        drop(waits.remove(2));
        // Up to 3 ops: the first two waiters (1 + 2).
        let batch = b.next_batch().unwrap();
        assert_eq!(
            batch.iter().map(|w| w.ops.len()).collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!(batch[0].since_us, 0);
        // The given-up one is skipped; the last goes alone.
        let batch = b.next_batch().unwrap();
        assert_eq!(batch.len(), 1);
        assert_eq!(batch[0].ops[0].key, "q3.0");
        // Nothing left: each slot is released in turn, then one is free again.
        assert!(b.next_batch().is_none());
        assert!(b.next_batch().is_none());
        assert!(matches!(b.enter(&[op("c")], 9), Turn::Now));
        assert!(matches!(b.enter(&[op("d")], 9), Turn::Now));
        assert!(matches!(b.enter(&[op("e")], 9), Turn::Queued(_)));
    }

    #[test]
    fn a_waiter_larger_than_a_batch_still_goes() {
        let b = Batching::new("store".into(), 1, 2);
        assert!(matches!(b.enter(&[op("a")], 0), Turn::Now));
        let ops: Vec<Op> = (0..5).map(|j| op(&format!("big{j}"))).collect();
        let _rx = match b.enter(&ops, 1) {
            Turn::Queued(rx) => rx,
            Turn::Now => panic!("the slot is held"),
        };
        let batch = b.next_batch().unwrap();
        assert_eq!(batch[0].ops.len(), 5);
    }
}
