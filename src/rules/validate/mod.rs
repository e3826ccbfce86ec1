//! The semantic walk of one rules file: YAML tree → [`Domain`], or the reasons it is refused.
//!
//! `load.rs` hands in one file's text; [`file_rules`] parses it (`yaml.rs`) and walks it top
//! down, resolving defaults as it goes: the domain, each `descriptors:` level (no key+value
//! declared twice) and each descriptor (key, value, flags) here; what a descriptor limits with
//! (`rate_limit`/`rate_limits`, each limit and its rate) in `limit.rs`. The readers in
//! `yaml.rs` check each field's YAML shape; this walk checks what the fields mean.
//!
//! Every problem goes into the file's [`Problems`] with the offending node's position and the
//! walk carries on, so one run of `tollgate check` lists them all. A part with an error is
//! dropped (`None`) on the way up, so a file with any error yields no domain.

mod limit;

use std::collections::HashMap;
use std::sync::Arc;

use super::error::Pos;
use super::error::Problems;
use super::model::{Algorithm, Descriptor, Domain, Level, Limit, LoadOptions, Origin};
use super::yaml::{self, Node, join};
use limit::Inherited;

/// Walks one file's text into its [`Domain`]; `None` when anything in it is wrong (every
/// problem, and every warning, is in `problems`).
pub(crate) fn file_rules(text: &str, opts: LoadOptions, problems: &mut Problems) -> Option<Domain> {
    FileWalk { opts, problems }.file(text)
}

/// Where a descriptor sits in its domain's tree: the two names its limits are known by.
#[derive(Clone, Debug, Default)]
struct RulePath {
    /// The keys from the root, joined by `.` (`tenant.endpoint`): a limit's default
    /// metrics class.
    keys: String,
    /// One segment per level, `key` or `key_value` as the reference names it
    /// (`tenant_acme`, `endpoint`): a limit's statsd path (`telemetry/statsd/`).
    stat: Vec<String>,
}

impl RulePath {
    /// The path of a child descriptor with `key` (and `value`, when the rule gives one).
    fn child(&self, key: &str, value: Option<&str>) -> RulePath {
        let keys = if self.keys.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.keys)
        };
        let mut stat = self.stat.clone();
        stat.push(match value {
            Some(v) => format!("{key}_{v}"),
            None => key.to_string(),
        });
        RulePath { keys, stat }
    }
}

/// The walk of one file: the settings that resolve defaults and where problems go.
struct FileWalk<'a> {
    opts: LoadOptions,
    problems: &'a mut Problems,
}

