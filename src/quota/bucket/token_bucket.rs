//! The token bucket (`lua/token_bucket.lua`, and the token half of `lua/lease.lua`):
//! `capacity` tokens, refilled continuously at `refill` per `window_ms`; a take of `cost`
//! succeeds when that many tokens are there and removes them, a refused take removes nothing.
//!
//! # A capacity edit keeps what was spent
//!
//! The state records the capacity its tokens were counted against. Read with another capacity
//! (a rules edit of `burst` or `requests_per_unit`, a region's share or a shard count that
//! moved), the bucket keeps what was spent, `capacity − tokens`: it holds `new capacity −
//! spent` ([`carried`]), so a bucket of 5 with 5 spent raised to 8 holds 3, and lowered below
//! what was spent it holds debt, at most one new capacity of it (the most any bucket carries,
//! as with `overdraft`). The refill since the state was written runs at the new rate.

use super::{ClaimAsk, Outcome};

/// The numbers of a token bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenBucketParams {
    pub capacity: u64,
    /// Tokens added per `window_ms`.
    pub refill: u64,
    pub window_ms: u64,
}

/// A token bucket's stored state: three numbers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenBucketState {
    pub tokens: f64,
    /// When `tokens` was last brought up to date (monotonic ms; Redis `TIME` in Lua).
    pub ts_ms: u64,
    /// The capacity `tokens` were counted against (module doc). `None`: a state written
    /// before capacities were stored (0.1.0's hash, or the previous release's 16-byte
    /// string), read as the current capacity.
    pub capacity: Option<f64>,
}

