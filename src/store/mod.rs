//! Where bucket state lives: in this process ([`MemoryStore`]) or in Redis (later).
//!
//! The limiter hands the store every bucket operation of one request at once ([`Op`]s), so a
//! remote store can send them in one round trip, and gets one [`Outcome`] per op back, in
//! order. [`Store`] is an enum rather than a trait object: there are few backends, and a
//! `match` keeps the hot path free of boxed futures.

pub mod memory;

pub use memory::MemoryStore;

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
}

impl Store {
    /// Applies `ops` in order and returns one outcome per op.
    pub async fn apply(&self, ops: &[Op]) -> Result<Vec<Outcome>, StoreError> {
        match self {
            Store::Memory(m) => Ok(ops.iter().map(|op| m.apply(op)).collect()),
        }
    }

    /// Periodic housekeeping (the memory store drops idle buckets); called about once a second.
    pub fn maintain(&self) {
        match self {
            Store::Memory(m) => {
                m.sweep();
            }
        }
    }

    /// A short name for logs and `/readyz`.
    pub fn name(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
        }
    }
}
