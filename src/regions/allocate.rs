//! How a global limit is split between regions: each region's share, in parts per million of
//! the limit, from every region's demand. Pure arithmetic: `regions/mod.rs` feeds it what the
//! global store holds and applies the answer.
//!
//! The rule, for configured regions of weights `w` (1 each unless `regions` gives them):
//!
//! - A region the global store has not heard from lately (partitioned, down, or not started)
//!   may be serving on its **partition share**, `w / Σw` of the limit (`1/R` with equal
//!   weights), so that much is kept for it.
//! - Every region that is heard from holds a **floor** (`region_floor` × its partition share),
//!   so a key it has never asked for still admits something before its first exchange.
//! - What is left goes to the regions that are heard from by **weighted max-min fairness** on
//!   their demand (with [`HEADROOM`]) above the floor: no region gets more than it asks while
//!   another that asks for more gets less than its weighted part. What nobody asks for is split
//!   by weight among them, so a burst in any region finds some room.
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
    /// Its weight (`regions`: `name=weight`; 1 by default), above 0.
    pub weight: f64,
}

/// Each region's partition share in parts per million (its weight's part of the whole,
/// rounded down): what it is kept while not heard from, and what it holds cut off.
pub fn partition_shares(weights: &[f64]) -> Vec<u64> {
    let total: f64 = weights.iter().sum();
    weights
        .iter()
        .map(|w| {
            if total > 0.0 {
                ((WHOLE as f64) * w / total).floor() as u64
            } else {
                0
            }
        })
        .collect()
}

/// A whole limit, in parts per million.
pub const WHOLE: u64 = 1_000_000;

/// What a region asks for, over what it used: a fifth more.
pub const HEADROOM: f64 = 1.2;

/// Each region's share in parts per million, in the order of `regions`; `floor` is the share
/// of its partition share a reachable region always holds (0 to 1).
pub fn allocate(regions: &[RegionDemand], floor: f64) -> Vec<u32> {
    if regions.is_empty() {
        return Vec::new();
    }
    let weights: Vec<f64> = regions.iter().map(|r| r.weight).collect();
    let partitions = partition_shares(&weights);
    let floor = floor.clamp(0.0, 1.0);
    let floors: Vec<u64> = partitions
        .iter()
        .map(|&p| ((p as f64) * floor).floor() as u64)
        .collect();
    let mut shares: Vec<u64> = (0..regions.len())
        .map(|i| {
            if regions[i].reachable {
                floors[i]
            } else {
                partitions[i]
            }
        })
        .collect();
    let reachable: Vec<usize> = (0..regions.len())
        .filter(|&i| regions[i].reachable)
        .collect();
    let mut left = WHOLE.saturating_sub(shares.iter().sum::<u64>());
    // Weighted water-filling: the smallest wants per unit of weight are met first; each region
    // still wanting is offered its weight's part of what is left.
    let mut wanting: Vec<(u64, usize)> = reachable
        .iter()
        .map(|&i| {
            let asks = (regions[i].demand_ppm as f64 * HEADROOM).min(u64::MAX as f64) as u64;
            (asks.saturating_sub(floors[i]), i)
        })
        .filter(|&(want, _)| want > 0)
        .collect();
    wanting.sort_by(|a, b| (a.0 as f64 / weights[a.1]).total_cmp(&(b.0 as f64 / weights[b.1])));
    let mut pending: f64 = wanting.iter().map(|&(_, i)| weights[i]).sum();
    for (want, i) in wanting {
        let part = ((left as f64) * weights[i] / pending).floor() as u64;
        let given = want.min(part).min(left);
        shares[i] += given;
        left -= given;
        pending -= weights[i];
    }
    // Nobody wants the rest: each reachable region its weight's part.
    let reachable_weight: f64 = reachable.iter().map(|&i| weights[i]).sum();
    if reachable_weight > 0.0 && left > 0 {
        let whole_left = left;
        for &i in &reachable {
            let part = ((whole_left as f64) * weights[i] / reachable_weight).floor() as u64;
            let given = part.min(left);
            shares[i] += given;
            left -= given;
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
            weight: 1.0,
        }
    }

    fn down() -> RegionDemand {
        RegionDemand {
            reachable: false,
            demand_ppm: 0,
            weight: 1.0,
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

    #[test]
    fn weights_set_the_partition_shares_the_floors_and_the_fair_parts() {
        let w = |reachable: bool, demand_ppm: u64, weight: f64| RegionDemand {
            reachable,
            demand_ppm,
            weight,
        };
        // us weighs 2 of 4: half the limit kept for it while not heard from.
        let s = allocate(
            &[w(false, 0, 2.0), w(true, 5_000_000, 1.0), w(true, 0, 1.0)],
            0.1,
        );
        assert_eq!(s[0], 500_000);
        assert_eq!(s[2], 25_000, "a quarter's floor");
        assert_eq!(s[1], 475_000);
        // Everyone asking for everything: parts by weight.
        let s = allocate(
            &[
                w(true, 9_000_000, 2.0),
                w(true, 9_000_000, 1.0),
                w(true, 9_000_000, 1.0),
            ],
            0.1,
        );
        assert!((499_999..=500_001).contains(&s[0]), "{s:?}");
        assert!((249_999..=250_001).contains(&s[1]), "{s:?}");
        // Equal weights: as without weights.
        assert_eq!(partition_shares(&[1.0, 1.0, 1.0]), [333_333; 3]);
    }

    proptest! {
        #![proptest_config(crate::testing::proptest_config(256))]
        #[test]
        fn shares_never_add_up_past_the_limit_and_keep_their_guarantees(
            regions in prop::collection::vec((any::<bool>(), 0u64..3_000_000, 1u32..=8), 1..8),
            floor in 0.0f64..=1.0,
        ) {
            let regions: Vec<RegionDemand> = regions
                .into_iter()
                .map(|(reachable, demand_ppm, w)| RegionDemand {
                    reachable,
                    demand_ppm,
                    weight: f64::from(w) / 2.0,
                })
                .collect();
            let s = allocate(&regions, floor);
            let total: u64 = s.iter().map(|&x| u64::from(x)).sum();
            prop_assert!(total <= WHOLE, "{s:?}");
            let weights: Vec<f64> = regions.iter().map(|r| r.weight).collect();
            let partitions = partition_shares(&weights);
            for ((r, &x), &partition) in regions.iter().zip(&s).zip(&partitions) {
                if r.reachable {
                    prop_assert!(u64::from(x) >= (partition as f64 * floor).floor() as u64);
                    // Asked for less than its partition share: got at least what it asked.
                    if r.demand_ppm <= partition {
                        prop_assert!(u64::from(x) + 1 >= r.demand_ppm, "{s:?} {regions:?}");
                    }
                } else {
                    prop_assert_eq!(u64::from(x), partition);
                }
            }
        }
    }
}
