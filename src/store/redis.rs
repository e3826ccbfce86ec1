//! The shared store: bucket state in one Redis or a Redis Cluster, so every replica of
//! tollgate spends from one quota.
//!
//! # How a request flows
//!
//! [`RedisStore::apply`] gets all bucket ops of one request. Each op becomes one `EVALSHA` of
//! a script from `lua/` (`token_bucket.lua`, `fixed_window.lua`, `sliding_window.lua`): the
//! read-decide-write of a bucket runs atomically inside Redis, on Redis `TIME`, mirroring
//! `limiter::bucket` line for line. Then:
//!
//! - **Standalone**: every op of the request goes out as one pipeline on one connection: one
//!   round trip per request, however many descriptors it has.
//! - **Cluster**: a cluster pipeline must stay within one hash slot, so ops are grouped by slot
//!   (`keys::cluster_slot`; every key of one bucket shares its hash tag) and the groups go out
//!   concurrently; the request waits for the slowest node, not for the sum of them.
//!
//! The whole call is bounded by `store_timeout_ms` (`StoreError { kind: "timeout" }`), so a
//! slow or paused Redis never stalls a request past the timeout. A script that timed out on the
//! client side may still run once Redis resumes (the command was already sent): its tokens are
//! spent although the request was answered UNAVAILABLE.
//!
//! # Connections
//!
//! The store holds `store_pool_size` long-lived multiplexed connections
//! ([`MultiplexedConnection`] for a standalone Redis, [`ClusterConnection`] for a cluster, which
//! itself keeps one connection per node and follows the slot map). Each request picks one
//! round-robin; a multiplexed connection pipelines concurrent requests, so there is no
//! checkout. A pool (deadpool-redis) is deliberately not used: its checkout runs UNWATCH+PING
//! on recycle, one extra round trip per request, and buys nothing when connections are shared
//! rather than lent. Connections are made with `redis::Client` / `ClusterClient` directly.
//!
//! A background keeper task fills empty slots, loads the scripts on each new connection
//! (`SCRIPT LOAD`), pings idle or suspect connections once a second and replaces those that no
//! longer answer; it backs off while Redis is unreachable. A Redis that is down at startup
//! does not stop tollgate: the store starts anyway, requests fail fast with a transient
//! `connection` error (gRPC UNAVAILABLE) until the keeper connects.
//!
//! # Scripts
//!
//! Scripts are sent by SHA1 (`EVALSHA`). When Redis answers `NOSCRIPT` (a restart, a failover
//! to a fresh replica, `SCRIPT FLUSH`), the failed ops, and only those, are retried once with
//! `EVAL` and the full source, which runs them and caches the script again on that node; ops
//! of the same pipeline that did run are not repeated.
//!
//! # Errors
//!
//! [`StoreError::kind`]s: `timeout` (no answer within `store_timeout_ms`), `connection` (not
//! connected, or the connection broke) and `unavailable` (`CLUSTERDOWN`, `TRYAGAIN`, `LOADING`,
//! `BUSY`, a redirect that did not settle, …) are transient; `script` (a script or data
//! error), `auth` and `protocol` (a reply of the wrong shape) are not; `config` (a bad URL)
//! only comes from [`RedisStore::connect`]. The limiter counts failed calls by kind in
//! `tollgate_store_errors`; this module adds `kind="connect"` for failed (re)connection
//! attempts of the keeper, so an outage shows even while no request arrives.
//!
//! TLS (`rediss://`) is not built in: it would pull a TLS stack (rustls and a crypto backend)
//! into every build. Such URLs are refused at startup with a clear error.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::Poll;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::sync::Notify;

use super::{Op, OpKind, Outcome, StoreError};
use crate::keys;
use crate::settings::{Settings, redact_url};
use crate::telemetry::{self, KindLabels, Metrics, OpLabels, StateLabels};

/// `lua/token_bucket.lua`, compiled into the binary.
pub const TOKEN_BUCKET_LUA: &str = include_str!("../../lua/token_bucket.lua");
/// `lua/fixed_window.lua`, compiled into the binary.
pub const FIXED_WINDOW_LUA: &str = include_str!("../../lua/fixed_window.lua");
/// `lua/sliding_window.lua`, compiled into the binary.
pub const SLIDING_WINDOW_LUA: &str = include_str!("../../lua/sliding_window.lua");

/// How often the keeper looks at the connections (and pings idle ones).
const TICK: Duration = Duration::from_secs(1);
/// Reconnect back-off while Redis is unreachable: doubles from the first to the last.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// What the Redis store needs to know (taken from [`Settings`]).
#[derive(Clone, Debug)]
pub struct RedisConfig {
    /// `redis://…`, `rediss://…`, `redis+cluster://…` or `rediss+cluster://…`.
    pub url: String,
    /// Multiplexed connections (cluster: cluster connections) to hold.
    pub pool_size: usize,
    /// Bound on making one connection (TCP, AUTH/SELECT, script load) and on keeper pings.
    pub connect_timeout: Duration,
    /// Bound on one `apply` call, retries included.
    pub timeout: Duration,
}

