//! One RLQS report, steps 1 and 2 of the module doc (`rlqs/mod.rs`): the stream's domain is
//! checked, each reported bucket is admitted ([`Session::admit_id`]), matched to its rule,
//! its last assignment settled against what it admitted (one store call for all), abandoned
//! when idle or ruleless, and its demand recorded; then the counted buckets go to
//! `claim.rs` and the others are told their blanket assignment.

use std::collections::HashMap;

use super::session::{Admit, Tracked, tracked_key};
use super::{Action, Assignment, BucketKey, RlqsError, Session, Usage};
use crate::limiter::{FallbackMode, Limiter, Quota};
use crate::quota::lease::WINDOW_MARGIN_MS;
use crate::quota::{Action as OpAction, Op};
use crate::rules::RuleSet;

/// What a report's first pass gathers: the ids still held (to claim or tell), the give-backs
/// and charges that settle their last assignments (one store call), and what some are told
/// at once (refused, abandoned).
#[derive(Default)]
struct Pass {
    reported: Vec<BucketKey>,
    settles: Vec<(Op, Option<FallbackMode>)>,
    actions: Vec<Action>,
}

impl Session {
    /// Handles one report (see the module doc); `domain` is the report's (empty after the
    /// first, as Envoy may send it). An error ends the stream.
    pub async fn report(
        &mut self,
        limiter: &Limiter,
        rules: &RuleSet,
        domain: &str,
        usages: Vec<Usage>,
    ) -> Result<Vec<Action>, RlqsError> {
        self.shared.metrics.reports.inc();
        self.check_domain(rules, domain)?;
        let now = self.shared.config.clock.mono_ms();
        let interval = self.shared.config.report_interval_ms;

        // 1. Rules, each bucket's demand, and the last assignments settled.
        let mut pass = Pass::default();
        for usage in merge_repeats(usages) {
            self.take_usage(limiter, rules, usage, now, &mut pass);
        }
        if !pass.settles.is_empty() {
            limiter.apply_quota_ops(&pass.settles).await;
        }

        // 2. Claims for the counted buckets; the others are told now.
        let mut actions = pass.actions;
        let mut claims: Vec<BucketKey> = Vec::new();
        for id in pass.reported {
            let Some(tracked) = self.buckets.get(&id) else {
                continue;
            };
            match tracked.quota {
                Quota::Counted { .. } => claims.push(id),
                // No limit (as RLS answers), or not servable (refused at load in an
                // rlqs: true domain; here only if the rules changed under the stream).
                Quota::NoRule | Quota::Unlimited | Quota::Unservable => {
                    let assignment = Assignment::AllowAll {
                        ttl_s: self.shared.ttl_s(),
                    };
                    actions.push(self.told(id, assignment));
                }
            }
        }
        actions.extend(self.claim(limiter, claims, now, interval).await);
        Ok(actions)
    }

