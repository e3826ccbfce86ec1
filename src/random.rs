//! Where the service's own random draws come from: the random part of a replica's id
//! (`fleet::replica_id`) and the shard a hot key's request is sent to (`limiter/shard.rs`).
//!
//! From the OS by default. A seed makes them replayable: `TOLLGATE_SEED=<u64>` for the binary,
//! [`set_seed`] for a process that embeds the service. The test harness gives every server it
//! starts the suite's fixed seed, so a test that failed draws the same ids and the same picks
//! when it runs again (which thread draws first still depends on the scheduler). Each
//! generator made from the seed gets a seed of its own ([`next_seed`]), so two replicas in one
//! process never share an id. The simulator seeds its generators itself (`sim/`).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

static SEED: OnceLock<Option<u64>> = OnceLock::new();
static DRAWN: AtomicU64 = AtomicU64::new(0);

/// Seeds this process's draws with `seed`; call it before the service starts. The first seed
/// (this one or `TOLLGATE_SEED`, whichever is read first) stays.
pub fn set_seed(seed: u64) {
    let _ = SEED.set(Some(seed));
}

/// The process's seed: [`set_seed`]'s, else `TOLLGATE_SEED`'s; `None`: draw from the OS. A
/// `TOLLGATE_SEED` that is not a number is ignored with a warning (it only makes draws
/// replayable; no decision depends on it).
pub fn seed() -> Option<u64> {
    *SEED.get_or_init(|| {
        let raw = std::env::var("TOLLGATE_SEED").ok()?;
        match raw.trim().parse::<u64>() {
            Ok(seed) => Some(seed),
            Err(_) => {
                tracing::warn!(
                    value = %raw.chars().take(40).collect::<String>(),
                    "TOLLGATE_SEED is not a number from 0 to 18446744073709551615; drawing from the OS"
                );
                None
            }
        }
    })
}

/// A seed for one more generator (or one draw): a different one on every call, from the
/// process's seed; `None` when the process draws from the OS.
pub fn next_seed() -> Option<u64> {
    let seed = seed()?;
    let n = DRAWN.fetch_add(1, Ordering::Relaxed);
    Some(splitmix64(seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
}

/// SplitMix64's output step: spreads nearby inputs (seed, seed ^ 1, …) over the whole range.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_drawn_from_one_seed_differ() {
        let a: Vec<u64> = (0..100u64).map(|n| splitmix64(7 ^ n)).collect();
        let mut sorted = a.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), a.len());
    }
}
