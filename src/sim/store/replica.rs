//! One replica's client of the simulated store ([`ReplicaStore`], the replica's
//! [`Backend`]): its own circuit breakers (the Redis client's, `store/breaker.rs`), and so its
//! own view of each node's silence.
//!
//! Flow: the limiter's ops → grouped by node, one call per node, concurrently
//! ([`Backend::apply_each`]) → each call through its node's breaker ([`ReplicaStore::call`])
//! → the node's fault decides: refused at once, never answered, or sent
//! ([`ReplicaStore::dispatch`]) → the store's list of calls in flight carries it to the node
//! and the reply back ([`ReplicaStore::send`], `in_flight.rs`) → the caller waits by the
//! give-up rule ([`ReplicaStore::wait`]), and how the call ended goes to the breakers
//! ([`ReplicaStore::settle`]). Membership heartbeats skip the breakers
//! ([`ReplicaStore::membership_call`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::{BoxFuture, join_all};

use super::SimStore;
use super::in_flight::{InFlight, Reply, Stage, Work};
use crate::quota::{Op, Outcome};
use crate::sim::scenario::FaultKind;
use crate::store::breaker::{Breakers, Wait, probe_until_closed};
use crate::store::{Backend, StoreError, StoreErrorKind};
use crate::telemetry::StoreMetrics;

/// One replica's client of the simulated store: its own breakers (the Redis client's), and
/// so its own view of each node's silence.
#[derive(Debug)]
pub struct ReplicaStore {
    store: Arc<SimStore>,
    index: u32,
    breakers: Arc<Breakers>,
    /// Per node: the calls waiting for its silence (see [`Silence`]).
    silence: Vec<Arc<Silence>>,
}

/// One node's silence as this replica hears it.
///
/// The give-up rule looks at a waiting call every `store_timeout_ms` while the node keeps
/// answering other calls (`Wait::next` then only says "look again when it will have been
/// silent"). Behind an overloaded node a call waits up to the hard limit, so a fleet's waiting
/// calls would wake ~100 times each for nothing, and the simulation's cost per decision would
/// grow with the backlog. Instead such a call waits here: one watcher task per node and
/// replica sleeps until the node will have been silent for the timeout
/// ([`Wait::silent_until`]), again while replies keep coming, and wakes the waiting calls the
/// moment the silence is reached, when the rule looks at them exactly as it would have.
#[derive(Debug, Default)]
struct Silence {
    reached: tokio::sync::Notify,
    waiting: AtomicUsize,
    watched: AtomicBool,
}

/// One call's place among a node's [`Silence`] waiters, given up when the call stops waiting.
struct Waiting<'a>(&'a Silence);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ReplicaStore {
    pub fn new(store: Arc<SimStore>, index: u32, metrics: StoreMetrics) -> Self {
        let breakers = Breakers::new(store.policy, store.clock.clone(), metrics);
        ReplicaStore {
            silence: (0..store.nodes.len()).map(|_| Arc::default()).collect(),
            store,
            index,
            breakers: Arc::new(breakers),
        }
    }

    /// Starts `node`'s silence watcher unless one runs: it sleeps until the node will have
    /// been silent for the timeout since its last reply (again, while replies keep coming),
    /// then wakes every call waiting for that, and ends; it also ends when nobody waits.
    fn watch_silence(&self, node: usize) {
        let silence = self.silence[node].clone();
        if silence.watched.swap(true, Ordering::Relaxed) {
            return;
        }
        let (breakers, name) = (self.breakers.clone(), self.store.names[node].clone());
        let clock = self.store.clock.clone();
        let timeout_us = self.store.policy.timeout.as_micros() as u64;
        self.store.clock.spawn(async move {
            while silence.waiting.load(Ordering::Relaxed) > 0 {
                let at = breakers
                    .last_reply(&name)
                    .unwrap_or(0)
                    .saturating_add(timeout_us);
                let now = clock.mono_us();
                if now >= at {
                    silence.reached.notify_waiters();
                    break;
                }
                clock.sleep(Duration::from_micros(at - now)).await;
            }
            silence.watched.store(false, Ordering::Relaxed);
        });
    }