    /// The report's domain against the stream's: the first report names a known domain served
    /// over RLQS, later ones the same one (or none); a reload that took `rlqs: true` away ends
    /// the stream (Envoy falls back, rather than its buckets going unlimited).
    fn check_domain(&mut self, rules: &RuleSet, domain: &str) -> Result<(), RlqsError> {
        let refuse = |reason: &'static str, e: RlqsError| {
            self.shared.refused(reason);
            Err(e)
        };
        match &self.domain {
            None if domain.is_empty() => refuse("no_domain", RlqsError::NoDomain),
            None => match rules.domains.get(domain) {
                None => refuse(
                    "unknown_domain",
                    RlqsError::UnknownDomain(domain.to_string()),
                ),
                Some(d) if !d.rlqs => refuse("not_rlqs", RlqsError::NotRlqs(domain.to_string())),
                Some(_) => {
                    self.domain = Some(domain.to_string());
                    Ok(())
                }
            },
            Some(first) if !domain.is_empty() && domain != first => refuse(
                "domain_changed",
                RlqsError::DomainChanged {
                    first: first.clone(),
                    now: domain.to_string(),
                },
            ),
            Some(first) if rules.domains.get(first).is_some_and(|d| !d.rlqs) => {
                refuse("not_rlqs", RlqsError::NotRlqs(first.clone()))
            }
            Some(_) => Ok(()),
        }
    }

    /// One bucket's usage: admitted (or told `DENY_ALL`), its last assignment settled, then
    /// abandoned (idle, or its rule went away) or kept with its demand recorded.
    fn take_usage(
        &mut self,
        limiter: &Limiter,
        rules: &RuleSet,
        usage: Usage,
        now: u64,
        pass: &mut Pass,
    ) {
        let reserved = match self.admit_id(&usage.id) {
            Admit::Held => 0,
            Admit::New(bytes) => bytes,
            Admit::Denied => {
                let ttl_s = self.shared.ttl_s();
                pass.actions
                    .push(self.told(usage.id, Assignment::DenyAll { ttl_s }));
                return;
            }
            Admit::Skipped => return,
        };
        let quota = self.quota(limiter, rules, &usage.id);
        let shared = self.shared.clone();
        let tracked = self.buckets.entry(usage.id.clone()).or_insert_with(|| {
            shared.metrics.buckets.inc();
            Tracked::new(quota.clone(), now, reserved)
        });
        let requests = usage.allowed.saturating_add(usage.denied);
        if requests > 0 {
            tracked.active_ms = now;
        }
        pass.settles
            .extend(settle(tracked, usage.allowed, now, &shared));
        let old_key = tracked_key(tracked);
        let new_key = match &quota {
            Quota::Counted { key, .. } => Some(key.clone()),
            _ => None,
        };
        let idle = requests == 0 && now.saturating_sub(tracked.active_ms) >= shared.config.idle_ms;
        // Its rule went away on a reload, or it went idle: Envoy forgets it, and its next
        // request brings it back as a new bucket.
        if idle || (old_key.is_some() && new_key.is_none()) {
            if let Some(t) = self.buckets.remove(&usage.id) {
                shared.caps.release(t.bytes);
            }
            shared.metrics.buckets.dec();
            if let Some(key) = old_key {
                self.forget_demand(&key, &usage.id);
            }
            pass.actions.push(self.told(usage.id, Assignment::Abandon));
            return;
        }
        tracked.quota = quota;
        tracked.rate =
            (usage.elapsed_ms > 0).then(|| requests as f64 * 1000.0 / usage.elapsed_ms as f64);
        let rate = tracked.rate;
        if old_key.is_some() && old_key != new_key {
            // A changed limit (a new key): the old bucket's demand goes.
            if let Some(key) = &old_key {
                self.forget_demand(key, &usage.id);
            }
        }
        if let Some(key) = new_key {
            let mut demand = shared.demand();
            demand
                .entry(key)
                .or_default()
                .rates
                .insert(self.demand_id(&usage.id), rate);
        }
        pass.reported.push(usage.id);
    }
}

/// The last assignment's tokens (`held`) against what the Envoy says it admitted: the unused
/// ones given back, the ones admitted beyond it charged (into debt if need be). Tokens the
/// fallback granted, or of a window that is over, are not the store's to take back.
fn settle(
    tracked: &mut Tracked,
    allowed: u64,
    now: u64,
    shared: &super::Rlqs,
) -> Option<(Op, Option<FallbackMode>)> {
    let Quota::Counted { limit, key, kind } = &tracked.quota else {
        return None;
    };
    let held = std::mem::take(&mut tracked.held);
    let window_over = tracked
        .window_end_ms
        .is_some_and(|end| now.saturating_add(WINDOW_MARGIN_MS) >= end);
    if held > allowed && !tracked.held_from_fallback && !window_over {
        let n = held - allowed;
        shared.count_tokens("returned", n);
        let give_back = Op {
            key: key.clone(),
            kind: *kind,
            cost: n,
            action: OpAction::RETURN,
        };
        Some((give_back, limit.fallback))
    } else if allowed > held {
        let n = allowed - held;
        shared.count_tokens("charged", n);
        Some((Op::charge(key.clone(), *kind, n), limit.fallback))
    } else {
        None
    }
}

/// One usage per bucket id: a report that names an id twice (Envoy does not; a hostile client
/// might) counts its requests once each, not its assignment twice.
fn merge_repeats(usages: Vec<Usage>) -> Vec<Usage> {
    let mut at: HashMap<BucketKey, usize> = HashMap::new();
    let mut merged: Vec<Usage> = Vec::with_capacity(usages.len());
    for u in usages {
        match at.get(&u.id) {
            Some(&i) => {
                let m = &mut merged[i];
                m.allowed = m.allowed.saturating_add(u.allowed);
                m.denied = m.denied.saturating_add(u.denied);
                m.elapsed_ms = m.elapsed_ms.max(u.elapsed_ms);
            }
            None => {
                at.insert(u.id.clone(), merged.len());
                merged.push(u);
            }
        }
    }
    merged
}
