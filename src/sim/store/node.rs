//! The simulated Redis nodes ([`SimStore`]), shared by every replica's client: which node a
//! key lives on, what fault the schedule puts on it, how long a round trip takes, how the
//! node queues scripts, and what a call runs on it.
//!
//! Flow: a replica's client asks for a node's fault ([`SimStore::fault`]) and a round trip
//! ([`SimStore::round_trip_us`]) → it sends the call ([`SimStore::send`]: onto the list of
//! calls in flight, `in_flight.rs`, which the store's one task works through) → the call
//! reaches the node and queues ([`SimStore::enqueue`]) → at its turn the node runs it
//! ([`SimStore::run`]: ops on the node's buckets, or a heartbeat on its membership set) and
//! counts the scripts → the reply goes back. A breaker's probe takes the same path in one step
//! ([`SimStore::probe`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, LogNormal};

use super::in_flight::{Events, InFlight, Reply, Stage, Work};
use super::{ClassCalls, lock};
use crate::clock::Clock;
use crate::sim::scenario::{FaultKind, Latency, StoreModel};
use crate::store::breaker::{Policy, Probe};
use crate::store::redis::slot_of;
use crate::store::{MemoryStore, StoreError, StoreErrorKind};

/// Buckets a simulated node holds at most (Redis holds them all; the memory store's cap
/// would evict live buckets and make the simulation wrong, not tell the user).
const NODE_MAX_KEYS: usize = 50_000_000;

/// One simulated Redis primary.
#[derive(Debug)]
pub(super) struct Node {
    pub(super) buckets: MemoryStore,
    /// Membership key → replica → expiry (virtual ms).
    members: Mutex<HashMap<String, HashMap<String, u64>>>,
    /// When the node is done with the scripts queued so far (virtual µs).
    busy_until_us: Mutex<f64>,
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
    pub(super) clock: Clock,
    pub(super) nodes: Vec<Node>,
    pub(super) latency: Latency,
    /// Microseconds one script takes on a node.
    pub(super) script_us: f64,
    faults: Vec<Window>,
    rng: Mutex<SmallRng>,
    /// Scripts run, per node per virtual second.
    calls: Mutex<Vec<Vec<u64>>>,
    /// The clients' give-up and breaker rules, from the scenario's `settings:`.
    pub(super) policy: Policy,
    /// Each node's name for the breakers (`node0`, `node1`, …).
    pub(super) names: Vec<Arc<str>>,
    /// The last slot of each node, as `redis-cli --cluster create` splits the 16,384.
    last_slots: Vec<u16>,
    classes: Arc<ClassCalls>,
    /// Anything that happened (a script run, a reply): the driver runs the runtime until this
    /// stops moving.
    pub(super) activity: Arc<AtomicU64>,
    /// The calls on their way to a node, in its queue, or their replies on the way back.
    pub(super) events: Events,
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
            events: Events::default(),
        }
    }

    /// Scripts each node ran in each virtual second (`[node][second]`).
    pub fn calls_per_second(&self) -> Vec<Vec<u64>> {
        lock(&self.calls).clone()
    }

    /// The node holding `key`: the one whose slot range holds its hash tag's slot.
    pub(super) fn node_of(&self, key: &str) -> usize {
        if self.nodes.len() == 1 {
            return 0;
        }
        let slot = slot_of(key.as_bytes());
        self.last_slots.partition_point(|&last| last < slot)
    }

    /// The fault on `node` at `t_us` as `replica` sees it, if any (the first that applies).
    pub(super) fn fault(&self, node: usize, replica: u32, t_us: u64) -> Option<&FaultKind> {
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
    pub(super) async fn probe(&self, node: usize, replica: u32) -> Probe {
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
    pub(super) fn round_trip_us(&self, latency: Latency) -> f64 {
        round_trip_us(latency, &mut lock(&self.rng))
    }

    /// Queues `scripts` reaching `node` at `at_us`; when they are done.
    pub(super) fn enqueue(&self, node: usize, at_us: f64, scripts: u64) -> f64 {
        let mut busy = lock(&self.nodes[node].busy_until_us);
        let start = busy.max(at_us);
        *busy = start + self.script_us * scripts as f64;
        *busy
    }

    /// How long a script reaching `node` at `now_us` would wait for the ones before it.
    fn queue_us(&self, node: usize, now_us: u64) -> f64 {
        (*lock(&self.nodes[node].busy_until_us) - now_us as f64).max(0.0)
    }

    pub(super) fn count_scripts(&self, node: usize, t_us: u64, n: u64) {
        let second = (t_us / 1_000_000) as usize;
        if let Some(slot) = lock(&self.calls)[node].get_mut(second) {
            *slot += n;
        }
    }
}

impl SimStore {
    /// Runs `work` on `node` now.
    pub(super) fn run(&self, node: usize, work: Work) -> Reply {
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
                // As lua/membership.lua: expired entries go first, then this one.
                let now = self.clock.mono_ms();
                let mut members = lock(&n.members);
                let set = members.entry(key).or_default();
                set.retain(|_, expiry| *expiry > now);
                set.remove(&replica);
                Reply::Live(set.len() as u64)
            }
        }
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

/// One round trip (µs) under `latency`, drawn from `rng`: log-normal through its p50 and p99.
pub(in crate::sim) fn round_trip_us(latency: Latency, rng: &mut SmallRng) -> f64 {
    if latency.p50_ms <= 0.0 {
        return 0.0;
    }
    // z(0.99) = 2.3263.
    let sigma = ((latency.p99_ms / latency.p50_ms).ln() / 2.3263).max(0.0);
    let ms = match LogNormal::new(latency.p50_ms.ln(), sigma) {
        Ok(d) => d.sample(rng),
        Err(_) => latency.p50_ms,
    };
    ms * 1_000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::store::testing::{store, store_of};

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
