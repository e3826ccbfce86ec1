//! The fixed window (`lua/fixed_window.lua`, and the window half of `lua/lease.lua`): a
//! counter per epoch-aligned window; like envoyproxy/ratelimit, every hit is counted (also
//! refused ones) and a hit is over when the count passes the limit.

use super::{ClaimAsk, Outcome};

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
    window_with_debt(state, now_ms, 0, window_ms, false)
}

/// As [`window_at`]; with `overdraft`, an earlier window's count past `limit` is debt that the
/// windows after it pay, `limit` each: `k` windows later the count starts at
/// `count - k × limit` (0 once paid).
fn window_with_debt(
    state: Option<WindowState>,
    now_ms: u64,
    limit: u64,
    window_ms: u64,
    overdraft: bool,
) -> (u64, u64, u64) {
    let start_ms = now_ms - now_ms % window_ms;
    let before = match state {
        Some(s) if s.start_ms == start_ms => s.count,
        Some(s) if overdraft && s.start_ms < start_ms => {
            let windows = (start_ms - s.start_ms) / window_ms;
            s.count.saturating_sub(windows.saturating_mul(limit))
        }
        _ => 0,
    };
    (start_ms, before, start_ms + window_ms - now_ms)
}

/// With `overdraft`, the most a fixed window's count holds: the limit and one limit of debt.
pub fn overdraft_cap(limit: u64) -> u64 {
    limit.saturating_mul(2)
}

/// One fixed-window hit of `cost` at wall time `now_ms`, with `limit` hits per `window_ms`.
///
/// Every hit is counted, refused ones too (as the reference counts them). With `overdraft`
/// the count past the limit is also debt carried into the next windows (see
/// [`window_with_debt`]), at most one limit of it ([`overdraft_cap`]); a refused hit's
/// `retry_ms` is then the start of the first window with room again, and `reset_ms` the end
/// of the debt (when the count is back at 0).
pub fn take_window(
    state: Option<WindowState>,
    now_ms: u64,
    limit: u64,
    window_ms: u64,
    cost: u64,
    overdraft: bool,
) -> (WindowState, Outcome) {
    let (start_ms, before, window_left) =
        window_with_debt(state, now_ms, limit, window_ms, overdraft);
    let (count, allowed) = if cost == 0 {
        (before, before < limit)
    } else {
        let after = before.saturating_add(cost);
        let count = if overdraft {
            after.min(overdraft_cap(limit))
        } else {
            after
        };
        (count, after <= limit)
    };
    // Windows after this one that the count still fills (overdraft debt): the balance has
    // room again `full` windows on, and is empty after `ceil(count / limit) - 1`.
    let later = |n: u64| window_left.saturating_add(n.saturating_sub(1).saturating_mul(window_ms));
    let retry_ms = if allowed {
        Some(0)
    } else if limit == 0 {
        None
    } else if overdraft {
        Some(later(count / limit))
    } else if cost > limit {
        None
    } else {
        Some(window_left)
    };
    let reset_ms = if overdraft && limit > 0 && count > limit {
        later(count.div_ceil(limit))
    } else {
        window_left
    };
    let outcome = Outcome {
        allowed,
        remaining: limit.saturating_sub(count),
        reset_ms,
        retry_ms,
        granted: if allowed { cost } else { 0 },
    };
    let next = match state {
        // A check leaves an earlier window's debt as stored: what is left of it follows from
        // the time (and `fixed_window.lua` leaves the key as it is too).
        Some(s) if cost == 0 && overdraft && s.start_ms < start_ms => s,
        _ => WindowState { start_ms, count },
    };
    (next, outcome)
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

    #[test]
    fn fixed_window_counts_like_the_reference() {
        let w = 60_000;
        let t0 = 1_700_000_000_000 - 1_700_000_000_000 % w + 1_000; // 1 s into a window
        let (s, o) = take_window(None, t0, 3, w, 2, false);
        assert!(o.allowed);
        assert_eq!((o.remaining, o.reset_ms), (1, 59_000));
        let (s, o) = take_window(Some(s), t0 + 10, 3, w, 2, false);
        assert!(!o.allowed, "3 + 1 > 3");
        assert_eq!((s.count, o.remaining, o.retry_ms), (4, 0, Some(58_990)));
        let (_, o) = take_window(Some(s), t0, 3, w, 0, false);
        assert!(!o.allowed, "check-only after the limit");
        // The next window starts from zero.
        let (s, o) = take_window(Some(s), t0 + w, 3, w, 1, false);
        assert!(o.allowed);
        assert_eq!((s.count, s.start_ms), (1, t0 - 1_000 + w));
        let (_, o) = take_window(None, t0, 3, w, 4, false);
        assert_eq!(o.retry_ms, None, "more than the limit never fits");
        let (_, o) = take_window(None, t0, 0, w, 1, false);
        assert!(!o.allowed && o.retry_ms.is_none());
        let (s, _) = take_window(None, t0, 5, w, u64::MAX, false);
        assert_eq!(s.count, u64::MAX, "saturates");
    }
}
