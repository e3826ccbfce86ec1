//! The bucket math, in one place: the memory store runs it, and the Lua scripts in `lua/`
//! mirror it line for line (`tests/lua_mirror.rs` holds the two to the same answers).
//!
//! Token bucket: `capacity` tokens, refilled continuously at `refill` tokens per `window_ms`;
//! a take of `cost` succeeds when that many tokens are there and removes them. A refused take
//! removes nothing. Fixed window: a counter per epoch-aligned window; like envoyproxy/ratelimit,
//! every hit is counted (also refused ones) and a hit is over when the count passes the limit.
//!
//! Sliding window counter ([`take_sliding`]): epoch-aligned windows like the fixed window, but a
//! take looks back one window length. It keeps the count of the current window and of the one
//! before, and estimates the hits in the last `window_ms` as
//! `prev * (1 - elapsed / window_ms) + curr` (`elapsed`: ms since the current window started),
//! i.e. as if the previous window's hits had been spread evenly over it. A take of `cost` is
//! allowed when `estimate + cost <= limit` and adds `cost` to the current count; unlike the
//! fixed window, a refused take counts nothing (a client that keeps retrying does not push its
//! own reset further out). It avoids the fixed window's double burst at a window edge without
//! storing every hit's time.
//!
//! A cost of 0 checks without consuming: allowed while at least one unit is left.

/// The result of one take, in the units the response needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub allowed: bool,
    /// Whole tokens (or requests) left after this take, floored.
    pub remaining: u64,
    /// Milliseconds until the bucket is full again (token bucket) or the window ends.
    pub reset_ms: u64,
    /// Milliseconds until a refused take of the same cost would fit; `None` when it never
    /// can (the cost is above the capacity, or nothing refills). 0 when allowed.
    pub retry_ms: Option<u64>,
    /// Tokens this op took for the caller: the cost of an allowed take, what a lease claim
    /// was granted (its cost plus any extra), 0 when refused or for a give-back.
    pub granted: u64,
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

    /// Milliseconds until a bucket holding `tokens` holds `target`, rounded up, as this very
    /// arithmetic sees it (`tokens + refilled(ms) >= target`); `None` if nothing refills.
    ///
    /// The plain quotient is one ulp short now and then when the numbers are large (a
    /// bucket of 10^8 with 10 a year: an ulp of the balance, 1.5e-8 tokens, takes 45 ms to
    /// refill), and a client told to retry then would be refused again. So the wait steps
    /// on by the time one ulp of `target` takes to refill until the sum is there (a step or
    /// two at most; bounded at four).
    fn wait_ms(&self, tokens: f64, target: f64) -> Option<u64> {
        if tokens >= target {
            return Some(0);
        }
        if self.refill == 0 {
            return None;
        }
        let (window, refill) = (self.window_ms as f64, self.refill as f64);
        let mut ms = ((target - tokens) * window / refill).ceil();
        let step = (target * f64::EPSILON * window / refill).ceil().max(1.0);
        for _ in 0..4 {
            if tokens + self.refilled(ms) >= target {
                break;
            }
            ms += step;
        }
        // `as` saturates: a wait past u64::MAX ms is "never" in all but name.
        Some(ms as u64)
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
        p.wait_ms(tokens, need)
    };
    let outcome = Outcome {
        allowed,
        remaining: tokens.max(0.0).floor() as u64,
        // A bucket that never refills is reported to reset at its window, like the reference.
        reset_ms: p.wait_ms(tokens, capacity).unwrap_or(p.window_ms),
        retry_ms,
        granted: if allowed { cost } else { 0 },
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
    p.wait_ms(state.tokens, p.capacity as f64)
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

/// The fixed window at wall time `now_ms`: its start, the hits counted in it so far (0 when
/// the stored window is another one) and the ms until it ends.
fn window_at(state: Option<WindowState>, now_ms: u64, window_ms: u64) -> (u64, u64, u64) {
    let start_ms = now_ms - now_ms % window_ms;
    let before = match state {
        Some(s) if s.start_ms == start_ms => s.count,
        _ => 0,
    };
    (start_ms, before, start_ms + window_ms - now_ms)
}

/// One fixed-window hit of `cost` at wall time `now_ms`, with `limit` hits per `window_ms`.
pub fn take_window(
    state: Option<WindowState>,
    now_ms: u64,
    limit: u64,
    window_ms: u64,
    cost: u64,
) -> (WindowState, Outcome) {
    let (start_ms, before, reset_ms) = window_at(state, now_ms, window_ms);
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
        granted: if allowed { cost } else { 0 },
    };
    (WindowState { start_ms, count }, outcome)
}

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
pub fn take_sliding(
    state: Option<SlidingWindowState>,
    now_ms: u64,
    limit: u64,
    window_ms: u64,
    cost: u64,
) -> (SlidingWindowState, Outcome) {
    let start_ms = now_ms - now_ms % window_ms;
    let (prev, curr) = match state {
        Some(s) if s.start_ms == start_ms => (s.prev, s.curr),
        // The stored window is the one before: its count becomes the previous count.
        Some(s) if s.start_ms.checked_add(window_ms) == Some(start_ms) => (s.curr, 0),
        _ => (0, 0),
    };
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
    }
    let end_ms = start_ms.saturating_add(window_ms) - now_ms;
    let reset_ms = if curr > 0 {
        end_ms.saturating_add(window_ms)
    } else if prev > 0 {
        end_ms
    } else {
        0
    };
    let retry_ms = if allowed {
        Some(0)
    } else if cost > limit || limit == 0 {
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

/// What a lease claim asks of a bucket (`lua/lease.lua`; the lease itself is `limiter/lease.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaimAsk {
    /// Tokens that must all be granted, or none: the part of a request's cost the lease does
    /// not cover. At least 1.
    pub need: u64,
    /// Most tokens to take (at least `need`): the need plus what the lease would like to keep.
    pub want: u64,
    /// The extra beyond `need` is at most `(available - need) / share`: with `share` = live
    /// replicas, a nearly spent bucket is split between replicas instead of hoarded by the
    /// first one to claim. At least 1.
    pub share: u64,
}

