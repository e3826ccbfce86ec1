//! The fixed window (`lua/fixed_window.lua`, and the window half of `lua/lease.lua`): a
//! counter per epoch-aligned window; like envoyproxy/ratelimit, a refused hit is counted and
//! a hit is over when the count passes the limit.
//!
//! # Debt
//!
//! A window's count past its limit is **debt**: hits charged after the fact (a rule's
//! `overdraft`, an RLQS Envoy's usage beyond its assignment). Every operation carries it into
//! the windows after it, which pay one limit each: `k` windows later the count starts at
//! `count - k × limit` (0 once paid). Only charges put a count past the limit: a refused take
//! counts up to the limit and no further (its answer, and every later one in the window, is
//! the same as the reference's, whose counter runs on), so a count past the limit always
//! means tokens that were really admitted, and a give-back takes its tokens off that count
//! without erasing anyone's debt.
//!
//! # A limit edit
//!
//! The state records the limit its count was kept against. A window read with another limit
//! (a rules edit, a region's share or a shard count that moved) keeps what it admitted and
//! its debt, and compares them with the new limit ([`counted`]): raised from 100 to 120 after
//! 100 hits, it admits 20 more; lowered to 50 after 60, it refuses the rest of the window and
//! the next window starts at 0, as the reference's does (what was admitted under the old limit
//! is not debt). Debt (a count past the limit, from charges) is kept, at most one new limit of
//! it, so lowering a limit far below a window's debt costs the tenant at most the next window.

use super::{ClaimAsk, Outcome};
use crate::quota::calendar::Calendar;

/// A fixed window's stored state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowState {
    /// Wall-clock start of the window (epoch ms, a multiple of the window length).
    pub start_ms: u64,
    pub count: u64,
    /// The limit `count` was kept against (module doc, "A limit edit"). `None`: a state
    /// written before limits were stored (0.1.0's hash, or the previous release's 16-byte
    /// string), read as kept against the limit in force.
    pub limit: Option<u64>,
}

/// A stored count in the terms of `limit`: the count itself when it was kept against this
/// limit; after an edit, what it admitted within the limits (never more than the new limit)
/// plus its debt (what it holds past the larger of the two limits: charges beyond a limit, never
/// the edit itself), at most one new limit of it. `lua/fixed_window.lua` and `lua/lease.lua`
/// compute the same.
pub fn counted(s: WindowState, limit: u64) -> u64 {
    match s.limit {
        Some(was) if was != limit => {
            let debt = s.count.saturating_sub(was.max(limit)).min(limit);
            s.count.min(limit) + debt
        }
        _ => s.count,
    }
}

/// How a fixed window's windows are laid out: every `window_ms` from the epoch (the
/// reference's), or the civil calendar's days, weeks, months or years (`quota/calendar.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Windows {
    Every(u64),
    Calendar(Calendar),
}

impl Windows {
    /// The start of the window holding `now_ms`.
    fn start(self, now_ms: u64) -> u64 {
        match self {
            Windows::Every(w) => now_ms - now_ms % w,
            Windows::Calendar(c) => c.start(now_ms),
        }
    }

    /// The start of the window after the one starting at `start_ms`.
    fn next(self, start_ms: u64) -> u64 {
        match self {
            Windows::Every(w) => start_ms.saturating_add(w),
            Windows::Calendar(c) => c.next(start_ms),
        }
    }

    /// How many windows after the one starting at `from` the one starting at `to` is
    /// (`from` < `to`), counted up to `most` (a calendar's are counted one by one; debt is
    /// paid within a few windows, so no caller needs more).
    fn between(self, from: u64, to: u64, most: u64) -> u64 {
        match self {
            Windows::Every(w) => (to - from) / w,
            Windows::Calendar(c) => {
                let (mut n, mut at) = (0, from);
                while at < to && n < most {
                    at = c.next(at);
                    n += 1;
                }
                n
            }
        }
    }
}

/// The window holding `now_ms`: where it starts and how long is left of it.
#[derive(Clone, Copy, Debug)]
struct Window {
    windows: Windows,
    start_ms: u64,
    now_ms: u64,
    /// Until the window ends.
    left: u64,
}

impl Window {
    fn at(windows: Windows, now_ms: u64) -> Window {
        let start_ms = windows.start(now_ms);
        Window {
            windows,
            start_ms,
            now_ms,
            left: windows.next(start_ms) - now_ms,
        }
    }

    /// Until the end of the window `n - 1` windows after this one (`n` = 1: this one's end).
    fn later(&self, n: u64) -> u64 {
        match self.windows {
            Windows::Every(w) => self
                .left
                .saturating_add(n.saturating_sub(1).saturating_mul(w)),
            Windows::Calendar(c) => {
                let mut end = c.next(self.start_ms);
                for _ in 1..n {
                    end = c.next(end);
                }
                end - self.now_ms
            }
        }
    }

