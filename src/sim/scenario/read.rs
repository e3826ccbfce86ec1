//! The walk over a scenario file: its top-level fields into a [`Scenario`], the `settings:`
//! checked as `serve` checks them, the `rules:` loaded with those settings (each problem recorded
//! with its line, the walk going on).
//!
//! Flow: [`read`] takes the top-level fields → `settings:` ([`settings`], each setting alone
//! and then together) → `rules:` ([`load_rules`], shaped by the settings) → each section
//! through its own reader (`store.rs`, `replicas.rs`, `traffic.rs`, `envoy.rs`) → the checks
//! across sections (`check.rs`) → a [`Scenario`] when nothing was missing or wrong.

use std::path::Path;

use super::envoy::envoy;
use super::fields::positive_uint;
use super::regions::{RegionsModel, regions};
use super::replicas::replicas;
use super::store::store;
use super::traffic::traffic;
use super::{MAX_DURATION_S, MAX_REPLICAS, Scenario, check};
use crate::rules::error::Problems;
use crate::rules::yaml::{self, Node, Value};
use crate::rules::{LoadOptions, RuleSet};
use crate::settings::{KEYS, Settings, Sources};

/// Walks the file; `None` when something is missing or wrong (recorded in `out`).
pub(super) fn read(out: &mut Problems, path: &Path, root: &Node) -> Option<Scenario> {
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
            "envoy",
            "regions",
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
    let envoy = match f.get("envoy") {
        Some(n) => envoy(out, n),
        None => Some(super::EnvoyModel::default()),
    };
    let regions = match f.get("regions") {
        Some(n) => regions(out, n).map(Some),
        None => Some(None),
    };
    if let (Some(Some(r)), Some(s), Some(n)) = (&regions, &settings, f.get("regions")) {
        region_settings(out, n, s, r);
    }
    if let (Some(Some(r)), Some(fleet)) = (&regions, &replicas) {
        check::cuts(out, root, r, fleet);
    }
    // Every region runs the whole fleet: the replicas in all stay within the bound.
    if let (Some(Some(r)), Some(fleet), Some(n)) = (&regions, &replicas, f.get("regions")) {
        let most = std::iter::once(fleet.start)
            .chain(fleet.changes.iter().map(|c| c.1))
            .max()
            .unwrap_or(0);
        let all = u64::from(most) * r.names.len() as u64;
        if all > MAX_REPLICAS {
            out.error(
                n.pos,
                "regions",
                format!(
                    "{} regions of up to {most} replicas each is {all} replicas; at most {MAX_REPLICAS} in all",
                    r.names.len()
                ),
            );
        }
    }
    if let (Some(regions), Some(traffic)) = (&regions, &traffic) {
        check::stream_regions(out, root, regions.as_ref(), traffic);
    }
    if let Some(store) = &store {
        check::faults(out, root, store, replicas.as_ref());
    }
    if let (Some(rules), Some(traffic)) = (&rules, &traffic) {
        check::domains(out, root, rules, traffic);
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
        envoy: envoy?,
        regions: regions?,
    })
}

/// The settings' region checks (`region_exchange_ms`, `region_lease_ms`, `region_floor`), as
/// `serve` makes them with a global store, for the regions of `regions:`.
fn region_settings(out: &mut Problems, node: &Node, s: &Settings, r: &RegionsModel) {
    let mut with = s.clone();
    with.global_store = "redis://global.simulated:6379".into();
    with.regions = r
        .names
        .iter()
        .zip(&r.weights)
        .map(|(name, w)| format!("{name}={w}"))
        .collect::<Vec<_>>()
        .join(",");
    with.region = r.names[0].clone();
    if let Err(e) = with.validate() {
        out.error(node.pos, "settings", e.to_string());
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
        if matches!(name, "global_store" | "region" | "regions") {
            out.error(
                k.pos,
                &field,
                "set by the scenario's `regions:` (its names and global store)",
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