impl RedisConfig {
    pub fn from_settings(s: &Settings) -> Self {
        RedisConfig {
            url: s.store.clone(),
            pool_size: s.store_pool_size.max(1),
            connect_timeout: Duration::from_millis(s.store_connect_timeout_ms),
            timeout: Duration::from_millis(s.store_timeout_ms),
        }
    }
}

/// Which script an op runs and its `ARGV`, exactly as sent (see the scripts' headers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScriptCall {
    /// `token_bucket.lua`: capacity, refill, window_ms, cost (unclamped: the script reads it
    /// as the same double Rust's `cost as f64` is).
    TokenBucket([u64; 4]),
    /// `fixed_window.lua`: limit, window_ms, cost clamped to limit + 1 (same answers, exact
    /// numbers; see the script's header).
    FixedWindow([u64; 3]),
    /// `sliding_window.lua`: limit, window_ms, cost (unclamped, as for the token bucket:
    /// refused takes count nothing, so the cost is only compared, never stored).
    SlidingWindow([u64; 3]),
}

impl ScriptCall {
    pub fn for_op(op: &Op) -> Self {
        match op.kind {
            OpKind::TokenBucket {
                capacity,
                refill,
                window_ms,
            } => ScriptCall::TokenBucket([capacity, refill, window_ms, op.cost]),
            OpKind::FixedWindow { limit, window_ms } => {
                ScriptCall::FixedWindow([limit, window_ms, op.cost.min(limit.saturating_add(1))])
            }
            OpKind::SlidingWindow { limit, window_ms } => {
                ScriptCall::SlidingWindow([limit, window_ms, op.cost])
            }
        }
    }

    pub fn source(&self) -> &'static str {
        match self {
            ScriptCall::TokenBucket(_) => TOKEN_BUCKET_LUA,
            ScriptCall::FixedWindow(_) => FIXED_WINDOW_LUA,
            ScriptCall::SlidingWindow(_) => SLIDING_WINDOW_LUA,
        }
    }

    pub fn argv(&self) -> &[u64] {
        match self {
            ScriptCall::TokenBucket(a) => a,
            ScriptCall::FixedWindow(a) => a,
            ScriptCall::SlidingWindow(a) => a,
        }
    }
}

/// The SHA1s `EVALSHA` names the scripts by.
#[derive(Debug)]
struct Scripts {
    token_bucket: String,
    fixed_window: String,
    sliding_window: String,
}

impl Scripts {
    fn new() -> Self {
        Scripts {
            token_bucket: redis::Script::new(TOKEN_BUCKET_LUA).get_hash().to_string(),
            fixed_window: redis::Script::new(FIXED_WINDOW_LUA).get_hash().to_string(),
            sliding_window: redis::Script::new(SLIDING_WINDOW_LUA)
                .get_hash()
                .to_string(),
        }
    }

    fn sha(&self, call: &ScriptCall) -> &str {
        match call {
            ScriptCall::TokenBucket(_) => &self.token_bucket,
            ScriptCall::FixedWindow(_) => &self.fixed_window,
            ScriptCall::SlidingWindow(_) => &self.sliding_window,
        }
    }
}

/// How connections are made: a parsed URL.
enum Connector {
    Standalone {
        client: redis::Client,
        config: AsyncConnectionConfig,
    },
    Cluster(ClusterClient),
}

