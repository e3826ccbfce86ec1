//! The loaded, validated rules: what a request's descriptors are matched against.
//!
//! The loader (`load.rs`, through the walk in `validate/`) builds these from YAML and the
//! matcher (`matcher.rs`) walks them; nothing here parses or matches. A [`RuleSet`] is
//! immutable once built: a reload builds a new one and swaps it in whole.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use prometheus_client::metrics::counter::Counter;
use serde::{Deserialize, Serialize};

use crate::quota::calendar::Calendar;
use crate::telemetry::Outcome;

/// A time unit as envoyproxy/ratelimit spells it (case-insensitive in files).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// Length in seconds, as in the reference (a month is 30 days, a year 365).
    pub fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// `envoy.type.v3.RateLimitUnit` / `RateLimitResponse.RateLimit.Unit` numbers (both
    /// enums agree: 1 second … 6 year, 7 week); 0 (unknown) and others are `None`.
    pub fn from_proto(n: i32) -> Option<Unit> {
        match n {
            1 => Some(Unit::Second),
            2 => Some(Unit::Minute),
            3 => Some(Unit::Hour),
            4 => Some(Unit::Day),
            5 => Some(Unit::Month),
            6 => Some(Unit::Year),
            7 => Some(Unit::Week),
            _ => None,
        }
    }

    pub fn parse(s: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(s))
    }
}

/// Settings that shape how rules are read.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// The algorithm of a limit that does not name one.
    pub default_algorithm: Algorithm,
    /// The largest `requests_per_unit` of a `sliding_log` limit (it keeps every hit).
    pub sliding_log_max_limit: u64,
    /// `rlqs_report_interval_ms`: an `rlqs: true` domain's token buckets must hold what
    /// refills in one report interval.
    pub rlqs_report_interval_ms: u64,
}

/// The default of `sliding_log_max_limit`: a full log of this many hits is a few hundred KB
/// in Redis (docs/rules.md, the sliding log).
pub const SLIDING_LOG_MAX_LIMIT: u64 = 10_000;

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            default_algorithm: Algorithm::default(),
            sliding_log_max_limit: SLIDING_LOG_MAX_LIMIT,
            rlqs_report_interval_ms: RLQS_REPORT_INTERVAL_MS,
        }
    }
}

/// The default of `rlqs_report_interval_ms`: Envoy 1.40's filter reports every 5 s, whatever
/// its `reporting_interval` says (envoyproxy/envoy#46033).
pub const RLQS_REPORT_INTERVAL_MS: u64 = 5_000;

/// How a limit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// Capacity `burst`, refilled smoothly at `requests_per_unit` per window. The default.
    #[default]
    TokenBucket,
    /// At most `requests_per_unit` per epoch-aligned window (the reference's behaviour).
    FixedWindow,
    /// At most `requests_per_unit` in any window-long span, estimated from the counts of the
    /// current and the previous epoch-aligned window (no double burst at a window edge).
    SlidingWindow,
    /// At most `requests_per_unit` in any window-long span, exactly: every admitted hit is
    /// kept with its time (memory grows with the limit).
    SlidingLog,
}

/// A name that is not one of [`Algorithm::NAMES`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown algorithm '{0}' ({names})", names = Algorithm::NAMES)]
pub struct UnknownAlgorithm(pub String);

impl std::str::FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::parse(s).ok_or_else(|| UnknownAlgorithm(s.to_string()))
    }
}

