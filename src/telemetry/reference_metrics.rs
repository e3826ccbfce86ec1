//! The reference's Prometheus metrics, on a port of their own: what envoyproxy/ratelimit serves
//! with `USE_PROMETHEUS=true` (`PROMETHEUS_ADDR`, `PROMETHEUS_PATH`), so Envoy Gateway's scrape
//! and dashboard keep working when its image is swapped for tollgate's.
//!
//! The reference turns its statsd counters into Prometheus series with the statsd exporter's
//! mapping (`PROMETHEUS_MAPPER_YAML`, or its default one). Data flows the same way here: the
//! statsd counters ([`super::Statsd`]: per-rule hits, errors, config loads, calls and their
//! response times), by their statsd names → [`Mapper`] (each name to a Prometheus name and
//! labels, as the statsd exporter maps it: the first glob mapping that matches, then the first
//! regex one; `action: drop`; a name no mapping matches is kept with its dots as `_`) →
//! [`render`]: the text format, with the `process_*` families. The default mapping is the
//! reference's: `ratelimit_service_rate_limit_<counter>{domain, key1[, key2]}`,
//! `ratelimit_service_should_rate_limit_error{err_type}`,
//! `ratelimit_service_total_requests{grpc_method}`,
//! `ratelimit_service_response_time_seconds{grpc_method}` (a histogram),
//! `ratelimit_service_config_load_{success,error}`.

use std::collections::BTreeMap;

use regex::Regex;
use yaml_rust2::{Yaml, YamlLoader};

use super::Metrics;
use super::statsd::BUCKETS;

/// The hit counters of a rule, the last level of their statsd names.
const RULE_COUNTERS: [&str; 5] = [
    "near_limit",
    "over_limit",
    "total_hits",
    "within_limit",
    "shadow_mode",
];

/// The statsd name of the gRPC server's call counter and response time.
const CALLS: &str = "ratelimit_server.ShouldRateLimit.total_requests";
const RESPONSE_TIME: &str = "ratelimit_server.ShouldRateLimit.response_time";

/// Which statsd metric types a mapping applies to (`match_metric_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Counter,
    Observer,
}

#[derive(Debug)]
struct Mapping {
    /// Anchored for a glob; as written for a regex (the statsd exporter does not anchor it).
    pattern: Regex,
    glob: bool,
    /// The Prometheus name and labels, with `$n` (or `${n}`) for the n-th capture.
    name: String,
    labels: Vec<(String, String)>,
    drop: bool,
    kind: Option<Kind>,
    /// `scale`: a factor on observed values (response times are milliseconds).
    scale: Option<f64>,
    /// Observed values as a histogram (`timer_type`/`observer_type: histogram`), else as
    /// the statsd exporter's default, a summary (here its sum and count: no quantiles).
    histogram: bool,
}

/// What one statsd name becomes.
#[derive(Debug, PartialEq)]
enum Mapped {
    Series {
        name: String,
        labels: Vec<(String, String)>,
    },
    Dropped,
}

/// A statsd exporter mapping: [`Mapper::reference_default`] or one read from a file.
#[derive(Debug)]
pub struct Mapper {
    mappings: Vec<Mapping>,
}

/// Where a mapping file sets `histogram_options` (`defaults`, `mappings[i]`), which is not read.
fn unread_histogram_options(text: &str) -> Vec<String> {
    let Ok(docs) = YamlLoader::load_from_str(text) else {
        return Vec::new();
    };
    let Some(root) = docs.into_iter().next() else {
        return Vec::new();
    };
    let set = |node: &Yaml| !matches!(node["histogram_options"], Yaml::BadValue | Yaml::Null);
    let mut found = Vec::new();
    if set(&root["defaults"]) {
        found.push("defaults".to_string());
    }
    if let Yaml::Array(items) = &root["mappings"] {
        for (i, item) in items.iter().enumerate() {
            if set(item) {
                found.push(format!("mappings[{i}]"));
            }
        }
    }
    found
}

