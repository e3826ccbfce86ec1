//! The long-lived connections and their keeper.
//!
//! The [`Pool`] holds `store_pool_size` entries, each one shared connection ([`Conn`]). A
//! request takes the next held connection round-robin ([`Pool::pick`]) and clones the handle;
//! a multiplexed connection pipelines concurrent requests, so there is no checkout. A pool
//! that lends connections (deadpool-redis) is deliberately not used: its recycle runs
//! UNWATCH+PING, one extra round trip per request, and buys nothing when connections are
//! shared rather than lent.
//!
//! The keeper task (`keeper.rs`) fills empty entries, loads the scripts on each new connection, pings
//! idle or suspect connections once a [`TICK`] and replaces those that no longer answer; it
//! backs off while Redis is unreachable. Requests report back ([`Pool::call_succeeded`],
//! [`Pool::call_failed`]) so a broken connection is dropped or checked at once. The pool
//! records `tollgate_store_connections` and, for failed connection attempts,
//! `tollgate_store_errors_total{kind="connect"}`, so an outage shows while no request arrives.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use tokio::sync::Notify;

use super::connect::{Conn, Connector};
use super::scripts::Scripts;
use super::slots::SlotMap;
use crate::store::StoreErrorKind;
use crate::telemetry::{StateLabels, StoreMetrics};

mod keeper;

/// How often the keeper looks at the connections (and pings idle ones).
const TICK: Duration = Duration::from_secs(1);

/// One entry of the pool: a connection, or none while it is being (re)made.
struct PoolEntry {
    conn: ArcSwapOption<Conn>,
    /// Its last call or ping answered. A held connection that failed one is not counted as
    /// connected (gauge, state) until it answers again or is replaced.
    live: AtomicBool,
    /// A call on it timed out or failed: the keeper should check it now.
    suspect: AtomicBool,
    /// When it last answered (ms since the pool started).
    last_ok_ms: AtomicU64,
}

/// A connection lent to one call: which entry it came from, and the handle.
pub(super) struct Picked {
    entry: usize,
    pub(super) conn: Arc<Conn>,
}

pub(super) struct Pool {
    connector: Connector,
    entries: Box<[PoolEntry]>,
    next: AtomicUsize,
    pub(super) scripts: Scripts,
    connect_timeout: Duration,
    /// Wakes the keeper early (a connection broke). Shared with the keeper task, which must not
    /// hold the pool alive while it waits.
    wake: Arc<Notify>,
    /// False after a call failed transiently, true again after one succeeded.
    healthy: AtomicBool,
    /// Whether a connection or a call has ever succeeded (`/readyz`'s opt-in gate).
    answered: AtomicBool,
    /// Why the last connection attempt failed, for the "not connected" error.
    last_connect_error: Mutex<String>,
    /// The credentials or TLS refusal last logged as an ERROR (cleared when a connection is
    /// made), so a Redis that refuses the password says so once, not every back-off.
    refusal_logged: Mutex<Option<String>>,
    /// Redis's eviction policies as of the last new connection (`eviction.rs`), if readable.
    eviction_policies: Mutex<Option<Vec<String>>>,
    started: Instant,
    metrics: StoreMetrics,
    /// The URL with its password replaced, for logs.
    pub(super) display_url: String,
    /// What the logs call this Redis (`RedisConfig::role`).
    pub(super) role: &'static str,
    /// A cluster's slot map (refreshed every keeper round); `None` for a standalone Redis.
    slots: Option<SlotMap>,
}

