//! A store client's circuit breakers (one per node) and its rule for giving up on a call:
//! one copy, run by the Redis client (`store/redis/`) and by each simulated replica of
//! `tollgate simulate` (`sim/store/replica.rs`), on their clock handle, so a simulated fleet
//! opens, probes and closes its breakers at the moments a real one would.
//!
//! The node is `store` for a standalone Redis, `host:port` of the primary for a Redis Cluster
//! (one node down affects only the keys in its slots), `node<i>` in the simulator.
//!
//! - **Giving up** ([`Breakers::wait`]): a call gives up when its node has been silent (no reply
//!   to any call of this client) for `timeout`, not when the call itself has waited that long,
//!   or after `max_wait` in all; time this process spent too busy to look is not counted as
//!   silence; before giving up it pauses once more, a quarter of the timeout, in case the
//!   replies are already waiting unread.
//! - **Opening** ([`Breakers::settle`]): after `failures_to_open` consecutive failed calls, or
//!   at once when the node refused or dropped the connection; or ([`Breakers::missed`]) when
//!   its callers' deadlines keep passing while it answers late: `failures_to_open` misses in
//!   a row, or more than one decision in four missed for a while. While open, no call is made: the
//!   client fails the node's ops at once with [`StoreErrorKind::CircuitOpen`] and the limiter
//!   answers them from its fallback, so no request waits for the timeout during an outage.
//! - **Closing** ([`probe_until_closed`]): from the moment it opened, every `probe_every`, the
//!   client's probe runs a real script on the node (Redis: `redis/probe.rs`; the simulator:
//!   its node model), bounded by the connect timeout. The first that runs closes the breaker.
//!
//! Each transition is one log line, a count in `tollgate_breaker_transitions_total{node,to}`
//! and the gauge `tollgate_fallback_active{node}`.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;

use super::StoreErrorKind;
use crate::clock::Clock;
use crate::telemetry::{NodeLabels, StoreMetrics, TransitionLabels};

/// When a client gives up on a call, opens a node's breaker and probes it (from the settings:
/// `store_timeout_ms`, `store_connect_timeout_ms`, `breaker_failures`, `breaker_probe_ms`).
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// How long a node may stay silent before a call to it gives up.
    pub timeout: Duration,
    /// A call's bound in all, whatever the node says: max(connect timeout, timeout).
    pub max_wait: Duration,
    /// A probe's bound (the connect timeout).
    pub probe_limit: Duration,
    /// Consecutive failed calls to a node that open its breaker.
    pub failures_to_open: u32,
    /// How long after opening (and after each failed probe) the node is probed.
    pub probe_every: Duration,
}

impl Policy {
    pub fn new(
        timeout: Duration,
        connect_timeout: Duration,
        failures_to_open: u32,
        probe_every: Duration,
    ) -> Self {
        Policy {
            timeout,
            max_wait: connect_timeout.max(timeout),
            probe_limit: connect_timeout,
            failures_to_open: failures_to_open.max(1),
            probe_every,
        }
    }
}

#[derive(Debug)]
struct Breaker {
    failures: AtomicU32,
    /// Missed deadlines, as a score: +[`MISS_WEIGHT`] a miss, −1 a call answered (see
    /// [`Breakers::missed`]).
    late: AtomicU32,
    open: AtomicBool,
    /// When the node last replied to a call, in µs on the client's clock, plus one (0: never).
    replied_us: AtomicU64,
}

/// One client's breakers, by node.
#[derive(Debug)]
pub struct Breakers {
    policy: Policy,
    clock: Clock,
    /// Read on every request without a lock; a node seen for the first time is added under
    /// `adding` (copy, insert, swap: it happens once per node).
    nodes: ArcSwap<HashMap<Arc<str>, Arc<Breaker>>>,
    adding: Mutex<()>,
    metrics: StoreMetrics,
}

/// What a probe found.
#[derive(Debug, PartialEq, Eq)]
pub enum Probe {
    /// The script ran: the node does real work again.
    Ran,
    /// No answer, or the script was refused (`OOM`, `READONLY`, …).
    Failed,
    /// The node is gone from the client's map (a failed-over cluster primary): forget it.
    Gone,
    /// The client itself is gone: stop probing.
    Stopped,
}