impl Algorithm {
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindow => "sliding_window",
            Algorithm::SlidingLog => "sliding_log",
        }
    }

    pub const ALL: [Algorithm; 4] = [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ];

    /// The accepted names, for error messages.
    pub const NAMES: &'static str = "token_bucket, fixed_window, sliding_window or sliding_log";

    pub fn parse(s: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == s)
    }

    /// A short tag that goes into store keys, so two algorithms never share a bucket.
    pub fn key_tag(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "tb",
            Algorithm::FixedWindow => "fw",
            Algorithm::SlidingWindow => "sw",
            Algorithm::SlidingLog => "sl",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a rule was declared, for errors, logs and `/config`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Origin {
    pub file: PathBuf,
    pub line: usize,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// One rate limit, fully resolved (defaults applied).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Limit {
    /// The reference's `name` (used by `replaces` and reported in `current_limit.name`).
    pub name: Option<String>,
    /// `None` for `unlimited: true`.
    pub rate: Option<Rate>,
    /// Per-rule shadow mode: an over-limit decision is reported as OK (and counted).
    pub shadow_mode: bool,
    /// The descriptor's `detailed_metric`: label metrics with the request's values too.
    pub detailed_metric: bool,
    /// The descriptor's (or the limit's own) `quota_mode`, as in the reference: over this
    /// limit, the request is still OK unless a limit without it is over too, or every
    /// quota-mode limit of the request is (`limiter/status.rs`).
    pub quota_mode: bool,
    /// The descriptor's `metadata` (a JSON object), returned in the response's dynamic
    /// metadata when the descriptor passes and `response_dynamic_metadata` is on.
    pub metadata: Option<Arc<serde_json::Value>>,
    /// Names of other limits this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// `fallback:` — what this limit does while the store cannot answer (else the global
    /// `fallback` setting).
    pub fallback: Option<FallbackMode>,
    /// `shards:` — how many sub-buckets the bucket is split into (1 = not sharded), so a hot
    /// key's load spreads over several Redis Cluster slots (`limiter/shard.rs`).
    pub shards: u32,
    /// `lease:` — this limit's token-leasing override (else the global `lease_*` settings).
    pub lease: Option<LeaseRule>,
    /// `overdraft: true` — a take that does not fit is charged anyway (and refused): usage
    /// known only when a response ends is never lost; the bucket goes into debt, at most one
    /// limit deep (`quota/bucket/`). Never leased or sharded.
    pub overdraft: bool,
    /// `global: true` — one quota across regions (`regions/`): each region's bucket holds the
    /// share of the limit that region is allotted by demand, exchanged through the global
    /// store. Without `global_store` set it is an ordinary limit. Token buckets only.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub global: bool,
    /// The metrics label for this limit: `class`, else `name`, else the key path. An `Arc`
    /// so each decision's metric labels share it instead of copying it.
    pub class: Arc<str>,
    /// The reference's stats path of this limit: one segment per level of its rule, `key` or
    /// `key_value` (`["tenant_acme", "endpoint"]`); statsd names are made from it
    /// (`telemetry/statsd/`).
    #[serde(skip)]
    pub stat_path: Arc<[String]>,
    /// How many limits before this one on its descriptor have the same algorithm and window
    /// ([`Rate::identity`]): 0 for nearly every limit. The store key names a limit by those
    /// and this count, not by its numbers nor its position, so a rules edit that changes its
    /// numbers, or inserts, removes or reorders other limits, keeps this one's bucket.
    pub index: usize,
    pub origin: Origin,
    /// This limit's `tollgate_decisions_total` series, kept with it.
    #[serde(skip)]
    pub decisions: DecisionSeries,
}

/// A limit's series of `tollgate_decisions_total`, one per outcome, each made on first use and
/// kept with the limit (as envoyproxy/ratelimit keeps each rule's stats with the rule): a
/// decision counts itself without hashing its domain and class into the family, which was a
/// measurable part of a request's cost on the memory store. They are the family's own series
/// (a `Counter` clone shares its count), made for the limit's own class (a `detailed_metric`
/// class goes to the family) and the first domain it counts under (another domain, too).
/// Not part of what the limit is: a clone starts empty, any two compare equal.
#[derive(Default)]
pub struct DecisionSeries {
    domain: OnceLock<Arc<str>>,
    counters: [OnceLock<Counter>; Outcome::COUNT],
}

impl DecisionSeries {
    /// The series of `outcome` under `domain`, made by `make` the first time; `None` when
    /// this limit's series were made for another domain.
    pub fn get(
        &self,
        domain: &Arc<str>,
        outcome: Outcome,
        make: impl FnOnce() -> Counter,
    ) -> Option<&Counter> {
        let mine = self.domain.get_or_init(|| domain.clone());
        if !Arc::ptr_eq(mine, domain) && **mine != **domain {
            return None;
        }
        // An outcome past `COUNT` (one added after `refund`) goes to the family.
        Some(self.counters.get(outcome as usize)?.get_or_init(make))
    }
}

impl Clone for DecisionSeries {
    fn clone(&self) -> Self {
        DecisionSeries::default()
    }
}

impl PartialEq for DecisionSeries {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl fmt::Debug for DecisionSeries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DecisionSeries")
    }
}

