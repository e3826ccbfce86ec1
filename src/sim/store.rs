//! The simulated Redis of `tollgate simulate`: nodes that hold buckets, take time, queue
//! when busy and fail on the scenario's schedule, seen by each replica through its own client
//! (with its own circuit breakers, as each real replica has).
//!
//! What is the real code and what is a model:
//! - The buckets are the quota core's ([`MemoryStore`]: the same math `lua/` mirrors, held to
//!   it by `tests/lua_mirror.rs`), one per node, on the virtual clock; the membership set is
//!   the one `lua/membership.lua` keeps (entries with an expiry, counted live).
//! - The network and Redis itself are a model: a round trip drawn from a log-normal through
//!   the scenario's p50 and p99; a node runs `ops_per_s` scripts a second, one at a time, so
//!   past it calls queue; the ops of a call run when the node gets to them, **whether or not
//!   the caller still waits** (a timed-out call's tokens are spent, as in Redis).
//! - The client's breakers and give-up rule are the Redis client's own (`store/breaker.rs`,
//!   [`Breakers`]), one set per replica on the virtual clock: a call gives up when its node
//!   has been silent to this replica for `store_timeout_ms` (after one last short pause), or
//!   after max(`store_connect_timeout_ms`, `store_timeout_ms`); a refused connection opens
//!   the node's breaker at once, `breaker_failures` failed calls in a row open it too; an open
//!   breaker fails its node's ops at once (`CircuitOpen`), and [`probe_until_closed`] probes
//!   it every `breaker_probe_ms` with a script that must run within the connect timeout,
//!   queue included ([`SimStore::probe`]: the model's part). Membership heartbeats pass the
//!   breakers, bounded by the connect timeout alone, as `RedisStore::membership` is. Left out:
//!   the connection pool's reconnect back-off after an outage (a real fleet returns to the
//!   store up to a couple of seconds later than this one).
//! - Slots: a key's node is its hash-tag slot's, the slots split over the nodes in order as
//!   `redis-cli --cluster create` splits them.
//!
//! Flow: a replica's limiter calls [`ReplicaStore`] (a [`Backend`]) → the ops are grouped by
//! node → each node's group is one call ([`ReplicaStore::call`]): breaker, fault, round trip,
//! queue → a task on the virtual clock runs the ops at the node's turn → the reply comes
//! back half a round trip later, or the caller has given up.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::{BoxFuture, join_all};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, LogNormal};

use super::scenario::{FaultKind, Latency, StoreModel};
use crate::clock::Clock;
use crate::store::breaker::{Breakers, Policy, Probe, probe_until_closed};
use crate::store::redis::slot_of;
use crate::store::{Backend, MemoryStore, Op, Outcome, StoreError, StoreErrorKind};
use crate::telemetry::StoreMetrics;

/// Buckets a simulated node holds at most (Redis holds them all; the memory store's cap
/// would evict live buckets and make the simulation wrong, not tell the user).
const NODE_MAX_KEYS: usize = 50_000_000;

/// One simulated Redis primary.
#[derive(Debug)]
struct Node {
    buckets: MemoryStore,
    /// Membership key → replica → expiry (virtual ms).
    members: Mutex<HashMap<String, HashMap<String, u64>>>,
    /// When the node is done with the scripts queued so far (virtual µs).
    busy_until_us: Mutex<f64>,
}

/// Which limit class each bucket belongs to (the driver names each bucket as it first
/// appears), and the scripts each class's buckets ran per virtual second: the report's
/// per-class store calls. Heartbeats and probes belong to no class.
#[derive(Debug, Default)]
pub struct ClassCalls {
    /// Bucket key (a sharded limit's without its shard part, `keys::bucket_id`) → class.
    of: Mutex<HashMap<String, usize>>,
    /// `[class][second]`.
    calls: Mutex<Vec<Vec<u64>>>,
    seconds: usize,
}

impl ClassCalls {
    pub fn new(duration_s: u64) -> Self {
        ClassCalls {
            seconds: duration_s as usize + 2,
            ..ClassCalls::default()
        }
    }

