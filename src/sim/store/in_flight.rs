//! What a call asks of a simulated node and what it answers ([`Work`], [`Reply`]), and the
//! calls on their way ([`InFlight`]): to a node, in its queue, and their replies on the way
//! back, kept as one list of events in virtual time ([`Events`]) that one task of the store
//! works through (`node.rs`: `SimStore::send`, `deliver`).
//!
//! Why a list and not a task per call: behind an overloaded node, hundreds of thousands of
//! calls are on their way at once (a call runs on its node whether or not its caller still
//! waits). As tasks, each cost its task, its future and up to three sleeps on the clock; as an
//! event it costs one entry of the list. The order is the one those sleeps had: by the virtual
//! µs an event happens at, then by when it was scheduled.
//!
//! Flow: a replica's client sends a call (`SimStore::send`) → `Arrive`, half a round trip
//! later: the call queues behind what reached the node before it → `Run` at its turn: the ops
//! run on the node's buckets and the scripts are counted (a call that finds the node idle runs
//! as it arrives, its few µs of run time going into the reply's wait: one event less for most
//! of a large fleet's calls) → `Reply` half a round trip after: the replica's breakers hear the
//! node, and the caller gets the reply if it still waits.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::lock;
use crate::quota::{Op, Outcome};
use crate::store::StoreError;
use crate::store::breaker::Breakers;

/// Where a call's reply goes: the caller, if it still waits.
pub(super) type ReplyTx = tokio::sync::oneshot::Sender<Result<Reply, StoreError>>;

/// One call on its way, at one of its stages.
pub(super) struct InFlight {
    pub(super) node: usize,
    pub(super) replica: u32,
    pub(super) scripts: u64,
    /// Half the call's round trip (µs): to the node, and back.
    pub(super) half_us: f64,
    /// When this stage happens, exactly (the list is keyed by it rounded up to a µs).
    pub(super) at_us: f64,
    pub(super) stage: Stage,
    /// The sending replica's breakers, which hear the reply.
    pub(super) breakers: Arc<Breakers>,
    pub(super) reply_to: ReplyTx,
}

pub(super) enum Stage {
    /// Reaches the node.
    Arrive(Work),
    /// The node gets to it.
    Run(Work),
    /// Its reply reaches the replica.
    Reply(Result<Reply, StoreError>),
}

/// The list of calls on their way, and its task's state.
#[derive(Default)]
pub(super) struct Events {
    /// By (virtual µs, order scheduled).
    list: Mutex<BTreeMap<(u64, u64), InFlight>>,
    scheduled: AtomicU64,
    /// Wakes the task when an event comes due sooner than the one it sleeps for.
    pub(super) sooner: Notify,
    pub(super) started: AtomicBool,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("in_flight", &lock(&self.list).len())
            .finish()
    }
}

impl Events {
    /// Puts `call` on the list; `wake`: the task is asleep (not the one scheduling).
    pub(super) fn schedule(&self, call: InFlight, wake: bool) {
        let at = call.at_us.max(0.0).ceil() as u64;
        let order = self.scheduled.fetch_add(1, Ordering::Relaxed);
        let first = {
            let mut list = lock(&self.list);
            list.insert((at, order), call);
            list.first_key_value().map(|(k, _)| *k) == Some((at, order))
        };
        if wake && first {
            self.sooner.notify_one();
        }
    }

    /// The first event due at `now_us` or before, taken off the list.
    pub(super) fn due(&self, now_us: u64) -> Option<InFlight> {
        let mut list = lock(&self.list);
        let entry = list.first_entry()?;
        (entry.key().0 <= now_us).then(|| entry.remove())
    }

    pub(super) fn next_us(&self) -> Option<u64> {
        lock(&self.list).first_key_value().map(|(k, _)| k.0)
    }
}

/// What a call asks of its node.
pub(super) enum Work {
    Ops(Vec<Op>),
    Heartbeat {
        key: String,
        replica: String,
        ttl_ms: u64,
    },
    Leave {
        key: String,
        replica: String,
    },
}

pub(super) enum Reply {
    Ops(Vec<Outcome>),
    Live(u64),
}
