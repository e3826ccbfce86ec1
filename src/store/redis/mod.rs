//! The shared store: bucket state in one Redis or a Redis Cluster, so every replica of
//! tollgate spends from one quota.
//!
//! # How a request flows
//!
//! [`RedisStore::apply_each`] gets all bucket ops of one request, takes a connection from the
//! [`pool`] and runs each op as a Lua script ([`scripts`]):
//!
//! - **Standalone** (and Sentinel): every op of the request goes out as one call: one round
//!   trip per request, however many descriptors it has (one `EVALSHA`, or one batch script
//!   call for several, [`batch_script`]). While `store_batch_in_flight` calls are out, the
//!   requests that arrive wait and go together as one batch call when one returns ([`batch`]).
//! - **Cluster**: ops are grouped by node (the [`slots`] map), and each node's group goes out
//!   as one call, the groups concurrently; the request waits for the slowest node, not for the
//!   sum of them. Several ops of one node travel as one batch script call whatever their slots
//!   (only the first key declared, `batch_script::Layout::Routed`); without batching, as one
//!   pipeline per slot. Batches form per node, as on a standalone Redis (a request whose ops
//!   span nodes is not queued: it calls each node at once).
//!
//! Ops are grouped by node first (`store` for a standalone Redis; the primary's `host:port`
//! from the [`slots`] map on a cluster; when every op is on one node, as always on a
//! standalone Redis, they go out as one call with nothing to group) and each node has a
//! circuit breaker (`store/breaker.rs`, shared with the simulator): the
//! ops of a node whose circuit is open are not sent at all ([`StoreErrorKind::CircuitOpen`]),
//! and [`RedisStore::apply_each`] returns one result per op, so the limiter can fall back for
//! exactly the ops whose node failed.
//!
//! # When a call gives up
//!
//! A call gives up ([`StoreErrorKind::Timeout`]) when its **node** has been silent for
//! `store_timeout_ms`: no reply to any call since the call started (or since the node's last
//! reply, when later), not counting time this process itself was too busy to run (measured as
//! how late the call's timer fired, and confirmed by one more pause of a quarter of the
//! timeout, in which any reply from the node keeps the call waiting). A call that waits behind
//! others on a busy replica (a
//! burst of hundreds of calls, a CPU-throttled pod) while Redis keeps answering is therefore
//! never given up: it would only hand a decision whose tokens Redis spends anyway to the
//! fallback. A paused or partitioned Redis answers nothing, so its calls give up after the
//! timeout and the breaker opens. However busy the node, a call never waits past
//! `max(store_connect_timeout_ms, store_timeout_ms)`.
//!
//! A call that gave up was sent, and Redis may run its script later: its outcome is unknown
//! ([`StoreError::outcome_unknown`]) and the fallback never admits it from the local share.
//! Each op is judged by its own reply (`scripts::OpResults`): one refused op neither fails the
//! others nor hides the tokens they spent. Failures are classified in [`errors`], counted in
//! `tollgate_store_errors_total{kind}` (one per failed op) and logged as an outage state
//! ([`outage`]).
//!
//! # Files
//!
//! - [`config`]: what the store needs to know ([`RedisConfig`]).
//! - [`apply`]: a request's ops grouped by node, one call per node; what the results tell the
//!   pool, the breakers and the metrics.
//! - [`call`]: one node's call (its pipelines) and when it gives up.
//! - [`batch`]: decisions that wait for a busy node and go together as one call;
//!   [`batch_script`]: that call (its script is made in [`lua`]).
//! - [`connect`]: the URL → standalone, cluster or Sentinel client ([`client`], [`sentinel`]);
//!   one live connection (`Conn`).
//! - [`pool`]: the long-lived connections, and the keeper task that makes, checks and replaces
//!   them (`pool/keeper.rs`).
//! - [`lua`]: the Lua sources, and the batch script made of them.
//! - [`scripts`]: `EVALSHA` with the `NOSCRIPT` retry, reply parsing.
//! - [`errors`]: Redis errors → [`StoreErrorKind`].
//! - [`outage`]: one log line per outage state change, not per failed request.
//! - [`probe`]: an open breaker's probe (a real script call on the node); the breakers
//!   themselves and the give-up rule are `store/breaker.rs`, shared with the simulator.
//! - [`slots`]: the cluster's slot map, for per-node breakers.
//! - [`version`]: a server older than Redis 5 is refused at connect.
//! - `lua/membership.lua` ([`RedisStore::membership`]): the fleet's live replicas, a sorted set
//!   of replica id → expiry on the Redis clock, under its own hash tag.
//! - [`regions`]: what regions sharing global limits tell each other through the global store
//!   (`lua/regions.lua`; the sharing is `src/regions/`).
//! - [`resets`]: the counter API's reset (its keys deleted) and the fleet's log of resets
//!   (`lua/resets.lua`, under the membership set's hash tag).