    /// `bucket` is a bucket of class `class`.
    pub fn name(&self, bucket: &str, class: usize) {
        lock(&self.of).insert(bucket.to_string(), class);
        let mut calls = lock(&self.calls);
        while calls.len() <= class {
            calls.push(vec![0; self.seconds]);
        }
    }

    fn count(&self, key: &str, second: usize) {
        let Some(&class) = lock(&self.of).get(crate::keys::bucket_id(key)) else {
            return;
        };
        if let Some(n) = lock(&self.calls)
            .get_mut(class)
            .and_then(|c| c.get_mut(second))
        {
            *n += 1;
        }
    }

    /// `[class][second]`.
    pub fn per_second(&self) -> Vec<Vec<u64>> {
        lock(&self.calls).clone()
    }
}

/// A fault in virtual µs.
#[derive(Clone, Debug)]
struct Window {
    from_us: u64,
    until_us: u64,
    kind: FaultKind,
    node: Option<u32>,
}

/// The nodes, shared by every replica's client.
#[derive(Debug)]
pub struct SimStore {
    clock: Clock,
    nodes: Vec<Node>,
    latency: Latency,
    /// Microseconds one script takes on a node.
    script_us: f64,
    faults: Vec<Window>,
    rng: Mutex<SmallRng>,
    /// Scripts run, per node per virtual second.
    calls: Mutex<Vec<Vec<u64>>>,
    /// The clients' give-up and breaker rules, from the scenario's `settings:`.
    policy: Policy,
    /// Each node's name for the breakers (`node0`, `node1`, …).
    names: Vec<Arc<str>>,
    /// The last slot of each node, as `redis-cli --cluster create` splits the 16,384.
    last_slots: Vec<u16>,
    classes: Arc<ClassCalls>,
    /// Anything that happened (a script run, a reply): the driver runs the runtime until this
    /// stops moving.
    pub(super) activity: Arc<AtomicU64>,
}

/// The last slot of each of `nodes` primaries: `redis-cli --cluster create`'s split (16,384 ÷
/// nodes each, rounded, the last node to the end).
fn last_slots(nodes: u32) -> Vec<u16> {
    let per = 16_384.0 / f64::from(nodes.max(1));
    let (mut first, mut cursor) = (0u32, 0.0f64);
    (0..nodes.max(1))
        .map(|i| {
            let mut last = (cursor + per - 1.0).round() as u32;
            if last > 16_383 || i == nodes.max(1) - 1 {
                last = 16_383;
            }
            last = last.max(first);
            first = last + 1;
            cursor += per;
            last as u16
        })
        .collect()
}

impl SimStore {
    pub fn new(
        model: &StoreModel,
        policy: Policy,
        clock: Clock,
        seed: u64,
        duration_s: u64,
        activity: Arc<AtomicU64>,
        classes: Arc<ClassCalls>,
    ) -> Self {
        let to_us = |s: f64| (s * 1e6).round() as u64;
        SimStore {
            nodes: (0..model.nodes)
                .map(|_| Node {
                    buckets: MemoryStore::with_max_keys(clock.clone(), NODE_MAX_KEYS),
                    members: Mutex::new(HashMap::new()),
                    busy_until_us: Mutex::new(0.0),
                })
                .collect(),
            clock,
            latency: model.latency,
            script_us: 1e6 / model.ops_per_s,
            faults: model
                .faults
                .iter()
                .map(|f| Window {
                    from_us: to_us(f.at_s),
                    until_us: to_us(f.at_s + f.for_s),
                    kind: f.kind.clone(),
                    node: f.node,
                })
                .collect(),
            rng: Mutex::new(SmallRng::seed_from_u64(seed ^ 0x5354_4f52_4521)),
            calls: Mutex::new(vec![vec![0; duration_s as usize + 2]; model.nodes as usize]),
            policy,
            names: (0..model.nodes)
                .map(|i| Arc::from(format!("node{i}").as_str()))
                .collect(),
            last_slots: last_slots(model.nodes),
            classes,
            activity,
        }
    }

    /// Scripts each node ran in each virtual second (`[node][second]`).
    pub fn calls_per_second(&self) -> Vec<Vec<u64>> {
        lock(&self.calls).clone()
    }

