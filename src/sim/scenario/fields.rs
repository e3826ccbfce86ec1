//! The field readers every section of a scenario uses (`read.rs`, `store.rs`, `replicas.rs`,
//! `traffic.rs`, `regions.rs`): a whole number of at least 1, a plain number in a range, a
//! fault's time window, a range of replicas. Each records its problem with the field's line and returns `None`, so
//! the walk goes on.

use super::{MAX_DURATION_S, MAX_REPLICAS};
use crate::rules::error::Problems;
use crate::rules::yaml::{self, Node, Value};

/// A fault's `at_s` and `for_s` (both required) in the mapping `f` of `node` at `path`.
pub(super) fn window(
    out: &mut Problems,
    node: &Node,
    f: &yaml::Fields<'_>,
    path: &str,
) -> Option<(f64, f64)> {
    let mut read = |name: &str, min: f64| {
        let field = yaml::join(path, name);
        match f.get(name) {
            Some(n) => number(out, n, &field, min, MAX_DURATION_S as f64),
            None => {
                out.error(node.pos, &field, "missing (required)");
                None
            }
        }
    };
    let at_s = read("at_s", 0.0);
    let for_s = read("for_s", 0.001);
    Some((at_s?, for_s?))
}

pub(super) fn positive_uint(out: &mut Problems, node: &Node, field: &str, max: u64) -> Option<u64> {
    match yaml::uint(out, node, field, max)? {
        0 => {
            out.error(node.pos, field, "must be at least 1");
            None
        }
        n => Some(n),
    }
}

/// An unquoted number (`0.4`, `20000`, `1e5`) in `min..=max`.
pub(super) fn number(
    out: &mut Problems,
    node: &Node,
    field: &str,
    min: f64,
    max: f64,
) -> Option<f64> {
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

/// `[from, to]`: replica indexes, `to` excluded.
pub(super) fn replica_range(out: &mut Problems, list: &Node, field: &str) -> Option<(u32, u32)> {
    let items = yaml::seq(out, list, field)?;
    if items.len() != 2 {
        out.error(list.pos, field, "expected [from, to]");
        return None;
    }
    let from = yaml::uint(out, &items[0], field, MAX_REPLICAS)? as u32;
    let to = yaml::uint(out, &items[1], field, MAX_REPLICAS)? as u32;
    if from >= to {
        out.error(
            list.pos,
            field,
            format!("from ({from}) must be below to ({to})"),
        );
        return None;
    }
    Some((from, to))
}