    /// Notes how a call to `node` ended, as `RedisStore` does; a breaker this opened is probed
    /// by the Redis client's own task, on the virtual clock.
    fn settle(&self, node: usize, failed: Option<StoreErrorKind>) {
        let name = &self.store.names[node];
        if self.breakers.settle(name, failed) {
            self.start_probe(node);
        }
    }

    /// Probes `node`, whose breaker just opened, until it closes (as `RedisStore` does).
    fn start_probe(&self, node: usize) {
        let name = &self.store.names[node];
        let (store, replica) = (self.store.clone(), self.index);
        let probe = move || {
            let store = store.clone();
            async move { store.probe(node, replica).await }
        };
        self.store.clock.spawn(probe_until_closed(
            self.breakers.clone(),
            name.clone(),
            probe,
        ));
    }

    /// One decision-side call to `node` (`RedisStore::call`): through the node's breaker,
    /// given up on the node's silence; `Ok` with the node's reply, or the error every part of
    /// it gets.
    async fn call(&self, node: usize, work: Work, scripts: u64) -> Result<Reply, StoreError> {
        let s = &self.store;
        if self.breakers.is_open(&s.names[node]) {
            return Err(StoreError::new(
                StoreErrorKind::CircuitOpen,
                "simulated node's circuit is open",
            ));
        }
        let started = s.clock.mono_us();
        let result = match self.dispatch(node, work, scripts, started) {
            Ok(reply) => self.wait(node, reply).await,
            Err(e) => Err(e),
        };
        if result.is_ok() {
            self.breakers.answered(&s.names[node], scripts as usize);
        }
        self.settle(node, result.as_ref().err().map(|e| e.kind));
        result
    }

