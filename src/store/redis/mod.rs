//! The shared store: bucket state in one Redis or a Redis Cluster, so every replica of
//! tollgate spends from one quota.
//!
//! # How a request flows
//!
//! [`RedisStore::apply`] gets all bucket ops of one request, takes a connection from the
//! [`pool`] and runs each op as one `EVALSHA` of a Lua script ([`scripts`]):
//!
//! - **Standalone**: every op of the request goes out as one pipeline on one connection: one
//!   round trip per request, however many descriptors it has.
//! - **Cluster**: a cluster pipeline must stay within one hash slot, so ops are grouped by slot
//!   (`Slot::for_key`; every key of one bucket shares its hash tag) and the groups go out
//!   concurrently; the request waits for the slowest node, not for the sum of them.
//!
//! Ops are grouped by node first (`store` for a standalone Redis; the primary's `host:port`
//! from the [`slots`] map on a cluster; when every op is on one node, as always on a
//! standalone Redis, they go out as one call with nothing to group) and each node has a
//! circuit breaker ([`breaker`]): the
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
//! - [`connect`]: the URL → standalone or cluster client; one live connection ([`Conn`]).
//! - [`pool`]: the long-lived connections and the keeper task that reconnects them.
//! - [`scripts`]: the Lua sources, `EVALSHA` with the `NOSCRIPT` retry, reply parsing.
//! - [`errors`]: Redis errors → [`StoreErrorKind`].
//! - [`outage`]: one log line per outage state change, not per failed request.
//! - [`breaker`]: one circuit breaker per node, its probe (a real script call) and when the node
//!   last replied.
//! - [`slots`]: the cluster's slot map, for per-node breakers.
//! - [`version`]: a server older than Redis 5 is refused at connect.
//! - `lua/membership.lua` ([`RedisStore::membership`]): the fleet's live replicas, a sorted set
//!   of replica id → expiry on the Redis clock, under its own hash tag.

mod breaker;
mod client;
mod connect;
mod errors;
mod eviction;
mod outage;
mod pool;
mod scripts;
mod sentinel;
mod slots;
mod version;

pub use scripts::{FIXED_WINDOW_LUA, LEASE_LUA, SLIDING_WINDOW_LUA, ScriptCall, TOKEN_BUCKET_LUA};

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::join_all;
use redis::cluster_routing::Slot;

use breaker::Breakers;
use connect::{Conn, Connector};
use errors::CallError;
use outage::OutageLog;
use pool::Pool;
use scripts::OpResults;

use super::{Op, Outcome, StoreError, StoreErrorKind};
use crate::redact::redact_url;
use crate::telemetry::{KindLabels, Metrics, StoreMetrics};

/// What the Redis store needs to know (built from the settings by `configs.rs`).
#[derive(Clone, Debug)]
pub struct RedisConfig {
    /// `redis://…`, `rediss://…`, `redis+cluster://…` or `rediss+cluster://…`.
    pub url: String,
    /// Multiplexed connections (cluster: cluster connections) to hold.
    pub pool_size: usize,
    /// Bound on making one connection (TCP, AUTH/SELECT, script load) and on keeper pings.
    pub connect_timeout: Duration,
    /// How long a node may stay silent before a call to it gives up (see the module doc).
    pub timeout: Duration,
    /// Consecutive failed calls to a node that open its circuit.
    pub breaker_failures: u32,
    /// How often an open circuit's node is probed.
    pub breaker_probe: Duration,
    /// The bucket keys' prefix: the probe's key is under it too (ACLs that name key patterns).
    pub key_prefix: String,
    /// `rediss://`: the CA file (empty: the system roots), and the client certificate and key
    /// for mutual TLS (both or neither).
    pub tls_ca: String,
    pub tls_cert: String,
    pub tls_key: String,
    /// Credentials from the settings (else the URL's); `password_file` is read at each new
    /// connection.
    pub username: String,
    pub password: String,
    pub password_file: String,
    /// The Sentinels' own credentials (`redis+sentinel://`).
    pub sentinel_username: String,
    pub sentinel_password: String,
    /// `WAIT` after each call's scripts: this many replicas (0: no `WAIT`), within this
    /// many ms (see [`scripts`]).
    pub wait_replicas: u64,
    pub wait_timeout_ms: u64,
}

