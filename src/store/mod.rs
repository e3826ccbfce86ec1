//! Where bucket state lives: in this process ([`MemoryStore`]) or in Redis, standalone or
//! cluster ([`RedisStore`]), chosen by the `store` setting ([`Store::connect`]).
//!
//! The limiter hands the store every bucket operation of one request at once ([`Op`]s), so a
//! remote store can send them in one round trip, and gets one [`Outcome`] per op back, in
//! order. [`Store`] is an enum rather than a trait object: there are few backends, and a
//! `match` keeps the hot path free of boxed futures.

pub mod memory;
pub mod redis;

pub use memory::MemoryStore;
pub use redis::{RedisConfig, RedisStore};

use crate::clock::Clock;
use crate::settings::Settings;
use crate::telemetry::Metrics;

pub use crate::limiter::bucket::Outcome;

/// One bucket operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub key: String,
    pub kind: OpKind,
    /// Tokens (hits) to take; 0 checks without consuming.
    pub cost: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    TokenBucket {
        capacity: u64,
        refill: u64,
        window_ms: u64,
    },
    FixedWindow {
        limit: u64,
        window_ms: u64,
    },
    SlidingWindow {
        limit: u64,
        window_ms: u64,
    },
}

/// A store failure. `transient` errors (timeouts, lost connections) may succeed on retry and
/// are what the fallback policy covers; others (a script bug, a wrong password) are not.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("store {kind}: {message}")]
pub struct StoreError {
    pub kind: &'static str,
    pub message: String,
    pub transient: bool,
}

/// The configured store.
#[derive(Debug)]
pub enum Store {
    Memory(MemoryStore),
    Redis(RedisStore),
}

impl Store {
    /// The store the settings name: `memory`, or a Redis / Redis Cluster URL. Fails only on a
    /// bad configuration (a malformed URL, TLS, which is not built in); an unreachable Redis
    /// still yields a store, which reconnects in the background (see `redis.rs`).
    pub async fn connect(
        settings: &Settings,
        clock: Clock,
        metrics: &Metrics,
    ) -> Result<Store, StoreError> {
        if settings.store == "memory" {
            return Ok(Store::Memory(MemoryStore::new(clock)));
        }
        // Redis keeps its own clock (`TIME`), so every replica agrees.
        RedisStore::connect(RedisConfig::from_settings(settings), metrics)
            .await
            .map(Store::Redis)
    }

    /// Applies `ops` in order and returns one outcome per op.
    pub async fn apply(&self, ops: &[Op]) -> Result<Vec<Outcome>, StoreError> {
        match self {
            Store::Memory(m) => Ok(ops.iter().map(|op| m.apply(op)).collect()),
            Store::Redis(r) => r.apply(ops).await,
        }
    }

    /// Periodic housekeeping (the memory store drops idle buckets); called about once a second.
    pub fn maintain(&self) {
        match self {
            Store::Memory(m) => {
                m.sweep();
            }
            // Redis expires idle buckets itself (PEXPIRE); the connection keeper is a task.
            Store::Redis(_) => {}
        }
    }

    /// A short name for logs and `/readyz`: `memory`, `redis` or `redis-cluster`.
    pub fn name(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
            Store::Redis(r) => r.name(),
        }
    }

    /// Whether the store can answer, for `/readyz` (informational: a store outage must not
    /// pull replicas out of the Service): `connected`, `degraded` (connections held, the last
    /// call failed) or `disconnected`. The memory store is always `connected`.
    pub fn state(&self) -> &'static str {
        match self {
            Store::Memory(_) => "connected",
            Store::Redis(r) => r.state(),
        }
    }
}