/// One live connection; both kinds are cheap handles onto a shared driver task.
#[derive(Clone)]
enum Conn {
    Standalone(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// Lets commands that need no per-topology handling (SCRIPT LOAD) use either kind.
impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::Standalone(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Standalone(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// One entry of the connection set.
struct Slot {
    conn: ArcSwapOption<Conn>,
    /// A call on it timed out or failed: the keeper should check it now.
    suspect: AtomicBool,
    /// When it last answered (ms since the store started).
    last_ok_ms: AtomicU64,
}

/// A failure of one store call, before it becomes a [`StoreError`].
#[derive(Debug, thiserror::Error)]
enum CallError {
    #[error("{0}")]
    Redis(#[from] RedisError),
    #[error("unexpected reply from Redis: {0}")]
    Reply(String),
}

struct StoreMetrics {
    duration: Family<OpLabels, Histogram, fn() -> Histogram>,
    connections: Family<StateLabels, Gauge>,
    errors: Family<KindLabels, Counter>,
}

impl StoreMetrics {
    fn register(metrics: &Metrics) -> Self {
        let duration =
            Family::<OpLabels, Histogram, fn() -> Histogram>::new_with_constructor(|| {
                // 50 µs … ~0.8 s: a store call should take well under a millisecond on a LAN.
                Histogram::new(exponential_buckets(0.000_05, 2.0, 15))
            });
        let connections = Family::<StateLabels, Gauge>::default();
        metrics.with_registry(|r| {
            r.register(
                telemetry::STORE_CALL_DURATION,
                "Time of one store call by operation (apply: one request's bucket ops; connect; ping)",
                duration.clone(),
            );
            r.register(
                telemetry::STORE_CONNECTIONS,
                "Store connections held (state=connected) out of the configured pool (state=total)",
                connections.clone(),
            );
        });
        StoreMetrics {
            duration,
            connections,
            errors: metrics.store_errors.clone(),
        }
    }

    fn observe(&self, op: &'static str, started: Instant) {
        self.duration
            .get_or_create(&OpLabels { op })
            .observe(started.elapsed().as_secs_f64());
    }
}

struct Inner {
    connector: Connector,
    slots: Box<[Slot]>,
    next: AtomicUsize,
    scripts: Scripts,
    timeout: Duration,
    connect_timeout: Duration,
    /// Wakes the keeper early (a connection broke). Shared with the keeper task, which must not
    /// hold `Inner` alive while it waits.
    wake: Arc<Notify>,
    /// False after a call failed transiently, true again after one succeeded.
    healthy: AtomicBool,
    /// Why the last connection attempt failed, for the "not connected" error.
    last_connect_error: Mutex<String>,
    started: Instant,
    metrics: StoreMetrics,
    /// The URL with its password replaced, for logs.
    display_url: String,
}

/// The Redis store (standalone or cluster). Cheap to share behind the limiter.
pub struct RedisStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.inner.display_url)
            .field("pool_size", &self.inner.slots.len())
            .field("state", &self.state())
            .finish()
    }
}

fn config_error(message: String) -> StoreError {
    StoreError {
        kind: "config",
        message,
        transient: false,
    }
}

impl Connector {
    fn parse(cfg: &RedisConfig) -> Result<Connector, StoreError> {
        let url = cfg.url.as_str();
        let shown = redact_url(url);
        if url.starts_with("rediss://") || url.starts_with("rediss+cluster://") {
            return Err(config_error(format!(
                "{shown}: TLS is not built into this tollgate (it would add a TLS stack to every build); \
                 use redis:// / redis+cluster:// on a trusted network or a TLS sidecar"
            )));
        }
        if let Some(rest) = url.strip_prefix("redis+cluster://") {
            let (auth, rest) = match rest.rsplit_once('@') {
                Some((auth, hosts)) => (Some(auth), hosts),
                None => (None, rest),
            };
            let (hosts, tail) = match rest.find(['/', '?']) {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            if !matches!(tail, "" | "/" | "/0") {
                return Err(config_error(format!(
                    "{shown}: a cluster URL takes no database or options (Redis Cluster has only database 0)"
                )));
            }
            let nodes: Vec<String> = hosts
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(|h| match auth {
                    // Credentials apply to every node.
                    Some(auth) => format!("redis://{auth}@{h}"),
                    None => format!("redis://{h}"),
                })
                .collect();
            if nodes.is_empty() {
                return Err(config_error(format!(
                    "{shown}: no cluster nodes (expected host:port,host:port,…)"
                )));
            }
            let client = ClusterClient::builder(nodes)
                .connection_timeout(cfg.connect_timeout)
                // Bounds the cluster client's internal work (slot refreshes, reconnects); each
                // request is bounded by our own, shorter timeout.
                .response_timeout(cfg.connect_timeout.max(cfg.timeout))
                .build()
                .map_err(|e| config_error(format!("{shown}: {e}")))?;
            return Ok(Connector::Cluster(client));
        }
        if !url.starts_with("redis://") {
            return Err(config_error(format!(
                "{shown}: expected redis://, rediss://, redis+cluster:// or rediss+cluster://"
            )));
        }
        let client = redis::Client::open(url).map_err(|e| config_error(format!("{shown}: {e}")))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(cfg.connect_timeout))
            // Every call is bounded by our own timeout (tokio::time::timeout) instead.
            .set_response_timeout(None);
        Ok(Connector::Standalone { client, config })
    }

    async fn connect(&self) -> Result<Conn, RedisError> {
        match self {
            Connector::Standalone { client, config } => client
                .get_multiplexed_async_connection_with_config(config)
                .await
                .map(Conn::Standalone),
            Connector::Cluster(client) => client.get_async_connection().await.map(Conn::Cluster),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Connector::Standalone { .. } => "redis",
            Connector::Cluster(_) => "redis-cluster",
        }
    }
}

impl RedisStore {
    /// Parses the URL, tries to connect once (bounded by the connect timeout) and starts the
    /// keeper. Fails only on a bad configuration: an unreachable Redis is retried in the
    /// background while requests fail fast with transient errors.
    pub async fn connect(cfg: RedisConfig, metrics: &Metrics) -> Result<RedisStore, StoreError> {
        let connector = Connector::parse(&cfg)?;
        let pool_size = cfg.pool_size.max(1);
        let inner = Arc::new(Inner {
            connector,
            slots: (0..pool_size)
                .map(|_| Slot {
                    conn: ArcSwapOption::empty(),
                    suspect: AtomicBool::new(false),
                    last_ok_ms: AtomicU64::new(0),
                })
                .collect(),
            next: AtomicUsize::new(0),
            scripts: Scripts::new(),
            timeout: cfg.timeout,
            connect_timeout: cfg.connect_timeout,
            wake: Arc::new(Notify::new()),
            healthy: AtomicBool::new(false),
            last_connect_error: Mutex::new("not connected yet".to_string()),
            started: Instant::now(),
            metrics: StoreMetrics::register(metrics),
            display_url: redact_url(&cfg.url),
        });
        inner
            .metrics
            .connections
            .get_or_create(&StateLabels { state: "total" })
            .set(pool_size as i64);
        let connected = inner.tend().await;
        if connected {
            tracing::info!(url = %inner.display_url, connections = pool_size, "store connected");
        } else {
            tracing::warn!(
                url = %inner.display_url,
                error = %inner.last_connect_error(),
                "store unreachable at startup; requests fail (UNAVAILABLE) until it answers, retrying in the background"
            );
        }
        tokio::spawn(keeper(
            Arc::downgrade(&inner),
            inner.wake.clone(),
            connected,
        ));
        Ok(RedisStore { inner })
    }

    /// Applies `ops` in order and returns one outcome per op (see the module doc for how the
    /// ops travel). All of it is bounded by the store timeout.
    pub async fn apply(&self, ops: &[Op]) -> Result<Vec<Outcome>, StoreError> {
        let started = Instant::now();
        let result = self.inner.apply(ops).await;
        self.inner.metrics.observe("apply", started);
        result
    }

    /// `redis` or `redis-cluster`.
    pub fn name(&self) -> &'static str {
        self.inner.connector.name()
    }

    /// `connected` (connections held and the last call answered), `degraded` (connections
    /// held but the last call failed) or `disconnected` (none held: calls fail fast).
    pub fn state(&self) -> &'static str {
        self.inner.state()
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        // Lets the keeper notice at once that the store is gone.
        self.inner.wake.notify_one();
    }
}

