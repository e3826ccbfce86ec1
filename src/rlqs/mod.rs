//! RLQS: Envoy's `rate_limit_quota` filter enforces quota assignments locally, and tollgate
//! hands each Envoy its share of the **same shared bucket** RLS requests and leases draw from.
//!
//! # How a report flows ([`Session::report`])
//!
//! One [`Session`] per `StreamRateLimitQuotas` stream (`service/rlqs.rs` turns protos into
//! [`Usage`]s and [`Action`]s into protos). Envoy reports each bucket's usage when the bucket
//! sees its first request, then every report interval (5 s on Envoy 1.40). For each bucket:
//!
//! 1. **Rule**: the bucket id (a map) is put in the order the domain's tree declares its keys
//!    (`rules::matcher::order_entries`) and planned as an RLS descriptor with those entries
//!    would be ([`Limiter::quota_of`]): the same store key. No rule: `ALLOW_ALL` (no limit, as
//!    RLS answers); `unlimited`: `ALLOW_ALL`; a rule that went away on reload: `abandon`.
//! 2. **Settle** the last assignment: the Envoy was given `held` tokens (claimed from the
//!    shared bucket before it spent any); it reports `allowed`. Unused tokens (`held - allowed`)
//!    are given back; requests admitted beyond `held` (before its first assignment, under its
//!    fallback, or from the previous assignment while this one was on its way) are charged to
//!    the bucket, into debt if need be (`overdraft`'s charge, at most one limit deep). A fixed
//!    window carries its debt into the next windows, and a give-back never erases what others
//!    were charged (`quota/bucket/fixed_window.rs`).
//! 3. **Claim** the next assignment: [`size::want`] tokens, the Envoy's demand-weighted share
//!    of what the bucket can give over one interval, with a floor, never more than its
//!    demand (× 1.25) or, where the bucket can spare it beyond the other Envoys' demand, the
//!    limit's refill over one interval (so demand can grow at once; also a new stream's first
//!    claim, before its demand is known); a claim of at least 1 and up to `want`
//!    (`lease.lua`'s claim). The weights are
//!    over the Envoys this replica serves; Envoys on other replicas share by when they
//!    report (each claim takes what has refilled since the last). Granted: a token bucket holding those tokens (with a slow refill, charged when
//!    used). Refused: `DENY_ALL`, and the bucket is claimed again
//!    when the store says tokens exist again ([`Session::wake`]), pushed without waiting for
//!    the next report.
//!
//! A fixed window's assignment ends with its window: its TTL is rounded down to the whole
//! seconds left (Envoy reads whole seconds); in the window's last second none is made
//! (`DENY_ALL` for 1 s, then claimed again when the next window starts, [`Session::wake`]).
//!
//! Settles, then claims, go to the store as one call each per report ([`Limiter::apply_quota_ops`]);
//! what it cannot answer comes from the local fallback share, as RLS decisions do.
//!
//! # Envoy's token bucket starts with exactly the assignment
//!
//! Envoy 1.40 starts a token bucket that replaces another at the old one's fill ratio (part of
//! the old leftover carries over), and keeps the old one outright when the new assignment
//! looks the same. The accounting above needs each assignment to hold exactly what was
//! claimed for it (the old one's leftover was given back), so `service/rlqs.rs` sends each
//! token bucket right after a `DENY_ALL` for the same bucket in one response: a bucket that
//! replaces a blanket rule starts full, and Envoy applies a response's actions in order
//! before its workers see any. A granted bucket of `n` refills `n` per [`FILL_SECS`] (Envoy
//! needs a refill above 0): what that admits before the next assignment is charged.
//!
//! # Bounds
//!
//! Tokens are claimed before an Envoy can spend them, so assignments never admit more than
//! the bucket gave. What is admitted beyond them is charged at the next report: requests
//! before an Envoy's first assignment (its `no_assignment_behavior`), while tollgate was
//! unreachable (its `expired_assignment_behavior`), and those its previous assignment admitted
//! between sending a report and applying the answer (about one round trip of its traffic). A
//! stream that breaks keeps its last assignment's tokens spent (the Envoy may still use them
//! until their TTL); its next stream's first report charges what it admitted meanwhile.
//! At most `rlqs_max_streams` streams × `rlqs_max_buckets_per_stream` buckets are held.

mod caps;
mod size;