impl Pool {
    pub(super) fn new(
        connector: Connector,
        size: usize,
        connect_timeout: Duration,
        metrics: StoreMetrics,
        (display_url, role): (String, &'static str),
        scripts: Scripts,
    ) -> Pool {
        let size = size.max(1);
        metrics
            .connections
            .get_or_create(&StateLabels { state: "total" })
            .set(size as i64);
        Pool {
            entries: (0..size)
                .map(|_| PoolEntry {
                    conn: ArcSwapOption::empty(),
                    live: AtomicBool::new(false),
                    suspect: AtomicBool::new(false),
                    last_ok_ms: AtomicU64::new(0),
                })
                .collect(),
            next: AtomicUsize::new(0),
            scripts,
            connect_timeout,
            wake: Arc::new(Notify::new()),
            healthy: AtomicBool::new(false),
            answered: AtomicBool::new(false),
            last_connect_error: Mutex::new("not connected yet".to_string()),
            refusal_logged: Mutex::new(None),
            eviction_policies: Mutex::new(None),
            started: Instant::now(),
            metrics,
            display_url,
            role,
            slots: matches!(connector, Connector::Cluster { .. }).then(SlotMap::new),
            connector,
        }
    }

    pub(super) fn size(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn connector(&self) -> &Connector {
        &self.connector
    }

    pub(super) fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    pub(super) fn slots(&self) -> Option<&SlotMap> {
        self.slots.as_ref()
    }

    /// Starts the keeper task; it ends once the pool is dropped.
    pub(super) fn start_keeper(self: &Arc<Self>, connected: bool) {
        tokio::spawn(keeper::keeper(
            Arc::downgrade(self),
            self.wake.clone(),
            connected,
        ));
    }

    /// Lets the keeper notice at once that the pool is gone (or a connection broke).
    pub(super) fn wake_keeper(&self) {
        self.wake.notify_one();
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Entries whose connection answered its last call or ping.
    fn live(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| e.live.load(Ordering::Relaxed) && e.conn.load().is_some())
            .count()
    }

    /// `connected` (a connection answers and the last call succeeded), `degraded` (one
    /// answers but the last call failed) or `disconnected` (none answers: calls fail fast or
    /// time out).
    pub(super) fn state(&self) -> &'static str {
        if self.live() == 0 {
            "disconnected"
        } else if self.healthy.load(Ordering::Relaxed) {
            "connected"
        } else {
            "degraded"
        }
    }

    /// A connection answered or a call succeeded.
    fn mark_healthy(&self) {
        self.healthy.store(true, Ordering::Relaxed);
        self.answered.store(true, Ordering::Relaxed);
    }

    /// Whether Redis has answered once since start.
    pub(super) fn answered_once(&self) -> bool {
        self.answered.load(Ordering::Relaxed)
    }

    pub(super) fn last_connect_error(&self) -> String {
        self.last_connect_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn update_gauge(&self) {
        self.metrics
            .connections
            .get_or_create(&StateLabels { state: "connected" })
            .set(self.live() as i64);
    }

    /// The next held connection, round-robin, preferring one that answered its last call or
    /// ping (after an outage, entries the keeper has not replaced yet still hold dead
    /// connections); `None` (and the keeper woken) when none is held.
    pub(super) fn pick(&self) -> Option<Picked> {
        let n = self.entries.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let find = |live_only: bool| {
            (0..n).find_map(|i| {
                let entry = (start + i) % n;
                let e = &self.entries[entry];
                if live_only && !e.live.load(Ordering::Relaxed) {
                    return None;
                }
                e.conn.load_full().map(|conn| Picked { entry, conn })
            })
        };
        let picked = find(true).or_else(|| find(false));
        if picked.is_none() {
            self.wake.notify_one();
        }
        picked
    }

    pub(super) fn call_succeeded(&self, picked: &Picked) {
        let entry = &self.entries[picked.entry];
        entry.last_ok_ms.store(self.now_ms(), Ordering::Relaxed);
        self.mark_healthy();
        if !entry.live.swap(true, Ordering::Relaxed) {
            self.update_gauge();
        }
    }

    /// A call on `picked` failed with `kind` (a timeout included); `readonly`: Redis answered
    /// READONLY (the server is a replica now, after a failover).
    pub(super) fn call_failed(&self, picked: &Picked, kind: StoreErrorKind, readonly: bool) {
        if kind.is_transient() {
            self.healthy.store(false, Ordering::Relaxed);
        }
        let entry = &self.entries[picked.entry];
        match kind {
            // A lost socket never recovers; a demoted primary will not take writes again:
            // either way the connection is replaced (through the Sentinels, the new primary).
            _ if readonly || kind == StoreErrorKind::Connection => {
                // A standalone multiplexed connection that lost its socket never recovers:
                // drop it so other requests skip it. A cluster connection reconnects to nodes
                // by itself; the keeper checks it and replaces it if it must.
                if let Conn::Standalone(_) = *picked.conn {
                    entry
                        .conn
                        .compare_and_swap(&Some(picked.conn.clone()), None);
                    // The other connections go to the same server, which just dropped one:
                    // none counts as live (so `pick` prefers a reconnected one after the
                    // outage) until the keeper, woken now, has checked it.
                    for other in self.entries.iter() {
                        other.live.store(false, Ordering::Relaxed);
                        other.suspect.store(true, Ordering::Relaxed);
                        // A replica answers PING like a primary: the keeper's check would keep
                        // them. After READONLY every connection goes, and the reconnects ask
                        // the Sentinels for the primary.
                        if readonly {
                            other.conn.store(None);
                        }
                    }
                    self.update_gauge();
                }
            }
            StoreErrorKind::Timeout => {}
            _ => return,
        }
        if entry.live.swap(false, Ordering::Relaxed) {
            self.update_gauge();
        }
        entry.suspect.store(true, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// Warnings about the store's configuration (an evicting `maxmemory-policy`), for `/readyz`.
    pub(super) fn warnings(&self) -> Vec<String> {
        let known = self
            .eviction_policies
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<String> = known
            .iter()
            .flatten()
            .filter_map(|p| super::eviction::warning(p))
            .collect();
        out.dedup();
        out
    }
}
