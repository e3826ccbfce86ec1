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
    /// Envoy's per-descriptor `limit`: used instead of the rules' limit, as in the reference.
    pub limit_override: Option<LimitOverride>,
}

/// `RateLimitDescriptor.limit`: requests per unit supplied by Envoy's route config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitOverride {
    pub requests_per_unit: u32,
    pub unit: Unit,
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
    /// The algorithm of Envoy-supplied limit overrides.
    pub default_algorithm: Algorithm,
}

#[derive(Debug)]
pub struct Limiter {
    store: Store,
    config: LimiterConfig,
    metrics: Arc<Metrics>,
    /// Metric label values made once, so no decision allocates them.
    labels: FixedLabels,
}

#[derive(Debug)]
struct FixedLabels {
    unknown_domain: Arc<str>,
    no_class: Arc<str>,
    override_class: Arc<str>,
}

/// A counted limit of descriptor `desc` (an `Arc` clone: the rules' own, or an override).
struct Planned {
    desc: usize,
    limit: Arc<Limit>,
}

/// The metrics class of every Envoy-supplied limit override: one series, whatever the values.
pub const OVERRIDE_CLASS: &str = "envoy_override";

/// A limit from the request's `RateLimitDescriptor.limit`; its key path keeps its window, so
/// two overrides with different units never share a bucket.
fn override_limit(o: LimitOverride, algorithm: Algorithm, class: Arc<str>) -> Arc<Limit> {
    Arc::new(Limit {
        name: None,
        rate: Some(crate::rules::Rate {
            requests_per_unit: o.requests_per_unit,
            unit: o.unit,
            unit_multiplier: 1,
            burst: u64::from(o.requests_per_unit),
            algorithm,
        }),
        shadow_mode: false,
        detailed_metric: false,
        replaces: Vec::new(),
        class,
        // Its own bucket, apart from the rules' limits on the same entries (keys.rs).
        index: keys::OVERRIDE_INDEX,
        origin: crate::rules::model::Origin {
            file: "(request)".into(),
            line: 0,
        },
    })
}

/// The metrics `domain` of requests for a domain no rules file declares (one series for all
/// of them: request domains are caller input).
pub const UNKNOWN_DOMAIN: &str = "(unknown)";