    /// A membership heartbeat or leave (`RedisStore::membership`): past the breakers, bounded
    /// by the connect timeout alone, and no breaker counts it.
    async fn membership_call(&self, node: usize, work: Work) -> Result<Reply, StoreError> {
        let s = &self.store;
        let started = s.clock.mono_us();
        let limit = s.policy.probe_limit;
        match self.dispatch(node, work, 1, started)? {
            Some(reply) => match s.clock.timeout(limit, reply).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err(StoreError::new(
                    StoreErrorKind::Connection,
                    "simulated call dropped",
                )),
                Err(_) => Err(StoreError::new(
                    StoreErrorKind::Timeout,
                    "membership heartbeat timed out",
                )),
            },
            None => {
                s.clock.sleep(limit).await;
                Err(StoreError::new(
                    StoreErrorKind::Timeout,
                    "membership heartbeat timed out",
                ))
            }
        }
    }

    /// Sends `work` as the node's faults at `started` allow: refused at once (down), never
    /// answered (`None`: a partition), or on its way (its reply to wait for).
    #[allow(clippy::type_complexity)]
    fn dispatch(
        &self,
        node: usize,
        work: Work,
        scripts: u64,
        started: u64,
    ) -> Result<Option<tokio::sync::oneshot::Receiver<Result<Reply, StoreError>>>, StoreError> {
        let s = &self.store;
        let latency = match s.fault(node, self.index, started) {
            Some(FaultKind::Down) => {
                return Err(StoreError::new(
                    StoreErrorKind::Connection,
                    "simulated node is down (connection refused)",
                ));
            }
            // Packets dropped: the call is never answered.
            Some(FaultKind::Partition { .. }) => return Ok(None),
            Some(FaultKind::Slow(l)) => *l,
            _ => s.latency,
        };
        let rtt = s.round_trip_us(latency);
        Ok(Some(self.send(node, work, scripts, started, rtt)))
    }

    /// Sends `work` to `node` ([`SimStore::send`]): it reaches the node half a round trip
    /// later, queues behind what reached the node before it, runs (whether or not this
    /// replica still waits), and the reply arrives half a round trip after that.
    fn send(
        &self,
        node: usize,
        work: Work,
        scripts: u64,
        now: u64,
        rtt_us: f64,
    ) -> tokio::sync::oneshot::Receiver<Result<Reply, StoreError>> {
        let (reply_to, rx) = tokio::sync::oneshot::channel();
        let half_us = rtt_us / 2.0;
        self.store.send(InFlight {
            node,
            replica: self.index,
            scripts,
            half_us,
            at_us: now as f64 + half_us,
            stage: Stage::Arrive(work),
            breakers: self.breakers.clone(),
            reply_to,
        });
        rx
    }

    /// Waits for the reply by the Redis client's give-up rule ([`Breakers::wait`]): until the
    /// node has been silent to this replica for the timeout, or the hard limit. While the node
    /// keeps answering other calls, the call waits on the node's [`Silence`] instead of looking
    /// again every timeout: it is woken at the same moments the rule would act on.
    async fn wait(
        &self,
        node: usize,
        mut reply: Option<tokio::sync::oneshot::Receiver<Result<Reply, StoreError>>>,
    ) -> Result<Reply, StoreError> {
        let clock = &self.store.clock;
        let name = &self.store.names[node];
        let mut wait = self.breakers.wait();
        let mut deadline = wait.first_deadline(&self.breakers);
        let mut on_silence = false;
        loop {
            let left = Duration::from_micros(deadline.saturating_sub(clock.mono_us()));
            let answered = match &mut reply {
                Some(reply) if on_silence => self.until_silence(node, left, reply).await,
                Some(reply) => clock.timeout(left, reply).await,
                // A partition: nothing comes back.
                None => {
                    clock.sleep(left).await;
                    Err(crate::clock::Elapsed)
                }
            };
            match answered {
                Ok(Ok(result)) => return result,
                Ok(Err(_)) => {
                    return Err(StoreError::new(
                        StoreErrorKind::Connection,
                        "simulated call dropped",
                    ));
                }
                // The node may have replied to another call meanwhile: the rule looks again
                // (woken by the silence, the look is on time: that moment is its deadline).
                Err(_) => {
                    let now = clock.mono_us();
                    let looked = if on_silence { now } else { deadline };
                    match wait.next(&self.breakers, name, looked, now, now) {
                        Some(next) => {
                            deadline = next;
                            on_silence = reply.is_some()
                                && waits_on_silence(&wait, &self.breakers, name, next);
                            if on_silence {
                                deadline = wait.hard();
                            }
                        }
                        None => {
                            return Err(StoreError::new(
                                StoreErrorKind::Timeout,
                                "simulated node silent past store_timeout_ms",
                            ));
                        }
                    }
                }
            }
        }
    }

    /// Waits for `reply`, the node's silence, or `left` (the hard limit), whichever is first.
    async fn until_silence(
        &self,
        node: usize,
        left: Duration,
        reply: &mut tokio::sync::oneshot::Receiver<Result<Reply, StoreError>>,
    ) -> Result<
        Result<Result<Reply, StoreError>, tokio::sync::oneshot::error::RecvError>,
        crate::clock::Elapsed,
    > {
        let silence = &self.silence[node];
        silence.waiting.fetch_add(1, Ordering::Relaxed);
        let _waiting = Waiting(silence);
        // Created before the watcher can run: a silence reached from now on wakes it.
        let reached = silence.reached.notified();
        self.watch_silence(node);
        tokio::select! {
            biased;
            out = reply => Ok(out),
            () = reached => Err(crate::clock::Elapsed),
            () = self.store.clock.sleep(left) => Err(crate::clock::Elapsed),
        }
    }
}

/// Whether `next`, what the rule said after a look, only means "look again once the node will
/// have been silent" (it answered meanwhile), not the last short pause or the hard limit.
fn waits_on_silence(wait: &Wait, breakers: &Breakers, node: &Arc<str>, next: u64) -> bool {
    next < wait.hard() && next == wait.silent_until(breakers, node)
}

