//! Matching a request descriptor against the rules tree, as envoyproxy/ratelimit does.
//!
//! For each entry, in order, one level down the tree: the exact `key`+`value` first, then the
//! first declared wildcard `value` of that key that matches (`*` stands for zero or more
//! characters, anywhere, any number of times), then the bare `key`. A limit applies only at
//! the depth equal to the number of entries; a matched node without limits means "no limit".

use super::model::{Descriptor, Domain};

/// The node a descriptor matched, plus the entries whose values share one bucket.
#[derive(Debug)]
pub struct Match<'r> {
    pub node: &'r Descriptor,
    /// `(entry index, declared pattern)` for entries matched by a `share_threshold` wildcard:
    /// the bucket key uses the pattern instead of the request's value, so every matching
    /// value shares one bucket. Usually empty (no allocation).
    pub shared: Vec<(usize, &'r str)>,
    /// Entries matched through a node with `value_to_metric` (not folded by a
    /// `share_threshold`): their request values join the metrics class. Usually empty.
    pub metric_values: Vec<usize>,
}

/// Walks `entries` (key, value) down `domain`'s tree. `None`: nothing matched at full depth.
pub fn find<'r>(
    domain: &'r Domain,
    entries: &[(impl AsRef<str>, impl AsRef<str>)],
) -> Option<Match<'r>> {
    let mut level = &domain.root;
    let mut shared = Vec::new();
    let mut metric_values = Vec::new();
    let last = entries.len().checked_sub(1)?;
    for (i, (key, value)) in entries.iter().enumerate() {
        let (key, value) = (key.as_ref(), value.as_ref());
        let mut folded = false;
        let node = if let Some(d) = level.exact.get(key).and_then(|m| m.get(value)) {
            d
        } else if let Some((_, pattern, d)) = level
            .wildcard
            .iter()
            .find(|(k, p, _)| k == key && glob_match(p, value))
        {
            if d.share_threshold {
                shared.push((i, pattern.as_str()));
                folded = true;
            }
            d
        } else {
            level.bare.get(key)?
        };
        if node.value_to_metric && !folded {
            metric_values.push(i);
        }
        if i == last {
            return Some(Match {
                node,
                shared,
                metric_values,
            });
        }
        level = &node.children;
    }
    None
}

/// Puts an unordered set of entries (an RLQS `BucketId`, a map) in the order `domain`'s tree
/// declares their keys: at each level, the entry whose key that level declares, matched as
/// [`find`] matches (exact value, then wildcard, then bare key). When one level declares
/// several of the entries' keys, they are tried in key order and the first that places every
/// entry wins. `None` when no order places them all (the bucket id matches no rule), or when
/// the search would take more than [`ORDER_STEPS`] steps (a tree that declares many of the
/// id's keys on every level: trying each order is factorial).
pub fn order_entries<'e>(
    domain: &Domain,
    entries: &[(&'e str, &'e str)],
) -> Option<Vec<(&'e str, &'e str)>> {
    fn step<'e>(
        level: &super::model::Level,
        left: &mut Vec<(&'e str, &'e str)>,
        placed: &mut Vec<(&'e str, &'e str)>,
        steps: &mut u32,
    ) -> bool {
        if left.is_empty() {
            return true;
        }
        *steps += 1;
        if *steps > ORDER_STEPS {
            return false;
        }
        let mut candidates: Vec<usize> = (0..left.len()).collect();
        candidates.sort_by_key(|&i| left[i].0);
        for i in candidates {
            let (key, value) = left[i];
            let node = level
                .exact
                .get(key)
                .and_then(|m| m.get(value))
                .or_else(|| {
                    level
                        .wildcard
                        .iter()
                        .find(|(k, p, _)| k == key && glob_match(p, value))
                        .map(|(_, _, d)| d)
                })
                .or_else(|| level.bare.get(key));
            let Some(node) = node else { continue };
            let entry = left.remove(i);
            placed.push(entry);
            if step(&node.children, left, placed, steps) {
                return true;
            }
            placed.pop();
            left.insert(i, entry);
        }
        false
    }
    let mut left = entries.to_vec();
    let mut placed = Vec::with_capacity(entries.len());
    let mut steps = 0;
    (!entries.is_empty() && step(&domain.root, &mut left, &mut placed, &mut steps))
        .then_some(placed)
}

/// The most levels [`order_entries`] visits for one set of entries.
pub const ORDER_STEPS: u32 = 1_000;