impl Mapper {
    /// The reference's default mapping (its `src/stats/prom/default_mapper.yaml`, as behaviour):
    /// a rule's counters by domain and its first key (globs) or first two (regexes), the error
    /// counter by type, calls and response times (in seconds) by method, config loads.
    pub fn reference_default() -> Mapper {
        let mut mappings = Vec::new();
        for counter in RULE_COUNTERS {
            mappings.push(mapping(
                &format!("ratelimit.service.rate_limit.*.*.{counter}"),
                true,
                &format!("ratelimit_service_rate_limit_{counter}"),
                &[("domain", "$1"), ("key1", "$2")],
            ));
        }
        for counter in RULE_COUNTERS {
            mappings.push(mapping(
                &format!(
                    r"ratelimit\.service\.rate_limit\.([^\.]*)\.([^\.]*)\.([^\.]*)(\..*)?\.{counter}"
                ),
                false,
                &format!("ratelimit_service_rate_limit_{counter}"),
                &[("domain", "$1"), ("key1", "$2"), ("key2", "$3")],
            ));
        }
        let mut errors = mapping(
            "ratelimit.service.call.should_rate_limit.*",
            true,
            "ratelimit_service_should_rate_limit_error",
            &[("err_type", "$1")],
        );
        errors.kind = Some(Kind::Counter);
        let mut calls = mapping(
            "ratelimit_server.*.total_requests",
            true,
            "ratelimit_service_total_requests",
            &[("grpc_method", "$1")],
        );
        calls.kind = Some(Kind::Counter);
        let mut times = mapping(
            "ratelimit_server.*.response_time",
            true,
            "ratelimit_service_response_time_seconds",
            &[("grpc_method", "$1")],
        );
        times.scale = Some(0.001);
        mappings.extend([errors, calls, times]);
        for result in ["success", "error"] {
            let mut load = mapping(
                &format!("ratelimit.service.config_load_{result}"),
                true,
                &format!("ratelimit_service_config_load_{result}"),
                &[],
            );
            load.kind = Some(Kind::Counter);
            mappings.push(load);
        }
        Mapper { mappings }
    }

    /// Reads a statsd exporter mapping file (`mappings:` of `match`, `name`, `labels`,
    /// `match_type` glob or regex, `action: drop`, `match_metric_type`, `scale`,
    /// `timer_type`/`observer_type`, and those `defaults`; `histogram_options` is not read:
    /// the buckets are Prometheus's defaults). Errors name the mapping.
    pub fn from_yaml(text: &str) -> Result<Mapper, String> {
        Mapper::from_yaml_noting(text).map(|(m, _)| m)
    }

    /// [`Mapper::from_yaml`], and where the file asks for what is not read (`histogram_options`,
    /// in `defaults` or a mapping): the startup warning names each, so a dashboard built on
    /// custom buckets is not silently fed the default ones.
    pub fn from_yaml_noting(text: &str) -> Result<(Mapper, Vec<String>), String> {
        let unread = unread_histogram_options(text);
        Mapper::parse_yaml(text).map(|m| (m, unread))
    }

