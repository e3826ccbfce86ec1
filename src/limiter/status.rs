//! Folding the store's answers into the response: one [`Status`] per descriptor, in request
//! order, and the overall [`Code`]; each descriptor's decision is counted in the metrics on
//! the way (`tollgate_decisions_total` by domain, class and outcome).
//!
//! Data in: the [`Plan`] (each descriptor's limits, and which descriptor and limit each op
//! counts) and the store's outcomes, one per op in op order. Per descriptor:
//! - no limit (no rule matched, or all were replaced): OK without a limit, `no_rule`;
//! - only unlimited limits: OK with `u32::MAX` remaining, `unlimited`;
//! - otherwise: OVER_LIMIT if any non-shadow limit is over, reporting the over limit with the
//!   longest wait (its reset and Retry-After are the ones that matter); else the limit with
//!   the least remaining. A shadow-mode limit that is over reports OK, flagged `shadow`.
//!   A descriptor over quota-mode limits only reports OVER_LIMIT, flagged `quota_mode`.
//!
//! Overall, as envoyproxy/ratelimit decides it: OVER_LIMIT if a limit without quota mode is
//! over, or if the request has quota-mode limits and every one of them is over (under global
//! quota mode a descriptor without a rule counts as one that is not); shadow-mode limits are
//! never over. Global shadow mode then turns OVER_LIMIT into OK (counted in
//! `tollgate_global_shadow_total`). Without quota mode anywhere: OVER_LIMIT if any
//! descriptor is.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;

use super::plan::{Plan, Planned};
use super::{Code, Decision, ReportedLimit, Request, RequestDescriptor, Source, Status};
use crate::quota::Outcome;
use crate::rules::{Limit, Unit};
use crate::telemetry::{self, DecisionLabels, Hits, Metrics, Split};

/// The metrics `domain` of requests for a domain no rules file declares (one series for all
/// of them: request domains are caller input).
pub const UNKNOWN_DOMAIN: &str = "(unknown)";

/// Distinct unknown domain names counted and shown by name; past it they count as `(other)`
/// (the names are caller input: a bound on series and on memory).
pub const UNKNOWN_DOMAIN_NAMES: usize = 100;
/// Longest unknown domain name kept as given; a longer one is cut (and marked `…`).
const UNKNOWN_DOMAIN_MAX_LEN: usize = 64;

impl Status {
    /// OK without a limit: no rule (`remaining` 0) or unlimited (`u32::MAX`).
    pub(super) fn no_limit(remaining: u32) -> Self {
        Status {
            code: Code::Ok,
            limit: None,
            remaining,
            reset_ms: 0,
            retry_ms: None,
            shadow: false,
            quota_mode: false,
            metadata: None,
            receipt: None,
        }
    }
}

/// The global modes the fold applies (the `shadow_mode` and `quota_mode` settings).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Modes {
    pub(super) shadow: bool,
    pub(super) quota: bool,
}

impl Decision {
    /// The answer for a domain without rules: every descriptor OK, no limit.
    pub(super) fn without_limits(descriptors: usize) -> Self {
        Decision {
            overall: Code::Ok,
            statuses: vec![Status::no_limit(0); descriptors],
            from_fallback: false,
        }
    }
}

/// Counts decisions and store errors. The fixed label values are made once, so counting a
/// decision clones an `Arc` instead of allocating a string.
#[derive(Debug)]
pub(super) struct Tally {
    metrics: Arc<Metrics>,
    /// An admitted decision past this share of its limit is `near_limit` (1: never).
    near_limit_ratio: f64,
    unknown_domain: Arc<str>,
    no_class: Arc<str>,
    /// `detailed_metric` classes seen, per limit class: at most `detailed_max` each, then the
    /// limit's one overflow series (request values are caller input: a bound on series).
    detailed: Mutex<HashMap<Arc<str>, Detailed>>,
    detailed_max: usize,
    /// Unknown domain names seen (at most [`UNKNOWN_DOMAIN_NAMES`]), each logged once.
    unknown_names: Mutex<HashSet<Arc<str>>>,
}

