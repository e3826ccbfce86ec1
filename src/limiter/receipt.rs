//! Receipts: what a reservation actually took, so that its settlement gives back no more than
//! that, only to the limits that took it, and nothing once the window it was taken in ended.
//!
//! A reservation is a take on a node whose child has `charge_parent` (`Descriptor::settled_by`
//! in `rules/model.rs`). When it passes, tollgate answers with a receipt in the response's
//! dynamic metadata, under `metadata.<that child's key>` (`service/response.rs`). Envoy's
//! stream-done settlement builds the child's descriptor from that metadata (a `metadata`
//! action), so the receipt comes back as the settlement descriptor's last value, and a refund
//! there (`is_negative_hits`) is read through it ([`Settlement`]): at most the receipt's
//! tokens, nothing to a limit that took nothing, and, on a window, the window's end travels
//! with the give-back (`Action::Return::receipt_ms`) so the store gives nothing once that
//! window has ended. A charge on the same descriptor ignores the value: usage is charged now.
//!
//! Data flow: `plan.rs` notes which descriptors are owed a receipt (`Plan::receipts`) and turns
//! a refund's receipt into its ops ([`Settlement::give_back`]); `decide` reads the wall clock
//! before the store call, and [`issue`] writes each receipt from the outcomes.
//!
//! The text is `r:<tokens>:<limit 1>:<limit 2>…`, one field per counted limit of the node in
//! its rules order: `-` (that limit took nothing: a shadow limit that was over, or the
//! fallback's local share decided, whose tokens the shared bucket never gave), `t<ms>` (a token
//! bucket: when the take was sent; the give-back is less what the refill gave since, so a late
//! refund does not hand back refill a full bucket would have spilled), `0` (a sliding log,
//! which takes no refunds) or the end of the window the tokens came from, in ms since the
//! epoch: the time this replica sent the take plus the store's `reset_ms`. After a take that fits, `reset_ms` runs to the window's end from
//! the store's clock, read after the call left this replica, so the sum is never later than the
//! store's own end while the clocks agree (a replica whose clock runs ahead of Redis's by `d`
//! ms lets a refund sent in the first `d` ms of the next window through: docs/usage-costs.md).
//! A value that does not start with `r:` (a settlement gated on a plain `metadata` value such as
//! `held`, as before receipts) is a refund without a receipt: its cost, to the current window.

use crate::quota::{Action, Op, OpKind, Outcome};

/// A settlement descriptor's value, read as a receipt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Settlement {
    /// No receipt (the value does not start with `r:`): the refund's cost, current window.
    Unreceipted,
    /// A receipt: `tokens` at most, per limit what it took.
    Receipt { tokens: u64, limits: Vec<Taken> },
    /// Starts with `r:` but is not a receipt this replica can read: nothing is given back.
    Unreadable,
}

/// What a reservation took from one limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Taken {
    Nothing,
    /// From a sliding log (which takes no refunds: a refund there is a check).
    NoWindow,
    /// From a token bucket, by a take sent at this instant (ms since the epoch).
    At(u64),
    /// From the window ending at this instant (ms since the epoch; see the module doc).
    WindowEnding(u64),
}

const PREFIX: &str = "r:";

impl Settlement {
    /// Reads a settlement descriptor's value.
    pub(super) fn read(value: &str) -> Settlement {
        let Some(rest) = value.strip_prefix(PREFIX) else {
            return Settlement::Unreceipted;
        };
        let mut fields = rest.split(':');
        let Some(Ok(tokens)) = fields.next().map(str::parse::<u64>) else {
            return Settlement::Unreadable;
        };
        let mut limits = Vec::new();
        for f in fields {
            limits.push(match f {
                "-" => Taken::Nothing,
                "0" => Taken::NoWindow,
                _ => match f.strip_prefix('t') {
                    Some(at) => match at.parse::<u64>() {
                        Ok(at) => Taken::At(at),
                        Err(_) => return Settlement::Unreadable,
                    },
                    None => match f.parse::<u64>() {
                        Ok(end) => Taken::WindowEnding(end),
                        Err(_) => return Settlement::Unreadable,
                    },
                },
            });
        }
        if limits.is_empty() {
            return Settlement::Unreadable;
        }
        Settlement::Receipt { tokens, limits }
    }

    /// The give-back of `cost` to the `nth` of the descriptor's `counted` limits (its bucket
    /// `key`, `kind`) that this settlement allows.
    pub(super) fn give_back(
        &self,
        key: String,
        kind: OpKind,
        cost: u64,
        nth: usize,
        counted: usize,
    ) -> Op {
        let (cost, receipt_ms) = match self {
            Settlement::Unreceipted => (cost, None),
            Settlement::Unreadable => (0, None),
            // A receipt for another set of limits (the rules changed since the take): which
            // field is whose cannot be told, so nothing is given back.
            Settlement::Receipt { limits, .. } if limits.len() != counted => (0, None),
            Settlement::Receipt { tokens, limits } => match limits[nth] {
                Taken::Nothing => (0, None),
                Taken::NoWindow => (cost.min(*tokens), None),
                Taken::At(at) | Taken::WindowEnding(at) => (cost.min(*tokens), Some(at)),
            },
        };
        Op {
            action: Action::Return { receipt_ms },
            ..Op::give_back(key, kind, cost)
        }
    }
}

