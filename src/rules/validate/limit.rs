//! The limits part of the walk: a descriptor's `rate_limit` or `rate_limits` → [`Limit`]s.
//!
//! The descriptor walk (`mod.rs`) calls `FileWalk::limits` with the descriptor's fields and
//! what its limits inherit from it (`shadow_mode`, `detailed_metric`); each limit's fields are
//! read here (`name`, `class`, `replaces`, `unlimited`) and, for a counted limit, its rate
//! (`unit`, `requests_per_unit`, `algorithm`, `burst`, `unit_multiplier`) with the defaults
//! resolved: the settings' `default_algorithm`, `burst` = `requests_per_unit`, a multiplier of 1.

use std::sync::Arc;

use super::{FileWalk, RulePath};
use crate::quota::calendar::{Calendar, CalendarUnit};
use crate::rules::FallbackMode;
use crate::rules::model::{Algorithm, LeaseRule, Limit, Rate, Unit};
use crate::rules::yaml::{self, Fields, Node, join};

/// What a limit takes over from the descriptor that declares it.
pub(super) struct Inherited {
    pub(super) shadow_mode: bool,
    pub(super) detailed_metric: bool,
    pub(super) quota_mode: bool,
    pub(super) metadata: Option<Arc<serde_json::Value>>,
}

/// A field that may be left out but, when given, must be a count of at least 1.
enum AtLeastOne {
    Absent,
    Given(u64),
    /// Given but not valid; the error is already recorded.
    Refused,
}