mod apply;
mod batch;
mod batch_script;
mod call;
mod client;
mod config;
mod connect;
mod errors;
mod eviction;
mod lua;
mod outage;
mod pool;
mod probe;
mod regions;
mod resets;
mod scripts;
mod sentinel;
mod slots;
mod version;

pub use batch_script::{PACKED_REPLY_BYTES, packed_replies, push_op as push_batch_op};
pub use config::RedisConfig;
pub use lua::{
    BATCH_LUA, BATCHED_LUA, ENTRY_MARK, FIXED_WINDOW_LUA, HASH_STATE_OFF, LEASE_LUA,
    SLIDING_LOG_LUA, SLIDING_WINDOW_LUA, Sources, StateFormat, TOKEN_BUCKET_LUA, batch_lua,
    packed_fixed_window_args, packed_token_bucket_args, writing_hash,
};
pub use scripts::ScriptCall;
pub use slots::slot_of;

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use connect::Connector;
use errors::CallError;
use outage::OutageLog;
use pool::Pool;

use super::breaker::{self, Breakers, Policy};
use super::{StoreError, StoreErrorKind};
use crate::clock::Clock;
use crate::quota::{Op, Outcome};
use crate::redact::redact_url;
use crate::telemetry::{Metrics, StoreMetrics};

/// `lua/membership.lua`, compiled into the binary.
pub const MEMBERSHIP_LUA: &str = include_str!("../../../lua/membership.lua");

/// The Redis store (standalone or cluster). Cheap to share behind the limiter.
pub struct RedisStore {
    pool: Arc<Pool>,
    /// Where the breakers' probe keys live (the key prefix).
    probe_prefix: Arc<str>,
    outage: OutageLog,
    /// Failures that will not heal by themselves (auth, script, protocol), logged apart.
    fatal: OutageLog,
    metrics: StoreMetrics,
    breakers: Arc<Breakers>,
    /// The node name of every op of a standalone Redis.
    standalone: Arc<str>,
    /// Decisions that wait for a busy node and go as one call (`batch.rs`), per node.
    batching: batch::Batchings,
    membership: redis::Script,
    /// `lua/resets.lua`: the fleet's log of counter resets (`resets.rs`).
    resets: redis::Script,
    /// `lua/regions.lua`: what regions sharing global limits tell each other (`regions.rs`).
    regions: redis::Script,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.pool.display_url)
            .field("pool_size", &self.pool.size())
            .field("state", &self.state())
            .finish()
    }
}

impl RedisStore {
    /// Checks `cfg` without any network: the URL parses, and every file it names (TLS
    /// certificates and keys, the password file) can be read and holds what it should. The
    /// startup runs this before it binds a port.
    pub fn check(cfg: &RedisConfig) -> Result<(), StoreError> {
        Connector::parse(cfg).map(|_| ())
    }

