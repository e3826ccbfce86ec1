//! Calls on their way through the simulated store ([`InFlight`]): to a node, in its queue,
//! and their replies on the way back, kept as one list of events in virtual time and worked
//! through by one task ([`deliver`]).
//!
//! Why a list and not a task per call: behind an overloaded node, hundreds of thousands of
//! calls are on their way at once (a call runs on its node whether or not its caller still
//! waits). As tasks, each cost its task, its future and up to three sleeps on the clock; as an
//! event it costs one entry of the list. The order is the one those sleeps had: by the virtual
//! µs an event happens at, then by when it was scheduled.
//!
//! Flow: a replica's client sends a call ([`SimStore::send`]) → `Arrive`, half a round trip
//! later: the call queues behind what reached the node before it → `Run` at its turn: the ops
//! run on the node's buckets and the scripts are counted (a call that finds the node idle runs
//! as it arrives, its few µs of run time going into the reply's wait: one event less for most
//! of a large fleet's calls) → `Reply` half a round trip after: the replica's breakers hear the
//! node, and the caller gets the reply if it still waits.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::SimStore;
use super::lock;
use super::node::{Reply, Work};
use crate::sim::scenario::FaultKind;
use crate::store::breaker::Breakers;
use crate::store::{StoreError, StoreErrorKind};

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
    sooner: Notify,
    started: AtomicBool,
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
    fn schedule(&self, call: InFlight, wake: bool) {
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
    fn due(&self, now_us: u64) -> Option<InFlight> {
        let mut list = lock(&self.list);
        let entry = list.first_entry()?;
        (entry.key().0 <= now_us).then(|| entry.remove())
    }

    fn next_us(&self) -> Option<u64> {
        lock(&self.list).first_key_value().map(|(k, _)| k.0)
    }
}

impl SimStore {
    /// Sends `call` (at its `Arrive` stage) on its way; the store's one task carries it from
    /// here, whether or not its caller still waits.
    pub(super) fn send(self: &Arc<Self>, call: InFlight) {
        self.events.schedule(call, true);
        if !self.events.started.swap(true, Ordering::Relaxed) {
            self.clock.spawn(deliver(self.clone()));
        }
    }

    /// Moves `call` past its stage at `now_us` (see the module doc).
    fn step(&self, mut call: InFlight, now_us: u64) {
        match std::mem::replace(&mut call.stage, Stage::Reply(Ok(Reply::Live(0)))) {
            Stage::Arrive(work) => {
                // Queued at the moment it reached the node.
                let done_at = self.enqueue(call.node, call.at_us, call.scripts);
                if done_at - call.at_us > self.script_us * call.scripts as f64 + 1.0 {
                    call.at_us = done_at;
                    call.stage = Stage::Run(work);
                    self.events.schedule(call, false);
                } else {
                    self.run_call(call, work, now_us, done_at);
                }
            }
            Stage::Run(work) => {
                let done_at = call.at_us;
                self.run_call(call, work, now_us, done_at);
            }
            Stage::Reply(result) => {
                call.breakers.replied(&self.names[call.node]);
                self.activity.fetch_add(1, Ordering::Relaxed);
                let _ = call.reply_to.send(result);
            }
        }
    }

    /// Runs `call`'s `work` on its node now (`done_at`: when the node is done with it), and
    /// schedules its reply.
    fn run_call(&self, mut call: InFlight, work: Work, now_us: u64, done_at: f64) {
        self.count_scripts(call.node, now_us, call.scripts);
        let result = match self.fault(call.node, call.replica, now_us) {
            Some(FaultKind::Oom) => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "OOM command not allowed when used memory > 'maxmemory' (simulated)",
            )),
            _ => Ok(self.run(call.node, work)),
        };
        self.activity.fetch_add(1, Ordering::Relaxed);
        call.at_us = done_at.max(now_us as f64) + call.half_us;
        call.stage = Stage::Reply(result);
        self.events.schedule(call, false);
    }
}

/// The store's one task: works through the events due, then sleeps until the next (or until
/// one is scheduled sooner). It lives as long as the runtime it runs on.
async fn deliver(s: Arc<SimStore>) {
    loop {
        let now = s.clock.mono_us();
        while let Some(call) = s.events.due(now) {
            s.step(call, now);
        }
        // Made before the list is read: an event scheduled from here on wakes it.
        let sooner = s.events.sooner.notified();
        match s.events.next_us() {
            Some(at) => {
                let sleep = s.clock.sleep(Duration::from_micros(at.saturating_sub(now)));
                tokio::select! {
                    biased;
                    () = sleep => {}
                    () = sooner => {}
                }
            }
            None => sooner.await,
        }
    }
}
