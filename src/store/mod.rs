//! Where bucket state lives: in this process ([`MemoryStore`]) or in Redis, standalone or
//! cluster ([`RedisStore`]), chosen by the `store` setting ([`Store::connect`]).
//!
//! The limiter hands the store every bucket operation of one request at once ([`Op`]s), so a
//! remote store can send them in one round trip, and gets one [`Outcome`] per op back, in
//! order (the ops and outcomes are the quota core's, `quota/`). [`Store`] is an enum rather
//! than a trait object: a `match` keeps the hot path of the two built-in stores free of boxed
//! futures. Any other store (a test's, a simulator's) implements [`Backend`] and rides in
//! [`Store::Custom`].

pub mod breaker;
pub mod memory;
pub mod redis;

pub use memory::MemoryStore;
pub use redis::{RedisConfig, RedisStore};

use crate::clock::Clock;
use crate::telemetry::Metrics;

use crate::quota::{Op, Outcome};

/// Which store to connect to, and how (built from the settings by `configs.rs`).
#[derive(Clone, Debug)]
pub enum StoreConfig {
    /// Buckets in this process, at most `max_keys` of them.
    Memory {
        max_keys: usize,
    },
    Redis(Box<RedisConfig>),
}

/// What kind of failure a [`StoreError`] is. The names are the `kind` label of
/// `tollgate_store_errors_total`, which dashboards and alerts use: keep them stable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreErrorKind {
    /// No answer within `store_timeout_ms`.
    Timeout,
    /// Not connected, or the connection broke.
    Connection,
    /// The store answered "not now": `CLUSTERDOWN`, `TRYAGAIN`, `LOADING`, `BUSY`, a redirect
    /// that did not settle, …
    Unavailable,
    /// A script or data error: retrying will not help.
    Script,
    /// Authentication or ACL refused.
    Auth,
    /// The TLS handshake failed: an untrusted or mismatched server certificate, or a client
    /// certificate the server refused.
    Tls,
    /// A reply of the wrong shape.
    Protocol,
    /// A bad store configuration (only at startup).
    Config,
    /// Not tried: the circuit breaker of the op's node is open after repeated failures, so
    /// the request goes to the fallback at once instead of waiting for the timeout.
    CircuitOpen,
    /// Not answered within the request's decision budget (the caller's deadline less
    /// `decision_margin_ms`): the caller answered from the fallback instead. The store may
    /// still run it (a call already sent), or never (a request already late when read).
    Deadline,
}

impl StoreErrorKind {
    /// The metrics label value.
    pub fn label(self) -> &'static str {
        match self {
            StoreErrorKind::Timeout => "timeout",
            StoreErrorKind::Connection => "connection",
            StoreErrorKind::Unavailable => "unavailable",
            StoreErrorKind::Script => "script",
            StoreErrorKind::Auth => "auth",
            StoreErrorKind::Tls => "tls",
            StoreErrorKind::Protocol => "protocol",
            StoreErrorKind::Config => "config",
            StoreErrorKind::CircuitOpen => "circuit_open",
            StoreErrorKind::Deadline => "deadline",
        }
    }

    /// Whether a retry may succeed (timeouts, lost connections, a cluster in transition).
    /// Every failed op goes to the fallback either way; the non-transient ones are also
    /// logged apart, since they are bugs or misconfiguration that will not heal.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            StoreErrorKind::Timeout
                | StoreErrorKind::Connection
                | StoreErrorKind::Unavailable
                | StoreErrorKind::CircuitOpen
                | StoreErrorKind::Deadline
        )
    }
}

impl std::fmt::Display for StoreErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// A store failure: its kind, what failed, and the underlying error when there is one.
#[derive(Clone, Debug, thiserror::Error)]
#[error("store {kind}: {message}")]
pub struct StoreError {
    pub kind: StoreErrorKind,
    /// What failed, in words (the source's text included, so one log line says it all).
    pub message: String,
    /// The client library's error, when the failure came from one.
    #[source]
    pub source: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
}

impl StoreError {
    pub fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError {
            kind,
            message: message.into(),
            source: None,
        }
    }

    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(std::sync::Arc::new(source));
        self
    }

    pub fn is_transient(&self) -> bool {
        self.kind.is_transient()
    }

    /// Whether the op may have run although no answer came: a call that timed out was sent,
    /// and Redis may have run its script (spent its tokens) after we stopped waiting. Such an
    /// op must not be admitted as if nothing had been spent. Every other kind failed before
    /// the script ran (refused connection, open circuit) or with the script's own refusal.
    pub fn outcome_unknown(&self) -> bool {
        self.kind == StoreErrorKind::Timeout
    }
}

/// The configured store.
#[derive(Debug)]
pub enum Store {
    Memory(MemoryStore),
    /// Shared: a batch of queued decisions (`redis/batch.rs`) runs in a task of its own.
    Redis(std::sync::Arc<RedisStore>),
    /// Any other [`Backend`]: a test's or a simulator's store (latency, faults).
    Custom(std::sync::Arc<dyn Backend>),
}