/// `*` matches zero or more characters; everything else matches itself.
pub fn glob_match(pattern: &str, value: &str) -> bool {
    let Some((head, tail)) = pattern.split_once('*') else {
        return pattern == value; // no `*` at all: an exact comparison
    };
    // The text before the first `*` is a prefix, the text after the last one a suffix, and
    // the parts in between are found left to right (leftmost is enough when `*` is the only
    // metacharacter). No allocation: this runs for every wildcard rule a lookup tries.
    let Some(mut rest) = value.strip_prefix(head) else {
        return false;
    };
    let (middle, last) = tail.rsplit_once('*').unwrap_or(("", tail));
    for part in middle.split('*').filter(|p| !p.is_empty()) {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::rules::LoadOptions;
    use crate::rules::load::load_sources;
    use crate::rules::model::RuleSet;

    fn rules(text: &str) -> RuleSet {
        load_sources(
            &[(PathBuf::from("t.yaml"), text.to_string())],
            LoadOptions::default(),
        )
        .unwrap()
    }

    /// The requests_per_unit of the limit found for `entries`, or None.
    fn limit_for(set: &RuleSet, entries: &[(&str, &str)]) -> Option<u32> {
        let m = find(&set.domains["d"], entries)?;
        m.node
            .limits
            .first()
            .and_then(|l| l.rate)
            .map(|r| r.requests_per_unit)
    }

    #[test]
    fn bucket_id_entries_take_the_order_the_tree_declares() {
        let set = rules(TREE);
        let d = &set.domains["d"];
        // The map's order does not matter: the tree puts tenant before endpoint.
        assert_eq!(
            order_entries(d, &[("endpoint", "/a"), ("tenant", "other")]),
            Some(vec![("tenant", "other"), ("endpoint", "/a")])
        );
        // As `find`: the exact `acme` node wins and has no children, so nothing places
        // endpoint under it.
        assert_eq!(
            order_entries(d, &[("endpoint", "/a"), ("tenant", "acme")]),
            None
        );
        assert_eq!(
            order_entries(d, &[("tenant", "acme")]),
            Some(vec![("tenant", "acme")])
        );
        assert_eq!(order_entries(d, &[("nobody", "x")]), None);
        assert_eq!(order_entries(d, &[]), None);
        // Every entry must be placed.
        assert_eq!(
            order_entries(d, &[("tenant", "acme"), ("nobody", "x")]),
            None
        );
    }

    const TREE: &str = r#"
domain: d
descriptors:
  - key: tenant
    value: acme
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: tenant
    value: "team-*"
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: tenant
    value: "*-beta-*"
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 4}
    descriptors:
      - key: endpoint
        rate_limit: {unit: second, requests_per_unit: 5}
  - key: remote
    descriptors:
      - key: path
        value: /slow
        rate_limit: {unit: second, requests_per_unit: 6}
  - key: empty
"#;

    #[test]
    fn exact_then_wildcard_then_bare() {
        let set = rules(TREE);
        assert_eq!(limit_for(&set, &[("tenant", "acme")]), Some(1));
        assert_eq!(limit_for(&set, &[("tenant", "team-red")]), Some(2));
        assert_eq!(
            limit_for(&set, &[("tenant", "team-")]),
            Some(2),
            "* matches zero chars"
        );
        // First declared wildcard wins: "team-x-beta-y" matches both patterns.
        assert_eq!(limit_for(&set, &[("tenant", "team-x-beta-y")]), Some(2));
        assert_eq!(limit_for(&set, &[("tenant", "x-beta-y")]), Some(3));
        assert_eq!(limit_for(&set, &[("tenant", "other")]), Some(4));
        assert_eq!(limit_for(&set, &[("nobody", "x")]), None);
    }

    #[test]
    fn limits_apply_only_at_full_depth() {
        let set = rules(TREE);
        assert_eq!(
            limit_for(&set, &[("tenant", "other"), ("endpoint", "/a")]),
            Some(5)
        );
        // acme has no children: a deeper request matches nothing.
        assert_eq!(
            limit_for(&set, &[("tenant", "acme"), ("endpoint", "/a")]),
            None
        );
        // remote alone has no limit (grouping node), remote+path does.
        assert_eq!(limit_for(&set, &[("remote", "x")]), None);
        assert_eq!(
            limit_for(&set, &[("remote", "x"), ("path", "/slow")]),
            Some(6)
        );
        assert_eq!(limit_for(&set, &[("remote", "x"), ("path", "/fast")]), None);
        assert_eq!(
            limit_for(&set, &[("tenant", "o"), ("endpoint", "/a"), ("x", "y")]),
            None
        );
        // A node with neither limit nor children matches, meaning "no limit".
        let m = find(&set.domains["d"], &[("empty", "v")]).unwrap();
        assert!(m.node.limits.is_empty());
        assert!(find(&set.domains["d"], &[] as &[(&str, &str)]).is_none());
    }

    #[test]
    fn share_threshold_reports_the_pattern() {
        let set = rules(
            "domain: d\ndescriptors:\n  - key: k\n    value: \"a*\"\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: j\n    value: \"b*\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        );
        let m = find(&set.domains["d"], &[("k", "abc")]).unwrap();
        assert_eq!(m.shared, vec![(0, "a*")]);
        let m = find(&set.domains["d"], &[("j", "bcd")]).unwrap();
        assert!(m.shared.is_empty());
    }

    #[test]
    fn glob_cases() {
        for (p, v, want) in [
            ("*", "", true),
            ("*", "anything", true),
            ("a*", "a", true),
            ("a*", "ba", false),
            ("*a", "ba", true),
            ("*a", "ab", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "aXcYb", false),
            ("a**b", "ab", true),
            ("ab*ba", "aba", false), // prefix and suffix must not overlap
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ] {
            assert_eq!(glob_match(p, v), want, "{p} vs {v}");
        }
    }
}
