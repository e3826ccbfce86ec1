//! Circuit breakers, one per node: `store` for a standalone Redis, `host:port` of the primary
//! for a Redis Cluster (so one node down affects only the keys in its slots).
//!
//! A breaker opens after `breaker_failures` consecutive failed calls to its node (a call
//! fails when the node stayed silent for the timeout, or when every op of it got an error),
//! or at once when the node refuses or drops the connection. While it is open no call is
//! made: the node's ops fail at once with [`StoreErrorKind::CircuitOpen`] and the limiter
//! answers them from its fallback, so no request waits `store_timeout_ms` during an outage.
//!
//! A probe task (every `breaker_probe_ms`) runs a real script on a key in the node's slots,
//! not a `PING`: a Redis at `maxmemory` with `noeviction` answers `PING` while it refuses
//! every script with `OOM`, and a breaker that closed on `PING` would reopen three calls
//! later, every half second. The probe's key is routed by the current slot map, so a node
//! that left the map (a failed-over primary, a pod that came back with another address) is
//! forgotten rather than probed at its old address for ever. Each transition is one log
//! line, a count in `tollgate_breaker_transitions_total{node,to}` and the gauge
//! `tollgate_fallback_active{node}`.
//!
//! Each breaker also keeps when its node last replied to any call ([`Breakers::replied`]):
//! the store's call timeout counts the node's silence, not one call's wait (see
//! `RedisStore::call`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use super::pool::Pool;
use super::scripts;
use crate::store::{Op, OpKind, StoreErrorKind};
use crate::telemetry::{NodeLabels, StoreMetrics, TransitionLabels};

/// The node name of a standalone Redis.
pub(super) const STANDALONE: &str = "store";

#[derive(Debug)]
struct Breaker {
    failures: AtomicU32,
    open: AtomicBool,
    /// When the node last replied to a call, in µs since [`Breakers::epoch`] (0: never).
    replied_us: AtomicU64,
}

#[derive(Debug)]
pub(super) struct Breakers {
    failures_to_open: u32,
    pub(super) probe_every: Duration,
    /// Read on every request without a lock; a node seen for the first time is added under
    /// `adding` (copy, insert, swap: it happens once per node).
    nodes: ArcSwap<HashMap<Arc<str>, Arc<Breaker>>>,
    adding: Mutex<()>,
    epoch: Instant,
    metrics: StoreMetrics,
}

