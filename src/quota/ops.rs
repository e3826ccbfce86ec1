//! One bucket operation ([`Op`]: which bucket, which algorithm with its numbers, what to do
//! to it) as the limiter builds it and every store applies it. The stores answer each with an
//! [`Outcome`](super::Outcome) computed by `bucket.rs` (memory) or its Lua mirror (Redis).

use super::ClaimAsk;
use super::calendar::Calendar;

/// One bucket operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub key: String,
    pub kind: OpKind,
    /// Tokens (hits) to take; 0 checks without consuming. For [`Action::Return`], the tokens
    /// given back.
    pub cost: u64,
    pub action: Action,
}

/// What an [`Op`] does to its bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Action {
    /// Take `cost` (the algorithm's own script).
    #[default]
    Take,
    /// Take `cost`, and when it does not fit charge it anyway and refuse: the bucket goes into
    /// debt, at most one limit deep (a rule's `overdraft: true`; see `bucket/`). Every
    /// algorithm; never leased or sharded (the rules refuse both beside it).
    Charge,
    /// Claim a lease: all of `need` and up to `want` tokens, or nothing (`lease.lua`). Token
    /// bucket and fixed window only; on a sliding window it is a take of `cost`.
    Claim(ClaimAsk),
    /// Give `cost` tokens back (`lease.lua`; a calendar or sliding window's own script): a
    /// lease's unspent tokens, an RLQS give-back or a refund. Capped at the capacity, and never
    /// paying debt: a count past its limit stays past it by as much (`bucket/`).
    Return {
        /// A refund's receipt (`limiter/receipt.rs`), ms since the epoch.
        /// - On a window (fixed, calendar or sliding): when the window its tokens were taken
        ///   in ends, as the replica that took them reckoned it (the time it sent the take
        ///   plus the store's `reset_ms`, so never later than the store's own end while the
        ///   clocks agree). The give-back applies only while the current window started
        ///   before this instant: a refund that arrives after its window ended gives nothing
        ///   to the next one.
        /// - On a token bucket: when the tokens were taken. What the refill has given since
        ///   (refill × elapsed) is taken off the give-back: tokens held by a reservation that
        ///   a full bucket's refill would have spilled are not handed back a second time.
        ///
        /// `None`: no receipt (a lease's or an RLQS give-back, whose tokens are of now, or a
        /// refund without one): the current window, the whole give-back.
        receipt_ms: Option<u64>,
    },
    /// Take `cost` as a reservation that a `charge_parent` child settles: like [`Action::Take`],
    /// but a fixed window (calendar or not) counts nothing for it when it does not fit, as a
    /// token bucket or sliding window never does (a refused reservation is never settled, so a
    /// count of it would stay). Never leased.
    Reserve,
}

impl Action {
    /// A give-back to the current window ([`Action::Return`] without a receipt).
    pub const RETURN: Action = Action::Return { receipt_ms: None };

    /// Whether this gives tokens back ([`Action::Return`], with or without a receipt).
    pub fn is_return(self) -> bool {
        matches!(self, Action::Return { .. })
    }
}

impl Op {
    /// A take of `cost` from the bucket `key`.
    pub fn take(key: String, kind: OpKind, cost: u64) -> Op {
        Op {
            key,
            kind,
            cost,
            action: Action::Take,
        }
    }

    /// `cost` tokens given back to the bucket `key` ([`Action::Return`]): a lease's unspent
    /// tokens, an RLQS give-back, or a refund (Envoy's `is_negative_hits`).
    pub fn give_back(key: String, kind: OpKind, cost: u64) -> Op {
        Op {
            action: Action::RETURN,
            ..Op::take(key, kind, cost)
        }
    }

    /// A reservation of `cost` ([`Action::Reserve`]).
    pub fn reserve(key: String, kind: OpKind, cost: u64) -> Op {
        Op {
            action: Action::Reserve,
            ..Op::take(key, kind, cost)
        }
    }

    /// A take of `cost` that is charged even when it does not fit ([`Action::Charge`]).
    pub fn charge(key: String, kind: OpKind, cost: u64) -> Op {
        Op {
            action: Action::Charge,
            ..Op::take(key, kind, cost)
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    TokenBucket {
        capacity: u64,
        refill: u64,
        window_ms: u64,
    },
    FixedWindow {
        limit: u64,
        window_ms: u64,
    },
    SlidingWindow {
        limit: u64,
        window_ms: u64,
    },
    SlidingLog {
        limit: u64,
        window_ms: u64,
    },
    /// A fixed window aligned to the civil calendar (`quota/calendar.rs`): `limit` hits per
    /// day, ISO week, month or year. `window_ms` is the nominal length (a month is 30 days),
    /// for what needs only a scale (sizes, the simulator); the windows are the calendar's.
    /// Never leased, sharded or served over RLQS (the rules refuse it).
    CalendarWindow {
        limit: u64,
        calendar: Calendar,
        window_ms: u64,
    },
}

impl OpKind {
    /// The tokens one window gives (a token bucket's refill, a window's limit) and the
    /// window's length in ms.
    pub fn per_window(&self) -> (u64, u64) {
        match *self {
            OpKind::TokenBucket {
                refill, window_ms, ..
            } => (refill, window_ms),
            OpKind::FixedWindow { limit, window_ms }
            | OpKind::SlidingWindow { limit, window_ms }
            | OpKind::SlidingLog { limit, window_ms }
            | OpKind::CalendarWindow {
                limit, window_ms, ..
            } => (limit, window_ms),
        }
    }
}