pub use caps::{TRACKED_OVERHEAD, tracked_bytes};

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::clock::Clock;
use crate::limiter::{FallbackMode, Limiter, Quota};
use crate::quota::lease::WINDOW_MARGIN_MS;
use crate::quota::{Action as OpAction, ClaimAsk, Op};
use crate::rules::RuleSet;
use crate::rules::matcher::order_entries;
use crate::telemetry::{EventLabels, ReasonLabels, RlqsMetrics, StrategyLabels};

/// A granted assignment of `n` tokens refills `n` per this many seconds (Envoy's token bucket
/// needs a refill above 0): 0.14 % of the assignment over a 5 s interval, admitted beyond the
/// claim and charged at the next report.
pub const FILL_SECS: i64 = 3_600;

/// The settings of the RLQS server.
#[derive(Clone, Debug)]
pub struct RlqsConfig {
    pub report_interval_ms: u64,
    pub assignment_ttl_ms: u64,
    pub max_streams: usize,
    /// Streams one peer (a remote IP address) may hold of `max_streams`.
    pub max_streams_per_peer: usize,
    pub max_buckets_per_stream: usize,
    /// Bytes of bucket-id state all streams of this replica may hold ([`tracked_bytes`]).
    pub max_state_bytes: u64,
    pub idle_ms: u64,
    /// The bounds of an RLS descriptor, for a bucket id's entries.
    pub max_entries: usize,
    pub max_key_bytes: usize,
    pub max_value_bytes: usize,
    pub clock: Clock,
}

/// A bucket id: its entries sorted by key (a `BucketId` is a map: order does not matter).
pub type BucketKey = Vec<(String, String)>;

/// One bucket's usage in a report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Usage {
    pub id: BucketKey,
    pub allowed: u64,
    pub denied: u64,
    /// The span the counts cover; 0 in a bucket's first report.
    pub elapsed_ms: u64,
}

/// What one bucket is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assignment {
    /// A token bucket holding exactly `tokens` (module doc).
    Tokens {
        tokens: u64,
        ttl_s: u64,
    },
    AllowAll {
        ttl_s: u64,
    },
    DenyAll {
        ttl_s: u64,
    },
    /// Forget the bucket (its rule went away, or it went idle).
    Abandon,
}

impl Assignment {
    /// The metrics label.
    pub fn strategy(&self) -> &'static str {
        match self {
            Assignment::Tokens { ttl_s: 0, .. }
            | Assignment::AllowAll { ttl_s: 0 }
            | Assignment::DenyAll { ttl_s: 0 } => "expire",
            Assignment::Tokens { .. } => "token_bucket",
            Assignment::AllowAll { .. } => "allow_all",
            Assignment::DenyAll { .. } => "deny_all",
            Assignment::Abandon => "abandon",
        }
    }

    /// The same assignment, expiring now (shutdown: Envoy goes to its fallback).
    fn expired(self) -> Option<Assignment> {
        match self {
            Assignment::Tokens { tokens, .. } => Some(Assignment::Tokens { tokens, ttl_s: 0 }),
            Assignment::AllowAll { .. } => Some(Assignment::AllowAll { ttl_s: 0 }),
            Assignment::DenyAll { .. } => Some(Assignment::DenyAll { ttl_s: 0 }),
            Assignment::Abandon => None,
        }
    }
}

/// One bucket action to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Action {
    pub id: BucketKey,
    pub assignment: Assignment,
}

/// Why a stream is ended.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RlqsError {
    #[error("the first RLQS report must name its domain (RateLimitQuotaFilterConfig.domain)")]
    NoDomain,
    #[error(
        "the stream reported for domain '{first}' and now names '{now}': one stream, one domain"
    )]
    DomainChanged { first: String, now: String },
    #[error("no rules file declares domain '{0}'")]
    UnknownDomain(String),
    #[error("domain '{0}' is not served over RLQS: its rules file does not set rlqs: true")]
    NotRlqs(String),
    #[error("this replica holds rlqs_max_streams ({0}) RLQS streams already")]
    TooManyStreams(usize),
    #[error(
        "peer {peer} holds rlqs_max_streams_per_peer ({max}) RLQS streams on this replica already"
    )]
    TooManyStreamsFromPeer { peer: IpAddr, max: usize },
}

/// The state all streams of this replica share: settings, metrics, and each bucket's demand
/// by stream (for the weights).
#[derive(Debug)]
pub struct Rlqs {
    config: RlqsConfig,
    metrics: RlqsMetrics,
    /// Stream places (in all and per peer) and bucket-id bytes taken (`caps.rs`).
    caps: caps::Caps,
    next_stream: AtomicU64,
    /// Store key → its Envoys' demand and what the bucket held at its last claim.
    demand: Mutex<HashMap<String, KeyDemand>>,
}

