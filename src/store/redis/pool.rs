//! The long-lived connections and their keeper.
//!
//! The [`Pool`] holds `store_pool_size` entries, each one shared connection ([`Conn`]). A
//! request takes the next held connection round-robin ([`Pool::pick`]) and clones the handle;
//! a multiplexed connection pipelines concurrent requests, so there is no checkout. A pool
//! that lends connections (deadpool-redis) is deliberately not used: its recycle runs
//! UNWATCH+PING, one extra round trip per request, and buys nothing when connections are
//! shared rather than lent.
//!
//! The [`keeper`] task fills empty entries, loads the scripts on each new connection, pings
//! idle or suspect connections once a [`TICK`] and replaces those that no longer answer; it
//! backs off while Redis is unreachable. Requests report back ([`Pool::call_succeeded`],
//! [`Pool::call_failed`]) so a broken connection is dropped or checked at once. The pool
//! records `tollgate_store_connections` and, for failed connection attempts,
//! `tollgate_store_errors_total{kind="connect"}`, so an outage shows while no request arrives.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use redis::RedisError;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use tokio::sync::Notify;

use super::connect::{Conn, Connector};
use super::errors::{connect_kind, kind_of};
use super::scripts::Scripts;
use super::slots::SlotMap;
use crate::store::StoreErrorKind;
use crate::telemetry::{KindLabels, StateLabels, StoreMetrics};

/// How often the keeper looks at the connections (and pings idle ones).
pub(super) const TICK: Duration = Duration::from_secs(1);
/// Reconnect back-off while Redis is unreachable: doubles from the first to the last.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Why a connection could not be made.
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error("{0}")]
    Redis(#[from] RedisError),
    #[error("connect timed out after {} ms", .0.as_millis())]
    TimedOut(Duration),
}

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
    /// Redis's eviction policies as of the last new connection (`eviction.rs`), if readable.
    eviction_policies: Mutex<Option<Vec<String>>>,
    started: Instant,
    metrics: StoreMetrics,
    /// The URL with its password replaced, for logs.
    pub(super) display_url: String,
    /// A cluster's slot map (refreshed every keeper round); `None` for a standalone Redis.
    slots: Option<SlotMap>,
}