/// The fleet's reset log (the counter API's resets) read after a sequence number.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResetLog {
    /// The log's sequence number now: where the next read starts.
    pub seq: u64,
    /// The bucket keys reset since.
    pub keys: Vec<String>,
    /// `false` when resets since may be missing from `keys` (the log was trimmed past them, or
    /// lost): the reader must forget everything it caches.
    pub complete: bool,
}

/// A store other than the built-in two, behind the same calls as [`Store`]: a test's or a
/// simulator's, usually a [`MemoryStore`] wrapped with latency or faults. Memory and Redis
/// stay enum variants so that their calls are not boxed futures on the request path.
pub trait Backend: std::fmt::Debug + Send + Sync {
    /// One result per op, in order (see [`Store::apply_each`]).
    fn apply_each<'a>(
        &'a self,
        ops: &'a [Op],
    ) -> futures_util::future::BoxFuture<'a, Vec<Result<Outcome, StoreError>>>;

    /// The caller's decision budget ran out before `ops` were answered, after `waited` (see
    /// [`Store::missed_deadline`]): a store with breakers counts it (the simulator's does, by
    /// the Redis client's rule, `Breakers::missed`). Nothing by default.
    fn missed_deadline(&self, _ops: &[Op], _waited: std::time::Duration) {}

    /// Registers `replica` as live for `ttl` in the membership set `key`; how many are live.
    fn heartbeat<'a>(
        &'a self,
        key: &'a str,
        replica: &'a str,
        ttl: std::time::Duration,
    ) -> futures_util::future::BoxFuture<'a, Result<u64, StoreError>>;

    /// Takes `replica` out of the membership set `key`.
    fn leave<'a>(
        &'a self,
        key: &'a str,
        replica: &'a str,
    ) -> futures_util::future::BoxFuture<'a, Result<u64, StoreError>>;

    /// Deletes the buckets `keys` (the counter API's reset); how many existed. A test's
    /// store need not take resets.
    fn reset<'a>(
        &'a self,
        keys: &'a [String],
    ) -> futures_util::future::BoxFuture<'a, Result<u64, StoreError>> {
        let _ = keys;
        Box::pin(async {
            Err(StoreError::new(
                StoreErrorKind::Config,
                "this store does not take counter resets",
            ))
        })
    }

    /// A short name for logs and `/readyz`.
    fn name(&self) -> &'static str;

    /// `connected`, `degraded` or `disconnected` (see [`Store::state`]).
    fn state(&self) -> &'static str {
        "connected"
    }
}

impl Store {
    /// The store `config` names: memory, or a Redis / Redis Cluster / Sentinel URL. Fails
    /// only on a bad configuration (a malformed URL, unreadable TLS files); an unreachable
    /// Redis still yields a store, which reconnects in the background (see `redis/pool/`).
    pub async fn connect(
        config: StoreConfig,
        clock: Clock,
        metrics: &Metrics,
    ) -> Result<Store, StoreError> {
        match config {
            StoreConfig::Memory { max_keys } => {
                Ok(Store::Memory(MemoryStore::with_max_keys(clock, max_keys)))
            }
            // Redis keeps its own clock (`TIME`), so every replica agrees.
            StoreConfig::Redis(redis) => RedisStore::connect(*redis, metrics)
                .await
                .map(|r| Store::Redis(std::sync::Arc::new(r))),
        }
    }

    /// Checks `config` without connecting: a malformed URL, or a file it names that is
    /// missing or wrong, fails here (before the startup binds a port) as it would in
    /// [`Store::connect`].
    pub fn check(config: &StoreConfig) -> Result<(), StoreError> {
        match config {
            StoreConfig::Memory { .. } => Ok(()),
            StoreConfig::Redis(redis) => RedisStore::check(redis),
        }
    }

    /// Applies `ops` in order and returns one outcome per op; the first failure fails all.
    pub async fn apply(&self, ops: &[Op]) -> Result<Vec<Outcome>, StoreError> {
        self.apply_each(ops).await.into_iter().collect()
    }

    /// Applies `ops` and returns one result per op, in order: on a Redis Cluster one node can
    /// fail (or have its circuit open) while the others answer, and only its ops go to the
    /// fallback.
    ///
    /// Each call is a child span of the request's (exported only with `otlp_endpoint`, like
    /// the request span; a disabled span costs a cached callsite check).
    pub async fn apply_each(&self, ops: &[Op]) -> Vec<Result<Outcome, StoreError>> {
        use tracing::Instrument;
        match self {
            Store::Memory(m) => ops.iter().map(|op| Ok(m.apply(op))).collect(),
            Store::Custom(b) => b.apply_each(ops).await,
            Store::Redis(r) => {
                let span = tracing::info_span!(
                    target: "tollgate::request",
                    "store.apply",
                    ops = ops.len(),
                    failed = tracing::field::Empty,
                );
                // Boxed: a Redis call's state is large, and inline, it would be part of every
                // request's future whatever its store (each waiting request holds one).
                let results = Box::pin(r.apply_each(ops).instrument(span.clone())).await;
                if !span.is_disabled() {
                    span.record("failed", results.iter().filter(|r| r.is_err()).count());
                }
                results
            }
        }
    }

