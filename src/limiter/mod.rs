//! The decision for one request: descriptors → matched limits → store ops → statuses.
//!
//! For each descriptor the rules give zero or more limits (`rules::matcher`); limits named in
//! another matched limit's `replaces` are dropped; every remaining counted limit becomes one
//! store [`Op`] with its key (`keys.rs`) and cost. All ops of a request go to the store in one
//! call, and every descriptor is charged, as in envoyproxy/ratelimit. The answers become one
//! [`Status`] per descriptor, in request order, and an overall code.

pub mod bucket;

use std::sync::Arc;

use crate::keys;
use crate::rules::matcher;
use crate::rules::{Algorithm, Limit, RuleSet, Unit};
use crate::store::{Op, OpKind, Outcome, Store, StoreError};
use crate::telemetry::{self, DecisionLabels, Metrics};

/// One request, already validated by the service layer; borrows the caller's strings.
#[derive(Clone, Debug, Default)]
pub struct Request<'a> {
    pub domain: &'a str,
    pub descriptors: Vec<RequestDescriptor<'a>>,
    /// Request-level cost; 0 means 1.
    pub hits_addend: u64,
}

#[derive(Clone, Debug, Default)]
pub struct RequestDescriptor<'a> {
    pub entries: Vec<(&'a str, &'a str)>,
    /// Descriptor-level cost; overrides the request's. `Some(0)` checks without consuming.
    pub hits_addend: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
}

/// The limit a status reports (`current_limit` in the response).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportedLimit {
    pub requests_per_unit: u32,
    pub unit: Unit,
    pub name: String,
}

/// The answer for one descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    /// `None` for no rule and for unlimited.
    pub limit: Option<ReportedLimit>,
    pub remaining: u32,
    /// Milliseconds until the bucket is full again / the window ends (0 without a limit).
    pub reset_ms: u64,
    /// Over the limit: milliseconds until the cost would fit, if it ever can.
    pub retry_ms: Option<u64>,
    /// Over a limit in shadow mode (reported as OK).
    pub shadow: bool,
}