impl FileWalk<'_> {
    fn error(&mut self, pos: Pos, field: &str, message: impl Into<String>) {
        self.problems.error(pos, field, message);
    }

    fn origin(&self, pos: Pos) -> Origin {
        Origin {
            file: self.problems.file().to_path_buf(),
            line: pos.line,
        }
    }

    /// Fields envoyproxy/ratelimit knows but tollgate ignores: accepted, so an existing rules
    /// directory loads unchanged, with a warning so nobody relies on them silently.
    /// A field that must be there (`missing` says why, at `parent`) and be a non-empty string.
    fn required_string(
        &mut self,
        node: Option<&Node>,
        parent: Pos,
        field: &str,
        missing: &str,
    ) -> Option<(String, Pos)> {
        let Some(node) = node else {
            self.error(parent, field, missing);
            return None;
        };
        match yaml::string(self.problems, node, field) {
            Some(s) if s.is_empty() => {
                self.error(node.pos, field, "must not be empty");
                None
            }
            other => other.map(|s| (s, node.pos)),
        }
    }

    fn file(&mut self, text: &str) -> Option<Domain> {
        let root = match yaml::parse(text) {
            Ok(Some(root)) => root,
            Ok(None) => {
                self.error(
                    Pos { line: 1, col: 1 },
                    "",
                    "the file is empty: expected `domain` and `descriptors`",
                );
                return None;
            }
            Err(e) => {
                self.error(e.pos, "", format!("invalid YAML: {}", e.message));
                return None;
            }
        };
        let f = yaml::fields(self.problems, &root, "", &["domain", "descriptors", "rlqs"])?;
        let domain = self.required_string(
            f.get("domain").copied(),
            root.pos,
            "domain",
            "missing: every rules file names its domain",
        );
        // tollgate's own: the domain is served to Envoy's rate_limit_quota filter too (RLQS).
        let rlqs = match f.get("rlqs") {
            Some(n) => Some(yaml::bool(self.problems, n, "rlqs")?),
            None => None,
        };
        let level = match f.get("descriptors") {
            Some(node) => self.level(node, "descriptors", &RulePath::default(), &[])?,
            None => Level::default(),
        };
        let (name, pos) = domain?;
        let rlqs = rlqs.unwrap_or(false);
        if rlqs && !self.rlqs_servable(&level) {
            return None;
        }
        Some(Domain {
            name: name.into(),
            root: level,
            origin: self.origin(pos),
            rlqs,
        })
    }

    /// Whether every node of an `rlqs: true` domain can be served over RLQS, where an Envoy
    /// enforces one token bucket per bucket id, paid for in advance out of the shared bucket
    /// (`rlqs/`): at most one counted limit per node, claimable (a token bucket or a fixed
    /// window: what a lease can claim), whole (no shards), without overdraft or shadow mode,
    /// and holding at least one report interval of its refill. Each refusal names the limit.
    fn rlqs_servable(&mut self, level: &Level) -> bool {
        // One refusal per limit, in file order, whatever the maps' order.
        let nodes = level.in_file_order();
        let interval_ms = self.opts.rlqs_report_interval_ms.max(1);
        let mut ok = true;
        for node in nodes {
            let counted: Vec<&Limit> = node
                .limits
                .iter()
                .filter(|l| l.rate.is_some())
                .map(|l| &**l)
                .collect();
            let pos = Pos {
                line: node.origin.line,
                col: 1,
            };
            if node.charge_parent.is_some() {
                self.error(
                    pos,
                    "charge_parent",
                    format!(
                        "descriptor '{}' has charge_parent, but the domain has rlqs: true and Envoy's quota filter reports usage without a reservation to settle: serve this domain over RLS only",
                        node.key
                    ),
                );
                ok = false;
            }
            if counted.len() > 1 {
                self.error(
                    pos,
                    "rate_limits",
                    format!(
                        "descriptor '{}' has {} counted limits, but the domain has rlqs: true and an RLQS bucket gets one token bucket: keep one limit here, or serve this domain over RLS only",
                        node.key,
                        counted.len()
                    ),
                );
                ok = false;
            }
            for limit in counted {
                let Some(rate) = limit.rate else { continue };
                let pos = Pos {
                    line: limit.origin.line,
                    col: 1,
                };
                let why = if !matches!(
                    rate.algorithm,
                    Algorithm::TokenBucket | Algorithm::FixedWindow
                ) {
                    Some(format!(
                        "algorithm {} cannot be claimed in advance; use token_bucket or fixed_window",
                        rate.algorithm.name()
                    ))
                } else if rate.calendar.is_some() {
                    Some(
                        "a calendar window cannot be claimed in advance (assignments are claimed on epoch-aligned windows); drop calendar, or serve this domain over RLS only"
                            .into(),
                    )
                } else if limit.shards > 1 {
                    Some(
                        "shards split the bucket, and an assignment is claimed from one bucket"
                            .into(),
                    )
                } else if limit.overdraft {
                    Some(
                        "overdraft charges after the fact, and an assignment is paid before".into(),
                    )
                } else if limit.global {
                    Some("a global limit's share moves with the regions' demand, and an assignment is claimed from one bucket".into())
                } else if limit.shadow_mode {
                    Some("shadow_mode cannot be enforced by Envoy's filter (it would deny)".into())
                } else {
                    // What refills between two reports must fit in the bucket, or Envoys,
                    // holding only what was there at their last report, could use at most
                    // `burst` per report interval.
                    let per_interval = u128::from(rate.requests_per_unit) * u128::from(interval_ms)
                        / u128::from(rate.window_ms().max(1));
                    if rate.algorithm == Algorithm::TokenBucket
                        && per_interval > u128::from(rate.burst)
                    {
                        Some(format!(
                            "it refills {per_interval} tokens per report interval (rlqs_report_interval_ms {interval_ms}) but holds only burst {}: Envoys would be held to {} per interval; set burst to at least {per_interval}",
                            rate.burst, rate.burst
                        ))
                    } else if rate.algorithm == Algorithm::FixedWindow
                        && rate.window_ms() < interval_ms
                    {
                        // An assignment ends with its window, and the next is claimed at the
                        // Envoy's next report: windows shorter than the interval would be
                        // served only in part.
                        Some(format!(
                            "its window ({} ms) is shorter than the report interval (rlqs_report_interval_ms {interval_ms}): an assignment ends with its window and the next comes only at the next report, so most of each window would go unserved; use a window of at least the interval, or token_bucket",
                            rate.window_ms()
                        ))
                    } else {
                        None
                    }
                };
                if let Some(why) = why {
                    self.error(
                        pos,
                        "rate_limit",
                        format!("the domain has rlqs: true, and this limit cannot be served over RLQS: {why}"),
                    );
                    ok = false;
                }
            }
            ok &= self.rlqs_servable(&node.children);
        }
        ok
    }

    /// A `descriptors:` list → one level of the tree.
    /// `parent_limits`: the limits of the descriptor this list is under (none at the top),
    /// which a child with `charge_parent` is charged to.
    fn level(
        &mut self,
        node: &Node,
        path: &str,
        parent: &RulePath,
        parent_limits: &[Arc<Limit>],
    ) -> Option<Level> {
        let items = yaml::seq(self.problems, node, path)?;
        let mut level = Level::default();
        let mut seen: HashMap<(String, Option<String>), usize> = HashMap::new();
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let field = format!("{path}[{i}]");
            // Duplicates are checked on the raw key and value, before (and whatever) the rest
            // of the descriptor says: a typo elsewhere in it must not hide this error until
            // the typo is fixed.
            let mut duplicate = false;
            if let Some(id) = identity(item) {
                if let Some(first) = seen.get(&id) {
                    duplicate = true;
                    let shown = match &id.1 {
                        Some(v) => format!("key '{}' with value '{v}'", id.0),
                        None => format!("key '{}' without a value", id.0),
                    };
                    self.error(
                        item.pos,
                        &field,
                        format!(
                            "duplicate descriptor: {shown} is already declared at line {first}"
                        ),
                    );
                    ok = false;
                } else {
                    seen.insert(id, item.pos.line);
                }
            }
            let Some(d) = self.descriptor(item, &field, parent, parent_limits) else {
                ok = false;
                continue;
            };
            if duplicate {
                continue;
            }
            let d = Arc::new(d);
            match &d.value {
                None => {
                    level.bare.insert(d.key.clone(), d);
                }
                Some(v) if v.contains('*') => level.wildcard.push((d.key.clone(), v.clone(), d)),
                Some(v) => {
                    level
                        .exact
                        .entry(d.key.clone())
                        .or_default()
                        .insert(v.clone(), d);
                }
            }
        }
        ok.then_some(level)
    }

    fn descriptor(
        &mut self,
        node: &Node,
        path: &str,
        parent: &RulePath,
        parent_limits: &[Arc<Limit>],
    ) -> Option<Descriptor> {
        const FIELDS: &[&str] = &[
            "key",
            "value",
            "rate_limit",
            "rate_limits",
            "descriptors",
            "shadow_mode",
            "share_threshold",
            "detailed_metric",
            "quota_mode",
            "value_to_metric",
            "metadata",
            "charge_parent",
        ];
        let f = yaml::fields(self.problems, node, path, FIELDS)?;
        let mut ok = true;
        let key = self.required_string(
            f.get("key").copied(),
            node.pos,
            &join(path, "key"),
            "missing: every descriptor has a key",
        );
        // An empty value is the same as no value, as in the reference.
        let value = match f.get("value") {
            Some(n) if !n.is_null() => {
                yaml::string(self.problems, n, &join(path, "value")).filter(|v| !v.is_empty())
            }
            _ => None,
        };
        // A flag that is not true or false is an error that refuses the descriptor, but the
        // walk goes on as if it were false so the rest of it is still checked.
        let mut flag = |walk: &mut Self, name: &str| match f.get(name) {
            Some(n) => yaml::bool(walk.problems, n, &join(path, name)).unwrap_or_else(|| {
                ok = false;
                false
            }),
            None => false,
        };
        let shadow_mode = flag(self, "shadow_mode");
        let share_threshold = flag(self, "share_threshold");
        let detailed_metric = flag(self, "detailed_metric");
        let quota_mode = flag(self, "quota_mode");
        let value_to_metric = flag(self, "value_to_metric");
        let charge_parent = flag(self, "charge_parent");
        let metadata = match f.get("metadata") {
            Some(n) if !n.is_null() => match metadata_json(n) {
                Ok(v) => Some(Arc::new(v)),
                Err((pos, e)) => {
                    self.error(pos, &join(path, "metadata"), e);
                    ok = false;
                    None
                }
            },
            _ => None,
        };
        if share_threshold
            && value_to_metric
            && let Some(n) = f.get("value_to_metric")
        {
            // As in the reference, the shared pattern wins.
            self.problems.warn(
                n.pos,
                &join(path, "value_to_metric"),
                "has no effect beside share_threshold: every matching value shares one bucket and one metrics class",
            );
        }
        let (key, _) = key?;
        let at = parent.child(&key, value.as_deref());
        if share_threshold
            && !value.as_deref().is_some_and(|v| v.contains('*'))
            && let Some(n) = f.get("share_threshold")
        {
            self.error(
                n.pos,
                &join(path, "share_threshold"),
                "only applies to a wildcard `value` (one containing `*`)",
            );
            ok = false;
        }
        let inherited = Inherited {
            shadow_mode,
            detailed_metric,
            quota_mode,
            metadata,
        };
        let limits = self.limits(&f, path, &inherited, &at);
        ok &= limits.is_some();
        let charge_parent = match f.get("charge_parent") {
            Some(n) if charge_parent => {
                let own = limits.as_ref().is_some_and(|l| !l.is_empty());
                match self.charged_parent(parent_limits, own) {
                    Ok(limits) => Some(limits),
                    Err(why) => {
                        self.error(n.pos, &join(path, "charge_parent"), why);
                        ok = false;
                        None
                    }
                }
            }
            _ => None,
        };
        let own_limits = limits.as_deref().unwrap_or(&[]);
        let children = match f.get("descriptors") {
            Some(n) => self.level(n, &join(path, "descriptors"), &at, own_limits),
            None => Some(Level::default()),
        };
        let children = children?;
        let settled_by = children
            .in_file_order()
            .iter()
            .find(|c| c.charge_parent.is_some())
            .map(|c| c.key.clone());
        ok.then(|| Descriptor {
            key,
            value,
            limits: limits.unwrap_or_default(),
            share_threshold,
            detailed_metric,
            value_to_metric,
            charge_parent,
            settled_by,
            children,
            origin: self.origin(node.pos),
        })
    }

    /// The limits a `charge_parent: true` node is charged to: its parent's, which must be
    /// there, counted and whole (a charge goes to the one bucket a reservation was taken
    /// from; a shard is picked at random per request). `own`: the node declares limits too.
    fn charged_parent(
        &mut self,
        parent_limits: &[Arc<Limit>],
        own: bool,
    ) -> Result<Vec<Arc<Limit>>, String> {
        if own {
            return Err("a descriptor with charge_parent is counted on its parent's limits and has none of its own: drop its rate_limit(s)".into());
        }
        if !parent_limits.iter().any(|l| l.rate.is_some()) {
            return Err("the parent descriptor has no counted limit to charge: put charge_parent on a child of a descriptor with a rate_limit".into());
        }
        if parent_limits.iter().any(|l| l.shards > 1) {
            return Err("the parent's limit is sharded, and a charge must reach the bucket its reservation was taken from: drop `shards` there".into());
        }
        // A sliding log cannot be charged into debt or given back to. (A fixed window's
        // reservations are made so that a refused one counts nothing: `Descriptor::settled_by`.)
        if parent_limits
            .iter()
            .filter_map(|l| l.rate)
            .any(|r| r.algorithm == Algorithm::SlidingLog)
        {
            return Err("the parent's limit is a sliding_log, which a settlement can neither charge into debt nor give back to: use token_bucket, fixed_window or sliding_window there".into());
        }
        Ok(parent_limits.to_vec())
    }
}

