//! Planning a request: which limits apply to each descriptor and which store ops count them.
//!
//! Data flows in three steps, all in memory:
//! 1. match: each descriptor's entries walk the domain's descriptor tree (`rules::matcher`),
//!    giving its node and which entries a `share_threshold` wildcard folds into one bucket;
//! 2. limits: Envoy's per-descriptor override if the request carries one (it replaces the
//!    rules' limit, as in the reference), else the node's limits minus those named by any
//!    matched limit's `replaces`;
//! 3. ops: every counted limit (not `unlimited`) becomes one [`Op`]: its bucket key
//!    (`keys::bucket_key`), its [`OpKind`] (from the limit's [`Rate`]) and the descriptor's
//!    cost. A descriptor with Envoy's `is_negative_hits` (a refund) gives its cost back
//!    instead ([`Action::Return`](crate::quota::Action::Return): a token bucket refilled, a
//!    window's count lowered, capped as a lease's give-back is and never paying debt; see
//!    docs/usage-costs.md); on a `charge_parent` node its value is the reservation's receipt,
//!    which bounds what and where it gives back (`receipt.rs`). A request's refunds are
//!    planned before its takes and charges, so a settlement gives back before it charges.
//!
//! The [`Plan`] keeps, next to the ops, which descriptor and limit each op counts, so the
//! store's outcomes (one per op, same order) can be folded back per descriptor (`status.rs`).

use std::sync::Arc;

use super::receipt::Settlement;
use super::{LimitOverride, LimiterConfig, Request, shard};
use crate::keys;
use crate::quota::{Op, OpKind};
use crate::rules::matcher;
use crate::rules::model::Origin;
use crate::rules::{Algorithm, Domain, Limit, Rate};

/// The metrics class of every Envoy-supplied limit override: one series, whatever the values.
pub const OVERRIDE_CLASS: &str = "envoy_override";

/// What a request will do to the store, and to which descriptor each part belongs.
#[derive(Clone)]
pub(super) struct Plan {
    /// The limits of each descriptor, in request order (empty: no rule matched, or all of
    /// its limits were replaced). Unlimited limits are here but have no op.
    pub(super) limits: Vec<Vec<Arc<Limit>>>,
    /// One per op, in the same order: the descriptor and limit the op counts.
    pub(super) planned: Vec<Planned>,
    /// Per descriptor, the entries whose request values join its limits' metrics class
    /// (`value_to_metric`); empty lists, which do not allocate, nearly always.
    pub(super) metric_values: Vec<Vec<usize>>,
    /// `(descriptor, [(entry, declared pattern)])` of the entries a `share_threshold` wildcard
    /// folded into one bucket, where a `detailed_metric` limit would name each value: its
    /// metrics name the pattern instead (one series, as the reference's). Empty, without
    /// allocating, nearly always.
    pub(super) shared: Vec<(usize, Vec<(usize, String)>)>,
    /// `(descriptor, key)` of each reservation that is owed a receipt if it passes: a take
    /// on a node a `charge_parent` child settles, under that child's key (`receipt.rs`).
    /// Empty, without allocating, unless the domain has reservations.
    pub(super) receipts: Vec<(usize, String)>,
    pub(super) ops: Vec<Op>,
}

/// A counted limit of descriptor `desc` (an `Arc` clone: the rules' own, or an override).
#[derive(Clone)]
pub(super) struct Planned {
    pub(super) desc: usize,
    pub(super) limit: Arc<Limit>,
    /// The shard picked for a sharded limit (`shards` > 1; see `shard.rs`).
    pub(super) shard: Option<u32>,
    /// The hits this op takes (the descriptor's `hits_addend`, else the request's, else 1).
    pub(super) cost: u64,
}

