//! Hot-key sharding: a limit declared with `shards: N` keeps its quota in N sub-buckets whose
//! keys differ only in a `|#i` part inside the hash tag (`keys.rs`), so on a Redis Cluster they
//! land in different slots, and usually on different nodes: one hot key's load spreads.
//!
//! The capacity and the refill (a fixed window's limit) are split so the shards add up exactly
//! to the limit: shard `i` gets `total / N`, plus one for the first `total % N` shards. The rules
//! refuse more shards than min(burst, requests_per_unit), so every shard has capacity and
//! refill. The planner sends each request to a random shard ([`pick`]); when that shard is
//! empty, the request tries one [`other`] shard before it is refused (`shard_retry`), which
//! keeps refusals while other shards still hold tokens rare (README: the trade-offs).
//!
//! What a sharded limit reports: the shard's outcome, with `remaining` scaled up by N (capped
//! at the capacity) as the estimate of the whole bucket: random picks drain the shards evenly.

use rand::Rng;

use crate::store::OpKind;

/// `total` split N ways: shard `i`'s part, the remainder spread over the first shards.
fn part(total: u64, shards: u32, i: u32) -> u64 {
    let n = u64::from(shards.max(1));
    total / n + u64::from(u64::from(i) < total % n)
}

/// The op kind of shard `i` of `shards`.
pub(super) fn kind(kind: OpKind, shards: u32, i: u32) -> OpKind {
    match kind {
        OpKind::TokenBucket {
            capacity,
            refill,
            window_ms,
        } => OpKind::TokenBucket {
            capacity: part(capacity, shards, i),
            refill: part(refill, shards, i),
            window_ms,
        },
        OpKind::FixedWindow { limit, window_ms } => OpKind::FixedWindow {
            limit: part(limit, shards, i),
            window_ms,
        },
        // The rules refuse shards on a sliding window.
        OpKind::SlidingWindow { .. } => kind,
    }
}

/// A random shard.
pub(super) fn pick(shards: u32) -> u32 {
    rand::rng().random_range(0..shards.max(1))
}

/// A random shard other than `i` (`i` itself when there is only one).
pub(super) fn other(shards: u32, i: u32) -> u32 {
    if shards <= 1 {
        return i;
    }
    (i + rand::rng().random_range(1..shards)) % shards
}

/// The whole bucket's remaining tokens, estimated from one shard's.
pub(super) fn scale_remaining(remaining: u64, shards: u32, capacity: u64) -> u64 {
    remaining.saturating_mul(u64::from(shards)).min(capacity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_add_up_to_the_limit() {
        for (total, n) in [(10, 3), (100, 4), (7, 7), (1_000_003, 16)] {
            let parts: Vec<u64> = (0..n).map(|i| part(total, n, i)).collect();
            assert_eq!(parts.iter().sum::<u64>(), total, "{total} / {n}");
            assert!(parts.iter().max().unwrap() - parts.iter().min().unwrap() <= 1);
            assert!(parts.iter().all(|&p| p >= 1));
        }
        let k = kind(
            OpKind::TokenBucket {
                capacity: 10,
                refill: 7,
                window_ms: 1_000,
            },
            3,
            0,
        );
        assert_eq!(
            k,
            OpKind::TokenBucket {
                capacity: 4,
                refill: 3,
                window_ms: 1_000
            }
        );
    }

    #[test]
    fn other_is_never_the_same_shard() {
        for _ in 0..200 {
            let i = pick(4);
            assert!(i < 4);
            let j = other(4, i);
            assert!(j < 4 && j != i);
        }
        assert_eq!(other(1, 0), 0);
        assert_eq!(scale_remaining(3, 4, 10), 10);
        assert_eq!(scale_remaining(2, 4, 10), 8);
    }
}
