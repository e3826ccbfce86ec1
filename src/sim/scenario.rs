//! The scenario file of `tollgate simulate`: what fleet, store, faults and traffic to run.
//!
//! Read with the rules' YAML reader (`rules::yaml`), so every problem (an unknown key, a
//! number out of range, a rules path without rules, a setting `serve` would refuse) is
//! reported as `file:line:col: field: message`, all of them in one run, as `tollgate check`
//! reports rules. The names are part of the interface: docs/simulate.md documents them.
//!
//! Flow: [`Scenario::load`] parses the file → [`read`] walks it into a [`Scenario`] (the
//! settings through [`Settings::load`], the rules through [`crate::rules::load_path`], both
//! relative to the scenario file) → `sim::run`.

use std::path::{Path, PathBuf};

use crate::rules::error::{Pos, Problems, RuleError, RulesError};
use crate::rules::yaml::{self, Node, Value};
use crate::rules::{LoadOptions, RuleSet};
use crate::settings::{KEYS, Settings, Sources};

/// A whole scenario, checked.
#[derive(Debug)]
pub struct Scenario {
    /// The scenario file (relative paths inside it are relative to its directory).
    pub file: PathBuf,
    /// Virtual seconds to run.
    pub duration_s: u64,
    pub seed: u64,
    pub rules_path: PathBuf,
    pub rules: RuleSet,
    /// Every `serve` setting, the scenario's over the defaults.
    pub settings: Settings,
    pub store: StoreModel,
    pub replicas: FleetSize,
    pub traffic: Vec<Traffic>,
}

/// The simulated Redis: one primary, or a cluster of `nodes` primaries.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreModel {
    pub nodes: u32,
    pub latency: Latency,
    /// Script calls one node runs per second; past it, calls queue.
    pub ops_per_s: f64,
    pub faults: Vec<Fault>,
}

/// A round trip's time, log-normal through its median and 99th percentile.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Fault {
    pub at_s: f64,
    pub for_s: f64,
    pub kind: FaultKind,
    /// The cluster node it hits (`node: i`); every node when absent.
    pub node: Option<u32>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum FaultKind {
    /// The node refuses connections: every call fails at once.
    Down,
    /// Round trips take `latency` instead.
    Slow(Latency),
    /// `maxmemory` with `noeviction`: every script is refused (`OOM`), the node answers.
    Oom,
    /// Replicas `from..to` (by index, in start order) cannot reach the store: their calls go
    /// unanswered until the store timeout.
    Partition { from: u32, to: u32 },
}

impl FaultKind {
    pub fn name(&self) -> &'static str {
        match self {
            FaultKind::Down => "down",
            FaultKind::Slow(_) => "slow",
            FaultKind::Oom => "oom",
            FaultKind::Partition { .. } => "partition",
        }
    }
}

/// Replicas at the start and the autoscaler's changes.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetSize {
    pub start: u32,
    /// `(at_s, to)`, in time order.
    pub changes: Vec<(f64, u32)>,
}

/// One stream of requests.
#[derive(Clone, Debug, PartialEq)]
pub struct Traffic {
    pub domain: String,
    /// Descriptor entries: key, and the value's template.
    pub entries: Vec<(String, Template)>,
    /// The index range of `{zipf}` and `{uniform}`.
    pub tenants: u64,
    pub zipf_exponent: f64,
    /// Requests per second across the fleet.
    pub rate_per_s: f64,
    pub arrivals: Arrivals,
    pub routing: Routing,
    pub cost: u64,
}

/// A descriptor value: fixed text, or text around one `{zipf}` or `{uniform}` index.
#[derive(Clone, Debug, PartialEq)]
pub enum Template {
    Fixed(String),
    Indexed {
        before: String,
        pick: Pick,
        after: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    Zipf,
    Uniform,
}

/// When requests come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrivals {
    /// Independent arrivals (exponential gaps): real traffic's bunching.
    Poisson,
    /// One every 1/rate seconds exactly: a count that does not vary between seeds.
    Even,
}