#[cfg(test)]
impl RedisConfig {
    /// A config for `url` with the given pool and timeouts and nothing else set (tests).
    pub(crate) fn for_tests(url: &str, pool_size: usize, connect_ms: u64, timeout_ms: u64) -> Self {
        RedisConfig {
            url: url.to_string(),
            pool_size,
            connect_timeout: Duration::from_millis(connect_ms),
            timeout: Duration::from_millis(timeout_ms),
            breaker_failures: 3,
            breaker_probe: Duration::from_millis(500),
            key_prefix: "tollgate:".to_string(),
            tls_ca: String::new(),
            tls_cert: String::new(),
            tls_key: String::new(),
            username: String::new(),
            password: String::new(),
            password_file: String::new(),
            sentinel_username: String::new(),
            sentinel_password: String::new(),
            wait_replicas: 0,
            wait_timeout_ms: 5,
        }
    }
}

/// `lua/membership.lua`, compiled into the binary.
pub const MEMBERSHIP_LUA: &str = include_str!("../../../lua/membership.lua");

/// The Redis store (standalone or cluster). Cheap to share behind the limiter.
pub struct RedisStore {
    pool: Arc<Pool>,
    /// A node's silence that gives a call up.
    timeout: Duration,
    /// The most any call waits, however busy its node: `max(connect timeout, timeout)`.
    max_wait: Duration,
    /// Where the breakers' probe keys live (the key prefix).
    probe_prefix: Arc<str>,
    outage: OutageLog,
    /// Failures that will not heal by themselves (auth, script, protocol), logged apart.
    fatal: OutageLog,
    metrics: StoreMetrics,
    breakers: Arc<Breakers>,
    /// The node name of every op of a standalone Redis.
    standalone: Arc<str>,
    membership: redis::Script,
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
    /// Parses the URL, tries to connect once (bounded by the connect timeout) and starts the
    /// keeper. Fails only on a bad configuration: an unreachable Redis is retried in the
    /// background while requests fail fast with transient errors.
    /// Checks `cfg` without any network: the URL parses, and every file it names (TLS
    /// certificates and keys, the password file) can be read and holds what it should. The
    /// startup runs this before it binds a port.
    pub fn check(cfg: &RedisConfig) -> Result<(), StoreError> {
        Connector::parse(cfg).map(|_| ())
    }

    pub async fn connect(cfg: RedisConfig, metrics: &Metrics) -> Result<RedisStore, StoreError> {
        let connector = Connector::parse(&cfg)?;
        let pool = Arc::new(Pool::new(
            connector,
            cfg.pool_size,
            cfg.connect_timeout,
            metrics.store.clone(),
            redact_url(&cfg.url),
            (cfg.wait_replicas > 0).then(|| scripts::Wait {
                replicas: cfg.wait_replicas,
                // Validated > 0 in the settings; `max` keeps `WAIT … 0` (for ever) out anyway.
                timeout_ms: cfg.wait_timeout_ms.max(1),
                short: metrics.store.wait_short.clone(),
                log: OutageLog::new("store WAITs (store_wait_replicas acknowledging each write)"),
            }),
        ));
        let connected = pool.tend().await;
        if connected {
            tracing::info!(url = %pool.display_url, connections = pool.size(), "store connected");
        } else {
            tracing::warn!(
                url = %pool.display_url,
                error = %pool.last_connect_error(),
                "store unreachable at startup; the fallback decides until it answers, retrying in the background"
            );
        }
        pool.start_keeper(connected);
        Ok(RedisStore {
            pool,
            timeout: cfg.timeout,
            max_wait: cfg.connect_timeout.max(cfg.timeout),
            probe_prefix: cfg.key_prefix.as_str().into(),
            outage: OutageLog::new("store calls"),
            fatal: OutageLog::new(
                "store calls with errors that will not heal by themselves (check credentials, ACLs, scripts, memory)",
            ),
            metrics: metrics.store.clone(),
            breakers: Arc::new(Breakers::new(
                cfg.breaker_failures,
                cfg.breaker_probe,
                metrics.store.clone(),
            )),
            standalone: breaker::STANDALONE.into(),
            membership: redis::Script::new(MEMBERSHIP_LUA),
        })
    }