    /// The count this window starts from: the stored window's count when it is this one; an
    /// earlier window's debt, less a limit per window since; else 0.
    ///
    /// A stored count is read in the terms of `limit` ([`counted`]) and as at most
    /// [`overdraft_cap`]`(limit)`: one limit of debt, the most a window ever carries (a state
    /// that does not say its limit may hold more only after a limit edit).
    fn before(&self, state: Option<WindowState>, limit: u64) -> u64 {
        match state {
            Some(s) if s.start_ms == self.start_ms => counted(s, limit).min(overdraft_cap(limit)),
            Some(s) if s.start_ms < self.start_ms => {
                let count = counted(s, limit).min(overdraft_cap(limit));
                // Enough windows to pay any count: one more than it holds limits.
                let most = count.checked_div(limit).map_or(1, |n| n + 1);
                let windows = self.windows.between(s.start_ms, self.start_ms, most);
                count.saturating_sub(windows.saturating_mul(limit))
            }
            _ => 0,
        }
    }

    /// Until the count is back at 0: this window's end, or with debt the end of the window
    /// that pays its last part (`ceil(count / limit)` windows, this one included).
    fn reset_of(&self, count: u64, limit: u64) -> u64 {
        if limit > 0 && count > limit {
            self.later(count.div_ceil(limit))
        } else {
            self.left
        }
    }

    /// Until a hit of `cost` fits after `count` (windows start `limit` lower each): 0 if it
    /// fits now, `None` if it never does.
    fn retry_of(&self, count: u64, cost: u64, limit: u64) -> Option<u64> {
        if count.saturating_add(cost) <= limit {
            return Some(0);
        }
        if cost > limit || limit == 0 {
            return None;
        }
        // The first `k` with count - k × limit + cost <= limit.
        let k = (count.saturating_add(cost) - limit).div_ceil(limit);
        Some(self.later(k))
    }
}

/// With `overdraft`, the most a fixed window's count holds: the limit and one limit of debt.
pub fn overdraft_cap(limit: u64) -> u64 {
    limit.saturating_mul(2)
}

/// One fixed-window hit of `cost` at wall time `now_ms`, with `limit` hits per `window_ms`:
/// [`take_windows`] on epoch-aligned windows.
pub fn take_window(
    state: Option<WindowState>,
    now_ms: u64,
    limit: u64,
    window_ms: u64,
    cost: u64,
    overdraft: bool,
) -> (WindowState, Outcome) {
    take_windows(
        state,
        now_ms,
        limit,
        Windows::Every(window_ms),
        cost,
        overdraft,
    )
}

/// One fixed-window hit of `cost` at wall time `now_ms`, with `limit` hits per window.
///
/// A refused hit is counted up to the limit (module doc). With `overdraft` a hit that does
/// not fit is charged anyway, into debt (at most one limit of it, [`overdraft_cap`]); a
/// refused hit's `retry_ms` is then the start of the first window with room for a hit of 1.
/// `reset_ms` is until the count is back at 0 (the window's end, or the end of its debt).
pub fn take_windows(
    state: Option<WindowState>,
    now_ms: u64,
    limit: u64,
    windows: Windows,
    cost: u64,
    overdraft: bool,
) -> (WindowState, Outcome) {
    let refused = if overdraft {
        Refused::Charged
    } else {
        Refused::Counted
    };
    take_in(state, now_ms, limit, windows, cost, refused)
}

/// A reservation of `cost` (`Action::Reserve`): [`take_windows`], but a hit that does not fit
/// counts nothing (a refused reservation is never settled).
pub fn reserve_windows(
    state: Option<WindowState>,
    now_ms: u64,
    limit: u64,
    windows: Windows,
    cost: u64,
) -> (WindowState, Outcome) {
    take_in(state, now_ms, limit, windows, cost, Refused::NotCounted)
}

/// What a take that does not fit does to the count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refused {
    /// Counted up to the limit (the reference's way).
    Counted,
    /// Charged anyway, into debt (`overdraft`).
    Charged,
    /// Not counted (a reservation).
    NotCounted,
}

