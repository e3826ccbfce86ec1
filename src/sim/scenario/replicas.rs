//! The scenario's `replicas:` section: the fleet's size at the start and the autoscaler's
//! changes over time.
//!
//! Flow: [`replicas`] reads the start and each change (in time order) → a [`FleetSize`], which
//! the driver resizes the fleet by, and the checks count started replicas from.

use super::MAX_REPLICAS;
use super::fields::{number, positive_uint};
use crate::rules::error::Problems;
use crate::rules::yaml::{self, Node};

/// Replicas at the start and the autoscaler's changes.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetSize {
    pub start: u32,
    /// `(at_s, to)`, in time order.
    pub changes: Vec<(f64, u32)>,
}

pub(super) fn replicas(out: &mut Problems, node: &Node) -> Option<FleetSize> {
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