impl Breakers {
    pub fn new(policy: Policy, clock: Clock, metrics: StoreMetrics) -> Self {
        Breakers {
            policy,
            clock,
            nodes: ArcSwap::from_pointee(HashMap::new()),
            adding: Mutex::new(()),
            metrics,
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    fn breaker(&self, node: &Arc<str>) -> Arc<Breaker> {
        if let Some(b) = self.nodes.load().get(node) {
            return b.clone();
        }
        let _adding = self.adding.lock().unwrap_or_else(|p| p.into_inner());
        let current = self.nodes.load_full();
        if let Some(b) = current.get(node) {
            return b.clone();
        }
        let b = Arc::new(Breaker {
            failures: AtomicU32::new(0),
            late: AtomicU32::new(0),
            open: AtomicBool::new(false),
            replied_us: AtomicU64::new(0),
        });
        let mut next = (*current).clone();
        next.insert(node.clone(), b.clone());
        self.nodes.store(Arc::new(next));
        b
    }

    pub fn is_open(&self, node: &Arc<str>) -> bool {
        self.breaker(node).open.load(Ordering::Acquire)
    }

    /// `node` replied to a call (any reply, an error reply included: the node is alive).
    pub fn replied(&self, node: &Arc<str>) {
        let us = self.clock.mono_us().saturating_add(1);
        self.breaker(node)
            .replied_us
            .fetch_max(us, Ordering::AcqRel);
    }

    /// When `node` last replied to a call (µs on the clock); `None` before its first reply.
    pub fn last_reply(&self, node: &Arc<str>) -> Option<u64> {
        match self.breaker(node).replied_us.load(Ordering::Acquire) {
            0 => None,
            us => Some(us - 1),
        }
    }

    /// The give-up rule for one call to `node` that starts now.
    pub fn wait(&self) -> Wait {
        self.wait_since(self.clock.mono_us())
    }

    /// The give-up rule for a call whose caller has waited since `started` (µs on the
    /// breakers' clock): decisions that queued for a batch (`store/redis/batch.rs`) count the
    /// node's silence, and the hard limit, from when they queued, not from when their batch
    /// went out.
    pub fn wait_since(&self, started: u64) -> Wait {
        Wait {
            started,
            hard: started.saturating_add(micros(self.policy.max_wait)),
            lag: 0,
            confirmed: false,
        }
    }

    /// Notes how a call to `node` ended: `None` when it succeeded, else the kind of error that
    /// failed it as a whole. True when this failure opened the breaker: the caller then starts
    /// [`probe_until_closed`].
    pub fn settle(&self, node: &Arc<str>, failed: Option<StoreErrorKind>) -> bool {
        let b = self.breaker(node);
        let Some(kind) = failed else {
            b.failures.store(0, Ordering::Release);
            return false;
        };
        let failures = b.failures.fetch_add(1, Ordering::AcqRel) + 1;
        // A refused or dropped connection will not answer the next call either.
        let open = kind == StoreErrorKind::Connection || failures >= self.policy.failures_to_open;
        // Opened once: a call that fails while it is open does not start a second probe.
        if !open || b.open.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.transition(node, "open", 1);
        tracing::warn!(
            %node,
            failures,
            error_kind = %kind,
            "store circuit open: no request is sent to this node until a probe's script runs on it; meanwhile each rule's fallback decides its requests (fallback: error, the default started as ratelimit, answers UNAVAILABLE)"
        );
        true
    }

    /// `node` answered a call carrying `ops` ops (a batch carries many requests' ops): each
    /// pays off one third of a missed deadline (see [`Breakers::missed`]).
    pub fn answered(&self, node: &Arc<str>, ops: usize) {
        let n = u32::try_from(ops).unwrap_or(u32::MAX);
        let _ = self
            .breaker(node)
            .late
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |l| {
                (l > 0).then(|| l.saturating_sub(n))
            });
    }

    /// A request's decision budget ran out while `node` had not answered it (the caller
    /// answered from its fallback): a node that keeps answering, but late, fails its callers as
    /// a silent one does. Misses are scored apart from failed calls, because the calls that
    /// do come back in time, interleaved with them, would reset a count of consecutive
    /// failures every time: a miss adds [`MISS_WEIGHT`], each op an answered call carried
    /// takes 1 off ([`Breakers::answered`]), and the breaker opens at `failures_to_open` ×
    /// [`MISS_WEIGHT`]. So `failures_to_open` misses in a row open it, as failed calls do, and
    /// so does a node that misses more than one decision in four for a while (each miss
    /// outweighs three answers), while a rare miss beside answers in time never adds up. True
    /// when this miss opened the breaker: the caller then starts [`probe_until_closed`].
    ///
    /// `waited`: how long the caller's store part had. A miss counts only when that was at
    /// least `timeout` (the silence a node is allowed): a shorter wait is the caller's own
    /// lateness (the request queued in its process, its budget mostly spent on arrival), not
    /// the node's.
    pub fn missed(&self, node: &Arc<str>, waited: Duration) -> bool {
        if waited < self.policy.timeout {
            return false;
        }
        let b = self.breaker(node);
        let late = b.late.fetch_add(MISS_WEIGHT, Ordering::AcqRel) + MISS_WEIGHT;
        if late < self.policy.failures_to_open.saturating_mul(MISS_WEIGHT) {
            return false;
        }
        if b.open.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.transition(node, "open", 1);
        tracing::warn!(
            %node,
            "store circuit open: this node keeps answering after its callers' deadlines; no request is sent to it until a probe's script runs on it; meanwhile each rule's fallback decides its requests (fallback: error, the default started as ratelimit, answers UNAVAILABLE)"
        );
        true
    }

    /// Closes `node`'s breaker after its probe's script ran.
    pub fn close(&self, node: &Arc<str>) {
        let b = self.breaker(node);
        b.failures.store(0, Ordering::Release);
        b.late.store(0, Ordering::Release);
        if b.open.swap(false, Ordering::AcqRel) {
            self.transition(node, "closed", 0);
            tracing::info!(%node, "store circuit closed: a script ran again; back to the shared quota");
        }
    }

    /// Drops `node`'s breaker: the slot map names it no more (its slots are served by another
    /// node now), so it is neither probed nor reported as open.
    pub fn forget(&self, node: &Arc<str>) {
        let _adding = self.adding.lock().unwrap_or_else(|p| p.into_inner());
        let current = self.nodes.load_full();
        let Some(b) = current.get(node) else {
            return;
        };
        if b.open.load(Ordering::Acquire) {
            self.transition(node, "closed", 0);
            tracing::info!(%node, "store circuit closed: the node left the slot map, its slots are served by another node");
        }
        let mut next = (*current).clone();
        next.remove(node);
        self.nodes.store(Arc::new(next));
    }

    fn transition(&self, node: &Arc<str>, to: &'static str, active: i64) {
        self.metrics
            .breaker_transitions
            .get_or_create(&TransitionLabels {
                node: node.to_string(),
                to,
            })
            .inc();
        self.metrics
            .fallback_active
            .get_or_create(&NodeLabels {
                node: node.to_string(),
            })
            .set(active);
    }

    /// The open nodes among those `current` keeps (the slot map's nodes on a cluster).
    pub fn open_nodes(&self, current: impl Fn(&str) -> bool) -> Vec<String> {
        let mut open: Vec<String> = self
            .nodes
            .load()
            .iter()
            .filter(|(n, b)| b.open.load(Ordering::Acquire) && current(n))
            .map(|(n, _)| n.to_string())
            .collect();
        open.sort();
        open
    }
}

/// One call's give-up rule in progress (from [`Breakers::wait`]), in µs on the client's clock.
#[derive(Debug)]
pub struct Wait {
    started: u64,
    hard: u64,
    /// Time the process was too busy to look at the call (see [`Wait::next`]).
    lag: u64,
    /// Whether the node's silence was confirmed by a last short pause (once per call).
    confirmed: bool,
}

impl Wait {
    /// When the node will have been silent to this call for the timeout, if it answers
    /// nothing more: the last reply heard (or the call's start) + the timeout + the time the
    /// process was too busy to look. Until then [`Wait::next`] only says to look again then.
    pub fn silent_until(&self, breakers: &Breakers, node: &Arc<str>) -> u64 {
        let heard = breakers
            .last_reply(node)
            .map_or(self.started, |t| t.max(self.started));
        heard + micros(breakers.policy.timeout) + self.lag
    }

