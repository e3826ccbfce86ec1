//! Step 3 of an RLQS report (`rlqs/mod.rs`): one store call claiming each counted bucket's
//! next assignment, sized by its demand against the other Envoys' ([`super::size`]), and what
//! each outcome tells the Envoy: its tokens, `DENY_ALL` until the store says tokens exist
//! again, or, in a fixed window's last second, `DENY_ALL` until the next window.

use std::collections::HashMap;

use super::session::Session;
use super::{Action, Assignment, BucketKey, KeyDemand, size};
use crate::limiter::{FallbackMode, Limiter, Quota};
use crate::quota::{Action as OpAction, ClaimAsk, Op, OpKind, Outcome};

/// What a bucket's claim step asks of the store.
enum Ask {
    Claim((Op, Option<FallbackMode>)),
    /// Its fixed window ends at this monotonic ms, within a second: told `DENY_ALL` until then.
    WindowEnds(u64),
    /// Not held, or not counted.
    Nothing,
}

impl Session {
    /// One store call claiming the next assignment of each of `ids` (all counted).
    pub(super) async fn claim(
        &mut self,
        limiter: &Limiter,
        ids: Vec<BucketKey>,
        now: u64,
        interval: u64,
    ) -> Vec<Action> {
        let mut ops: Vec<(Op, Option<FallbackMode>)> = Vec::with_capacity(ids.len());
        let mut asked: Vec<BucketKey> = Vec::with_capacity(ids.len());
        let mut actions = Vec::with_capacity(ids.len());
        let mut window_ending: Vec<(BucketKey, u64)> = Vec::new();
        {
            let demand = self.shared.demand();
            for id in ids {
                match self.claim_op(&id, &demand, now, interval) {
                    Ask::Claim(op) => {
                        ops.push(op);
                        asked.push(id);
                    }
                    Ask::WindowEnds(end) => window_ending.push((id, end)),
                    Ask::Nothing => {}
                }
            }
        }
        for (id, end) in window_ending {
            actions.push(self.window_ends(id, end));
        }
        let outcomes = limiter.apply_quota_ops(&ops).await;
        for ((id, (op, _)), outcome) in asked.into_iter().zip(&ops).zip(outcomes) {
            actions.extend(self.claimed(id, op, outcome, now, interval));
        }
        actions
    }

    /// The claim for bucket `id`: [`size::want`] tokens, its demand-weighted share of what the
    /// key's bucket can give over one interval.
    fn claim_op(
        &self,
        id: &BucketKey,
        demand: &HashMap<String, KeyDemand>,
        now: u64,
        interval: u64,
    ) -> Ask {
        let Some(t) = self.buckets.get(id) else {
            return Ask::Nothing;
        };
        let Quota::Counted { limit, key, kind } = &t.quota else {
            return Ask::Nothing;
        };
        // A fixed window known to end within a second: an assignment could not end with it
        // (Envoy reads whole seconds), so none is claimed (see `claimed`).
        if let Some(end) = t.window_end_ms.filter(|&end| {
            matches!(kind, OpKind::FixedWindow { .. }) && end > now && end - now < 1_000
        }) {
            return Ask::WindowEnds(end);
        }
        let me = self.demand_id(id);
        let (others, remaining) = match demand.get(key) {
            Some(d) => (
                d.rates
                    .iter()
                    .filter(|(s, _)| **s != me)
                    .map(|(_, r)| r.unwrap_or(0.0))
                    .collect::<Vec<f64>>(),
                d.remaining
                    .filter(|&(_, until)| now < until)
                    .map(|(r, _)| r),
            ),
            None => (Vec::new(), None),
        };
        let capacity = match *kind {
            OpKind::TokenBucket { capacity, .. } => capacity,
            OpKind::FixedWindow { limit, .. }
            | OpKind::SlidingWindow { limit, .. }
            | OpKind::SlidingLog { limit, .. }
            | OpKind::CalendarWindow { limit, .. } => limit,
        };
        let supply = size::supply(*kind, remaining.unwrap_or(capacity), interval);
        let ramp = size::refill_per_interval(*kind, interval);
        // Envoy's max_tokens is a u32.
        let want = size::want(t.rate, &others, supply, interval, ramp).min(u64::from(u32::MAX));
        let op = Op {
            key: key.clone(),
            kind: *kind,
            cost: 1,
            action: OpAction::Claim(ClaimAsk {
                need: 1,
                want,
                // Not split by replicas as leases are: `want` is already this Envoy's share,
                // capped by its own demand.
                share: 1,
            }),
        };
        Ask::Claim((op, limit.fallback))
    }

