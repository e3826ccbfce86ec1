//! The sliding window counter (`lua/sliding_window.lua`); the method is in the module doc
//! of `bucket/`.

use super::Outcome;

/// A sliding window counter's stored state: three numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlidingWindowState {
    /// Wall-clock start of the current window (epoch ms, a multiple of the window length).
    pub start_ms: u64,
    /// Hits allowed in the window before `start_ms`.
    pub prev: u64,
    /// Hits allowed in the current window.
    pub curr: u64,
}

impl SlidingWindowState {
    /// Whether this state answers like a bucket never seen, so it need not be stored.
    pub fn is_empty(&self) -> bool {
        self.prev == 0 && self.curr == 0
    }
}

/// One sliding-window-counter take of `cost` at wall time `now_ms`, with `limit` hits per
/// `window_ms` (see the module doc for the estimate). `state` is `None` for a bucket never seen.
///
/// The estimate and the waits are f64, computed in the same order as `sliding_window.lua` so
/// both agree to the bit: multiply first, divide once, so whole answers stay exact (10 hits
/// half a window ago weigh exactly 5). The reported times:
/// - `reset_ms`: until the estimate decays to 0 with no more hits: the end of the next window
///   while the current count is above 0, the end of this one if only the previous count is,
///   0 when both are 0 (then the state equals a fresh one and is not stored).
/// - `retry_ms`: 0 if allowed; `None` when the cost is above the limit or the limit is 0;
///   otherwise until the decaying estimate leaves room for the cost (see [`sliding_wait`]).
///
/// A stored window that is neither the current nor the previous one counts nothing: it ended
/// long ago, or (a clock that stepped back into an earlier window) it is ahead of `now_ms`,
/// which, like the fixed window, starts the window again rather than guessing.
///
/// With `overdraft` a take that does not fit is counted anyway (up to the estimate reaching
/// twice the limit: one limit of debt) and refused; its `retry_ms` is when a take of 1
/// fits again. The debt decays with the window, as every count does.
pub fn take_sliding(
    state: Option<SlidingWindowState>,
    now_ms: u64,
    limit: u64,
    window_ms: u64,
    cost: u64,
    overdraft: bool,
) -> (SlidingWindowState, Outcome) {
    let (start_ms, prev, curr) = counts_at(state, now_ms, window_ms);
    let w = window_ms as f64;
    let elapsed = (now_ms - start_ms) as f64;
    let mut estimate = prev as f64 * (w - elapsed) / w + curr as f64;
    let lim = limit as f64;
    let need = cost.max(1) as f64;
    let allowed = limit > 0 && estimate + need <= lim;
    let mut curr = curr;
    if allowed {
        // An allowed cost is at most the limit, so this never saturates in practice.
        curr = curr.saturating_add(cost);
        estimate += cost as f64;
    } else if overdraft && cost > 0 {
        // At most one limit of debt: the estimate after the charge stays within twice the
        // limit (capping only the current count let the previous window's debt add to it:
        // up to three limits deep at a window's start).
        let room = (2.0 * lim - estimate).max(0.0).floor() as u64;
        let charged = curr.saturating_add(cost.min(room));
        estimate += (charged - curr) as f64;
        curr = charged;
    }
    let reset_ms = decayed_after(start_ms, now_ms, window_ms, prev, curr);
    let retry_ms = if allowed {
        Some(0)
    } else if limit == 0 {
        None
    } else if overdraft {
        Some(sliding_wait(prev, curr, lim - 1.0, w, elapsed))
    } else if cost > limit {
        None
    } else {
        Some(sliding_wait(prev, curr, lim - need, w, elapsed))
    };
    let outcome = Outcome {
        allowed,
        remaining: (lim - estimate).max(0.0).floor() as u64,
        reset_ms,
        retry_ms,
        granted: if allowed { cost } else { 0 },
        found: None,
    };
    (
        SlidingWindowState {
            start_ms,
            prev,
            curr,
        },
        outcome,
    )
}

/// The window `now_ms` is in (its start) and the counts of it and of the one before, from the
/// stored state: a stored window that is the one before gives its count as the previous one;
/// an older one (or, after a clock step back, a later one) counts nothing.
fn counts_at(state: Option<SlidingWindowState>, now_ms: u64, window_ms: u64) -> (u64, u64, u64) {
    let start_ms = now_ms - now_ms % window_ms;
    let (prev, curr) = match state {
        Some(s) if s.start_ms == start_ms => (s.prev, s.curr),
        Some(s) if s.start_ms.checked_add(window_ms) == Some(start_ms) => (s.curr, 0),
        _ => (0, 0),
    };
    (start_ms, prev, curr)
}

