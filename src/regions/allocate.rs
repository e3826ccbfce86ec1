//! How a global limit is split between regions: each region's share, in parts per million of
//! the limit, from every region's demand. Pure arithmetic: `regions/mod.rs` feeds it what the
//! global store holds and applies the answer.
//!
//! The rule, for `R` configured regions:
//!
//! - A region the global store has not heard from lately (partitioned, down, or not started)
//!   may be serving on its **partition share**, `1/R` of the limit, so that much is kept for it.
//! - Every region that is heard from holds a **floor** (`region_floor` × `1/R`), so a key it
//!   has never asked for still admits something before its first exchange.
//! - What is left goes to the regions that are heard from by **max-min fairness** on their
//!   demand (with [`HEADROOM`]) above the floor: no region gets more than it asks while another
//!   that asks for more gets less than an equal part. What nobody asks for is split equally
//!   among them, so a burst in any region finds some room.
//!
//! A region's demand is measured over the last exchange and moves with its traffic; a share
//! cut to exactly that would refuse about half of a steady flow whose rate its refill only
//! just matches (a request early by a little finds the bucket a little short). So a region
//! asks for a fifth more than it used.
//!
//! The shares add up to at most one million (rounded down), so the regions' buckets together
//! never hold more than the limit.

/// One region, as the global store reports it for one key.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionDemand {
    /// Heard from within the lease (its heartbeat is fresh).
    pub reachable: bool,
    /// Tokens it asked for over one window of the limit, as a share of the limit in parts per
    /// million (may exceed a million: a region can ask for more than the whole limit).
    pub demand_ppm: u64,
}

/// A whole limit, in parts per million.
pub const WHOLE: u64 = 1_000_000;

/// What a region asks for, over what it used: a fifth more.
pub const HEADROOM: f64 = 1.2;

/// Each region's share in parts per million, in the order of `regions`; `floor` is the share
/// of its partition share a reachable region always holds (0 to 1).
pub fn allocate(regions: &[RegionDemand], floor: f64) -> Vec<u32> {
    let n = regions.len() as u64;
    if n == 0 {
        return Vec::new();
    }
    let partition = WHOLE / n;
    let floor_ppm = ((partition as f64) * floor.clamp(0.0, 1.0)).floor() as u64;
    let mut shares: Vec<u64> = regions
        .iter()
        .map(|r| if r.reachable { floor_ppm } else { partition })
        .collect();
    let reachable: Vec<usize> = (0..regions.len())
        .filter(|&i| regions[i].reachable)
        .collect();
    let mut left = WHOLE.saturating_sub(shares.iter().sum::<u64>());
    // Water-filling: the smallest wants are met first; each round offers every region still
    // wanting an equal part of what is left.
    let mut wanting: Vec<(u64, usize)> = reachable
        .iter()
        .map(|&i| {
            let asks = (regions[i].demand_ppm as f64 * HEADROOM).min(u64::MAX as f64) as u64;
            (asks.saturating_sub(floor_ppm), i)
        })
        .filter(|&(want, _)| want > 0)
        .collect();
    wanting.sort_unstable();
    let mut pending = wanting.len() as u64;
    for (want, i) in wanting {
        let part = left / pending;
        let given = want.min(part);
        shares[i] += given;
        left -= given;
        pending -= 1;
    }
    // Nobody wants the rest: an equal part to each reachable region.
    if !reachable.is_empty() && left > 0 {
        let part = left / reachable.len() as u64;
        for &i in &reachable {
            shares[i] += part;
        }
    }
    shares.into_iter().map(|s| s.min(WHOLE) as u32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn up(demand_ppm: u64) -> RegionDemand {
        RegionDemand {
            reachable: true,
            demand_ppm,
        }
    }

    fn down() -> RegionDemand {
        RegionDemand {
            reachable: false,
            demand_ppm: 0,
        }
    }

    #[test]
    fn skewed_demand_over_the_limit_is_split_max_min_fair() {
        // 8:1:1 asking 1.6× the limit: the small ones get what they ask (and the headroom),
        // the big one the rest.
        let s = allocate(&[up(1_600_000), up(200_000), up(200_000)], 0.1);
        assert_eq!(s, [520_000, 240_000, 240_000]);
        // Everyone over an equal part: equal parts.
        let s = allocate(&[up(900_000), up(800_000), up(700_000)], 0.1);
        assert!(s.iter().all(|&x| (333_332..=333_334).contains(&x)), "{s:?}");
    }

    #[test]
    fn what_nobody_asks_for_is_split_equally_and_idle_regions_keep_their_floor() {
        let s = allocate(&[up(100_000), up(0), up(0)], 0.1);
        // Floors 33,333 each; the first asks 120,000 (with the headroom): 86,667 more;
        // 813,334 left, 271,111 each.
        assert_eq!(s, [120_000 + 271_111, 33_333 + 271_111, 33_333 + 271_111]);
    }

    #[test]
    fn a_region_not_heard_from_is_kept_its_partition_share() {
        let s = allocate(&[up(5_000_000), down(), up(0)], 0.1);
        assert_eq!(s[1], 333_333);
        assert_eq!(s[2], 33_333);
        assert_eq!(s[0], WHOLE as u32 - 333_333 - 33_333);
        // Nobody heard from: each on its partition share.
        assert_eq!(allocate(&[down(), down()], 0.1), [500_000, 500_000]);
    }

    proptest! {
        #[test]
        fn shares_never_add_up_past_the_limit_and_keep_their_guarantees(
            regions in prop::collection::vec((any::<bool>(), 0u64..3_000_000), 1..8),
            floor in 0.0f64..=1.0,
        ) {
            let regions: Vec<RegionDemand> = regions
                .into_iter()
                .map(|(reachable, demand_ppm)| RegionDemand { reachable, demand_ppm })
                .collect();
            let s = allocate(&regions, floor);
            let total: u64 = s.iter().map(|&x| u64::from(x)).sum();
            prop_assert!(total <= WHOLE, "{s:?}");
            let n = regions.len() as u64;
            let floor_ppm = ((WHOLE / n) as f64 * floor).floor() as u32;
            for (r, &x) in regions.iter().zip(&s) {
                if r.reachable {
                    prop_assert!(x >= floor_ppm);
                    // Asked for less than an equal part: got at least what it asked.
                    if r.demand_ppm <= WHOLE / n {
                        prop_assert!(u64::from(x) + 1 >= r.demand_ppm);
                    }
                } else {
                    prop_assert_eq!(u64::from(x), WHOLE / n);
                }
            }
        }
    }
}