impl Inner {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn state(&self) -> &'static str {
        let held = self
            .slots
            .iter()
            .filter(|s| s.conn.load().is_some())
            .count();
        if held == 0 {
            "disconnected"
        } else if self.healthy.load(Ordering::Relaxed) {
            "connected"
        } else {
            "degraded"
        }
    }

    fn last_connect_error(&self) -> String {
        self.last_connect_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn update_gauge(&self) {
        let held = self
            .slots
            .iter()
            .filter(|s| s.conn.load().is_some())
            .count();
        self.metrics
            .connections
            .get_or_create(&StateLabels { state: "connected" })
            .set(held as i64);
    }

    /// The next held connection, round-robin.
    fn pick(&self) -> Option<(usize, Arc<Conn>)> {
        let n = self.slots.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n).find_map(|i| {
            let idx = (start + i) % n;
            self.slots[idx].conn.load_full().map(|c| (idx, c))
        })
    }

    async fn apply(&self, ops: &[Op]) -> Result<Vec<Outcome>, StoreError> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let Some((idx, held)) = self.pick() else {
            self.wake.notify_one();
            return Err(StoreError {
                kind: "connection",
                message: format!("not connected to Redis ({})", self.last_connect_error()),
                transient: true,
            });
        };
        let mut conn = (*held).clone();
        let slot = &self.slots[idx];
        let result = tokio::time::timeout(self.timeout, run(&mut conn, ops, &self.scripts)).await;
        match result {
            Ok(Ok(outcomes)) => {
                slot.last_ok_ms.store(self.now_ms(), Ordering::Relaxed);
                self.healthy.store(true, Ordering::Relaxed);
                Ok(outcomes)
            }
            Ok(Err(CallError::Redis(e))) => {
                let err = classify(&e);
                if err.transient {
                    self.healthy.store(false, Ordering::Relaxed);
                }
                if err.kind == "connection" {
                    // A standalone multiplexed connection that lost its socket never recovers:
                    // drop it so other requests skip it. A cluster connection reconnects to
                    // nodes by itself; the keeper checks it and replaces it if it must.
                    if let Conn::Standalone(_) = *held {
                        slot.conn.compare_and_swap(&Some(held.clone()), None);
                        self.update_gauge();
                    }
                    slot.suspect.store(true, Ordering::Relaxed);
                    self.wake.notify_one();
                }
                Err(err)
            }
            Ok(Err(e @ CallError::Reply(_))) => Err(StoreError {
                kind: "protocol",
                message: e.to_string(),
                transient: false,
            }),
            Err(_) => {
                self.healthy.store(false, Ordering::Relaxed);
                slot.suspect.store(true, Ordering::Relaxed);
                self.wake.notify_one();
                Err(StoreError {
                    kind: "timeout",
                    message: format!(
                        "no answer from Redis within {} ms",
                        self.timeout.as_millis()
                    ),
                    transient: true,
                })
            }
        }
    }

    /// Opens one connection and loads the scripts on it, within the connect timeout.
    async fn open(&self) -> Result<Conn, String> {
        let started = Instant::now();
        let attempt = async {
            let mut conn = self.connector.connect().await?;
            for (source, sha) in [
                (TOKEN_BUCKET_LUA, &self.scripts.token_bucket),
                (FIXED_WINDOW_LUA, &self.scripts.fixed_window),
                (SLIDING_WINDOW_LUA, &self.scripts.sliding_window),
            ] {
                // On a cluster, SCRIPT LOAD goes to every primary. A refusal (an ACL without
                // SCRIPT, say) is not fatal: EVALSHA's NOSCRIPT falls back to EVAL.
                let load = redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(source)
                    .query_async::<String>(&mut conn)
                    .await;
                match load {
                    Ok(got) if got == *sha => {}
                    Ok(got) => {
                        tracing::error!(expected = %sha, %got, "Redis computed another script SHA1")
                    }
                    Err(e) if e.is_io_error() || e.is_unrecoverable_error() => return Err(e),
                    Err(e) => {
                        tracing::warn!(error = %e, "SCRIPT LOAD refused; scripts will be sent with EVAL")
                    }
                }
            }
            Ok::<Conn, RedisError>(conn)
        };
        let result = match tokio::time::timeout(self.connect_timeout, attempt).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "connect timed out after {} ms",
                self.connect_timeout.as_millis()
            )),
        };
        self.metrics.observe("connect", started);
        if let Err(e) = &result {
            self.metrics
                .errors
                .get_or_create(&KindLabels { kind: "connect" })
                .inc();
            *self
                .last_connect_error
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = e.clone();
        }
        result
    }

    /// Whether `conn` answers a PING within the connect timeout; `Err` carries the error when
    /// it failed rather than timed out.
    async fn ping(&self, conn: &Conn) -> Result<bool, RedisError> {
        let started = Instant::now();
        let ping = redis::cmd("PING");
        let answered = tokio::time::timeout(self.connect_timeout, async {
            match conn.clone() {
                Conn::Standalone(mut c) => ping.query_async::<Value>(&mut c).await.map(|_| ()),
                // One node is enough to know the handle works; per-node health is the cluster
                // client's business (it reconnects and refreshes slots on its own).
                Conn::Cluster(mut c) => c
                    .route_command(ping, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
                    .await
                    .map(|_| ()),
            }
        })
        .await;
        self.metrics.observe("ping", started);
        match answered {
            Ok(Ok(())) => Ok(true),
            Ok(Err(e)) => Err(e),
            Err(_) => Ok(false),
        }
    }

    /// One keeper round: fill empty slots, check suspect and idle ones. Stops at the first
    /// failed connection attempt (Redis is likely down; the next round comes after a back-off).
    /// Returns whether every slot holds a connection that answered.
    async fn tend(&self) -> bool {
        let mut all_ok = true;
        for slot in self.slots.iter() {
            let held = slot.conn.load_full();
            // What a replacement swaps out: `held`, or nothing once a dead one was dropped.
            let mut expected = held.clone();
            if let Some(conn) = &held {
                let idle = self
                    .now_ms()
                    .saturating_sub(slot.last_ok_ms.load(Ordering::Relaxed));
                let suspect = slot.suspect.load(Ordering::Relaxed);
                if !suspect && idle < TICK.as_millis() as u64 {
                    continue;
                }
                match self.ping(conn).await {
                    Ok(true) => {
                        slot.suspect.store(false, Ordering::Relaxed);
                        slot.last_ok_ms.store(self.now_ms(), Ordering::Relaxed);
                        self.healthy.store(true, Ordering::Relaxed);
                        continue;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        // A standalone connection whose socket is gone never recovers.
                        if matches!(**conn, Conn::Standalone(_))
                            && classify(&e).kind == "connection"
                        {
                            slot.conn.compare_and_swap(&held, None);
                            expected = None;
                        }
                    }
                }
                self.healthy.store(false, Ordering::Relaxed);
            }
            match self.open().await {
                Ok(conn) => {
                    // Replace only what we looked at: a request may have cleared it meanwhile.
                    slot.conn.compare_and_swap(&expected, Some(Arc::new(conn)));
                    slot.suspect.store(false, Ordering::Relaxed);
                    slot.last_ok_ms.store(self.now_ms(), Ordering::Relaxed);
                    self.healthy.store(true, Ordering::Relaxed);
                }
                Err(_) => {
                    // An old connection that did not answer a ping in time is kept when a
                    // new one cannot be made either: Redis may be paused or slow rather than
                    // gone, and a kept connection still answers once it resumes.
                    all_ok = false;
                    break;
                }
            }
        }
        self.update_gauge();
        all_ok
    }
}