impl Status {
    fn no_limit(remaining: u32) -> Self {
        Status {
            code: Code::Ok,
            limit: None,
            remaining,
            reset_ms: 0,
            retry_ms: None,
            shadow: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub overall: Code,
    pub statuses: Vec<Status>,
}

/// Settings the decision loop needs.
#[derive(Clone, Debug)]
pub struct LimiterConfig {
    pub key_prefix: String,
    /// Global shadow mode: the overall code is always OK (statuses stay as decided).
    pub shadow_mode: bool,
}

#[derive(Debug)]
pub struct Limiter {
    store: Store,
    config: LimiterConfig,
    metrics: Arc<Metrics>,
}

/// A counted limit matched by descriptor `desc`.
struct Planned<'r> {
    desc: usize,
    limit: &'r Limit,
}

const UNKNOWN_DOMAIN: &str = "(unknown)";

impl Limiter {
    pub fn new(store: Store, config: LimiterConfig, metrics: Arc<Metrics>) -> Self {
        Limiter { store, config, metrics }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Decides `req` against `rules`. A store failure fails the whole request (the caller maps
    /// it to gRPC UNAVAILABLE so Envoy's failure mode applies).
    pub async fn decide(&self, rules: &RuleSet, req: &Request<'_>) -> Result<Decision, StoreError> {
        let n = req.descriptors.len();
        let Some(domain) = rules.domains.get(req.domain) else {
            for _ in 0..n {
                self.count(UNKNOWN_DOMAIN, "", telemetry::Outcome::no_rule);
            }
            return Ok(Decision {
                overall: Code::Ok,
                statuses: vec![Status::no_limit(0); n],
            });
        };

        // 1. Match: the limits of each descriptor (and the entries' key values).
        let matches: Vec<Option<matcher::Match<'_>>> =
            req.descriptors.iter().map(|d| matcher::find(domain, &d.entries)).collect();

        // 2. `replaces`: a matched limit named by another matched limit's `replaces` is dropped.
        let replaced: Vec<&str> = matches
            .iter()
            .flatten()
            .flat_map(|m| m.node.limits.iter())
            .flat_map(|l| l.replaces.iter().map(String::as_str))
            .collect();
        let is_replaced = |l: &Limit| l.name.as_deref().is_some_and(|name| replaced.contains(&name));

        // 3. Plan one op per counted limit.
        let mut planned: Vec<Planned<'_>> = Vec::new();
        let mut ops: Vec<Op> = Vec::new();
        for (i, m) in matches.iter().enumerate() {
            let Some(m) = m else { continue };
            let desc = &req.descriptors[i];
            let cost = desc
                .hits_addend
                .unwrap_or(if req.hits_addend == 0 { 1 } else { req.hits_addend });
            for limit in m.node.limits.iter().filter(|l| !is_replaced(l)) {
                let Some(rate) = limit.rate else { continue };
                let entries = desc.entries.iter().enumerate().map(|(j, &(k, v))| {
                    let shared = m.shared.iter().find(|(at, _)| *at == j).map(|(_, p)| *p);
                    (k, shared.unwrap_or(v))
                });
                let key = keys::bucket_key(&self.config.key_prefix, req.domain, entries, &rate, limit.index, None);
                let kind = match rate.algorithm {
                    Algorithm::TokenBucket => OpKind::TokenBucket {
                        capacity: rate.burst,
                        refill: u64::from(rate.requests_per_unit),
                        window_ms: rate.window_ms(),
                    },
                    Algorithm::FixedWindow => OpKind::FixedWindow {
                        limit: u64::from(rate.requests_per_unit),
                        window_ms: rate.window_ms(),
                    },
                };
                planned.push(Planned { desc: i, limit });
                ops.push(Op { key, kind, cost });
            }
        }

        // 4. One store call for the whole request.
        let outcomes = if ops.is_empty() {
            Vec::new()
        } else {
            self.store.apply(&ops).await.inspect_err(|e| {
                self.metrics
                    .store_errors
                    .get_or_create(&telemetry::KindLabels { kind: e.kind })
                    .inc();
            })?
        };

        // 5. Statuses, in request order.
        let mut statuses = Vec::with_capacity(n);
        for (i, m) in matches.iter().enumerate() {
            let status = match m {
                None => {
                    self.count(&domain.name, "", telemetry::Outcome::no_rule);
                    Status::no_limit(0)
                }
                Some(m) => {
                    let limits: Vec<&Limit> =
                        m.node.limits.iter().map(|l| &**l).filter(|l| !is_replaced(l)).collect();
                    self.descriptor_status(&domain.name, i, &limits, &planned, &outcomes, &req.descriptors[i])
                }
            };
            statuses.push(status);
        }
        let over = statuses.iter().any(|s| s.code == Code::OverLimit);
        let overall = if over && self.config.shadow_mode {
            self.metrics.global_shadow.inc();
            Code::Ok
        } else if over {
            Code::OverLimit
        } else {
            Code::Ok
        };
        Ok(Decision { overall, statuses })
    }

    /// Folds the outcomes of one descriptor's limits into its status: over if any limit is
    /// over (the first such one is reported, non-shadow first), else the one with the least
    /// remaining.
    fn descriptor_status(
        &self,
        domain: &str,
        desc: usize,
        limits: &[&Limit],
        planned: &[Planned<'_>],
        outcomes: &[Outcome],
        req: &RequestDescriptor<'_>,
    ) -> Status {
        if limits.is_empty() {
            self.count(domain, "", telemetry::Outcome::no_rule);
            return Status::no_limit(0);
        }
        let counted: Vec<(&Limit, &Outcome)> = planned
            .iter()
            .zip(outcomes)
            .filter(|(p, _)| p.desc == desc)
            .map(|(p, o)| (p.limit, o))
            .collect();
        if counted.is_empty() {
            // Only unlimited limits matched.
            for l in limits {
                self.count(domain, &class_of(l, req), telemetry::Outcome::unlimited);
            }
            return Status::no_limit(u32::MAX);
        }
        let (limit, outcome) = counted
            .iter()
            .find(|(l, o)| !o.allowed && !l.shadow_mode)
            .or_else(|| counted.iter().find(|(_, o)| !o.allowed))
            .or_else(|| counted.iter().min_by_key(|(_, o)| o.remaining))
            .copied()
            .unwrap_or(counted[0]);
        for (l, o) in &counted {
            let outcome = match (o.allowed, l.shadow_mode) {
                (true, _) => telemetry::Outcome::ok,
                (false, false) => telemetry::Outcome::over_limit,
                (false, true) => telemetry::Outcome::shadow,
            };
            self.count(domain, &class_of(l, req), outcome);
        }
        let over = !outcome.allowed;
        // A shadow limit that is over reports OK; a non-shadow over limit elsewhere on the
        // same descriptor still makes it OVER_LIMIT.
        let hard_over = counted.iter().any(|(l, o)| !o.allowed && !l.shadow_mode);
        let rate = limit.rate.unwrap_or(crate::rules::Rate {
            requests_per_unit: 0,
            unit: Unit::Second,
            unit_multiplier: 1,
            burst: 0,
            algorithm: Algorithm::TokenBucket,
        });
        Status {
            code: if hard_over { Code::OverLimit } else { Code::Ok },
            limit: Some(ReportedLimit {
                requests_per_unit: rate.requests_per_unit,
                unit: rate.unit,
                name: limit.name.clone().unwrap_or_default(),
            }),
            remaining: u32::try_from(outcome.remaining).unwrap_or(u32::MAX),
            reset_ms: outcome.reset_ms,
            retry_ms: if over { outcome.retry_ms } else { None },
            shadow: over && !hard_over,
        }
    }

    fn count(&self, domain: &str, class: &str, outcome: telemetry::Outcome) {
        self.metrics
            .decisions
            .get_or_create(&DecisionLabels {
                domain: domain.to_string(),
                class: class.to_string(),
                outcome,
            })
            .inc();
    }
}

/// The metrics class of a limit; with `detailed_metric` the request's values are appended
/// (an explicit opt-in to one series per value).
fn class_of(limit: &Limit, req: &RequestDescriptor<'_>) -> String {
    if !limit.detailed_metric {
        return limit.class.clone();
    }
    let mut class = limit.class.clone();
    for (k, v) in &req.entries {
        class.push_str(&format!(".{k}_{v}"));
    }
    class
}