/// One call's reply as the answers of its `n` ops: each op's outcome, or the call's error
/// for every op.
fn per_op(reply: Result<Reply, StoreError>, n: usize) -> Vec<Result<Outcome, StoreError>> {
    match reply {
        Ok(Reply::Ops(outcomes)) if outcomes.len() == n => outcomes.into_iter().map(Ok).collect(),
        Ok(_) => vec![
            Err(StoreError::new(
                StoreErrorKind::Protocol,
                "simulated reply of the wrong shape",
            ));
            n
        ],
        Err(e) => vec![Err(e); n],
    }
}

impl Backend for ReplicaStore {
    /// A decision's budget ran out on these ops: each node they are on missed a deadline, by
    /// the Redis client's rule (`Breakers::missed`, `RedisStore::missed_deadline`).
    fn missed_deadline(&self, ops: &[Op], waited: Duration) {
        // Only a request on one node says which node kept it waiting.
        let Some(node) = ops.first().map(|op| self.store.node_of(&op.key)) else {
            return;
        };
        if ops[1..]
            .iter()
            .any(|op| self.store.node_of(&op.key) != node)
        {
            return;
        }
        if self.breakers.missed(&self.store.names[node], waited) {
            self.start_probe(node);
        }
    }

    fn apply_each<'a>(&'a self, ops: &'a [Op]) -> BoxFuture<'a, Vec<Result<Outcome, StoreError>>> {
        Box::pin(async move {
            // Every op on one node (always so on one primary): one call, nothing to regroup.
            let first = ops.first().map(|op| self.store.node_of(&op.key));
            if let Some(node) = first
                && ops[1..]
                    .iter()
                    .all(|op| self.store.node_of(&op.key) == node)
            {
                let reply = self.call(node, Work::Ops(ops.to_vec()), ops.len() as u64);
                return per_op(reply.await, ops.len());
            }
            // One call per node, concurrently, as the cluster client sends them.
            let mut by_node: Vec<(usize, Vec<usize>)> = Vec::new();
            for (i, op) in ops.iter().enumerate() {
                let node = self.store.node_of(&op.key);
                match by_node.iter_mut().find(|(n, _)| *n == node) {
                    Some((_, idx)) => idx.push(i),
                    None => by_node.push((node, vec![i])),
                }
            }
            // In node order: each call draws its round trip from the one generator, and the
            // ops' order (a lease table's give-backs) is not the same from run to run.
            by_node.sort_by_key(|(node, _)| *node);
            let calls = by_node.iter().map(|(node, idx)| {
                let part: Vec<Op> = idx.iter().map(|&i| ops[i].clone()).collect();
                let scripts = part.len() as u64;
                self.call(*node, Work::Ops(part), scripts)
            });
            let replies = join_all(calls).await;
            let mut results: Vec<Option<Result<Outcome, StoreError>>> = vec![None; ops.len()];
            for ((_, idx), reply) in by_node.iter().zip(replies) {
                for (&i, result) in idx.iter().zip(per_op(reply, idx.len())) {
                    results[i] = Some(result);
                }
            }
            results
                .into_iter()
                .map(|r| {
                    r.unwrap_or_else(|| Err(StoreError::new(StoreErrorKind::Protocol, "no reply")))
                })
                .collect()
        })
    }