    fn parse_yaml(text: &str) -> Result<Mapper, String> {
        // Read with yaml-rust2 directly: telemetry sits below the rules and does not borrow
        // their position-keeping reader. Errors name the mapping by its index.
        let docs = YamlLoader::load_from_str(text).map_err(|e| e.to_string())?;
        let root = docs.into_iter().next().ok_or("empty: no mappings")?;
        let field = |node: &Yaml, name: &str| -> Option<Yaml> {
            match &node[name] {
                Yaml::BadValue | Yaml::Null => None,
                found => Some(found.clone()),
            }
        };
        let text_of = |node: &Yaml| match node {
            Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
            Yaml::Integer(n) => Some(n.to_string()),
            Yaml::Boolean(b) => Some(b.to_string()),
            _ => None,
        };
        let default_of = |name: &str| {
            field(&root, "defaults")
                .and_then(|d| field(&d, name))
                .and_then(|n| text_of(&n))
        };
        let default_glob = default_of("match_type").is_none_or(|t| t != "regex");
        let default_histogram = default_of("observer_type")
            .or_else(|| default_of("timer_type"))
            .is_some_and(|t| t == "histogram");
        let Some(Yaml::Array(items)) = field(&root, "mappings") else {
            return Err("no `mappings:` list".to_string());
        };
        let mut mappings = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let at = format!("mappings[{i}]");
            let get = |name: &str| field(item, name).and_then(|n| text_of(&n));
            let pattern = get("match").ok_or(format!("{at}: no `match`"))?;
            let glob = match get("match_type").as_deref() {
                None => default_glob,
                Some("glob") => true,
                Some("regex") => false,
                Some(other) => return Err(format!("{at}: match_type {other}: glob or regex")),
            };
            let drop = get("action").as_deref() == Some("drop");
            let name = get("name").unwrap_or_default();
            if name.is_empty() && !drop {
                return Err(format!("{at}: no `name`"));
            }
            let labels = match field(item, "labels") {
                Some(Yaml::Hash(pairs)) => pairs
                    .iter()
                    .filter_map(|(k, v)| Some((text_of(k)?, text_of(v)?)))
                    .collect(),
                _ => Vec::new(),
            };
            let kind = match get("match_metric_type").as_deref() {
                None => None,
                Some("counter") => Some(Kind::Counter),
                Some("observer" | "timer" | "histogram" | "summary") => Some(Kind::Observer),
                // A gauge: tollgate sends none, so the mapping never applies.
                Some(_) => continue,
            };
            let histogram = get("observer_type")
                .or_else(|| get("timer_type"))
                .map_or(default_histogram, |t| t == "histogram");
            let scale = get("scale")
                .map(|s| s.parse::<f64>().map_err(|_| format!("{at}: scale {s}")))
                .transpose()?;
            mappings.push(Mapping {
                pattern: compile(&pattern, glob).map_err(|e| format!("{at}: {e}"))?,
                glob,
                name,
                labels,
                drop,
                kind,
                scale,
                histogram,
            });
        }
        Ok(Mapper { mappings })
    }

    /// The scale of observed response times (milliseconds × scale): the mapping's, else none.
    pub fn response_time_scale(&self) -> f64 {
        match self.find(RESPONSE_TIME, Kind::Observer) {
            Some((m, _)) => m.scale.unwrap_or(1.0),
            None => 1.0,
        }
    }

    /// The first glob mapping that matches `name`, else the first regex one, with captures.
    fn find(&self, name: &str, kind: Kind) -> Option<(&Mapping, Vec<String>)> {
        let applies = |m: &&Mapping| m.kind.is_none_or(|k| k == kind);
        let captured = |m: &Mapping| {
            m.pattern.captures(name).map(|c| {
                c.iter()
                    .map(|g| g.map_or(String::new(), |g| g.as_str().to_string()))
                    .collect::<Vec<_>>()
            })
        };
        let globs = self.mappings.iter().filter(|m| m.glob).filter(applies);
        let regexes = self.mappings.iter().filter(|m| !m.glob).filter(applies);
        globs
            .chain(regexes)
            .find_map(|m| captured(m).map(|c| (m, c)))
    }

    fn map(&self, name: &str, kind: Kind) -> Mapped {
        match self.find(name, kind) {
            Some((m, _)) if m.drop => Mapped::Dropped,
            Some((m, captures)) => {
                // Escaped as the statsd exporter escapes every name: a capture may hold
                // anything a statsd name does (`my-domain`).
                let name = escape(&expand(&m.name, &captures));
                if name.is_empty() {
                    // The exporter drops it too (`empty_metric_name`).
                    return Mapped::Dropped;
                }
                Mapped::Series {
                    name,
                    labels: m
                        .labels
                        .iter()
                        .map(|(k, v)| (k.clone(), expand(v, &captures)))
                        .collect(),
                }
            }
            // Unmapped: the statsd exporter keeps the name, made a valid Prometheus one.
            None => Mapped::Series {
                name: escape(name),
                labels: Vec::new(),
            },
        }
    }
}