/// A limit's `lease: {max_batch, ttl_ms}`; a field left out takes the global setting
/// (`lease_max_batch`, `lease_ttl_ms`). `max_batch: 0` turns leasing off for the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LeaseRule {
    pub max_batch: Option<u64>,
    pub ttl_ms: Option<u64>,
}

/// The numbers of a counted (not unlimited) limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Rate {
    pub requests_per_unit: u32,
    pub unit: Unit,
    /// The window is `unit_multiplier` units long (e.g. 5 × minute).
    pub unit_multiplier: u32,
    /// Token-bucket capacity; defaults to `requests_per_unit`.
    pub burst: u64,
    pub algorithm: Algorithm,
    /// `calendar:` — a fixed window aligned to the civil calendar (a day, ISO week, month or
    /// year at UTC or a fixed offset) instead of to the epoch; `window_ms` is then its nominal
    /// length (the reference's: a month is 30 days), for what only needs a scale.
    pub calendar: Option<Calendar>,
}

impl Rate {
    pub fn window_ms(&self) -> u64 {
        self.unit.seconds() * 1000 * u64::from(self.unit_multiplier)
    }

    /// What a limit's state means, so what names its bucket (`keys::bucket_key`): the
    /// algorithm, the window and the calendar of a calendar window. Not `requests_per_unit`
    /// nor `burst`: an edit of those keeps the bucket and what it spent (docs/rules.md, "What
    /// a rules edit keeps"); an edit of these starts a fresh one.
    pub fn identity(&self) -> (Algorithm, u64, Option<Calendar>) {
        (self.algorithm, self.window_ms(), self.calendar)
    }
}

/// One level of the descriptor tree: the children of a domain or of a descriptor.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Level {
    /// `key` → exact `value` → node (two levels so a lookup borrows the request's strings).
    pub exact: HashMap<String, HashMap<String, Arc<Descriptor>>>,
    /// `key` + a value containing `*`, in declaration order (the first match wins).
    pub wildcard: Vec<(String, String, Arc<Descriptor>)>,
    /// `key` without a value: any value of that key.
    pub bare: HashMap<String, Arc<Descriptor>>,
}

impl Level {
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcard.is_empty() && self.bare.is_empty()
    }

    /// Every node of this level (exact, wildcard, bare), in the order the file declares them.
    pub fn in_file_order(&self) -> Vec<&Descriptor> {
        let mut nodes: Vec<&Descriptor> = self
            .exact
            .values()
            .flat_map(|m| m.values())
            .chain(self.wildcard.iter().map(|(_, _, d)| d))
            .chain(self.bare.values())
            .map(|d| &**d)
            .collect();
        nodes.sort_by_key(|d| d.origin.line);
        nodes
    }
}

/// A declared descriptor node.
#[derive(Clone, Debug, PartialEq)]
pub struct Descriptor {
    pub key: String,
    pub value: Option<String>,
    /// Empty when the node only groups children (or means "no limit").
    pub limits: Vec<Arc<Limit>>,
    /// With a wildcard value: every matching value shares one bucket.
    pub share_threshold: bool,
    /// Label metrics with this descriptor's full key path and values (opt-in cardinality).
    pub detailed_metric: bool,
    /// `value_to_metric`: the request's value for this descriptor's key joins the metrics
    /// class of the limit matched through it (`limiter/status.rs`).
    pub value_to_metric: bool,
    /// `charge_parent: true`: the parent's limits (shared with it), charged on the parent's
    /// buckets by a request that matches this node. A take here is a charge (`overdraft`'s:
    /// counted even when it does not fit), a refund gives back: what a reservation's
    /// stream-done call does (docs/usage-costs.md, "Reserve, then commit"). Such a node has
    /// no limits of its own.
    pub charge_parent: Option<Vec<Arc<Limit>>>,
    /// The key of a child with `charge_parent` (the first in the file, if several), which
    /// settles this node's takes: they are
    /// reservations, so on a fixed window (calendar or not) a refused one counts nothing
    /// (`Action::Reserve`), and one that passed is answered with a receipt under this key
    /// (`limiter/receipt.rs`).
    pub settled_by: Option<String>,
    pub children: Level,
    pub origin: Origin,
}

impl Descriptor {
    /// Whether a `charge_parent` child settles this node's takes (see `settled_by`).
    pub fn reserved(&self) -> bool {
        self.settled_by.is_some()
    }