    /// Applies `ops` and returns one result per op, in order (see the module doc for how the
    /// ops travel). Each node's part gives up only when that node stays silent (see "When a
    /// call gives up"); the parts of different cluster nodes run concurrently.
    pub async fn apply_each(&self, ops: &[Op]) -> Vec<Result<Outcome, StoreError>> {
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

    /// Every op of `ops` on `node`, as one call.
    async fn apply_on(&self, node: Arc<str>, ops: &[Op]) -> Vec<Result<Outcome, StoreError>> {
        let result = if self.breakers.is_open(&node) {
            Err(circuit_open(&node))
        } else {
            let result = match self.pool.pick() {
                None => Err(self.not_connected()),
                Some(picked) => {
                    let group: Vec<&Op> = ops.iter().collect();
                    let mut conn = (*picked.conn).clone();
                    let result = self.call(&node, &mut conn, &group).await;
                    self.judge(&picked, std::slice::from_ref(&result));
                    result
                }
            };
            self.settle(&node, &result);
            result
        };
        match result {
            Ok(results) => results,
            Err(e) => vec![Err(e); ops.len()],
        }
    }

    /// Ops on several nodes (a cluster request whose descriptors hash to different slots): one
    /// call per node, concurrently, on one cluster connection.
    async fn apply_grouped(&self, ops: &[Op]) -> Vec<Result<Outcome, StoreError>> {
        // Few ops per request: a linear scan beats hashing.
        let mut groups: Vec<(Arc<str>, Vec<usize>)> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let node = self.node_of(&op.key);
            match groups.iter_mut().find(|g| g.0 == node) {
                Some(g) => g.1.push(i),
                None => groups.push((node, vec![i])),
            }
        }
        let mut out: Vec<Option<Result<Outcome, StoreError>>> = vec![None; ops.len()];
        let mut calls = Vec::with_capacity(groups.len());
        for (node, at) in &groups {
            if self.breakers.is_open(node) {
                let e = circuit_open(node);
                for &i in at {
                    out[i] = Some(Err(e.clone()));
                }
            } else {
                calls.push((node, at));
            }
        }
        if !calls.is_empty() {
            let results = match self.pool.pick() {
                None => {
                    let e = self.not_connected();
                    calls.iter().map(|_| Err(e.clone())).collect()
                }
                Some(picked) => {
                    let results = join_all(calls.iter().map(|(node, at)| {
                        let group: Vec<&Op> = at.iter().map(|&i| &ops[i]).collect();
                        let mut conn = (*picked.conn).clone();
                        async move { self.call(node, &mut conn, &group).await }
                    }))
                    .await;
                    self.judge(&picked, &results);
                    results
                }
            };
            for ((node, at), result) in calls.iter().zip(results) {
                self.settle(node, &result);
                match result {
                    Ok(results) => {
                        for (&i, r) in at.iter().zip(results) {
                            out[i] = Some(r);
                        }
                    }
                    Err(e) => {
                        for &i in at.iter() {
                            out[i] = Some(Err(e.clone()));
                        }
                    }
                }
            }
        }
        out.into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(StoreError::new(
                        StoreErrorKind::Protocol,
                        "an op got no answer",
                    ))
                })
            })
            .collect()
    }

    /// The connection itself is judged by its calls of one request: failed when all failed.
    fn judge(&self, picked: &pool::Picked, results: &[Result<OpResults, StoreError>]) {
        let failed: Vec<&StoreError> = results.iter().filter_map(call_error).collect();
        match failed.first() {
            Some(e) if failed.len() == results.len() => {
                self.pool
                    .call_failed(picked, e.kind, errors::is_readonly(e))
            }
            _ => self.pool.call_succeeded(picked),
        }
    }

    /// One node's call, for its breaker, the error counter (one count per failed op) and the
    /// log. The node failed when the call did or every op of it did.
    fn settle(&self, node: &Arc<str>, result: &Result<OpResults, StoreError>) {
        let count = |e: &StoreError| {
            self.metrics
                .errors
                .get_or_create(&KindLabels {
                    kind: e.kind.label(),
                })
                .inc();
            if !e.is_transient() {
                // Auth, OOM-like script errors, bad replies: these will not heal by
                // themselves, so they get a line of their own (rate-limited).
                self.fatal.record(&Err::<(), _>(e.clone()));
            }
        };
        match result {
            Ok(results) => results
                .iter()
                .filter_map(|r| r.as_ref().err())
                .for_each(count),
            Err(e) => count(e),
        }
        match call_error(result) {
            None => self.breakers.succeeded(node),
            Some(e) => {
                if self.breakers.failed(node, e.kind) {
                    self.start_probe(node.clone());
                }
            }
        }
    }

    fn not_connected(&self) -> StoreError {
        StoreError::new(
            StoreErrorKind::Connection,
            format!(
                "not connected to Redis ({})",
                self.pool.last_connect_error()
            ),
        )
    }

    /// One node's ops on `conn`. Gives up only when `node` has been silent for the timeout
    /// (see the module doc), or after `max_wait`.
    async fn call(
        &self,
        node: &Arc<str>,
        conn: &mut Conn,
        ops: &[&Op],
    ) -> Result<OpResults, StoreError> {
        let started = Instant::now();
        let hard = started + self.max_wait;
        let run = run(conn, ops, &self.pool.scripts);
        tokio::pin!(run);
        // Time this process was too busy to look at the call: how late its timer fired, and
        // how long it takes to get through the run queue once (a burst, CPU throttling). The
        // node's replies may be waiting unread all that time, so it is not node silence.
        let mut lag = Duration::ZERO;
        let mut deadline = started + self.timeout;
        // Whether the node's silence was confirmed by a last short pause (once per call).
        let mut confirmed = false;
        let done = loop {
            tokio::select! {
                biased;
                done = &mut run => break Some(done),
                _ = tokio::time::sleep_until(deadline.into()) => {}
            }
            let fired = Instant::now();
            lag += fired.saturating_duration_since(deadline);
            // Each yield lets the runtime poll its I/O driver and run the tasks queued ahead of
            // this one, the connection's reader among them, before the call is judged.
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
            if let Some(done) = (&mut run).now_or_never() {
                break Some(done);
            }
            let now = Instant::now();
            lag += now - fired;
            let heard = self
                .breakers
                .last_reply(node)
                .map_or(started, |t| t.max(started));
            let silent_until = heard + self.timeout + lag;
            if now >= hard {
                break None;
            }
            if now >= silent_until {
                if confirmed {
                    break None;
                }
                // Before giving up, one short pause (a quarter of the timeout): on an
                // overcommitted host the connection's reader can sit unscheduled on another
                // worker, or another thread, with the node's replies already in its socket.
                // The pause lets it run; a reply heard meanwhile (this call's or another's)
                // keeps the call waiting. A node that is really silent costs it a quarter of
                // the timeout more.
                confirmed = true;
                deadline = (now + (self.timeout / 4).max(Duration::from_millis(1))).min(hard);
                continue;
            }
            deadline = silent_until.min(hard);
        };
        match done {
            Some(Ok(results)) => {
                self.breakers.replied(node);
                Ok(results)
            }
            Some(Err(e)) => {
                let e = e.into_store_error();
                if !e.is_transient() {
                    // The node answered, with an error.
                    self.breakers.replied(node);
                }
                Err(e)
            }
            None => Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!(
                    "no reply from Redis ({node}) to any call for {} ms",
                    self.timeout.as_millis()
                ),
            )),
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
        let breakers = self.breakers.clone();
        let prefix = self.probe_prefix.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(breakers.probe_every).await;
                let Some(pool) = pool.upgrade() else { return };
                match breaker::probe(&pool, &node, &prefix).await {
                    breaker::Probe::Ran => {
                        breakers.replied(&node);
                        breakers.close(&node);
                        return;
                    }
                    breaker::Probe::Gone => {
                        breakers.forget(&node);
                        return;
                    }
                    breaker::Probe::Failed => {}
                }
            }
        });
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

