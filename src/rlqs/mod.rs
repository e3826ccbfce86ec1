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
//!
//! # Files
//!
//! - this file: the settings, the messages ([`Usage`], [`Action`], [`Assignment`]), the
//!   errors that end a stream, and [`Rlqs`], the state every stream of the replica shares
//!   (each key's demand by stream).
//! - [`session`]: one stream's held buckets, the caps on them, and its lifetime.
//! - [`report`]: a report, steps 1 and 2 (the domain, each bucket's rule, demand and settle).
//! - [`claim`]: step 3, the claims and what each outcome tells the Envoy.
//! - [`size`]: how many tokens to claim; [`caps`]: the stream and state bounds.

mod caps;
mod claim;
mod report;
mod session;
mod size;

pub use caps::{TRACKED_OVERHEAD, tracked_bytes};
pub use session::Session;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use crate::clock::Clock;
use crate::telemetry::{EventLabels, ReasonLabels, RlqsMetrics};

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

#[cfg(test)]
mod tests;
