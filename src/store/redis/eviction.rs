//! Redis's eviction policy, checked on each new connection: under `maxmemory` an `allkeys-*`
//! policy evicts live buckets, which silently resets them (a spent tenant gets a full bucket
//! again). tollgate's keys all expire (`PEXPIRE`), so `volatile-ttl` (evict what ends soonest)
//! or `noeviction` with memory sized from ~120 bytes per bucket keep limits exact.
//!
//! The policy comes from `INFO memory` (an ACL user limited to tollgate's commands may not
//! run it: then it stays unknown, without a warning). On a cluster each node answers; any
//! `allkeys-*` among them is reported.

use redis::Value;
use redis::aio::ConnectionLike;

/// The `maxmemory_policy` values in `conn`'s `INFO memory` (one per node of a cluster), or
/// `None` when the command is refused or the reply has none.
pub(super) async fn policies<C: ConnectionLike>(conn: &mut C) -> Option<Vec<String>> {
    let reply = redis::cmd("INFO")
        .arg("memory")
        .query_async::<Value>(conn)
        .await
        .ok()?;
    let mut texts = Vec::new();
    collect_text(&reply, &mut texts);
    let found: Vec<String> = texts
        .iter()
        .flat_map(|t| t.lines())
        .filter_map(|l| l.trim().strip_prefix("maxmemory_policy:"))
        .map(str::to_string)
        .collect();
    (!found.is_empty()).then_some(found)
}

/// Every text in a reply: a node's INFO is one string; a cluster's is a map of them.
pub(super) fn collect_text(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::BulkString(b) => out.push(String::from_utf8_lossy(b).into_owned()),
        Value::VerbatimString { text, .. } => out.push(text.clone()),
        Value::SimpleString(s) => out.push(s.clone()),
        Value::Array(items) | Value::Set(items) => items.iter().for_each(|i| collect_text(i, out)),
        Value::Map(pairs) => pairs.iter().for_each(|(_, v)| collect_text(v, out)),
        _ => {}
    }
}

/// The warning for a policy that evicts live buckets, if it is one.
pub(super) fn warning(policy: &str) -> Option<String> {
    policy.starts_with("allkeys-").then(|| {
        format!(
            "Redis maxmemory-policy is {policy}: under memory pressure it evicts live rate-limit buckets, which resets them; use volatile-ttl or noeviction (and size memory at ~120 bytes per bucket)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allkeys_policies_warn_and_cluster_replies_are_read() {
        assert!(warning("allkeys-lru").is_some_and(|w| w.contains("volatile-ttl")));
        assert!(warning("allkeys-random").is_some());
        for ok in ["noeviction", "volatile-ttl", "volatile-lru"] {
            assert!(warning(ok).is_none(), "{ok}");
        }
        let node = |p: &str| {
            Value::BulkString(
                format!("# Memory\r\nused_memory:1\r\nmaxmemory_policy:{p}\r\n").into_bytes(),
            )
        };
        let cluster = Value::Map(vec![
            (Value::SimpleString("a:1".into()), node("noeviction")),
            (Value::SimpleString("b:2".into()), node("allkeys-lru")),
        ]);
        let mut texts = Vec::new();
        collect_text(&cluster, &mut texts);
        let found: Vec<&str> = texts
            .iter()
            .flat_map(|t| t.lines())
            .filter_map(|l| l.trim().strip_prefix("maxmemory_policy:"))
            .collect();
        assert_eq!(found, ["noeviction", "allkeys-lru"]);
    }
}