impl FileWalk<'_> {
    /// A descriptor's `rate_limit` (one) or `rate_limits` (a list, each with its own bucket);
    /// `None` when any of them is refused.
    pub(super) fn limits(
        &mut self,
        f: &Fields<'_>,
        path: &str,
        inherited: &Inherited,
        at: &RulePath,
    ) -> Option<Vec<Arc<Limit>>> {
        let mut limits = Vec::new();
        let mut ok = true;
        // An empty `rate_limit:` is no limit, as in the reference (its YAML reads a null
        // pointer): the descriptor matches and limits nothing, like one without the field.
        let given = |name| f.get(name).copied().filter(|n: &&Node| !n.is_null());
        match (given("rate_limit"), given("rate_limits")) {
            (Some(_), Some(n)) => {
                self.error(
                    n.pos,
                    &join(path, "rate_limits"),
                    "use either `rate_limit` or `rate_limits`, not both",
                );
                ok = false;
            }
            (Some(n), None) => match self.limit(n, &join(path, "rate_limit"), inherited, at) {
                Some(l) => limits.push(l),
                None => ok = false,
            },
            (None, Some(n)) => {
                let field = join(path, "rate_limits");
                let items = yaml::seq(self.problems, n, &field).unwrap_or(&[]);
                for (i, item) in items.iter().enumerate() {
                    let item_path = format!("{field}[{i}]");
                    match self.limit(item, &item_path, inherited, at) {
                        Some(l) => limits.push(l),
                        None => ok = false,
                    }
                }
            }
            (None, None) => {}
        }
        same_identity(&mut limits);
        ok.then(|| limits.into_iter().map(Arc::new).collect())
    }

    fn limit(
        &mut self,
        node: &Node,
        path: &str,
        inherited: &Inherited,
        at: &RulePath,
    ) -> Option<Limit> {
        const FIELDS: &[&str] = &[
            "unit",
            "requests_per_unit",
            "unlimited",
            "name",
            "replaces",
            "algorithm",
            "burst",
            "unit_multiplier",
            "class",
            "fallback",
            "shards",
            "lease",
            "quota_mode",
            "overdraft",
            "calendar",
            "global",
        ];
        let f = yaml::fields(self.problems, node, path, FIELDS)?;
        // Every check below runs even after one fails (to report them all); whether any
        // failed is whether the error count moved.
        let errors_before = self.problems.errors.len();
        let unlimited = f
            .get("unlimited")
            .and_then(|n| yaml::bool(self.problems, n, &join(path, "unlimited")))
            .unwrap_or(false);
        let name = f
            .get("name")
            .and_then(|n| yaml::string(self.problems, n, &join(path, "name")))
            .filter(|s| !s.is_empty());
        let class = f
            .get("class")
            .and_then(|n| yaml::string(self.problems, n, &join(path, "class")));
        if let Some(n) = f.get("class")
            && class.as_deref() == Some("")
        {
            self.error(n.pos, &join(path, "class"), "must not be empty");
        }
        // The reference reads `quota_mode` on the descriptor; a limit of `rate_limits` may
        // set its own (either one makes the limit quota-mode).
        let quota_mode = inherited.quota_mode
            || f.get("quota_mode")
                .and_then(|n| yaml::bool(self.problems, n, &join(path, "quota_mode")))
                .unwrap_or(false);
        let fallback = f.get("fallback").and_then(|n| {
            let field = join(path, "fallback");
            let s = yaml::string(self.problems, n, &field)?;
            let mode = FallbackMode::parse(&s);
            if mode.is_none() {
                self.error(
                    n.pos,
                    &field,
                    format!("unknown fallback '{s}' (expected {})", FallbackMode::NAMES),
                );
            } else if unlimited {
                self.error(
                    n.pos,
                    &field,
                    "an unlimited limit never calls the store, so it has no fallback",
                );
            }
            mode
        });
        let replaces = match f.get("replaces") {
            Some(n) => self.replaces(n, &join(path, "replaces"), name.as_ref()),
            None => Vec::new(),
        };
        let rate = if unlimited {
            if let Some(n) = f.get("unit") {
                self.error(
                    n.pos,
                    &join(path, "unit"),
                    "must not be set when `unlimited: true`",
                );
            }
            None
        } else {
            self.rate(node, path, &f)
        };
        let shards = self.shards(&f, path, unlimited, rate);
        let lease = self.lease(&f, path, unlimited, rate);
        let overdraft = self.overdraft(&f, path, unlimited, shards, lease, rate);
        let global = self.global(&f, path, unlimited, shards, overdraft, rate);
        if self.problems.errors.len() > errors_before {
            return None;
        }
        Some(Limit {
            class: class
                .or_else(|| name.clone())
                .unwrap_or_else(|| at.keys.clone())
                .into(),
            stat_path: at.stat.clone().into(),
            name,
            rate,
            shadow_mode: inherited.shadow_mode,
            detailed_metric: inherited.detailed_metric,
            quota_mode,
            metadata: inherited.metadata.clone(),
            replaces,
            fallback,
            shards,
            lease,
            overdraft,
            global,
            // Set once the descriptor's limits are all read (`number_identical`).
            index: 0,
            origin: self.origin(node.pos),
            decisions: Default::default(),
        })
    }

    /// `shards: N`: at least 1, only on a token bucket or fixed window, and at most
    /// min(burst, requests_per_unit): the capacity and the refill are split so the shards add
    /// up to the limit, and a shard with no refill (or no capacity) would stay empty forever.
    fn shards(&mut self, f: &Fields<'_>, path: &str, unlimited: bool, rate: Option<Rate>) -> u32 {
        let Some(n) = f.get("shards") else { return 1 };
        let field = join(path, "shards");
        let AtLeastOne::Given(shards) = self.at_least_one(f, path, "shards", 1024) else {
            return 1;
        };
        if unlimited {
            self.error(n.pos, &field, "an unlimited limit has no bucket to shard");
        }
        match rate {
            // Unlimited, or a rate already refused with its own error.
            None => {}
            Some(r) if matches!(r.algorithm, Algorithm::SlidingWindow | Algorithm::SlidingLog) => self.error(
                n.pos,
                &field,
                "only applies to token_bucket and fixed_window (a sliding window's estimate, or a sliding log, cannot be split)",
            ),
            Some(r) if r.calendar.is_some() => self.error(
                n.pos,
                &field,
                "not with calendar: a calendar window is not split into shards",
            ),
            Some(r) => {
                let most = match r.algorithm {
                    Algorithm::TokenBucket => r.burst.min(u64::from(r.requests_per_unit)),
                    _ => u64::from(r.requests_per_unit),
                };
                if shards > most {
                    self.error(
                        n.pos,
                        &field,
                        format!(
                            "{shards} shards need at least one token of capacity and refill each; at most {most} here (min of burst and requests_per_unit)"
                        ),
                    );
                }
            }
        }
        shards as u32 // capped at 1024 by at_least_one
    }

    /// `lease: {max_batch, ttl_ms}`: only on a token bucket or fixed window (a sliding window
    /// cannot hand out tokens ahead of time; an unlimited limit has none to hand out).
    fn lease(
        &mut self,
        f: &Fields<'_>,
        path: &str,
        unlimited: bool,
        rate: Option<Rate>,
    ) -> Option<LeaseRule> {
        let n = f.get("lease")?;
        let field = join(path, "lease");
        let lf = yaml::fields(self.problems, n, &field, &["max_batch", "ttl_ms"])?;
        let max_batch = lf
            .get("max_batch")
            .and_then(|m| yaml::uint(self.problems, m, &join(&field, "max_batch"), 1_000_000));
        let ttl_ms = match self.at_least_one(&lf, &field, "ttl_ms", 3_600_000) {
            AtLeastOne::Given(v) => Some(v),
            _ => None,
        };
        if unlimited {
            self.error(n.pos, &field, "an unlimited limit has no tokens to lease");
        }
        match rate {
            Some(r) if matches!(r.algorithm, Algorithm::SlidingWindow | Algorithm::SlidingLog) => self.error(
                n.pos,
                &field,
                "only applies to token_bucket and fixed_window (a sliding window or log cannot hand out tokens ahead of time)",
            ),
            Some(r) if r.calendar.is_some() && max_batch != Some(0) => self.error(
                n.pos,
                &field,
                "not with calendar: a calendar window is not leased (global leasing passes it by)",
            ),
            _ => {}
        }
        Some(LeaseRule { max_batch, ttl_ms })
    }

    /// `overdraft: true`: a take that does not fit is charged anyway. Not on an unlimited
    /// limit (no balance), a sharded one (a charge one shard cannot hold would be lost to the
    /// others) or a leased one (leased tokens are spent from memory, which cannot go past
    /// zero); global leasing passes such limits by.
    fn overdraft(
        &mut self,
        f: &Fields<'_>,
        path: &str,
        unlimited: bool,
        shards: u32,
        lease: Option<LeaseRule>,
        rate: Option<Rate>,
    ) -> bool {
        let Some(n) = f.get("overdraft") else {
            return false;
        };
        let field = join(path, "overdraft");
        let Some(on) = yaml::bool(self.problems, n, &field) else {
            return false;
        };
        if !on {
            return false;
        }
        if unlimited {
            self.error(n.pos, &field, "an unlimited limit has no balance to charge");
        }
        if rate.is_some_and(|r| r.algorithm == Algorithm::SlidingLog) {
            self.error(
                n.pos,
                &field,
                "not with sliding_log: a log records admitted hits only (use sliding_window, fixed_window or token_bucket)",
            );
        }
        if shards > 1 {
            self.error(
                n.pos,
                &field,
                "not with shards: a charge that does not fit one shard would be lost to the others (drop `shards`)",
            );
        }
        if lease.is_some_and(|l| l.max_batch != Some(0)) {
            self.error(
                n.pos,
                &field,
                "not with lease: leased tokens are spent from memory, which cannot go into debt (drop `lease`; global leasing passes overdraft limits by)",
            );
        }
        true
    }

    /// `global: true`: one quota across regions, each region's bucket scaled to its share
    /// (`regions/`). A token bucket only (a share scales its capacity and refill, which a
    /// window's count cannot follow), whole (no shards), without overdraft (a debt would be
    /// owed to a share that moves) and never leased (leased tokens outlast a shrinking share;
    /// global leasing passes global limits by).
    fn global(
        &mut self,
        f: &Fields<'_>,
        path: &str,
        unlimited: bool,
        shards: u32,
        overdraft: bool,
        rate: Option<Rate>,
    ) -> bool {
        let leased = f.get("lease").is_some();
        let Some(n) = f.get("global") else {
            return false;
        };
        let field = join(path, "global");
        if !yaml::bool(self.problems, n, &field).unwrap_or(false) {
            return false;
        }
        let why = if unlimited {
            Some("an unlimited limit has nothing to share across regions".to_string())
        } else if let Some(r) = rate.filter(|r| r.algorithm != Algorithm::TokenBucket) {
            Some(format!(
                "only a token_bucket is shared across regions (a region's share scales its capacity and refill); this limit is {}",
                r.algorithm.name()
            ))
        } else if rate.is_some_and(|r| r.calendar.is_some()) {
            Some("a calendar window is not shared across regions (use a token bucket)".into())
        } else if shards > 1 {
            Some("not with shards: a region's share is one bucket (drop `shards`)".into())
        } else if overdraft {
            Some("not with overdraft: a debt would be owed to a share that moves".into())
        } else if leased {
            Some(
                "not with lease: leased tokens would outlast a share that shrinks (drop `lease`; global leasing passes global limits by)"
                    .into(),
            )
        } else {
            None
        };
        if let Some(why) = why {
            self.error(n.pos, &field, why);
        }
        true
    }

    /// A limit's `replaces: [{name: …}, …]`: the names of the limits it replaces (not its own).
    fn replaces(&mut self, node: &Node, field: &str, own_name: Option<&String>) -> Vec<String> {
        let mut replaces = Vec::new();
        for (i, item) in yaml::seq(self.problems, node, field)
            .unwrap_or(&[])
            .iter()
            .enumerate()
        {
            let item_path = format!("{field}[{i}]");
            let Some(rf) = yaml::fields(self.problems, item, &item_path, &["name"]) else {
                continue;
            };
            let replaced = rf
                .get("name")
                .and_then(|n| yaml::string(self.problems, n, &join(&item_path, "name")));
            match replaced {
                Some(r) if r.is_empty() => self.error(
                    item.pos,
                    &item_path,
                    "a replaces entry needs a non-empty name",
                ),
                None if !rf.contains_key("name") => self.error(
                    item.pos,
                    &item_path,
                    "a replaces entry needs a non-empty name",
                ),
                Some(r) if Some(&r) == own_name => self.error(
                    item.pos,
                    &item_path,
                    format!("a limit cannot replace itself ('{r}')"),
                ),
                Some(r) => replaces.push(r),
                None => {}
            }
        }
        replaces
    }

    /// The numbers of a counted limit (not `unlimited`), with defaults resolved.
    fn rate(&mut self, node: &Node, path: &str, f: &Fields<'_>) -> Option<Rate> {
        let unit = match f.get("unit") {
            None => {
                self.error(
                    node.pos,
                    &join(path, "unit"),
                    "missing (second, minute, hour, day, week, month or year)",
                );
                None
            }
            Some(n) => {
                let s = yaml::string(self.problems, n, &join(path, "unit"))?;
                let unit = Unit::parse(&s);
                if unit.is_none() {
                    self.error(
                        n.pos,
                        &join(path, "unit"),
                        format!("unknown unit '{s}' (expected second, minute, hour, day, week, month or year)"),
                    );
                }
                unit
            }
        };
        let rpu = match f.get("requests_per_unit") {
            None => {
                self.error(
                    node.pos,
                    &join(path, "requests_per_unit"),
                    "missing (or set `unlimited: true`)",
                );
                None
            }
            Some(n) => yaml::uint(
                self.problems,
                n,
                &join(path, "requests_per_unit"),
                u64::from(u32::MAX),
            ),
        };
        let algorithm = match f.get("algorithm") {
            None => Some(self.opts.default_algorithm),
            Some(n) => {
                let s = yaml::string(self.problems, n, &join(path, "algorithm"))?;
                let a = Algorithm::parse(&s);
                if a.is_none() {
                    self.error(
                        n.pos,
                        &join(path, "algorithm"),
                        format!("unknown algorithm '{s}' (expected {})", Algorithm::NAMES),
                    );
                }
                a
            }
        };
        let burst = self.at_least_one(f, path, "burst", u64::from(u32::MAX));
        let multiplier = self.at_least_one(f, path, "unit_multiplier", 1_000_000);
        let calendar = match f.get("calendar") {
            None => Ok(None),
            Some(n) => self.calendar(n, path, unit),
        };
        // A calendar window is a fixed window: it is the algorithm unless another is named.
        let algorithm = match (&calendar, f.get("algorithm")) {
            (Ok(Some(_)), None) => Some(Algorithm::FixedWindow),
            _ => algorithm,
        };
        let (Some(unit), Some(rpu), Some(algorithm), Ok(calendar)) =
            (unit, rpu, algorithm, calendar)
        else {
            return None;
        };
        let (burst, multiplier) = match (burst, multiplier) {
            (AtLeastOne::Refused, _) | (_, AtLeastOne::Refused) => return None,
            (burst, multiplier) => (burst.given(), multiplier.given()),
        };
        if calendar.is_some() {
            // One calendar unit per window, counted as a fixed window.
            if algorithm != Algorithm::FixedWindow
                && let Some(n) = f.get("algorithm")
            {
                self.error(
                    n.pos,
                    &join(path, "algorithm"),
                    "a calendar window is a fixed window: use algorithm fixed_window (or leave it out)",
                );
                return None;
            }
            if multiplier.is_some_and(|m| m != 1)
                && let Some(n) = f.get("unit_multiplier")
            {
                self.error(
                    n.pos,
                    &join(path, "unit_multiplier"),
                    "a calendar window is one day, week, month or year: leave unit_multiplier out",
                );
                return None;
            }
        }
        if burst.is_some()
            && algorithm != Algorithm::TokenBucket
            && let Some(n) = f.get("burst")
        {
            self.error(
                n.pos,
                &join(path, "burst"),
                "only applies to algorithm token_bucket",
            );
            return None;
        }
        // A log keeps every admitted hit of its window: memory grows with the limit.
        let most = self.opts.sliding_log_max_limit;
        if algorithm == Algorithm::SlidingLog
            && rpu > most
            && let Some(n) = f.get("requests_per_unit")
        {
            self.error(
                n.pos,
                &join(path, "requests_per_unit"),
                format!(
                    "{rpu} is above sliding_log_max_limit ({most}): a sliding log keeps every admitted hit of its window (about 130 bytes each in Redis); use sliding_window for large limits, or raise the setting"
                ),
            );
            return None;
        }
        // A bucket that never refills is dropped once idle and would come back full: with no
        // refill there is nothing a burst could mean but "a few, now and then". Refuse it.
        if rpu == 0
            && burst.is_some()
            && let Some(n) = f.get("burst")
        {
            self.error(
                n.pos,
                &join(path, "burst"),
                "needs requests_per_unit above 0 (0 denies everything)",
            );
            return None;
        }
        Some(Rate {
            requests_per_unit: rpu as u32, // uint() capped it at u32::MAX
            unit,
            unit_multiplier: multiplier.unwrap_or(1) as u32, // capped at 1_000_000
            burst: burst.unwrap_or(rpu),
            algorithm,
            calendar,
        })
    }

    /// `calendar: utc` (or `true`, or an offset such as `+09:00`): the fixed window is a
    /// calendar day, ISO week, month or year (`quota/calendar.rs`), of a unit of a day or
    /// longer. `Err`: refused, with the error recorded.
    fn calendar(
        &mut self,
        n: &Node,
        path: &str,
        unit: Option<Unit>,
    ) -> Result<Option<Calendar>, ()> {
        let field = join(path, "calendar");
        let s = yaml::string(self.problems, n, &field).ok_or(())?;
        let offset_min = match s.as_str() {
            "false" => return Ok(None),
            "true" => 0,
            other => match Calendar::parse_offset(other) {
                Ok(o) => o,
                Err(e) => {
                    self.error(n.pos, &field, e);
                    return Err(());
                }
            },
        };
        let Some(unit) = unit else {
            return Err(()); // refused with its own error
        };
        let unit = match unit {
            Unit::Day => Some(CalendarUnit::Day),
            Unit::Week => Some(CalendarUnit::Week),
            Unit::Month => Some(CalendarUnit::Month),
            Unit::Year => Some(CalendarUnit::Year),
            Unit::Second | Unit::Minute | Unit::Hour => None,
        };
        let Some(unit) = unit else {
            self.error(
                n.pos,
                &field,
                "calendar windows are days, weeks, months or years: use one of those units (a second, minute or hour window is aligned already)",
            );
            return Err(());
        };
        Ok(Some(Calendar { unit, offset_min }))
    }

    fn at_least_one(&mut self, f: &Fields<'_>, path: &str, name: &str, max: u64) -> AtLeastOne {
        let Some(n) = f.get(name) else {
            return AtLeastOne::Absent;
        };
        match yaml::uint(self.problems, n, &join(path, name), max) {
            None => AtLeastOne::Refused,
            Some(0) => {
                self.error(n.pos, &join(path, name), "must be at least 1");
                AtLeastOne::Refused
            }
            Some(v) => AtLeastOne::Given(v),
        }
    }
}

