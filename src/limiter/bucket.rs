//! The bucket math, in one place: the memory store runs it, and the Lua scripts in `lua/`
//! mirror it line for line (the store contract tests hold the two to the same answers).
//!
//! Token bucket: `capacity` tokens, refilled continuously at `refill` tokens per `window_ms`;
//! a take of `cost` succeeds when that many tokens are there and removes them. A refused take
//! removes nothing. Fixed window: a counter per epoch-aligned window; like envoyproxy/ratelimit,
//! every hit is counted (also refused ones) and a hit is over when the count passes the limit.
//!
//! A cost of 0 checks without consuming: allowed while at least one unit is left.

/// The result of one take, in the units the response needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub allowed: bool,
    /// Whole tokens (or requests) left after this take, floored.
    pub remaining: u64,
    /// Milliseconds until the bucket is full again (token bucket) or the window ends.
    pub reset_ms: u64,
    /// Milliseconds until a refused take of the same cost would fit; `None` when it never
    /// can (the cost is above the capacity, or nothing refills). 0 when allowed.
    pub retry_ms: Option<u64>,
}

/// The numbers of a token bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucketParams {
    pub capacity: u64,
    /// Tokens added per `window_ms`.
    pub refill: u64,
    pub window_ms: u64,
}

/// A token bucket's stored state: two numbers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenBucketState {
    pub tokens: f64,
    /// When `tokens` was last brought up to date (monotonic ms; Redis `TIME` in Lua).
    pub ts_ms: u64,
}

impl TokenBucketParams {
    /// Tokens refilled in `elapsed_ms`. Multiply first, divide once: whole-token answers stay
    /// exact in f64 (e.g. 2/hour gives exactly one token after 1,800,000 ms), and
    /// `token_bucket.lua` computes it in the same order so both agree to the bit.
    fn refilled(&self, elapsed_ms: f64) -> f64 {
        elapsed_ms * self.refill as f64 / self.window_ms as f64
    }

    /// Milliseconds for `missing` tokens to refill, rounded up; `None` if nothing refills.
    fn wait_ms(&self, missing: f64) -> Option<u64> {
        if missing <= 0.0 {
            return Some(0);
        }
        (self.refill > 0)
            .then(|| (missing * self.window_ms as f64 / self.refill as f64).ceil() as u64)
    }
}

/// One token-bucket take at `now_ms`. `state` is `None` for a bucket never seen (full).
/// Returns the state to store and the outcome.
pub fn take_token(
    state: Option<TokenBucketState>,
    now_ms: u64,
    p: TokenBucketParams,
    cost: u64,
) -> (TokenBucketState, Outcome) {
    let capacity = p.capacity as f64;
    let last_ms = state.map_or(now_ms, |s| s.ts_ms);
    let mut tokens = match state {
        None => capacity,
        Some(s) => {
            let elapsed = now_ms.saturating_sub(s.ts_ms) as f64;
            capacity.min(s.tokens + p.refilled(elapsed))
        }
    };
    let need = cost.max(1) as f64;
    let allowed = p.capacity > 0 && tokens >= need;
    if allowed {
        tokens -= cost as f64;
    }
    let retry_ms = if allowed {
        Some(0)
    } else if cost > p.capacity {
        None
    } else {
        p.wait_ms(need - tokens)
    };
    let outcome = Outcome {
        allowed,
        remaining: tokens.max(0.0).floor() as u64,
        // A bucket that never refills is reported to reset at its window, like the reference.
        reset_ms: p.wait_ms(capacity - tokens).unwrap_or(p.window_ms),
        retry_ms,
    };
    // A clock that steps back (a failover to a skewed host) must not refill twice later.
    (
        TokenBucketState {
            tokens,
            ts_ms: now_ms.max(last_ms),
        },
        outcome,
    )
}

/// Milliseconds after `now_ms` at which a token bucket in `state` is full again, i.e. when its
/// stored state stops mattering and may be dropped (the Lua script's `PEXPIRE`).
pub fn token_idle_after_ms(state: TokenBucketState, p: TokenBucketParams) -> u64 {
    p.wait_ms(p.capacity as f64 - state.tokens)
        .unwrap_or(p.window_ms)
        .max(1)
}

/// A fixed window's stored state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowState {
    /// Wall-clock start of the window (epoch ms, a multiple of the window length).
    pub start_ms: u64,
    pub count: u64,
}