    /// The node holding `key`: the one whose slot range holds its hash tag's slot.
    fn node_of(&self, key: &str) -> usize {
        if self.nodes.len() == 1 {
            return 0;
        }
        let slot = slot_of(key.as_bytes());
        self.last_slots.partition_point(|&last| last < slot)
    }

    /// The fault on `node` at `t_us` as `replica` sees it, if any (the first that applies).
    fn fault(&self, node: usize, replica: u32, t_us: u64) -> Option<&FaultKind> {
        self.faults
            .iter()
            .filter(|w| (w.from_us..w.until_us).contains(&t_us))
            .filter(|w| w.node.is_none_or(|n| n as usize == node))
            .map(|w| &w.kind)
            .find(|k| match k {
                FaultKind::Partition { from, to } => (*from..*to).contains(&replica),
                _ => true,
            })
    }

    /// A breaker probe from `replica` (`store/redis/probe.rs`: a real script, bounded by the
    /// connect timeout), taking the time it takes: the node must be reachable and running
    /// scripts, and its queue plus a round trip short enough. A probe that reaches the node is
    /// one more script on it.
    async fn probe(&self, node: usize, replica: u32) -> Probe {
        let t = self.clock.mono_us();
        let limit_us = self.policy.probe_limit.as_micros() as f64;
        let latency = match self.fault(node, replica, t) {
            // Refused at once.
            Some(FaultKind::Down) => return Probe::Failed,
            // Nothing comes back: the probe waits out its bound.
            Some(FaultKind::Partition { .. }) => {
                self.clock.sleep(self.policy.probe_limit).await;
                return Probe::Failed;
            }
            Some(FaultKind::Oom) => {
                self.count_scripts(node, t, 1);
                let rtt = self.round_trip_us(self.latency).min(limit_us);
                self.clock.sleep(Duration::from_micros(rtt as u64)).await;
                return Probe::Failed;
            }
            Some(FaultKind::Slow(l)) => *l,
            None => self.latency,
        };
        self.count_scripts(node, t, 1);
        let waited = self.queue_us(node, t) + self.round_trip_us(latency);
        if waited < limit_us {
            self.enqueue(node, t as f64, 1);
            self.clock
                .sleep(Duration::from_micros(waited.ceil() as u64))
                .await;
            Probe::Ran
        } else {
            self.clock.sleep(self.policy.probe_limit).await;
            Probe::Failed
        }
    }

    /// One round trip (µs) under `latency`.
    fn round_trip_us(&self, latency: Latency) -> f64 {
        if latency.p50_ms <= 0.0 {
            return 0.0;
        }
        // Log-normal through p50 and p99: z(0.99) = 2.3263.
        let sigma = ((latency.p99_ms / latency.p50_ms).ln() / 2.3263).max(0.0);
        let ms = match LogNormal::new(latency.p50_ms.ln(), sigma) {
            Ok(d) => d.sample(&mut *lock(&self.rng)),
            Err(_) => latency.p50_ms,
        };
        ms * 1_000.0
    }

    /// Queues `scripts` reaching `node` at `at_us`; when they are done.
    fn enqueue(&self, node: usize, at_us: f64, scripts: u64) -> f64 {
        let mut busy = lock(&self.nodes[node].busy_until_us);
        let start = busy.max(at_us);
        *busy = start + self.script_us * scripts as f64;
        *busy
    }

    /// How long a script reaching `node` at `now_us` would wait for the ones before it.
    fn queue_us(&self, node: usize, now_us: u64) -> f64 {
        (*lock(&self.nodes[node].busy_until_us) - now_us as f64).max(0.0)
    }