/// Milliseconds until the estimate has decayed to 0 (the outcome's `reset_ms`): the end of the
/// next window while this one counts hits, the end of this one if only the previous does.
fn decayed_after(start_ms: u64, now_ms: u64, window_ms: u64, prev: u64, curr: u64) -> u64 {
    let end_ms = start_ms.saturating_add(window_ms) - now_ms;
    if curr > 0 {
        end_ms.saturating_add(window_ms)
    } else if prev > 0 {
        end_ms
    } else {
        0
    }
}

/// Gives `n` hits back to a sliding window (a refund: Envoy's `is_negative_hits`): off the
/// current window's count, never below its debt (`give_back_count`), and nothing when the
/// refund's receipt names an earlier window (`window_end_ms`, as on a fixed window). Hits of the window before are already being weighed
/// out as time passes; what is left of them stays (a window that has ended gets nothing back,
/// as on a fixed window). Never refused.
pub fn give_back_sliding(
    state: Option<SlidingWindowState>,
    now_ms: u64,
    limit: u64,
    window_ms: u64,
    n: u64,
    window_end_ms: Option<u64>,
) -> (SlidingWindowState, Outcome) {
    let (start_ms, prev, curr) = counts_at(state, now_ms, window_ms);
    let n = if super::fixed_window::receipt_is_current(window_end_ms, start_ms) {
        n
    } else {
        0
    };
    let curr = super::fixed_window::give_back_count(curr, limit, n);
    let w = window_ms as f64;
    let elapsed = (now_ms - start_ms) as f64;
    let estimate = prev as f64 * (w - elapsed) / w + curr as f64;
    let outcome = Outcome {
        allowed: true,
        remaining: (limit as f64 - estimate).max(0.0).floor() as u64,
        reset_ms: decayed_after(start_ms, now_ms, window_ms, prev, curr),
        retry_ms: Some(0),
        granted: 0,
        found: None,
    };
    (
        SlidingWindowState {
            start_ms,
            prev,
            curr,
        },
        outcome,
    )
}

