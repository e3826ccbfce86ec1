//! The bucket math, in one place: the memory store runs it, and the Lua scripts in `lua/`
//! mirror it line for line (`tests/lua_mirror.rs` holds the two to the same answers).
//!
//! Token bucket: `capacity` tokens, refilled continuously at `refill` tokens per `window_ms`;
//! a take of `cost` succeeds when that many tokens are there and removes them. A refused take
//! removes nothing. Fixed window: a counter per epoch-aligned window; like envoyproxy/ratelimit,
//! a refused hit counts too (up to the limit) and a hit is over when the count passes the
//! limit; a count past the limit is debt, carried into the next windows (`fixed_window.rs`).
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
//!
//! Overdraft (`overdraft: true` on a rule, [`Action::Charge`](crate::quota::ops::Action)): a
//! take that does not fit is charged anyway and refused, so usage known only afterwards (an
//! LLM response's tokens) is never lost. The bucket goes below zero, at most one limit deep
//! (a token bucket's balance down to `-capacity`, a window's count up to twice the limit);
//! usage past that is not carried. Later takes are refused until the debt is refilled away,
//! and a refused take's `retry_ms` is when a take of 1 fits again. A fixed window carries
//! its debt into the windows after it (each pays one limit); a sliding window's decays with
//! its counts.
//!
//! Sliding log ([`take_log`]): every admitted hit kept with its time; exact in any window-long
//! span, for memory that grows with the limit.
//!
//! One file per algorithm, as `lua/` has one script each: `token_bucket.rs`,
//! `fixed_window.rs`, `sliding_window.rs`, `sliding_log.rs`; what they share (the [`Outcome`] of an op, the
//! [`ClaimAsk`] of a lease claim) is here.

mod fixed_window;
mod sliding_log;
mod sliding_window;
mod token_bucket;

pub use fixed_window::{
    WindowState, Windows, claim_window, overdraft_cap, reserve_windows, return_window,
    return_windows, take_window, take_windows,
};
pub use sliding_log::{SlidingLog, take_log};
pub use sliding_window::{SlidingWindowState, give_back_sliding, take_sliding};
pub use token_bucket::{
    TokenBucketParams, TokenBucketState, claim_token, return_token, take_token, token_idle_after_ms,
};

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
    /// A fixed window's take: the count it found before its own hits (debt included). A
    /// refused take counts up to the limit and reports none `remaining`, so this is what the
    /// reference's statsd split of a refused take is computed from (`limiter/status.rs`).
    /// `None` for the other algorithms, whose refused takes charge nothing (their count
    /// before is what `remaining` says), and for claims and give-backs.
    pub found: Option<u64>,
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
        super::share::lease_grant(available, self.need, self.want, self.share)
    }
}

#[cfg(test)]
mod properties;