/// The tokens a stored state holds against capacity `p.capacity`, before the refill since it
/// was written: the same spent (`capacity − tokens`) against the new capacity, never more than
/// one new capacity of debt. Unchanged (bit for bit) when the capacity is the same;
/// `lua/token_bucket.lua` and `lua/lease.lua` compute the same, in the same order.
pub fn carried(s: TokenBucketState, p: TokenBucketParams) -> f64 {
    let capacity = p.capacity as f64;
    match s.capacity {
        Some(was) if was != capacity => (s.tokens + (capacity - was)).max(-capacity),
        _ => s.tokens,
    }
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
    /// on by the time one ulp of `target` (or of a debt, when `tokens` is the larger number)
    /// takes to refill until the sum is there (a step or two at most; bounded at four).
    fn wait_ms(&self, tokens: f64, target: f64) -> Option<u64> {
        if tokens >= target {
            return Some(0);
        }
        if self.refill == 0 {
            return None;
        }
        let (window, refill) = (self.window_ms as f64, self.refill as f64);
        let mut ms = ((target - tokens) * window / refill).ceil();
        // The ulp that matters is the larger number's: the target's, or a debt's (overdraft).
        let scale = target.max(tokens.abs());
        let step = (scale * f64::EPSILON * window / refill).ceil().max(1.0);
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
///
/// With `overdraft` a take that does not fit is charged anyway and refused: the balance goes
/// below zero, at most one capacity deep (usage past that is not carried), and its
/// `retry_ms` is when the balance is back at one token (what a check, or a take of 1, needs).
pub fn take_token(
    state: Option<TokenBucketState>,
    now_ms: u64,
    p: TokenBucketParams,
    cost: u64,
    overdraft: bool,
) -> (TokenBucketState, Outcome) {
    let capacity = p.capacity as f64;
    let last_ms = state.map_or(now_ms, |s| s.ts_ms);
    let mut tokens = match state {
        None => capacity,
        Some(s) => {
            let elapsed = now_ms.saturating_sub(s.ts_ms) as f64;
            capacity.min(carried(s, p) + p.refilled(elapsed))
        }
    };
    let need = cost.max(1) as f64;
    let allowed = p.capacity > 0 && tokens >= need;
    if allowed {
        tokens -= cost as f64;
    } else if overdraft {
        tokens = (tokens - cost as f64).max(-capacity);
    }
    let retry_ms = if allowed {
        Some(0)
    } else if overdraft {
        if p.capacity == 0 {
            None
        } else {
            p.wait_ms(tokens, 1.0)
        }
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
        found: None,
    };
    // A clock that steps back (a failover to a skewed host) must not refill twice later.
    (
        TokenBucketState {
            tokens,
            ts_ms: now_ms.max(last_ms),
            capacity: Some(p.capacity as f64),
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

/// The tokens of a token bucket at `now_ms` (refilled since it was stored, capped at the
/// capacity) and the time they were last brought up to date.
fn tokens_at(state: Option<TokenBucketState>, now_ms: u64, p: TokenBucketParams) -> (f64, u64) {
    let capacity = p.capacity as f64;
    match state {
        None => (capacity, now_ms),
        Some(s) => {
            let elapsed = now_ms.saturating_sub(s.ts_ms) as f64;
            (capacity.min(carried(s, p) + p.refilled(elapsed)), s.ts_ms)
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
        found: None,
    };
    (
        TokenBucketState {
            tokens,
            ts_ms: now_ms.max(last_ms),
            capacity: Some(p.capacity as f64),
        },
        outcome,
    )
}

/// What a give-back of `n` returns when its tokens were taken `since_take_ms` ago (a refund's
/// receipt; `None`: all of it): less what the refill gave meanwhile, never below 0. A
/// reservation's tokens were out of the bucket while it refilled; had they stayed, a bucket
/// that filled up would have spilled that refill, so it is not handed back a second time.
/// (`lease.lua`'s give-back computes the same, in the same order.)
pub fn refund_after_refill(n: u64, since_take_ms: Option<u64>, p: TokenBucketParams) -> f64 {
    match since_take_ms {
        Some(ms) => (n as f64 - ms as f64 * p.refill as f64 / p.window_ms as f64).max(0.0),
        None => n as f64,
    }
}

/// A token bucket's balance after `n` tokens are given back: never above the capacity, and
/// never paying debt (a balance below zero, from `overdraft` or a `charge_parent`
/// settlement): at most `capacity + tokens` while in debt. The same rule as a window's
/// [`give_back_count`](super::fixed_window::give_back_count) with count = capacity − tokens.
pub fn give_back_tokens(tokens: f64, capacity: f64, n: f64) -> f64 {
    (tokens + n).min(capacity + tokens.min(0.0))
}

/// Gives `n` unspent leased tokens back to a token bucket, capped at its capacity.
pub fn return_token(
    state: Option<TokenBucketState>,
    now_ms: u64,
    p: TokenBucketParams,
    n: u64,
    since_take_ms: Option<u64>,
) -> (TokenBucketState, Outcome) {
    let (tokens, last_ms) = tokens_at(state, now_ms, p);
    let n = refund_after_refill(n, since_take_ms, p);
    let tokens = give_back_tokens(tokens, p.capacity as f64, n);
    let outcome = Outcome {
        allowed: true,
        remaining: tokens.max(0.0).floor() as u64,
        reset_ms: p.wait_ms(tokens, p.capacity as f64).unwrap_or(p.window_ms),
        retry_ms: Some(0),
        granted: 0,
        found: None,
    };
    (
        TokenBucketState {
            tokens,
            ts_ms: now_ms.max(last_ms),
            capacity: Some(p.capacity as f64),
        },
        outcome,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::bucket::Outcome;

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
                let (s, o) = take_token(state, now, p, cost, false);
                state = Some(s);
                o
            })
            .collect()
    }

    #[test]
    fn a_capacity_edit_keeps_what_was_spent() {
        // 5 an hour, 5 spent; raised to 8: 3 more, not 8.
        let p = |n| TokenBucketParams {
            capacity: n,
            refill: n,
            window_ms: 3_600_000,
        };
        let (s, _) = take_token(None, 0, p(5), 5, false);
        let (s, o) = take_token(Some(s), 1, p(8), 3, false);
        assert!(o.allowed && o.remaining == 0);
        let (s, o) = take_token(Some(s), 2, p(8), 1, false);
        assert!(!o.allowed);
        // Lowered to 2 with 8 spent: debt, at most one capacity (2) of it.
        let (s, o) = take_token(Some(s), 3, p(2), 0, false);
        assert!(!o.allowed);
        assert_eq!(s.tokens.round(), -2.0);
        assert_eq!(s.capacity, Some(2.0));
        // A state that does not say its capacity is read as counted against the one in force.
        let legacy = TokenBucketState {
            tokens: 1.0,
            ts_ms: 0,
            capacity: None,
        };
        assert_eq!(carried(legacy, p(100)), 1.0);
    }

    #[test]
    fn a_refund_never_pays_debt() {
        // 10 an hour with overdraft: a charge of 25 leaves -10 (capped one limit deep).
        let p = TokenBucketParams {
            capacity: 10,
            refill: 10,
            window_ms: 3_600_000,
        };
        let (s, o) = take_token(None, 0, p, 25, true);
        assert_eq!((s.tokens, o.allowed), (-10.0, false));
        let (s, o) = return_token(Some(s), 0, p, 20, None);
        assert_eq!(
            (s.tokens, o.remaining),
            (0.0, 0),
            "the debt stays; nothing admitted"
        );
        assert_eq!(give_back_tokens(-3.0, 10.0, 5.0), 2.0);
        assert_eq!(
            give_back_tokens(4.0, 10.0, 50.0),
            10.0,
            "never above the capacity"
        );
        // A refund of 6 taken 30 minutes ago on 10 an hour: the 5 refilled since are not
        // given back again.
        assert_eq!(refund_after_refill(6, Some(1_800_000), p), 1.0);
        assert_eq!(refund_after_refill(6, Some(7_200_000), p), 0.0);
        assert_eq!(refund_after_refill(6, None, p), 6.0);
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
        let (s, _) = take_token(None, 0, P, 4, false);
        assert_eq!(token_idle_after_ms(s, P), 400);
        let (s, _) = take_token(None, 0, P, 0, false);
        assert_eq!(
            token_idle_after_ms(s, P),
            1,
            "a full bucket expires at once"
        );
    }
}