/// Which replica a request goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// Round robin over the live replicas (Envoy's default).
    Even,
    /// A descriptor keeps its replica while the fleet size stays (hash of the values).
    Sticky,
    /// A uniformly random live replica.
    Random,
}

/// The most of a few numbers, so a typo cannot ask for a week of virtual time or a million
/// replicas (the simulation would run out of memory instead of saying why).
const MAX_DURATION_S: u64 = 86_400;
const MAX_REPLICAS: u64 = 5_000;
const MAX_NODES: u64 = 64;
const MAX_RATE: f64 = 10_000_000.0;

impl Scenario {
    /// Reads and checks the scenario file at `path`.
    pub fn load(path: &Path) -> Result<Scenario, RulesError> {
        let whole = |message: String| RulesError {
            errors: vec![RuleError::whole_file(path, message)],
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| whole(format!("cannot read the scenario: {e}")))?;
        Scenario::parse(path, &text)
    }

    /// Checks the scenario `text` (read from `path`, which relative paths start from).
    pub fn parse(path: &Path, text: &str) -> Result<Scenario, RulesError> {
        let mut out = Problems::new(path);
        let root = match yaml::parse(text) {
            Ok(Some(root)) => root,
            Ok(None) => {
                out.error(Pos { line: 1, col: 1 }, "", "the scenario is empty");
                return Err(RulesError { errors: out.errors });
            }
            Err(e) => {
                out.error(e.pos, "", e.message);
                return Err(RulesError { errors: out.errors });
            }
        };
        match read(&mut out, path, &root) {
            Some(s) if out.errors.is_empty() => Ok(s),
            _ => Err(RulesError { errors: out.errors }),
        }
    }
}

/// Walks the file; `None` when something is missing or wrong (recorded in `out`).
fn read(out: &mut Problems, path: &Path, root: &Node) -> Option<Scenario> {
    let f = yaml::fields(
        out,
        root,
        "",
        &[
            "duration_s",
            "seed",
            "rules",
            "settings",
            "store",
            "replicas",
            "traffic",
        ],
    )?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let duration_s = required(out, root, &f, "duration_s")
        .and_then(|n| positive_uint(out, n, "duration_s", MAX_DURATION_S));
    let seed = match f.get("seed") {
        Some(n) => yaml::uint(out, n, "seed", u64::MAX),
        None => Some(0),
    };
    let settings = match f.get("settings") {
        Some(n) => settings(out, n),
        None => Some(Settings::default()),
    };
    let rules_node = required(out, root, &f, "rules");
    let rules_path = rules_node
        .and_then(|n| yaml::string(out, n, "rules"))
        .map(|p| dir.join(p));
    // The rules are loaded with the settings that shape them (the default algorithm …).
    let rules = match (&rules_path, &settings, rules_node) {
        (Some(p), Some(s), Some(node)) => load_rules(out, node, p, s),
        _ => None,
    };
    let store = required(out, root, &f, "store").and_then(|n| store(out, n));
    let replicas = required(out, root, &f, "replicas").and_then(|n| replicas(out, n));
    let traffic = required(out, root, &f, "traffic").and_then(|n| traffic(out, n));
    if let Some(store) = &store {
        // Replica indexes are given in start order and never reused: a scale-in stops the
        // newest, a later scale-out starts new ones after every index used so far.
        let started = replicas.as_ref().map(|r| {
            let mut size = r.start;
            let mut started = r.start;
            for &(_, to) in &r.changes {
                started += to.saturating_sub(size);
                size = to;
            }
            started
        });
        for (i, (fault, node)) in store.faults.iter().zip(fault_nodes(root)).enumerate() {
            if let (FaultKind::Partition { to, .. }, Some(started)) = (&fault.kind, started)
                && *to > started
            {
                out.error(
                    node.pos,
                    &format!("store.faults[{i}].replicas"),
                    format!(
                        "names replicas up to {to}, but only {started} are ever started (indexes 0..{started}, in start order)"
                    ),
                );
            }
            if fault.node.is_some_and(|n| n >= store.nodes) {
                out.error(
                    node.pos,
                    &format!("store.faults[{i}].node"),
                    format!("the store has {} node(s), numbered from 0", store.nodes),
                );
            }
        }
    }
    if let (Some(rules), Some(traffic)) = (&rules, &traffic) {
        for (i, (t, node)) in traffic.iter().zip(traffic_nodes(root)).enumerate() {
            if !rules.domains.contains_key(&t.domain) {
                let mut known: Vec<&str> = rules.domains.keys().map(String::as_str).collect();
                known.sort_unstable();
                out.error(
                    child(node, "domain").unwrap_or(node).pos,
                    &format!("traffic[{i}].domain"),
                    format!(
                        "no rules for domain `{}` (the rules declare: {}): every request would pass",
                        t.domain,
                        known.join(", ")
                    ),
                );
            }
        }
    }
    Some(Scenario {
        file: path.to_path_buf(),
        duration_s: duration_s?,
        seed: seed?,
        rules_path: rules_path?,
        rules: rules?,
        settings: settings?,
        store: store?,
        replicas: replicas?,
        traffic: traffic?,
    })
}