/// The error that fails a node's call as a whole: the call's own, or the first op's when every
/// op failed.
fn call_error(result: &Result<OpResults, StoreError>) -> Option<&StoreError> {
    match result {
        Err(e) => Some(e),
        Ok(results) if !results.is_empty() && results.iter().all(|r| r.is_err()) => {
            results.first().and_then(|r| r.as_ref().err())
        }
        Ok(_) => None,
    }
}

fn circuit_open(node: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::CircuitOpen,
        format!("circuit open for {node}"),
    )
}

/// Runs `ops` on `conn`: one pipeline (standalone) or one pipeline per hash slot, concurrently
/// (cluster). Results come back in the order of `ops`; a slot's pipeline that failed fails its
/// own ops only.
async fn run(
    conn: &mut Conn,
    ops: &[&Op],
    scripts: &scripts::Scripts,
) -> Result<OpResults, CallError> {
    let c = match conn {
        Conn::Standalone(c) => return scripts::eval_ops(c, ops, scripts).await,
        Conn::Cluster(c) => c,
    };
    // The common case (one descriptor, or all in one slot): one pipeline, nothing to group, so
    // nothing allocated for grouping.
    if let Some((first, rest)) = ops.split_first() {
        let slot = Slot::for_key(&first.key);
        if rest.iter().all(|op| Slot::for_key(&op.key) == slot) {
            return scripts::eval_ops(c, ops, scripts).await;
        }
    }
    // Few ops per request: a linear scan beats hashing.
    let mut groups: Vec<(Slot, Vec<&Op>, Vec<usize>)> = Vec::new();
    for (i, &op) in ops.iter().enumerate() {
        let slot = Slot::for_key(&op.key);
        match groups.iter_mut().find(|g| g.0 == slot) {
            Some(g) => {
                g.1.push(op);
                g.2.push(i);
            }
            None => groups.push((slot, vec![op], vec![i])),
        }
    }
    let calls = groups.iter().map(|(_, group, _)| {
        let mut c = c.clone();
        async move { scripts::eval_ops(&mut c, group, scripts).await }
    });
    let mut results = join_all(calls).await;
    if !results.is_empty()
        && results.iter().all(Result::is_err)
        && let Err(e) = results.swap_remove(0)
    {
        // No slot's pipeline answered: the call failed as a whole (a lost node, say).
        return Err(e);
    }
    let mut out: Vec<Option<Result<Outcome, StoreError>>> = vec![None; ops.len()];
    for ((_, _, at), result) in groups.iter().zip(results) {
        match result {
            Ok(outcomes) => {
                for (&i, o) in at.iter().zip(outcomes) {
                    out[i] = Some(o);
                }
            }
            Err(e) => {
                let e = e.into_store_error();
                for &i in at {
                    out[i] = Some(Err(e.clone()));
                }
            }
        }
    }
    Ok(out
        .into_iter()
        .map(|o| {
            o.unwrap_or_else(|| {
                Err(StoreError::new(
                    StoreErrorKind::Protocol,
                    "an op got no answer",
                ))
            })
        })
        .collect())
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
        let store = RedisStore::connect(cfg, &metrics).await.unwrap();
        assert_eq!(store.state(), "disconnected");
        let op = Op {
            key: "k".into(),
            kind: crate::store::OpKind::TokenBucket {
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
