//! A part of a quota, in one place: the three ways tollgate hands out less than a whole
//! bucket, and what each keeps true.
//!
//! - **The local fallback's share** ([`fallback_part`]): while the store cannot answer, each
//!   of `n` replicas decides alone on `1/n` of the quota, with the same algorithm and burst
//!   ratio. Never zero where the quota is not (a share rounds up to one and stretches its
//!   window instead), so the `n` parts add up to at least the quota, at most one a window each
//!   beyond it.
//! - **A shard** ([`shard_part`]): a hot key split N ways; the parts add up to the quota
//!   exactly (the remainder goes to the first shards), and a shard's `remaining` is scaled
//!   back up ([`shard_remaining`]) as the estimate of the whole.
//! - **A lease** ([`lease_grant`]): a replica (or, next, an Envoy) claims tokens ahead from the
//!   shared bucket; beyond what it needs now it gets at most `1/share` of what is left, so a
//!   nearly spent bucket is split between claimants instead of hoarded by the first. The
//!   tokens leave the bucket when granted, so leases never add to what the bucket admits.

use super::OpKind;

/// One replica's part of a bucket shared by `n`: same algorithm, same burst ratio.
pub fn fallback_part(kind: OpKind, n: u64) -> OpKind {
    let n = n.max(1);
    match kind {
        // refill / (window × n) = (refill / n) / window: the refill stays whole.
        OpKind::TokenBucket {
            capacity,
            refill,
            window_ms,
        } => OpKind::TokenBucket {
            capacity: (capacity / n).max(1),
            refill,
            window_ms: window_ms.saturating_mul(n),
        },
        OpKind::FixedWindow { limit, window_ms } => {
            let (limit, window_ms) = window_share(limit, window_ms, n);
            OpKind::FixedWindow { limit, window_ms }
        }
        OpKind::SlidingWindow { limit, window_ms } => {
            let (limit, window_ms) = window_share(limit, window_ms, n);
            OpKind::SlidingWindow { limit, window_ms }
        }
        OpKind::SlidingLog { limit, window_ms } => {
            let (limit, window_ms) = window_share(limit, window_ms, n);
            OpKind::SlidingLog { limit, window_ms }
        }
        // limit ÷ n per calendar window; below one, a plain fixed window of the nominal
        // length stretched as above (a calendar window cannot be stretched).
        OpKind::CalendarWindow {
            limit,
            calendar,
            window_ms,
        } if limit >= n || limit == 0 => OpKind::CalendarWindow {
            limit: limit / n,
            calendar,
            window_ms,
        },
        OpKind::CalendarWindow {
            limit, window_ms, ..
        } => {
            let (limit, window_ms) = window_share(limit, window_ms, n);
            OpKind::FixedWindow { limit, window_ms }
        }
    }
}

/// `limit ÷ n` per window, or, below one, one per `⌈n ÷ limit⌉` windows.
fn window_share(limit: u64, window_ms: u64, n: u64) -> (u64, u64) {
    if limit == 0 {
        return (0, window_ms);
    }
    if limit >= n {
        return (limit / n, window_ms);
    }
    (1, window_ms.saturating_mul(n.div_ceil(limit)))
}

/// `total` split N ways: shard `i`'s part, the remainder spread over the first shards.
fn part(total: u64, shards: u32, i: u32) -> u64 {
    let n = u64::from(shards.max(1));
    total / n + u64::from(u64::from(i) < total % n)
}

/// The op kind of shard `i` of `shards`.
pub fn shard_part(kind: OpKind, shards: u32, i: u32) -> OpKind {
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
        // The rules refuse shards on a sliding window, a sliding log and a calendar window.
        OpKind::SlidingWindow { .. }
        | OpKind::SlidingLog { .. }
        | OpKind::CalendarWindow { .. } => kind,
    }
}

