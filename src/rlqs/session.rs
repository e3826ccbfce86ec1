//! One RLQS stream ([`Session`]): the bucket ids it holds ([`Tracked`]), the bounds a new id
//! must fit ([`Session::admit_id`]), what each id draws from under the current rules, and its
//! lifetime: opened within the stream caps, woken for refused buckets, closed with every
//! assignment expiring, dropped with its demand forgotten. A report goes through `report.rs`,
//! then `claim.rs`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Action, Assignment, BucketKey, Rlqs, RlqsConfig, RlqsError, tracked_bytes};
use crate::limiter::{Limiter, Quota};
use crate::rules::RuleSet;
use crate::rules::matcher::order_entries;
use crate::telemetry::StrategyLabels;

/// One bucket id held by a stream.
#[derive(Debug)]
pub(super) struct Tracked {
    pub(super) quota: Quota,
    /// Tokens claimed for the Envoy's current assignment and not settled yet.
    pub(super) held: u64,
    /// The last span's demand (requests per second).
    pub(super) rate: Option<f64>,
    /// Monotonic ms of the last report with requests in it.
    pub(super) active_ms: u64,
    /// Refused: when the store says tokens exist again (monotonic ms).
    pub(super) wake_ms: Option<u64>,
    /// `held` came from the fallback, not the shared bucket: never given back to the store.
    pub(super) held_from_fallback: bool,
    /// A fixed window's `held`: when its window ends (monotonic ms). Tokens of an ended
    /// window are not given back (they would count against the next window), as leases do.
    pub(super) window_end_ms: Option<u64>,
    pub(super) last: Option<Assignment>,
    /// What it counts against `max_state_bytes` ([`tracked_bytes`]).
    pub(super) bytes: u64,
}

impl Tracked {
    /// A bucket id seen for the first time at `now`, its `bytes` reserved.
    pub(super) fn new(quota: Quota, now: u64, bytes: u64) -> Self {
        Tracked {
            quota,
            held: 0,
            rate: None,
            active_ms: now,
            wake_ms: None,
            held_from_fallback: false,
            window_end_ms: None,
            last: None,
            bytes,
        }
    }
}

/// Whether a reported id is held.
pub(super) enum Admit {
    /// Held already.
    Held,
    /// New, and its bytes are reserved against `max_state_bytes`.
    New(u64),
    /// Not held, and told `DENY_ALL`: refused by a cap, tollgate never leaves its Envoy to an
    /// unlimited `no_assignment_behavior`.
    Denied,
    /// Not held, not answered (an empty id: nothing to answer).
    Skipped,
}

/// One RLQS stream's buckets. Dropping it forgets them (their demand stops counting).
#[derive(Debug)]
pub struct Session {
    pub(super) shared: Arc<Rlqs>,
    pub(super) id: u64,
    pub(super) domain: Option<String>,
    pub(super) buckets: HashMap<BucketKey, Tracked>,
    /// The remote address it counts against (`max_streams_per_peer`).
    peer: Option<IpAddr>,
    warned_full: bool,
}

impl Session {
    /// A new stream from `peer` (its remote address, when known), within `rlqs_max_streams`
    /// and `rlqs_max_streams_per_peer`: one peer cannot take every stream of the replica.
    pub fn open(shared: &Arc<Rlqs>, peer: Option<IpAddr>) -> Result<Session, RlqsError> {
        let c = &shared.config;
        if let Err(e) = shared
            .caps
            .open(peer, c.max_streams, c.max_streams_per_peer)
        {
            shared.refused(match e {
                RlqsError::TooManyStreamsFromPeer { .. } => "too_many_streams_from_peer",
                _ => "too_many_streams",
            });
            return Err(e);
        }
        shared.metrics.streams.inc();
        Ok(Session {
            shared: shared.clone(),
            id: shared.next_stream.fetch_add(1, Ordering::Relaxed),
            domain: None,
            buckets: HashMap::new(),
            peer,
            warned_full: false,
        })
    }

    /// The domain the stream named (after its first report).
    pub fn domain(&self) -> Option<&str> {
        self.domain.as_deref()
    }

    /// Bucket ids held.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// Whether `id` is held.
    pub fn holds(&self, id: &[(String, String)]) -> bool {
        self.buckets.contains_key(id)
    }

    pub fn config(&self) -> &RlqsConfig {
        &self.shared.config
    }

    /// Counts a refusal of this stream's input.
    pub fn refused(&self, reason: &'static str) {
        self.shared.refused(reason);
    }

    /// When [`Session::wake`] has work: the earliest refused bucket's retry time (mono ms).
    pub fn next_wake_ms(&self) -> Option<u64> {
        self.buckets.values().filter_map(|t| t.wake_ms).min()
    }

    /// Claims again for the buckets refused earlier whose tokens exist again; their new
    /// assignments are pushed without waiting for the Envoy's next report.
    pub async fn wake(&mut self, limiter: &Limiter) -> Vec<Action> {
        let now = self.shared.config.clock.mono_ms();
        let due: Vec<BucketKey> = self
            .buckets
            .iter()
            .filter(|(_, t)| t.wake_ms.is_some_and(|at| at <= now))
            .map(|(id, _)| id.clone())
            .collect();
        let interval = self.shared.config.report_interval_ms;
        self.claim(limiter, due, now, interval).await
    }