/// A glob (`*` is one level: no dots; the rest literal; the whole name) or a regex as written.
fn compile(pattern: &str, glob: bool) -> Result<Regex, regex::Error> {
    if glob {
        let parts: Vec<String> = pattern.split('*').map(regex::escape).collect();
        Regex::new(&format!("^{}$", parts.join("([^.]*)")))
    } else {
        Regex::new(pattern)
    }
}

/// A built-in mapping (its pattern is known to compile).
fn mapping(pattern: &str, glob: bool, name: &str, labels: &[(&str, &str)]) -> Mapping {
    Mapping {
        pattern: compile(pattern, glob).expect("a built-in pattern"),
        glob,
        name: name.to_string(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        drop: false,
        kind: None,
        scale: None,
        histogram: true,
    }
}

/// Go's `regexp.Expand`, which the statsd exporter uses: `$name` takes the longest run of
/// letters, digits and `_` (so `$1_x` is the group named `1_x`: empty), `${name}` the braces'
/// content; a number is that capture, any other name (named groups are not used) is empty,
/// `$$` is `$`, and a `$` that starts no name is kept.
fn expand(template: &str, captures: &[String]) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(more) = after.strip_prefix('$') {
            out.push('$');
            rest = more;
            continue;
        }
        let (name, used) = match after.strip_prefix('{') {
            Some(inner) => match inner.find('}') {
                Some(end) => (&inner[..end], end + 2),
                None => ("", 0),
            },
            None => {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], end)
            }
        };
        if name.is_empty() {
            out.push('$');
            rest = after;
            continue;
        }
        if let Ok(n) = name.parse::<usize>() {
            out.push_str(captures.get(n).map_or("", String::as_str));
        }
        rest = &after[used..];
    }
    out.push_str(rest);
    out
}

/// The statsd exporter's name escaping: anything but `[a-zA-Z0-9_]` becomes `_`, and a name
/// that starts with a digit gets a leading `_`.
fn escape(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// A label value in the text format: `\`, `"` and newlines escaped.
fn label_value(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', r#"\""#)
        .replace('\n', r"\n")
}

fn labels_text(labels: &[(String, String)], extra: Option<(&str, String)>) -> String {
    let mut all: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", label_value(v)))
        .collect();
    if let Some((k, v)) = extra {
        all.push(format!("{k}=\"{v}\""));
    }
    if all.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", all.join(","))
    }
}