/// Milliseconds from `elapsed` ms into a `w`-ms window until the estimate, decaying with no
/// more hits, is at most `room` (= limit - cost: the take fits). Only called for a refused take
/// whose cost fits the limit, so the estimate is above `room` now and `room >= 0`.
///
/// In this window the estimate is `prev * (w - x) / w + curr` at `x` ms into it, falling to
/// `curr` at its end; it gets to `room` at `x = w - (room - curr) * w / prev` if `curr <= room`.
/// Otherwise the next window must start: there `curr` is the previous count and the estimate
/// is `curr * (w - y) / w` at `y` ms in, which gets to `room` at `y = w - room * w / curr`.
/// Rounded up, and at least 1: a refused take is never told to retry at once (rounding must
/// not turn "a fraction of a ms" into 0).
fn sliding_wait(prev: u64, curr: u64, room: f64, w: f64, elapsed: f64) -> u64 {
    let (prev, curr) = (prev as f64, curr as f64);
    let wait = if prev > 0.0 && curr <= room {
        w - (room - curr) * w / prev - elapsed
    } else if curr > 0.0 {
        w - elapsed + (w - room * w / curr)
    } else {
        // Unreachable for a refused take (the estimate would be 0); the window's end is safe
        // and keeps every division defined.
        w - elapsed
    };
    (wait.ceil() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wall time that starts a second, a minute and an hour (472,222 hours after the epoch).
    const T0: u64 = 1_699_999_200_000;

    #[test]
    fn a_give_back_lowers_only_the_current_count_and_never_below_zero() {
        // 4 of 10 in the window before, 3 in this one, half-way through: estimate 2 + 3.
        let s = SlidingWindowState {
            start_ms: T0 - 1_000,
            prev: 1,
            curr: 4,
        };
        let (s, o) = take_sliding(Some(s), T0 + 500, 10, 1_000, 3, false);
        assert_eq!((s.prev, s.curr, o.remaining), (4, 3, 5));
        let (s, o) = give_back_sliding(Some(s), T0 + 500, 10, 1_000, 2, None);
        assert_eq!((s.prev, s.curr, o.remaining, o.allowed), (4, 1, 7, true));
        // More than the current count: 0, and the previous window keeps its weighed hits.
        let (s, o) = give_back_sliding(Some(s), T0 + 500, 10, 1_000, 50, None);
        assert_eq!((s.prev, s.curr, o.remaining), (4, 0, 8));
        assert_eq!(
            o.reset_ms, 500,
            "only the previous count is left, until this window ends"
        );
        // A window later, the old count is the previous one; a refund has nothing to take.
        let (s, o) = give_back_sliding(Some(s), T0 + 1_250, 10, 1_000, 1, None);
        assert_eq!((s.prev, s.curr, o.remaining), (0, 0, 10));
    }

    fn slide(steps: &[(u64, u64)], limit: u64, window_ms: u64) -> Vec<Outcome> {
        let mut state = None;
        steps
            .iter()
            .map(|&(now, cost)| {
                let (s, o) = take_sliding(state, now, limit, window_ms, cost, false);
                state = Some(s);
                o
            })
            .collect()
    }

    #[test]
    fn sliding_window_weighs_the_previous_window() {
        let out = slide(
            &[
                (T0 + 200, 10), // fills window 0
                (T0 + 500, 1),  // refused: 10 in this window
                (T0 + 1000, 1), // refused: 10 * 1.0 from the previous window
                (T0 + 1099, 1), // refused: 9.01 + 1 > 10
                (T0 + 1100, 1), // 9 + 1 fits
                (T0 + 1500, 4), // 10 * 0.5 + 1 + 4 = 10
                (T0 + 1500, 0), // nothing left
                (T0 + 2000, 0), // prev 5 at full weight: 5 left
            ],
            10,
            1000,
        );
        let allowed: Vec<bool> = out.iter().map(|o| o.allowed).collect();
        assert_eq!(
            allowed,
            [true, false, false, false, true, true, false, true]
        );
        assert_eq!(
            (out[0].remaining, out[0].reset_ms),
            (0, 1800),
            "end of the next window"
        );
        assert_eq!(out[1].retry_ms, Some(600), "100 ms into the next window");
        assert_eq!(out[1].reset_ms, 1500);
        assert_eq!(
            (out[2].remaining, out[2].retry_ms, out[2].reset_ms),
            (0, Some(100), 1000),
            "only the previous count: empty when this window ends"
        );
        assert_eq!(out[3].retry_ms, Some(1), "a fraction of a ms is rounded up");
        assert_eq!((out[4].remaining, out[4].reset_ms), (0, 1900));
        assert_eq!(out[5].remaining, 0);
        assert_eq!(
            out[6].retry_ms,
            Some(100),
            "0.1 ms per unit of the previous 10"
        );
        assert_eq!(
            (out[7].remaining, out[7].reset_ms),
            (5, 1000),
            "only the previous count"
        );
    }

    #[test]
    fn sliding_window_whole_estimates_are_exact() {
        // 25 hits, then 440 ms into the next window they weigh exactly 14: 11 left, and a take
        // of 11 fits. The textbook order, prev * (1 - elapsed / w), gives 14.000000000000002
        // and would report 10 left.
        let out = slide(&[(T0, 25), (T0 + 1_440, 0), (T0 + 1_440, 11)], 25, 1000);
        assert!(out.iter().all(|o| o.allowed));
        assert_eq!((out[1].remaining, out[2].remaining), (11, 0));
        assert_ne!(25.0 * (1.0 - 440.0 / 1000.0), 14.0, "why the order matters");
    }

    #[test]
    fn sliding_window_decays_to_nothing() {
        let (s, o) = take_sliding(None, T0 + 10, 5, 1000, 3, false);
        assert_eq!((o.remaining, o.reset_ms), (2, 1990));
        // One window later: prev = 3 at weight 0.75.
        let (s2, o) = take_sliding(Some(s), T0 + 1250, 5, 1000, 0, false);
        assert_eq!((s2.prev, s2.curr, s2.start_ms), (3, 0, T0 + 1000));
        assert_eq!((o.remaining, o.reset_ms), (2, 750), "5 - 2.25, floored");
        // Two windows later nothing is left, and the state is empty (not stored).
        let (s3, o) = take_sliding(Some(s), T0 + 2000, 5, 1000, 0, false);
        assert!(s3.is_empty());
        assert_eq!((o.remaining, o.reset_ms, o.retry_ms), (5, 0, Some(0)));
        let (_, o) = take_sliding(Some(s2), T0 + 1999, 5, 1000, 0, false);
        assert_eq!((o.remaining, o.reset_ms), (4, 1), "3 * 0.001 left");
    }

    #[test]
    fn sliding_window_check_only_does_not_consume() {
        let mut state = None;
        for _ in 0..3 {
            let (s, o) = take_sliding(state, T0, 2, 60_000, 0, false);
            assert!(o.allowed && o.remaining == 2);
            assert!(s.is_empty());
            state = Some(s);
        }
        let (s, o) = take_sliding(state, T0, 2, 60_000, 1, false);
        assert!(o.allowed && o.remaining == 1);
        let (s, o) = take_sliding(Some(s), T0 + 5, 2, 60_000, 0, false);
        assert!(o.allowed && o.remaining == 1 && s.curr == 1);
        let (s, _) = take_sliding(Some(s), T0 + 5, 2, 60_000, 1, false);
        let (s, o) = take_sliding(Some(s), T0 + 5, 2, 60_000, 0, false);
        assert!(!o.allowed, "check-only needs one whole unit");
        assert_eq!(s.curr, 2, "refusals count nothing");
        // 2 in this window: one unit frees up when the next window is half over.
        assert_eq!(o.retry_ms, Some(60_000 - 5 + 30_000));
    }

    #[test]
    fn sliding_window_cost_above_limit_and_zero_limit_never_fit() {
        for cost in [4, 1_000, u64::MAX] {
            let (s, o) = take_sliding(None, T0, 3, 1000, cost, false);
            assert!(!o.allowed, "cost {cost}");
            assert_eq!((o.remaining, o.retry_ms, o.reset_ms), (3, None, 0));
            assert!(s.is_empty(), "a refusal counts nothing");
        }
        let (s, _) = take_sliding(None, T0, 3, 1000, 1, false);
        let (_, o) = take_sliding(Some(s), T0, 3, 1000, 3, false);
        assert!(!o.allowed);
        assert_eq!(
            o.retry_ms,
            Some(2000),
            "3 fits only once the 1 has decayed: the end of the next window"
        );
        for cost in [1, 0] {
            let (s, o) = take_sliding(None, T0 + 7, 0, 1000, cost, false);
            assert!(!o.allowed && o.retry_ms.is_none() && o.remaining == 0);
            assert!(s.is_empty() && o.reset_ms == 0);
        }
    }

    #[test]
    fn sliding_window_saturates_and_survives_a_clock_step_back() {
        let (s, o) = take_sliding(None, T0, u64::MAX, 1000, u64::MAX, false);
        assert!(o.allowed && s.curr == u64::MAX);
        let (s, o) = take_sliding(Some(s), T0 + 1, u64::MAX, 1000, u64::MAX, false);
        assert!(!o.allowed && s.curr == u64::MAX && o.retry_ms >= Some(1));
        let (_, o) = take_sliding(None, T0, 10, u64::MAX, 5, false);
        assert!(o.allowed && o.reset_ms == u64::MAX, "saturated: {o:?}");
        // A clock that steps back into an earlier window starts it afresh, without panicking.
        let (s, _) = take_sliding(None, T0 + 5_000, 1, 1000, 1, false);
        let (s, o) = take_sliding(Some(s), T0 + 3_500, 1, 1000, 1, false);
        assert!(o.allowed && s.start_ms == T0 + 3_000);
    }

    /// For many states and costs: a refused take is never told to retry at once, a retry at the
    /// promised time fits, and one ms earlier does not (the closed form is tight).
    #[test]
    fn sliding_window_retry_is_positive_exact_and_tight() {
        let mut checked = 0;
        for window_ms in [1, 7, 1000, 60_000, 3_600_000] {
            for limit in [1, 2, 3, 10, 97, 1000] {
                for (prev, curr) in [
                    (0, 1),
                    (1, 0),
                    (3, 2),
                    (limit, 0),
                    (0, limit),
                    (limit / 2, limit / 2),
                ] {
                    let (prev, curr) = (prev.min(limit), curr.min(limit));
                    for at in [0, 1, window_ms / 3, window_ms / 2, window_ms - 1] {
                        let base = T0 - T0 % window_ms;
                        let now = base + at;
                        let state = SlidingWindowState {
                            start_ms: base,
                            prev,
                            curr,
                        };
                        for cost in [0, 1, 2, limit / 2, limit] {
                            let (_, o) =
                                take_sliding(Some(state), now, limit, window_ms, cost, false);
                            if o.allowed || cost > limit {
                                continue;
                            }
                            let Some(retry) = o.retry_ms else {
                                panic!("{state:?} w {window_ms} at {at} cost {cost}: {o:?}")
                            };
                            assert!(retry >= 1, "{state:?} at {at} cost {cost}");
                            let at_retry = take_sliding(
                                Some(state),
                                now + retry,
                                limit,
                                window_ms,
                                cost,
                                false,
                            )
                            .1;
                            assert!(
                                at_retry.allowed,
                                "{state:?} w {window_ms} at {at} cost {cost}: retry {retry}"
                            );
                            if retry > 1 {
                                let before = take_sliding(
                                    Some(state),
                                    now + retry - 1,
                                    limit,
                                    window_ms,
                                    cost,
                                    false,
                                )
                                .1;
                                assert!(
                                    !before.allowed,
                                    "{state:?} w {window_ms} at {at} cost {cost}: retry {retry} not tight"
                                );
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked > 500, "{checked}");
    }
}