impl ClaimAsk {
    /// What a bucket with `available` (>= need) tokens grants. In f64 like `lease.lua`; every
    /// number here is at most the capacity, so exact.
    fn grant(&self, available: f64) -> u64 {
        let spare = ((available - self.need as f64) / self.share.max(1) as f64).floor();
        let extra = (self.want.saturating_sub(self.need) as f64).min(spare.max(0.0));
        self.need + extra as u64
    }
}

/// The tokens of a token bucket at `now_ms` (refilled since it was stored, capped at the
/// capacity) and the time they were last brought up to date.
fn tokens_at(state: Option<TokenBucketState>, now_ms: u64, p: TokenBucketParams) -> (f64, u64) {
    let capacity = p.capacity as f64;
    match state {
        None => (capacity, now_ms),
        Some(s) => {
            let elapsed = now_ms.saturating_sub(s.ts_ms) as f64;
            (capacity.min(s.tokens + p.refilled(elapsed)), s.ts_ms)
        }
    }
}

/// A lease claim on a token bucket: all of `ask.need` and up to `ask.want` (see [`ClaimAsk`]),
/// or nothing. `remaining` is what the shared bucket keeps after the grant; a refused claim's
/// `retry_ms` is when `need` would fit, as for a take of that cost.
pub fn claim_token(
    state: Option<TokenBucketState>,
    now_ms: u64,
    p: TokenBucketParams,
    ask: ClaimAsk,
) -> (TokenBucketState, Outcome) {
    let (mut tokens, last_ms) = tokens_at(state, now_ms, p);
    let ask = ClaimAsk {
        need: ask.need.max(1),
        ..ask
    };
    let need = ask.need;
    let allowed = p.capacity > 0 && tokens >= need as f64;
    let granted = if allowed { ask.grant(tokens) } else { 0 };
    tokens -= granted as f64;
    let retry_ms = if allowed {
        Some(0)
    } else if need > p.capacity {
        None
    } else {
        p.wait_ms(tokens, need as f64)
    };
    let outcome = Outcome {
        allowed,
        remaining: tokens.max(0.0).floor() as u64,
        reset_ms: p.wait_ms(tokens, p.capacity as f64).unwrap_or(p.window_ms),
        retry_ms,
        granted,
    };
    (
        TokenBucketState {
            tokens,
            ts_ms: now_ms.max(last_ms),
        },
        outcome,
    )
}

