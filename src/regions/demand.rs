//! How much of a global key one replica asks for: a rate measured over a span long enough for
//! its **region** to have asked a few requests, so a tenant seen every few seconds is not
//! counted as asking nothing, and a key busy across 200 replicas, each seeing a request now
//! and then, is still read fast. Pure arithmetic: `regions/mod.rs` closes a period of each key
//! at every exchange and halfway between (its tokens, requests and length go into a
//! [`History`]) and sends what [`History::demand_ppm`] answers to the global store.
//!
//! The demand is read from the newest periods back, tokens over time:
//!
//! - **The span** is as long as the region takes to ask [`ENOUGH_HITS`] tokens at the rate the
//!   global store last reported for it (every replica of a region gets the same total back, so
//!   they measure over the same span and their rates add up to the region's), at least one
//!   period and at most a lease. Before the region has a rate (a key new to it), the span holds
//!   [`ENOUGH_HITS`] of this replica's own requests.
//! - **A sparse key is measured over the lease**: one request every three seconds is three in
//!   the last ten seconds, a third of a request a second, where one period alone reads 0 most
//!   of the time and a whole second's worth now and then (and the allocation, which lets a
//!   share grow only when two exchanges agree, kept the smaller: the floor).
//! - **A change is read at once**: the span stops before an older period far from what the
//!   span so far predicts for it (more than twice it and four requests more, or less than half
//!   of it and four fewer). A fall is read from the first whole period after it, so the region
//!   whose demand rose gets the room within two exchanges; a sparse key that turns busy is read
//!   from its busy periods alone, not averaged over a quiet lease.
//! - **A key that stops** being asked for fades over the lease (its last requests stay in the
//!   span until they are a lease old).

use std::collections::VecDeque;

use super::WHOLE;

/// Requests a demand's span must hold, unless a lease of periods holds fewer: a count of 16
/// varies by about a quarter (Poisson arrivals), which the allocation's headroom absorbs.
pub const ENOUGH_HITS: u64 = 16;

/// Demand above this (parts per million of the limit: a million times the limit) is counted as
/// this: the global store sums it in Lua's doubles.
pub const MAX_DEMAND_PPM: u64 = 1_000_000_000_000;

/// One period between two exchanges, as one replica saw one key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Period {
    /// Tokens asked (a request's cost; 1 for most).
    pub tokens: u64,
    /// Requests that asked them.
    pub hits: u64,
    /// How long the period lasted (ms, at least 1).
    pub ms: u64,
}

/// A key's recent periods, newest first, covering at most a lease.
#[derive(Debug, Default)]
pub struct History {
    periods: VecDeque<Period>,
}

impl History {
    /// Adds the period that just closed and drops those past `lease_ms` (the newest is always
    /// kept, however long it was).
    pub fn push(&mut self, period: Period, lease_ms: u64) {
        self.periods.push_front(Period {
            ms: period.ms.max(1),
            ..period
        });
        let mut covered = 0u64;
        let mut keep = 0;
        for p in &self.periods {
            if keep > 0 && covered.saturating_add(p.ms) > lease_ms {
                break;
            }
            covered = covered.saturating_add(p.ms);
            keep += 1;
        }
        self.periods.truncate(keep);
    }