/// A token bucket held to `ppm` parts per million of itself: a region's share of a global
/// limit (`regions/`). The capacity is rounded down, but a share of more than nothing keeps
/// at least one token (a bucket of 0 refuses everything for ever: a region asking a small part
/// of a limit with a small burst would get nothing at all); the refill keeps its exact rate by
/// stretching the window instead (`refill × ppm` per `window × 1,000,000`, reduced), unless
/// those numbers would pass what a double holds exactly (2^53, Lua's numbers), when the refill
/// is rounded down instead. The refill is never 0 (the scripts divide by it): a share of
/// nothing refuses everything by its capacity of 0, and still refills a trickle. The refills
/// of one limit's shares never add up past it, nor their capacities past it plus one token a
/// region. Other kinds are not shared (the rules refuse `global` on them) and pass unchanged.
pub fn region_part(kind: OpKind, ppm: u32) -> OpKind {
    let OpKind::TokenBucket {
        capacity,
        refill,
        window_ms,
    } = kind
    else {
        return kind;
    };
    const WHOLE: u64 = 1_000_000;
    let part =
        (u128::from(capacity) * u128::from(u64::from(ppm).min(WHOLE)) / u128::from(WHOLE)) as u64;
    let capacity = if ppm > 0 {
        part.max(capacity.min(1))
    } else {
        0
    };
    // The refill's share: at least one part per million, so it is never 0.
    let ppm = u64::from(ppm).clamp(1, WHOLE);
    let g = gcd(ppm, WHOLE);
    let (num, den) = (ppm / g, WHOLE / g);
    const EXACT: u64 = 1 << 53;
    let (refill, window_ms) = match (refill.checked_mul(num), window_ms.checked_mul(den)) {
        (Some(r), Some(w)) if r < EXACT && w < EXACT => (r, w),
        _ => (
            ((u128::from(refill) * u128::from(ppm) / u128::from(WHOLE)) as u64).max(1),
            window_ms,
        ),
    };
    OpKind::TokenBucket {
        capacity,
        refill,
        window_ms,
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The whole bucket's remaining tokens, estimated from one shard's.
pub fn shard_remaining(remaining: u64, shards: u32, capacity: u64) -> u64 {
    remaining.saturating_mul(u64::from(shards)).min(capacity)
}

/// What a lease claim of `need` (all or nothing) and up to `want` gets from a bucket holding
/// `available` (>= need) tokens, split `share` ways: the need, plus at most
/// `(available - need) / share` of the rest. In f64 like `lua/lease.lua`; every number here
/// is at most the capacity, so exact.
pub fn lease_grant(available: f64, need: u64, want: u64, share: u64) -> u64 {
    let spare = ((available - need as f64) / share.max(1) as f64).floor();
    let extra = (want.saturating_sub(need) as f64).min(spare.max(0.0));
    need + extra as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_part_keeps_the_rate_exact_and_rounds_the_capacity_down() {
        let tb = |capacity, refill, window_ms| OpKind::TokenBucket {
            capacity,
            refill,
            window_ms,
        };
        // 60 % of 100 per second: 3 per 50 ms… as 3 per 5 of the window, 60 of the 100 burst.
        assert_eq!(
            region_part(tb(100, 100, 1_000), 600_000),
            tb(60, 300, 5_000)
        );
        // A third: the capacity rounds down, the rate stays exact.
        assert_eq!(
            region_part(tb(10, 10, 60_000), 333_333),
            tb(3, 3_333_330, 60_000_000_000)
        );
        // Nothing, or the whole.
        assert_eq!(region_part(tb(10, 10, 1_000), 0), tb(0, 10, 1_000_000_000));
        // A small share keeps one token: 3.3 % of a burst of 10, at 3.3 a second.
        assert_eq!(
            region_part(tb(10, 100, 1_000), 33_333),
            tb(1, 3_333_300, 1_000_000_000)
        );
        assert_eq!(region_part(tb(10, 10, 1_000), 1_000_000), tb(10, 10, 1_000));
        // Past 2^53: the refill rounds down on the limit's own window.
        assert_eq!(
            region_part(tb(u64::MAX, u64::MAX / 2, 31_536_000_000), 333_333),
            tb(
                (u128::from(u64::MAX) * 333_333 / 1_000_000) as u64,
                (u128::from(u64::MAX / 2) * 333_333 / 1_000_000) as u64,
                31_536_000_000
            )
        );
        // Not a token bucket: unchanged.
        let fw = OpKind::FixedWindow {
            limit: 5,
            window_ms: 1_000,
        };
        assert_eq!(region_part(fw, 1), fw);
    }
    use crate::quota::Op;

    fn tb(capacity: u64, refill: u64) -> Op {
        Op {
            key: "k".into(),
            kind: OpKind::TokenBucket {
                capacity,
                refill,
                window_ms: 1_000,
            },
            cost: 1,
            action: Default::default(),
        }
    }

    #[test]
    fn a_share_keeps_the_algorithm_and_the_burst_ratio() {
        assert_eq!(
            fallback_part(tb(30, 30).kind, 3),
            OpKind::TokenBucket {
                capacity: 10,
                refill: 30,
                window_ms: 3_000
            },
            "10 now, 10/s refill"
        );
        // 5/s across 10 replicas: capacity rounds up to 1, refill stays at 0.5/s.
        assert_eq!(
            fallback_part(tb(5, 5).kind, 10),
            OpKind::TokenBucket {
                capacity: 1,
                refill: 5,
                window_ms: 10_000
            }
        );
        assert_eq!(window_share(100, 60_000, 3), (33, 60_000));
        assert_eq!(window_share(2, 60_000, 5), (1, 180_000), "1 per 3 minutes");
        assert_eq!(window_share(0, 60_000, 5), (0, 60_000), "0 stays 0");
    }

    #[test]
    fn a_calendar_window_share_keeps_its_calendar_or_stretches_a_plain_window() {
        let calendar = crate::quota::calendar::Calendar {
            unit: crate::quota::calendar::CalendarUnit::Month,
            offset_min: 0,
        };
        let month = |limit| OpKind::CalendarWindow {
            limit,
            calendar,
            window_ms: 30 * 86_400_000,
        };
        assert_eq!(fallback_part(month(300), 3), month(100));
        // Below one per replica: one per 2 nominal months (a calendar cannot be stretched).
        assert_eq!(
            fallback_part(month(2), 3),
            OpKind::FixedWindow {
                limit: 1,
                window_ms: 60 * 86_400_000
            }
        );
        assert_eq!(shard_part(month(10), 2, 0), month(10), "never sharded");
    }

    #[test]
    fn parts_add_up_to_the_limit() {
        for (total, n) in [(10, 3), (100, 4), (7, 7), (1_000_003, 16)] {
            let parts: Vec<u64> = (0..n).map(|i| part(total, n, i)).collect();
            assert_eq!(parts.iter().sum::<u64>(), total, "{total} / {n}");
            assert!(parts.iter().max().unwrap() - parts.iter().min().unwrap() <= 1);
            assert!(parts.iter().all(|&p| p >= 1));
        }
        let k = shard_part(
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
        assert_eq!(shard_remaining(3, 4, 10), 10);
        assert_eq!(shard_remaining(2, 4, 10), 8);
    }

    #[test]
    fn a_lease_gets_its_need_and_a_share_of_the_rest() {
        assert_eq!(lease_grant(100.0, 1, 10, 1), 10, "plenty: all it wants");
        assert_eq!(lease_grant(13.0, 1, 10, 3), 5, "1 + (13 - 1) / 3");
        assert_eq!(lease_grant(2.0, 2, 10, 3), 2, "the need, nothing spare");
        assert_eq!(
            lease_grant(5.0, 3, 3, 0),
            3,
            "want = need; share 0 counts as 1"
        );
    }
}
