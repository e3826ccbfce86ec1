//! Which cluster node holds a key: the slot map, for per-node circuit breakers.
//!
//! The `redis` crate's cluster client routes commands by itself but does not expose its slot
//! map, so the store keeps its own from `CLUSTER SLOTS` (refreshed by the connection keeper
//! every tick): slot ranges → the primary's `host:port`. A key's slot is CRC16 (XMODEM) of
//! its hash tag modulo 16,384, computed with the `crc16` crate the `redis` crate itself uses;
//! a test holds it to `redis::cluster_routing::Slot::for_key`. Until the first refresh every
//! key maps to one node name, `cluster`.

use std::sync::Arc;

use arc_swap::ArcSwap;
use redis::Value;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use super::connect::Conn;

/// Slot ranges (inclusive) and the primary that serves them, sorted by start.
#[derive(Debug, Default)]
pub(super) struct SlotMap {
    ranges: ArcSwap<Vec<(u16, u16, Arc<str>)>>,
    unknown: Arc<str>,
}

impl SlotMap {
    pub(super) fn new() -> Self {
        SlotMap {
            ranges: ArcSwap::from_pointee(Vec::new()),
            unknown: "cluster".into(),
        }
    }

    /// The node (`host:port` of the primary) that holds `key`.
    pub(super) fn node_of(&self, key: &str) -> Arc<str> {
        let slot = slot_of(key.as_bytes());
        let ranges = self.ranges.load();
        let at = ranges.partition_point(|(start, _, _)| *start <= slot);
        match at.checked_sub(1).and_then(|i| ranges.get(i)) {
            Some((_, end, node)) if slot <= *end => node.clone(),
            _ => self.unknown.clone(),
        }
    }

    /// Whether `node` is a primary's name, not the placeholder every key maps to before the
    /// first refresh.
    pub(super) fn knows(&self, node: &str) -> bool {
        *self.unknown != *node
    }

    /// Whether the map names `node` (before the first refresh: only `cluster`).
    pub(super) fn has_node(&self, node: &str) -> bool {
        let ranges = self.ranges.load();
        if ranges.is_empty() {
            return *self.unknown == *node;
        }
        ranges.iter().any(|(_, _, n)| **n == *node)
    }

    /// A key `{base}{{i}}` that `node` holds (for its breaker's probe); `None` when the map
    /// does not name `node`. A node holds about 1 / nodes of the slots, so a few tries find one.
    pub(super) fn key_on(&self, node: &str, base: &str) -> Option<String> {
        if !self.has_node(node) {
            return None;
        }
        (0..=u16::MAX)
            .map(|i| format!("{base}{{{i}}}"))
            .find(|key| *self.node_of(key) == *node)
    }

    /// Refreshes the map from `CLUSTER SLOTS` of any node, asked through `conn` within
    /// `timeout` (the pool's connect timeout); on a failure or a reply of another shape the
    /// last map stays.
    pub(super) async fn refresh(&self, conn: &Conn, timeout: std::time::Duration) {
        let Conn::Cluster(mut c) = conn.clone() else {
            return;
        };
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let reply = tokio::time::timeout(
            timeout,
            c.route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random)),
        )
        .await;
        if let Ok(Ok(reply)) = reply
            && !self.update(&reply)
        {
            tracing::warn!("unexpected CLUSTER SLOTS reply; keeping the last slot map");
        }
    }

    /// Replaces the map with a `CLUSTER SLOTS` reply; a reply of another shape is ignored.
    pub(super) fn update(&self, reply: &Value) -> bool {
        let Value::Array(items) = reply else {
            return false;
        };
        let mut ranges = Vec::with_capacity(items.len());
        for item in items {
            // [start, end, [host, port, id, …], replica…]
            let Value::Array(fields) = item else {
                return false;
            };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return false;
            };
            let host = match primary.first() {
                Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                Some(Value::SimpleString(s)) => s.clone(),
                _ => return false,
            };
            let Some(Value::Int(port)) = primary.get(1) else {
                return false;
            };
            let (Ok(start), Ok(end)) = (u16::try_from(*start), u16::try_from(*end)) else {
                return false;
            };
            ranges.push((start, end, Arc::from(format!("{host}:{port}"))));
        }
        ranges.sort_by_key(|r| r.0);
        self.ranges.store(Arc::new(ranges));
        true
    }
}

/// The hash slot of a key: CRC16 of its hash tag (the bytes between the first `{` and the
/// next `}`, when not empty), else of the whole key. Also the simulated cluster's
/// (`sim/store/node.rs`).
pub fn slot_of(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % 16_384
}

#[cfg(test)]
mod tests {
    use redis::cluster_routing::Slot;

    use super::*;

    #[test]
    fn slots_agree_with_the_redis_crate() {
        for key in [
            "{user1000}.following",
            "foo{}{bar}",
            "foo{{bar}}zap",
            "foo{bar}{zap}",
            "{}",
            "}{",
            "",
            "somekey",
            "tollgate:{edge|tenant=a|tb:60000:0}",
        ] {
            assert_eq!(
                Slot::new(slot_of(key.as_bytes())),
                Some(Slot::for_key(key)),
                "{key}"
            );
        }
    }

    #[test]
    fn keys_map_to_the_primary_of_their_slot() {
        let map = SlotMap::new();
        assert_eq!(&*map.node_of("x"), "cluster", "before the first refresh");
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(8192),
                Value::Int(16383),
                node("10.0.0.2", 7001),
            ]),
            Value::Array(vec![
                Value::Int(0),
                Value::Int(8191),
                node("10.0.0.1", 7000),
            ]),
        ]);
        assert!(map.update(&reply));
        // `somekey` is slot 11058, `{user1000}` 3443 (CLUSTER KEYSLOT).
        assert_eq!(&*map.node_of("somekey"), "10.0.0.2:7001");
        assert_eq!(&*map.node_of("{user1000}.following"), "10.0.0.1:7000");
        assert!(!map.update(&Value::Nil));
        assert_eq!(
            &*map.node_of("somekey"),
            "10.0.0.2:7001",
            "a bad reply changes nothing"
        );
        // A probe key for each node, and none for a node the map does not name.
        for n in ["10.0.0.1:7000", "10.0.0.2:7001"] {
            let key = map.key_on(n, "p:probe").expect("a key");
            assert_eq!(&*map.node_of(&key), n, "{key}");
        }
        assert!(map.has_node("10.0.0.1:7000") && !map.has_node("cluster"));
        assert_eq!(map.key_on("10.0.0.3:7002", "p:probe"), None);
    }
}