/// A descriptor's `metadata`: a map, as JSON (the reference returns it as a protobuf
/// `Struct`). Unquoted scalars are typed as YAML types them (null, true/false, numbers),
/// everything else is a string; nested maps and lists are kept.
fn metadata_json(node: &Node) -> Result<serde_json::Value, (Pos, String)> {
    fn value(node: &Node) -> Result<serde_json::Value, (Pos, String)> {
        use serde_json::Value as J;
        Ok(match &node.value {
            yaml::Value::Scalar { text, quoted: true } => J::String(text.clone()),
            yaml::Value::Scalar { .. } if node.is_null() => J::Null,
            yaml::Value::Scalar { text, .. } => {
                if text.eq_ignore_ascii_case("true") {
                    J::Bool(true)
                } else if text.eq_ignore_ascii_case("false") {
                    J::Bool(false)
                } else if let Ok(n) = text.parse::<i64>() {
                    J::from(n)
                } else if let Some(n) = text
                    .parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite())
                    .and_then(serde_json::Number::from_f64)
                {
                    J::Number(n)
                } else {
                    J::String(text.clone())
                }
            }
            yaml::Value::Seq(items) => J::Array(items.iter().map(value).collect::<Result<_, _>>()?),
            yaml::Value::Map(pairs) => {
                let mut out = serde_json::Map::new();
                for (k, v) in pairs {
                    let yaml::Value::Scalar { text, .. } = &k.value else {
                        return Err((k.pos, format!("a key must be a string, found {}", k.kind())));
                    };
                    out.insert(text.clone(), value(v)?);
                }
                J::Object(out)
            }
        })
    }
    match &node.value {
        yaml::Value::Map(_) => value(node),
        _ => Err((node.pos, format!("expected a map, found {}", node.kind()))),
    }
}