    /// Shutdown: every bucket's assignment again, expiring now, so each Envoy goes to its
    /// `expired_assignment_behavior` before tollgate stops answering. Their tokens stay
    /// spent: an Envoy that reuses its last assignment may still spend them.
    pub fn closing(&mut self) -> Vec<Action> {
        self.buckets
            .iter()
            .filter_map(|(id, t)| {
                t.last
                    .and_then(Assignment::expired)
                    .map(|assignment| Action {
                        id: id.clone(),
                        assignment,
                    })
            })
            .collect()
    }

    /// Counts and records what `id` is told.
    pub(super) fn told(&mut self, id: BucketKey, assignment: Assignment) -> Action {
        self.shared
            .metrics
            .assignments
            .get_or_create(&StrategyLabels {
                strategy: assignment.strategy(),
            })
            .inc();
        if let Some(t) = self.buckets.get_mut(&id) {
            t.last = Some(assignment);
        }
        Action { id, assignment }
    }

    /// Whether a reported bucket id is held: not empty, within the descriptor bounds, within
    /// `rlqs_max_buckets_per_stream`, and within `rlqs_max_state_bytes` for the replica. An id
    /// refused by a bound is told `DENY_ALL` (counted): an Envoy whose ids tollgate cannot hold
    /// is limited, not left to a `no_assignment_behavior` that may be `ALLOW_ALL`.
    pub(super) fn admit_id(&mut self, id: &BucketKey) -> Admit {
        let c = &self.shared.config;
        if id.is_empty() {
            self.shared.refused("empty_bucket_id");
            return Admit::Skipped;
        }
        if id.len() > c.max_entries
            || id.iter().any(|(k, v)| {
                k.is_empty() || k.len() > c.max_key_bytes || v.len() > c.max_value_bytes
            })
        {
            self.shared.refused("bucket_id_too_large");
            return Admit::Denied;
        }
        if self.buckets.contains_key(id) {
            return Admit::Held;
        }
        let bytes = tracked_bytes(id);
        let (reason, why) = if self.buckets.len() >= c.max_buckets_per_stream {
            (
                "too_many_buckets",
                "an RLQS stream reports more bucket ids than rlqs_max_buckets_per_stream: the others are told DENY_ALL",
            )
        } else if !self.shared.caps.reserve(bytes, c.max_state_bytes) {
            (
                "state_full",
                "the RLQS bucket ids held on this replica reach rlqs_max_state_bytes: new ones are told DENY_ALL",
            )
        } else {
            return Admit::New(bytes);
        };
        self.shared.refused(reason);
        if !self.warned_full {
            self.warned_full = true;
            tracing::warn!(
                domain = self.domain.as_deref().unwrap_or(""),
                max_buckets_per_stream = c.max_buckets_per_stream,
                max_state_bytes = c.max_state_bytes,
                "{why}"
            );
        }
        Admit::Denied
    }

    /// What `id` draws from under `rules` now.
    pub(super) fn quota(&self, limiter: &Limiter, rules: &RuleSet, id: &BucketKey) -> Quota {
        let Some(domain) = self.domain.as_deref().and_then(|d| rules.domains.get(d)) else {
            return Quota::NoRule;
        };
        if !domain.rlqs {
            return Quota::Unservable;
        }
        let entries: Vec<(&str, &str)> = id.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        match order_entries(domain, &entries) {
            Some(ordered) => limiter.quota_of(domain, &ordered),
            None => Quota::NoRule,
        }
    }

    /// Bucket `id`'s entry in the demand of its key.
    pub(super) fn demand_id(&self, id: &BucketKey) -> (u64, u64) {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        id.hash(&mut h);
        (self.id, h.finish())
    }

    /// Bucket `id`'s demand on `key` stops counting.
    pub(super) fn forget_demand(&self, key: &str, id: &BucketKey) {
        let me = self.demand_id(id);
        let mut demand = self.shared.demand();
        if let Some(d) = demand.get_mut(key) {
            d.rates.remove(&me);
            if d.rates.is_empty() {
                demand.remove(key);
            }
        }
    }
}

pub(super) fn tracked_key(t: &Tracked) -> Option<String> {
    match &t.quota {
        Quota::Counted { key, .. } => Some(key.clone()),
        _ => None,
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let bytes: u64 = self.buckets.values().map(|t| t.bytes).sum();
        self.shared.caps.close(self.peer, bytes);
        let keys: Vec<(String, BucketKey)> = self
            .buckets
            .iter()
            .filter_map(|(id, t)| tracked_key(t).map(|k| (k, id.clone())))
            .collect();
        for (key, id) in keys {
            self.forget_demand(&key, &id);
        }
        self.shared
            .metrics
            .buckets
            .dec_by(self.buckets.len() as i64);
        self.shared.metrics.streams.dec();
    }
}