impl Limiter {
    pub fn new(store: Store, config: LimiterConfig, metrics: Arc<Metrics>) -> Self {
        Limiter {
            store,
            config,
            metrics,
            labels: FixedLabels {
                unknown_domain: UNKNOWN_DOMAIN.into(),
                no_class: "".into(),
                override_class: OVERRIDE_CLASS.into(),
            },
        }
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
                self.count(
                    &self.labels.unknown_domain,
                    &self.labels.no_class,
                    telemetry::Outcome::no_rule,
                );
            }
            return Ok(Decision {
                overall: Code::Ok,
                statuses: vec![Status::no_limit(0); n],
            });
        };

        // 1. Match: the node of each descriptor (and which values share a bucket).
        let matches: Vec<Option<matcher::Match<'_>>> = req
            .descriptors
            .iter()
            .map(|d| matcher::find(domain, &d.entries))
            .collect();

        // 2. The limits of each descriptor: Envoy's override if the request carries one (as the
        //    reference: it replaces the rules' limit), else the matched ones minus those named
        //    by another matched limit's `replaces`.
        let replaced: Vec<&str> = matches
            .iter()
            .flatten()
            .flat_map(|m| m.node.limits.iter())
            .flat_map(|l| l.replaces.iter().map(String::as_str))
            .collect();
        let limits: Vec<Vec<Arc<Limit>>> = req
            .descriptors
            .iter()
            .zip(&matches)
            .map(|(d, m)| match (d.limit_override, m) {
                (Some(o), _) => vec![override_limit(
                    o,
                    self.config.default_algorithm,
                    self.labels.override_class.clone(),
                )],
                (None, Some(m)) => m
                    .node
                    .limits
                    .iter()
                    .filter(|l| {
                        !l.name
                            .as_deref()
                            .is_some_and(|name| replaced.contains(&name))
                    })
                    .cloned()
                    .collect(),
                (None, None) => Vec::new(),
            })
            .collect();

        // 3. Plan one op per counted limit.
        let mut planned: Vec<Planned> = Vec::new();
        let mut ops: Vec<Op> = Vec::new();
        for (i, desc) in req.descriptors.iter().enumerate() {
            let cost = desc.hits_addend.unwrap_or(if req.hits_addend == 0 {
                1
            } else {
                req.hits_addend
            });
            let shared = matches[i].as_ref().map_or(&[][..], |m| &m.shared[..]);
            for limit in &limits[i] {
                let Some(rate) = limit.rate else { continue };
                let entries = desc.entries.iter().enumerate().map(|(j, &(k, v))| {
                    let pattern = shared.iter().find(|(at, _)| *at == j).map(|(_, p)| *p);
                    (k, pattern.unwrap_or(v))
                });
                let key = keys::bucket_key(
                    &self.config.key_prefix,
                    req.domain,
                    entries,
                    &rate,
                    limit.index,
                    None,
                );
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
                    Algorithm::SlidingWindow => OpKind::SlidingWindow {
                        limit: u64::from(rate.requests_per_unit),
                        window_ms: rate.window_ms(),
                    },
                };
                planned.push(Planned {
                    desc: i,
                    limit: limit.clone(),
                });
                ops.push(Op { key, kind, cost });
            }
        }

        // 4. One store call for the whole request.
        let outcomes = if ops.is_empty() {
            Vec::new()
        } else {
            // The store counts its own failures (tollgate_store_errors_total).
            self.store.apply(&ops).await?
        };

        // 5. Statuses, in request order.
        let statuses: Vec<Status> = (0..n)
            .map(|i| {
                self.descriptor_status(
                    &domain.name,
                    i,
                    &limits[i],
                    &planned,
                    &outcomes,
                    &req.descriptors[i],
                )
            })
            .collect();
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
    /// over (the non-shadow one with the longest wait is reported), else the one with the
    /// least remaining.
    fn descriptor_status(
        &self,
        domain: &Arc<str>,
        desc: usize,
        limits: &[Arc<Limit>],
        planned: &[Planned],
        outcomes: &[Outcome],
        req: &RequestDescriptor<'_>,
    ) -> Status {
        if limits.is_empty() {
            self.count(domain, &self.labels.no_class, telemetry::Outcome::no_rule);
            return Status::no_limit(0);
        }
        let counted: Vec<(&Limit, &Outcome)> = planned
            .iter()
            .zip(outcomes)
            .filter(|(p, _)| p.desc == desc)
            .map(|(p, o)| (&*p.limit, o))
            .collect();
        if counted.is_empty() {
            // Only unlimited limits matched.
            for l in limits {
                self.count(domain, &class_of(l, req), telemetry::Outcome::unlimited);
            }
            return Status::no_limit(u32::MAX);
        }
        // Over: report the non-shadow limit that keeps the request out longest (a wait that
        // never ends first), so its reset and Retry-After are the ones that matter.
        let wait = |o: &Outcome| o.retry_ms.unwrap_or(u64::MAX);
        let (limit, outcome) = counted
            .iter()
            .filter(|(l, o)| !o.allowed && !l.shadow_mode)
            .max_by_key(|(_, o)| wait(o))
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
        let (requests_per_unit, unit) = limit
            .rate
            .map_or((0, Unit::Second), |r| (r.requests_per_unit, r.unit));
        Status {
            code: if hard_over { Code::OverLimit } else { Code::Ok },
            limit: Some(ReportedLimit {
                requests_per_unit,
                unit,
                name: limit.name.clone().unwrap_or_default(),
            }),
            remaining: u32::try_from(outcome.remaining).unwrap_or(u32::MAX),
            reset_ms: outcome.reset_ms,
            retry_ms: if over { outcome.retry_ms } else { None },
            shadow: over && !hard_over,
        }
    }

    fn count(&self, domain: &Arc<str>, class: &Arc<str>, outcome: telemetry::Outcome) {
        self.metrics
            .decisions
            .get_or_create(&DecisionLabels {
                domain: domain.clone(),
                class: class.clone(),
                outcome,
            })
            .inc();
    }
}