    fn heartbeat<'a>(
        &'a self,
        key: &'a str,
        replica: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let node = self.store.node_of(key);
            let work = Work::Heartbeat {
                key: key.to_string(),
                replica: replica.to_string(),
                ttl_ms: ttl.as_millis() as u64,
            };
            match self.membership_call(node, work).await? {
                Reply::Live(n) => Ok(n),
                Reply::Ops(_) => Err(StoreError::new(StoreErrorKind::Protocol, "wrong reply")),
            }
        })
    }

    fn leave<'a>(
        &'a self,
        key: &'a str,
        replica: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let node = self.store.node_of(key);
            let work = Work::Leave {
                key: key.to_string(),
                replica: replica.to_string(),
            };
            match self.membership_call(node, work).await? {
                Reply::Live(n) => Ok(n),
                Reply::Ops(_) => Err(StoreError::new(StoreErrorKind::Protocol, "wrong reply")),
            }
        })
    }

    fn name(&self) -> &'static str {
        "simulated"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::scenario::{Fault, Latency};
    use crate::sim::store::testing::{drive, store, take};

    #[tokio::test]
    async fn a_call_takes_a_round_trip_and_queues_behind_a_busy_node() {
        let (clock, s) = store(Vec::new());
        let replica = Arc::new(ReplicaStore::new(
            s.clone(),
            0,
            crate::telemetry::Metrics::new().store,
        ));
        let r = replica.clone();
        let (out, took) = drive(&clock, async move { r.apply_each(&[take("a")]).await }).await;
        assert!(out[0].as_ref().is_ok_and(|o| o.allowed));
        // 1 ms round trip + 1 ms of script (1,000 a second).
        assert!((2_000..2_300).contains(&took), "{took} µs");
        // Five at once on a node that runs one a millisecond: the last waits for four.
        let r = replica.clone();
        let (out, took) = drive(&clock, async move {
            let ops: Vec<Op> = (0..5).map(|i| take(&format!("k{i}"))).collect();
            r.apply_each(&ops).await
        })
        .await;
        assert_eq!(out.len(), 5);
        assert!((6_000..6_300).contains(&took), "{took} µs");
    }

    #[tokio::test]
    async fn a_call_that_times_out_still_runs_and_a_refused_connection_opens_the_breaker() {
        // Round trips of 50 ms against a 10 ms timeout: the caller gives up, the node runs it.
        let slow = Fault {
            at_s: 0.0,
            for_s: 1.0,
            kind: FaultKind::Slow(Latency {
                p50_ms: 50.0,
                p99_ms: 50.0,
            }),
            node: None,
        };
        let down = Fault {
            at_s: 2.0,
            for_s: 1.0,
            kind: FaultKind::Down,
            node: None,
        };
        let (clock, s) = store(vec![slow, down]);
        let replica = Arc::new(ReplicaStore::new(
            s.clone(),
            0,
            crate::telemetry::Metrics::new().store,
        ));
        let r = replica.clone();
        let (out, took) = drive(&clock, async move { r.apply_each(&[take("a")]).await }).await;
        let e = out[0].as_ref().expect_err("timed out");
        assert!(e.outcome_unknown(), "{e}");
        // 10 ms of silence, then the rule's last pause of a quarter of the timeout.
        assert!((12_500..12_800).contains(&took), "{took} µs");
        // The token was spent all the same, once the call reached the node.
        let (_, _) = drive(&clock, {
            let c = clock.clone();
            async move { c.sleep(Duration::from_millis(100)).await }
        })
        .await;
        assert_eq!(s.nodes[0].buckets.apply(&take("a")).remaining, 8);

        // Down: refused at once, and the breaker is open: the next call is not even tried.
        clock.advance_us(2_000_000 - clock.mono_us());
        let r = replica.clone();
        let (out, took) = drive(&clock, async move { r.apply_each(&[take("b")]).await }).await;
        assert_eq!(
            out[0].as_ref().map_err(|e| e.kind),
            Err(StoreErrorKind::Connection)
        );
        assert!(took <= 100, "{took} µs");
        let r = replica.clone();
        let (out, _) = drive(&clock, async move { r.apply_each(&[take("b")]).await }).await;
        assert_eq!(
            out[0].as_ref().map_err(|e| e.kind),
            Err(StoreErrorKind::CircuitOpen)
        );
        // After the outage, the first probe closes it (the probe task runs on the clock).
        let (_, _) = drive(&clock, {
            let c = clock.clone();
            async move {
                c.sleep(Duration::from_micros(3_600_000 - c.mono_us()))
                    .await
            }
        })
        .await;
        let r = replica.clone();
        let (out, _) = drive(&clock, async move { r.apply_each(&[take("b")]).await }).await;
        assert!(out[0].is_ok());
    }
}