    /// Parses the URL, tries to connect once (bounded by the connect timeout) and starts the
    /// keeper. Fails only on a bad configuration: an unreachable Redis is retried in the
    /// background while requests fail fast with transient errors.
    pub async fn connect(cfg: RedisConfig, metrics: &Metrics) -> Result<RedisStore, StoreError> {
        let connector = Connector::parse(&cfg)?;
        let pool = Arc::new(Pool::new(
            connector,
            cfg.pool_size,
            cfg.connect_timeout,
            metrics.store.clone(),
            (redact_url(&cfg.url), cfg.role),
            scripts::Scripts::new(
                cfg.state_format,
                (cfg.wait_replicas > 0).then(|| scripts::Wait {
                    replicas: cfg.wait_replicas,
                    // Validated > 0 in the settings; `max` keeps `WAIT … 0` (for ever) out anyway.
                    timeout_ms: cfg.wait_timeout_ms.max(1),
                    short: metrics.store.wait_short.clone(),
                    log: OutageLog::new(
                        "store WAITs (store_wait_replicas acknowledging each write)",
                    ),
                }),
            ),
        ));
        let connected = pool.tend().await;
        if connected {
            tracing::info!(url = %pool.display_url, connections = pool.size(), "{} connected", pool.role);
        } else if pool.role != "store" {
            tracing::warn!(
                url = %pool.display_url,
                error = %pool.last_connect_error(),
                "{} unreachable at startup; retrying in the background (decisions never wait for it)",
                pool.role
            );
        } else {
            tracing::warn!(
                url = %pool.display_url,
                error = %pool.last_connect_error(),
                "store unreachable at startup; retrying in the background (until it answers the replica is unready, with unready_until_store_answers, and each rule's fallback decides: fallback: error, the default started as ratelimit, answers UNAVAILABLE)"
            );
        }
        pool.start_keeper(connected);
        if pool.slots().is_none() {
            // Exported from the start, at 0 (a cluster's nodes get theirs at their first miss),
            // so `rate()` and the alert see the series before its first miss.
            let _ = metrics
                .store
                .deadline_misses
                .get_or_create(&crate::telemetry::NodeLabels {
                    node: probe::STANDALONE.to_string(),
                });
        }
        Ok(RedisStore {
            pool,
            probe_prefix: cfg.key_prefix.as_str().into(),
            outage: OutageLog::new("store calls"),
            fatal: OutageLog::new(
                "store calls with errors that will not heal by themselves (check credentials, ACLs, scripts, memory)",
            ),
            metrics: metrics.store.clone(),
            breakers: Arc::new(Breakers::new(
                Policy::new(
                    cfg.timeout,
                    cfg.connect_timeout,
                    cfg.breaker_failures,
                    cfg.breaker_probe,
                ),
                Clock::system(),
                metrics.store.clone(),
            )),
            standalone: probe::STANDALONE.into(),
            batching: batch::Batchings::new(cfg.batch_in_flight, cfg.batch_max_ops),
            membership: redis::Script::new(MEMBERSHIP_LUA),
            resets: redis::Script::new(resets::RESETS_LUA),
            regions: redis::Script::new(regions::REGIONS_LUA),
        })
    }

    /// Applies `ops` and returns one result per op, in order (see the module doc for how the
    /// ops travel). Each node's part gives up only when that node stays silent (see "When a
    /// call gives up"); the parts of different cluster nodes run concurrently.
    pub async fn apply_each(self: &Arc<Self>, ops: &[Op]) -> Vec<Result<Outcome, StoreError>> {
        let Some(first) = ops.first() else {
            return Vec::new();
        };
        let started = Instant::now();
        let node = self.node_of(&first.key);
        let out = if ops[1..].iter().all(|op| self.node_of(&op.key) == node) {
            // The common case (a standalone Redis; on a cluster, one descriptor or one hash
            // tag): one node, one call, nothing to group.
            self.apply_on(node, ops).await
        } else {
            self.apply_grouped(ops).await
        };
        self.metrics.observe("apply", started);
        let first_error = out.iter().find_map(|r| r.as_ref().err());
        self.outage
            .record::<()>(&first_error.map_or(Ok(()), |e| Err(e.clone())));
        out
    }

    /// A request's decision budget ran out before its `ops` were answered (the limiter
    /// answered them from the fallback and dropped the call; `limiter/mod.rs`), after the
    /// store's part had `waited`. When that was at least `store_timeout_ms` (the silence a
    /// node is allowed) and the ops are all on one node, that node missed a deadline:
    /// counted in `tollgate_store_deadline_misses_total{node}` and scored against its breaker
    /// (`Breakers::missed`), so a node that keeps missing budgets opens like a silent one, an
    /// overloaded primary stops receiving the load that overloads it, and its probe closes it
    /// again. A shorter wait is this process's own lateness (the request queued here, its
    /// budget mostly spent on arrival), not the node's; a request on several cluster nodes
    /// does not say which of them kept it waiting (the others may have answered in time), so
    /// it blames none: its node's single-node requests do.
    pub fn missed_deadline(&self, ops: &[Op], waited: Duration) {
        if waited < self.breakers.policy().timeout {
            // The caller's own lateness (`Breakers::missed` says why): not the node's.
            return;
        }
        let Some(first) = ops.first() else {
            return;
        };
        let node = self.node_of(&first.key);
        if ops[1..].iter().any(|op| self.node_of(&op.key) != node) {
            return;
        }
        self.metrics
            .deadline_misses
            .get_or_create(&crate::telemetry::NodeLabels {
                node: node.to_string(),
            })
            .inc();
        if self.breakers.missed(&node, waited) {
            self.start_probe(node);
        }
    }

    /// The node that holds `key`: `store` for a standalone Redis, else its primary.
    fn node_of(&self, key: &str) -> Arc<str> {
        match self.pool.slots() {
            Some(slots) => slots.node_of(key),
            None => self.standalone.clone(),
        }
    }

