//! The sliding log (`lua/sliding_log.lua`): every admitted hit is recorded with its time, and a
//! take of `cost` is admitted when the hits of the last `window_ms` plus the cost fit the
//! limit. Exact at every instant, window edges included, for a memory that grows with the
//! limit (the rules cap `requests_per_unit` at `sliding_log_max_limit`).
//!
//! A hit at time `t` counts while `now - window_ms < t`, i.e. it leaves the window at
//! `t + window_ms`. A refused take records nothing; a cost of 0 checks (allowed while at
//! least one hit is left). The reported times: `reset_ms` until the newest hit leaves (the
//! log is empty then), `retry_ms` until enough of the oldest hits have left for the cost to
//! fit (`None` when it never can: a cost above the limit, or a limit of 0).

use std::collections::VecDeque;

use super::Outcome;

/// A sliding log's stored state: the admitted hits still in the window, oldest first, as
/// runs of hits at one time (`lua/sliding_log.lua` keeps one sorted-set member per hit).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlidingLog {
    /// (time in epoch ms, hits at that time), sorted by time.
    pub runs: VecDeque<(u64, u64)>,
    /// The hits of all runs.
    pub total: u64,
}

impl SlidingLog {
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Drops the hits that have left the window at `now_ms` (those at or before
    /// `now_ms - window_ms`).
    fn trim(&mut self, now_ms: u64, window_ms: u64) {
        let Some(edge) = now_ms.checked_sub(window_ms) else {
            return;
        };
        while let Some(&(t, n)) = self.runs.front() {
            if t > edge {
                break;
            }
            self.total -= n;
            self.runs.pop_front();
        }
    }

    /// Records `n` hits at `t`, keeping the runs sorted (a clock that stepped back puts a
    /// hit before later ones).
    fn record(&mut self, t: u64, n: u64) {
        self.total += n;
        match self.runs.back_mut() {
            Some((last, hits)) if *last == t => *hits += n,
            Some((last, _)) if *last > t => {
                let at = self.runs.partition_point(|&(u, _)| u < t);
                match self.runs.get_mut(at) {
                    Some((u, hits)) if *u == t => *hits += n,
                    _ => self.runs.insert(at, (t, n)),
                }
            }
            _ => self.runs.push_back((t, n)),
        }
    }

    /// The time of the `k`-th oldest hit (1-based), if the log holds that many.
    fn kth_oldest(&self, k: u64) -> Option<u64> {
        let mut seen = 0;
        self.runs.iter().find_map(|&(t, n)| {
            seen += n;
            (seen >= k).then_some(t)
        })
    }
}

/// One sliding-log take of `cost` at wall time `now_ms`, with `limit` hits per `window_ms`,
/// on `log` in place (it may hold up to `limit` hits: copying it per take would cost more
/// than the take).
pub fn take_log(
    log: &mut SlidingLog,
    now_ms: u64,
    limit: u64,
    window_ms: u64,
    cost: u64,
) -> Outcome {
    log.trim(now_ms, window_ms);
    let count = log.total;
    let need = cost.max(1);
    let allowed = limit > 0 && count.saturating_add(need) <= limit;
    if allowed && cost > 0 {
        log.record(now_ms, cost);
    }
    let leaves = |t: u64| t.saturating_add(window_ms).saturating_sub(now_ms);
    let retry_ms = if allowed {
        Some(0)
    } else if limit == 0 || cost > limit {
        None
    } else {
        // Enough of the oldest hits must leave for `need` to fit: count + need - limit.
        log.kth_oldest(count + need - limit)
            .map(|t| leaves(t).max(1))
    };
    Outcome {
        allowed,
        remaining: limit.saturating_sub(log.total),
        reset_ms: log.runs.back().map_or(0, |&(t, _)| leaves(t)),
        retry_ms,
        granted: if allowed { cost } else { 0 },
        found: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: u64 = 1_699_999_200_000;

    #[test]
    fn exact_at_the_window_edge() {
        let mut log = SlidingLog::default();
        // 3 a second: two at t, one at t + 900.
        assert!(take_log(&mut log, T0, 3, 1_000, 2).allowed);
        assert!(take_log(&mut log, T0 + 900, 3, 1_000, 1).allowed);
        let o = take_log(&mut log, T0 + 999, 3, 1_000, 1);
        assert!(!o.allowed);
        assert_eq!(o.retry_ms, Some(1), "the two at t leave at t + 1000");
        let o = take_log(&mut log, T0 + 999, 3, 1_000, 3);
        assert_eq!(
            o.retry_ms,
            Some(901),
            "all three must leave: the last at t + 1900"
        );
        // At t + 1000 the first two have left, exactly.
        let o = take_log(&mut log, T0 + 1_000, 3, 1_000, 2);
        assert!(o.allowed && o.remaining == 0, "{o:?}");
        assert_eq!(o.reset_ms, 1_000, "the newest leaves a window from now");
        // A check neither records nor needs more than one hit of room.
        assert!(!take_log(&mut log, T0 + 1_000, 3, 1_000, 0).allowed);
        assert_eq!(log.total, 3);
    }

    #[test]
    fn refused_takes_record_nothing_and_impossible_ones_never_fit() {
        let mut log = SlidingLog::default();
        assert_eq!(take_log(&mut log, T0, 2, 1_000, 3).retry_ms, None);
        assert_eq!(take_log(&mut log, T0, 0, 1_000, 0).retry_ms, None);
        assert!(log.is_empty());
        let o = take_log(&mut log, T0, 2, 1_000, 0);
        assert!(o.allowed && o.reset_ms == 0 && o.remaining == 2);
        assert!(
            take_log(&mut log, T0, 2, 1_000, u64::MAX)
                .retry_ms
                .is_none()
        );
    }

    #[test]
    fn a_clock_step_back_keeps_the_log_sorted() {
        let mut log = SlidingLog::default();
        take_log(&mut log, T0 + 500, 10, 1_000, 1);
        take_log(&mut log, T0 + 100, 10, 1_000, 2);
        take_log(&mut log, T0 + 500, 10, 1_000, 1);
        assert_eq!(log.runs, VecDeque::from([(T0 + 100, 2), (T0 + 500, 2)]));
        // At T0 + 1100 the hits at T0 + 100 have left.
        let o = take_log(&mut log, T0 + 1_100, 10, 1_000, 0);
        assert_eq!((o.remaining, log.total), (8, 2));
    }
}
