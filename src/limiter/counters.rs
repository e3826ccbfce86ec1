//! The limiter's half of the counter API (the admin port's `/counters/…`, `counter_api.rs`):
//! what a request's buckets hold now, and resetting them.
//!
//! A request is planned as a decision would be (`plan.rs`: the same rules, `replaces`,
//! overrides and keys), and each counted limit's bucket (every shard of a sharded one) is
//! read with a check (a cost of 0) **straight from the store**: no lease, no over-limit cache,
//! no fallback, so the answer is the shared bucket's, net of what all replicas' leases hold.
//! What this replica's own lease holds is reported beside it.
//!
//! A `global: true` limit's bucket is read at this region's share of it (`regions/`: what the
//! region enforces, not the rule's numbers), without counting the read as demand.
//!
//! An explain ([`Limiter::explain`], `POST /counters/explain`) reads the same buckets and
//! adds, per bucket, the rule it comes from, the capacity enforced here, the balance signed
//! (debt below zero) and what would decide a request of it now, in the order a decision takes
//! them: this replica's lease, its over-limit cache, the store, or, when the store cannot
//! answer, the limit's fallback. Nothing is spent, no lease is claimed, nothing is cached.
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
use crate::quota::{Op, OpKind, Outcome};
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

/// One bucket of a request explained (`POST /counters/explain`, module doc).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Explained {
    /// The bucket as the store holds it (its `remaining` and `reset_ms` are 0 when the store
    /// could not be read: see `read`).
    #[serde(flatten)]
    pub bucket: BucketView,
    /// Whether the store answered the read.
    pub read: bool,
    /// What is left, signed: below zero, the debt (a token bucket's balance, a window's count
    /// past its limit). `None` when the store could not be read.
    pub balance: Option<i64>,
    /// What this replica enforces: the burst (a window's limit), at this region's share of a
    /// global limit, a sharded limit's shards added up; while the `local` fallback decides,
    /// this replica's share of it (÷ live replicas).
    pub capacity_here: u64,
    /// A `global: true` limit's region: the share held here, the floor, and whether this
    /// replica is cut off from the global store.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<RegionView>,
    pub rule: RuleView,
    pub decided_by: DecidedBy,
}

/// Where a limit comes from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RuleView {
    /// The file and line that declare it (`rules.yaml:12`; `xds:<config name>:…` over xDS).
    pub origin: String,
    /// Its rule's path, one segment per level (`tenant_acme.endpoint`).
    pub path: String,
    /// `shadow_mode: true`: counted, never refused.
    pub shadow_mode: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replaces: Vec<String>,
}

/// A global limit's share in this region.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RegionView {
    pub share: f64,
    pub floor: f64,
    pub partitioned: bool,
}

/// What would decide a request of a bucket now, the first of a decision's steps that answers.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum DecidedBy {
    /// This replica's over-limit cache refuses it without asking the store, for `retry_ms`.
    OverLimitCache { retry_ms: u64 },
    /// This replica's lease holds `tokens` of it: a request spends them here.
    Lease { tokens: u64 },
    /// The store, on the shared bucket.
    Store,
    /// The store cannot answer (`why`); the limit's fallback decides, in `mode`.
    Fallback { mode: &'static str, why: String },
}

/// A token bucket's or a window's capacity, as enforced by an op of `kind`.
fn capacity_of(kind: &OpKind) -> u64 {
    match *kind {
        OpKind::TokenBucket { capacity, .. } => capacity,
        OpKind::FixedWindow { limit, .. }
        | OpKind::SlidingWindow { limit, .. }
        | OpKind::SlidingLog { limit, .. }
        | OpKind::CalendarWindow { limit, .. } => limit,
    }
}

/// A check's answer as a signed balance: what is left, or below zero the debt. A token
/// bucket's follows from how long it takes to be full again; a window's from the count it
/// found (debt included).
fn signed_balance(kind: &OpKind, o: &Outcome) -> i64 {
    let remaining = i64::try_from(o.remaining).unwrap_or(i64::MAX);
    match *kind {
        OpKind::TokenBucket {
            capacity,
            refill,
            window_ms,
        } if o.remaining == 0 && refill > 0 => {
            let tokens = capacity as f64 - o.reset_ms as f64 * refill as f64 / window_ms as f64;
            tokens.floor().min(0.0) as i64
        }
        OpKind::FixedWindow { limit, .. } | OpKind::CalendarWindow { limit, .. } => o
            .found
            .map_or(remaining, |found| limit as i64 - found as i64),
        _ => remaining,
    }
}