#[derive(Debug, Default)]
struct KeyDemand {
    /// (stream id, bucket id hash) → requests per second (`None`: not known yet). Several
    /// bucket ids of one stream can share a key (a `share_threshold` wildcard folds them).
    rates: HashMap<(u64, u64), Option<f64>>,
    /// What the bucket held at its last claim, and until when that holds (monotonic ms): a
    /// fixed window's count starts again at its end.
    remaining: Option<(u64, u64)>,
}

impl Rlqs {
    pub fn new(config: RlqsConfig, metrics: RlqsMetrics) -> Arc<Self> {
        Arc::new(Rlqs {
            config,
            metrics,
            caps: caps::Caps::default(),
            next_stream: AtomicU64::new(1),
            demand: Mutex::new(HashMap::new()),
        })
    }

    pub fn config(&self) -> &RlqsConfig {
        &self.config
    }

    /// Counts a refusal.
    pub fn refused(&self, reason: &'static str) {
        self.metrics
            .refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    fn demand(&self) -> std::sync::MutexGuard<'_, HashMap<String, KeyDemand>> {
        self.demand.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ttl_s(&self) -> u64 {
        (self.config.assignment_ttl_ms / 1000).max(1)
    }

    fn count_tokens(&self, event: &'static str, n: u64) {
        if n > 0 {
            self.metrics
                .tokens
                .get_or_create(&EventLabels { event })
                .inc_by(n);
        }
    }
}

/// One bucket id held by a stream.
#[derive(Debug)]
struct Tracked {
    quota: Quota,
    /// Tokens claimed for the Envoy's current assignment and not settled yet.
    held: u64,
    /// The last span's demand (requests per second).
    rate: Option<f64>,
    /// Monotonic ms of the last report with requests in it.
    active_ms: u64,
    /// Refused: when the store says tokens exist again (monotonic ms).
    wake_ms: Option<u64>,
    /// `held` came from the fallback, not the shared bucket: never given back to the store.
    held_from_fallback: bool,
    /// A fixed window's `held`: when its window ends (monotonic ms). Tokens of an ended
    /// window are not given back (they would count against the next window), as leases do.
    window_end_ms: Option<u64>,
    last: Option<Assignment>,
    /// What it counts against `max_state_bytes` ([`tracked_bytes`]).
    bytes: u64,
}

/// Whether a reported id is held.
enum Admit {
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
    shared: Arc<Rlqs>,
    id: u64,
    domain: Option<String>,
    buckets: HashMap<BucketKey, Tracked>,
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

