//! The keeper: the task that makes, checks and replaces the pool's connections.
//!
//! Once a [`TICK`] (or at once when a request woke it: a connection broke) it runs
//! [`Pool::tend`]: empty entries get a new connection (scripts loaded, the server's version
//! and eviction policy read), idle or suspect ones are pinged and replaced when they do not
//! answer, a cluster's slot map is refreshed. While Redis is unreachable it backs off from
//! [`BACKOFF_MIN`] to [`BACKOFF_MAX`] instead of being woken by every failing request.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use redis::RedisError;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use tokio::sync::Notify;

use super::{Pool, TICK};
use crate::store::StoreErrorKind;
use crate::store::redis::connect::Conn;
use crate::store::redis::errors::{connect_kind, kind_of};
use crate::telemetry::KindLabels;

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

impl Pool {
    /// Opens one connection and loads the scripts on it, within the connect timeout.
    async fn open(&self) -> Result<Conn, ConnectError> {
        let started = Instant::now();
        let attempt = async {
            let mut conn = self.connector.connect().await?;
            crate::store::redis::version::check(&mut conn).await?;
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
            if kind == "auth" || kind == "tls" {
                self.log_refusal(kind, &text);
            }
            *self
                .last_connect_error
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = text;
        } else {
            *self
                .refusal_logged
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = None;
        }
        result
    }

    /// A Redis that refuses the credentials or the TLS handshake will not heal by itself:
    /// one ERROR with the cause (again only when the cause changes, or after a connection
    /// was made), not a WARN among the reconnect attempts.
    fn log_refusal(&self, kind: &str, cause: &str) {
        let mut logged = self
            .refusal_logged
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if logged.as_deref() == Some(cause) {
            return;
        }
        let what = if kind == "auth" {
            "Redis refused the credentials (store_username/store_password, REDIS_AUTH): check them; retrying"
        } else {
            "the TLS handshake with Redis failed (store_tls_ca/_cert/_key/_server_name, REDIS_TLS_*): check them; retrying"
        };
        tracing::error!(url = %self.display_url, error = %cause, "{what}");
        *logged = Some(cause.to_string());
    }

    /// Reads Redis's eviction policy on a new connection; logs a policy that evicts live
    /// buckets when it is first seen.
    async fn check_eviction(&self, conn: &mut Conn) {
        let Some(found) = crate::store::redis::eviction::policies(conn).await else {
            return;
        };
        let mut known = self
            .eviction_policies
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if known.as_ref() != Some(&found) {
            for w in found
                .iter()
                .filter_map(|p| crate::store::redis::eviction::warning(p))
            {
                tracing::warn!("{w}");
            }
            *known = Some(found);
        }
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
    pub(in crate::store::redis) async fn tend(&self) -> bool {
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
pub(super) async fn keeper(pool: Weak<Pool>, wake: Arc<Notify>, mut was_ok: bool) {
    let mut backoff = BACKOFF_MIN;
    loop {
        let ok = {
            let Some(pool) = pool.upgrade() else { return };
            let ok = pool.tend().await;
            if ok != was_ok {
                if ok {
                    tracing::info!(url = %pool.display_url, "{} reconnected", pool.role);
                } else {
                    tracing::warn!(url = %pool.display_url, error = %pool.last_connect_error(), "{} unreachable; retrying", pool.role);
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