    /// The demand, over one window of the limit (`refill` tokens per `window_ms`), in parts per
    /// million of it (see the module doc). `region_ppm` is the region's total demand the
    /// global store last reported, in the same unit (0: none yet).
    pub fn demand_ppm(&self, refill: u64, window_ms: u64, region_ppm: u64) -> u64 {
        let (refill, window_ms) = (refill.max(1), window_ms.max(1));
        // How long the region takes to ask ENOUGH_HITS tokens: ENOUGH_HITS × window × WHOLE /
        // (region_ppm × refill), in ms.
        let span_ms = (region_ppm > 0).then(|| {
            let ms = u128::from(ENOUGH_HITS) * u128::from(window_ms) * u128::from(WHOLE)
                / (u128::from(region_ppm) * u128::from(refill)).max(1);
            ms.min(u128::from(u64::MAX)) as u64
        });
        let (mut tokens, mut hits, mut ms) = (0u64, 0u64, 0u64);
        for p in &self.periods {
            if ms > 0 {
                match span_ms {
                    Some(span) if ms >= span => break,
                    None if hits >= ENOUGH_HITS => break,
                    _ => {}
                }
                // Only once the span holds requests: a key with none lately fades over the
                // lease (a batch every few seconds is still asking, between its bursts).
                if hits > 0 {
                    let expected = hits as f64 * p.ms as f64 / ms as f64;
                    let got = p.hits as f64;
                    if got > 2.0 * expected + 4.0 || got < expected / 2.0 - 4.0 {
                        break;
                    }
                }
            }
            tokens = tokens.saturating_add(p.tokens);
            hits = hits.saturating_add(p.hits);
            ms = ms.saturating_add(p.ms);
        }
        if tokens == 0 {
            return 0;
        }
        // Tokens per window as parts per million of the refill, divided once (a sparse key's
        // few tokens would round to nothing divided twice).
        let scaled = u128::from(tokens)
            .saturating_mul(u128::from(window_ms))
            .saturating_mul(u128::from(WHOLE));
        (scaled / (u128::from(ms.max(1)) * u128::from(refill))).min(u128::from(MAX_DEMAND_PPM))
            as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn period(hits: u64, ms: u64) -> Period {
        Period {
            tokens: hits,
            hits,
            ms,
        }
    }

    /// A limit of 60 a minute: one a second is a million parts per million.
    fn per_minute(h: &History) -> u64 {
        h.demand_ppm(60, 60_000, 0)
    }

    #[test]
    fn a_sparse_key_is_measured_over_the_lease_not_over_one_period() {
        // One request every 3.3 s, exchanges every second: most periods see none.
        let mut h = History::default();
        for s in 0..30u64 {
            let hit = u64::from(s % 10 == 0 || s % 10 == 3 || s % 10 == 6);
            h.push(period(hit, 1_000), 10_000);
            if s >= 9 {
                // Three requests in the last ten seconds: 0.3 a second, 30 % of the limit.
                assert_eq!(per_minute(&h), 300_000, "at {s} s");
            }
        }
    }

    #[test]
    fn a_busy_key_is_measured_over_the_last_period_alone() {
        let mut h = History::default();
        for _ in 0..5 {
            h.push(period(20, 1_000), 10_000);
        }
        assert_eq!(h.demand_ppm(100, 1_000, 0), 200_000);
        // Demand jumps to 150 a second: seen at the next exchange, not averaged away.
        h.push(period(150, 1_000), 10_000);
        assert_eq!(h.demand_ppm(100, 1_000, 0), 1_500_000);
        // And falls back: 20 requests is enough to measure, so the drop is seen at once too.
        h.push(period(20, 1_000), 10_000);
        assert_eq!(h.demand_ppm(100, 1_000, 0), 200_000);
    }

    #[test]
    fn a_fall_in_demand_is_read_from_the_first_period_after_it() {
        let mut h = History::default();
        for _ in 0..5 {
            h.push(period(75, 1_000), 10_000);
        }
        // 10 a second now: fewer than enough requests in one period, but the one before is
        // far busier than 10 a second predicts, so it is not counted.
        h.push(period(10, 1_000), 10_000);
        assert_eq!(h.demand_ppm(100, 1_000, 0), 100_000);
        // A quiet period between two as quiet is counted as usual.
        h.push(period(4, 1_000), 10_000);
        assert_eq!(h.demand_ppm(100, 1_000, 0), 70_000);
    }

    #[test]
    fn the_span_follows_the_regions_rate_so_many_replicas_each_seeing_little_read_fast() {
        // One replica of 200 in a busy region: half a request a period here, the region 100 a
        // second (a million ppm of a 100 a second limit): 16 requests take the region 160 ms,
        // so the last period alone counts, as it does on every replica of the region.
        let mut h = History::default();
        for hit in [1, 0, 0, 1, 0, 1] {
            h.push(period(hit, 500), 10_000);
        }
        assert_eq!(h.demand_ppm(100, 1_000, 1_000_000), 20_000);
        h.push(period(0, 500), 10_000);
        assert_eq!(h.demand_ppm(100, 1_000, 1_000_000), 0);
        // The same replica in a sparse region (1 % of the limit): the lease.
        assert_eq!(h.demand_ppm(100, 1_000, 10_000), 3 * 100_000 / 35);
    }

    #[test]
    fn a_sparse_key_that_turns_busy_is_read_from_its_busy_periods_alone() {
        let mut h = History::default();
        for s in 0..20u64 {
            h.push(period(u64::from(s % 7 == 0), 500), 10_000);
        }
        h.push(period(40, 500), 10_000);
        assert_eq!(h.demand_ppm(100, 1_000, 30_000), 800_000);
    }

    #[test]
    fn a_key_that_stops_fades_over_the_lease_and_then_asks_nothing() {
        let mut h = History::default();
        h.push(period(8, 1_000), 10_000);
        let mut last = u64::MAX;
        for _ in 0..9 {
            h.push(period(0, 1_000), 10_000);
            let d = h.demand_ppm(100, 1_000, 0);
            assert!(d < last && d > 0, "{d} after {last}");
            last = d;
        }
        h.push(period(0, 1_000), 10_000);
        assert_eq!(h.demand_ppm(100, 1_000, 0), 0);
    }

    #[test]
    fn costs_count_as_tokens_and_huge_demand_is_capped() {
        let mut h = History::default();
        h.push(
            Period {
                tokens: 500,
                hits: 1,
                ms: 1_000,
            },
            10_000,
        );
        assert_eq!(h.demand_ppm(1_000, 1_000, 0), 500_000);
        h.push(
            Period {
                tokens: u64::MAX,
                hits: 1,
                ms: 1,
            },
            10_000,
        );
        assert_eq!(h.demand_ppm(1, 31_536_000_000, 0), MAX_DEMAND_PPM);
    }
}
