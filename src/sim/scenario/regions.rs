//! The scenario's `regions:` section: several regions sharing the rules' `global: true` limits,
//! each with its own fleet (`replicas:`) on its own store (one like `store:`), and the global
//! store they exchange demand through: its round trip from a region and when a region is cut
//! off from it.
//!
//! Flow: [`regions`] reads the names, the global store's latency and its faults ([`cut`]) → a
//! [`RegionsModel`], which the run starts one fleet and one store per name from, and one model
//! of the global store (`sim/regions.rs`); each traffic stream names its region (`check.rs`).

use super::fields::{number, replica_range, window};
use super::store::{Latency, latency};
use crate::rules::error::Problems;
use crate::rules::yaml::{self, Node};

/// The most regions a scenario may declare (the settings' `regions` list has no bound, but a
/// planner's question is about a few).
const MAX_REGIONS: usize = 16;

/// Regions sharing the global limits.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionsModel {
    /// The regions, in order (as the settings' `regions` lists them).
    pub names: Vec<String>,
    /// Their weights (`weights:`; 1 each by default): each one's partition share.
    pub weights: Vec<f64>,
    /// A round trip from any region to the global store.
    pub global_latency: Latency,
    /// When regions are cut off from the global store.
    pub cuts: Vec<Cut>,
}

/// A region (or every region) cut off from the global store: its calls there get no answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Cut {
    pub at_s: f64,
    pub for_s: f64,
    /// Indexes into `names`; every region when `None`.
    pub regions: Option<Vec<usize>>,
    /// Only these replicas of those regions (`from..to`, in start order); all when `None`.
    pub replicas: Option<(u32, u32)>,
}

impl RegionsModel {
    /// Whether the calls of replica `replica` of region `r` to the global store go unanswered
    /// at `t_us`.
    pub fn cut_off(&self, r: usize, replica: u32, t_us: u64) -> bool {
        let t = t_us as f64 / 1e6;
        self.cuts.iter().any(|c| {
            (c.at_s..c.at_s + c.for_s).contains(&t)
                && c.regions.as_ref().is_none_or(|rs| rs.contains(&r))
                && c.replicas
                    .is_none_or(|(from, to)| (from..to).contains(&replica))
        })
    }
}

pub(super) fn regions(out: &mut Problems, node: &Node) -> Option<RegionsModel> {
    let f = yaml::fields(
        out,
        node,
        "regions",
        &["names", "weights", "global_latency_ms", "global_faults"],
    )?;
    let names = match f.get("names") {
        Some(n) => names(out, n),
        None => {
            out.error(node.pos, "regions.names", "missing (required)");
            None
        }
    };
    let weights = match (f.get("weights"), &names) {
        (None, Some(names)) => Some(vec![1.0; names.len()]),
        (None, None) => None,
        (Some(n), names) => weights(out, n, names.as_ref().map_or(0, Vec::len)),
    };
    let global_latency = match f.get("global_latency_ms") {
        Some(n) => latency(out, n, "regions.global_latency_ms"),
        None => {
            out.error(
                node.pos,
                "regions.global_latency_ms",
                "missing (required): a round trip to the global store, {p50: …, p99: …}",
            );
            None
        }
    };
    let mut cuts = Some(Vec::new());
    if let Some(list) = f
        .get("global_faults")
        .and_then(|n| yaml::seq(out, n, "regions.global_faults"))
    {
        for (i, item) in list.iter().enumerate() {
            let one = cut(
                out,
                item,
                &format!("regions.global_faults[{i}]"),
                names.as_deref().unwrap_or_default(),
            );
            match (&mut cuts, one) {
                (Some(all), Some(one)) => all.push(one),
                _ => cuts = None,
            }
        }
    }
    Some(RegionsModel {
        names: names?,
        weights: weights?,
        global_latency: global_latency?,
        cuts: cuts?,
    })
}

/// The region names: two or more, distinct, as the settings' `regions` takes them.
fn names(out: &mut Problems, node: &Node) -> Option<Vec<String>> {
    let items = yaml::seq(out, node, "regions.names")?;
    let mut names = Vec::new();
    for item in items {
        let name = yaml::string(out, item, "regions.names")?;
        let fine = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
        if !fine {
            out.error(
                item.pos,
                "regions.names",
                format!("`{name}`: a region name is letters, digits, `-`, `_` and `.`"),
            );
            return None;
        }
        if names.contains(&name) {
            out.error(
                item.pos,
                "regions.names",
                format!("`{name}` is given twice"),
            );
            return None;
        }
        names.push(name);
    }
    if !(2..=MAX_REGIONS).contains(&names.len()) {
        out.error(
            node.pos,
            "regions.names",
            format!("give 2 to {MAX_REGIONS} regions"),
        );
        return None;
    }
    Some(names)
}

/// The regions' weights: one per name, each from 0.001 to 1000 (as `serve` takes them).
fn weights(out: &mut Problems, node: &Node, names: usize) -> Option<Vec<f64>> {
    let items = yaml::seq(out, node, "regions.weights")?;
    if items.len() != names {
        out.error(
            node.pos,
            "regions.weights",
            format!("give one weight per region ({names})"),
        );
        return None;
    }
    let mut all = Some(Vec::new());
    for item in items {
        match (
            &mut all,
            number(out, item, "regions.weights", 0.001, 1000.0),
        ) {
            (Some(all), Some(w)) => all.push(w),
            _ => all = None,
        }
    }
    all
}

fn cut(out: &mut Problems, node: &Node, path: &str, names: &[String]) -> Option<Cut> {
    let f = yaml::fields(out, node, path, &["at_s", "for_s", "regions", "replicas"])?;
    let field = |name: &str| yaml::join(path, name);
    let at = window(out, node, &f, path);
    let regions = match f.get("regions") {
        None => Some(None),
        Some(list) => {
            let items = yaml::seq(out, list, &field("regions"))?;
            let mut picked = Vec::new();
            for item in items {
                let name = yaml::string(out, item, &field("regions"))?;
                match names.iter().position(|n| *n == name) {
                    Some(i) => picked.push(i),
                    None => {
                        out.error(
                            item.pos,
                            &field("regions"),
                            format!("no region `{name}` (regions.names: {})", names.join(", ")),
                        );
                        return None;
                    }
                }
            }
            Some(Some(picked))
        }
    };
    let replicas = match f.get("replicas") {
        None => Some(None),
        Some(list) => replica_range(out, list, &field("replicas")).map(Some),
    };
    Some(Cut {
        at_s: at?.0,
        for_s: at?.1,
        regions: regions?,
        replicas: replicas?,
    })
}