fn take_in(
    state: Option<WindowState>,
    now_ms: u64,
    limit: u64,
    windows: Windows,
    cost: u64,
    refused: Refused,
) -> (WindowState, Outcome) {
    let overdraft = refused == Refused::Charged;
    let window = Window::at(windows, now_ms);
    let start_ms = window.start_ms;
    let before = window.before(state, limit);
    let (count, allowed) = if cost == 0 {
        (before, before < limit)
    } else {
        let after = before.saturating_add(cost);
        let count = if after <= limit {
            after
        } else {
            match refused {
                Refused::Charged => after.min(overdraft_cap(limit)).max(before),
                Refused::Counted => limit.max(before),
                Refused::NotCounted => before,
            }
        };
        (count, after <= limit)
    };
    let retry_ms = if allowed {
        Some(0)
    } else if overdraft {
        window.retry_of(count, 1, limit)
    } else {
        window.retry_of(count, cost.max(1), limit)
    };
    let outcome = Outcome {
        allowed,
        remaining: limit.saturating_sub(count),
        reset_ms: window.reset_of(count, limit),
        retry_ms,
        granted: if allowed { cost } else { 0 },
        found: Some(before),
    };
    let next = match state {
        // A check leaves an earlier window's debt as stored (what is left of it follows from
        // the time; `fixed_window.lua` leaves the key as it is too).
        Some(s) if cost == 0 && s.start_ms < start_ms && s.count > limit => s,
        // A check in the stored window writes nothing (`fixed_window.lua` neither): a count
        // read capped at two limits (a limit edit) is kept as counted.
        Some(s) if cost == 0 && s.start_ms == start_ms => s,
        _ => WindowState {
            start_ms,
            count,
            limit: Some(limit),
        },
    };
    (next, outcome)
}

/// A lease claim on a fixed window: all of `ask.need` and up to `ask.want` of what is left
/// of the window's limit after its count (debt included), or nothing. Unlike a take, a
/// refused claim counts nothing.
pub fn claim_window(
    state: Option<WindowState>,
    now_ms: u64,
    limit: u64,
    window_ms: u64,
    ask: ClaimAsk,
) -> (WindowState, Outcome) {
    let window = Window::at(Windows::Every(window_ms), now_ms);
    let (start_ms, before) = (window.start_ms, window.before(state, limit));
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
    let outcome = Outcome {
        allowed,
        remaining: limit.saturating_sub(count),
        reset_ms: window.reset_of(count, limit),
        retry_ms: if allowed {
            Some(0)
        } else {
            window.retry_of(before, need, limit)
        },
        granted,
        found: None,
    };
    // A refused claim changes nothing (`lease.lua` writes nothing either): a stored window that
    // is not this one stays as it is, as after a clock step back into an earlier window.
    let next = match state {
        Some(s) if !allowed => s,
        _ => WindowState {
            start_ms,
            count,
            limit: Some(limit),
        },
    };
    (next, outcome)
}

/// Gives `n` unspent leased hits back to a fixed window: [`return_windows`] on
/// epoch-aligned windows.
pub fn return_window(
    state: Option<WindowState>,
    now_ms: u64,
    limit: u64,
    window_ms: u64,
    n: u64,
    window_end_ms: Option<u64>,
) -> (WindowState, Outcome) {
    return_windows(
        state,
        now_ms,
        limit,
        Windows::Every(window_ms),
        n,
        window_end_ms,
    )
}

/// Gives `n` hits back to a fixed window (unspent leased hits, or a refund), if it is still
/// the window they were counted in (a past window's tokens are gone with it): the stored
/// window is the current one and, for a refund with a receipt, the window the receipt names
/// ended after the current one started (`window_end_ms`, see
/// [`Action::Return`](crate::quota::Action::Return)). They come off the count, never below its
/// debt: [`give_back_count`].
pub fn return_windows(
    state: Option<WindowState>,
    now_ms: u64,
    limit: u64,
    windows: Windows,
    n: u64,
    window_end_ms: Option<u64>,
) -> (WindowState, Outcome) {
    let window = Window::at(windows, now_ms);
    let start_ms = window.start_ms;
    let n = if receipt_is_current(window_end_ms, start_ms) {
        n
    } else {
        0
    };
    let (count, next) = match state {
        Some(s) if s.start_ms == start_ms => {
            let count = give_back_count(window.before(state, limit), limit, n);
            (
                count,
                WindowState {
                    start_ms,
                    count,
                    limit: Some(limit),
                },
            )
        }
        // Another window's count is left as it is (`lease.lua` writes nothing either).
        Some(s) => (window.before(state, limit), s),
        None => (
            0,
            WindowState {
                start_ms,
                count: 0,
                limit: Some(limit),
            },
        ),
    };
    let outcome = Outcome {
        allowed: true,
        remaining: limit.saturating_sub(count),
        reset_ms: window.reset_of(count, limit),
        retry_ms: Some(0),
        granted: 0,
        found: None,
    };
    (next, outcome)
}

/// A window's count after `n` hits are given back to it: `n` off, but never below the count's
/// debt (what it holds past `limit`: usage charged beyond the limit by `overdraft`, a
/// `charge_parent` settlement or RLQS), so a refund gives back what was taken within the limit
/// and never pays debt, which only time pays (one limit per window).
pub fn give_back_count(count: u64, limit: u64, n: u64) -> u64 {
    count.saturating_sub(n).max(count.saturating_sub(limit))
}