/// The keeper: runs [`Inner::tend`] every [`TICK`], early when woken, with back-off while
/// Redis is unreachable; ends when the store is dropped.
async fn keeper(inner: Weak<Inner>, wake: Arc<Notify>, mut was_ok: bool) {
    let mut backoff = BACKOFF_MIN;
    loop {
        let ok = {
            let Some(inner) = inner.upgrade() else { return };
            let ok = inner.tend().await;
            if ok != was_ok {
                if ok {
                    tracing::info!(url = %inner.display_url, "store reconnected");
                } else {
                    tracing::warn!(url = %inner.display_url, error = %inner.last_connect_error(), "store unreachable; retrying");
                }
            }
            ok
        };
        was_ok = ok;
        if ok {
            backoff = BACKOFF_MIN;
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(TICK) => {}
            }
        } else {
            // Not woken early: while Redis is down every failing request would wake us.
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }
}

/// Runs `ops` on `conn`: one pipeline (standalone) or one pipeline per hash slot, concurrently
/// (cluster). Outcomes come back in the order of `ops`.
async fn run(conn: &mut Conn, ops: &[Op], scripts: &Scripts) -> Result<Vec<Outcome>, CallError> {
    match conn {
        Conn::Standalone(c) => {
            let all: Vec<&Op> = ops.iter().collect();
            eval_ops(c, &all, scripts).await
        }
        Conn::Cluster(c) => {
            // Few ops per request: a linear scan beats hashing.
            let mut groups: Vec<(u16, Vec<&Op>, Vec<usize>)> = Vec::new();
            for (i, op) in ops.iter().enumerate() {
                let slot = keys::cluster_slot(&op.key);
                match groups.iter_mut().find(|g| g.0 == slot) {
                    Some(g) => {
                        g.1.push(op);
                        g.2.push(i);
                    }
                    None => groups.push((slot, vec![op], vec![i])),
                }
            }
            if let [(_, group, _)] = groups.as_slice() {
                return eval_ops(c, group, scripts).await;
            }
            let calls = groups.iter().map(|(_, group, _)| {
                let mut c = c.clone();
                async move { eval_ops(&mut c, group, scripts).await }
            });
            let results = try_join_all(calls).await?;
            let mut out: Vec<Option<Outcome>> = vec![None; ops.len()];
            for ((_, _, at), outcomes) in groups.iter().zip(results) {
                for (&i, o) in at.iter().zip(outcomes) {
                    out[i] = Some(o);
                }
            }
            out.into_iter()
                .map(|o| o.ok_or_else(|| CallError::Reply("an op got no answer".into())))
                .collect()
        }
    }
}

