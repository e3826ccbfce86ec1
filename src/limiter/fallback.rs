//! The fallback: how an op is decided while the store cannot answer for it (a failed or
//! timed-out call, or an open circuit; see `store/breaker.rs`).
//!
//! Each failed op gets the mode of its limit (`fallback:` in `rate_limit`), else the global
//! `fallback` setting:
//! - `local` (default): a bucket in this process holding the limit's share, quota ÷ live
//!   replicas, same algorithm and same burst ratio. A token bucket keeps its refill and
//!   stretches its window by the replica count (so a fractional share refills correctly); its
//!   capacity is `burst ÷ replicas`, at least 1. A window of fewer requests than replicas
//!   allows one request per `replicas ÷ limit` windows. The buckets start full and are keyed
//!   by the limit's key and the replica count only (a change of the count starts fresh ones),
//!   so they are **kept across outages**: a store that fails, recovers and fails again every
//!   half second (a Redis at `maxmemory` refusing scripts) finds each share as the last
//!   outage left it, and the fallback admits at most one share per replica per refill period
//!   (per window), however often the store flaps. They are dropped only once full again.
//!   A request whose cost is above the share (capacity ÷ replicas) is refused for as long as
//!   the store is out, with a retry of one probe interval (the shared bucket may hold it once
//!   the store is back), never admitted past the share.
//!   An op whose outcome is unknown (its call timed out: the script may have run and spent
//!   the tokens) is refused, never taken from the share, with a retry of one probe interval.
//! - `open`: admitted; `closed`: refused (retry after one probe interval);
//! - `error`: the whole request fails with gRPC UNAVAILABLE, so Envoy's `failure_mode_deny`
//!   decides (the behaviour before the fallback existed).
//!
//! The replica count ([`Replicas`]) is the fixed `fallback_replicas`, else the last count of
//! the store's membership set (kept while the store is down), never below
//! `fallback_min_replicas`; a replica that never reached the store uses that floor.

use std::sync::Arc;

use crate::clock::Clock;
use crate::fleet::Replicas;
use crate::quota::{Action, Op, Outcome};
pub use crate::rules::FallbackMode;
use crate::store::MemoryStore;

/// Decides the ops the store could not answer.
#[derive(Debug)]
pub(super) struct Fallback {
    pub(super) mode: FallbackMode,
    local: MemoryStore,
    pub(super) replicas: Arc<Replicas>,
    /// What `closed` (and an unknown outcome) tells a client to wait (one probe interval).
    closed_retry_ms: u64,
}

impl Fallback {
    pub(super) fn new(
        mode: FallbackMode,
        replicas: Arc<Replicas>,
        clock: Clock,
        closed_retry_ms: u64,
        max_keys: usize,
    ) -> Self {
        Fallback {
            mode,
            local: MemoryStore::with_max_keys(clock, max_keys),
            replicas,
            closed_retry_ms,
        }
    }

    /// The outcome of `op` under `mode`, or `None` for `error`. `unknown`: the store call may
    /// have run (see [`crate::store::StoreError::outcome_unknown`]).
    pub(super) fn decide(&self, op: &Op, mode: FallbackMode, unknown: bool) -> Option<Outcome> {
        let refused = Outcome {
            allowed: false,
            remaining: 0,
            reset_ms: self.closed_retry_ms,
            retry_ms: Some(self.closed_retry_ms),
            granted: 0,
            found: None,
        };
        if op.action.is_return() {
            return self.give_back(op, mode, unknown);
        }
        match mode {
            FallbackMode::Error => None,
            FallbackMode::Open => Some(Outcome {
                allowed: true,
                remaining: 0,
                reset_ms: 0,
                retry_ms: Some(0),
                granted: op.cost,
                found: None,
            }),
            FallbackMode::Closed => Some(refused),
            // Its tokens may be spent in the shared bucket already: admitting it from the
            // share as well would count it twice.
            FallbackMode::Local if unknown => Some(refused),
            FallbackMode::Local => {
                let n = self.replicas.count();
                // A take (a failed lease claim falls back for its request's cost), or a charge
                // for an overdraft limit: its usage is charged to the share.
                let key = format!("{}|n{n}", op.key);
                let kind = crate::quota::share::fallback_part(op.kind, n);
                let share = if op.action == Action::Charge {
                    Op::charge(key, kind, op.cost)
                } else {
                    Op::take(key, kind, op.cost)
                };
                let mut outcome = self.local.apply(&share);
                if !outcome.allowed && outcome.retry_ms.is_none() {
                    // The cost is above this replica's share: the share can never hold it,
                    // but the shared bucket may once the store answers again.
                    outcome.retry_ms = Some(self.closed_retry_ms);
                    outcome.reset_ms = outcome.reset_ms.max(self.closed_retry_ms);
                }
                Some(outcome)
            }
        }
    }