/// Every counter and the response-time histogram, mapped by `mapper`, in the Prometheus text
/// format, and the `process_*` families.
pub fn render(metrics: &Metrics, mapper: &Mapper) -> String {
    let statsd = &metrics.statsd;
    // Counters by Prometheus name, then by labels (two statsd names may land on one series:
    // their counts add up, as the statsd exporter's counter would).
    let mut counters: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    let mut names: Vec<(String, u64)> = statsd
        .snapshot(metrics)
        .into_iter()
        .map(|(n, v)| (format!("ratelimit.service.{n}"), v))
        .collect();
    names.push((
        CALLS.to_string(),
        statsd.calls.load(std::sync::atomic::Ordering::Relaxed),
    ));
    for (name, value) in names {
        if let Mapped::Series { name, labels } = mapper.map(&name, Kind::Counter) {
            *counters
                .entry(name)
                .or_default()
                .entry(labels_text(&labels, None))
                .or_default() += value;
        }
    }
    let mut out = String::new();
    for (name, series) in &counters {
        out.push_str(&format!(
            "# HELP {name} Metric autogenerated by statsd_exporter.\n# TYPE {name} counter\n"
        ));
        for (labels, value) in series {
            out.push_str(&format!("{name}{labels} {value}\n"));
        }
    }
    if let Mapped::Series { name, labels } = mapper.map(RESPONSE_TIME, Kind::Observer) {
        let histogram = mapper
            .find(RESPONSE_TIME, Kind::Observer)
            .is_none_or(|(m, _)| m.histogram);
        let (cumulative, sum) = statsd.response_times.histogram();
        let kind = if histogram { "histogram" } else { "summary" };
        out.push_str(&format!(
            "# HELP {name} Metric autogenerated by statsd_exporter.\n# TYPE {name} {kind}\n"
        ));
        let total = cumulative.last().copied().unwrap_or(0);
        if histogram {
            for (bound, count) in BUCKETS.iter().zip(&cumulative) {
                let l = labels_text(&labels, Some(("le", bound.to_string())));
                out.push_str(&format!("{name}_bucket{l} {count}\n"));
            }
            let l = labels_text(&labels, Some(("le", "+Inf".to_string())));
            out.push_str(&format!("{name}_bucket{l} {total}\n"));
        }
        let l = labels_text(&labels, None);
        out.push_str(&format!("{name}_sum{l} {sum}\n{name}_count{l} {total}\n"));
    }
    out.push_str(&super::exposition::to_text(
        &super::exposition::process_families(),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, labels: &[(&str, &str)]) -> Mapped {
        Mapped::Series {
            name: name.to_string(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// The reference's default mapping, name by name, as the statsd exporter applies it.
    #[test]
    fn the_default_mapping_names_series_as_the_reference_does() {
        let m = Mapper::reference_default();
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.edge.tenant.total_hits",
                Kind::Counter
            ),
            series(
                "ratelimit_service_rate_limit_total_hits",
                &[("domain", "edge"), ("key1", "tenant")]
            )
        );
        // Three levels and more: the first two keys.
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.edge.tenant_acme.path.x.over_limit",
                Kind::Counter
            ),
            series(
                "ratelimit_service_rate_limit_over_limit",
                &[
                    ("domain", "edge"),
                    ("key1", "tenant_acme"),
                    ("key2", "path")
                ]
            )
        );
        assert_eq!(
            m.map(
                "ratelimit.service.call.should_rate_limit.redis_error",
                Kind::Counter
            ),
            series(
                "ratelimit_service_should_rate_limit_error",
                &[("err_type", "redis_error")]
            )
        );
        assert_eq!(
            m.map(CALLS, Kind::Counter),
            series(
                "ratelimit_service_total_requests",
                &[("grpc_method", "ShouldRateLimit")]
            )
        );
        assert_eq!(
            m.map("ratelimit.service.config_load_success", Kind::Counter),
            series("ratelimit_service_config_load_success", &[])
        );
        // No mapping: the name, escaped.
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.edge.domain_not_found",
                Kind::Counter
            ),
            series("ratelimit_service_rate_limit_edge_domain_not_found", &[])
        );
        assert_eq!(m.response_time_scale(), 0.001);
    }

    #[test]
    fn a_mapping_file_is_read_with_globs_regexes_drops_and_types() {
        let m = Mapper::from_yaml(
            r#"
mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "hits_$1"
    timer_type: "histogram"
    labels: {key1: "${2}"}
  - match: 'ratelimit\.service\.rate_limit\.([^\.]*)\..*\.over_limit'
    match_type: regex
    name: "over"
    labels: {domain: "$1"}
  - match: "ratelimit.service.global_shadow_mode"
    action: drop
  - match: "ratelimit_server.*.response_time"
    name: "rt"
    match_metric_type: observer
"#,
        )
        .unwrap();
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.edge.tenant.total_hits",
                Kind::Counter
            ),
            series("hits_edge", &[("key1", "tenant")])
        );
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.edge.a.b.over_limit",
                Kind::Counter
            ),
            series("over", &[("domain", "edge")])
        );
        assert_eq!(
            m.map("ratelimit.service.global_shadow_mode", Kind::Counter),
            Mapped::Dropped
        );
        // Not a counter mapping: the counter of the same name is unmapped.
        assert_eq!(
            m.map(RESPONSE_TIME, Kind::Counter),
            series("ratelimit_server_ShouldRateLimit_response_time", &[])
        );
        assert_eq!(m.response_time_scale(), 1.0);
        for (bad, says) in [
            ("mappings: [{match: a}]", "no `name`"),
            (
                "mappings: [{match: '(', match_type: regex, name: x}]",
                "mappings[0]",
            ),
            ("other: 1", "no `mappings:`"),
        ] {
            let e = Mapper::from_yaml(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    /// `histogram_options` is not read; where a file sets it is said (the startup warning).
    #[test]
    fn histogram_options_are_named_as_unread() {
        let (_, unread) = Mapper::from_yaml_noting(
            "defaults:\n  histogram_options: {buckets: [0.1, 1]}\nmappings:\n  - match: \"a.*\"\n    name: \"a\"\n  - match: \"b.*\"\n    name: \"b\"\n    histogram_options: {buckets: [5]}\n",
        )
        .unwrap();
        assert_eq!(unread, ["defaults", "mappings[1]"]);
        let (_, none) =
            Mapper::from_yaml_noting("mappings:\n  - match: \"a.*\"\n    name: \"a\"\n").unwrap();
        assert!(none.is_empty());
    }

    /// Go's `regexp.Expand` and the exporter's escaping of mapped names.
    #[test]
    fn names_expand_and_escape_as_the_statsd_exporter_does() {
        let c = ["all".to_string(), "my-domain".to_string(), "b".to_string()];
        assert_eq!(expand("x_$1", &c), "x_my-domain");
        assert_eq!(expand("${1}_x", &c), "my-domain_x");
        assert_eq!(expand("$1_x", &c), "", "the group named 1_x");
        assert_eq!(expand("a$$b $ c$", &c), "a$b $ c$");
        let m = Mapper::from_yaml(
            "mappings:\n  - match: \"ratelimit.service.rate_limit.*.*.total_hits\"\n    name: \"hits_$1\"\n  - match: \"x.*\"\n    name: \"$9\"\n",
        )
        .unwrap();
        assert_eq!(
            m.map(
                "ratelimit.service.rate_limit.my-domain.k.total_hits",
                Kind::Counter
            ),
            series("hits_my_domain", &[])
        );
        assert_eq!(m.map("x.y", Kind::Counter), Mapped::Dropped);
    }

    #[test]
    fn render_gives_counters_the_histogram_and_process_families() {
        let metrics = Metrics::new();
        metrics.statsd.enable();
        let d: std::sync::Arc<str> = "edge".into();
        let p: std::sync::Arc<[String]> = vec!["tenant".to_string()].into();
        metrics
            .statsd
            .add(&d, &p, 3, super::super::Split::whole(3, true));
        metrics
            .statsd
            .call(std::time::Duration::from_millis(2), None);
        let text = render(&metrics, &Mapper::reference_default());
        for line in [
            "ratelimit_service_rate_limit_total_hits{domain=\"edge\",key1=\"tenant\"} 3\n",
            "ratelimit_service_rate_limit_within_limit{domain=\"edge\",key1=\"tenant\"} 3\n",
            "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 1\n",
            "ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",le=\"0.005\"} 1\n",
            "ratelimit_service_response_time_seconds_count{grpc_method=\"ShouldRateLimit\"} 1\n",
            "# TYPE ratelimit_service_config_load_success counter\n",
            // The process families in this port's text format too.
            "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total ",
        ] {
            assert!(text.contains(line), "{line}:\n{text}");
        }
        assert!(text.contains("\nprocess_resident_memory_bytes "), "{text}");
        // A mapping without `timer_type: histogram`: the exporter's default, a summary.
        let summary = Mapper::from_yaml(
            "mappings:\n  - match: \"ratelimit_server.*.response_time\"\n    name: rt\n",
        )
        .unwrap();
        let text = render(&metrics, &summary);
        assert!(text.contains("# TYPE rt summary\n"), "{text}");
        assert!(!text.contains("rt_bucket"), "{text}");
        assert!(
            text.contains("rt_count{} 1\n") || text.contains("rt_count 1\n"),
            "{text}"
        );
    }
}