/// The receipt of a reservation of `tokens` that passed: one field per op it made (`ops`, with
/// the outcome of each and whether the fallback decided it), `sent_ms` the wall-clock time
/// read before the store call.
pub(super) fn issue<'a>(
    tokens: u64,
    sent_ms: u64,
    ops: impl Iterator<Item = (&'a Op, &'a Outcome, bool)>,
) -> String {
    let mut out = format!("{PREFIX}{tokens}");
    for (op, outcome, from_fallback) in ops {
        out.push(':');
        if !outcome.allowed || from_fallback {
            out.push('-');
            continue;
        }
        let end = match op.kind {
            OpKind::TokenBucket { .. } => {
                out.push_str(&format!("t{}", sent_ms.max(1)));
                continue;
            }
            OpKind::SlidingLog { .. } => None,
            OpKind::FixedWindow { .. } | OpKind::CalendarWindow { .. } => {
                Some(sent_ms.saturating_add(outcome.reset_ms))
            }
            // A sliding window with hits in this window decays to 0 at the end of the next.
            OpKind::SlidingWindow { window_ms, .. } => {
                Some(sent_ms.saturating_add(outcome.reset_ms.saturating_sub(window_ms)))
            }
        };
        match end {
            // 0 means "no window": an instant that early names no window a store is in.
            Some(end) => out.push_str(&end.max(1).to_string()),
            None => out.push('0'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fw() -> OpKind {
        OpKind::FixedWindow {
            limit: 100,
            window_ms: 60_000,
        }
    }

    fn outcome(allowed: bool, reset_ms: u64) -> Outcome {
        Outcome {
            allowed,
            remaining: 0,
            reset_ms,
            retry_ms: Some(0),
            granted: 0,
            found: None,
        }
    }

    #[test]
    fn a_receipt_names_each_limits_window_and_reads_back() {
        let tb = OpKind::TokenBucket {
            capacity: 10,
            refill: 10,
            window_ms: 1_000,
        };
        let sw = OpKind::SlidingWindow {
            limit: 10,
            window_ms: 1_000,
        };
        let ops = [
            Op::take("a".into(), fw(), 60),
            Op::take("b".into(), tb, 60),
            Op::take("c".into(), sw, 60),
            Op::take("d".into(), fw(), 60),
            Op::take("e".into(), fw(), 60),
        ];
        let outcomes = [
            outcome(true, 2_000),
            outcome(true, 500),
            outcome(true, 1_300),
            outcome(false, 9),
            outcome(true, 9),
        ];
        let fallback = [false, false, false, false, true];
        let text = issue(
            60,
            1_000_000,
            ops.iter()
                .zip(&outcomes)
                .zip(fallback)
                .map(|((o, r), f)| (o, r, f)),
        );
        assert_eq!(text, "r:60:1002000:t1000000:1000300:-:-");
        assert_eq!(
            Settlement::read(&text),
            Settlement::Receipt {
                tokens: 60,
                limits: vec![
                    Taken::WindowEnding(1_002_000),
                    Taken::At(1_000_000),
                    Taken::WindowEnding(1_000_300),
                    Taken::Nothing,
                    Taken::Nothing,
                ],
            }
        );
    }

    #[test]
    fn a_settlement_gives_back_at_most_the_receipt_and_nothing_it_cannot_read() {
        let receipt = Settlement::read("r:60:1002000:-");
        let back = receipt.give_back("k".into(), fw(), 90, 0, 2);
        assert_eq!(
            (back.cost, back.action),
            (
                60,
                Action::Return {
                    receipt_ms: Some(1_002_000)
                }
            )
        );
        assert_eq!(receipt.give_back("k".into(), fw(), 90, 1, 2).cost, 0);
        // A receipt for two limits where the rules now have three: nothing.
        assert_eq!(receipt.give_back("k".into(), fw(), 90, 0, 3).cost, 0);
        // Smaller than the receipt: the refund's own cost.
        assert_eq!(receipt.give_back("k".into(), fw(), 20, 0, 2).cost, 20);
        for bad in ["r:", "r:x:1", "r:5", "r:5:1:x", "r:-1:0", "r:5:t", "r:5:tx"] {
            assert_eq!(Settlement::read(bad), Settlement::Unreadable, "{bad}");
            assert_eq!(
                Settlement::read(bad)
                    .give_back("k".into(), fw(), 9, 0, 1)
                    .cost,
                0
            );
        }
        // Without a receipt (a plain metadata gate): the refund as asked, current window.
        let plain = Settlement::read("held").give_back("k".into(), fw(), 9, 0, 1);
        assert_eq!((plain.cost, plain.action), (9, Action::RETURN));
    }
}
