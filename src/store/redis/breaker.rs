//! Circuit breakers, one per node: `store` for a standalone Redis, `host:port` of the primary
//! for a Redis Cluster (so one node down affects only the keys in its slots).
//!
//! A breaker opens after `breaker_failures` consecutive failed or timed-out calls to its node,
//! or at once when the node refuses or drops the connection. While it is open no call is
//! made: the node's ops fail at once with [`StoreErrorKind::CircuitOpen`] and the limiter
//! answers them from its fallback, so no request waits `store_timeout_ms` during an outage. A
//! probe task (every `breaker_probe_ms`) pings the node; when it answers, the breaker closes,
//! [`Breakers::recoveries`] grows (the limiter then drops its local fallback buckets) and the
//! shared quota resumes. Each transition is one log line, a count in
//! `tollgate_breaker_transitions_total{node,to}` and the gauge `tollgate_fallback_active{node}`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use super::connect::Conn;
use super::pool::Pool;
use crate::store::StoreErrorKind;
use crate::telemetry::{NodeLabels, StoreMetrics, TransitionLabels};

/// The node name of a standalone Redis.
pub(super) const STANDALONE: &str = "store";

#[derive(Debug)]
struct Breaker {
    failures: AtomicU32,
    open: AtomicBool,
}

#[derive(Debug)]
pub(super) struct Breakers {
    failures_to_open: u32,
    pub(super) probe_every: Duration,
    /// Read on every request without a lock; a node seen for the first time is added under
    /// `adding` (copy, insert, swap: it happens once per node).
    nodes: ArcSwap<HashMap<Arc<str>, Arc<Breaker>>>,
    adding: Mutex<()>,
    recoveries: AtomicU64,
    metrics: StoreMetrics,
}

impl Breakers {
    pub(super) fn new(failures_to_open: u32, probe_every: Duration, metrics: StoreMetrics) -> Self {
        Breakers {
            failures_to_open: failures_to_open.max(1),
            probe_every,
            nodes: ArcSwap::from_pointee(HashMap::new()),
            adding: Mutex::new(()),
            recoveries: AtomicU64::new(0),
            metrics,
        }
    }

    fn breaker(&self, node: &Arc<str>) -> Arc<Breaker> {
        if let Some(b) = self.nodes.load().get(node) {
            return b.clone();
        }
        let _adding = self.adding.lock().unwrap_or_else(|p| p.into_inner());
        let current = self.nodes.load_full();
        if let Some(b) = current.get(node) {
            return b.clone();
        }
        let b = Arc::new(Breaker {
            failures: AtomicU32::new(0),
            open: AtomicBool::new(false),
        });
        let mut next = (*current).clone();
        next.insert(node.clone(), b.clone());
        self.nodes.store(Arc::new(next));
        b
    }

    pub(super) fn is_open(&self, node: &Arc<str>) -> bool {
        self.breaker(node).open.load(Ordering::Acquire)
    }

    pub(super) fn succeeded(&self, node: &Arc<str>) {
        self.breaker(node).failures.store(0, Ordering::Release);
    }

    /// Notes a failed call to `node`; returns true when this failure opened its breaker (the
    /// caller then starts the probe).
    pub(super) fn failed(&self, node: &Arc<str>, kind: StoreErrorKind) -> bool {
        let b = self.breaker(node);
        let failures = b.failures.fetch_add(1, Ordering::AcqRel) + 1;
        // A refused or dropped connection will not answer the next call either.
        let open = kind == StoreErrorKind::Connection || failures >= self.failures_to_open;
        if !open || b.open.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.transition(node, "open", 1);
        tracing::warn!(
            %node,
            failures,
            error_kind = %kind,
            "store circuit open: this node's requests go to the fallback until it answers a probe"
        );
        true
    }

    /// Closes `node`'s breaker after a probe answered.
    pub(super) fn close(&self, node: &Arc<str>) {
        let b = self.breaker(node);
        b.failures.store(0, Ordering::Release);
        if b.open.swap(false, Ordering::AcqRel) {
            self.recoveries.fetch_add(1, Ordering::AcqRel);
            self.transition(node, "closed", 0);
            tracing::info!(%node, "store circuit closed: back to the shared quota");
        }
    }

    fn transition(&self, node: &Arc<str>, to: &'static str, active: i64) {
        self.metrics
            .breaker_transitions
            .get_or_create(&TransitionLabels {
                node: node.to_string(),
                to,
            })
            .inc();
        self.metrics
            .fallback_active
            .get_or_create(&NodeLabels {
                node: node.to_string(),
            })
            .set(active);
    }

    pub(super) fn recoveries(&self) -> u64 {
        self.recoveries.load(Ordering::Acquire)
    }

    pub(super) fn open_nodes(&self) -> Vec<String> {
        let mut open: Vec<String> = self
            .nodes
            .load()
            .iter()
            .filter(|(_, b)| b.open.load(Ordering::Acquire))
            .map(|(n, _)| n.to_string())
            .collect();
        open.sort();
        open
    }
}

/// Whether `node` answers a PING (the probe of an open circuit): any held connection of a
/// standalone Redis, the cluster primary at `host:port` (any node before the slot map is known).
pub(super) async fn ping_node(pool: &Pool, node: &str) -> bool {
    let Some(picked) = pool.pick() else {
        return false;
    };
    let routing = match node
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse().ok()?)))
    {
        Some((host, port)) if node != STANDALONE => {
            RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.to_string(),
                port,
            })
        }
        _ => RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
    };
    let answered = tokio::time::timeout(pool.connect_timeout(), async {
        match (*picked.conn).clone() {
            Conn::Standalone(mut c) => redis::cmd("PING")
                .query_async::<redis::Value>(&mut c)
                .await
                .map(|_| ()),
            Conn::Cluster(mut c) => c
                .route_command(redis::cmd("PING"), routing)
                .await
                .map(|_| ()),
        }
    })
    .await;
    matches!(answered, Ok(Ok(())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Metrics;

    #[test]
    fn opens_after_consecutive_failures_or_a_refusal_and_closes_on_a_probe() {
        let metrics = Metrics::new();
        let b = Breakers::new(3, Duration::from_millis(500), metrics.store.clone());
        let node: Arc<str> = "a:1".into();
        assert!(!b.failed(&node, StoreErrorKind::Timeout));
        b.succeeded(&node);
        assert!(!b.failed(&node, StoreErrorKind::Timeout));
        assert!(!b.failed(&node, StoreErrorKind::Timeout));
        assert!(!b.is_open(&node), "two in a row after a success");
        assert!(
            b.failed(&node, StoreErrorKind::Timeout),
            "the third opens it"
        );
        assert!(b.is_open(&node));
        assert!(!b.failed(&node, StoreErrorKind::Timeout), "opens once");
        assert_eq!(b.open_nodes(), ["a:1"]);
        b.close(&node);
        assert!(!b.is_open(&node));
        assert_eq!(b.recoveries(), 1);
        let other: Arc<str> = "b:2".into();
        assert!(
            b.failed(&other, StoreErrorKind::Connection),
            "a refusal opens at once"
        );
        assert!(!b.is_open(&node), "per node");
        let text = metrics.render();
        for expected in [
            r#"tollgate_breaker_transitions_total{node="a:1",to="open"} 1"#,
            r#"tollgate_breaker_transitions_total{node="a:1",to="closed"} 1"#,
            r#"tollgate_fallback_active{node="a:1"} 0"#,
            r#"tollgate_fallback_active{node="b:2"} 1"#,
        ] {
            assert!(text.contains(expected), "{expected} in {text}");
        }
    }
}