/// Runs `ops` as one pipeline of `EVALSHA`s on one connection; retries the ops that got
/// `NOSCRIPT`, and only those, once with `EVAL` (which caches the script again).
async fn eval_ops<C: ConnectionLike>(
    conn: &mut C,
    ops: &[&Op],
    scripts: &Scripts,
) -> Result<Vec<Outcome>, CallError> {
    let calls: Vec<ScriptCall> = ops.iter().map(|op| ScriptCall::for_op(op)).collect();
    let mut pipe = redis::pipe();
    // Per-command results: one op's NOSCRIPT must not hide the others' answers.
    pipe.ignore_errors();
    for (op, call) in ops.iter().zip(&calls) {
        pipe.cmd("EVALSHA")
            .arg(scripts.sha(call))
            .arg(1)
            .arg(&op.key)
            .arg(call.argv());
    }
    let replies: Vec<Value> = pipe.query_async(conn).await?;
    if replies.len() != ops.len() {
        return Err(CallError::Reply(format!(
            "{} replies for {} ops",
            replies.len(),
            ops.len()
        )));
    }
    let mut out: Vec<Option<Outcome>> = Vec::with_capacity(ops.len());
    let mut missing: Vec<usize> = Vec::new();
    for (i, reply) in replies.into_iter().enumerate() {
        match reply {
            Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript) => {
                missing.push(i);
                out.push(None);
            }
            reply => out.push(Some(parse_outcome(reply)?)),
        }
    }
    if !missing.is_empty() {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for &i in &missing {
            let call = &calls[i];
            pipe.cmd("EVAL")
                .arg(call.source())
                .arg(1)
                .arg(&ops[i].key)
                .arg(call.argv());
        }
        let replies: Vec<Value> = pipe.query_async(conn).await?;
        if replies.len() != missing.len() {
            return Err(CallError::Reply(format!(
                "{} replies for {} ops",
                replies.len(),
                missing.len()
            )));
        }
        for (i, reply) in missing.into_iter().zip(replies) {
            out[i] = Some(parse_outcome(reply)?);
        }
    }
    out.into_iter()
        .map(|o| o.ok_or_else(|| CallError::Reply("an op got no answer".into())))
        .collect()
}