    /// A refund (Envoy's `is_negative_hits`) the store could not take: never refused. Under
    /// `local` the tokens go back to this replica's share, where takes are decided meanwhile
    /// (capped at the share, as the store caps at the capacity), unless the store may have
    /// taken them already; otherwise they are dropped (fewer admitted later, never more).
    fn give_back(&self, op: &Op, mode: FallbackMode, unknown: bool) -> Option<Outcome> {
        match mode {
            FallbackMode::Error => None,
            FallbackMode::Local if !unknown => {
                let n = self.replicas.count();
                let key = format!("{}|n{n}", op.key);
                let kind = crate::quota::share::fallback_part(op.kind, n);
                // The receipt's window goes with it: a late refund gives the share nothing.
                let back = Op {
                    action: op.action,
                    ..Op::give_back(key, kind, op.cost)
                };
                Some(self.local.apply(&back))
            }
            _ => Some(Outcome {
                allowed: true,
                remaining: 0,
                reset_ms: 0,
                retry_ms: Some(0),
                granted: 0,
                found: None,
            }),
        }
    }

    /// An RLQS op the store could not answer, under `mode` (`None` for `error`). A claim is
    /// claimed from this replica's local share of the quota (as a take is decided from it) so
    /// the Envoys on this replica get a share, not the whole quota; `open` grants all it
    /// wants. A charge goes to the share; a give-back the store did not take is dropped (those
    /// tokens are lost, never counted twice; the session never gives back tokens the fallback
    /// granted). `unknown`: the store call may have run, so nothing more is granted.
    pub(super) fn claim(&self, op: &Op, mode: FallbackMode, unknown: bool) -> Option<Outcome> {
        let nothing = Outcome {
            allowed: false,
            remaining: 0,
            reset_ms: self.closed_retry_ms,
            retry_ms: Some(self.closed_retry_ms),
            granted: 0,
            found: None,
        };
        let Action::Claim(ask) = op.action else {
            return match op.action {
                Action::Charge => self.decide(op, mode, unknown),
                _ => Some(nothing),
            };
        };
        match mode {
            FallbackMode::Error => None,
            FallbackMode::Open => Some(Outcome {
                allowed: true,
                granted: ask.want,
                retry_ms: Some(0),
                ..nothing
            }),
            FallbackMode::Closed => Some(nothing),
            FallbackMode::Local if unknown => Some(nothing),
            FallbackMode::Local => {
                let n = self.replicas.count();
                let share = Op {
                    key: format!("{}|n{n}", op.key),
                    kind: crate::quota::share::fallback_part(op.kind, n),
                    cost: ask.need,
                    action: op.action,
                };
                Some(self.local.apply(&share))
            }
        }
    }

    /// Drops local buckets that are full again (called with the store's housekeeping).
    pub(super) fn sweep(&self) {
        self.local.sweep();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::OpKind;

    fn tb(capacity: u64, refill: u64) -> Op {
        Op {
            key: "k".into(),
            kind: OpKind::TokenBucket {
                capacity,
                refill,
                window_ms: 1_000,
            },
            cost: 1,
            action: Default::default(),
        }
    }

    #[test]
    fn modes_answer_as_documented_and_local_spends_the_share() {
        let replicas = Arc::new(Replicas::new(0, 1));
        let clock = Clock::manual(1_700_000_000_000);
        let f = Fallback::new(
            FallbackMode::Local,
            replicas.clone(),
            clock.clone(),
            500,
            1_000,
        );
        assert!(f.decide(&tb(1, 1), FallbackMode::Error, false).is_none());
        assert!(
            f.decide(&tb(1, 1), FallbackMode::Open, false)
                .unwrap()
                .allowed
        );
        let closed = f.decide(&tb(1, 1), FallbackMode::Closed, false).unwrap();
        assert_eq!((closed.allowed, closed.retry_ms), (false, Some(500)));

        assert_eq!(replicas.source(), "floor");
        replicas.observed(3);
        assert_eq!((replicas.count(), replicas.source()), (3, "membership"));
        let admitted = (0..20)
            .filter(|_| {
                f.decide(&tb(30, 30), FallbackMode::Local, false)
                    .unwrap()
                    .allowed
            })
            .count();
        assert_eq!(admitted, 10, "30 across 3 replicas");
        // The store recovered and failed again: the share is where the last outage left it
        // (spent), not full again.
        assert!(
            !f.decide(&tb(30, 30), FallbackMode::Local, false)
                .unwrap()
                .allowed
        );
        // A fresh key's share is full, but an op whose call timed out is refused from it.
        let fresh = Op {
            key: "fresh".into(),
            ..tb(30, 30)
        };
        let unknown = f.decide(&fresh, FallbackMode::Local, true).unwrap();
        assert_eq!((unknown.allowed, unknown.retry_ms), (false, Some(500)));
        assert!(
            f.decide(&fresh, FallbackMode::Local, false)
                .unwrap()
                .allowed
        );
        // A cost above the share (10 of 30 across 3): refused, retry after a probe interval.
        let big = Op {
            key: "big".into(),
            cost: 11,
            ..tb(30, 30)
        };
        let o = f.decide(&big, FallbackMode::Local, false).unwrap();
        assert_eq!((o.allowed, o.retry_ms), (false, Some(500)));
    }
}
