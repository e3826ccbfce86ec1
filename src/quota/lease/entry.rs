//! One key's lease: its tokens, its batch size, what it gives back and what it reports.

use std::sync::Arc;

use super::{Claim, Lease, LeasePolicy};
use crate::quota::{Op, OpKind, Outcome};

impl Lease {
    /// An empty lease of bucket `id` for `op`: its first take claims.
    pub(super) fn new(id: &str, op: &Op, class: &Arc<str>, now_ms: u64) -> Self {
        Lease {
            tokens: 0,
            expires_ms: 0,
            shared_remaining: 0,
            claimed_ms: now_ms,
            spent_since_claim: 0,
            last_batch: 0,
            ttl_ms: 0,
            window_end_ms: 0,
            claiming: None,
            claim_key: (op.key != id).then(|| op.key.clone()),
            kind: op.kind,
            class: class.clone(),
        }
    }

    /// The next batch: about half a TTL's worth of this key's recent rate, at most `max`;
    /// nothing extra for a key seen less than about once per half TTL (an extra it would not
    /// spend in time only goes back at expiry).
    pub(super) fn batch(&self, policy: LeasePolicy, now_ms: u64) -> u64 {
        if self.expires_ms == 0 {
            // The key's first claim: no rate known yet, take only the cost.
            return 0;
        }
        self.per_half_ttl(policy.ttl_ms, now_ms)
            .min(policy.max_batch.max(1))
    }

    /// The tokens spent since the last claim, scaled to half a TTL of `ttl_ms`.
    fn per_half_ttl(&self, ttl_ms: u64, now_ms: u64) -> u64 {
        let elapsed = now_ms.saturating_sub(self.claimed_ms).max(1);
        self.spent_since_claim.saturating_mul(ttl_ms) / (2 * elapsed)
    }

    /// Whether the rate measured since the last claim still makes a batch now (and so at
    /// every earlier moment: it only falls as time passes); a lease that has claimed once
    /// and whose rate no longer does claims exactly as a new one would.
    pub(super) fn makes_a_batch(&self, now_ms: u64) -> bool {
        self.expires_ms != 0 && self.per_half_ttl(self.ttl_ms, now_ms) > 0
    }

    /// Notes where a claim of lease `id` went: `key`, which is `id` itself unless the limit
    /// is sharded.
    pub(super) fn set_claim_key(&mut self, id: &str, key: &str) {
        match &mut self.claim_key {
            _ if key == id => self.claim_key = None,
            Some(k) => key.clone_into(k),
            None => self.claim_key = Some(key.to_string()),
        }
    }

    /// The op that gives `tokens` of lease `id` back to where its last claim took them from.
    pub(super) fn give_back(&self, id: &str, tokens: u64) -> Op {
        Op {
            key: self.claim_key.clone().unwrap_or_else(|| id.to_string()),
            kind: self.kind,
            cost: tokens,
            action: crate::quota::ops::Action::RETURN,
        }
    }

    /// A leased answer (see the module doc): allowed, `spent` just taken.
    pub(super) fn estimate(&self, now_ms: u64, spent: u64) -> Outcome {
        let (remaining, reset_ms) = match self.kind {
            OpKind::TokenBucket {
                capacity,
                refill,
                window_ms,
            } => {
                let remaining = (self.shared_remaining + self.tokens).min(capacity);
                let missing = capacity - remaining;
                let reset = if refill == 0 {
                    window_ms
                } else {
                    (missing.saturating_mul(window_ms)).div_ceil(refill)
                };
                (remaining, reset)
            }
            OpKind::FixedWindow { limit, .. }
            | OpKind::SlidingWindow { limit, .. }
            | OpKind::SlidingLog { limit, .. }
            | OpKind::CalendarWindow { limit, .. } => (
                (self.shared_remaining + self.tokens).min(limit),
                self.window_end_ms.saturating_sub(now_ms),
            ),
        };
        Outcome {
            allowed: true,
            remaining,
            reset_ms,
            retry_ms: Some(0),
            granted: spent,
            found: None,
        }
    }

    /// Ends `claim`'s single flight, if it is this lease's, and wakes its waiters.
    pub(super) fn release(&mut self, claim: &Claim) {
        if let (Some(mine), Some(current)) = (&claim.notify, &self.claiming)
            && Arc::ptr_eq(mine, current)
        {
            self.claiming = None;
            mine.notify_waiters();
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let Some(leases) = self.leases.take() else {
            return;
        };
        let mut shard = leases.shard(&self.id);
        if let Some(lease) = shard.get_mut(&self.id) {
            lease.tokens += self.reserved;
            lease.release(self);
        }
    }
}