/// `{allowed, remaining, reset_ms, retry_ms}` → [`Outcome`].
fn parse_outcome(reply: Value) -> Result<Outcome, CallError> {
    let items = match reply {
        Value::Array(items) => items,
        Value::ServerError(e) => return Err(CallError::Redis(e.into())),
        other => {
            return Err(CallError::Reply(format!(
                "expected 4 integers, got {other:?}"
            )));
        }
    };
    match items.as_slice() {
        [
            Value::Int(allowed),
            Value::Int(remaining),
            Value::Int(reset),
            Value::Int(retry),
        ] => Ok(Outcome {
            allowed: *allowed == 1,
            remaining: u64::try_from(*remaining).unwrap_or(0),
            reset_ms: u64::try_from(*reset).unwrap_or(0),
            retry_ms: u64::try_from(*retry).ok(),
        }),
        _ => Err(CallError::Reply(format!(
            "expected 4 integers, got {items:?}"
        ))),
    }
}

/// Maps a Redis error to the store's error kinds; `transient` where a retry may succeed.
fn classify(e: &RedisError) -> StoreError {
    let (kind, transient) = if e.is_timeout() {
        ("timeout", true)
    } else if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.kind() == ErrorKind::ClusterConnectionNotFound
    {
        ("connection", true)
    } else {
        match e.kind() {
            ErrorKind::Server(
                ServerErrorKind::ClusterDown
                | ServerErrorKind::TryAgain
                | ServerErrorKind::MasterDown
                | ServerErrorKind::BusyLoading
                | ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::ReadOnly,
            ) => ("unavailable", true),
            ErrorKind::AuthenticationFailed | ErrorKind::Server(ServerErrorKind::NoPerm) => {
                ("auth", false)
            }
            // BUSY (a script running long) and OOM pass; others are a script or data problem.
            _ if matches!(e.code(), Some("BUSY" | "OOM")) => ("unavailable", true),
            ErrorKind::Server(_) | ErrorKind::Extension => ("script", false),
            _ => ("protocol", false),
        }
    };
    StoreError {
        kind,
        message: e.to_string(),
        transient,
    }
}

