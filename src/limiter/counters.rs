//! The limiter's half of the counter API (the admin port's `/counters/…`, `counter_api.rs`):
//! what a request's buckets hold now, and resetting them.
//!
//! A request is planned as a decision would be (`plan.rs`: the same rules, `replaces`,
//! overrides and keys), and each counted limit's bucket (every shard of a sharded one) is
//! read with a check (a cost of 0) **straight from the store**: no lease, no over-limit cache,
//! no fallback, so the answer is the shared bucket's, net of what all replicas' leases hold.
//! What this replica's own lease holds is reported beside it.
//!
//! A reset deletes the buckets (each starts over, full) and forgets what this replica holds of
//! them; on Redis the store also writes them to the fleet's reset log, which every other
//! replica reads each membership interval and forgets its own cache entries and leases of
//! ([`Limiter::forget_buckets`], run by `counter_api::follow_resets`).

use std::sync::Arc;

use serde::Serialize;

use super::{Limiter, Request, plan};
use crate::keys;
use crate::quota::share::shard_part;
use crate::quota::{Op, OpKind};
use crate::rules::{Limit, RuleSet};
use crate::store::StoreError;

/// One bucket of a request, as the store holds it now.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BucketView {
    /// The request's descriptor the bucket is for (0-based).
    pub descriptor: usize,
    /// The limit's metrics class, and its `name` when it has one.
    pub class: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub algorithm: &'static str,
    pub requests_per_unit: u32,
    pub unit: &'static str,
    pub unit_multiplier: u32,
    /// A token bucket's capacity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// A calendar window's calendar (`month UTC`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calendar: Option<String>,
    /// The store key (a sharded limit's: without its shard part; its shards are listed).
    pub key: String,
    /// Hits (tokens) left now: a sharded limit's shards added up.
    pub remaining: u64,
    /// Until the bucket is whole again (a token bucket full, a window over, debt paid).
    pub reset_ms: u64,
    /// Tokens this replica's lease holds of it (taken from the bucket already).
    pub leased_here: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardView>,
}

/// One shard of a sharded limit's bucket.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ShardView {
    pub key: String,
    pub remaining: u64,
    pub reset_ms: u64,
}

/// A counted limit's bucket: its keys (one, or one per shard) with each key's op kind.
struct Planned {
    descriptor: usize,
    limit: Arc<Limit>,
    /// The whole bucket's key (a sharded limit's: its shard part dropped).
    key: String,
    keys: Vec<(String, OpKind)>,
}

impl Limiter {
    /// The buckets `req` maps to, one per counted limit, read from the store now (module
    /// doc). A domain without rules has none. `Err`: the store could not answer.
    pub async fn read_buckets(
        &self,
        rules: &RuleSet,
        req: &Request<'_>,
    ) -> Result<Vec<BucketView>, StoreError> {
        let planned = self.buckets_of(rules, req);
        let checks: Vec<Op> = planned
            .iter()
            .flat_map(|p| &p.keys)
            .map(|(key, kind)| Op::take(key.clone(), *kind, 0))
            .collect();
        let outcomes = self.store.apply(&checks).await?;
        if outcomes.len() != checks.len() {
            return Err(StoreError::new(
                crate::store::StoreErrorKind::Protocol,
                format!("{} answers to {} checks", outcomes.len(), checks.len()),
            ));
        }
        let mut outcomes = outcomes.into_iter();
        let mut views = Vec::with_capacity(planned.len());
        for p in planned {
            let Some(rate) = p.limit.rate else { continue };
            let mut shards = Vec::new();
            let (mut remaining, mut reset_ms) = (0u64, 0u64);
            for (key, _) in &p.keys {
                let Some(o) = outcomes.next() else { break };
                remaining = remaining.saturating_add(o.remaining);
                reset_ms = reset_ms.max(o.reset_ms);
                if p.keys.len() > 1 {
                    shards.push(ShardView {
                        key: key.clone(),
                        remaining: o.remaining,
                        reset_ms: o.reset_ms,
                    });
                }
            }
            views.push(BucketView {
                descriptor: p.descriptor,
                class: p.limit.class.to_string(),
                name: p.limit.name.clone(),
                algorithm: rate.algorithm.name(),
                requests_per_unit: rate.requests_per_unit,
                unit: rate.unit.name(),
                unit_multiplier: rate.unit_multiplier,
                burst: (rate.algorithm == crate::rules::Algorithm::TokenBucket)
                    .then_some(rate.burst),
                calendar: rate.calendar.map(|c| c.to_string()),
                leased_here: p
                    .keys
                    .iter()
                    .map(|(k, _)| self.hot.leased(k))
                    .max()
                    .unwrap_or(0),
                key: p.key,
                remaining,
                reset_ms,
                shards,
            });
        }
        Ok(views)
    }