    /// The hard limit: the call gives up then, whatever the node does.
    pub fn hard(&self) -> u64 {
        self.hard
    }

    /// When to look at the call first: `timeout` after it started.
    pub fn first_deadline(&self, breakers: &Breakers) -> u64 {
        (self.started + micros(breakers.policy.timeout)).min(self.hard)
    }

    /// The call is still unanswered: its timer for `deadline` fired at `fired`, and the client
    /// looked at the call at `now` (after letting the connection's reader run). `None` gives
    /// up; else when to look again.
    ///
    /// How late the timer fired and how long the look took are time the process was too busy
    /// (a burst, CPU throttling): the node's replies may have waited unread all that time, so
    /// it is not the node's silence.
    pub fn next(
        &mut self,
        breakers: &Breakers,
        node: &Arc<str>,
        deadline: u64,
        fired: u64,
        now: u64,
    ) -> Option<u64> {
        self.lag += fired.saturating_sub(deadline) + now.saturating_sub(fired);
        let timeout = micros(breakers.policy.timeout);
        let silent_until = self.silent_until(breakers, node);
        if now >= self.hard {
            return None;
        }
        if now >= silent_until {
            if self.confirmed {
                return None;
            }
            // One short pause before giving up: on an overcommitted host the connection's
            // reader can sit unscheduled with the node's replies already in its socket. A
            // reply heard meanwhile (this call's or another's) keeps the call waiting; a node
            // that is really silent costs it a quarter of the timeout more.
            self.confirmed = true;
            return Some((now + (timeout / 4).max(1_000)).min(self.hard));
        }
        Some(silent_until.min(self.hard))
    }
}

/// Probes `node` until its breaker closes: every `probe_every` from when it opened (and after
/// each failed probe ends), `probe` runs a script on the node. [`Probe::Ran`] closes the
/// breaker, [`Probe::Gone`] forgets it, [`Probe::Stopped`] ends the task. Spawned on the
/// breakers' clock by the client whose [`Breakers::settle`] opened it.
pub async fn probe_until_closed<F, P>(breakers: Arc<Breakers>, node: Arc<str>, mut probe: F)
where
    F: FnMut() -> P,
    P: Future<Output = Probe>,
{
    loop {
        breakers.clock.sleep(breakers.policy.probe_every).await;
        match probe().await {
            Probe::Ran => {
                breakers.replied(&node);
                breakers.close(&node);
                return;
            }
            Probe::Gone => {
                breakers.forget(&node);
                return;
            }
            Probe::Stopped => return,
            Probe::Failed => {}
        }
    }
}

/// What one missed deadline weighs against one answered call ([`Breakers::missed`]).
pub const MISS_WEIGHT: u32 = 3;

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Metrics;