    /// The limits a request matching this node is counted against: its own, or with
    /// `charge_parent` its parent's.
    pub fn counted_limits(&self) -> &[Arc<Limit>] {
        self.charge_parent.as_deref().unwrap_or(&self.limits)
    }
}

/// A domain: a namespace of descriptors, one per rules file.
#[derive(Clone, Debug, PartialEq)]
pub struct Domain {
    /// An `Arc` so each decision's metric labels share it instead of copying it.
    pub name: Arc<str>,
    pub root: Level,
    pub origin: Origin,
    /// `rlqs: true`: Envoy's `rate_limit_quota` filter may be assigned this domain's quotas
    /// (`rlqs/`); every limit in it was checked to be servable that way at load.
    pub rlqs: bool,
}

/// Everything loaded from the rules path.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuleSet {
    pub domains: HashMap<String, Domain>,
    /// The files read, in load order (for `check` and `/config`).
    pub files: Vec<PathBuf>,
    /// Non-fatal findings, as `file:line: message` (none are made today; `tollgate check`
    /// and the reload log print them).
    pub warnings: Vec<String>,
}

impl RuleSet {
    /// Counts (domains, descriptor nodes, limits) for summaries.
    pub fn counts(&self) -> (usize, usize, usize) {
        fn walk(level: &Level, nodes: &mut usize, limits: &mut usize) {
            let all = level
                .exact
                .values()
                .flat_map(|m| m.values())
                .chain(level.wildcard.iter().map(|(_, _, d)| d))
                .chain(level.bare.values());
            for d in all {
                *nodes += 1;
                *limits += d.limits.len();
                walk(&d.children, nodes, limits);
            }
        }
        let (mut nodes, mut limits) = (0, 0);
        for d in self.domains.values() {
            walk(&d.root, &mut nodes, &mut limits);
        }
        (self.domains.len(), nodes, limits)
    }

    /// Whether any limit says `global: true`.
    pub fn has_global_limits(&self) -> bool {
        fn walk(level: &Level) -> bool {
            level
                .exact
                .values()
                .flat_map(|m| m.values())
                .chain(level.wildcard.iter().map(|(_, _, d)| d))
                .chain(level.bare.values())
                .any(|d| d.limits.iter().any(|l| l.global) || walk(&d.children))
        }
        self.domains.values().any(|d| walk(&d.root))
    }

    /// A digest of the `global: true` limits, as 16 hex digits: each one's domain, descriptor
    /// path, window, `requests_per_unit` and `burst`, in a sorted text hashed with FNV-1a (a
    /// hash every release computes alike). The regions publish it (`regions/agree.rs`): two
    /// regions whose global limits differ share nothing (their buckets' keys differ), so each
    /// would admit the whole limit. `"none"` without global limits.
    pub fn global_digest(&self) -> String {
        fn walk(level: &Level, domain: &str, prefix: &str, out: &mut Vec<String>) {
            for d in level.in_file_order() {
                let step = match &d.value {
                    Some(v) => format!("{}={v}", d.key),
                    None => d.key.clone(),
                };
                let path = format!("{prefix}.{step}");
                for l in d.limits.iter().filter(|l| l.global) {
                    if let Some(rate) = &l.rate {
                        out.push(format!(
                            "{domain}{path} {} {} {}",
                            rate.window_ms(),
                            rate.requests_per_unit,
                            rate.burst
                        ));
                    }
                }
                walk(&d.children, domain, &path, out);
            }
        }
        let mut lines = Vec::new();
        for (name, d) in &self.domains {
            walk(&d.root, name, "", &mut lines);
        }
        if lines.is_empty() {
            return "none".into();
        }
        lines.sort_unstable();
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in lines.join("\n").bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{hash:016x}")
    }

    /// The one line `tollgate check` prints for a set that loaded (see [`RulesSummary`]).
    pub fn summary(&self) -> RulesSummary<'_> {
        RulesSummary { set: self }
    }
}

/// What a loaded [`RuleSet`] holds, in one line:
/// `ok: 2 file(s), 2 domain(s) [api, edge], 5 descriptor(s), 4 limit(s)` (domains sorted, so
/// the line is the same on every run).
#[derive(Clone, Copy, Debug)]
pub struct RulesSummary<'a> {
    set: &'a RuleSet,
}