/// The traffic streams' nodes, in order (for errors found once the whole file is read).
fn traffic_nodes(root: &Node) -> Vec<&Node> {
    match child(root, "traffic").map(|t| &t.value) {
        Some(Value::Seq(items)) => items.iter().collect(),
        _ => Vec::new(),
    }
}

/// The field `name` of a mapping node.
fn child<'n>(n: &'n Node, name: &str) -> Option<&'n Node> {
    match &n.value {
        Value::Map(pairs) => pairs.iter().find_map(|(k, v)| {
            matches!(&k.value, Value::Scalar { text, .. } if text == name).then_some(v)
        }),
        _ => None,
    }
}

/// The fault nodes, in order (for errors found once the whole file is read).
fn fault_nodes(root: &Node) -> Vec<&Node> {
    match child(root, "store")
        .and_then(|s| child(s, "faults"))
        .map(|f| &f.value)
    {
        Some(Value::Seq(items)) => items.iter().collect(),
        _ => Vec::new(),
    }
}

fn required<'n>(
    out: &mut Problems,
    parent: &Node,
    f: &yaml::Fields<'n>,
    name: &str,
) -> Option<&'n Node> {
    let found = f.get(name).copied();
    if found.is_none() {
        out.error(parent.pos, name, "missing (required)");
    }
    found
}

fn positive_uint(out: &mut Problems, node: &Node, field: &str, max: u64) -> Option<u64> {
    match yaml::uint(out, node, field, max)? {
        0 => {
            out.error(node.pos, field, "must be at least 1");
            None
        }
        n => Some(n),
    }
}

/// An unquoted number (`0.4`, `20000`, `1e5`) in `min..=max`.
fn number(out: &mut Problems, node: &Node, field: &str, min: f64, max: f64) -> Option<f64> {
    let parsed = match &node.value {
        Value::Scalar {
            text,
            quoted: false,
        } => text.parse::<f64>().ok().filter(|x| x.is_finite()),
        _ => None,
    };
    match parsed {
        Some(x) if (min..=max).contains(&x) => Some(x),
        Some(x) => {
            out.error(
                node.pos,
                field,
                format!("{x} is out of range (from {min} to {max})"),
            );
            None
        }
        None => {
            out.error(
                node.pos,
                field,
                format!("expected a number, found {}", node.kind()),
            );
            None
        }
    }
}