impl AtLeastOne {
    /// The value when given; only called once `Refused` is ruled out.
    fn given(self) -> Option<u64> {
        match self {
            AtLeastOne::Given(v) => Some(v),
            AtLeastOne::Absent | AtLeastOne::Refused => None,
        }
    }
}

/// Numbers the limits of one descriptor that have the same algorithm and window
/// ([`Rate::identity`]): the store key names a limit by them (`keys::bucket_key`), so
/// inserting, removing or reordering other limits, or editing a limit's numbers, and
/// reloading keeps each limit's bucket; only limits alike in algorithm and window need their
/// order to tell them apart (the second of two gets `index` 1).
fn same_identity(limits: &mut [Limit]) {
    for i in 0..limits.len() {
        let Some(rate) = limits[i].rate else { continue };
        let before = limits[..i]
            .iter()
            .filter(|l| l.rate.is_some_and(|r| r.identity() == rate.identity()))
            .count();
        limits[i].index = before;
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::super::tests::{load, refused};
    use crate::rules::LoadOptions;
    use crate::rules::load::load_sources;
    use crate::rules::model::Algorithm;

    #[test]
    fn extensions_resolve_defaults() {
        let set = load(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 10, burst: 20, class: burst}\n      - {unit: minute, requests_per_unit: 0, unit_multiplier: 5, algorithm: fixed_window}\n      - {unit: hour, requests_per_unit: 7, algorithm: sliding_window}\n",
        )
        .unwrap();
        let k = &set.domains["d"].root.bare["k"];
        let (a, b) = (k.limits[0].rate.unwrap(), k.limits[1].rate.unwrap());
        assert_eq!(
            (a.burst, a.algorithm, &*k.limits[0].class),
            (20, Algorithm::TokenBucket, "burst")
        );
        assert_eq!(
            (b.window_ms(), b.algorithm, k.limits[1].index),
            (300_000, Algorithm::FixedWindow, 0),
            "the first limit with these numbers"
        );
        let c = k.limits[2].rate.unwrap();
        assert_eq!(
            (c.window_ms(), c.algorithm, c.requests_per_unit),
            (3_600_000, Algorithm::SlidingWindow, 7)
        );
    }

    #[test]
    fn default_algorithm_applies_to_limits_without_one() {
        let src = [(PathBuf::from("r.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n".to_string())];
        let set = load_sources(
            &src,
            LoadOptions {
                default_algorithm: Algorithm::FixedWindow,
                ..LoadOptions::default()
            },
        )
        .unwrap();
        assert_eq!(
            set.domains["d"].root.bare["k"].limits[0]
                .rate
                .unwrap()
                .algorithm,
            Algorithm::FixedWindow
        );
    }

    /// The reference reads an empty `rate_limit:` as no limit; an empty field inside a limit is
    /// refused at its own line, not the next one.
    #[test]
    fn an_empty_rate_limit_is_no_limit_and_empty_fields_are_refused_at_their_line() {
        for empty in ["", " ~", " null"] {
            let set = load(&format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:{empty}\n  - key: j\n    rate_limits:{empty}\n    descriptors:\n      - key: c\n        rate_limit: {{unit: second, requests_per_unit: 1}}\n"
            ))
            .unwrap();
            let root = &set.domains["d"].root.bare;
            assert!(root["k"].limits.is_empty(), "{empty:?}");
            assert!(root["j"].limits.is_empty(), "{empty:?}");
            assert_eq!(root["j"].children.bare["c"].limits.len(), 1);
        }
        let (line, field, msg) = refused(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit:\n      requests_per_unit: 1\n",
        );
        assert_eq!(
            (line, field.as_str()),
            (5, "descriptors[0].rate_limit.unit"),
            "{msg}"
        );
    }

    #[test]
    fn refuses_bad_units_and_counts() {
        let base = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n";
        let (line, field, msg) = refused(&format!(
            "{base}      unit: minutes\n      requests_per_unit: 1\n"
        ));
        assert_eq!(
            (line, field.as_str()),
            (5, "descriptors[0].rate_limit.unit")
        );
        assert!(msg.contains("unknown unit 'minutes'"), "{msg}");
        let (line, _, msg) = refused(&format!(
            "{base}      unit: second\n      requests_per_unit: -5\n"
        ));
        assert_eq!(line, 6);
        assert!(msg.contains("negative"), "{msg}");
        let (line, field, msg) = refused(&format!("{base}      unit: second\n"));
        assert_eq!(
            (line, field.as_str()),
            (5, "descriptors[0].rate_limit.requests_per_unit")
        );
        assert!(msg.contains("missing"), "{msg}");
        let (line, _, msg) = refused(&format!(
            "{base}      unit: second\n      requests_per_unit: 4294967296\n"
        ));
        assert_eq!(line, 6);
        assert!(msg.contains("too large"), "{msg}");
        let (line, _, _) = refused(&format!(
            "{base}      unit: second\n      requests_per_unit: ten\n"
        ));
        assert_eq!(line, 6);
        let (line, _, msg) = refused(&format!(
            "{base}      unit: second\n      requests_per_unit: 0\n      burst: 5\n"
        ));
        assert_eq!(line, 7);
        assert!(msg.contains("requests_per_unit above 0"), "{msg}");
        let (line, _, msg) = refused(&format!(
            "{base}      unit: second\n      requests_per_unit: 1\n      burst: 0\n"
        ));
        assert_eq!(line, 7);
        assert!(msg.contains("at least 1"), "{msg}");
        // `burst` is a token-bucket capacity: a window algorithm refuses it.
        for algorithm in ["fixed_window", "sliding_window"] {
            let (line, field, msg) = refused(&format!(
                "{base}      unit: second\n      requests_per_unit: 1\n      algorithm: {algorithm}\n      burst: 5\n"
            ));
            assert_eq!(
                (line, field.as_str()),
                (8, "descriptors[0].rate_limit.burst")
            );
            assert!(msg.contains("token_bucket"), "{msg}");
        }
        let (line, _, msg) = refused(&format!(
            "{base}      unit: second\n      requests_per_unit: 1\n      algorithm: leaky_bucket\n"
        ));
        assert_eq!(line, 7);
        assert!(
            msg.contains("expected token_bucket, fixed_window, sliding_window or sliding_log"),
            "{msg}"
        );
        // `unlimited` needs no requests_per_unit but refuses a unit.
        assert!(load(&format!("{base}      unlimited: true\n")).is_ok());
        let (line, field, msg) = refused(&format!(
            "{base}      unlimited: true\n      unit: second\n"
        ));
        assert_eq!(
            (line, field.as_str()),
            (6, "descriptors[0].rate_limit.unit")
        );
        assert!(msg.contains("unlimited"), "{msg}");
    }

    #[test]
    fn refuses_bad_replaces() {
        let base = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      name: one\n      replaces:\n";
        let (line, _, msg) = refused(&format!("{base}        - name: one\n"));
        assert_eq!(line, 9);
        assert!(msg.contains("itself"), "{msg}");
        let (line, _, msg) = refused(&format!("{base}        - name: \"\"\n"));
        assert_eq!(line, 9);
        assert!(msg.contains("non-empty"), "{msg}");
        let (line, _, _) = refused(&format!("{base}        - {{}}\n"));
        assert_eq!(line, 9);
    }

    #[test]
    fn sliding_log_is_capped_and_refuses_what_it_cannot_do() {
        let set = load("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 10000, algorithm: sliding_log}\n").unwrap();
        let r = set.domains["d"].root.bare["k"].limits[0].rate.unwrap();
        assert_eq!(r.algorithm, Algorithm::SlidingLog);
        let base = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      algorithm: sliding_log\n";
        let (line, field, msg) = refused(&format!("{base}      requests_per_unit: 10001\n"));
        assert_eq!(
            (line, field.as_str()),
            (7, "descriptors[0].rate_limit.requests_per_unit")
        );
        assert!(msg.contains("sliding_log_max_limit (10000)"), "{msg}");
        for (extra, field, needle) in [
            ("shards: 2", "shards", "cannot be split"),
            ("lease: {max_batch: 5}", "lease", "ahead of time"),
            ("overdraft: true", "overdraft", "admitted hits only"),
            ("burst: 20", "burst", "token_bucket"),
        ] {
            let (_, got, msg) = refused(&format!(
                "{base}      requests_per_unit: 10\n      {extra}\n"
            ));
            assert_eq!(got, format!("descriptors[0].rate_limit.{field}"), "{extra}");
            assert!(msg.contains(needle), "{extra}: {msg}");
        }
        // The cap is a setting.
        let src = [(
            PathBuf::from("r.yaml"),
            format!("{base}      requests_per_unit: 20000\n"),
        )];
        let opts = LoadOptions {
            sliding_log_max_limit: 50_000,
            ..LoadOptions::default()
        };
        assert!(load_sources(&src, opts).is_ok());
    }

    #[test]
    fn calendar_windows_are_read_and_refused_where_they_mean_nothing() {
        use crate::rules::{Calendar, CalendarUnit};
        let set = load(
            "domain: d\ndescriptors:\n  - key: m\n    rate_limit: {unit: month, requests_per_unit: 10000, calendar: utc}\n  - key: t\n    rate_limit: {unit: Day, requests_per_unit: 5, algorithm: fixed_window, calendar: \"+09:00\", overdraft: true}\n  - key: w\n    rate_limit: {unit: week, requests_per_unit: 5, calendar: true, lease: {max_batch: 0}}\n  - key: off\n    rate_limit: {unit: year, requests_per_unit: 5, calendar: false}\n",
        )
        .unwrap();
        let rate = |k: &str| set.domains["d"].root.bare[k].limits[0].rate.unwrap();
        let m = rate("m");
        assert_eq!(
            m.algorithm,
            Algorithm::FixedWindow,
            "calendar implies the fixed window"
        );
        assert_eq!(
            m.calendar,
            Some(Calendar {
                unit: CalendarUnit::Month,
                offset_min: 0
            })
        );
        assert_eq!(rate("t").calendar.unwrap().offset_min, 540);
        assert_eq!(rate("w").calendar.unwrap().unit, CalendarUnit::Week);
        assert_eq!(rate("off").calendar, None);
        assert_ne!(
            m.identity(),
            crate::rules::Rate {
                calendar: None,
                ..m
            }
            .identity(),
            "its own bucket"
        );

        let base =
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      requests_per_unit: 10\n";
        for (extra, field, needle) in [
            (
                "      unit: hour\n      calendar: utc\n",
                "calendar",
                "days, weeks, months or years",
            ),
            (
                "      unit: month\n      calendar: Europe/Berlin\n",
                "calendar",
                "daylight saving",
            ),
            (
                "      unit: month\n      calendar: \"+19:00\"\n",
                "calendar",
                "+09:00",
            ),
            (
                "      unit: month\n      calendar: utc\n      algorithm: token_bucket\n",
                "algorithm",
                "fixed window",
            ),
            (
                "      unit: month\n      calendar: utc\n      unit_multiplier: 3\n",
                "unit_multiplier",
                "leave unit_multiplier out",
            ),
            (
                "      unit: month\n      calendar: utc\n      shards: 2\n",
                "shards",
                "not with calendar",
            ),
            (
                "      unit: month\n      calendar: utc\n      lease: {max_batch: 5}\n",
                "lease",
                "not with calendar",
            ),
        ] {
            let (_, got, msg) = refused(&format!("{base}{extra}"));
            assert_eq!(got, format!("descriptors[0].rate_limit.{field}"), "{extra}");
            assert!(msg.contains(needle), "{extra}: {msg}");
        }
        let err = load("domain: d\nrlqs: true\ndescriptors:\n  - key: a\n    rate_limit: {unit: month, requests_per_unit: 10, calendar: utc}\n")
            .expect_err("rlqs");
        assert!(
            err.to_string()
                .contains("calendar window cannot be claimed"),
            "{err}"
        );
    }

    #[test]
    fn overdraft_is_read_and_refused_beside_unlimited_shards_and_lease() {
        let set = load(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100, overdraft: true}\n  - key: f\n    rate_limits:\n      - {unit: day, requests_per_unit: 10, algorithm: fixed_window, overdraft: true, lease: {max_batch: 0}}\n      - {unit: day, requests_per_unit: 10, algorithm: sliding_window, overdraft: false}\n",
        )
        .unwrap();
        let root = &set.domains["d"].root;
        assert!(root.bare["k"].limits[0].overdraft);
        let f = &root.bare["f"].limits;
        assert!(f[0].overdraft && !f[1].overdraft);
        let base = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n";
        for (extra, needle) in [
            ("      unlimited: true\n", "no balance"),
            (
                "      unit: second\n      requests_per_unit: 10\n      shards: 2\n",
                "shards",
            ),
            (
                "      unit: second\n      requests_per_unit: 10\n      lease: {ttl_ms: 100}\n",
                "lease",
            ),
            (
                "      unit: second\n      requests_per_unit: 10\n      lease: {max_batch: 5}\n",
                "lease",
            ),
        ] {
            let (_, field, msg) = refused(&format!("{base}{extra}      overdraft: true\n"));
            assert_eq!(field, "descriptors[0].rate_limit.overdraft", "{extra}");
            assert!(msg.contains(needle), "{extra}: {msg}");
        }
        let (_, field, _) = refused(&format!(
            "{base}      unit: second\n      requests_per_unit: 1\n      overdraft: maybe\n"
        ));
        assert_eq!(field, "descriptors[0].rate_limit.overdraft");
    }

    #[test]
    fn global_is_read_and_refused_where_a_share_cannot_apply() {
        let set = load(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1000, global: true}\n  - key: f\n    rate_limit: {unit: minute, requests_per_unit: 10, global: false}\n",
        )
        .unwrap();
        let root = &set.domains["d"].root;
        assert!(root.bare["k"].limits[0].global && !root.bare["f"].limits[0].global);
        assert!(set.has_global_limits());
        let base = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n";
        for (extra, needle) in [
            ("      unlimited: true\n", "nothing to share"),
            (
                "      unit: second\n      requests_per_unit: 10\n      algorithm: fixed_window\n",
                "fixed_window",
            ),
            (
                "      unit: month\n      requests_per_unit: 10\n      calendar: utc\n",
                "token_bucket",
            ),
            (
                "      unit: second\n      requests_per_unit: 10\n      shards: 2\n",
                "shards",
            ),
            (
                "      unit: second\n      requests_per_unit: 10\n      overdraft: true\n",
                "overdraft",
            ),
            (
                "      unit: second\n      requests_per_unit: 10\n      lease: {max_batch: 5}\n",
                "lease",
            ),
        ] {
            let (_, field, msg) = refused(&format!("{base}{extra}      global: true\n"));
            assert_eq!(field, "descriptors[0].rate_limit.global", "{extra}");
            assert!(msg.contains(needle), "{extra}: {msg}");
        }
        let (_, field, _) = refused(&format!(
            "{base}      unit: second\n      requests_per_unit: 1\n      global: yes-please\n"
        ));
        assert_eq!(field, "descriptors[0].rate_limit.global");
    }

    #[test]
    fn shards_and_lease_are_read_and_checked() {
        let set = load(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100, shards: 4, lease: {max_batch: 20, ttl_ms: 500}}\n  - key: f\n    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: fixed_window, lease: {max_batch: 0}}\n",
        )
        .unwrap();
        let k = &set.domains["d"].root.bare["k"].limits[0];
        assert_eq!(k.shards, 4);
        assert_eq!(
            k.lease,
            Some(crate::rules::LeaseRule {
                max_batch: Some(20),
                ttl_ms: Some(500)
            })
        );
        let f = &set.domains["d"].root.bare["f"].limits[0];
        assert_eq!((f.shards, f.lease.unwrap().max_batch), (1, Some(0)));

        let base = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n";
        // More shards than tokens of refill or capacity: a shard would stay empty.
        let (line, field, msg) = refused(&format!(
            "{base}      unit: second\n      requests_per_unit: 10\n      burst: 3\n      shards: 4\n"
        ));
        assert_eq!(
            (line, field.as_str()),
            (8, "descriptors[0].rate_limit.shards")
        );
        assert!(msg.contains("at most 3"), "{msg}");
        let (line, _, msg) = refused(&format!(
            "{base}      unit: second\n      requests_per_unit: 1\n      shards: 0\n"
        ));
        assert_eq!(line, 7);
        assert!(msg.contains("at least 1"), "{msg}");
        for field in ["shards: 2", "lease: {max_batch: 5}"] {
            let (line, _, msg) = refused(&format!(
                "{base}      unit: second\n      requests_per_unit: 10\n      algorithm: sliding_window\n      {field}\n"
            ));
            assert_eq!(line, 8, "{field}");
            assert!(msg.contains("token_bucket and fixed_window"), "{msg}");
            let (line, _, msg) = refused(&format!("{base}      unlimited: true\n      {field}\n"));
            assert_eq!(line, 6, "{field}");
            assert!(msg.contains("unlimited"), "{msg}");
        }
        let (line, field, msg) = refused(&format!(
            "{base}      unit: second\n      requests_per_unit: 1\n      lease: {{max_batch: 5, size: 3}}\n"
        ));
        assert_eq!(
            (line, field.as_str()),
            (7, "descriptors[0].rate_limit.lease.size")
        );
        assert!(msg.contains("unknown field"), "{msg}");
        let (line, _, msg) = refused(&format!(
            "{base}      unit: second\n      requests_per_unit: 1\n      lease: {{ttl_ms: 0}}\n"
        ));
        assert_eq!(line, 7);
        assert!(msg.contains("at least 1"), "{msg}");
    }
}