/// The store operation that enforces a rate, by its algorithm.
impl From<Rate> for OpKind {
    fn from(rate: Rate) -> Self {
        let window_ms = rate.window_ms();
        if let Some(calendar) = rate.calendar {
            return OpKind::CalendarWindow {
                limit: u64::from(rate.requests_per_unit),
                calendar,
                window_ms,
            };
        }
        match rate.algorithm {
            Algorithm::TokenBucket => OpKind::TokenBucket {
                capacity: rate.burst,
                refill: u64::from(rate.requests_per_unit),
                window_ms,
            },
            Algorithm::FixedWindow => OpKind::FixedWindow {
                limit: u64::from(rate.requests_per_unit),
                window_ms,
            },
            Algorithm::SlidingWindow => OpKind::SlidingWindow {
                limit: u64::from(rate.requests_per_unit),
                window_ms,
            },
            Algorithm::SlidingLog => OpKind::SlidingLog {
                limit: u64::from(rate.requests_per_unit),
                window_ms,
            },
        }
    }
}

/// Plans `req` against `domain` (the rules of `req.domain`). `override_class` is the shared
/// metrics class of Envoy overrides ([`OVERRIDE_CLASS`]), passed in so no request allocates it.
pub(super) fn plan(
    domain: &Domain,
    req: &Request<'_>,
    config: &LimiterConfig,
    override_class: &Arc<str>,
) -> Plan {
    // 1. Match: the node of each descriptor (and which values share a bucket).
    let matches: Vec<Option<matcher::Match<'_>>> = req
        .descriptors
        .iter()
        .map(|d| matcher::find(domain, &d.entries))
        .collect();

    // 2. The limits of each descriptor. `replaces` works across descriptors: a limit matched
    //    anywhere in the request drops the limits it names everywhere in it.
    let replaced: Vec<&str> = matches
        .iter()
        .flatten()
        .flat_map(|m| m.node.counted_limits().iter())
        .flat_map(|l| l.replaces.iter().map(String::as_str))
        .collect();
    let limits: Vec<Vec<Arc<Limit>>> = req
        .descriptors
        .iter()
        .zip(&matches)
        .map(|(d, m)| match (d.limit_override, m) {
            (Some(o), _) => vec![override_limit(
                o,
                override_algorithm(o, config),
                override_class.clone(),
            )],
            (None, Some(m)) => m
                .node
                .counted_limits()
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

    // 3. One op per counted limit: refunds first, then the rest, so a settlement that gives
    //    a reservation back and charges its usage in one call (in either order) gives back
    //    before it charges: an honest reserve of 60 that used 90 neither loses tokens to the
    //    debt cap nor mints any.
    // Sized to the limits at once: a request's plan lives as long as its store call, and a
    // first push would reserve room for four.
    let counted = limits.iter().flatten().filter(|l| l.rate.is_some()).count();
    let mut planned: Vec<Planned> = Vec::with_capacity(counted);
    let mut ops: Vec<Op> = Vec::with_capacity(counted);
    let mut receipts = Vec::new();
    for refunds in [true, false] {
        for (i, ((desc, m), desc_limits)) in req
            .descriptors
            .iter()
            .zip(&matches)
            .zip(&limits)
            .enumerate()
        {
            if desc.refund != refunds {
                continue;
            }
            // The descriptor's cost wins over the request's; a request cost of 0 means 1 (the
            // proto default), while a descriptor cost of 0 means "check only".
            let cost = desc.hits_addend.unwrap_or(if req.hits_addend == 0 {
                1
            } else {
                req.hits_addend
            });
            let shared = m.as_ref().map_or(&[][..], |m| &m.shared[..]);
            // A `charge_parent` node is counted on its parent's buckets: keyed by the entries
            // down to the parent, and charged (never lost) rather than taken.
            let charges_parent = desc.limit_override.is_none()
                && m.as_ref().is_some_and(|m| m.node.charge_parent.is_some());
            let depth = desc.entries.len() - usize::from(charges_parent);
            // A node a `charge_parent` child settles: its takes are reservations, owed a receipt.
            let settled_by = match m {
                Some(m) if desc.limit_override.is_none() => m.node.settled_by.as_deref(),
                _ => None,
            };
            let reserves = settled_by.is_some();
            if let Some(key) = settled_by
                && !desc.refund
                && cost > 0
            {
                receipts.push((i, key.to_string()));
            }
            // A refund on a `charge_parent` node: its value is the reservation's receipt.
            let settlement = (desc.refund && charges_parent)
                .then(|| Settlement::read(desc.entries.last().map_or("", |e| e.1)));
            let counted = desc_limits.iter().filter(|l| l.rate.is_some()).count();
            for (nth, (limit, rate)) in desc_limits
                .iter()
                .filter_map(|l| l.rate.map(|r| (l, r)))
                .enumerate()
            {
                // Shared values are keyed by their pattern, so they all land in one bucket.
                let entries = desc.entries[..depth]
                    .iter()
                    .enumerate()
                    .map(|(j, &(k, v))| {
                        let pattern = shared.iter().find(|(at, _)| *at == j).map(|(_, p)| *p);
                        (k, pattern.unwrap_or(v))
                    });
                // A sharded limit: a random shard, holding its part of the limit.
                let shard = (limit.shards > 1).then(|| shard::pick(limit.shards));
                let key = keys::bucket_key(
                    &config.key_prefix,
                    req.domain,
                    entries,
                    &rate,
                    limit.index,
                    shard,
                );
                let kind = match shard {
                    Some(i) => crate::quota::share::shard_part(OpKind::from(rate), limit.shards, i),
                    None => OpKind::from(rate),
                };
                // A global limit: this region's share of it (its demand counted for the exchange).
                let kind = match &config.regions {
                    Some(shares) if limit.global => {
                        shares.scale(&key, kind, if desc.refund { 0 } else { cost })
                    }
                    _ => kind,
                };
                let op = if let Some(settlement) = &settlement {
                    settlement.give_back(key, kind, cost, nth, counted)
                } else if desc.refund {
                    Op::give_back(key, kind, cost)
                } else if limit.overdraft || charges_parent {
                    Op::charge(key, kind, cost)
                } else if reserves
                    && matches!(
                        kind,
                        OpKind::FixedWindow { .. } | OpKind::CalendarWindow { .. }
                    )
                {
                    // On a window a refused reservation must count nothing (never settled).
                    Op::reserve(key, kind, cost)
                } else {
                    Op::take(key, kind, cost)
                };
                planned.push(Planned {
                    desc: i,
                    limit: limit.clone(),
                    shard,
                    cost: op.cost,
                });
                ops.push(op);
            }
        }
    }
    // Only where a limit names the request's values in its metrics (`detailed_metric`): nearly
    // never, so this allocates nothing on the common path.
    let shared = matches
        .iter()
        .enumerate()
        .filter_map(|(i, m)| {
            let m = m.as_ref()?;
            let detailed = m.node.counted_limits().iter().any(|l| l.detailed_metric);
            (detailed && !m.shared.is_empty()).then(|| {
                let patterns = m.shared.iter();
                (i, patterns.map(|(at, p)| (*at, p.to_string())).collect())
            })
        })
        .collect();
    // An Envoy override is counted in its own class, whatever the node says.
    let metric_values = matches
        .into_iter()
        .zip(&req.descriptors)
        .map(|(m, d)| match (m, d.limit_override) {
            (Some(m), None) => m.metric_values,
            _ => Vec::new(),
        })
        .collect();
    Plan {
        limits,
        planned,
        ops,
        metric_values,
        shared,
        receipts,
    }
}

/// The algorithm of an Envoy override: `default_algorithm`, but a sliding log only within
/// `sliding_log_max_limit`, the cap the rules hold their own limits to (a log keeps every hit
/// of its window: one override of 50,000,000 an hour with a large `hits_addend` would write
/// that many members in one script). Past it, the sliding window: the same edges-smoothed
/// count in two numbers.
fn override_algorithm(o: LimitOverride, config: &LimiterConfig) -> Algorithm {
    match config.default_algorithm {
        Algorithm::SlidingLog if u64::from(o.requests_per_unit) > config.sliding_log_max_limit => {
            Algorithm::SlidingWindow
        }
        a => a,
    }
}

/// A limit from the request's `RateLimitDescriptor.limit`; its key path keeps its window, so
/// two overrides with different units never share a bucket.
fn override_limit(o: LimitOverride, algorithm: Algorithm, class: Arc<str>) -> Arc<Limit> {
    Arc::new(Limit {
        name: None,
        rate: Some(Rate {
            requests_per_unit: o.requests_per_unit,
            unit: o.unit,
            unit_multiplier: 1,
            burst: u64::from(o.requests_per_unit),
            algorithm,
            calendar: None,
        }),
        shadow_mode: false,
        detailed_metric: false,
        quota_mode: false,
        metadata: None,
        replaces: Vec::new(),
        fallback: None,
        shards: 1,
        lease: None,
        overdraft: false,
        global: false,
        stat_path: Arc::from(vec![class.to_string()]),
        class,
        // Its own bucket, apart from the rules' limits on the same entries (keys.rs).
        index: keys::OVERRIDE_INDEX,
        origin: Origin {
            file: "(request)".into(),
            line: 0,
        },
        decisions: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::fixture::{fixture, req};
    use super::super::{Code, LimitOverride, Status};
    use super::*;
    use crate::rules::Unit;

    fn rate(algorithm: Algorithm) -> Rate {
        Rate {
            requests_per_unit: 5,
            unit: Unit::Minute,
            unit_multiplier: 2,
            burst: 8,
            algorithm,
            calendar: None,
        }
    }

    #[test]
    fn op_kind_follows_the_algorithm() {
        assert_eq!(
            OpKind::from(rate(Algorithm::TokenBucket)),
            OpKind::TokenBucket {
                capacity: 8,
                refill: 5,
                window_ms: 120_000
            }
        );
        assert_eq!(
            OpKind::from(rate(Algorithm::FixedWindow)),
            OpKind::FixedWindow {
                limit: 5,
                window_ms: 120_000
            }
        );
        assert_eq!(
            OpKind::from(rate(Algorithm::SlidingWindow)),
            OpKind::SlidingWindow {
                limit: 5,
                window_ms: 120_000
            }
        );
    }

    #[test]
    fn one_op_per_counted_limit_with_the_descriptor_cost() {
        let f = fixture(false);
        let domain = &f.rules.domains["edge"];
        let mut r = req(
            "edge",
            &[&[("both", "x")], &[("free", "y")], &[("nobody", "z")]],
        );
        r.hits_addend = 3;
        r.descriptors[0].hits_addend = Some(0);
        let p = plan(domain, &r, &f.config, &OVERRIDE_CLASS.into());
        // `both` has two limits (two ops, two buckets); `free` is unlimited (a limit, no op);
        // `nobody` matches nothing.
        assert_eq!(p.limits.iter().map(Vec::len).collect::<Vec<_>>(), [2, 1, 0]);
        assert_eq!(p.ops.len(), 2);
        assert_eq!(p.planned.iter().map(|x| x.desc).collect::<Vec<_>>(), [0, 0]);
        assert_ne!(p.ops[0].key, p.ops[1].key);
        assert!(p.ops.iter().all(|op| op.cost == 0), "descriptor cost wins");
        assert!(p.ops[0].key.starts_with("t:{edge|both=x|tb:1000:0}"));

        let p = plan(
            domain,
            &req("edge", &[&[("tenant", "a")]]),
            &f.config,
            &OVERRIDE_CLASS.into(),
        );
        assert_eq!(p.ops[0].cost, 1, "a request cost of 0 means 1");
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

    /// `r` with its one descriptor turned into a refund of `hits` (Envoy's `is_negative_hits`).
    fn refund<'a>(r: &Request<'a>, hits: Option<u64>) -> Request<'a> {
        let mut back = r.clone();
        back.descriptors[0].refund = true;
        back.descriptors[0].hits_addend = hits;
        back
    }

    #[test]
    fn a_refund_gives_tokens_back_capped_and_is_never_refused() {
        let f = fixture(false);
        // Token bucket (tenant: 2/hour).
        let r = req("edge", &[&[("tenant", "rf")]]);
        let back = refund(&r, None);
        let full = f.decide(&back).statuses[0].clone();
        assert_eq!(
            (full.code, full.remaining),
            (Code::Ok, 2),
            "never above the capacity"
        );
        f.decide(&r);
        f.decide(&r);
        assert_eq!(f.codes(&r), [Code::OverLimit]);
        let given = f.decide(&back);
        assert_eq!(given.overall, Code::Ok);
        assert_eq!(given.statuses[0].remaining, 1);
        assert_eq!(f.codes(&r), [Code::Ok], "the token given back");
        assert_eq!(f.codes(&r), [Code::OverLimit]);
        assert_eq!(
            f.decide(&refund(&r, Some(5))).statuses[0].remaining,
            2,
            "a refund of 5 fills an empty bucket of 2, no more"
        );

        // Fixed window (window: 2/minute): the count goes down within the current window.
        let w = req("edge", &[&[("window", "wf")]]);
        f.decide(&w);
        f.decide(&w);
        assert_eq!(f.codes(&w), [Code::OverLimit]);
        assert_eq!(f.codes(&refund(&w, None)), [Code::Ok]);
        assert_eq!(f.codes(&w), [Code::Ok]);
        assert_eq!(f.codes(&w), [Code::OverLimit]);
        // A refund after the window ended gives nothing to the new one.
        f.clock.advance_ms(60_000);
        assert_eq!(f.decide(&refund(&w, Some(3))).statuses[0].remaining, 2);
        assert_eq!(f.codes(&w), [Code::Ok]);
        assert_eq!(f.codes(&w), [Code::Ok]);
        assert_eq!(f.codes(&w), [Code::OverLimit]);

        // Sliding window (slide: 2/minute): off the current window's count.
        let s = req("edge", &[&[("slide", "sf")]]);
        f.decide(&s);
        f.decide(&s);
        assert_eq!(f.codes(&s), [Code::OverLimit]);
        assert_eq!(f.codes(&refund(&s, None)), [Code::Ok]);
        assert_eq!(f.codes(&s), [Code::Ok]);
        assert_eq!(f.codes(&s), [Code::OverLimit]);

        // Beside a take over its limit, a refund does not change the request's answer.
        let other = req("edge", &[&[("tenant", "rf-other")]]);
        let mixed = Request {
            descriptors: vec![other.descriptors[0].clone(), back.descriptors[0].clone()],
            ..r.clone()
        };
        f.decide(&other);
        f.decide(&other);
        let d = f.decide(&mixed);
        assert_eq!(d.overall, Code::OverLimit);
        assert_eq!(
            d.statuses.iter().map(|s| s.code).collect::<Vec<_>>(),
            [Code::OverLimit, Code::Ok]
        );
        // On one bucket, a request's refunds go first, wherever they stand in it: the take
        // after them finds the token given back.
        let both = Request {
            descriptors: vec![r.descriptors[0].clone(), back.descriptors[0].clone()],
            ..r.clone()
        };
        f.decide(&r);
        f.decide(&r);
        assert_eq!(f.codes(&r), [Code::OverLimit]);
        assert_eq!(f.decide(&both).overall, Code::Ok);
        // Refunds are their own outcome, never hits.
        let m = f.metrics.render();
        assert!(
            m.contains(
                r#"tollgate_decisions_total{domain="edge",class="tenant",outcome="refund"} 5"#
            ),
            "{m}"
        );
    }

    #[test]
    fn charge_parent_settles_a_reservation_on_the_parents_bucket() {
        let f = fixture(false);
        // budget: 10/hour; (budget, settle=held) is charged to it.
        let reserve = |n| {
            let mut r = req("edge", &[&[("budget", "a")]]);
            r.descriptors[0].hits_addend = Some(n);
            r
        };
        let settle = |n, is_refund| {
            let mut r = req("edge", &[&[("budget", "a"), ("settle", "held")]]);
            r.descriptors[0].hits_addend = Some(n);
            r.descriptors[0].refund = is_refund;
            r
        };
        let domain = &f.rules.domains["edge"];
        let class: Arc<str> = OVERRIDE_CLASS.into();
        let taken = plan(domain, &reserve(6), &f.config, &class);
        let charged = plan(domain, &settle(2, false), &f.config, &class);
        assert_eq!(charged.ops[0].key, taken.ops[0].key, "the parent's bucket");
        assert_eq!(charged.ops[0].action, crate::quota::Action::Charge);
        assert_eq!(taken.ops[0].action, crate::quota::Action::Take);
        assert_eq!(
            plan(domain, &settle(6, true), &f.config, &class).ops[0].action,
            crate::quota::Action::RETURN
        );

        assert_eq!(f.decide(&reserve(6)).statuses[0].remaining, 4);
        assert_eq!(
            f.codes(&reserve(6)),
            [Code::OverLimit],
            "a reservation that does not fit is refused, and not charged"
        );
        // The stream is done: 6 reserved, 2 used.
        assert_eq!(f.decide(&settle(6, true)).statuses[0].remaining, 10);
        assert_eq!(f.decide(&settle(2, false)).statuses[0].remaining, 8);
        // Usage above what is left is charged all the same: into debt.
        let over = f.decide(&settle(15, false));
        assert_eq!(over.statuses[0].code, Code::OverLimit);
        assert_eq!(
            f.codes(&reserve(1)),
            [Code::OverLimit],
            "the budget is in debt"
        );
        // Counted in the parent's class.
        let m = f.metrics.render();
        assert!(m.contains(r#"class="budget",outcome="refund"} 1"#), "{m}");
    }

    #[test]
    fn a_refused_reservation_on_a_calendar_month_counts_nothing() {
        let f = fixture(false);
        // month_budget: 10 a calendar month, settled by (month_budget, settle=held).
        let with = |entries: &'static [(&'static str, &'static str)], n, refund| {
            let mut r = req("edge", &[entries]);
            r.descriptors[0].hits_addend = Some(n);
            r.descriptors[0].refund = refund;
            r
        };
        let reserve = |n| with(&[("month_budget", "t")], n, false);
        let settle = |n, refund| with(&[("month_budget", "t"), ("settle", "held")], n, refund);
        let domain = &f.rules.domains["edge"];
        let p = plan(domain, &reserve(6), &f.config, &OVERRIDE_CLASS.into());
        assert_eq!(p.ops[0].action, crate::quota::Action::Reserve);
        assert_eq!(f.decide(&reserve(6)).statuses[0].remaining, 4);
        assert_eq!(f.codes(&reserve(6)), [Code::OverLimit]);
        // A plain fixed-window take would have counted the refused 6 up to the limit.
        assert_eq!(
            f.decide(&reserve(4)).statuses[0].remaining,
            0,
            "nothing was counted"
        );
        // Both streams end: 10 reserved, 3 + 2 used.
        f.decide(&settle(6, true));
        f.decide(&settle(3, false));
        f.decide(&settle(4, true));
        assert_eq!(f.decide(&settle(2, false)).statuses[0].remaining, 5);
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
    fn a_calendar_month_ends_on_the_first_of_the_next() {
        let f = fixture(false);
        // 1.7e12 ms is 2023-11-14 22:13:20 UTC: November ends in 15 d 1 h 46 min 40 s.
        let to_december = 1_701_388_800_000 - 1_700_000_000_000;
        let r = req("edge", &[&[("monthly", "acme")]]);
        let p = plan(
            &f.rules.domains["edge"],
            &r,
            &f.config,
            &OVERRIDE_CLASS.into(),
        );
        assert!(p.ops[0].key.contains("|cw:month:0}"), "{}", p.ops[0].key);
        let first = f.decide(&r).statuses[0].clone();
        assert_eq!((first.code, first.reset_ms), (Code::Ok, to_december));
        f.decide(&r);
        let over = f.decide(&r).statuses[0].clone();
        assert_eq!(
            (over.code, over.retry_ms),
            (Code::OverLimit, Some(to_december))
        );
        f.clock.advance_ms(to_december - 1);
        assert_eq!(
            f.codes(&r),
            [Code::OverLimit],
            "November's last millisecond"
        );
        f.clock.advance_ms(1);
        let december = f.decide(&r).statuses[0].clone();
        assert_eq!(
            (december.code, december.reset_ms),
            (Code::Ok, 31 * 86_400_000),
            "December: 31 days"
        );
        // A refund goes back into the month it was taken in.
        let mut back = r.clone();
        back.descriptors[0].refund = true;
        assert_eq!(f.decide(&back).statuses[0].remaining, 2);
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
        // One class for both overrides: the 1/day one admitted its only hit (near its
        // limit: ⌊1 × 0.8⌋ = 0), the 5/s one its first.
        let m = f.metrics.render();
        assert!(
            m.contains(r#"class="envoy_override",outcome="ok"} 1"#),
            "{m}"
        );
        assert!(
            m.contains(r#"class="envoy_override",outcome="near_limit"} 1"#),
            "{m}"
        );
    }
}
