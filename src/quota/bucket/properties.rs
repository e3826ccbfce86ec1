//! Property tests: random runs of takes, the clock mostly moving forward, sometimes not at
//! all and sometimes stepping back (a failover to a skewed host), costs from 0 (a check)
//! to far above the capacity.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

/// A wall time that starts a second, a minute and an hour (472,222 hours after the epoch).
const T0: u64 = 1_699_999_200_000;

/// A run: clock steps (ms, possibly negative unless `back` is false) and costs.
fn run(window_ms: u64, capacity: u64, back: bool) -> impl Strategy<Value = Vec<(i64, u64)>> {
    let w = i64::try_from(window_ms).unwrap_or(i64::MAX / 4);
    let dt = prop_oneof![
        4 => Just(0_i64),
        8 => 1..=w,
        2 => w..=3 * w,
        2 => -2 * w..0,
    ]
    // Without `back`, a step back stands still instead: the clock never decreases.
    .prop_map(move |dt| if back { dt } else { dt.max(0) });
    let cost = prop_oneof![
        2 => Just(0_u64),
        8 => 1..=capacity.max(1),
        2 => capacity + 1..=3 * capacity + 1,
        1 => Just(u64::MAX),
    ];
    prop::collection::vec((dt, cost), 1..80)
}

/// A bucket's size or refill: small (where off-by-one bugs show) or large, up to a
/// billion (where f64 rounding bugs live).
fn amount() -> impl Strategy<Value = u64> {
    prop_oneof![3 => 0_u64..=20, 1 => 21_u64..=1_000_000_000]
}

/// A window: short, or the rules' long units (an hour, a day, a year, and a
/// multiple of a day, as `unit_multiplier` gives).
fn window() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 1_u64..=5_000,
        1 => Just(3_600_000_u64),
        1 => Just(86_400_000_u64),
        1 => Just(31_536_000_000_u64),
        1 => (2_u64..=400).prop_map(|days| days * 86_400_000),
    ]
}

/// Token-bucket parameters as the rules produce them: a capacity of 0 only with no
/// refill (`requests_per_unit: 0`); otherwise `burst` >= 1.
fn token_params() -> impl Strategy<Value = TokenBucketParams> {
    (amount(), amount(), window()).prop_map(|(capacity, refill, window_ms)| TokenBucketParams {
        capacity,
        refill: if capacity == 0 { 0 } else { refill },
        window_ms,
    })
}

fn token_case() -> impl Strategy<Value = (TokenBucketParams, u64, Vec<(i64, u64)>)> {
    (token_params(), any::<bool>())
        .prop_flat_map(|(p, back)| (Just(p), 0..p.window_ms, run(p.window_ms, p.capacity, back)))
}

fn window_case() -> impl Strategy<Value = (u64, u64, u64, bool, Vec<(i64, u64)>)> {
    (amount(), window(), any::<bool>()).prop_flat_map(|(limit, w, back)| {
        (
            Just(limit),
            Just(w),
            0..3 * w,
            Just(back),
            run(w, limit, back),
        )
    })
}

/// A window algorithm's refusal: `retry_ms` is `None` exactly when the cost can never fit
/// (a zero limit, a cost above it), else > 0, and after waiting it the cost fits.
fn refusal_waits_until_it_fits(
    o: &Outcome,
    limit: u64,
    cost: u64,
    fits_after: impl Fn(u64) -> bool,
) -> Result<(), TestCaseError> {
    let can_fit = limit > 0 && cost <= limit;
    match o.retry_ms {
        Some(r) => {
            prop_assert!(can_fit && r > 0, "{:?}", o);
            prop_assert!(fits_after(r), "limit {} cost {} {:?}", limit, cost, o);
        }
        None => prop_assert!(!can_fit, "limit {} cost {}", limit, cost),
    }
    Ok(())
}

/// What a window algorithm admitted: per window, and in the current stretch of takes in
/// one window (stepping the clock back into another window starts a stretch afresh).
struct Admitted {
    per_window: HashMap<u64, u128>,
    stretch: (u64, u128),
}

