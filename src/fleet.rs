//! Fleet membership: each replica heartbeats into a sorted set in the store, and the count of
//! live entries is the replica count the local fallback divides each quota by while the store
//! cannot answer (the last count stays meanwhile).
//!
//! Runs beside a limiter, not inside the gRPC server: [`membership`] needs only the store, the
//! [`Replicas`] it keeps current and a [`Clock`] to wait on, so a test or a simulator can run
//! many replicas' heartbeats on one manual clock.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::Clock;
use crate::store::Store;
use crate::telemetry::Metrics;

/// How many replicas share each quota while the store is down.
#[derive(Debug)]
pub struct Replicas {
    fixed: u64,
    min: u64,
    /// The last count from the membership set; 0 until the first heartbeat answered.
    live: AtomicU64,
}

impl Replicas {
    pub fn new(fixed: u64, min: u64) -> Self {
        Replicas {
            fixed,
            min: min.max(1),
            live: AtomicU64::new(0),
        }
    }

    /// A count from the membership set (a heartbeat's answer).
    pub fn observed(&self, live: u64) {
        self.live.store(live, Ordering::Release);
    }

    pub fn count(&self) -> u64 {
        if self.fixed > 0 {
            return self.fixed.max(self.min);
        }
        self.live.load(Ordering::Acquire).max(self.min)
    }

    /// Where [`Replicas::count`] comes from: `fixed`, `membership`, or `floor` (no heartbeat
    /// answered yet).
    pub fn source(&self) -> &'static str {
        if self.fixed > 0 {
            "fixed"
        } else if self.live.load(Ordering::Acquire) > 0 {
            "membership"
        } else {
            "floor"
        }
    }
}

/// Where and how often this replica heartbeats.
#[derive(Clone, Debug)]
pub struct MembershipConfig {
    /// The sorted set of live replicas, `<key_prefix>{members}` (its own hash tag).
    pub key: String,
    pub replica: String,
    pub interval: Duration,
}

/// This replica's id in the membership set: the host name (the pod's, in Kubernetes), the
/// process id and a random part, so a restarted pod never takes over its old entry (the
/// random part comes from the process's seed when it has one: `random.rs`).
pub fn replica_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "tollgate".to_string());
    format!(
        "{host}-{}-{:08x}",
        std::process::id(),
        crate::random::next_seed().map_or_else(rand::random::<u32>, |s| s as u32)
    )
}

/// Heartbeats into the store's membership set at once and then every `interval` (an entry
/// lives three intervals), and keeps the live count in `replicas`; the last count stays
/// while the store is down. Leaves the set when `stop` resolves.
pub async fn membership(
    store: &Store,
    replicas: &Replicas,
    metrics: &Metrics,
    cfg: MembershipConfig,
    clock: &Clock,
    stop: impl Future<Output = ()>,
) {
    if matches!(store, Store::Memory(_)) {
        // One process: the memory store never falls back.
        return;
    }
    tokio::pin!(stop);
    let ttl = cfg.interval * 3;
    let mut warned = false;
    loop {
        match store.heartbeat(&cfg.key, &cfg.replica, ttl).await {
            Ok(live) => {
                replicas.observed(live);
                metrics.replicas_from_membership.set(1);
                warned = false;
            }
            Err(e) if !warned => {
                warned = true;
                tracing::warn!(
                    error = %e,
                    replicas = replicas.count(),
                    source = replicas.source(),
                    "membership heartbeat failed; the last live replica count is kept (what a local fallback divides a quota by)"
                );
            }
            Err(_) => {}
        }
        metrics.replicas.set(replicas.count() as i64);
        tokio::select! {
            _ = &mut stop => break,
            () = clock.sleep(cfg.interval) => {}
        }
    }
    if let Err(e) = store.leave(&cfg.key, &cfg.replica).await {
        tracing::info!(error = %e, "could not leave the membership set; the entry ages out");
    }
}

#[cfg(test)]
mod tests {
    use super::Replicas;

    #[test]
    fn a_fixed_count_wins_over_membership_and_the_floor_over_both() {
        let fixed = Replicas::new(5, 1);
        fixed.observed(7);
        assert_eq!(fixed.count(), 5);
        let floor = Replicas::new(0, 4);
        assert_eq!(floor.count(), 4);
        floor.observed(2);
        assert_eq!(floor.count(), 4);
        floor.observed(6);
        assert_eq!(floor.count(), 6);
    }
}