/// A descriptor's `(key, value)` as written, read without reporting anything (the full walk
/// reports what is wrong with them); an empty value counts as none, as in the reference.
fn identity(node: &Node) -> Option<(String, Option<String>)> {
    let yaml::Value::Map(pairs) = &node.value else {
        return None;
    };
    let scalar = |name: &str| {
        pairs.iter().find_map(|(k, v)| match (&k.value, &v.value) {
            (yaml::Value::Scalar { text: k, .. }, yaml::Value::Scalar { text, .. })
                if k == name && !v.is_null() =>
            {
                Some(text.clone())
            }
            _ => None,
        })
    };
    let key = scalar("key").filter(|k| !k.is_empty())?;
    Some((key, scalar("value").filter(|v| !v.is_empty())))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use crate::rules::LoadOptions;
    use crate::rules::RulesError;
    use crate::rules::load::load_sources;
    use crate::rules::model::{RuleSet, Unit};

    pub(super) fn load(text: &str) -> Result<RuleSet, RulesError> {
        load_sources(
            &[(PathBuf::from("r.yaml"), text.to_string())],
            LoadOptions::default(),
        )
    }

    /// The single error of a refused file, as `line: field: message`.
    pub(super) fn refused(text: &str) -> (usize, String, String) {
        let err = load(text).expect_err("should be refused");
        assert_eq!(err.errors.len(), 1, "{err}");
        let e = &err.errors[0];
        (e.line, e.field.clone(), e.message.clone())
    }

    #[test]
    fn charge_parent_is_read_and_refused_where_there_is_nothing_to_charge() {
        let set = load("domain: d\ndescriptors:\n  - key: t\n    rate_limit: {unit: hour, requests_per_unit: 9}\n    descriptors:\n      - key: settle\n        charge_parent: true\n").unwrap();
        let t = &set.domains["d"].root.bare["t"];
        let settle = &t.children.bare["settle"];
        assert!(settle.limits.is_empty());
        assert_eq!(
            settle.counted_limits(),
            &t.limits[..],
            "the parent's, shared"
        );
        assert!(t.charge_parent.is_none());
        assert!(
            t.reserved() && !settle.reserved(),
            "the parent's takes are reservations"
        );

        let base = "domain: d\ndescriptors:\n";
        for (rules, line, why) in [
            (
                "  - key: t\n    charge_parent: true\n",
                4,
                "the parent descriptor has no counted limit",
            ),
            (
                "  - key: t\n    descriptors:\n      - key: s\n        charge_parent: true\n",
                6,
                "the parent descriptor has no counted limit",
            ),
            (
                "  - key: t\n    rate_limit: {unit: hour, requests_per_unit: 9}\n    descriptors:\n      - key: s\n        charge_parent: true\n        rate_limit: {unit: hour, requests_per_unit: 9}\n",
                7,
                "has none of its own",
            ),
            (
                "  - key: t\n    rate_limit: {unit: hour, requests_per_unit: 9, shards: 3}\n    descriptors:\n      - key: s\n        charge_parent: true\n",
                7,
                "sharded",
            ),
            (
                "  - key: t\n    rate_limit: {unit: hour, requests_per_unit: 9}\n    descriptors:\n      - key: s\n        charge_parent: yes please\n",
                7,
                "",
            ),
            (
                "  - key: t\n    rate_limit: {unit: hour, requests_per_unit: 9, algorithm: sliding_log}\n    descriptors:\n      - key: s\n        charge_parent: true\n",
                7,
                "sliding_log",
            ),
        ] {
            let (at, field, message) = refused(&format!("{base}{rules}"));
            assert_eq!(at, line, "{rules}: {message}");
            assert!(field.ends_with("charge_parent"), "{field}");
            assert!(message.contains(why), "{message}");
        }
        let (_, field, message) = refused(
            "domain: d\nrlqs: true\ndescriptors:\n  - key: t\n    rate_limit: {unit: hour, requests_per_unit: 9000}\n    descriptors:\n      - key: s\n        charge_parent: true\n",
        );
        assert_eq!(field, "charge_parent");
        assert!(message.contains("RLS only"), "{message}");
    }

    #[test]
    fn a_global_limit_is_refused_in_an_rlqs_domain() {
        let (_, _, message) = refused(
            "domain: d\nrlqs: true\ndescriptors:\n  - key: t\n    rate_limit: {unit: hour, requests_per_unit: 9000, global: true}\n",
        );
        assert!(
            message.contains("cannot be served over RLQS") && message.contains("global limit"),
            "{message}"
        );
    }

    #[test]
    fn loads_reference_shaped_rules() {
        let set = load(
            "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit:\n      unit: Minute\n      requests_per_unit: 100\n    descriptors:\n      - key: endpoint\n        value: /search\n        rate_limit: {unit: second, requests_per_unit: 5, name: search}\n  - key: path\n    value: /api/*\n    shadow_mode: true\n    rate_limit: {unlimited: true}\n",
        )
        .unwrap();
        let d = &set.domains["edge"];
        let tenant = &d.root.bare["tenant"];
        let rate = tenant.limits[0].rate.unwrap();
        assert_eq!(
            (rate.requests_per_unit, rate.unit, rate.burst),
            (100, Unit::Minute, 100)
        );
        assert_eq!(&*tenant.limits[0].class, "tenant");
        let ep = &tenant.children.exact["endpoint"]["/search"];
        assert_eq!(&*ep.limits[0].class, "search");
        assert_eq!(ep.origin.line, 8);
        assert_eq!(d.root.wildcard[0].1, "/api/*");
        assert!(d.root.wildcard[0].2.limits[0].rate.is_none());
        assert_eq!(set.counts(), (1, 3, 3));
    }

    #[test]
    fn refuses_bad_yaml_with_its_line() {
        let (line, _, msg) = refused("domain: d\ndescriptors:\n  - key: a\n    value: [unclosed\n");
        assert!(line >= 4, "{line}");
        assert!(msg.starts_with("invalid YAML"), "{msg}");
    }

    #[test]
    fn refuses_unknown_fields_at_their_line() {
        let (line, field, msg) = refused(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      request_per_unit: 2\n",
        );
        assert_eq!(
            (line, field.as_str()),
            (7, "descriptors[0].rate_limit.request_per_unit")
        );
        assert!(msg.contains("unknown field"), "{msg}");
        assert_eq!(refused("domain: d\nextra: 1\n").0, 2);
    }

    #[test]
    fn refuses_empty_domain_and_key() {
        let (line, field, msg) = refused("domain: \"\"\ndescriptors: []\n");
        assert_eq!(
            (line, field.as_str(), msg.as_str()),
            (1, "domain", "must not be empty")
        );
        let (line, field, _) = refused("descriptors: []\n");
        assert_eq!((line, field.as_str()), (1, "domain"));
        let (line, field, msg) = refused("domain: d\ndescriptors:\n  - key: \"\"\n");
        assert_eq!(
            (line, field.as_str(), msg.as_str()),
            (3, "descriptors[0].key", "must not be empty")
        );
        let (line, _, _) = refused("domain: d\ndescriptors:\n  - value: x\n");
        assert_eq!(line, 3);
        let (line, _, msg) = refused("");
        assert_eq!(line, 1);
        assert!(msg.contains("empty"));
    }

    #[test]
    fn refuses_duplicate_keys_at_one_level() {
        let (line, field, msg) = refused(
            "domain: d\ndescriptors:\n  - key: a\n    value: x\n  - key: b\n  - key: a\n    value: x\n",
        );
        assert_eq!((line, field.as_str()), (6, "descriptors[2]"));
        assert!(msg.contains("line 3"), "{msg}");
        // Same key with different values, or at different levels, is fine.
        assert!(load("domain: d\ndescriptors:\n  - key: a\n    value: x\n  - key: a\n  - key: b\n    descriptors:\n      - key: a\n").is_ok());
    }

    #[test]
    fn a_duplicate_shows_in_the_same_pass_as_an_error_inside_either_copy() {
        // Seen by a user: the duplicate only appeared once the unit typo was fixed.
        let err = load(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hours, requests_per_unit: 1}\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
        )
        .unwrap_err();
        let lines: Vec<usize> = err.errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, [4, 5], "{err}");
        assert!(err.errors[0].message.contains("hours"), "{err}");
        assert!(
            err.errors[1].message.contains("duplicate descriptor"),
            "{err}"
        );
    }

    #[test]
    fn collects_every_error() {
        let err = load("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: eon, requests_per_unit: 1}\n  - key: b\n    bogus: 1\n").unwrap_err();
        assert_eq!(err.errors.len(), 2, "{err}");
        assert!(err.to_string().contains("r.yaml:4:"), "{err}");
    }

    #[test]
    fn the_references_quota_mode_value_to_metric_and_metadata_are_read() {
        let set = load("domain: d\ndescriptors:\n  - key: a\n    quota_mode: true\n    value_to_metric: true\n    metadata:\n      team: core\n      n: 5\n      on: true\n      nested: {list: [1, \"2\"]}\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limits:\n      - {unit: second, requests_per_unit: 1, quota_mode: true}\n      - {unit: hour, requests_per_unit: 9}\n").unwrap();
        assert!(set.warnings.is_empty(), "{:?}", set.warnings);
        let warned = load("domain: d\ndescriptors:\n  - key: a\n    value: \"x*\"\n    share_threshold: true\n    value_to_metric: true\n").unwrap();
        assert_eq!(
            warned.warnings,
            [
                "r.yaml:6: descriptors[0].value_to_metric: has no effect beside share_threshold: every matching value shares one bucket and one metrics class"
            ]
        );
        let root = &set.domains["d"].root;
        let a = &root.bare["a"];
        assert!(a.value_to_metric && a.limits[0].quota_mode);
        assert_eq!(
            a.limits[0].metadata.as_deref(),
            Some(
                &serde_json::json!({"team": "core", "n": 5, "on": true, "nested": {"list": [1, "2"]}})
            )
        );
        let b = &root.bare["b"];
        assert_eq!(
            (
                b.limits[0].quota_mode,
                b.limits[1].quota_mode,
                b.value_to_metric
            ),
            (true, false, false)
        );
        // Refused where they are written, with the reason.
        let err =
            load("domain: d\ndescriptors:\n  - key: a\n    quota_mode: maybe\n    metadata: [1]\n")
                .unwrap_err()
                .to_string();
        for said in [
            "r.yaml:4:",
            "descriptors[0].quota_mode: expected true or false",
            "r.yaml:5:",
            "descriptors[0].metadata: expected a map, found a list",
        ] {
            assert!(err.contains(said), "{said} in {err}");
        }
    }
}