    /// The caller's decision budget ran out before `ops` were answered, after `waited` on
    /// the store: the Redis client counts a missed deadline against each of their nodes'
    /// breakers ([`RedisStore::missed_deadline`]). The memory store never keeps a caller
    /// waiting.
    pub fn missed_deadline(&self, ops: &[Op], waited: std::time::Duration) {
        match self {
            Store::Redis(r) => r.missed_deadline(ops, waited),
            Store::Custom(b) => b.missed_deadline(ops, waited),
            Store::Memory(_) => {}
        }
    }

    /// Registers `replica` as live for `ttl` in the membership set `key` and returns how many
    /// replicas are live (for the local fallback's share). The memory store is one replica.
    pub async fn heartbeat(
        &self,
        key: &str,
        replica: &str,
        ttl: std::time::Duration,
    ) -> Result<u64, StoreError> {
        match self {
            Store::Memory(_) => Ok(1),
            Store::Redis(r) => r.membership(key, replica, ttl, false).await,
            Store::Custom(b) => b.heartbeat(key, replica, ttl).await,
        }
    }

    /// Takes `replica` out of the membership set `key` (graceful shutdown).
    pub async fn leave(&self, key: &str, replica: &str) -> Result<u64, StoreError> {
        match self {
            Store::Memory(_) => Ok(0),
            Store::Redis(r) => {
                r.membership(key, replica, std::time::Duration::ZERO, true)
                    .await
            }
            Store::Custom(b) => b.leave(key, replica).await,
        }
    }

    /// Deletes the buckets `keys` (the counter API's reset: each starts over, full) and, on
    /// Redis, writes them to the fleet's reset log under the membership set `members_key`, so
    /// the other replicas forget what they hold of them ([`Store::resets_since`]). How many
    /// of the keys existed.
    pub async fn reset(&self, keys: &[String], members_key: &str) -> Result<u64, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.remove(keys)),
            Store::Redis(r) => r.reset(keys, members_key).await,
            Store::Custom(b) => b.reset(keys).await,
        }
    }

    /// The fleet's reset log after sequence number `after` (`None`: only where it is now).
    /// One process on the memory store: nothing to follow.
    pub async fn resets_since(
        &self,
        members_key: &str,
        after: Option<u64>,
    ) -> Result<ResetLog, StoreError> {
        match self {
            Store::Memory(_) | Store::Custom(_) => Ok(ResetLog {
                seq: after.unwrap_or(0),
                keys: Vec::new(),
                complete: true,
            }),
            Store::Redis(r) => r.resets_since(members_key, after).await,
        }
    }

    /// The nodes whose circuit is open now (`store` for a standalone Redis, `host:port` of a
    /// cluster primary), for `/readyz`.
    pub fn open_circuits(&self) -> Vec<String> {
        match self {
            Store::Memory(_) | Store::Custom(_) => Vec::new(),
            Store::Redis(r) => r.open_circuits(),
        }
    }

    /// Periodic housekeeping (the memory store drops idle buckets); called about once a second.
    pub fn maintain(&self) {
        match self {
            Store::Memory(m) => {
                m.sweep();
            }
            // Redis expires idle buckets itself (PEXPIRE); the connection keeper is a task.
            // A custom store keeps its own house.
            Store::Redis(_) | Store::Custom(_) => {}
        }
    }

    /// A short name for logs and `/readyz`: `memory`, `redis` or `redis-cluster`.
    pub fn name(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
            Store::Redis(r) => r.name(),
            Store::Custom(b) => b.name(),
        }
    }

    /// Warnings about the store's configuration that make limits wrong (a Redis
    /// `maxmemory-policy` that evicts live buckets), for `/readyz`.
    pub fn warnings(&self) -> Vec<String> {
        match self {
            Store::Memory(_) | Store::Custom(_) => Vec::new(),
            Store::Redis(r) => r.warnings(),
        }
    }

    /// Why the store is not connected (the last failed connection attempt: an unreachable
    /// host, a refused password, an untrusted certificate), for `/readyz`; `None` while
    /// connected. The message never holds a password.
    pub fn connect_error(&self) -> Option<String> {
        match self {
            Store::Memory(_) | Store::Custom(_) => None,
            Store::Redis(r) => r.connect_error(),
        }
    }

    /// Whether the store can answer, for `/readyz` (informational: a store outage must not
    /// pull replicas out of the Service): `connected`, `degraded` (connections held, the last
    /// call failed) or `disconnected`. The memory store is always `connected`.
    pub fn state(&self) -> &'static str {
        match self {
            Store::Memory(_) => "connected",
            Store::Redis(r) => r.state(),
            Store::Custom(b) => b.state(),
        }
    }

    /// Whether the store has answered once since start (the memory store always has).
    pub fn answered_once(&self) -> bool {
        match self {
            Store::Memory(_) | Store::Custom(_) => true,
            Store::Redis(r) => r.answered_once(),
        }
    }
}
