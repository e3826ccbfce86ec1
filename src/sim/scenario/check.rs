//! The checks that need more than one section of the scenario, made once every section is
//! read: a fault must name replicas the fleet starts and a node the store has, and a stream
//! must go to a domain the rules declare.
//!
//! Flow: [`read`](super::read::read) hands over the sections it read → each check finds the
//! YAML node of what it refuses ([`fault_nodes`], [`traffic_nodes`]) → the problem is recorded
//! at that node's line.

use super::regions::RegionsModel;
use super::replicas::FleetSize;
use super::store::{FaultKind, StoreModel};
use super::traffic::Traffic;
use crate::rules::RuleSet;
use crate::rules::error::Problems;
use crate::rules::yaml::{Node, Value};

/// Each fault of `store` against the fleet and the store: a partition names only replicas
/// the fleet ever starts, and a fault's node is one the store has.
pub(super) fn faults(
    out: &mut Problems,
    root: &Node,
    store: &StoreModel,
    replicas: Option<&FleetSize>,
) {
    let started = replicas.map(started);
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

/// How many replicas the fleet ever starts (in each region). Replica indexes are given in
/// start order and never reused: a scale-in stops the newest, a later scale-out starts new
/// ones after every index used so far.
fn started(r: &FleetSize) -> u32 {
    let mut size = r.start;
    let mut started = r.start;
    for &(_, to) in &r.changes {
        started += to.saturating_sub(size);
        size = to;
    }
    started
}

/// Each cut of `regions` that names replicas names only replicas each region ever starts.
pub(super) fn cuts(out: &mut Problems, root: &Node, regions: &RegionsModel, fleet: &FleetSize) {
    let started = started(fleet);
    let nodes: Vec<&Node> = match child(root, "regions")
        .and_then(|r| child(r, "global_faults"))
        .map(|f| &f.value)
    {
        Some(Value::Seq(items)) => items.iter().collect(),
        _ => Vec::new(),
    };
    for (i, (cut, node)) in regions.cuts.iter().zip(nodes).enumerate() {
        if let Some((_, to)) = cut.replicas
            && to > started
        {
            out.error(
                child(node, "replicas").unwrap_or(node).pos,
                &format!("regions.global_faults[{i}].replicas"),
                format!(
                    "names replicas up to {to}, but each region only ever starts {started} (indexes 0..{started}, in start order)"
                ),
            );
        }
    }
}

/// Each stream of `traffic` goes to a domain `rules` declare (else every request would pass).
pub(super) fn domains(out: &mut Problems, root: &Node, rules: &RuleSet, traffic: &[Traffic]) {
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

/// With `regions:`, each stream names one of them (its replicas are that region's); without,
/// none does.
pub(super) fn stream_regions(
    out: &mut Problems,
    root: &Node,
    regions: Option<&RegionsModel>,
    traffic: &[Traffic],
) {
    for (i, (t, node)) in traffic.iter().zip(traffic_nodes(root)).enumerate() {
        let at = child(node, "region").unwrap_or(node).pos;
        let field = format!("traffic[{i}].region");
        match (regions, &t.region) {
            (Some(r), Some(name)) if !r.names.contains(name) => out.error(
                at,
                &field,
                format!("no region `{name}` (regions.names: {})", r.names.join(", ")),
            ),
            (Some(r), None) => out.error(
                at,
                &field,
                format!(
                    "missing: with regions, a stream names its region ({})",
                    r.names.join(", ")
                ),
            ),
            (None, Some(_)) => out.error(
                at,
                &field,
                "only a scenario with `regions:` routes a stream to a region",
            ),
            _ => {}
        }
    }
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