impl fmt::Display for RulesSummary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (domains, nodes, limits) = self.set.counts();
        let mut names: Vec<&str> = self.set.domains.keys().map(String::as_str).collect();
        names.sort_unstable();
        write!(
            f,
            "ok: {} file(s), {domains} domain(s) [{}], {nodes} descriptor(s), {limits} limit(s)",
            self.set.files.len(),
            names.join(", ")
        )
    }
}

/// What a limit falls back to while the store cannot answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FallbackMode {
    /// The limit's share of the quota (quota ÷ live replicas), in memory.
    #[default]
    Local,
    /// Admit.
    Open,
    /// Refuse.
    Closed,
    /// Fail the request with gRPC UNAVAILABLE (Envoy's `failure_mode_deny` decides).
    Error,
}

impl FallbackMode {
    pub const NAMES: &'static str = "local, open, closed or error";

    pub fn name(self) -> &'static str {
        match self {
            FallbackMode::Local => "local",
            FallbackMode::Open => "open",
            FallbackMode::Closed => "closed",
            FallbackMode::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<FallbackMode> {
        [
            FallbackMode::Local,
            FallbackMode::Open,
            FallbackMode::Closed,
            FallbackMode::Error,
        ]
        .into_iter()
        .find(|m| m.name() == s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_parse_case_insensitively_and_have_reference_lengths() {
        assert_eq!(Unit::parse("MINUTE"), Some(Unit::Minute));
        assert_eq!(Unit::parse("Hour"), Some(Unit::Hour));
        assert_eq!(Unit::parse("minutes"), None);
        assert_eq!(Unit::Month.seconds(), 2_592_000);
        assert_eq!(Unit::Year.seconds(), 31_536_000);
    }

    #[test]
    fn algorithms_parse_by_name_and_have_distinct_key_tags() {
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::parse(a.name()), Some(a));
            assert!(Algorithm::NAMES.contains(a.name()));
        }
        assert_eq!(
            Algorithm::parse("sliding_window"),
            Some(Algorithm::SlidingWindow)
        );
        assert_eq!(Algorithm::parse("Sliding_Window"), None);
        let tags: std::collections::HashSet<_> =
            Algorithm::ALL.iter().map(|a| a.key_tag()).collect();
        assert_eq!(tags.len(), Algorithm::ALL.len());
        // Settings deserialize the same names.
        let a: Algorithm = serde_json::from_str("\"sliding_window\"").unwrap();
        assert_eq!(a, Algorithm::SlidingWindow);
    }

    #[test]
    fn summary_is_the_line_check_prints() {
        assert_eq!(
            RuleSet::default().summary().to_string(),
            "ok: 0 file(s), 0 domain(s) [], 0 descriptor(s), 0 limit(s)"
        );
        let sources = [
            (
                PathBuf::from("z.yaml"),
                "domain: edge\ndescriptors:\n  - key: a\n    rate_limits:\n      - {unit: second, requests_per_unit: 1}\n      - {unit: hour, requests_per_unit: 9}\n    descriptors:\n      - key: b\n".to_string(),
            ),
            (
                PathBuf::from("a.yaml"),
                "domain: api\ndescriptors:\n  - key: c\n    value: x\n    rate_limit: {unlimited: true}\n".to_string(),
            ),
        ];
        let set = crate::rules::load::load_sources(&sources, Default::default()).unwrap();
        assert_eq!(
            set.summary().to_string(),
            "ok: 2 file(s), 2 domain(s) [api, edge], 3 descriptor(s), 3 limit(s)"
        );
    }

    #[test]
    fn a_limits_decision_series_are_made_once_for_its_domain() {
        let series = DecisionSeries::default();
        let edge: Arc<str> = "edge".into();
        let made = std::cell::Cell::new(0);
        let make = || {
            made.set(made.get() + 1);
            Counter::default()
        };
        series.get(&edge, Outcome::ok, make).unwrap().inc();
        // Another Arc of the same name is the same domain; the series is made once.
        let again: Arc<str> = "edge".into();
        assert_eq!(series.get(&again, Outcome::ok, make).unwrap().get(), 1);
        assert_eq!(made.get(), 1);
        series.get(&edge, Outcome::refund, make).unwrap();
        assert_eq!(made.get(), 2);
        // Another domain goes to the family.
        assert!(series.get(&"api".into(), Outcome::ok, make).is_none());
        // A clone starts empty, and the series are no part of a limit's equality.
        assert!(series.clone().domain.get().is_none());
        assert_eq!(series.clone(), series);
    }
}
