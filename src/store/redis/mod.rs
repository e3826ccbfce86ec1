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
//! The whole call is bounded by `store_timeout_ms` ([`StoreErrorKind::Timeout`]), so a slow or
//! paused Redis never stalls a request past the timeout. A script that timed out on the client
//! side may still run once Redis resumes (the command was already sent): its tokens are spent
//! although the request was answered UNAVAILABLE. Failures are classified in [`errors`],
//! counted in `tollgate_store_errors_total{kind}` and logged as an outage state ([`outage`]).
//!
//! # Files
//!
//! - [`connect`]: the URL → standalone or cluster client; one live connection ([`Conn`]).
//! - [`pool`]: the long-lived connections and the keeper task that reconnects them.
//! - [`scripts`]: the Lua sources, `EVALSHA` with the `NOSCRIPT` retry, reply parsing.
//! - [`errors`]: Redis errors → [`StoreErrorKind`].
//! - [`outage`]: one log line per outage state change, not per failed request.

mod connect;
mod errors;
mod outage;
mod pool;
mod scripts;

pub use scripts::{FIXED_WINDOW_LUA, SLIDING_WINDOW_LUA, ScriptCall, TOKEN_BUCKET_LUA};

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::try_join_all;
use redis::cluster_routing::Slot;

use connect::{Conn, Connector};
use errors::CallError;
use outage::OutageLog;
use pool::Pool;

use super::{Op, Outcome, StoreError, StoreErrorKind};
use crate::settings::{Settings, redact_url};
use crate::telemetry::{KindLabels, Metrics, StoreMetrics};

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

/// The Redis store (standalone or cluster). Cheap to share behind the limiter.
pub struct RedisStore {
    pool: Arc<Pool>,
    timeout: Duration,
    outage: OutageLog,
    metrics: StoreMetrics,
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
    pub async fn connect(cfg: RedisConfig, metrics: &Metrics) -> Result<RedisStore, StoreError> {
        let connector = Connector::parse(&cfg)?;
        let pool = Arc::new(Pool::new(
            connector,
            cfg.pool_size,
            cfg.connect_timeout,
            metrics.store.clone(),
            redact_url(&cfg.url),
        ));
        let connected = pool.tend().await;
        if connected {
            tracing::info!(url = %pool.display_url, connections = pool.size(), "store connected");
        } else {
            tracing::warn!(
                url = %pool.display_url,
                error = %pool.last_connect_error(),
                "store unreachable at startup; requests fail (UNAVAILABLE) until it answers, retrying in the background"
            );
        }
        pool.start_keeper(connected);
        Ok(RedisStore {
            pool,
            timeout: cfg.timeout,
            outage: OutageLog::new(),
            metrics: metrics.store.clone(),
        })
    }

    /// Applies `ops` in order and returns one outcome per op (see the module doc for how the
    /// ops travel). All of it is bounded by the store timeout.
    pub async fn apply(&self, ops: &[Op]) -> Result<Vec<Outcome>, StoreError> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        let started = Instant::now();
        let result = self.call(ops).await;
        self.metrics.observe("apply", started);
        if let Err(e) = &result {
            self.metrics
                .errors
                .get_or_create(&KindLabels {
                    kind: e.kind.label(),
                })
                .inc();
        }
        self.outage.record(&result);
        result
    }

    async fn call(&self, ops: &[Op]) -> Result<Vec<Outcome>, StoreError> {
        let Some(picked) = self.pool.pick() else {
            return Err(StoreError::new(
                StoreErrorKind::Connection,
                format!(
                    "not connected to Redis ({})",
                    self.pool.last_connect_error()
                ),
            ));
        };
        let mut conn = (*picked.conn).clone();
        let run = run(&mut conn, ops, &self.pool.scripts);
        let result = match tokio::time::timeout(self.timeout, run).await {
            Ok(Ok(outcomes)) => {
                self.pool.call_succeeded(&picked);
                return Ok(outcomes);
            }
            Ok(Err(e)) => e.into_store_error(),
            Err(_) => StoreError::new(
                StoreErrorKind::Timeout,
                format!(
                    "no answer from Redis within {} ms",
                    self.timeout.as_millis()
                ),
            ),
        };
        self.pool.call_failed(&picked, result.kind);
        Err(result)
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
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        // Lets the keeper notice at once that the store is gone.
        self.pool.wake_keeper();
    }
}

/// Runs `ops` on `conn`: one pipeline (standalone) or one pipeline per hash slot, concurrently
/// (cluster). Outcomes come back in the order of `ops`.
async fn run(
    conn: &mut Conn,
    ops: &[Op],
    scripts: &scripts::Scripts,
) -> Result<Vec<Outcome>, CallError> {
    let c = match conn {
        Conn::Standalone(c) => {
            let all: Vec<&Op> = ops.iter().collect();
            return scripts::eval_ops(c, &all, scripts).await;
        }
        Conn::Cluster(c) => c,
    };
    // Few ops per request: a linear scan beats hashing.
    let mut groups: Vec<(Slot, Vec<&Op>, Vec<usize>)> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let slot = Slot::for_key(&op.key);
        match groups.iter_mut().find(|g| g.0 == slot) {
            Some(g) => {
                g.1.push(op);
                g.2.push(i);
            }
            None => groups.push((slot, vec![op], vec![i])),
        }
    }
    if let [(_, group, _)] = groups.as_slice() {
        return scripts::eval_ops(c, group, scripts).await;
    }
    let calls = groups.iter().map(|(_, group, _)| {
        let mut c = c.clone();
        async move { scripts::eval_ops(&mut c, group, scripts).await }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unreachable_redis_constructs_and_fails_fast_per_call() {
        // Port 1 on loopback: nothing listens, connections are refused at once.
        let metrics = Metrics::new();
        let cfg = RedisConfig {
            url: "redis://127.0.0.1:1".to_string(),
            pool_size: 2,
            connect_timeout: Duration::from_millis(200),
            timeout: Duration::from_millis(20),
        };
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
        };
        let started = Instant::now();
        let err = store.apply(&[op]).await.unwrap_err();
        assert!(
            err.is_transient() && err.kind == StoreErrorKind::Connection,
            "{err:?}"
        );
        assert!(started.elapsed() < Duration::from_millis(100));
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