    fn count_scripts(&self, node: usize, t_us: u64, n: u64) {
        let second = (t_us / 1_000_000) as usize;
        if let Some(slot) = lock(&self.calls)[node].get_mut(second) {
            *slot += n;
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a call asks of its node.
enum Work {
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

enum Reply {
    Ops(Vec<Outcome>),
    Live(u64),
}

/// One replica's client of the simulated store: its own breakers (the Redis client's), and
/// so its own view of each node's silence.
#[derive(Debug)]
pub struct ReplicaStore {
    store: Arc<SimStore>,
    index: u32,
    breakers: Arc<Breakers>,
}

impl ReplicaStore {
    pub fn new(store: Arc<SimStore>, index: u32, metrics: StoreMetrics) -> Self {
        let breakers = Breakers::new(store.policy, store.clock.clone(), metrics);
        ReplicaStore {
            store,
            index,
            breakers: Arc::new(breakers),
        }
    }

    /// Notes how a call to `node` ended, as `RedisStore` does; a breaker this opened is probed
    /// by the Redis client's own task, on the virtual clock.
    fn settle(&self, node: usize, failed: Option<StoreErrorKind>) {
        let name = &self.store.names[node];
        if !self.breakers.settle(name, failed) {
            return;
        }
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

    /// Sends `work` to `node` in a task of its own (so it runs even if the caller gives up):
    /// it reaches the node half a round trip later, queues behind what reached the node
    /// before it, runs, and the reply arrives half a round trip after that.
    fn send(
        &self,
        node: usize,
        work: Work,
        scripts: u64,
        now: u64,
        rtt_us: f64,
    ) -> tokio::sync::oneshot::Receiver<Result<Reply, StoreError>> {
        let s = self.store.clone();
        let half = rtt_us / 2.0;
        let arrives = now as f64 + half;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (breakers, name) = (self.breakers.clone(), s.names[node].clone());
        let replica = self.index;
        let clock = s.clock.clone();
        clock.clone().spawn(async move {
            clock.sleep(until(&clock, arrives)).await;
            // The node's queue is in the order calls reach it (the clock wakes sleeps in
            // deadline order), not the order they were sent.
            // Queued at the time it reached the node (the task may run a little later).
            let done_at = s.enqueue(node, arrives, scripts);
            // Behind a queue, the scripts run when the node gets to them; on an idle node they
            // run as they arrive (their few µs of run time go into the reply's wait instead:
            // one sleep less per call, which is most of a large fleet's calls).
            if done_at - arrives > s.script_us * scripts as f64 + 1.0 {
                clock.sleep(until(&clock, done_at)).await;
            }
            let t = clock.mono_us();
            s.count_scripts(node, t, scripts);
            let result = match s.fault(node, replica, t) {
                Some(FaultKind::Oom) => Err(StoreError::new(
                    StoreErrorKind::Unavailable,
                    "OOM command not allowed when used memory > 'maxmemory' (simulated)",
                )),
                _ => Ok(s.run(node, work)),
            };
            s.activity.fetch_add(1, Ordering::Relaxed);
            clock
                .sleep(until(&clock, done_at.max(t as f64) + half))
                .await;
            breakers.replied(&name);
            s.activity.fetch_add(1, Ordering::Relaxed);
            let _ = tx.send(result);
        });
        rx
    }

    /// Waits for the reply by the Redis client's give-up rule ([`Breakers::wait`]): until the
    /// node has been silent to this replica for the timeout, or the hard limit.
    async fn wait(
        &self,
        node: usize,
        mut reply: Option<tokio::sync::oneshot::Receiver<Result<Reply, StoreError>>>,
    ) -> Result<Reply, StoreError> {
        let clock = &self.store.clock;
        let mut wait = self.breakers.wait();
        let mut deadline = wait.first_deadline(&self.breakers);
        loop {
            let left = Duration::from_micros(deadline.saturating_sub(clock.mono_us()));
            let answered = match &mut reply {
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
                // The node may have replied to another call meanwhile: the rule looks again.
                Err(_) => {
                    let now = clock.mono_us();
                    match wait.next(&self.breakers, &self.store.names[node], deadline, now, now) {
                        Some(next) => deadline = next,
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
}

/// How long from now until `at_us` on `clock` (zero if past).
fn until(clock: &Clock, at_us: f64) -> Duration {
    let now = clock.mono_us() as f64;
    Duration::from_micros((at_us - now).max(0.0).ceil() as u64)
}

impl SimStore {
    /// Runs `work` on `node` now.
    fn run(&self, node: usize, work: Work) -> Reply {
        let n = &self.nodes[node];
        match work {
            Work::Ops(ops) => {
                let second = (self.clock.mono_us() / 1_000_000) as usize;
                for op in &ops {
                    self.classes.count(&op.key, second);
                }
                Reply::Ops(ops.iter().map(|op| n.buckets.apply(op)).collect())
            }
            Work::Heartbeat {
                key,
                replica,
                ttl_ms,
            } => {
                let now = self.clock.mono_ms();
                let mut members = lock(&n.members);
                let set = members.entry(key).or_default();
                set.retain(|_, expiry| *expiry > now);
                set.insert(replica, now + ttl_ms);
                Reply::Live(set.len() as u64)
            }
            Work::Leave { key, replica } => {
                let mut members = lock(&n.members);
                let set = members.entry(key).or_default();
                set.remove(&replica);
                Reply::Live(set.len() as u64)
            }
        }
    }
}

impl Backend for ReplicaStore {
    fn apply_each<'a>(&'a self, ops: &'a [Op]) -> BoxFuture<'a, Vec<Result<Outcome, StoreError>>> {
        Box::pin(async move {
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
                match reply {
                    Ok(Reply::Ops(outcomes)) => {
                        for (&i, o) in idx.iter().zip(outcomes) {
                            results[i] = Some(Ok(o));
                        }
                    }
                    Ok(Reply::Live(_)) => {
                        for &i in idx {
                            results[i] = Some(Err(StoreError::new(
                                StoreErrorKind::Protocol,
                                "simulated reply of the wrong shape",
                            )));
                        }
                    }
                    Err(e) => {
                        for &i in idx {
                            results[i] = Some(Err(e.clone()));
                        }
                    }
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
    use std::future::Future;

    use crate::quota::OpKind;
    use crate::sim::scenario::Fault;

    /// A store of `nodes` nodes on a manual clock: 1 ms round trips, 1,000 scripts a second,
    /// a 10 ms timeout, 1 s connect timeout, breakers after 3 failures probed every 500 ms.
    fn store_of(nodes: u32, faults: Vec<Fault>) -> (Clock, Arc<SimStore>) {
        let clock = Clock::manual(1_700_000_000_000);
        let model = StoreModel {
            nodes,
            latency: Latency {
                p50_ms: 1.0,
                p99_ms: 1.0,
            },
            ops_per_s: 1_000.0,
            faults,
        };
        let policy = Policy::new(
            Duration::from_millis(10),
            Duration::from_secs(1),
            3,
            Duration::from_millis(500),
        );
        let s = SimStore::new(
            &model,
            policy,
            clock.clone(),
            1,
            10,
            Arc::default(),
            Arc::default(),
        );
        (clock, Arc::new(s))
    }

    fn store(faults: Vec<Fault>) -> (Clock, Arc<SimStore>) {
        store_of(1, faults)
    }

    fn take(key: &str) -> Op {
        Op::take(
            key.into(),
            OpKind::TokenBucket {
                capacity: 10,
                refill: 10,
                window_ms: 3_600_000,
            },
            1,
        )
    }

    /// Runs `f` to its end, moving the clock 100 µs at a time; its result and how long it
    /// took in virtual µs.
    async fn drive<T: Send + 'static>(
        clock: &Clock,
        f: impl Future<Output = T> + Send + 'static,
    ) -> (T, u64) {
        let start = clock.mono_us();
        let task = tokio::spawn(f);
        while !task.is_finished() {
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
            clock.advance_us(100);
        }
        (task.await.expect("ran"), clock.mono_us() - start)
    }

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

    #[test]
    fn keys_go_to_the_node_of_their_slot_as_redis_cli_splits_them() {
        let (_, one) = store(Vec::new());
        assert_eq!(one.node_of("{anything}"), 0);
        let (_, three) = store_of(3, Vec::new());
        // CLUSTER KEYSLOT: "foo" is 12182 (the third of 0..=5460, 5461..=10922, 10923..=16383),
        // "user1000" 3443 (the first); a key's shards, each its own tag, spread.
        assert_eq!(last_slots(3), [5460, 10922, 16383]);
        assert_eq!(last_slots(1), [16383]);
        assert_eq!(three.node_of("foo"), 2);
        assert_eq!(three.node_of("{user1000}.following"), 0);
        let nodes: std::collections::HashSet<usize> = (0..16)
            .map(|i| three.node_of(&format!("{{edge|tenant=a|#{i}}}")))
            .collect();
        assert_eq!(nodes.len(), 3, "16 shards land on every node");
    }
}