impl Admitted {
    fn new() -> Self {
        Admitted {
            per_window: HashMap::new(),
            stretch: (u64::MAX, 0),
        }
    }

    /// Records one take in the window starting at `start_ms`; returns the stretch's total.
    fn record(&mut self, start_ms: u64, allowed: bool, cost: u64) -> u128 {
        if self.stretch.0 != start_ms {
            self.stretch = (start_ms, 0);
        }
        if allowed {
            self.stretch.1 += u128::from(cost);
            *self.per_window.entry(start_ms).or_default() += u128::from(cost);
        }
        self.stretch.1
    }

    fn every_window_within(&self, limit: u64) -> bool {
        self.per_window.values().all(|&n| n <= u128::from(limit))
    }
}

proptest! {
    #![proptest_config(crate::testing::proptest_config(512))]

    /// Never more than `capacity` tokens, never below 0; a check or a refused take
    /// takes nothing; over a run, admitted ≤ capacity + what refilled in the time
    /// seen; `retry_ms` is `None` exactly when the cost can never fit, else > 0 and
    /// the cost is there after it (up to f64 rounding; 1 ms later at the latest).
    #[test]
    fn token_bucket_invariants((p, offset, steps) in token_case()) {
        let mut state: Option<TokenBucketState> = None;
        let mut now = T0 + offset;
        let mut first_ms: Option<u64> = None;
        let mut latest = 0;
        let mut admitted: u128 = 0;
        for (dt, cost) in steps {
            now = now.saturating_add_signed(dt);
            let first = *first_ms.get_or_insert(now);
            latest = latest.max(now);
            let (check, _) = take_token(state, now, p, 0, false);
            let (next, o) = take_token(state, now, p, cost, false);

            prop_assert!(next.tokens >= 0.0 && next.tokens <= p.capacity as f64, "{next:?}");
            prop_assert!(o.remaining <= p.capacity, "{o:?}");
            prop_assert_eq!(o.allowed, o.retry_ms == Some(0), "{:?}", o);
            if cost == 0 {
                // A check consumes nothing: any take right after it answers as if the
                // check had not happened.
                for c in [1, p.capacity, p.capacity + 1] {
                    prop_assert_eq!(take_token(Some(next), now, p, c, false), take_token(state, now, p, c, false));
                }
            }
            if o.allowed {
                admitted += u128::from(cost);
            } else {
                // Refused: the bucket is only brought up to date, as a check would.
                prop_assert_eq!(next, check);
                let can_fit = p.capacity > 0 && cost <= p.capacity && p.refill > 0;
                match o.retry_ms {
                    Some(r) => {
                        prop_assert!(can_fit && r > 0, "{:?} cost {} {:?}", p, cost, o);
                        // Waited on the bucket's clock, which never steps back
                        // (`ts_ms` is the latest time it has seen), the cost fits:
                        // exactly then, f64 rounding included (0.39 tokens + 570 ms at
                        // 1 per 354 ms is 1.9999999999999998; 10^8 tokens an ulp short
                        // at 10 a year is 45 ms more), unless that moment is past
                        // u64 ms.
                        if let Some(at) = next.ts_ms.checked_add(r) {
                            let (_, then) = take_token(Some(next), at, p, cost, false);
                            prop_assert!(then.allowed, "{:?} {:?} cost {} retry {}", p, next, cost, r);
                        }
                        // And the wait is not much longer than the refill takes: the
                        // plain quotient plus at most four steps of one ulp's refill.
                        let (w, rf) = (p.window_ms as f64, p.refill as f64);
                        let need = cost.max(1) as f64;
                        let plain = ((need - next.tokens) * w / rf).ceil();
                        let step = (need * f64::EPSILON * w / rf).ceil().max(1.0);
                        prop_assert!(r as f64 <= plain + 4.0 * step, "retry {} vs {} + 4 x {}", r, plain, step);
                    }
                    None => prop_assert!(!can_fit, "{:?} cost {}", p, cost),
                }
            }
            // Never more than a full bucket plus what refilled since the first take
            // (up to the rounding of the sums: relative at large numbers).
            let refilled = (latest - first) as f64 * p.refill as f64 / p.window_ms as f64;
            let bound = p.capacity as f64 + refilled;
            prop_assert!(
                admitted as f64 <= bound + 1e-6 + bound * 1e-12,
                "admitted {} > {} + {}", admitted, p.capacity, refilled
            );
            state = Some(next);
        }
    }

    /// Admitted ≤ limit per window (per stretch of takes in one window when the clock
    /// steps back, since stepping into another window starts it afresh); a refused hit
    /// counts up to the limit, and every answer is the reference's (whose counter counts
    /// every hit); a refusal waits until the window
    /// ends, after which the cost fits, or is `None` when it never can.
    #[test]
    fn fixed_window_invariants((limit, w, offset, back, steps) in window_case()) {
        let mut state: Option<WindowState> = None;
        let mut reference: Option<(u64, u64)> = None;
        let mut now = T0 + offset;
        let mut admitted = Admitted::new();
        for (dt, cost) in steps {
            now = now.saturating_add_signed(dt);
            let (check, _) = take_window(state, now, limit, w, 0, false);
            let (next, o) = take_window(state, now, limit, w, cost, false);
            let start_ms = now - now % w;
            prop_assert_eq!(next.start_ms, start_ms);
            prop_assert!(o.reset_ms > 0 && o.reset_ms <= w, "{:?}", o);
            prop_assert_eq!(o.remaining, limit.saturating_sub(next.count));
            prop_assert_eq!(o.allowed, o.retry_ms == Some(0), "{:?}", o);
            // A refused hit counts up to the limit and no further (a count past the limit is
            // debt, which only charges make); a check counts nothing.
            // (A check leaves an earlier window's state as stored; with no debt it counts 0.)
            let before = if check.start_ms == start_ms { check.count } else { 0 };
            let want = if cost == 0 || o.allowed {
                before.saturating_add(cost)
            } else {
                before.max(limit)
            };
            prop_assert_eq!(next.count, want);
            prop_assert!(next.count <= limit);
            // The answers are the reference's, whose counter counts every hit and runs on.
            let ref_before = match reference {
                Some((start, c)) if start == start_ms => c,
                _ => 0u64,
            };
            let ref_after = ref_before.saturating_add(cost);
            prop_assert_eq!(o.allowed, if cost == 0 { ref_before < limit } else { ref_after <= limit });
            prop_assert_eq!(o.remaining, limit.saturating_sub(ref_after));
            reference = Some((start_ms, ref_after));

            let in_stretch = admitted.record(start_ms, o.allowed, cost);
            prop_assert!(in_stretch <= u128::from(limit), "{}", in_stretch);
            if !back {
                // With a clock that never steps back, that is per window.
                prop_assert!(admitted.every_window_within(limit));
            }
            if !o.allowed {
                // The window's end is the wait.
                prop_assert!(o.retry_ms.is_none_or(|r| r == o.reset_ms), "{:?}", o);
                refusal_waits_until_it_fits(&o, limit, cost, |r| {
                    take_window(Some(next), now + r, limit, w, cost, false).1.allowed
                })?;
            }
            state = Some(next);
        }
    }

    /// After an allowed take the module's estimate (previous count weighted by what is
    /// left of its window, plus the current count) is ≤ limit; `curr` is exactly what
    /// was admitted in the current window (so ≤ limit); a refusal or a check counts
    /// nothing; `retry_ms` is `None` exactly when the cost can never fit, else > 0 and
    /// the cost fits after it.
    #[test]
    fn sliding_window_invariants((limit, w, offset, back, steps) in window_case()) {
        let mut state: Option<SlidingWindowState> = None;
        let mut now = T0 + offset;
        let mut admitted = Admitted::new();
        for (dt, cost) in steps {
            now = now.saturating_add_signed(dt);
            let (check, _) = take_sliding(state, now, limit, w, 0, false);
            let (next, o) = take_sliding(state, now, limit, w, cost, false);
            let start_ms = now - now % w;
            prop_assert_eq!(next.start_ms, start_ms);
            prop_assert_eq!(o.allowed, o.retry_ms == Some(0), "{:?}", o);
            // The module's estimate of the hits in the last window, after this take.
            let elapsed = (now - start_ms) as f64;
            let estimate = next.prev as f64 * (w as f64 - elapsed) / w as f64 + next.curr as f64;
            // Floored, up to the last bit of the sum's order.
            let left = (limit as f64 - estimate).max(0.0) - o.remaining as f64;
            prop_assert!((-1e-9..1.0 + 1e-9).contains(&left), "{:?} {:?}", next, o);
            if o.allowed {
                prop_assert!(estimate <= limit as f64 + 1e-9, "{} > {}", estimate, limit);
                prop_assert_eq!(next.curr, check.curr + cost);
            } else {
                // A refused take counts nothing (unlike the fixed window).
                prop_assert_eq!(next, check);
            }
            if cost == 0 {
                for c in [1, limit, limit + 1] {
                    prop_assert_eq!(
                        take_sliding(Some(next), now, limit, w, c, false),
                        take_sliding(state, now, limit, w, c, false)
                    );
                }
            }

            // `curr` is exactly what was admitted in this window, and within the limit.
            prop_assert_eq!(u128::from(next.curr), admitted.record(start_ms, o.allowed, cost));
            prop_assert!(next.curr <= limit);
            if !back {
                prop_assert!(admitted.every_window_within(limit));
            }
            if !o.allowed {
                refusal_waits_until_it_fits(&o, limit, cost, |r| {
                    take_sliding(Some(next), now + r, limit, w, cost, false).1.allowed
                })?;
            }
            state = Some(next);
        }
    }

    /// Overdraft, every algorithm: a take of a non-zero cost is always charged (in full, down
    /// to the debt floor: a token bucket's `-capacity`, a window's count of twice the limit, a
    /// sliding window's estimate of twice the limit), allowed or not; a check charges nothing; a refusal says when a take of 1 fits
    /// again (`None` only when nothing ever refills, or the limit is 0), and it does then.
    #[test]
    fn overdraft_charges_every_take_and_says_when_the_debt_is_paid(
        (p, offset, steps) in token_case(),
        (limit, w, w_offset, _back, w_steps) in window_case(),
    ) {
        let mut state: Option<TokenBucketState> = None;
        let mut now = T0 + offset;
        for (dt, cost) in steps {
            now = now.saturating_add_signed(dt);
            let (check, _) = take_token(state, now, p, 0, true);
            let (next, o) = take_token(state, now, p, cost, true);
            let cap = p.capacity as f64;
            prop_assert!(next.tokens >= -cap && next.tokens <= cap, "{next:?}");
            prop_assert_eq!(next.tokens.to_bits(), (check.tokens - cost as f64).max(-cap).to_bits(), "charged in full, to the floor");
            if !o.allowed {
                match o.retry_ms {
                    Some(r) => {
                        prop_assert!(r > 0);
                        if let Some(at) = next.ts_ms.checked_add(r) {
                            prop_assert!(take_token(Some(next), at, p, 1, true).1.allowed, "{:?} {:?} retry {}", p, next, r);
                        }
                    }
                    None => prop_assert!(p.capacity == 0 || p.refill == 0, "{:?}", p),
                }
            }
            state = Some(next);
        }

        let (mut fixed, mut sliding): (Option<WindowState>, Option<SlidingWindowState>) = (None, None);
        let mut now = T0 + w_offset;
        for (dt, cost) in w_steps {
            now = now.saturating_add(dt.unsigned_abs());
            // What the window holds before the take: its own count, or what is left of an
            // earlier window's debt (a limit paid per window since).
            let start_ms = now - now % w;
            let before = match fixed {
                Some(f) if f.start_ms == start_ms => f.count,
                Some(f) if f.start_ms < start_ms => {
                    f.count.saturating_sub((start_ms - f.start_ms) / w * limit)
                }
                _ => 0,
            };
            let (next, o) = take_window(fixed, now, limit, w, cost, true);
            prop_assert_eq!(o.allowed, before.saturating_add(cost.max(1)) <= limit || (cost == 0 && before < limit));
            if cost > 0 {
                prop_assert_eq!(next.count, before.saturating_add(cost).min(2 * limit));
            }
            if !o.allowed {
                match o.retry_ms {
                    Some(r) => {
                        prop_assert!(r > 0 && r <= o.reset_ms, "{:?}", o);
                        prop_assert!(take_window(Some(next), now + r, limit, w, 1, true).1.allowed, "limit {} {:?} {:?}", limit, next, o);
                        // Not a window earlier.
                        if r > w {
                            prop_assert!(!take_window(Some(next), now + r - w, limit, w, 1, true).1.allowed);
                        }
                    }
                    None => prop_assert_eq!(limit, 0),
                }
            }
            fixed = Some(next);

            let (check, _) = take_sliding(sliding, now, limit, w, 0, true);
            let (next, o) = take_sliding(sliding, now, limit, w, cost, true);
            prop_assert!(next.curr <= 2 * limit, "{:?}", next);
            // One limit of debt at most: the estimate (the previous count weighted by what
            // is left of its window, plus the current) stays within twice the limit, however
            // deep the previous window went.
            let start_ms = now - now % w;
            // As `take_sliding` computes it, to the bit: `prev × (w − elapsed) / w`, not
            // `prev × ((w − elapsed) / w)`, which rounds differently for large counts (a
            // random case with counts near 10⁹ found `room` one apart).
            let (wf, elapsed) = (w as f64, (now - start_ms) as f64);
            let estimate = |s: &SlidingWindowState| {
                if s.start_ms == start_ms { s.prev as f64 * (wf - elapsed) / wf + s.curr as f64 } else { 0.0 }
            };
            if cost > 0 {
                prop_assert!(estimate(&next) <= (2 * limit) as f64 + 1e-6, "{:?} {}", next, estimate(&next));
            }
            if !o.allowed && cost > 0 {
                let room = (2.0 * limit as f64 - estimate(&check)).max(0.0).floor() as u64;
                prop_assert_eq!(next.curr, check.curr.saturating_add(cost.min(room)));
            }
            if !o.allowed {
                match o.retry_ms {
                    Some(r) => prop_assert!(r > 0 && take_sliding(Some(next), now + r, limit, w, 1, true).1.allowed, "limit {} {:?} {:?}", limit, next, o),
                    None => prop_assert_eq!(limit, 0),
                }
            }
            sliding = Some(next);
        }
    }

    /// The sliding log is exact: in every window-long span ending at an admitted take, the
    /// admitted hits are at most the limit; a refusal's wait is exact (the cost fits then,
    /// and not 1 ms earlier); a refused take or a check records nothing.
    #[test]
    fn sliding_log_is_exact_in_every_span((limit, w, offset, _back, steps) in window_case()) {
        let limit = limit.min(10_000);
        let mut log = SlidingLog::default();
        let mut now = T0 + offset;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (dt, cost) in steps {
            now = now.saturating_add(dt.unsigned_abs());
            let before = log.total;
            let o = take_log(&mut log, now, limit, w, cost);
            if o.allowed && cost > 0 {
                admitted.push((now, cost));
                let in_span: u64 = admitted.iter().filter(|(t, _)| t + w > now).map(|(_, c)| c).sum();
                prop_assert!(in_span <= limit, "{} admitted in the span ending at {}", in_span, now);
                prop_assert_eq!(log.total, in_span);
            } else if !o.allowed {
                prop_assert!(log.total <= before, "a refusal recorded hits");
                match o.retry_ms {
                    Some(r) => {
                        prop_assert!(r > 0);
                        let mut later = log.clone();
                        prop_assert!(take_log(&mut later, now + r, limit, w, cost).allowed, "{:?} cost {} retry {}", log, cost, r);
                        if r > 1 {
                            let mut sooner = log.clone();
                            prop_assert!(!take_log(&mut sooner, now + r - 1, limit, w, cost).allowed, "retry {} is not the first moment", r);
                        }
                    }
                    None => prop_assert!(limit == 0 || cost > limit),
                }
            }
        }
    }
}