/// Gives `n` unspent leased tokens back to a token bucket, capped at its capacity.
pub fn return_token(
    state: Option<TokenBucketState>,
    now_ms: u64,
    p: TokenBucketParams,
    n: u64,
) -> (TokenBucketState, Outcome) {
    let (tokens, last_ms) = tokens_at(state, now_ms, p);
    let tokens = (p.capacity as f64).min(tokens + n as f64);
    let outcome = Outcome {
        allowed: true,
        remaining: tokens.max(0.0).floor() as u64,
        reset_ms: p.wait_ms(tokens, p.capacity as f64).unwrap_or(p.window_ms),
        retry_ms: Some(0),
        granted: 0,
    };
    (
        TokenBucketState {
            tokens,
            ts_ms: now_ms.max(last_ms),
        },
        outcome,
    )
}

/// A lease claim on a fixed window: all of `ask.need` and up to `ask.want` of what is left
/// of the window's limit, or nothing. Unlike a take, a refused claim counts nothing (the
/// window's count only ever holds granted tokens).
pub fn claim_window(
    state: Option<WindowState>,
    now_ms: u64,
    limit: u64,
    window_ms: u64,
    ask: ClaimAsk,
) -> (WindowState, Outcome) {
    let (start_ms, before, reset_ms) = window_at(state, now_ms, window_ms);
    let ask = ClaimAsk {
        need: ask.need.max(1),
        ..ask
    };
    let need = ask.need;
    let available = limit.saturating_sub(before);
    let allowed = need <= available;
    let granted = if allowed {
        ask.grant(available as f64)
    } else {
        0
    };
    let count = before + granted;
    let retry_ms = if allowed {
        Some(0)
    } else if need > limit {
        None
    } else {
        Some(reset_ms)
    };
    let outcome = Outcome {
        allowed,
        remaining: limit.saturating_sub(count),
        reset_ms,
        retry_ms,
        granted,
    };
    // A refused claim changes nothing (`lease.lua` writes nothing either): a stored window that
    // is not this one stays as it is, as after a clock step back into an earlier window.
    let next = match state {
        Some(s) if !allowed => s,
        _ => WindowState { start_ms, count },
    };
    (next, outcome)
}