    /// What bucket `id` is told after its claim `op` came back with `outcome` (`None`: the
    /// limit's fallback is `error`, nothing is told).
    fn claimed(
        &mut self,
        id: BucketKey,
        op: &Op,
        outcome: Option<(Outcome, bool)>,
        now: u64,
        interval: u64,
    ) -> Option<Action> {
        let ttl_s = self.shared.ttl_s();
        let Some((outcome, from_fallback)) = outcome else {
            // The limit's fallback is `error`: no assignment, so Envoy keeps its last one
            // until its TTL and then applies its own expired_assignment_behavior. Tried
            // again a quarter interval on (not at once: a failing store answers fast).
            if let Some(t) = self.buckets.get_mut(&id) {
                t.held = 0;
                t.wake_ms = Some(now.saturating_add((interval / 4).max(100)));
            }
            return None;
        };
        // A fixed window's end: `reset_ms` is until its count is back at 0, which with
        // debt is some whole windows past this one's end. Not for the fallback's answer:
        // its `reset_ms` is its own (`closed_retry_ms` for `open`, a stretched window for
        // a small limit's `local` share), not the store's window.
        let window_left = match op.kind {
            OpKind::FixedWindow { window_ms, .. } if !from_fallback => {
                Some(outcome.reset_ms.saturating_sub(1) % window_ms.max(1) + 1)
            }
            _ => None,
        };
        if !from_fallback {
            // A token bucket's remaining holds (the supply adds its refill); a fixed
            // window's only until the window ends.
            let until = match window_left {
                Some(left) => now.saturating_add(left),
                None => u64::MAX,
            };
            let mut demand = self.shared.demand();
            if let Some(d) = demand.get_mut(&op.key) {
                d.remaining = Some((outcome.remaining, until));
            }
        }
        let t = self.buckets.get_mut(&id)?;
        t.held_from_fallback = from_fallback;
        let window_end = window_left.map(|left| now.saturating_add(left));
        // Only a granted assignment's window matters (settling, and the claim before the
        // window's last second).
        t.window_end_ms = window_end.filter(|_| outcome.granted > 0);
        if let Some(end) = window_end.filter(|&end| outcome.granted > 0 && end < now + 1_000) {
            // Granted in the window's last second: an assignment of whole seconds would
            // outlive it. Its tokens end with the window (too close to give back: a
            // give-back landing in the next window would take hits off that one).
            self.shared.count_tokens("expired", outcome.granted);
            return Some(self.window_ends(id, end));
        }
        let assignment = if outcome.granted > 0 {
            t.held = outcome.granted;
            // A fixed window's assignment ends with its window (Envoy reads whole
            // seconds: rounded down, it never outlives it). Until the Envoy's next report
            // it applies its expired_assignment_behavior; what that admits is charged to
            // the new window then. (Pushing the new window's assignment at once would
            // leave the old one's usage and the new one's in one count, which could only
            // be charged twice or under-charged.)
            let ttl_s = match window_left {
                Some(left) => ttl_s.min(left / 1_000),
                None => ttl_s,
            };
            t.wake_ms = None;
            self.shared.count_tokens("assigned", outcome.granted);
            Assignment::Tokens {
                tokens: outcome.granted,
                ttl_s,
            }
        } else {
            // Claimed again when the store says a token exists, but not more often than
            // a quarter interval: a slow refill would otherwise push one token at a time.
            t.wake_ms = outcome
                .retry_ms
                .map(|r| now.saturating_add(r.max(interval / 4)));
            Assignment::DenyAll { ttl_s }
        };
        Some(self.told(id, assignment))
    }

    /// A fixed window ends within a second (at monotonic `end`): the bucket is denied until
    /// then (1 s, the least Envoy reads) and claimed again when the next window starts.
    fn window_ends(&mut self, id: BucketKey, end: u64) -> Action {
        if let Some(t) = self.buckets.get_mut(&id) {
            t.held = 0;
            t.wake_ms = Some(end);
        }
        self.told(id, Assignment::DenyAll { ttl_s: 1 })
    }
}