#[derive(Debug)]
struct Detailed {
    seen: HashSet<Arc<str>>,
    overflow: Arc<str>,
}

impl Tally {
    pub(super) fn new(metrics: Arc<Metrics>, near_limit_ratio: f64, detailed_max: usize) -> Self {
        Tally {
            metrics,
            near_limit_ratio,
            unknown_domain: UNKNOWN_DOMAIN.into(),
            no_class: "".into(),
            detailed: Mutex::new(HashMap::new()),
            detailed_max,
            unknown_names: Mutex::new(HashSet::new()),
        }
    }

    /// The unknown domain names seen so far (at most [`UNKNOWN_DOMAIN_NAMES`]), sorted.
    pub(super) fn unknown_domains(&self) -> Vec<String> {
        let names = self.unknown_names.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        out.sort();
        out
    }

    /// Counts a request for the unknown `domain` by name; logs each new name once.
    fn unknown_name(&self, domain: &str) {
        let name: Arc<str> = if domain.len() > UNKNOWN_DOMAIN_MAX_LEN {
            let mut end = UNKNOWN_DOMAIN_MAX_LEN;
            while !domain.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}…", &domain[..end]).into()
        } else {
            domain.into()
        };
        let label = {
            let mut names = self.unknown_names.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(known) = names.get(&name) {
                known.clone()
            } else if names.len() < UNKNOWN_DOMAIN_NAMES {
                names.insert(name.clone());
                tracing::warn!(domain = %name, "a request named a domain no rules file declares (its descriptors are not limited); check Envoy's domain against the rules' (case and spelling)");
                name
            } else {
                "(other)".into()
            }
        };
        self.metrics.statsd.domain_not_found(&label);
        self.metrics
            .unknown_domains
            .get_or_create(&telemetry::DomainLabels { domain: label })
            .inc();
    }

    /// The metrics class of a limit; with `detailed_metric` the request's values are appended
    /// (an explicit opt-in to one series per value), with `value_to_metric` those of the
    /// entries `metric_values` names (matched through such a node), up to `detailed_max`
    /// series per limit, past which every new value counts as `<class>.(overflow)`; and
    /// whether it is that overflow.
    fn class_of(
        &self,
        limit: &Limit,
        req: &RequestDescriptor<'_>,
        metric_values: &[usize],
    ) -> (Arc<str>, bool) {
        if !limit.detailed_metric && metric_values.is_empty() {
            return (limit.class.clone(), false);
        }
        let mut class = limit.class.to_string();
        for (i, (k, v)) in req.entries.iter().enumerate() {
            if limit.detailed_metric || metric_values.contains(&i) {
                class.push_str(&format!(".{k}_{v}"));
            }
        }
        let mut detailed = self.detailed.lock().unwrap_or_else(|p| p.into_inner());
        let d = detailed
            .entry(limit.class.clone())
            .or_insert_with(|| Detailed {
                seen: HashSet::new(),
                overflow: format!("{}.(overflow)", limit.class).into(),
            });
        if let Some(seen) = d.seen.get(class.as_str()) {
            return (seen.clone(), false);
        }
        if d.seen.len() >= self.detailed_max {
            return (d.overflow.clone(), true);
        }
        let class: Arc<str> = class.into();
        d.seen.insert(class.clone());
        (class, false)
    }

    /// Counts one limit's decision: in `tollgate_decisions_total` by its class, and, with
    /// statsd on, its hits under the reference's path, split as the reference splits them
    /// (`telemetry/statsd/`): `remaining` is what the store reported after the decision.
    #[allow(clippy::too_many_arguments)]
    fn count_limit(
        &self,
        domain: &Arc<str>,
        limit: &Limit,
        req: &RequestDescriptor<'_>,
        metric_values: &[usize],
        outcome: telemetry::Outcome,
        hits: u64,
        remaining: u64,
        found: Option<u64>,
    ) {
        let (class, overflow) = self.class_of(limit, req, metric_values);
        let make = || self.series(domain, &class, outcome);
        // The limit's own class: its series, kept with it (`DecisionSeries`).
        match Arc::ptr_eq(&class, &limit.class)
            .then(|| limit.decisions.get(domain, outcome, make))
            .flatten()
        {
            Some(series) => {
                series.inc();
            }
            None => self.count(domain, &class, outcome),
        }
        let statsd = &self.metrics.statsd;
        if !statsd.enabled() {
            return;
        }
        let capacity = limit.rate.map_or(0, |r| r.burst);
        let counts = |before: u64| Hits {
            limit: capacity,
            near_threshold: (capacity as f64 * self.near_limit_ratio).floor() as u64,
            before,
            hits,
        };
        let used = capacity.saturating_sub(remaining);
        let split = match outcome {
            telemetry::Outcome::ok | telemetry::Outcome::near_limit => {
                Split::admitted(counts(used.saturating_sub(hits)))
            }
            // A refused take of a token bucket or a sliding window charged nothing: what is used
            // is the count it found (capacity − remaining). A fixed window's refused take counts
            // up to the limit and reports none left, so it says the count it found (`found`):
            // split from there as the reference's `base_limiter.go` splits it.
            telemetry::Outcome::over_limit => Split::refused(counts(found.unwrap_or(used)), false),
            telemetry::Outcome::shadow => Split::refused(counts(found.unwrap_or(used)), true),
            // Decided without the store's count.
            telemetry::Outcome::fallback_ok => Split::whole(hits, true),
            telemetry::Outcome::fallback_over_limit => Split::whole(hits, false),
            // The reference keeps no counters for unlimited limits; a refund is no hit.
            telemetry::Outcome::unlimited
            | telemetry::Outcome::no_rule
            | telemetry::Outcome::refund => return,
        };
        statsd.add(
            domain,
            &stat_path(limit, req, metric_values, overflow),
            hits,
            split,
        );
    }

    /// A request for a domain no rules file declares: counted by its name, and each
    /// descriptor is a `no_rule`.
    pub(super) fn unknown_domain(&self, domain: &str, descriptors: usize) {
        self.unknown_name(domain);
        for _ in 0..descriptors {
            self.count(
                &self.unknown_domain,
                &self.no_class,
                telemetry::Outcome::no_rule,
            );
        }
    }

    /// `near_limit` when the hits after this one pass ⌊capacity × ratio⌋ (the rule
    /// envoyproxy/ratelimit applies to its `near_limit` counter), else `ok`.
    fn admitted(&self, capacity: u64, remaining: u64) -> telemetry::Outcome {
        let threshold = (capacity as f64 * self.near_limit_ratio).floor();
        if capacity > 0 && capacity.saturating_sub(remaining) as f64 > threshold {
            telemetry::Outcome::near_limit
        } else {
            telemetry::Outcome::ok
        }
    }

    fn count(&self, domain: &Arc<str>, class: &Arc<str>, outcome: telemetry::Outcome) {
        self.series(domain, class, outcome).inc();
    }

    /// The `tollgate_decisions_total` series of `domain`, `class` and `outcome`, from the family.
    fn series(&self, domain: &Arc<str>, class: &Arc<str>, outcome: telemetry::Outcome) -> Counter {
        self.metrics
            .decisions
            .get_or_create(&DecisionLabels {
                domain: domain.clone(),
                class: class.clone(),
                outcome,
            })
            .clone()
    }
}