    fn breakers(clock: Clock, metrics: &Metrics) -> Breakers {
        let policy = Policy::new(
            Duration::from_millis(10),
            Duration::from_millis(100),
            3,
            Duration::from_millis(500),
        );
        Breakers::new(policy, clock, metrics.store.clone())
    }

    #[test]
    fn opens_after_consecutive_failures_or_a_refusal_and_closes_on_a_probe_or_when_forgotten() {
        let metrics = Metrics::new();
        let b = breakers(Clock::manual(0), &metrics);
        let node: Arc<str> = "a:1".into();
        let timeout = Some(StoreErrorKind::Timeout);
        assert!(!b.settle(&node, timeout));
        assert!(!b.settle(&node, None));
        assert!(!b.settle(&node, timeout));
        assert!(!b.settle(&node, timeout));
        assert!(!b.is_open(&node), "two in a row after a success");
        assert!(b.settle(&node, timeout), "the third opens it");
        assert!(b.is_open(&node));
        assert!(!b.settle(&node, timeout), "opens once");
        assert_eq!(b.open_nodes(|_| true), ["a:1"]);
        assert!(
            b.open_nodes(|n| n != "a:1").is_empty(),
            "not a current node"
        );
        b.close(&node);
        assert!(!b.is_open(&node));
        let other: Arc<str> = "b:2".into();
        assert!(
            b.settle(&other, Some(StoreErrorKind::Connection)),
            "a refusal opens at once"
        );
        assert!(!b.is_open(&node), "per node");
        b.forget(&other);
        assert!(!b.is_open(&other), "a forgotten node starts closed");
        assert!(b.last_reply(&node).is_none());
        b.replied(&node);
        assert_eq!(b.last_reply(&node), Some(0), "at 0 on the manual clock");
        let text = metrics.render();
        for expected in [
            r#"tollgate_breaker_transitions_total{node="a:1",to="open"} 1"#,
            r#"tollgate_breaker_transitions_total{node="a:1",to="closed"} 1"#,
            r#"tollgate_fallback_active{node="a:1"} 0"#,
            r#"tollgate_fallback_active{node="b:2"} 0"#,
            r#"tollgate_breaker_transitions_total{node="b:2",to="closed"} 1"#,
        ] {
            assert!(text.contains(expected), "{expected} in {text}");
        }
    }