/// Whether a give-back's receipt (`window_end_ms`) names the window starting at `start_ms`:
/// the receipt's window ended after this one started (a receipt's end is never later than the
/// true end, which is the next window's start). No receipt: the current window.
pub fn receipt_is_current(window_end_ms: Option<u64>, start_ms: u64) -> bool {
    window_end_ms.is_none_or(|end| start_ms < end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_edit_keeps_the_count_and_never_turns_it_into_debt() {
        let (w, hour) = (Windows::Every(3_600_000), 3_600_000);
        // 100 an hour, 100 hits; raised to 120: 20 more, then refused.
        let (s, _) = take_windows(None, 1_000, 100, w, 100, false);
        let (s, o) = take_windows(Some(s), 2_000, 120, w, 20, false);
        assert!(o.allowed && o.remaining == 0);
        let (_, o) = take_windows(Some(s), 3_000, 120, w, 1, false);
        assert!(!o.allowed);
        // 60 hits of 100; lowered to 50: refused for the rest of the window, and the next
        // window starts at 0 (what was admitted under 100 is not debt).
        let (s, _) = take_windows(None, 1_000, 100, w, 60, false);
        let (s, o) = take_windows(Some(s), 2_000, 50, w, 1, false);
        assert_eq!((o.allowed, o.retry_ms), (false, Some(hour - 2_000)));
        assert_eq!(o.reset_ms, hour - 2_000, "no debt past this window");
        let (_, o) = take_windows(Some(s), hour + 1, 50, w, 50, false);
        assert!(o.allowed, "a fresh window of 50");
        // Debt is kept, at most one new limit: 100 with overdraft charged 150 (50 of debt),
        // lowered to 20: the next window pays 20 of it and starts at 20, full.
        let (s, _) = take_windows(None, 1_000, 100, w, 150, true);
        assert_eq!(s.count, 150);
        assert_eq!(
            counted(s, 20),
            40,
            "20 admitted within the limit, 20 of debt"
        );
        let (_, o) = take_windows(Some(s), hour + 1, 20, w, 1, false);
        assert!(!o.allowed, "the next window pays the debt");
        // A state that does not say its limit is read as counted against the one in force.
        let legacy = WindowState { limit: None, ..s };
        assert_eq!(counted(legacy, 20), 150);
    }

    #[test]
    fn a_refund_never_pays_debt_nor_reaches_a_window_after_its_own() {
        // 10 an hour with overdraft: a charge of 25 leaves 20 (one limit of debt).
        let (w, hour) = (Windows::Every(3_600_000), 3_600_000);
        let (s, o) = take_windows(None, 1_000, 10, w, 25, true);
        assert_eq!((s.count, o.remaining), (20, 0));
        // A refund of 20: off what was within the limit, never the debt.
        let (s, o) = return_windows(Some(s), 2_000, 10, w, 20, None);
        assert_eq!((s.count, o.remaining), (10, 0), "nothing admitted");
        // Reserve 60 of 100 just before an edge, 60 just after; the first's refund gives
        // nothing to the second window (its receipt names the first).
        let (s, _) = take_windows(None, hour - 2_000, 100, w, 60, false);
        let (s, _) = take_windows(Some(s), hour + 10, 100, w, 60, false);
        let (s, o) = return_windows(Some(s), hour + 20, 100, w, 60, Some(hour - 10));
        assert_eq!((s.count, o.remaining), (60, 40));
        // Its own window's refund (a receipt ending after the window started) is given back.
        let (s, o) = return_windows(Some(s), hour + 30, 100, w, 60, Some(2 * hour - 50));
        assert_eq!((s.count, o.remaining), (0, 100));
        assert_eq!(
            give_back_count(150, 100, 60),
            90,
            "an honest refund beside debt"
        );
        assert_eq!(give_back_count(7, 10, 9), 0);
    }

    #[test]
    fn fixed_window_counts_like_the_reference() {
        let w = 60_000;
        let t0 = 1_700_000_000_000 - 1_700_000_000_000 % w + 1_000; // 1 s into a window
        let (s, o) = take_window(None, t0, 3, w, 2, false);
        assert!(o.allowed);
        assert_eq!((o.remaining, o.reset_ms), (1, 59_000));
        let (s, o) = take_window(Some(s), t0 + 10, 3, w, 2, false);
        assert!(!o.allowed, "3 + 1 > 3");
        // Counted up to the limit, no further: a count past it would be debt.
        assert_eq!((s.count, o.remaining, o.retry_ms), (3, 0, Some(58_990)));
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
        assert_eq!(s.count, 5, "a refused take counts up to the limit");
        let (s, o) = take_window(None, t0, 5, w, u64::MAX, true);
        assert_eq!(
            (s.count, o.retry_ms),
            (10, Some(119_000)),
            "overdraft: one limit of debt, room for 1 two windows on"
        );
    }
}
