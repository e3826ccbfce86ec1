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
//! keeps refusals while other shards still hold tokens rare (docs/accuracy.md).
//!
//! What a sharded limit reports: the shard's outcome, with `remaining` scaled up by N (capped
//! at the capacity) as the estimate of the whole bucket: random picks drain the shards evenly
//! (`quota::share::shard_remaining`). This file picks the shards.
//!
//! The picks come from the thread's random generator: seeded from the process's seed when it
//! has one (`random.rs`: the test harness sets one), or by [`seed_picks`] (`tollgate simulate`
//! runs a whole fleet on one thread, and the same seed must pick the same shards); otherwise
//! the OS's.

use std::cell::RefCell;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

thread_local! {
    static SEEDED: RefCell<Option<SmallRng>> =
        RefCell::new(crate::random::next_seed().map(SmallRng::seed_from_u64));
}

/// From now on, shards picked on this thread come from a generator seeded with `seed`
/// (`None`: the thread's generator again, seeded from the process's seed if it has one).
pub fn seed_picks(seed: Option<u64>) {
    let seed = seed.or_else(crate::random::next_seed);
    SEEDED.with(|s| *s.borrow_mut() = seed.map(SmallRng::seed_from_u64));
}

/// A number in `0..n` (`n` ≥ 1) from this thread's generator.
fn below(n: u32) -> u32 {
    SEEDED.with(|s| match s.borrow_mut().as_mut() {
        Some(rng) => rng.random_range(0..n),
        None => rand::rng().random_range(0..n),
    })
}

/// A random shard.
pub(super) fn pick(shards: u32) -> u32 {
    below(shards.max(1))
}

/// A random shard other than `i` (`i` itself when there is only one).
pub(super) fn other(shards: u32, i: u32) -> u32 {
    if shards <= 1 {
        return i;
    }
    (i + 1 + below(shards - 1)) % shards
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

    #[test]
    fn a_seeded_thread_picks_the_same_shards_again() {
        let picks = || {
            seed_picks(Some(7));
            let p: Vec<u32> = (0..50).map(|_| other(8, pick(8))).collect();
            seed_picks(None);
            p
        };
        let first = picks();
        assert_eq!(first, picks());
        assert!(
            first.iter().any(|&s| s != first[0]),
            "not one shard: {first:?}"
        );
    }
}