    #[test]
    fn misses_open_a_node_that_keeps_answering_late_but_not_one_that_misses_rarely() {
        let metrics = Metrics::new();
        let b = breakers(Clock::manual(0), &metrics);
        let node: Arc<str> = "store".into();
        let waited = Duration::from_millis(15);
        // A miss after less than the timeout is the caller's own lateness: never counted.
        for _ in 0..10 {
            assert!(!b.missed(&node, Duration::from_millis(9)));
        }
        // One decision in five missed, the others answered: never opens.
        for _ in 0..50 {
            assert!(!b.missed(&node, waited));
            for _ in 0..4 {
                b.answered(&node, 1);
            }
        }
        assert!(!b.is_open(&node));
        // One in three: opens, once.
        let opened = (0..20)
            .map(|_| {
                let opened = b.missed(&node, waited);
                b.answered(&node, 2);
                opened
            })
            .filter(|&o| o)
            .count();
        assert_eq!(opened, 1);
        assert!(b.is_open(&node));
        b.close(&node);
        // `failures_to_open` (3) in a row open it.
        assert!(!b.missed(&node, waited));
        assert!(!b.missed(&node, waited));
        assert!(b.missed(&node, waited));
    }

    #[test]
    fn a_call_gives_up_on_the_nodes_silence_after_one_short_pause_not_on_its_own_wait() {
        let clock = Clock::manual(0);
        let b = breakers(clock.clone(), &Metrics::new());
        let node: Arc<str> = "store".into();
        let mut wait = b.wait();
        let first = wait.first_deadline(&b);
        assert_eq!(first, 10_000);
        // Another call's reply at 8 ms: silent only from then.
        clock.advance_us(8_000);
        b.replied(&node);
        assert_eq!(wait.next(&b, &node, first, 10_000, 10_000), Some(18_000));
        // Silent at 18 ms: one pause of a quarter of the timeout (at least 1 ms), then give up.
        assert_eq!(wait.next(&b, &node, 18_000, 18_000, 18_000), Some(20_500));
        assert_eq!(wait.next(&b, &node, 20_500, 20_500, 20_500), None);
        // A process too busy to look (the timer 5 ms late) while another reply came at 20 ms:
        // silent from 20 ms, and the 5 ms of lag are not silence.
        let mut wait = b.wait();
        let at = wait.first_deadline(&b);
        assert_eq!(at, 18_000);
        clock.advance_us(12_000);
        b.replied(&node);
        assert_eq!(
            wait.next(&b, &node, at, at + 5_000, at + 5_000),
            Some(35_000)
        );
        // `max_wait` bounds it whatever the node says.
        let mut wait = b.wait();
        assert_eq!(wait.next(&b, &node, 0, 120_000, 120_000), None);
    }
}