/// A limit's statsd path, as the reference names it: the rule's own (`key` or `key_value` per
/// level); with `detailed_metric` every entry of the request as `key_value`; with
/// `value_to_metric` the request's value in place at the levels `metric_values` names. Past
/// the series bound (`overflow`), the rule's path and `(overflow)`.
fn stat_path(
    limit: &Limit,
    req: &RequestDescriptor<'_>,
    metric_values: &[usize],
    overflow: bool,
) -> Arc<[String]> {
    if overflow {
        let mut path = limit.stat_path.to_vec();
        path.push("(overflow)".to_string());
        return path.into();
    }
    if limit.detailed_metric {
        return req
            .entries
            .iter()
            .map(|(k, v)| format!("{k}_{v}"))
            .collect();
    }
    if metric_values.is_empty() {
        return limit.stat_path.clone();
    }
    limit
        .stat_path
        .iter()
        .zip(&req.entries)
        .enumerate()
        .map(|(i, (rule, (k, v)))| {
            if metric_values.contains(&i) {
                format!("{k}_{v}")
            } else {
                rule.clone()
            }
        })
        .collect()
}

/// Folds `outcomes` (one per op of `plan`, in order) into the decision for `req`.
pub(super) fn fold(
    domain: &Arc<str>,
    req: &Request<'_>,
    plan: &Plan,
    outcomes: &[Outcome],
    sources: &[Source],
    modes: Modes,
    tally: &Tally,
) -> Decision {
    let statuses: Vec<Status> = req
        .descriptors
        .iter()
        .zip(&plan.limits)
        .enumerate()
        .map(|(i, (desc, limits))| {
            // Values a share_threshold wildcard folded are counted under its pattern.
            let folded;
            let desc = match plan.shared.iter().find(|(d, _)| *d == i) {
                None => desc,
                Some((_, shared)) => {
                    folded = RequestDescriptor {
                        entries: desc
                            .entries
                            .iter()
                            .enumerate()
                            .map(|(j, &(k, v))| {
                                let pattern = shared.iter().find(|(at, _)| *at == j);
                                (k, pattern.map_or(v, |(_, p)| p.as_str()))
                            })
                            .collect(),
                        hits_addend: desc.hits_addend,
                        limit_override: desc.limit_override,
                        refund: desc.refund,
                    };
                    &folded
                }
            };
            descriptor_status(
                domain,
                i,
                limits,
                &plan.planned,
                outcomes,
                sources,
                desc,
                &plan.metric_values[i],
                modes.quota,
                tally,
            )
        })
        .collect();
    let over = overall_over(plan, outcomes, modes.quota);
    let overall = if over && modes.shadow {
        tally.metrics.global_shadow.inc();
        Code::Ok
    } else if over {
        Code::OverLimit
    } else {
        Code::Ok
    };
    Decision {
        overall,
        statuses,
        from_fallback: sources.iter().any(|s| s.is_fallback()),
    }
}

