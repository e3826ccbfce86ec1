//! The field readers every section of a scenario uses (`read.rs`, `store.rs`, `replicas.rs`,
//! `traffic.rs`): a whole number of at least 1, a plain number in a range. Each records its
//! problem with the field's line and returns `None`, so the walk goes on.

use crate::rules::error::Problems;
use crate::rules::yaml::{self, Node, Value};

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