impl Pool {
    pub(super) fn new(
        connector: Connector,
        size: usize,
        connect_timeout: Duration,
        metrics: StoreMetrics,
        display_url: String,
        wait: Option<super::scripts::Wait>,
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
            scripts: Scripts::new(wait),
            connect_timeout,
            wake: Arc::new(Notify::new()),
            healthy: AtomicBool::new(false),
            answered: AtomicBool::new(false),
            last_connect_error: Mutex::new("not connected yet".to_string()),
            eviction_policies: Mutex::new(None),
            started: Instant::now(),
            metrics,
            display_url,
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
        tokio::spawn(keeper(Arc::downgrade(self), self.wake.clone(), connected));
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

    /// Opens one connection and loads the scripts on it, within the connect timeout.
    async fn open(&self) -> Result<Conn, ConnectError> {
        let started = Instant::now();
        let attempt = async {
            let mut conn = self.connector.connect().await?;
            super::version::check(&mut conn).await?;
            self.scripts.load(&mut conn).await?;
            self.check_eviction(&mut conn).await;
            Ok::<Conn, RedisError>(conn)
        };
        let result = match tokio::time::timeout(self.connect_timeout, attempt).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(e)) => Err(ConnectError::Redis(e)),
            Err(_) => Err(ConnectError::TimedOut(self.connect_timeout)),
        };
        self.metrics.observe("connect", started);
        if let Err(e) = &result {
            let kind = match e {
                ConnectError::Redis(e) => connect_kind(e),
                ConnectError::TimedOut(_) => "connect",
            };
            self.metrics
                .errors
                .get_or_create(&KindLabels { kind })
                .inc();
            let mut text = e.to_string();
            let timed_out = match e {
                ConnectError::Redis(e) => e.is_timeout(),
                ConnectError::TimedOut(_) => true,
            };
            if timed_out && self.display_url.starts_with("rediss") {
                // A plain-text Redis reads a ClientHello as a command that never ends and
                // answers nothing: the handshake times out with no hint of why.
                text.push_str(" (over TLS: a port that speaks plain-text Redis never answers the TLS handshake; is this Redis's TLS port, or should the URL be redis://?)");
            }
            *self
                .last_connect_error
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = text;
        }
        result
    }

    /// Reads Redis's eviction policy on a new connection; logs a policy that evicts live
    /// buckets when it is first seen.
    async fn check_eviction(&self, conn: &mut Conn) {
        let Some(found) = super::eviction::policies(conn).await else {
            return;
        };
        let mut known = self
            .eviction_policies
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if known.as_ref() != Some(&found) {
            for w in found.iter().filter_map(|p| super::eviction::warning(p)) {
                tracing::warn!("{w}");
            }
            *known = Some(found);
        }
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

    /// Whether `conn` answers a PING within the connect timeout; `Err` carries the error when
    /// it failed rather than timed out.
    async fn ping(&self, conn: &Conn) -> Result<bool, RedisError> {
        let started = Instant::now();
        let ping = redis::cmd("PING");
        let answered = tokio::time::timeout(self.connect_timeout, async {
            match conn.clone() {
                Conn::Standalone(mut c) => {
                    ping.query_async::<redis::Value>(&mut c).await.map(|_| ())
                }
                // One node is enough to know the handle works; per-node health is the cluster
                // client's business (it reconnects and refreshes slots on its own).
                Conn::Cluster(mut c) => c
                    .route_command(ping, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random))
                    .await
                    .map(|_| ()),
            }
        })
        .await;
        self.metrics.observe("ping", started);
        match answered {
            Ok(Ok(())) => Ok(true),
            Ok(Err(e)) => Err(e),
            Err(_) => Ok(false),
        }
    }

    /// One keeper round: fill empty entries, check suspect and idle ones. Stops at the first
    /// failed connection attempt (Redis is likely down; the next round comes after a back-off).
    /// Returns whether every entry holds a connection that answered.
    pub(super) async fn tend(&self) -> bool {
        let mut all_ok = true;
        // Sentinel: a failover moved the primary. The old one keeps taking writes until the
        // Sentinels demote it (seconds), and they would be lost then: move every connection
        // now rather than at the first READONLY.
        if self.connector.primary_moved().await {
            tracing::warn!(url = %self.display_url, "the Sentinels name a new primary; reconnecting");
            for entry in self.entries.iter() {
                entry.conn.store(None);
                entry.live.store(false, Ordering::Relaxed);
            }
            self.update_gauge();
        }
        // After one failed connection attempt Redis is likely down: the other entries due for
        // a check are marked as not connected (so the gauge tells the truth) without another
        // attempt this round.
        let mut connect_failed = false;
        for entry in self.entries.iter() {
            let held = entry.conn.load_full();
            // What a replacement swaps out: `held`, or nothing once a dead one was dropped.
            let mut expected = held.clone();
            if let Some(conn) = &held {
                let idle = self
                    .now_ms()
                    .saturating_sub(entry.last_ok_ms.load(Ordering::Relaxed));
                let suspect = entry.suspect.load(Ordering::Relaxed);
                if !suspect && idle < TICK.as_millis() as u64 {
                    continue;
                }
                if connect_failed {
                    // Redis did not let us connect a moment ago: this one, due for a check,
                    // is not counted as connected, and the round stays short (no more
                    // pings that would each wait out the connect timeout).
                    entry.live.store(false, Ordering::Relaxed);
                    all_ok = false;
                    continue;
                }
                match self.ping(conn).await {
                    Ok(true) => {
                        entry.suspect.store(false, Ordering::Relaxed);
                        entry.live.store(true, Ordering::Relaxed);
                        entry.last_ok_ms.store(self.now_ms(), Ordering::Relaxed);
                        self.mark_healthy();
                        continue;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        // A standalone connection whose socket is gone never recovers.
                        if matches!(**conn, Conn::Standalone(_))
                            && kind_of(&e) == StoreErrorKind::Connection
                        {
                            entry.conn.compare_and_swap(&held, None);
                            expected = None;
                        }
                    }
                }
                entry.live.store(false, Ordering::Relaxed);
                self.healthy.store(false, Ordering::Relaxed);
            }
            if connect_failed {
                all_ok = false;
                continue;
            }
            match self.open().await {
                Ok(conn) => {
                    // Replace only what we looked at: a request may have cleared it meanwhile.
                    entry.conn.compare_and_swap(&expected, Some(Arc::new(conn)));
                    entry.suspect.store(false, Ordering::Relaxed);
                    entry.live.store(true, Ordering::Relaxed);
                    entry.last_ok_ms.store(self.now_ms(), Ordering::Relaxed);
                    self.mark_healthy();
                }
                Err(_) => {
                    // An old connection that did not answer a ping in time is kept when a
                    // new one cannot be made either: Redis may be paused or slow rather than
                    // gone, and a kept connection still answers once it resumes.
                    all_ok = false;
                    connect_failed = true;
                }
            }
        }
        self.update_gauge();
        if let Some(slots) = &self.slots
            && let Some(picked) = self.pick()
        {
            slots.refresh(&picked.conn, self.connect_timeout()).await;
        }
        all_ok
    }
}

/// The keeper: runs [`Pool::tend`] every [`TICK`], early when woken, with back-off while
/// Redis is unreachable; ends when the pool is dropped.
async fn keeper(pool: Weak<Pool>, wake: Arc<Notify>, mut was_ok: bool) {
    let mut backoff = BACKOFF_MIN;
    loop {
        let ok = {
            let Some(pool) = pool.upgrade() else { return };
            let ok = pool.tend().await;
            if ok != was_ok {
                if ok {
                    tracing::info!(url = %pool.display_url, "store reconnected");
                } else {
                    tracing::warn!(url = %pool.display_url, error = %pool.last_connect_error(), "store unreachable; retrying");
                }
            }
            ok
        };
        was_ok = ok;
        if ok {
            backoff = BACKOFF_MIN;
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(TICK) => {}
            }
        } else {
            // Not woken early: while Redis is down every failing request would wake us.
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }
}