/// `settings:`: any `serve` setting by its file name. Each value is checked alone, so an
/// error names its line; then all together (cross-setting checks).
fn settings(out: &mut Problems, node: &Node) -> Option<Settings> {
    let Value::Map(pairs) = &node.value else {
        if node.is_null() {
            return Some(Settings::default());
        }
        out.error(node.pos, "settings", "must be a mapping of serve settings");
        return None;
    };
    let before = out.errors.len();
    let mut flags: Vec<(&'static str, String)> = Vec::new();
    for (k, v) in pairs {
        let name = match &k.value {
            Value::Scalar { text, .. } => text.as_str(),
            _ => "",
        };
        let field = yaml::join("settings", name);
        let Some(key) = KEYS.iter().find(|key| key.name == name) else {
            out.error(
                k.pos,
                &field,
                "not a serve setting (see `tollgate serve --help`)",
            );
            continue;
        };
        if name == "store" || name == "rules" {
            out.error(
                k.pos,
                &field,
                "set by the scenario itself (its `store:` and `rules:`)",
            );
            continue;
        }
        let Some(value) = yaml::string(out, v, &field) else {
            continue;
        };
        if flags.iter().any(|(n, _)| *n == key.name) {
            out.error(k.pos, &field, "given twice");
            continue;
        }
        let alone = Settings::load(&Sources {
            flags: vec![(key.name, value.clone())],
            ..Sources::default()
        });
        if let Err(e) = alone {
            out.error(v.pos, &field, e.to_string());
            continue;
        }
        flags.push((key.name, value));
    }
    if out.errors.len() > before {
        return None;
    }
    match Settings::load(&Sources {
        flags,
        ..Sources::default()
    }) {
        Ok(s) => Some(s),
        Err(e) => {
            out.error(node.pos, "settings", e.to_string());
            None
        }
    }
}

fn load_rules(out: &mut Problems, node: &Node, path: &Path, s: &Settings) -> Option<RuleSet> {
    let opts = LoadOptions {
        default_algorithm: s.default_algorithm,
        sliding_log_max_limit: s.sliding_log_max_limit,
        rlqs_report_interval_ms: s.rlqs_report_interval_ms,
    };
    match crate::rules::load_path(path, opts) {
        Ok(set) if set.domains.is_empty() => {
            out.error(
                node.pos,
                "rules",
                format!(
                    "{}: no rules here (no *.yaml or *.yml file declares a domain)",
                    path.display()
                ),
            );
            None
        }
        Ok(set) => Some(set),
        Err(e) => {
            out.error(node.pos, "rules", e.to_string());
            None
        }
    }
}

fn latency(out: &mut Problems, node: &Node, path: &str) -> Option<Latency> {
    let f = yaml::fields(out, node, path, &["p50", "p99"])?;
    let p50_field = yaml::join(path, "p50");
    let p99_field = yaml::join(path, "p99");
    let p50 = match f.get("p50") {
        Some(n) => number(out, n, &p50_field, 0.0, 60_000.0),
        None => {
            out.error(node.pos, &p50_field, "missing (required)");
            None
        }
    }?;
    let p99 = match f.get("p99") {
        Some(n) => number(out, n, &p99_field, 0.0, 60_000.0)?,
        None => p50,
    };
    if p99 < p50 {
        out.error(
            node.pos,
            &p99_field,
            format!("p99 ({p99} ms) is below p50 ({p50} ms)"),
        );
        return None;
    }
    Some(Latency {
        p50_ms: p50,
        p99_ms: p99,
    })
}

fn store(out: &mut Problems, node: &Node) -> Option<StoreModel> {
    let f = yaml::fields(
        out,
        node,
        "store",
        &["nodes", "latency_ms", "ops_per_s", "faults"],
    )?;
    let nodes = match f.get("nodes") {
        Some(n) => positive_uint(out, n, "store.nodes", MAX_NODES).map(|n| n as u32),
        None => Some(1),
    };
    let latency = match f.get("latency_ms") {
        Some(n) => latency(out, n, "store.latency_ms"),
        None => Some(Latency {
            p50_ms: 0.4,
            p99_ms: 2.0,
        }),
    };
    let ops_per_s = match f.get("ops_per_s") {
        Some(n) => number(out, n, "store.ops_per_s", 1.0, 1e9),
        None => Some(100_000.0),
    };
    let mut faults = Some(Vec::new());
    if let Some(list) = f
        .get("faults")
        .and_then(|n| yaml::seq(out, n, "store.faults"))
    {
        for (i, item) in list.iter().enumerate() {
            let fault = fault(out, item, &format!("store.faults[{i}]"));
            match (&mut faults, fault) {
                (Some(all), Some(one)) => all.push(one),
                _ => faults = None,
            }
        }
    }
    Some(StoreModel {
        nodes: nodes?,
        latency: latency?,
        ops_per_s: ops_per_s?,
        faults: faults?,
    })
}

fn fault(out: &mut Problems, node: &Node, path: &str) -> Option<Fault> {
    let f = yaml::fields(
        out,
        node,
        path,
        &["at_s", "for_s", "kind", "latency_ms", "replicas", "node"],
    )?;
    let field = |name: &str| yaml::join(path, name);
    let at_s = match f.get("at_s") {
        Some(n) => number(out, n, &field("at_s"), 0.0, MAX_DURATION_S as f64),
        None => {
            out.error(node.pos, &field("at_s"), "missing (required)");
            None
        }
    };
    let for_s = match f.get("for_s") {
        Some(n) => number(out, n, &field("for_s"), 0.001, MAX_DURATION_S as f64),
        None => {
            out.error(node.pos, &field("for_s"), "missing (required)");
            None
        }
    };
    let kind_node = f.get("kind").copied();
    let kind_name = match kind_node {
        Some(n) => yaml::string(out, n, &field("kind")),
        None => {
            out.error(node.pos, &field("kind"), "missing (required)");
            None
        }
    };
    let node_index = match f.get("node") {
        Some(n) => yaml::uint(out, n, &field("node"), MAX_NODES).map(|n| Some(n as u32)),
        None => Some(None),
    };
    let only = |out: &mut Problems, name: &str, kind: &str| {
        if let Some(n) = f.get(name) {
            out.error(
                n.pos,
                &field(name),
                format!("only a fault of kind {kind} takes {name}"),
            );
        }
    };
    let kind = match kind_name.as_deref() {
        Some("down") | Some("oom") | Some("partition") => {
            only(out, "latency_ms", "slow");
            match kind_name.as_deref() {
                Some("down") => {
                    only(out, "replicas", "partition");
                    Some(FaultKind::Down)
                }
                Some("oom") => {
                    only(out, "replicas", "partition");
                    Some(FaultKind::Oom)
                }
                _ => partition(out, node, &f, path),
            }
        }
        Some("slow") => {
            only(out, "replicas", "partition");
            match f.get("latency_ms") {
                Some(n) => latency(out, n, &field("latency_ms")).map(FaultKind::Slow),
                None => {
                    out.error(
                        node.pos,
                        &field("latency_ms"),
                        "a slow fault needs latency_ms: {p50: …, p99: …}",
                    );
                    None
                }
            }
        }
        Some(other) => {
            out.error(
                kind_node.map_or(node.pos, |n| n.pos),
                &field("kind"),
                format!("unknown fault kind `{other}` (expected down, slow, oom or partition)"),
            );
            None
        }
        None => None,
    };
    Some(Fault {
        at_s: at_s?,
        for_s: for_s?,
        kind: kind?,
        node: node_index?,
    })
}

fn partition(
    out: &mut Problems,
    node: &Node,
    f: &yaml::Fields<'_>,
    path: &str,
) -> Option<FaultKind> {
    let field = yaml::join(path, "replicas");
    let Some(list) = f.get("replicas") else {
        out.error(
            node.pos,
            &field,
            "a partition needs replicas: [from, to] (replica indexes, to excluded)",
        );
        return None;
    };
    let items = yaml::seq(out, list, &field)?;
    if items.len() != 2 {
        out.error(list.pos, &field, "expected [from, to]");
        return None;
    }
    let from = yaml::uint(out, &items[0], &field, MAX_REPLICAS)? as u32;
    let to = yaml::uint(out, &items[1], &field, MAX_REPLICAS)? as u32;
    if from >= to {
        out.error(
            list.pos,
            &field,
            format!("from ({from}) must be below to ({to})"),
        );
        return None;
    }
    Some(FaultKind::Partition { from, to })
}

fn replicas(out: &mut Problems, node: &Node) -> Option<FleetSize> {
    let f = yaml::fields(out, node, "replicas", &["start", "changes"])?;
    let start = match f.get("start") {
        Some(n) => positive_uint(out, n, "replicas.start", MAX_REPLICAS).map(|n| n as u32),
        None => {
            out.error(node.pos, "replicas.start", "missing (required)");
            None
        }
    };
    let mut changes = Some(Vec::new());
    if let Some(list) = f
        .get("changes")
        .and_then(|n| yaml::seq(out, n, "replicas.changes"))
    {
        let mut last = -1.0;
        for (i, item) in list.iter().enumerate() {
            let path = format!("replicas.changes[{i}]");
            let change = yaml::fields(out, item, &path, &["at_s", "to"]).and_then(|c| {
                let at = c
                    .get("at_s")
                    .and_then(|n| number(out, n, &yaml::join(&path, "at_s"), 0.0, 1e6));
                let to = c
                    .get("to")
                    .and_then(|n| positive_uint(out, n, &yaml::join(&path, "to"), MAX_REPLICAS));
                if !c.contains_key("at_s") || !c.contains_key("to") {
                    out.error(item.pos, &path, "needs at_s and to");
                }
                Some((at?, to? as u32))
            });
            match change {
                Some((at, _)) if at <= last => {
                    out.error(item.pos, &path, "changes must be in time order");
                    changes = None;
                }
                Some(c) => {
                    last = c.0;
                    if let Some(all) = &mut changes {
                        all.push(c);
                    }
                }
                None => changes = None,
            }
        }
    }
    Some(FleetSize {
        start: start?,
        changes: changes?,
    })
}

fn traffic(out: &mut Problems, node: &Node) -> Option<Vec<Traffic>> {
    let list = yaml::seq(out, node, "traffic")?;
    if list.is_empty() {
        out.error(node.pos, "traffic", "no traffic: give at least one stream");
        return None;
    }
    let mut all = Some(Vec::new());
    for (i, item) in list.iter().enumerate() {
        let one = stream(out, item, &format!("traffic[{i}]"));
        match (&mut all, one) {
            (Some(all), Some(one)) => all.push(one),
            _ => all = None,
        }
    }
    all
}

fn stream(out: &mut Problems, node: &Node, path: &str) -> Option<Traffic> {
    let f = yaml::fields(
        out,
        node,
        path,
        &[
            "domain",
            "entries",
            "tenants",
            "zipf_exponent",
            "rate_per_s",
            "arrivals",
            "routing",
            "cost",
        ],
    )?;
    let field = |name: &str| yaml::join(path, name);
    let domain = match f.get("domain") {
        Some(n) => yaml::string(out, n, &field("domain")),
        None => {
            out.error(node.pos, &field("domain"), "missing (required)");
            None
        }
    };
    let entries = match f.get("entries") {
        Some(n) => entries(out, n, &field("entries")),
        None => {
            out.error(node.pos, &field("entries"), "missing (required)");
            None
        }
    };
    let tenants = match f.get("tenants") {
        Some(n) => positive_uint(out, n, &field("tenants"), 1 << 40),
        None => Some(1),
    };
    let zipf_exponent = match f.get("zipf_exponent") {
        Some(n) => number(out, n, &field("zipf_exponent"), 0.0, 10.0),
        None => Some(1.0),
    };
    let rate_per_s = match f.get("rate_per_s") {
        Some(n) => number(out, n, &field("rate_per_s"), 0.001, MAX_RATE),
        None => {
            out.error(node.pos, &field("rate_per_s"), "missing (required)");
            None
        }
    };
    let routing = match f.get("routing") {
        None => Some(Routing::Even),
        Some(n) => match yaml::string(out, n, &field("routing")).as_deref() {
            Some("even") => Some(Routing::Even),
            Some("sticky") => Some(Routing::Sticky),
            Some("random") => Some(Routing::Random),
            Some(other) => {
                out.error(
                    n.pos,
                    &field("routing"),
                    format!("unknown routing `{other}` (expected even, sticky or random)"),
                );
                None
            }
            None => None,
        },
    };
    let arrivals = match f.get("arrivals") {
        None => Some(Arrivals::Poisson),
        Some(n) => match yaml::string(out, n, &field("arrivals")).as_deref() {
            Some("poisson") => Some(Arrivals::Poisson),
            Some("even") => Some(Arrivals::Even),
            Some(other) => {
                out.error(
                    n.pos,
                    &field("arrivals"),
                    format!("unknown arrivals `{other}` (expected poisson or even)"),
                );
                None
            }
            None => None,
        },
    };
    let cost = match f.get("cost") {
        Some(n) => positive_uint(out, n, &field("cost"), u64::from(u32::MAX)),
        None => Some(1),
    };
    Some(Traffic {
        domain: domain?,
        entries: entries?,
        tenants: tenants?,
        zipf_exponent: zipf_exponent?,
        rate_per_s: rate_per_s?,
        arrivals: arrivals?,
        routing: routing?,
        cost: cost?,
    })
}

fn entries(out: &mut Problems, node: &Node, path: &str) -> Option<Vec<(String, Template)>> {
    let list = yaml::seq(out, node, path)?;
    if list.is_empty() {
        out.error(
            node.pos,
            path,
            "no entries: a descriptor needs at least one",
        );
        return None;
    }
    let mut all = Some(Vec::new());
    for (i, item) in list.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let one = yaml::fields(out, item, &p, &["key", "value"]).and_then(|f| {
            let key = f.get("key").and_then(|n| yaml::string(out, n, &p));
            if !f.contains_key("key") {
                out.error(item.pos, &yaml::join(&p, "key"), "missing (required)");
            }
            let value = match f.get("value") {
                Some(n) => yaml::string(out, n, &p).and_then(|v| template(out, n, &p, &v)),
                None => {
                    out.error(item.pos, &yaml::join(&p, "value"), "missing (required)");
                    None
                }
            };
            Some((key?, value?))
        });
        match (&mut all, one) {
            (Some(all), Some(one)) => all.push(one),
            _ => all = None,
        }
    }
    all
}

