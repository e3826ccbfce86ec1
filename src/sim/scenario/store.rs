//! The scenario's `store:` section: the simulated Redis (nodes, round-trip latency, scripts
//! a second) and the faults on its schedule.
//!
//! Flow: [`store`] reads the section → [`latency`] for its round trips (and a slow fault's)
//! → [`fault`] for each fault, [`partition`] for a partition's replicas → a [`StoreModel`],
//! which `sim::store` builds its nodes from.

use super::MAX_NODES;
use super::fields::{number, positive_uint, replica_range, window};
use crate::rules::error::Problems;
use crate::rules::yaml::{self, Node};

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

pub(super) fn latency(out: &mut Problems, node: &Node, path: &str) -> Option<Latency> {
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

pub(super) fn store(out: &mut Problems, node: &Node) -> Option<StoreModel> {
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
    let at = window(out, node, &f, path);
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
        at_s: at?.0,
        for_s: at?.1,
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
    let (from, to) = replica_range(out, list, &field)?;
    Some(FaultKind::Partition { from, to })
}