/// One fixed-window hit of `cost` at wall time `now_ms`, with `limit` hits per `window_ms`.
pub fn take_window(
    state: Option<WindowState>,
    now_ms: u64,
    limit: u64,
    window_ms: u64,
    cost: u64,
) -> (WindowState, Outcome) {
    let start_ms = now_ms - now_ms % window_ms;
    let before = match state {
        Some(s) if s.start_ms == start_ms => s.count,
        _ => 0,
    };
    let reset_ms = start_ms + window_ms - now_ms;
    let (count, allowed) = if cost == 0 {
        (before, before < limit)
    } else {
        let after = before.saturating_add(cost);
        (after, after <= limit)
    };
    let retry_ms = if allowed {
        Some(0)
    } else if cost > limit || limit == 0 {
        None
    } else {
        Some(reset_ms)
    };
    let outcome = Outcome {
        allowed,
        remaining: limit.saturating_sub(count),
        reset_ms,
        retry_ms,
    };
    (WindowState { start_ms, count }, outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: TokenBucketParams = TokenBucketParams {
        capacity: 10,
        refill: 10,
        window_ms: 1000,
    };

    fn run(p: TokenBucketParams, steps: &[(u64, u64)]) -> Vec<Outcome> {
        let mut state = None;
        steps
            .iter()
            .map(|&(now, cost)| {
                let (s, o) = take_token(state, now, p, cost);
                state = Some(s);
                o
            })
            .collect()
    }

    #[test]
    fn a_new_bucket_is_full_and_drains() {
        let out = run(P, &[(0, 1), (0, 8), (0, 1), (0, 1)]);
        assert_eq!(
            out.iter().map(|o| o.allowed).collect::<Vec<_>>(),
            [true, true, true, false]
        );
        assert_eq!(out[0].remaining, 9);
        assert_eq!(out[0].reset_ms, 100, "one token refills in 100 ms");
        assert_eq!(out[2].remaining, 0);
        assert_eq!(out[3].retry_ms, Some(100));
        assert_eq!(
            out[3].reset_ms, 1000,
            "empty bucket is full again after one window"
        );
    }

    #[test]
    fn refills_smoothly_and_caps_at_capacity() {
        let out = run(P, &[(0, 10), (250, 0), (250, 3), (10_000, 0)]);
        assert_eq!(out[1].remaining, 2, "250 ms refill 2.5 tokens, floored");
        assert!(out[1].allowed, "check-only sees a token");
        assert!(!out[2].allowed, "2.5 tokens cannot pay 3");
        assert_eq!(out[2].retry_ms, Some(50), "0.5 tokens missing at 10/s");
        assert_eq!(out[3].remaining, 10, "capped at capacity");
        assert_eq!(out[3].reset_ms, 0);
    }

    #[test]
    fn check_only_does_not_consume() {
        let out = run(P, &[(0, 9), (0, 0), (0, 0), (0, 1), (0, 0)]);
        assert!(out[1].allowed && out[2].allowed);
        assert_eq!(out[2].remaining, 1);
        assert!(out[3].allowed);
        assert!(!out[4].allowed, "less than one token left");
        assert_eq!(out[4].retry_ms, Some(100));
    }

    #[test]
    fn cost_above_capacity_never_fits() {
        let out = run(P, &[(0, 11)]);
        assert!(!out[0].allowed);
        assert_eq!((out[0].retry_ms, out[0].remaining), (None, 10));
        // Huge costs do not overflow.
        let out = run(P, &[(0, u64::MAX)]);
        assert!(!out[0].allowed);
    }

    #[test]
    fn zero_rate_denies_everything_without_infinite_waits() {
        let zero = TokenBucketParams {
            capacity: 0,
            refill: 0,
            window_ms: 1000,
        };
        let out = run(zero, &[(0, 1), (5000, 0)]);
        assert!(
            out.iter()
                .all(|o| !o.allowed && o.remaining == 0 && o.retry_ms.is_none())
        );
        assert_eq!(out[0].reset_ms, 0);
        // A burst without refill drains once and then stays empty.
        let once = TokenBucketParams {
            capacity: 2,
            refill: 0,
            window_ms: 1000,
        };
        let out = run(once, &[(0, 2), (1_000_000, 1)]);
        assert!(out[0].allowed && !out[1].allowed);
        assert_eq!((out[1].retry_ms, out[1].reset_ms), (None, 1000));
    }

    #[test]
    fn burst_differs_from_refill() {
        let p = TokenBucketParams {
            capacity: 100,
            refill: 60,
            window_ms: 60_000,
        };
        let out = run(p, &[(0, 100), (1000, 1), (1500, 1)]);
        assert!(out[0].allowed && out[1].allowed && !out[2].allowed);
        assert_eq!(out[2].retry_ms, Some(500), "one token per second");
    }

    #[test]
    fn clock_going_backwards_does_not_refill_or_panic() {
        let out = run(P, &[(5000, 10), (1000, 1), (5000, 1)]);
        assert!(!out[1].allowed && !out[2].allowed);
    }

    #[test]
    fn idle_time_is_time_to_full() {
        let (s, _) = take_token(None, 0, P, 4);
        assert_eq!(token_idle_after_ms(s, P), 400);
        let (s, _) = take_token(None, 0, P, 0);
        assert_eq!(
            token_idle_after_ms(s, P),
            1,
            "a full bucket expires at once"
        );
    }

    #[test]
    fn fixed_window_counts_like_the_reference() {
        let w = 60_000;
        let t0 = 1_700_000_000_000 - 1_700_000_000_000 % w + 1_000; // 1 s into a window
        let (s, o) = take_window(None, t0, 3, w, 2);
        assert!(o.allowed);
        assert_eq!((o.remaining, o.reset_ms), (1, 59_000));
        let (s, o) = take_window(Some(s), t0 + 10, 3, w, 2);
        assert!(!o.allowed, "3 + 1 > 3");
        assert_eq!((s.count, o.remaining, o.retry_ms), (4, 0, Some(58_990)));
        let (_, o) = take_window(Some(s), t0, 3, w, 0);
        assert!(!o.allowed, "check-only after the limit");
        // The next window starts from zero.
        let (s, o) = take_window(Some(s), t0 + w, 3, w, 1);
        assert!(o.allowed);
        assert_eq!((s.count, s.start_ms), (1, t0 - 1_000 + w));
        let (_, o) = take_window(None, t0, 3, w, 4);
        assert_eq!(o.retry_ms, None, "more than the limit never fits");
        let (_, o) = take_window(None, t0, 0, w, 1);
        assert!(!o.allowed && o.retry_ms.is_none());
        let (s, _) = take_window(None, t0, 5, w, u64::MAX);
        assert_eq!(s.count, u64::MAX, "saturates");
    }
}