/// The metrics class of a limit; with `detailed_metric` the request's values are appended
/// (an explicit opt-in to one series per value).
fn class_of(limit: &Limit, req: &RequestDescriptor<'_>) -> Arc<str> {
    if !limit.detailed_metric {
        return limit.class.clone();
    }
    let mut class = limit.class.to_string();
    for (k, v) in &req.entries {
        class.push_str(&format!(".{k}_{v}"));
    }
    class.into()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::clock::Clock;
    use crate::rules::load::{LoadOptions, load_sources};
    use crate::store::MemoryStore;

    const RULES: &str = r#"
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tenant
    value: vip
    rate_limit: {unit: hour, requests_per_unit: 1, name: vip, replaces: [{name: plan}]}
  - key: plan
    rate_limit: {unit: hour, requests_per_unit: 1, name: plan}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: zero
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: both
    rate_limits:
      - {unit: second, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 2, name: sustained}
  - key: group
    value: "g-*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: window
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window}
  - key: slide
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_window}
"#;

    struct Fixture {
        rules: RuleSet,
        limiter: Limiter,
        metrics: Arc<Metrics>,
        clock: Clock,
    }

    fn fixture(shadow_mode: bool) -> Fixture {
        let rules = load_sources(
            &[(PathBuf::from("t.yaml"), RULES.to_string())],
            LoadOptions::default(),
        )
        .unwrap();
        let clock = Clock::manual(1_700_000_000_000);
        let metrics = Arc::new(Metrics::new());
        let limiter = Limiter::new(
            Store::Memory(MemoryStore::new(clock.clone())),
            LimiterConfig {
                key_prefix: "t:".into(),
                shadow_mode,
                default_algorithm: Algorithm::TokenBucket,
            },
            metrics.clone(),
        );
        Fixture {
            rules,
            limiter,
            metrics,
            clock,
        }
    }

    fn req<'a>(domain: &'a str, descs: &[&[(&'a str, &'a str)]]) -> Request<'a> {
        Request {
            domain,
            descriptors: descs
                .iter()
                .map(|e| RequestDescriptor {
                    entries: e.to_vec(),
                    hits_addend: None,
                    limit_override: None,
                })
                .collect(),
            hits_addend: 0,
        }
    }

    impl Fixture {
        fn decide(&self, r: &Request<'_>) -> Decision {
            tokio_test_block_on(self.limiter.decide(&self.rules, r)).unwrap()
        }
        fn codes(&self, r: &Request<'_>) -> Vec<Code> {
            self.decide(r).statuses.iter().map(|s| s.code).collect()
        }
    }

    /// Runs a future to completion on a fresh current-thread runtime.
    fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn counts_down_then_over_limit_and_keys_are_per_value() {
        let f = fixture(false);
        let a = req("edge", &[&[("tenant", "a")]]);
        let d = f.decide(&a);
        assert_eq!(d.overall, Code::Ok);
        let s = &d.statuses[0];
        assert_eq!(s.remaining, 1);
        assert_eq!(
            s.limit.as_ref().map(|l| (l.requests_per_unit, l.unit)),
            Some((2, Unit::Hour))
        );
        assert_eq!(
            s.reset_ms, 1_800_000,
            "one token of 2/hour refills in 30 min"
        );
        f.decide(&a);
        let d = f.decide(&a);
        assert_eq!(
            (d.overall, d.statuses[0].code),
            (Code::OverLimit, Code::OverLimit)
        );
        assert_eq!(d.statuses[0].retry_ms, Some(1_800_000));
        assert_eq!(
            f.decide(&req("edge", &[&[("tenant", "b")]])).overall,
            Code::Ok
        );
        let text = f.metrics.render();
        assert!(
            text.contains(
                r#"tollgate_decisions_total{domain="edge",class="tenant",outcome="over_limit"} 1"#
            ),
            "{text}"
        );
        assert!(
            !text.contains("class=\"a\""),
            "raw values never become labels"
        );
    }

    #[test]
    fn unknown_domain_and_no_rule_are_ok_without_a_limit() {
        let f = fixture(false);
        let d = f.decide(&req("nope", &[&[("tenant", "a")]]));
        assert_eq!(d.statuses, vec![Status::no_limit(0)]);
        let d = f.decide(&req(
            "edge",
            &[&[("nobody", "x")], &[("tenant", "a"), ("deeper", "x")]],
        ));
        assert!(
            d.statuses
                .iter()
                .all(|s| s.code == Code::Ok && s.limit.is_none())
        );
        assert!(
            f.metrics
                .render()
                .contains(r#"domain="(unknown)",class="",outcome="no_rule""#)
        );
    }

    #[test]
    fn unlimited_reports_max_remaining() {
        let f = fixture(false);
        let d = f.decide(&req("edge", &[&[("free", "x")]]));
        assert_eq!(
            (d.statuses[0].remaining, d.statuses[0].limit.is_none()),
            (u32::MAX, true)
        );
    }

    #[test]
    fn every_descriptor_is_charged_and_any_over_makes_the_request_over() {
        let f = fixture(false);
        let r = req("edge", &[&[("zero", "x")], &[("tenant", "c")]]);
        assert_eq!(f.codes(&r), [Code::OverLimit, Code::Ok]);
        assert_eq!(f.decide(&r).overall, Code::OverLimit);
        // tenant c was charged both times although the request was over: the third is over.
        assert_eq!(f.codes(&r), [Code::OverLimit, Code::OverLimit]);
        let zero = &f.decide(&r).statuses[0];
        assert_eq!(
            (zero.remaining, zero.retry_ms),
            (0, None),
            "0/s never admits, never waits"
        );
    }

    #[test]
    fn hits_addend_request_and_descriptor_level() {
        let f = fixture(false);
        let mut r = req("edge", &[&[("tenant", "h")]]);
        r.hits_addend = 2;
        assert_eq!(
            f.decide(&r).statuses[0].remaining,
            0,
            "request-level 2 spends both"
        );
        let mut check = req("edge", &[&[("tenant", "h2")]]);
        check.descriptors[0].hits_addend = Some(0);
        check.hits_addend = 5;
        for _ in 0..3 {
            let s = &f.decide(&check).statuses[0];
            assert_eq!(
                (s.code, s.remaining),
                (Code::Ok, 2),
                "descriptor-level 0 only checks"
            );
        }
        let mut big = req("edge", &[&[("tenant", "h3")]]);
        big.descriptors[0].hits_addend = Some(u64::MAX);
        let s = &f.decide(&big).statuses[0];
        assert_eq!(
            (s.code, s.retry_ms),
            (Code::OverLimit, None),
            "above capacity never fits"
        );
        assert_eq!(
            f.decide(&req("edge", &[&[("tenant", "h3")]])).statuses[0].remaining,
            1,
            "nothing was taken"
        );
    }

    #[test]
    fn rule_shadow_mode_reports_ok_and_counts_shadow() {
        let f = fixture(false);
        let r = req("edge", &[&[("shadowed", "s")]]);
        f.decide(&r);
        let d = f.decide(&r);
        assert_eq!(
            (d.overall, d.statuses[0].code, d.statuses[0].shadow),
            (Code::Ok, Code::Ok, true)
        );
        assert!(
            f.metrics
                .render()
                .contains(r#"class="shadowed",outcome="shadow"} 1"#)
        );
    }

    #[test]
    fn global_shadow_mode_only_changes_the_overall_code() {
        let f = fixture(true);
        let r = req("edge", &[&[("zero", "x")]]);
        let d = f.decide(&r);
        assert_eq!((d.overall, d.statuses[0].code), (Code::Ok, Code::OverLimit));
        assert!(
            f.metrics
                .render()
                .contains("tollgate_global_shadow_total 1")
        );
    }

    #[test]
    fn replaces_drops_the_named_limit() {
        let f = fixture(false);
        // plan alone is limited to 1/hour.
        let plan = req("edge", &[&[("plan", "p")]]);
        f.decide(&plan);
        assert_eq!(f.codes(&plan), [Code::OverLimit]);
        // With vip matched too, vip replaces plan: plan's descriptor reports no limit.
        let both = req("edge", &[&[("tenant", "vip")], &[("plan", "p")]]);
        let d = f.decide(&both);
        assert_eq!(d.statuses[1], Status::no_limit(0));
        assert_eq!(d.statuses[0].limit.as_ref().unwrap().name, "vip");
    }

    #[test]
    fn several_limits_on_one_key_report_the_most_constrained() {
        let f = fixture(false);
        let r = req("edge", &[&[("both", "x")]]);
        let s = &f.decide(&r).statuses[0];
        assert_eq!(
            (s.remaining, s.limit.as_ref().unwrap().name.as_str()),
            (1, "sustained")
        );
        f.decide(&r);
        let s = &f.decide(&r).statuses[0];
        assert_eq!(
            (s.code, s.limit.as_ref().unwrap().unit),
            (Code::OverLimit, Unit::Hour)
        );
        // The per-second bucket was charged only while the request was admitted... and both are
        // separate buckets: a second later the hourly one is still over.
        f.clock.advance_ms(1000);
        assert_eq!(f.codes(&r), [Code::OverLimit]);
    }

    #[test]
    fn share_threshold_values_share_one_bucket() {
        let f = fixture(false);
        assert_eq!(f.codes(&req("edge", &[&[("group", "g-1")]])), [Code::Ok]);
        assert_eq!(
            f.codes(&req("edge", &[&[("group", "g-2")]])),
            [Code::OverLimit]
        );
    }

    #[test]
    fn fixed_window_resets_at_the_window_edge() {
        let f = fixture(false);
        let r = req("edge", &[&[("window", "w")]]);
        assert_eq!(
            f.decide(&r).statuses[0].reset_ms,
            40_000,
            "1.7e12 ms is 20 s into a minute"
        );
        f.decide(&r);
        assert_eq!(f.codes(&r), [Code::OverLimit]);
        f.clock.advance_ms(40_000);
        assert_eq!(f.codes(&r), [Code::Ok]);
    }

    #[test]
    fn sliding_window_weighs_the_previous_minute() {
        let f = fixture(false);
        let r = req("edge", &[&[("slide", "s")]]);
        assert_eq!(f.codes(&r), [Code::Ok]);
        assert_eq!(f.codes(&r), [Code::Ok]);
        let over = f.decide(&r).statuses[0].clone();
        assert_eq!(over.code, Code::OverLimit);
        // 1.7e12 ms is 20 s into a minute: one of the 2 frees 30 s into the next minute.
        assert_eq!((over.retry_ms, over.reset_ms), (Some(70_000), 100_000));
        // At the edge, unlike the fixed window, the previous minute still counts in full.
        f.clock.advance_ms(40_000);
        assert_eq!(f.codes(&r), [Code::OverLimit]);
        f.clock.advance_ms(30_000);
        assert_eq!(f.codes(&r), [Code::Ok]);
    }

    #[test]
    fn envoy_limit_override_replaces_the_rule_and_keeps_one_metric_class() {
        let f = fixture(false);
        let mut r = req("edge", &[&[("tenant", "o")]]);
        r.descriptors[0].limit_override = Some(LimitOverride {
            requests_per_unit: 1,
            unit: Unit::Day,
        });
        let s = &f.decide(&r).statuses[0];
        assert_eq!(
            s.limit.as_ref().map(|l| (l.requests_per_unit, l.unit)),
            Some((1, Unit::Day))
        );
        assert_eq!(f.codes(&r), [Code::OverLimit]);
        // The rules' own bucket for tenant o is untouched.
        let plain = &f.decide(&req("edge", &[&[("tenant", "o")]])).statuses[0];
        assert_eq!(plain.remaining, 1);
        // Overrides also apply where no rule matches, as in the reference.
        let mut r = req("edge", &[&[("nobody", "x")]]);
        r.descriptors[0].limit_override = Some(LimitOverride {
            requests_per_unit: 5,
            unit: Unit::Second,
        });
        assert_eq!(f.decide(&r).statuses[0].remaining, 4);
        assert!(
            f.metrics
                .render()
                .contains(r#"class="envoy_override",outcome="ok"} 2"#)
        );
    }

    #[test]
    fn when_several_limits_are_over_the_longest_wait_is_reported() {
        let f = fixture(false);
        let r = req("edge", &[&[("both", "w")]]);
        // 5/s and 2/hour on one key: after six requests in the same instant both are over.
        for _ in 0..5 {
            f.decide(&r);
        }
        let s = &f.decide(&r).statuses[0];
        assert_eq!(s.code, Code::OverLimit);
        assert_eq!(
            s.limit.as_ref().map(|l| l.unit),
            Some(Unit::Hour),
            "not the 5/s one"
        );
        assert_eq!(s.retry_ms, Some(1_800_000), "one of 2/hour, not 200 ms");
    }
}