/// Gives `n` unspent leased hits back to a fixed window, if it is still the window they were
/// claimed in (a past window's tokens are gone with it).
pub fn return_window(
    state: Option<WindowState>,
    now_ms: u64,
    limit: u64,
    window_ms: u64,
    n: u64,
) -> (WindowState, Outcome) {
    let start_ms = now_ms - now_ms % window_ms;
    let (count, next) = match state {
        // Refused takes count past the limit; the hits actually admitted are at most the limit.
        Some(s) if s.start_ms == start_ms => {
            let count = s.count.min(limit).saturating_sub(n);
            (count, WindowState { start_ms, count })
        }
        // Another window's count is left as it is (`lease.lua` writes nothing either).
        Some(s) => (0, s),
        None => (0, WindowState { start_ms, count: 0 }),
    };
    let outcome = Outcome {
        allowed: true,
        remaining: limit.saturating_sub(count),
        reset_ms: start_ms + window_ms - now_ms,
        retry_ms: Some(0),
        granted: 0,
    };
    (next, outcome)
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

    /// A wall time that starts a second, a minute and an hour (472,222 hours after the epoch).
    const T0: u64 = 1_699_999_200_000;

    fn slide(steps: &[(u64, u64)], limit: u64, window_ms: u64) -> Vec<Outcome> {
        let mut state = None;
        steps
            .iter()
            .map(|&(now, cost)| {
                let (s, o) = take_sliding(state, now, limit, window_ms, cost);
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
        let (s, o) = take_sliding(None, T0 + 10, 5, 1000, 3);
        assert_eq!((o.remaining, o.reset_ms), (2, 1990));
        // One window later: prev = 3 at weight 0.75.
        let (s2, o) = take_sliding(Some(s), T0 + 1250, 5, 1000, 0);
        assert_eq!((s2.prev, s2.curr, s2.start_ms), (3, 0, T0 + 1000));
        assert_eq!((o.remaining, o.reset_ms), (2, 750), "5 - 2.25, floored");
        // Two windows later nothing is left, and the state is empty (not stored).
        let (s3, o) = take_sliding(Some(s), T0 + 2000, 5, 1000, 0);
        assert!(s3.is_empty());
        assert_eq!((o.remaining, o.reset_ms, o.retry_ms), (5, 0, Some(0)));
        let (_, o) = take_sliding(Some(s2), T0 + 1999, 5, 1000, 0);
        assert_eq!((o.remaining, o.reset_ms), (4, 1), "3 * 0.001 left");
    }

    #[test]
    fn sliding_window_check_only_does_not_consume() {
        let mut state = None;
        for _ in 0..3 {
            let (s, o) = take_sliding(state, T0, 2, 60_000, 0);
            assert!(o.allowed && o.remaining == 2);
            assert!(s.is_empty());
            state = Some(s);
        }
        let (s, o) = take_sliding(state, T0, 2, 60_000, 1);
        assert!(o.allowed && o.remaining == 1);
        let (s, o) = take_sliding(Some(s), T0 + 5, 2, 60_000, 0);
        assert!(o.allowed && o.remaining == 1 && s.curr == 1);
        let (s, _) = take_sliding(Some(s), T0 + 5, 2, 60_000, 1);
        let (s, o) = take_sliding(Some(s), T0 + 5, 2, 60_000, 0);
        assert!(!o.allowed, "check-only needs one whole unit");
        assert_eq!(s.curr, 2, "refusals count nothing");
        // 2 in this window: one unit frees up when the next window is half over.
        assert_eq!(o.retry_ms, Some(60_000 - 5 + 30_000));
    }

    #[test]
    fn sliding_window_cost_above_limit_and_zero_limit_never_fit() {
        for cost in [4, 1_000, u64::MAX] {
            let (s, o) = take_sliding(None, T0, 3, 1000, cost);
            assert!(!o.allowed, "cost {cost}");
            assert_eq!((o.remaining, o.retry_ms, o.reset_ms), (3, None, 0));
            assert!(s.is_empty(), "a refusal counts nothing");
        }
        let (s, _) = take_sliding(None, T0, 3, 1000, 1);
        let (_, o) = take_sliding(Some(s), T0, 3, 1000, 3);
        assert!(!o.allowed);
        assert_eq!(
            o.retry_ms,
            Some(2000),
            "3 fits only once the 1 has decayed: the end of the next window"
        );
        for cost in [1, 0] {
            let (s, o) = take_sliding(None, T0 + 7, 0, 1000, cost);
            assert!(!o.allowed && o.retry_ms.is_none() && o.remaining == 0);
            assert!(s.is_empty() && o.reset_ms == 0);
        }
    }

    #[test]
    fn sliding_window_saturates_and_survives_a_clock_step_back() {
        let (s, o) = take_sliding(None, T0, u64::MAX, 1000, u64::MAX);
        assert!(o.allowed && s.curr == u64::MAX);
        let (s, o) = take_sliding(Some(s), T0 + 1, u64::MAX, 1000, u64::MAX);
        assert!(!o.allowed && s.curr == u64::MAX && o.retry_ms >= Some(1));
        let (_, o) = take_sliding(None, T0, 10, u64::MAX, 5);
        assert!(o.allowed && o.reset_ms == u64::MAX, "saturated: {o:?}");
        // A clock that steps back into an earlier window starts it afresh, without panicking.
        let (s, _) = take_sliding(None, T0 + 5_000, 1, 1000, 1);
        let (s, o) = take_sliding(Some(s), T0 + 3_500, 1, 1000, 1);
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
                            let (_, o) = take_sliding(Some(state), now, limit, window_ms, cost);
                            if o.allowed || cost > limit {
                                continue;
                            }
                            let Some(retry) = o.retry_ms else {
                                panic!("{state:?} w {window_ms} at {at} cost {cost}: {o:?}")
                            };
                            assert!(retry >= 1, "{state:?} at {at} cost {cost}");
                            let at_retry =
                                take_sliding(Some(state), now + retry, limit, window_ms, cost).1;
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

    /// Property tests: random runs of takes, the clock mostly moving forward, sometimes not at
    /// all and sometimes stepping back (a failover to a skewed host), costs from 0 (a check)
    /// to far above the capacity.
    mod properties {
        use std::collections::HashMap;

        use proptest::prelude::*;

        use super::super::*;
        use super::T0;

        /// A run: clock steps (ms, possibly negative unless `back` is false) and costs.
        fn run(
            window_ms: u64,
            capacity: u64,
            back: bool,
        ) -> impl Strategy<Value = Vec<(i64, u64)>> {
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
            (amount(), amount(), window()).prop_map(|(capacity, refill, window_ms)| {
                TokenBucketParams {
                    capacity,
                    refill: if capacity == 0 { 0 } else { refill },
                    window_ms,
                }
            })
        }

        fn token_case() -> impl Strategy<Value = (TokenBucketParams, u64, Vec<(i64, u64)>)> {
            (token_params(), any::<bool>()).prop_flat_map(|(p, back)| {
                (Just(p), 0..p.window_ms, run(p.window_ms, p.capacity, back))
            })
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
            #![proptest_config(ProptestConfig::with_cases(512))]

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
                    let (check, _) = take_token(state, now, p, 0);
                    let (next, o) = take_token(state, now, p, cost);

                    prop_assert!(next.tokens >= 0.0 && next.tokens <= p.capacity as f64, "{next:?}");
                    prop_assert!(o.remaining <= p.capacity, "{o:?}");
                    prop_assert_eq!(o.allowed, o.retry_ms == Some(0), "{:?}", o);
                    if cost == 0 {
                        // A check consumes nothing: any take right after it answers as if the
                        // check had not happened.
                        for c in [1, p.capacity, p.capacity + 1] {
                            prop_assert_eq!(take_token(Some(next), now, p, c), take_token(state, now, p, c));
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
                                    let (_, then) = take_token(Some(next), at, p, cost);
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
            /// steps back, since stepping into another window starts it afresh); every hit of
            /// a non-zero cost is counted, allowed or not; a refusal waits until the window
            /// ends, after which the cost fits, or is `None` when it never can.
            #[test]
            fn fixed_window_invariants((limit, w, offset, back, steps) in window_case()) {
                let mut state: Option<WindowState> = None;
                let mut now = T0 + offset;
                let mut admitted = Admitted::new();
                for (dt, cost) in steps {
                    now = now.saturating_add_signed(dt);
                    let (check, _) = take_window(state, now, limit, w, 0);
                    let (next, o) = take_window(state, now, limit, w, cost);
                    let start_ms = now - now % w;
                    prop_assert_eq!(next.start_ms, start_ms);
                    prop_assert!(o.reset_ms > 0 && o.reset_ms <= w, "{:?}", o);
                    prop_assert_eq!(o.remaining, limit.saturating_sub(next.count));
                    prop_assert_eq!(o.allowed, o.retry_ms == Some(0), "{:?}", o);
                    // Every hit counts, also a refused one (like the reference); a check none.
                    prop_assert_eq!(next.count, check.count.saturating_add(cost));

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
                            take_window(Some(next), now + r, limit, w, cost).1.allowed
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
                    let (check, _) = take_sliding(state, now, limit, w, 0);
                    let (next, o) = take_sliding(state, now, limit, w, cost);
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
                                take_sliding(Some(next), now, limit, w, c),
                                take_sliding(state, now, limit, w, c)
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
                            take_sliding(Some(next), now + r, limit, w, cost).1.allowed
                        })?;
                    }
                    state = Some(next);
                }
            }
        }
    }
}