/// A counted limit's bucket: its keys (one, or one per shard) with each key's op kind.
struct Planned {
    descriptor: usize,
    limit: Arc<Limit>,
    /// The whole bucket's key (a sharded limit's: its shard part dropped).
    key: String,
    keys: Vec<(String, OpKind)>,
    /// A `global: true` limit's share here, in ppm, when regions are on.
    region_ppm: Option<u32>,
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
        let outcomes = self.read_planned(&planned).await?;
        Ok(planned
            .into_iter()
            .zip(outcomes)
            .filter_map(|(p, o)| self.view(p, &o))
            .collect())
    }

    /// One check (a cost of 0) per key of `planned`, straight from the store: each bucket's
    /// outcomes, one per key.
    async fn read_planned(&self, planned: &[Planned]) -> Result<Vec<Vec<Outcome>>, StoreError> {
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
        Ok(planned
            .iter()
            .map(|p| outcomes.by_ref().take(p.keys.len()).collect())
            .collect())
    }

    /// The view of bucket `p` from its keys' `outcomes` (none: the store was not read).
    fn view(&self, p: Planned, outcomes: &[Outcome]) -> Option<BucketView> {
        let rate = p.limit.rate?;
        let mut shards = Vec::new();
        let (mut remaining, mut reset_ms) = (0u64, 0u64);
        for ((key, _), o) in p.keys.iter().zip(outcomes) {
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
        Some(BucketView {
            descriptor: p.descriptor,
            class: p.limit.class.to_string(),
            name: p.limit.name.clone(),
            algorithm: rate.algorithm.name(),
            requests_per_unit: rate.requests_per_unit,
            unit: rate.unit.name(),
            unit_multiplier: rate.unit_multiplier,
            burst: (rate.algorithm == crate::rules::Algorithm::TokenBucket).then_some(rate.burst),
            calendar: rate.calendar.map(|c| c.to_string()),
            leased_here: self.leased_of(&p),
            key: p.key,
            remaining,
            reset_ms,
            shards,
        })
    }

    /// What this replica's lease holds of bucket `p` (of its shards: the most any holds).
    fn leased_of(&self, p: &Planned) -> u64 {
        p.keys
            .iter()
            .map(|(k, _)| self.hot.leased(k))
            .max()
            .unwrap_or(0)
    }

    /// The buckets `req` maps to, explained (module doc): read from the store now when it
    /// answers; when it does not, each says the fallback decides and why.
    pub async fn explain(&self, rules: &RuleSet, req: &Request<'_>) -> Vec<Explained> {
        let planned = self.buckets_of(rules, req);
        let read = self.read_planned(&planned).await;
        let mut out = Vec::with_capacity(planned.len());
        for (i, p) in planned.into_iter().enumerate() {
            let limit = p.limit.clone();
            let mut capacity_here: u64 = p.keys.iter().map(|(_, k)| capacity_of(k)).sum();
            let region = p
                .region_ppm
                .zip(self.regions())
                .map(|(ppm, shares)| RegionView {
                    share: f64::from(ppm) / 1e6,
                    floor: f64::from(shares.floor_ppm()) / 1e6,
                    partitioned: shares.partitioned(),
                });
            let cached = p
                .keys
                .iter()
                .filter_map(|(k, kind)| self.hot.cached_refusal(k, *kind))
                .max();
            let leased = self.leased_of(&p);
            let outcomes = read.as_ref().ok().and_then(|all| all.get(i)).cloned();
            // A decision spends a lease's tokens first, even while the cache holds a refusal
            // of a larger claim (`hot/mod.rs`, `look`).
            let decided_by = if leased > 0 {
                DecidedBy::Lease { tokens: leased }
            } else if let Some(retry_ms) = cached {
                DecidedBy::OverLimitCache { retry_ms }
            } else {
                match &read {
                    Ok(_) => DecidedBy::Store,
                    Err(e) => {
                        let mode = limit.fallback.unwrap_or(self.fallback_mode());
                        if mode == crate::rules::FallbackMode::Local {
                            // The local fallback holds this replica's share of the limit.
                            let n = self.replicas().count();
                            capacity_here = p
                                .keys
                                .iter()
                                .map(|(_, k)| {
                                    capacity_of(&crate::quota::share::fallback_part(*k, n))
                                })
                                .sum();
                        }
                        DecidedBy::Fallback {
                            mode: mode.name(),
                            why: e.to_string(),
                        }
                    }
                }
            };
            let balance = outcomes.as_ref().map(|o| {
                p.keys
                    .iter()
                    .zip(o)
                    .map(|((_, kind), o)| signed_balance(kind, o))
                    .sum()
            });
            let rule = RuleView {
                origin: limit.origin.to_string(),
                path: limit.stat_path.join("."),
                shadow_mode: limit.shadow_mode,
                replaces: limit.replaces.clone(),
            };
            let Some(bucket) = self.view(p, outcomes.as_deref().unwrap_or(&[])) else {
                continue;
            };
            out.push(Explained {
                bucket,
                read: read.is_ok(),
                balance,
                capacity_here,
                region,
                rule,
                decided_by,
            });
        }
        out
    }

    /// Resets the buckets `req` maps to    /// Resets the buckets `req` maps to: reads them (the answer: what was reset), deletes
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
                let mut whole = OpKind::from(rate);
                // A global limit's bucket here is this region's share of it.
                let mut region_ppm = None;
                if let Some(shares) = self.regions().filter(|_| planned.limit.global) {
                    let (kind, ppm) = shares.peek(&op.key, whole);
                    (whole, region_ppm) = (kind, Some(ppm));
                }
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
                    region_ppm,
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