/// Whether the request as a whole is over (see the module doc): a limit without quota mode
/// is over, or the request has quota-mode limits and all of them are.
fn overall_over(plan: &Plan, outcomes: &[Outcome], global_quota: bool) -> bool {
    let (mut quota_limits, mut quota_over) = (0usize, 0usize);
    let mut over = false;
    for (p, o) in plan.planned.iter().zip(outcomes) {
        let is_over = !o.allowed && !p.limit.shadow_mode;
        if global_quota || p.limit.quota_mode {
            quota_limits += 1;
            quota_over += usize::from(is_over);
        } else {
            over |= is_over;
        }
    }
    if global_quota {
        // The reference counts a descriptor without a rule as a quota descriptor that passed.
        quota_limits += plan.limits.iter().filter(|l| l.is_empty()).count();
    }
    over || (quota_limits > 0 && quota_over == quota_limits)
}

/// Folds the outcomes of one descriptor's limits into its status: over if any limit is
/// over (the non-shadow one with the longest wait is reported, one without quota mode
/// first), else the one with the least remaining.
#[allow(clippy::too_many_arguments)]
fn descriptor_status(
    domain: &Arc<str>,
    desc: usize,
    limits: &[Arc<Limit>],
    planned: &[Planned],
    outcomes: &[Outcome],
    sources: &[Source],
    req: &RequestDescriptor<'_>,
    metric_values: &[usize],
    global_quota: bool,
    tally: &Tally,
) -> Status {
    if limits.is_empty() {
        tally.count(domain, &tally.no_class, telemetry::Outcome::no_rule);
        return Status::no_limit(0);
    }
    let counted: Vec<(&Limit, &Outcome)> = planned
        .iter()
        .zip(outcomes)
        .filter(|(p, _)| p.desc == desc)
        .map(|(p, o)| (&*p.limit, o))
        .collect();
    let Some(&first) = counted.first() else {
        // Only unlimited limits matched.
        for l in limits {
            tally.count_limit(
                domain,
                l,
                req,
                metric_values,
                telemetry::Outcome::unlimited,
                0,
                0,
                None,
            );
        }
        return Status::no_limit(u32::MAX);
    };
    // Over: report the non-shadow limit that keeps the request out longest (a wait that
    // never ends first), so its reset and Retry-After are the ones that matter; a limit
    // without quota mode before a quota-mode one.
    let wait = |o: &Outcome| o.retry_ms.unwrap_or(u64::MAX);
    let quota = |l: &Limit| global_quota || l.quota_mode;
    let (limit, outcome) = counted
        .iter()
        .filter(|(l, o)| !o.allowed && !l.shadow_mode)
        .max_by_key(|(l, o)| (!quota(l), wait(o)))
        .or_else(|| counted.iter().find(|(_, o)| !o.allowed))
        .or_else(|| counted.iter().min_by_key(|(_, o)| o.remaining))
        .copied()
        .unwrap_or(first);
    let fallback = planned
        .iter()
        .zip(sources)
        .filter(|(p, _)| p.desc == desc)
        .map(|(_, s)| s.is_fallback());
    let costs = planned.iter().filter(|p| p.desc == desc).map(|p| p.cost);
    for (((l, o), fallback), cost) in counted.iter().zip(fallback).zip(costs) {
        let outcome = match (o.allowed, l.shadow_mode, fallback) {
            _ if req.refund => telemetry::Outcome::refund,
            (true, _, true) => telemetry::Outcome::fallback_ok,
            (false, _, true) => telemetry::Outcome::fallback_over_limit,
            (true, _, false) => tally.admitted(l.rate.map_or(0, |r| r.burst), o.remaining),
            (false, false, false) => telemetry::Outcome::over_limit,
            (false, true, false) => telemetry::Outcome::shadow,
        };
        tally.count_limit(
            domain,
            l,
            req,
            metric_values,
            outcome,
            cost,
            o.remaining,
            o.found,
        );
    }
    let over = !outcome.allowed;
    // A shadow limit that is over reports OK; a non-shadow over limit elsewhere on the
    // same descriptor still makes it OVER_LIMIT.
    let hard_over = counted.iter().any(|(l, o)| !o.allowed && !l.shadow_mode);
    let rate_over = counted
        .iter()
        .any(|(l, o)| !o.allowed && !l.shadow_mode && !quota(l));
    let (requests_per_unit, unit, capacity, window_ms) =
        limit.rate.map_or((0, Unit::Second, 0, 1_000), |r| {
            (r.requests_per_unit, r.unit, r.burst, r.window_ms())
        });
    Status {
        code: if hard_over { Code::OverLimit } else { Code::Ok },
        limit: Some(ReportedLimit {
            requests_per_unit,
            unit,
            name: limit.name.clone().unwrap_or_default(),
            capacity,
            window_ms,
        }),
        remaining: u32::try_from(outcome.remaining).unwrap_or(u32::MAX),
        reset_ms: outcome.reset_ms,
        retry_ms: if over { outcome.retry_ms } else { None },
        shadow: over && !hard_over,
        quota_mode: hard_over && !rate_over,
        metadata: limit.metadata.clone(),
        receipt: None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixture::{fixture, req, with_config};
    use super::*;

    #[test]
    fn unknown_domains_are_counted_by_name_up_to_a_bound() {
        let f = fixture(false);
        for _ in 0..3 {
            f.decide(&req("Edge", &[&[("tenant", "a")]]));
        }
        for i in 0..UNKNOWN_DOMAIN_NAMES + 5 {
            f.decide(&req(&format!("d{i:03}"), &[&[("tenant", "a")]]));
        }
        let long = "x".repeat(200);
        f.decide(&req(&long, &[&[("tenant", "a")]]));
        let names = f.limiter.unknown_domains();
        assert_eq!(names.len(), UNKNOWN_DOMAIN_NAMES);
        assert!(names.contains(&"Edge".to_string()));
        let text = f.metrics.render();
        assert!(
            text.contains(r#"tollgate_unknown_domain_requests_total{domain="Edge"} 3"#),
            "{text}"
        );
        // Past the bound (Edge and d000..d098 fill it): six more names, the long one too.
        assert!(
            text.contains(r#"tollgate_unknown_domain_requests_total{domain="(other)"} 7"#),
            "{text}"
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
    fn admitted_past_the_near_limit_ratio_counts_near_limit() {
        // tenant: 2/hour; ⌊2 × 0.8⌋ = 1, so the second hit is near the limit.
        let f = fixture(false);
        let r = req("edge", &[&[("tenant", "near")]]);
        for _ in 0..3 {
            f.decide(&r);
        }
        let m = f.metrics.render();
        for outcome in ["ok", "near_limit", "over_limit"] {
            assert!(
                m.contains(&format!(r#"class="tenant",outcome="{outcome}"}} 1"#)),
                "{outcome}: {m}"
            );
        }
        // As envoyproxy/ratelimit counts it: of 10, hits 9 and 10 are near (⌊10 × 0.8⌋ = 8).
        let t = Tally::new(Arc::new(Metrics::new()), 0.8, 1_000);
        let near: Vec<u64> = (1..=10)
            .filter(|used| t.admitted(10, 10 - used) == telemetry::Outcome::near_limit)
            .collect();
        assert_eq!(near, [9, 10]);
        // 1 turns it off; a zero limit is never near.
        let off = Tally::new(Arc::new(Metrics::new()), 1.0, 1_000);
        assert_eq!(off.admitted(10, 0), telemetry::Outcome::ok);
        assert_eq!(t.admitted(0, 0), telemetry::Outcome::ok);
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
    fn quota_mode_refuses_only_when_every_quota_limit_is_over() {
        // user 1/hour and team 2/hour, both quota-mode: the user's own budget spent is not
        // enough to refuse, the team's spent too is.
        let f = fixture(false);
        let r = req("edge", &[&[("user", "a")], &[("team", "t")]]);
        let d = f.decide(&r);
        assert_eq!(d.overall, Code::Ok);
        let d = f.decide(&r);
        assert_eq!(d.overall, Code::Ok, "only the user's budget is spent");
        assert_eq!(
            (d.statuses[0].code, d.statuses[0].quota_mode),
            (Code::OverLimit, true),
            "a quota-mode descriptor over its limit still says so"
        );
        assert_eq!(d.statuses[1].code, Code::Ok);
        let d = f.decide(&r);
        assert_eq!(d.overall, Code::OverLimit, "both budgets are spent");
        // A limit without quota mode that is over refuses, whatever the quota limits say.
        let r = req("edge", &[&[("user", "b")], &[("zero", "x")]]);
        assert_eq!(f.decide(&r).overall, Code::OverLimit);
        // The only quota-mode limit of a request over is all of them: refused, as in the
        // reference, though the tenant's limit has room.
        let r = req("edge", &[&[("user", "c")], &[("tenant", "c")]]);
        f.decide(&r);
        assert_eq!(f.decide(&r).overall, Code::OverLimit);
    }

    #[test]
    fn global_quota_mode_makes_every_limit_quota_mode() {
        let f = with_config(|c| c.quota_mode = true);
        let r = req("edge", &[&[("zero", "x")], &[("tenant", "q")]]);
        assert_eq!(
            f.decide(&r).overall,
            Code::Ok,
            "zero is over, tenant is not"
        );
        f.decide(&r);
        assert_eq!(f.decide(&r).overall, Code::OverLimit, "both over");
        // As in the reference, a descriptor without a rule is a quota descriptor that passed.
        let r = req("edge", &[&[("zero", "x")], &[("nobody", "y")]]);
        assert_eq!(f.decide(&r).overall, Code::Ok);
        assert_eq!(
            f.decide(&req("edge", &[&[("zero", "x")]])).overall,
            Code::OverLimit
        );
    }

    #[test]
    fn value_to_metric_puts_the_value_in_the_class_and_metadata_rides_the_status() {
        let f = fixture(false);
        let d = f.decide(&req("edge", &[&[("user", "ann")], &[("tenant", "t")]]));
        let m = f.metrics.render();
        assert!(m.contains(r#"class="user.user_ann",outcome="#), "{m}");
        assert!(m.contains(r#"class="tenant",outcome="ok""#), "{m}");
        assert_eq!(
            d.statuses[0].metadata.as_deref(),
            Some(&serde_json::json!({"budget": "user", "tier": {"name": "free"}}))
        );
        assert_eq!(d.statuses[1].metadata, None);
    }

    #[test]
    fn statsd_counts_hits_under_the_references_paths() {
        let f = fixture(false);
        f.metrics.statsd.enable();
        let mut r = req(
            "edge",
            &[
                &[("tenant", "vip")],
                &[("user", "ann")],
                &[("shadowed", "s")],
            ],
        );
        f.decide(&r);
        r.hits_addend = 3;
        f.decide(&r);
        f.decide(&req("nope", &[&[("tenant", "a")]]));
        let got: HashMap<String, u64> = f.metrics.statsd.snapshot(&f.metrics).into_iter().collect();
        let at = |path: &str, n: &str| got.get(&format!("rate_limit.edge.{path}.{n}")).copied();
        // 1 an hour: the first hit is admitted (and near the limit), the next three are over.
        assert_eq!(at("tenant_vip", "total_hits"), Some(4), "{got:?}");
        assert_eq!(at("tenant_vip", "within_limit"), Some(1));
        assert_eq!(at("tenant_vip", "near_limit"), Some(1));
        assert_eq!(at("tenant_vip", "over_limit"), Some(3));
        // value_to_metric: the request's value in place, as the reference names it.
        assert_eq!(at("user_ann", "total_hits"), Some(4), "{got:?}");
        // Shadow: over (counted in over_limit too) but answered OK.
        assert_eq!(at("shadowed", "shadow_mode"), Some(3));
        assert_eq!(at("shadowed", "over_limit"), Some(3));
        assert_eq!(got.get("rate_limit.nope.domain_not_found"), Some(&1));
    }

    /// The reference's statsd counts for hits that cross the near threshold and the limit
    /// (`base_limiter.go`), and one series for a `share_threshold` wildcard with
    /// `detailed_metric`, under its pattern.
    #[test]
    fn statsd_splits_hits_as_the_reference_and_names_a_shared_wildcard_once() {
        let f = fixture(false);
        f.metrics.statsd.enable();
        // 10 an hour, near at 8: 4 within, 4 within, then 4 refused (2 near, 2 over).
        let mut r = req("edge", &[&[("ten", "x")]]);
        r.hits_addend = 4;
        assert_eq!(f.codes(&r), [Code::Ok]);
        assert_eq!(f.codes(&r), [Code::Ok]);
        assert_eq!(f.codes(&r), [Code::OverLimit]);
        for value in ["p-1", "p-2"] {
            f.decide(&req("edge", &[&[("pool", value)]]));
        }
        let got: HashMap<String, u64> = f.metrics.statsd.snapshot(&f.metrics).into_iter().collect();
        let at = |path: &str, n: &str| got.get(&format!("rate_limit.edge.{path}.{n}")).copied();
        assert_eq!(at("ten", "total_hits"), Some(12), "{got:?}");
        assert_eq!(at("ten", "within_limit"), Some(8), "{got:?}");
        assert_eq!(at("ten", "near_limit"), Some(2), "{got:?}");
        assert_eq!(at("ten", "over_limit"), Some(2), "{got:?}");
        assert_eq!(at("pool_p-*", "total_hits"), Some(2), "{got:?}");
        assert!(
            !got.keys().any(|k| k.contains("pool_p-1")),
            "one series for the wildcard: {got:?}"
        );
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