/// Polls `futures` together; the first error wins (the others are dropped, their commands may
/// still run). A few lines instead of a `futures` dependency.
async fn try_join_all<T, E, F>(futures: impl IntoIterator<Item = F>) -> Result<Vec<T>, E>
where
    F: Future<Output = Result<T, E>>,
{
    let mut pending: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<T>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut waiting = false;
        for (f, slot) in pending.iter_mut().zip(done.iter_mut()) {
            if slot.is_some() {
                continue;
            }
            match f.as_mut().poll(cx) {
                Poll::Ready(Ok(v)) => *slot = Some(v),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => waiting = true,
            }
        }
        if waiting {
            Poll::Pending
        } else {
            Poll::Ready(Ok(()))
        }
    })
    .await?;
    Ok(done.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(url: &str) -> RedisConfig {
        RedisConfig {
            url: url.to_string(),
            pool_size: 2,
            connect_timeout: Duration::from_millis(200),
            timeout: Duration::from_millis(20),
        }
    }

    #[test]
    fn urls_parse_into_the_right_topology() {
        assert!(matches!(
            Connector::parse(&cfg("redis://127.0.0.1:6379")),
            Ok(Connector::Standalone { .. })
        ));
        assert!(matches!(
            Connector::parse(&cfg("redis://:pw@127.0.0.1:6379/3")),
            Ok(Connector::Standalone { .. })
        ));
        assert!(matches!(
            Connector::parse(&cfg("redis+cluster://u:p@127.0.0.1:7000,127.0.0.1:7001")),
            Ok(Connector::Cluster(_))
        ));
        assert!(matches!(
            Connector::parse(&cfg("redis+cluster://127.0.0.1:7000/0")),
            Ok(Connector::Cluster(_))
        ));
    }

    #[test]
    fn bad_urls_are_config_errors_without_secrets() {
        for url in [
            "rediss://u:hunter2@h:1",
            "rediss+cluster://u:hunter2@h:1,h:2",
        ] {
            let Err(e) = Connector::parse(&cfg(url)) else {
                panic!("{url} accepted")
            };
            assert!(!e.transient);
            assert!(e.message.contains("TLS is not built"), "{e}");
            assert!(!e.message.contains("hunter2"), "{e}");
        }
        let Err(e) = Connector::parse(&cfg("redis+cluster://u:hunter2@a:1,b:2/3")) else {
            panic!()
        };
        assert!(
            e.message.contains("database 0") && !e.message.contains("hunter2"),
            "{e}"
        );
        assert!(Connector::parse(&cfg("redis+cluster://")).is_err());
        assert!(Connector::parse(&cfg("memcached://h:1")).is_err());
    }

    #[test]
    fn script_calls_match_the_script_headers() {
        let tb = Op {
            key: "k".into(),
            kind: OpKind::TokenBucket {
                capacity: 10,
                refill: 5,
                window_ms: 1000,
            },
            cost: u64::MAX,
        };
        assert_eq!(
            ScriptCall::for_op(&tb).argv(),
            [10, 5, 1000, u64::MAX],
            "sent unclamped"
        );
        let fw = Op {
            key: "k".into(),
            kind: OpKind::FixedWindow {
                limit: 3,
                window_ms: 60_000,
            },
            cost: u64::MAX,
        };
        assert_eq!(
            ScriptCall::for_op(&fw).argv(),
            [3, 60_000, 4],
            "clamped to limit + 1"
        );
        let huge = Op {
            kind: OpKind::FixedWindow {
                limit: u64::MAX,
                window_ms: 1,
            },
            ..fw
        };
        assert_eq!(ScriptCall::for_op(&huge).argv()[2], u64::MAX);
        let sw = Op {
            key: "k".into(),
            kind: OpKind::SlidingWindow {
                limit: 3,
                window_ms: 60_000,
            },
            cost: u64::MAX,
        };
        let call = ScriptCall::for_op(&sw);
        assert_eq!(call.argv(), [3, 60_000, u64::MAX], "sent unclamped");
        assert_eq!(call.source(), SLIDING_WINDOW_LUA);
        assert!(SLIDING_WINDOW_LUA.starts_with("-- sliding_window.lua"));
        assert!(TOKEN_BUCKET_LUA.starts_with("-- token_bucket.lua"));
        assert!(FIXED_WINDOW_LUA.starts_with("-- fixed_window.lua"));
    }

    #[test]
    fn replies_parse_and_bad_ones_are_errors() {
        let ok = Value::Array(vec![
            Value::Int(1),
            Value::Int(4),
            Value::Int(100),
            Value::Int(0),
        ]);
        let o = parse_outcome(ok).unwrap();
        assert_eq!(
            (o.allowed, o.remaining, o.reset_ms, o.retry_ms),
            (true, 4, 100, Some(0))
        );
        let never = Value::Array(vec![
            Value::Int(0),
            Value::Int(0),
            Value::Int(5),
            Value::Int(-1),
        ]);
        assert_eq!(parse_outcome(never).unwrap().retry_ms, None);
        assert!(parse_outcome(Value::Nil).is_err());
        assert!(parse_outcome(Value::Array(vec![Value::Int(1)])).is_err());
    }

    #[tokio::test]
    async fn try_join_all_keeps_order_and_stops_at_an_error() {
        let ok: Result<Vec<u32>, &str> = try_join_all([1u32, 2, 3].map(|i| async move {
            tokio::time::sleep(Duration::from_millis(u64::from(4 - i))).await;
            Ok(i)
        }))
        .await;
        assert_eq!(ok.unwrap(), [1, 2, 3]);
        let err = try_join_all([Ok(1), Err("boom"), Ok(3)].map(|r| async move { r })).await;
        assert_eq!(err, Err("boom"));
    }

    #[tokio::test]
    async fn an_unreachable_redis_constructs_and_fails_fast_per_call() {
        // Port 1 on loopback: nothing listens, connections are refused at once.
        let metrics = Metrics::new();
        let store = RedisStore::connect(cfg("redis://127.0.0.1:1"), &metrics)
            .await
            .unwrap();
        assert_eq!(store.state(), "disconnected");
        let op = Op {
            key: "k".into(),
            kind: OpKind::TokenBucket {
                capacity: 1,
                refill: 1,
                window_ms: 1000,
            },
            cost: 1,
        };
        let started = Instant::now();
        let err = store.apply(&[op]).await.unwrap_err();
        assert!(err.transient && err.kind == "connection", "{err:?}");
        assert!(started.elapsed() < Duration::from_millis(100));
        let text = metrics.render();
        assert!(
            text.contains("tollgate_store_connections{state=\"total\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("tollgate_store_errors_total{kind=\"connect\"}"),
            "{text}"
        );
    }
}