    /// Resets the buckets `req` maps to: reads them (the answer: what was reset), deletes
    /// them in the store (each starts over, full), and forgets what this replica holds of
    /// them. `members_key` names the fleet's reset log on Redis (the membership set's key).
    pub async fn reset_buckets(
        &self,
        rules: &RuleSet,
        req: &Request<'_>,
        members_key: &str,
    ) -> Result<Vec<BucketView>, StoreError> {
        let before = self.read_buckets(rules, req).await?;
        // Each bucket's stored keys: its own, or its shards'.
        let keys: Vec<String> = before
            .iter()
            .flat_map(|b| match b.shards.is_empty() {
                true => vec![b.key.clone()],
                false => b.shards.iter().map(|s| s.key.clone()).collect(),
            })
            .collect();
        if !keys.is_empty() {
            self.store.reset(&keys, members_key).await?;
            self.forget_buckets(&keys);
        }
        Ok(before)
    }

    /// Forgets this replica's over-limit cache entries and lease tokens of the buckets `keys`
    /// (reset by the counter API, here or on another replica); the leased tokens dropped.
    pub fn forget_buckets(&self, keys: &[String]) -> u64 {
        keys.iter().map(|k| self.hot.forget_bucket(k)).sum()
    }

    /// Empties this replica's over-limit cache (resets it may have missed: the fleet's log
    /// lost some); how many entries it held. Leases stay: what they hold is bounded by a TTL.
    pub fn forget_all_cached(&self) -> usize {
        self.hot.forget_all_cached()
    }

    /// Each counted limit's bucket of `req`, with every key it is stored under.
    fn buckets_of(&self, rules: &RuleSet, req: &Request<'_>) -> Vec<Planned> {
        let Some(domain) = rules.domains.get(req.domain) else {
            return Vec::new();
        };
        let plan = plan::plan(domain, req, &self.config, &self.override_class);
        plan.planned
            .iter()
            .zip(&plan.ops)
            .filter_map(|(planned, op)| {
                let rate = planned.limit.rate?;
                let whole = OpKind::from(rate);
                let shards = planned.limit.shards;
                let (key, keys) = match planned.shard {
                    Some(_) => {
                        let id = keys::bucket_id(&op.key);
                        let each = (0..shards)
                            .map(|i| (keys::with_shard(id, i), shard_part(whole, shards, i)))
                            .collect();
                        (format!("{id}}}"), each)
                    }
                    None => (op.key.clone(), vec![(op.key.clone(), whole)]),
                };
                Some(Planned {
                    descriptor: planned.desc,
                    limit: planned.limit.clone(),
                    key,
                    keys,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::Code;
    use super::super::fixture::{block_on, fixture, req};

    #[test]
    fn a_read_shows_every_bucket_and_a_reset_makes_them_whole() {
        let f = fixture(false);
        let both = req("edge", &[&[("both", "x")], &[("sharded", "s")]]);
        for _ in 0..2 {
            f.decide(&both);
        }
        let views = block_on(f.limiter.read_buckets(&f.rules, &both)).unwrap();
        // `both`: 5/second and 2/hour (`sustained`); `sharded`: 8/hour in 4 shards.
        let summary: Vec<(usize, &str, u64)> = views
            .iter()
            .map(|v| (v.descriptor, v.class.as_str(), v.remaining))
            .collect();
        assert_eq!(
            summary,
            [(0, "both", 3), (0, "sustained", 0), (1, "sharded", 6)]
        );
        assert_eq!(views[2].shards.len(), 4);
        assert!(views[2].shards.iter().all(|s| s.key.contains("|#")));
        assert!(!views[2].key.contains("|#") && views[2].key.ends_with('}'));
        assert_eq!(views[1].name.as_deref(), Some("sustained"));

        let before = block_on(f.limiter.reset_buckets(&f.rules, &both, "t:{members}")).unwrap();
        assert_eq!(before, views, "the answer is what was reset");
        let after = block_on(f.limiter.read_buckets(&f.rules, &both)).unwrap();
        let remaining: Vec<u64> = after.iter().map(|v| v.remaining).collect();
        assert_eq!(remaining, [5, 2, 8], "whole again");
        assert_eq!(f.codes(&req("edge", &[&[("both", "x")]])), [Code::Ok]);
        // No rules for the domain: no buckets.
        let none = block_on(
            f.limiter
                .read_buckets(&f.rules, &req("nowhere", &[&[("a", "b")]])),
        );
        assert_eq!(none.unwrap(), []);
    }
}