fn template(out: &mut Problems, node: &Node, path: &str, value: &str) -> Option<Template> {
    let found: Vec<(usize, Pick, usize)> = [("{zipf}", Pick::Zipf), ("{uniform}", Pick::Uniform)]
        .iter()
        .flat_map(|(pat, pick)| {
            value
                .match_indices(pat)
                .map(move |(at, _)| (at, *pick, pat.len()))
        })
        .collect();
    match found.as_slice() {
        [] => Some(Template::Fixed(value.to_string())),
        [(at, pick, len)] => Some(Template::Indexed {
            before: value[..*at].to_string(),
            pick: *pick,
            after: value[at + len..].to_string(),
        }),
        _ => {
            out.error(
                node.pos,
                &yaml::join(path, "value"),
                "at most one {zipf} or {uniform} in a value",
            );
            None
        }
    }
}

impl Template {
    /// The value for tenant index `i` (ignored by a fixed value).
    pub fn render(&self, i: u64, buf: &mut String) {
        use std::fmt::Write;
        buf.clear();
        match self {
            Template::Fixed(v) => buf.push_str(v),
            Template::Indexed { before, after, .. } => {
                buf.push_str(before);
                let _ = write!(buf, "{i}");
                buf.push_str(after);
            }
        }
    }

    pub fn pick(&self) -> Option<Pick> {
        match self {
            Template::Fixed(_) => None,
            Template::Indexed { pick, .. } => Some(*pick),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, scenario: &str) -> Result<Scenario, RulesError> {
        std::fs::create_dir_all(dir.join("rules")).unwrap();
        std::fs::write(
            dir.join("rules/edge.yaml"),
            "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 100}\n",
        )
        .unwrap();
        let file = dir.join("s.yaml");
        std::fs::write(&file, scenario).unwrap();
        Scenario::load(&file)
    }

    const GOOD: &str = "duration_s: 30\nseed: 7\nrules: rules/\nsettings:\n  lease_max_batch: 20\n  store_timeout_ms: 10\n  fallback: local\nstore:\n  nodes: 3\n  latency_ms: {p50: 0.4, p99: 2.0}\n  ops_per_s: 100000\n  faults:\n    - {at_s: 10, for_s: 5, kind: down}\n    - {at_s: 20, for_s: 1, kind: slow, latency_ms: {p50: 5, p99: 30}}\n    - {at_s: 22, for_s: 1, kind: partition, replicas: [0, 2]}\nreplicas:\n  start: 3\n  changes: [{at_s: 15, to: 6}]\ntraffic:\n  - domain: edge\n    entries: [{key: tenant, value: \"t{zipf}\"}]\n    tenants: 1000\n    zipf_exponent: 1.1\n    rate_per_s: 2000\n    routing: sticky\n";

    #[test]
    fn a_full_scenario_reads_into_its_parts() {
        let dir = tempfile::tempdir().unwrap();
        let s = write(dir.path(), GOOD).unwrap();
        assert_eq!((s.duration_s, s.seed), (30, 7));
        assert_eq!(s.settings.lease_max_batch, 20);
        assert_eq!(s.store.nodes, 3);
        assert_eq!(s.store.faults.len(), 3);
        assert_eq!(
            s.store.faults[2].kind,
            FaultKind::Partition { from: 0, to: 2 }
        );
        assert_eq!(s.replicas.changes, [(15.0, 6)]);
        assert_eq!(s.traffic[0].routing, Routing::Sticky);
        let mut v = String::new();
        s.traffic[0].entries[0].1.render(42, &mut v);
        assert_eq!(v, "t42");
        assert!(s.rules.domains.contains_key("edge"));
    }

    #[test]
    fn every_problem_is_reported_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let bad = GOOD
            .replace("seed: 7", "seed: 7\nsped: 3")
            .replace("store_timeout_ms: 10", "store_timeout_ms: -1")
            .replace("lease_max_batch: 20", "lease_max_bach: 20")
            .replace("kind: down", "kind: gone")
            .replace("rate_per_s: 2000", "rate_per_s: lots")
            .replace("routing: sticky", "routing: sideways");
        let e = write(dir.path(), &bad).unwrap_err().to_string();
        for want in [
            "s.yaml:3:1: sped: unknown field",
            "s.yaml:6:3: settings.lease_max_bach: not a serve setting",
            "s.yaml:7:21: settings.store_timeout_ms:",
            "store.faults[0].kind: unknown fault kind `gone`",
            "traffic[0].rate_per_s: expected a number, found `lots`",
            "traffic[0].routing: unknown routing `sideways`",
        ] {
            assert!(e.contains(want), "missing {want:?} in:\n{e}");
        }
    }

    #[test]
    fn a_partition_of_replicas_the_fleet_never_has_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = write(
            dir.path(),
            &GOOD.replace("replicas: [0, 2]", "replicas: [0, 9]"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("s.yaml:15:7: store.faults[2].replicas: names replicas up to 9, but only 6 are ever started"),
            "{e}"
        );
    }

    #[test]
    fn a_stream_for_a_domain_without_rules_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = write(
            dir.path(),
            &GOOD.replace("  - domain: edge", "  - domain: egde"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("s.yaml:20:13: traffic[0].domain: no rules for domain `egde` (the rules declare: edge)"),
            "{e}"
        );
    }

    #[test]
    fn a_rules_path_without_rules_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = write(
            dir.path(),
            &GOOD.replace("rules: rules/", "rules: nothing/"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("s.yaml:3:8: rules:"), "{e}");
        std::fs::create_dir_all(dir.path().join("empty")).unwrap();
        let e = write(dir.path(), &GOOD.replace("rules: rules/", "rules: empty/"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no rules here"), "{e}");
    }
}