    /// Handles one report (see the module doc); `domain` is the report's (empty after the
    /// first, as Envoy may send it). An error ends the stream.
    pub async fn report(
        &mut self,
        limiter: &Limiter,
        rules: &RuleSet,
        domain: &str,
        usages: Vec<Usage>,
    ) -> Result<Vec<Action>, RlqsError> {
        self.shared.metrics.reports.inc();
        match &self.domain {
            None if domain.is_empty() => {
                self.shared.refused("no_domain");
                return Err(RlqsError::NoDomain);
            }
            None => {
                let Some(d) = rules.domains.get(domain) else {
                    self.shared.refused("unknown_domain");
                    return Err(RlqsError::UnknownDomain(domain.to_string()));
                };
                if !d.rlqs {
                    self.shared.refused("not_rlqs");
                    return Err(RlqsError::NotRlqs(domain.to_string()));
                }
                self.domain = Some(domain.to_string());
            }
            Some(first) if !domain.is_empty() && domain != first => {
                self.shared.refused("domain_changed");
                return Err(RlqsError::DomainChanged {
                    first: first.clone(),
                    now: domain.to_string(),
                });
            }
            // A reload took `rlqs: true` away: the stream ends and Envoy falls back, rather
            // than its buckets going unlimited.
            Some(first) if rules.domains.get(first).is_some_and(|d| !d.rlqs) => {
                self.shared.refused("not_rlqs");
                return Err(RlqsError::NotRlqs(first.clone()));
            }
            Some(_) => {}
        }
        let now = self.shared.config.clock.mono_ms();
        let interval = self.shared.config.report_interval_ms;

        // 1. Rules, and each bucket's demand.
        let mut reported: Vec<BucketKey> = Vec::with_capacity(usages.len());
        let mut settles: Vec<(Op, Option<FallbackMode>)> = Vec::new();
        let mut actions: Vec<Action> = Vec::new();
        for usage in merge_repeats(usages) {
            let reserved = match self.admit_id(&usage.id) {
                Admit::Held => 0,
                Admit::New(bytes) => bytes,
                Admit::Denied => {
                    let ttl_s = self.shared.ttl_s();
                    actions.push(self.told(usage.id, Assignment::DenyAll { ttl_s }));
                    continue;
                }
                Admit::Skipped => continue,
            };
            let quota = self.quota(limiter, rules, &usage.id);
            let shared = self.shared.clone();
            let tracked = self.buckets.entry(usage.id.clone()).or_insert_with(|| {
                shared.metrics.buckets.inc();
                Tracked {
                    quota: quota.clone(),
                    held: 0,
                    rate: None,
                    active_ms: now,
                    wake_ms: None,
                    held_from_fallback: false,
                    window_end_ms: None,
                    last: None,
                    bytes: reserved,
                }
            });
            let requests = usage.allowed.saturating_add(usage.denied);
            if requests > 0 {
                tracked.active_ms = now;
            }
            // The last assignment's tokens against what it admitted.
            if let Quota::Counted { limit, key, kind } = &tracked.quota {
                let window_over = tracked
                    .window_end_ms
                    .is_some_and(|end| now.saturating_add(WINDOW_MARGIN_MS) >= end);
                if tracked.held > usage.allowed && (tracked.held_from_fallback || window_over) {
                    // Not the store's to take back: the fallback granted them, or their
                    // window is over.
                } else if tracked.held > usage.allowed {
                    let n = tracked.held - usage.allowed;
                    let give_back = Op {
                        key: key.clone(),
                        kind: *kind,
                        cost: n,
                        action: OpAction::Return,
                    };
                    settles.push((give_back, limit.fallback));
                    shared.count_tokens("returned", n);
                } else if usage.allowed > tracked.held {
                    let n = usage.allowed - tracked.held;
                    settles.push((Op::charge(key.clone(), *kind, n), limit.fallback));
                    shared.count_tokens("charged", n);
                }
                tracked.held = 0;
            }
            let old_key = tracked_key(tracked);
            let new_key = match &quota {
                Quota::Counted { key, .. } => Some(key.clone()),
                _ => None,
            };
            let idle =
                requests == 0 && now.saturating_sub(tracked.active_ms) >= shared.config.idle_ms;
            // Its rule went away on a reload, or it went idle: Envoy forgets it, and its next
            // request brings it back as a new bucket.
            let abandon = idle || (old_key.is_some() && new_key.is_none());
            if !abandon {
                tracked.quota = quota;
                tracked.rate = (usage.elapsed_ms > 0)
                    .then(|| requests as f64 * 1000.0 / usage.elapsed_ms as f64);
            }
            let rate = tracked.rate;
            if abandon {
                if let Some(t) = self.buckets.remove(&usage.id) {
                    shared.caps.release(t.bytes);
                }
                shared.metrics.buckets.dec();
                if let Some(key) = old_key {
                    self.forget_demand(&key, &usage.id);
                }
                actions.push(self.told(usage.id, Assignment::Abandon));
                continue;
            }
            if old_key.is_some() && old_key != new_key {
                // A changed limit (a new key): the old bucket's demand goes.
                if let Some(key) = &old_key {
                    self.forget_demand(key, &usage.id);
                }
            }
            if let Some(key) = new_key {
                let mut demand = shared.demand();
                demand
                    .entry(key)
                    .or_default()
                    .rates
                    .insert(self.demand_id(&usage.id), rate);
            }
            reported.push(usage.id);
        }
        if !settles.is_empty() {
            limiter.apply_quota_ops(&settles).await;
        }

        // 2. Claims for the counted buckets; the others are told now.
        let mut claims: Vec<BucketKey> = Vec::new();
        for id in reported {
            let Some(tracked) = self.buckets.get(&id) else {
                continue;
            };
            match tracked.quota {
                Quota::Counted { .. } => claims.push(id),
                // No limit (as RLS answers), or not servable (refused at load in an
                // rlqs: true domain; here only if the rules changed under the stream).
                Quota::NoRule | Quota::Unlimited | Quota::Unservable => {
                    let assignment = Assignment::AllowAll {
                        ttl_s: self.shared.ttl_s(),
                    };
                    actions.push(self.told(id, assignment));
                }
            }
        }
        actions.extend(self.claim(limiter, claims, now, interval).await);
        Ok(actions)
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
    fn told(&mut self, id: BucketKey, assignment: Assignment) -> Action {
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

    /// One store call claiming the next assignment of each of `ids` (all counted).
    async fn claim(
        &mut self,
        limiter: &Limiter,
        ids: Vec<BucketKey>,
        now: u64,
        interval: u64,
    ) -> Vec<Action> {
        let mut ops: Vec<(Op, Option<FallbackMode>)> = Vec::with_capacity(ids.len());
        let mut asked: Vec<BucketKey> = Vec::with_capacity(ids.len());
        let mut actions = Vec::with_capacity(ids.len());
        let mut window_ending: Vec<(BucketKey, u64)> = Vec::new();
        {
            let demand = self.shared.demand();
            for id in ids {
                let Some(t) = self.buckets.get(&id) else {
                    continue;
                };
                let Quota::Counted { limit, key, kind } = &t.quota else {
                    continue;
                };
                // A fixed window known to end within a second: an assignment could not end
                // with it (Envoy reads whole seconds), so none is claimed (see below).
                if let Some(end) = t.window_end_ms.filter(|&end| {
                    matches!(kind, crate::store::OpKind::FixedWindow { .. })
                        && end > now
                        && end - now < 1_000
                }) {
                    window_ending.push((id, end));
                    continue;
                }
                let me = self.demand_id(&id);
                let (others, remaining) = match demand.get(key) {
                    Some(d) => (
                        d.rates
                            .iter()
                            .filter(|(s, _)| **s != me)
                            .map(|(_, r)| r.unwrap_or(0.0))
                            .collect::<Vec<f64>>(),
                        d.remaining
                            .filter(|&(_, until)| now < until)
                            .map(|(r, _)| r),
                    ),
                    None => (Vec::new(), None),
                };
                let capacity = match *kind {
                    crate::store::OpKind::TokenBucket { capacity, .. } => capacity,
                    crate::store::OpKind::FixedWindow { limit, .. }
                    | crate::store::OpKind::SlidingWindow { limit, .. }
                    | crate::store::OpKind::SlidingLog { limit, .. } => limit,
                };
                let supply = size::supply(*kind, remaining.unwrap_or(capacity), interval);
                let ramp = size::refill_per_interval(*kind, interval);
                // Envoy's max_tokens is a u32.
                let want =
                    size::want(t.rate, &others, supply, interval, ramp).min(u64::from(u32::MAX));
                ops.push((
                    Op {
                        key: key.clone(),
                        kind: *kind,
                        cost: 1,
                        action: OpAction::Claim(ClaimAsk {
                            need: 1,
                            want,
                            // Not split by replicas as leases are: `want` is already
                            // this Envoy's share, capped by its own demand.
                            share: 1,
                        }),
                    },
                    limit.fallback,
                ));
                asked.push(id);
            }
        }
        for (id, end) in window_ending {
            actions.push(self.window_ends(id, end));
        }
        let outcomes = limiter.apply_quota_ops(&ops).await;
        let ttl_s = self.shared.ttl_s();
        for ((id, (op, _)), outcome) in asked.into_iter().zip(&ops).zip(outcomes) {
            let Some((outcome, from_fallback)) = outcome else {
                // The limit's fallback is `error`: no assignment, so Envoy keeps its last one
                // until its TTL and then applies its own expired_assignment_behavior. Tried
                // again a quarter interval on (not at once: a failing store answers fast).
                if let Some(t) = self.buckets.get_mut(&id) {
                    t.held = 0;
                    t.wake_ms = Some(now.saturating_add((interval / 4).max(100)));
                }
                continue;
            };
            // A fixed window's end: `reset_ms` is until its count is back at 0, which with
            // debt is some whole windows past this one's end. Not for the fallback's answer:
            // its `reset_ms` is its own (`closed_retry_ms` for `open`, a stretched window for
            // a small limit's `local` share), not the store's window.
            let window_left = match op.kind {
                crate::store::OpKind::FixedWindow { window_ms, .. } if !from_fallback => {
                    Some(outcome.reset_ms.saturating_sub(1) % window_ms.max(1) + 1)
                }
                _ => None,
            };
            if !from_fallback {
                // A token bucket's remaining holds (the supply adds its refill); a fixed
                // window's only until the window ends.
                let until = match window_left {
                    Some(left) => now.saturating_add(left),
                    None => u64::MAX,
                };
                let mut demand = self.shared.demand();
                if let Some(d) = demand.get_mut(&op.key) {
                    d.remaining = Some((outcome.remaining, until));
                }
            }
            let Some(t) = self.buckets.get_mut(&id) else {
                continue;
            };
            t.held_from_fallback = from_fallback;
            let window_end = window_left.map(|left| now.saturating_add(left));
            // Only a granted assignment's window matters (settling, and the claim before the
            // window's last second).
            t.window_end_ms = window_end.filter(|_| outcome.granted > 0);
            if let Some(end) = window_end.filter(|&end| outcome.granted > 0 && end < now + 1_000) {
                // Granted in the window's last second: an assignment of whole seconds would
                // outlive it. Its tokens end with the window (too close to give back: a
                // give-back landing in the next window would take hits off that one).
                self.shared.count_tokens("expired", outcome.granted);
                actions.push(self.window_ends(id, end));
                continue;
            }
            let assignment = if outcome.granted > 0 {
                t.held = outcome.granted;
                // A fixed window's assignment ends with its window (Envoy reads whole
                // seconds: rounded down, it never outlives it). Until the Envoy's next report
                // it applies its expired_assignment_behavior; what that admits is charged to
                // the new window then. (Pushing the new window's assignment at once would
                // leave the old one's usage and the new one's in one count, which could only
                // be charged twice or under-charged.)
                let ttl_s = match window_left {
                    Some(left) => ttl_s.min(left / 1_000),
                    None => ttl_s,
                };
                t.wake_ms = None;
                self.shared.count_tokens("assigned", outcome.granted);
                Assignment::Tokens {
                    tokens: outcome.granted,
                    ttl_s,
                }
            } else {
                // Claimed again when the store says a token exists, but not more often than
                // a quarter interval: a slow refill would otherwise push one token at a time.
                t.wake_ms = outcome
                    .retry_ms
                    .map(|r| now.saturating_add(r.max(interval / 4)));
                Assignment::DenyAll { ttl_s }
            };
            actions.push(self.told(id, assignment));
        }
        actions
    }

    /// A fixed window ends within a second (at monotonic `end`): the bucket is denied until
    /// then (1 s, the least Envoy reads) and claimed again when the next window starts.
    fn window_ends(&mut self, id: BucketKey, end: u64) -> Action {
        if let Some(t) = self.buckets.get_mut(&id) {
            t.held = 0;
            t.wake_ms = Some(end);
        }
        self.told(id, Assignment::DenyAll { ttl_s: 1 })
    }

    /// Whether a reported bucket id is held: not empty, within the descriptor bounds, within
    /// `rlqs_max_buckets_per_stream`, and within `rlqs_max_state_bytes` for the replica. An id
    /// refused by a bound is told `DENY_ALL` (counted): an Envoy whose ids tollgate cannot hold
    /// is limited, not left to a `no_assignment_behavior` that may be `ALLOW_ALL`.
    fn admit_id(&mut self, id: &BucketKey) -> Admit {
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
    fn quota(&self, limiter: &Limiter, rules: &RuleSet, id: &BucketKey) -> Quota {
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
    fn demand_id(&self, id: &BucketKey) -> (u64, u64) {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        id.hash(&mut h);
        (self.id, h.finish())
    }

    /// Bucket `id`'s demand on `key` stops counting.
    fn forget_demand(&self, key: &str, id: &BucketKey) {
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

/// One usage per bucket id: a report that names an id twice (Envoy does not; a hostile client
/// might) counts its requests once each, not its assignment twice.
fn merge_repeats(usages: Vec<Usage>) -> Vec<Usage> {
    let mut at: HashMap<BucketKey, usize> = HashMap::new();
    let mut merged: Vec<Usage> = Vec::with_capacity(usages.len());
    for u in usages {
        match at.get(&u.id) {
            Some(&i) => {
                let m = &mut merged[i];
                m.allowed = m.allowed.saturating_add(u.allowed);
                m.denied = m.denied.saturating_add(u.denied);
                m.elapsed_ms = m.elapsed_ms.max(u.elapsed_ms);
            }
            None => {
                at.insert(u.id.clone(), merged.len());
                merged.push(u);
            }
        }
    }
    merged
}

fn tracked_key(t: &Tracked) -> Option<String> {
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

#[cfg(test)]
mod tests;
