//! Hot-key sharding: a limit declared with `shards: N` keeps its quota in N sub-buckets whose
//! keys differ only in a `|#i` part inside the hash tag (`keys.rs`), so on a Redis Cluster they
//! land in different slots, and usually on different nodes: one hot key's load spreads.
//!
//! The capacity and the refill (a fixed window's limit) are split so the shards add up exactly
//! to the limit: shard `i` gets `total / N`, plus one for the first `total % N` shards
//! (`quota::share::shard_part`, with the other parts of a quota). The rules
//! refuse more shards than min(burst, requests_per_unit), so every shard has capacity and
//! refill. The planner sends each request to a random shard ([`pick`]); when that shard is
//! empty, the request tries one [`other`] shard before it is refused (`shard_retry`), which
//! keeps refusals while other shards still hold tokens rare (README: the trade-offs).
//!
//! What a sharded limit reports: the shard's outcome, with `remaining` scaled up by N (capped
//! at the capacity) as the estimate of the whole bucket: random picks drain the shards evenly
//! (`quota::share::shard_remaining`). This file picks the shards.

use rand::Rng;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_is_never_the_same_shard() {
        for _ in 0..200 {
            let i = pick(4);
            assert!(i < 4);
            let j = other(4, i);
            assert!(j < 4 && j != i);
        }
        assert_eq!(other(1, 0), 0);
    }
}