impl Breakers {
    pub(super) fn new(failures_to_open: u32, probe_every: Duration, metrics: StoreMetrics) -> Self {
        Breakers {
            failures_to_open: failures_to_open.max(1),
            probe_every,
            nodes: ArcSwap::from_pointee(HashMap::new()),
            adding: Mutex::new(()),
            epoch: Instant::now(),
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
            replied_us: AtomicU64::new(0),
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

    /// `node` replied to a call (any reply, an error reply included: the node is alive).
    pub(super) fn replied(&self, node: &Arc<str>) {
        let us = self.epoch.elapsed().as_micros() as u64;
        self.breaker(node)
            .replied_us
            .fetch_max(us.max(1), Ordering::AcqRel);
    }

    /// When `node` last replied to a call; `None` before its first reply.
    pub(super) fn last_reply(&self, node: &Arc<str>) -> Option<Instant> {
        match self.breaker(node).replied_us.load(Ordering::Acquire) {
            0 => None,
            us => Some(self.epoch + Duration::from_micros(us)),
        }
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
            "store circuit open: this node's requests go to the fallback until a probe's script runs on it"
        );
        true
    }

    /// Closes `node`'s breaker after its probe's script ran.
    pub(super) fn close(&self, node: &Arc<str>) {
        let b = self.breaker(node);
        b.failures.store(0, Ordering::Release);
        if b.open.swap(false, Ordering::AcqRel) {
            self.transition(node, "closed", 0);
            tracing::info!(%node, "store circuit closed: a script ran again; back to the shared quota");
        }
    }

    /// Drops `node`'s breaker: the slot map names it no more (its slots are served by another
    /// node now), so it is neither probed nor reported as open.
    pub(super) fn forget(&self, node: &Arc<str>) {
        let _adding = self.adding.lock().unwrap_or_else(|p| p.into_inner());
        let current = self.nodes.load_full();
        let Some(b) = current.get(node) else {
            return;
        };
        if b.open.load(Ordering::Acquire) {
            self.transition(node, "closed", 0);
            tracing::info!(%node, "store circuit closed: the node left the slot map, its slots are served by another node");
        }
        let mut next = (*current).clone();
        next.remove(node);
        self.nodes.store(Arc::new(next));
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

    /// The open nodes among those `current` keeps (the slot map's nodes on a cluster).
    pub(super) fn open_nodes(&self, current: impl Fn(&str) -> bool) -> Vec<String> {
        let mut open: Vec<String> = self
            .nodes
            .load()
            .iter()
            .filter(|(n, b)| b.open.load(Ordering::Acquire) && current(n))
            .map(|(n, _)| n.to_string())
            .collect();
        open.sort();
        open
    }
}

/// What a probe found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Probe {
    /// The script ran: the node does real work again.
    Ran,
    /// No answer, or the script was refused (`OOM`, `READONLY`, …).
    Failed,
    /// The slot map names the node no more.
    Gone,
}

/// Runs the token bucket script once on a key of `node` (a key whose slot the current map gives
/// to `node`; any key on a standalone Redis), bounded by the connect timeout. The key is under
/// `prefix` (so an ACL limited to tollgate's keys allows it) and holds one token for a second.
pub(super) async fn probe(pool: &Pool, node: &str, prefix: &str) -> Probe {
    let key = match pool.slots() {
        None => format!("{prefix}probe"),
        Some(slots) => match slots.key_on(node, &format!("{prefix}probe")) {
            Some(key) => key,
            None => return Probe::Gone,
        },
    };
    let Some(picked) = pool.pick() else {
        return Probe::Failed;
    };
    let op = Op::take(
        key,
        OpKind::TokenBucket {
            capacity: 1,
            refill: 1,
            window_ms: 1_000,
        },
        1,
    );
    let mut conn = (*picked.conn).clone();
    let ran = tokio::time::timeout(pool.connect_timeout(), async {
        match &mut conn {
            super::connect::Conn::Standalone(c) => {
                scripts::eval_ops(c, &[&op], &pool.scripts).await
            }
            super::connect::Conn::Cluster(c) => scripts::eval_ops(c, &[&op], &pool.scripts).await,
        }
    })
    .await;
    match ran {
        Ok(Ok(results)) if results.iter().all(|r| r.is_ok()) => Probe::Ran,
        _ => Probe::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Metrics;

    #[test]
    fn opens_after_consecutive_failures_or_a_refusal_and_closes_on_a_probe_or_when_forgotten() {
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
        assert_eq!(b.open_nodes(|_| true), ["a:1"]);
        assert!(
            b.open_nodes(|n| n != "a:1").is_empty(),
            "not a current node"
        );
        b.close(&node);
        assert!(!b.is_open(&node));
        let other: Arc<str> = "b:2".into();
        assert!(
            b.failed(&other, StoreErrorKind::Connection),
            "a refusal opens at once"
        );
        assert!(!b.is_open(&node), "per node");
        b.forget(&other);
        assert!(!b.is_open(&other), "a forgotten node starts closed");
        assert!(b.last_reply(&node).is_none());
        b.replied(&node);
        assert!(b.last_reply(&node).is_some_and(|t| t <= Instant::now()));
        let text = metrics.render();
        for expected in [
            r#"tollgate_breaker_transitions_total{node="a:1",to="open"} 1"#,
            r#"tollgate_breaker_transitions_total{node="a:1",to="closed"} 1"#,
            r#"tollgate_fallback_active{node="a:1"} 0"#,
            r#"tollgate_fallback_active{node="b:2"} 0"#,
            r#"tollgate_breaker_transitions_total{node="b:2",to="closed"} 1"#,
        ] {
            assert!(text.contains(expected), "{expected} in {text}");
        }
    }
}