    /// Probes `node` every `breaker_probe_ms` until a script runs on it (the circuit closes),
    /// the slot map names it no more (its breaker is forgotten) or the store is dropped.
    fn start_probe(&self, node: Arc<str>) {
        let pool: Weak<Pool> = Arc::downgrade(&self.pool);
        let prefix = self.probe_prefix.clone();
        let probed = node.clone();
        let probe = move || {
            let (pool, node, prefix) = (pool.upgrade(), probed.clone(), prefix.clone());
            async move {
                match pool {
                    Some(pool) => probe::probe(&pool, &node, &prefix).await,
                    None => breaker::Probe::Stopped,
                }
            }
        };
        let breakers = self.breakers.clone();
        self.breakers
            .clock()
            .spawn(breaker::probe_until_closed(breakers, node, probe));
    }

    /// Heartbeats `replica` into the membership set `key` for `ttl` (or takes it out when
    /// `leave`); returns the number of live replicas. Bounded by the connect timeout: it runs
    /// in the background, not on a request.
    pub async fn membership(
        &self,
        key: &str,
        replica: &str,
        ttl: Duration,
        leave: bool,
    ) -> Result<u64, StoreError> {
        let Some(picked) = self.pool.pick() else {
            return Err(StoreError::new(
                StoreErrorKind::Connection,
                "not connected to Redis",
            ));
        };
        let mut conn = (*picked.conn).clone();
        let mut invocation = self.membership.key(key);
        invocation
            .arg(replica)
            .arg(ttl.as_millis() as u64)
            .arg(u8::from(leave));
        let call = invocation.invoke_async::<u64>(&mut conn);
        match tokio::time::timeout(self.pool.connect_timeout(), call).await {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(e)) => Err(CallError::Redis(e).into_store_error()),
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Timeout,
                "membership heartbeat timed out",
            )),
        }
    }

    /// The nodes whose circuit is open (on a cluster, among those the slot map names now).
    pub fn open_circuits(&self) -> Vec<String> {
        match self.pool.slots() {
            Some(slots) => self.breakers.open_nodes(|n| slots.has_node(n)),
            None => self.breakers.open_nodes(|_| true),
        }
    }

    /// `redis` or `redis-cluster`.
    pub fn name(&self) -> &'static str {
        self.pool.connector().name()
    }

    /// `connected` (connections held and the last call answered), `degraded` (connections
    /// held but the last call failed) or `disconnected` (none held: calls fail fast).
    pub fn state(&self) -> &'static str {
        self.pool.state()
    }

    /// Whether Redis has answered once since start.
    pub fn answered_once(&self) -> bool {
        self.pool.answered_once()
    }

    /// Warnings about the Redis configuration (an evicting `maxmemory-policy`).
    pub fn warnings(&self) -> Vec<String> {
        self.pool.warnings()
    }

    /// The last failed connection attempt's error while not fully connected (see
    /// [`Store::connect_error`](crate::store::Store::connect_error)).
    pub fn connect_error(&self) -> Option<String> {
        (self.pool.state() != "connected").then(|| self.pool.last_connect_error())
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        // Lets the keeper notice at once that the store is gone.
        self.pool.wake_keeper();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unreachable_redis_constructs_and_fails_fast_per_call() {
        // Port 1 on loopback: nothing listens, connections are refused at once.
        let metrics = Metrics::new();
        // Long timeouts: a refusal seen well before them was known at once.
        let cfg = RedisConfig::for_tests("redis://127.0.0.1:1", 2, 2_000, 2_000);
        let store = Arc::new(RedisStore::connect(cfg, &metrics).await.unwrap());
        assert_eq!(store.state(), "disconnected");
        let op = Op {
            key: "k".into(),
            kind: crate::quota::OpKind::TokenBucket {
                capacity: 1,
                refill: 1,
                window_ms: 1000,
            },
            cost: 1,
            action: Default::default(),
        };
        let started = Instant::now();
        let err = store.apply_each(&[op]).await.remove(0).unwrap_err();
        assert!(
            err.is_transient() && err.kind == StoreErrorKind::Connection,
            "{err:?}"
        );
        assert!(
            started.elapsed() < Duration::from_millis(1_000),
            "failed after {:?}, not at once",
            started.elapsed()
        );
        let text = metrics.render();
        for expected in [
            "tollgate_store_connections{state=\"total\"} 2",
            "tollgate_store_errors_total{kind=\"connect\"}",
            "tollgate_store_errors_total{kind=\"connection\"} 1",
        ] {
            assert!(text.contains(expected), "{expected} in {text}");
        }
    }
}
