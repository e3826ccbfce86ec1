//! Metrics and logs: every metric family is declared here, once, with its name and help.
//!
//! The limiter and the servers record into a shared [`Metrics`]; the admin port's `/metrics`
//! renders it, with the `process_*` families, as OpenMetrics or the Prometheus text format,
//! whichever the scraper asks for (`exposition.rs`). Decisions are labelled by `domain`, `class` and
//! `outcome`: `class` is the rule's `class`, else its `name`, else its key path, never a raw
//! request value, so the number of series stays bounded by the rules, not by traffic.
//!
//! With `statsd_addr` set, the reference's per-rule counters also go to statsd (`statsd.rs`).
//!
//! Logs go to stderr through `tracing`. With `otlp_endpoint` set, each `ShouldRateLimit` call is
//! also a span (domain, descriptor count, result) exported over OTLP/gRPC to a collector: both
//! are set up in `traces.rs` ([`init`]).

use std::sync::{Arc, Mutex};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub mod exposition;
pub mod reference_metrics;
pub mod statsd;
mod traces;

pub use statsd::{CallError, Hits, Split, Statsd};
pub use traces::{LogFormat, REQUEST_SPAN_TARGET, Telemetry, TelemetryError, init, init_logging};

pub const DECISIONS: &str = "tollgate_decisions";
pub const REQUEST_DURATION: &str = "tollgate_request_duration_seconds";
pub const REQUESTS: &str = "tollgate_requests";
pub const GLOBAL_SHADOW: &str = "tollgate_global_shadow";
pub const RULES_RELOADS: &str = "tollgate_rules_reloads";
pub const COUNTER_API_CALLS: &str = "tollgate_counter_api_calls";
pub const RULES_LOADED: &str = "tollgate_rules_loaded_limits";
pub const STORE_ERRORS: &str = "tollgate_store_errors";
pub const STORE_CALL_DURATION: &str = "tollgate_store_call_duration_seconds";
pub const STORE_CONNECTIONS: &str = "tollgate_store_connections";
pub const FALLBACK_ACTIVE: &str = "tollgate_fallback_active";
pub const BREAKER_TRANSITIONS: &str = "tollgate_breaker_transitions";
pub const STORE_WAIT_SHORT: &str = "tollgate_store_wait_short";
pub const STORE_DEADLINE_MISSES: &str = "tollgate_store_deadline_misses";
pub const LATE_DECISIONS: &str = "tollgate_late_decisions";
pub const STORE_BATCH_OPS: &str = "tollgate_store_batch_ops";
pub const REFUSED: &str = "tollgate_refused";
pub const UNKNOWN_DOMAINS: &str = "tollgate_unknown_domain_requests";
pub const REPLICAS: &str = "tollgate_replicas";
pub const REPLICAS_FROM_MEMBERSHIP: &str = "tollgate_replicas_from_membership";
pub const LEASE_CLAIMS: &str = "tollgate_lease_claims";
pub const LEASE_TOKENS: &str = "tollgate_lease_tokens";
pub const LOCAL_DECISIONS: &str = "tollgate_local_decisions";
pub const SHARD_RETRIES: &str = "tollgate_shard_retries";
pub const RLQS_STREAMS: &str = "tollgate_rlqs_streams";
pub const RLQS_BUCKETS: &str = "tollgate_rlqs_buckets";
pub const RLQS_REPORTS: &str = "tollgate_rlqs_reports";
pub const RLQS_ASSIGNMENTS: &str = "tollgate_rlqs_assignments";
pub const RLQS_TOKENS: &str = "tollgate_rlqs_tokens";
pub const RLQS_REFUSED: &str = "tollgate_rlqs_refused";
pub const REGION_EXCHANGES: &str = "tollgate_region_exchanges";
pub const REGION_CONTACT_AGE: &str = "tollgate_region_global_contact_age_seconds";
pub const REGION_PARTITIONED: &str = "tollgate_region_partitioned";
pub const REGION_KEYS: &str = "tollgate_region_keys";
pub const REGION_SHARE: &str = "tollgate_region_share_ratio";
pub const REGION_DISAGREEMENTS: &str = "tollgate_region_disagreements";

/// What happened to one descriptor.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Outcome {
    ok,
    /// Admitted, but past `near_limit_ratio` of the limit (used after this hit > ⌊limit ×
    /// ratio⌋, as envoyproxy/ratelimit counts it); `ok` + `near_limit` is what was admitted.
    near_limit,
    over_limit,
    /// Over the limit, but the rule is in shadow mode: reported as OK.
    shadow,
    unlimited,
    no_rule,
    /// Decided by the fallback while the store could not answer: admitted.
    fallback_ok,
    /// Decided by the fallback while the store could not answer: refused.
    fallback_over_limit,
    /// Tokens given back (Envoy's `is_negative_hits`): not a hit, never refused.
    refund,
}

impl Outcome {
    /// How many outcomes there are (`outcome as usize` is below it while `refund` is last).
    pub const COUNT: usize = Outcome::refund as usize + 1;
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// `Arc`s shared with the rules: building the labels of a decision copies no string.
    pub domain: Arc<str>,
    pub class: Arc<str>,
    pub outcome: Outcome,
}

/// The result of one ShouldRateLimit call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// One of [`RequestCounts::CODES`].
    pub code: &'static str,
}

/// `tollgate_requests_total`'s series, one per result, made once: every request counts
/// itself without hashing its label into the family (a measurable part of a request's cost
/// on the memory store), and each series is exported from the start, at 0 until it counts.
#[derive(Debug)]
pub struct RequestCounts {
    ok: Counter,
    over_limit: Counter,
    invalid: Counter,
    error: Counter,
    overloaded: Counter,
}

impl RequestCounts {
    /// Every result a request is counted by.
    pub const CODES: [&'static str; 5] = ["ok", "over_limit", "invalid", "error", "overloaded"];

    fn new(family: &Family<RequestLabels, Counter>) -> Self {
        let series = |code| family.get_or_create(&RequestLabels { code }).clone();
        RequestCounts {
            ok: series("ok"),
            over_limit: series("over_limit"),
            invalid: series("invalid"),
            error: series("error"),
            overloaded: series("overloaded"),
        }
    }

    /// The series of `code` (one of [`Self::CODES`]; any other counts as `error`).
    pub fn of(&self, code: &str) -> &Counter {
        match code {
            "ok" => &self.ok,
            "over_limit" => &self.over_limit,
            "invalid" => &self.invalid,
            "overloaded" => &self.overloaded,
            _ => &self.error,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

/// A counter API call: `read` or `reset`, and how it ended (`ok`, `unauthorized`, `invalid`,
/// `error`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CounterApiLabels {
    pub action: &'static str,
    pub result: &'static str,
}

/// A domain no rules file declares, as the request named it (the first
/// `UNKNOWN_DOMAIN_NAMES` names, then `(other)`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DomainLabels {
    pub domain: Arc<str>,
}

/// What a peer was refused (`request_bytes`: past `max_request_bytes_in_flight`;
/// `connections`: past `grpc_max_connections`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    pub what: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

/// A store operation (`apply`, `connect`, `ping`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: &'static str,
}

/// A store node: `store` (standalone Redis) or a cluster primary's `host:port`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub node: String,
}

/// Where a request's decision budget ran out (`tollgate_late_decisions_total`): `arrival` (past
/// it when its headers were read: never sent to the store) or `store` (the store had not
/// answered within it).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub stage: &'static str,
}

/// A circuit breaker transition of one node, `to` `open` or `closed`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    pub node: String,
    pub to: &'static str,
}

/// A limit's metrics class (the rule's `class`, never a raw value).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabels {
    pub class: Arc<str>,
}

/// Leased tokens by class and what happened to them: `granted` by a claim, `returned` at
/// shutdown, `expired` unspent.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseTokenLabels {
    pub class: Arc<str>,
    pub event: &'static str,
}

/// A decision answered without a store call, by class and why: `lease` or `over_limit_cache`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LocalLabels {
    pub class: Arc<str>,
    pub reason: &'static str,
}

/// A count of store connections: `connected` or `total`.
/// An RLQS assignment by what it told Envoy: `token_bucket`, `allow_all`, `deny_all`,
/// `abandon`, `expire` (TTL 0 at shutdown).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StrategyLabels {
    pub strategy: &'static str,
}

/// RLQS tokens by event: `assigned` (claimed for an Envoy), `returned` (unused, given back
/// at its next report), `charged` (admitted beyond its assignment: before the first one, or
/// while it ran on its fallback).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    pub event: &'static str,
}

/// Why RLQS input was refused.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

/// The RLQS server's families (`rlqs/`).
#[derive(Clone, Debug, Default)]
pub struct RlqsMetrics {
    pub streams: Gauge,
    pub buckets: Gauge,
    pub reports: Counter,
    pub assignments: Family<StrategyLabels, Counter>,
    pub tokens: Family<EventLabels, Counter>,
    pub refused: Family<ReasonLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: &'static str,
}

/// The families of global limits shared across regions (`regions/`).
#[derive(Clone, Debug)]
pub struct RegionMetrics {
    /// Exchanges with the global store, by result (ok, error).
    pub exchanges: Family<ResultLabels, Counter>,
    /// Seconds since the global store last answered this replica.
    pub contact_age: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// 1 while this replica is cut off from the global store.
    pub partitioned: Gauge,
    /// Global keys this replica tracks.
    pub keys: Gauge,
    /// This region's shares of the global keys it tracks, as a distribution (0 to 1).
    pub share: Histogram,
    /// Live replicas whose settings for sharing global limits differ from this one's.
    pub disagreements: Gauge,
}

/// Every metric tollgate exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    pub decisions: Family<DecisionLabels, Counter>,
    pub requests: Family<RequestLabels, Counter>,
    /// `requests`' series, made once ([`RequestCounts`]).
    pub request_counts: RequestCounts,
    pub request_duration: Histogram,
    pub global_shadow: Counter,
    /// Requests whose decision budget (the caller's deadline less `decision_margin_ms`) ran
    /// out: their unanswered ops were decided by the fallback, before the deadline.
    pub late_decisions: Family<StageLabels, Counter>,
    pub rules_reloads: Family<ResultLabels, Counter>,
    pub rules_loaded: Gauge,
    /// The admin port's counter API calls (`counter_api.rs`).
    pub counter_api: Family<CounterApiLabels, Counter>,
    pub store: StoreMetrics,
    /// Live replicas as the fallback counts them (membership, or the fixed count or floor).
    pub replicas: Gauge,
    /// 1 when `replicas` comes from the store's membership set, 0 when it is the fixed
    /// count or the floor (a replica that started while the store was down).
    pub replicas_from_membership: Gauge,
    pub hot: HotKeyMetrics,
    /// What hostile or overloading peers were refused, by what (see [`RefusedLabels`]).
    pub refused: Family<RefusedLabels, Counter>,
    /// Requests for domains no rules file declares, by the name they gave.
    pub unknown_domains: Family<DomainLabels, Counter>,
    /// The reference's per-rule counters for statsd (off unless `statsd_addr` is set).
    pub statsd: Statsd,
    pub rlqs: RlqsMetrics,
    pub regions: RegionMetrics,
}

/// Leasing, the over-limit cache and shard retries (`quota/lease/`, `limiter/overlimit.rs`,
/// `shard.rs`).
#[derive(Clone, Debug, Default)]
pub struct HotKeyMetrics {
    pub lease_claims: Family<ClassLabels, Counter>,
    pub lease_tokens: Family<LeaseTokenLabels, Counter>,
    pub local_decisions: Family<LocalLabels, Counter>,
    pub shard_retries: Family<ClassLabels, Counter>,
}

/// The store's families (the Redis store records them; the memory store never fails).
#[derive(Clone, Debug)]
pub struct StoreMetrics {
    /// Failed calls by kind (`StoreErrorKind` labels), plus `connect` for failed
    /// (re)connection attempts of the Redis keeper, so an outage shows while no request arrives.
    pub errors: Family<KindLabels, Counter>,
    pub call_duration: Family<OpLabels, Histogram, fn() -> Histogram>,
    /// `connected` and `total` connections of the pool.
    pub connections: Family<StateLabels, Gauge>,
    /// 1 while a node's circuit is open (its requests go to the fallback).
    pub fallback_active: Family<NodeLabels, Gauge>,
    pub breaker_transitions: Family<TransitionLabels, Counter>,
    /// Store calls whose `WAIT` (`store_wait_replicas`) came back short.
    pub wait_short: Counter,
    /// Requests on one node whose decision budget ran out while it had not answered them, by
    /// node: each is scored against the node's circuit breaker (`Breakers::missed`).
    pub deadline_misses: Family<NodeLabels, Counter>,
    /// Ops per batch call (decisions that queued for a busy node and went as one call).
    pub batch_ops: Histogram,
}

impl StoreMetrics {
    /// Records how long the store operation `op` that began at `started` took.
    pub fn observe(&self, op: &'static str, started: std::time::Instant) {
        self.call_duration
            .get_or_create(&OpLabels { op })
            .observe(started.elapsed().as_secs_f64());
    }
}

/// 50 µs … ~0.8 s: a store call should take well under a millisecond on a LAN.
fn store_call_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 15))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            DECISIONS,
            "Descriptor decisions by domain, rule class and outcome (ok, near_limit, over_limit, shadow, unlimited, no_rule, fallback_ok, fallback_over_limit)",
            decisions.clone(),
        );
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            REQUESTS,
            "ShouldRateLimit calls by overall result",
            requests.clone(),
        );
        // 50 µs … ~0.8 s: a decision should take well under Envoy's 20 ms timeout.
        let request_duration = Histogram::new(exponential_buckets(0.000_05, 2.0, 15));
        registry.register(
            REQUEST_DURATION,
            "Time to decide one ShouldRateLimit call, store round trip included",
            request_duration.clone(),
        );
        let late_decisions = Family::<StageLabels, Counter>::default();
        registry.register(
            LATE_DECISIONS,
            "Requests whose decision budget (the caller's grpc-timeout less decision_margin_ms) ran out, by stage (arrival: already past it when read, never sent to the store; store: the store had not answered): their unanswered ops were decided by the fallback, answered before the caller's deadline",
            late_decisions.clone(),
        );
        let global_shadow = Counter::default();
        registry.register(
            GLOBAL_SHADOW,
            "Requests that were over a limit but answered OK because of the global shadow mode",
            global_shadow.clone(),
        );
        let rules_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            RULES_RELOADS,
            "Rules reloads by result (ok, error)",
            rules_reloads.clone(),
        );
        let counter_api = Family::<CounterApiLabels, Counter>::default();
        registry.register(
            COUNTER_API_CALLS,
            "Counter API calls on the admin port, by action (read, reset) and result (ok, unauthorized, invalid, error)",
            counter_api.clone(),
        );
        let rules_loaded = Gauge::default();
        registry.register(
            RULES_LOADED,
            "Limits in the rules in force",
            rules_loaded.clone(),
        );
        let store_errors = Family::<KindLabels, Counter>::default();
        registry.register(
            STORE_ERRORS,
            "Store calls that failed, by kind",
            store_errors.clone(),
        );
        let call_duration = Family::<OpLabels, Histogram, fn() -> Histogram>::new_with_constructor(
            store_call_histogram,
        );
        registry.register(
            STORE_CALL_DURATION,
            "Time of one store call by operation (apply: one request's bucket ops; connect; ping)",
            call_duration.clone(),
        );
        let connections = Family::<StateLabels, Gauge>::default();
        registry.register(
            STORE_CONNECTIONS,
            "Store connections held (state=connected) out of the configured pool (state=total)",
            connections.clone(),
        );
        let fallback_active = Family::<NodeLabels, Gauge>::default();
        registry.register(
            FALLBACK_ACTIVE,
            "1 while the circuit of a store node is open and its requests are decided by the fallback",
            fallback_active.clone(),
        );
        let breaker_transitions = Family::<TransitionLabels, Counter>::default();
        registry.register(
            BREAKER_TRANSITIONS,
            "Circuit breaker transitions by node and new state (open, closed)",
            breaker_transitions.clone(),
        );
        let unknown_domains = Family::<DomainLabels, Counter>::default();
        registry.register(
            UNKNOWN_DOMAINS,
            "Requests for a domain no rules file declares, by the domain they named (the first 100 names, then (other)): often a case or spelling mismatch between Envoy's domain and the rules",
            unknown_domains.clone(),
        );
        let refused = Family::<RefusedLabels, Counter>::default();
        registry.register(
            REFUSED,
            "What peers were refused to keep the process bounded, by what (request_bytes: a gRPC stream failed with RESOURCE_EXHAUSTED past max_request_bytes_in_flight; connections: a gRPC connection closed past grpc_max_connections)",
            refused.clone(),
        );
        let deadline_misses = Family::<NodeLabels, Counter>::default();
        registry.register(
            STORE_DEADLINE_MISSES,
            "Requests on this store node alone whose decision budget (the caller's grpc-timeout less decision_margin_ms) ran out after the node had at least store_timeout_ms to answer; each is scored against the node's circuit breaker (misses in a row, or more than one decision in four, open it)",
            deadline_misses.clone(),
        );
        let wait_short = Counter::default();
        registry.register(
            STORE_WAIT_SHORT,
            "Store calls whose WAIT (store_wait_replicas) was acknowledged by fewer replicas within store_wait_timeout_ms: their writes could be lost in a failover",
            wait_short.clone(),
        );
        let batch_ops = Histogram::new(exponential_buckets(1.0, 2.0, 11));
        registry.register(
            STORE_BATCH_OPS,
            "Bucket ops per batched store call: decisions that arrived while store_batch_in_flight calls to their Redis node were in flight, sent together as one script call",
            batch_ops.clone(),
        );
        let replicas = Gauge::default();
        registry.register(
            REPLICAS,
            "Live tollgate replicas the local fallback divides each quota by",
            replicas.clone(),
        );
        let replicas_from_membership = Gauge::default();
        registry.register(
            REPLICAS_FROM_MEMBERSHIP,
            "1 when the replica count comes from the store's membership set, 0 when it is the fixed count or the floor",
            replicas_from_membership.clone(),
        );
        let hot = HotKeyMetrics::default();
        registry.register(
            LEASE_CLAIMS,
            "Lease claims sent to the store, by rule class",
            hot.lease_claims.clone(),
        );
        registry.register(
            LEASE_TOKENS,
            "Leased tokens by rule class and event (granted by a claim, returned at shutdown, expired unspent)",
            hot.lease_tokens.clone(),
        );
        registry.register(
            LOCAL_DECISIONS,
            "Descriptor decisions answered without a store call, by rule class and reason (lease, over_limit_cache)",
            hot.local_decisions.clone(),
        );
        registry.register(
            SHARD_RETRIES,
            "Requests of a sharded limit that found their shard empty and tried one other, by rule class",
            hot.shard_retries.clone(),
        );
        let rlqs = RlqsMetrics::default();
        registry.register(
            RLQS_STREAMS,
            "RLQS streams open (one per Envoy quota client)",
            rlqs.streams.clone(),
        );
        registry.register(
            RLQS_BUCKETS,
            "RLQS bucket ids held by the open streams",
            rlqs.buckets.clone(),
        );
        registry.register(
            RLQS_REPORTS,
            "RLQS usage reports received",
            rlqs.reports.clone(),
        );
        registry.register(
            RLQS_ASSIGNMENTS,
            "RLQS bucket actions sent, by strategy (token_bucket, allow_all, deny_all, abandon, expire)",
            rlqs.assignments.clone(),
        );
        registry.register(
            RLQS_TOKENS,
            "RLQS tokens by event (assigned: claimed for an Envoy; returned: unused at its next report; charged: admitted beyond its assignment)",
            rlqs.tokens.clone(),
        );
        registry.register(
            RLQS_REFUSED,
            "RLQS input refused, by reason (no_domain, domain_changed, unknown_domain, not_rlqs, empty_bucket_id, bucket_id_too_large, too_many_buckets, too_many_streams, idle_stream)",
            rlqs.refused.clone(),
        );
        let regions = RegionMetrics {
            exchanges: Family::default(),
            contact_age: Gauge::default(),
            partitioned: Gauge::default(),
            keys: Gauge::default(),
            share: Histogram::new([0.01, 0.05, 0.1, 0.2, 0.33, 0.5, 0.75, 1.0]),
            disagreements: Gauge::default(),
        };
        registry.register(
            REGION_EXCHANGES,
            "Exchanges of global-limit demand with the global store, by result (ok, error)",
            regions.exchanges.clone(),
        );
        registry.register(
            REGION_CONTACT_AGE,
            "Seconds since the global store last answered this replica's exchange",
            regions.contact_age.clone(),
        );
        registry.register(
            REGION_PARTITIONED,
            "1 while this replica is cut off from the global store (no heartbeat answered within region_lease_ms): its global limits step down to at most their partition share",
            regions.partitioned.clone(),
        );
        registry.register(
            REGION_KEYS,
            "Global-limit keys this replica tracks",
            regions.keys.clone(),
        );
        registry.register(
            REGION_SHARE,
            "This region's shares of the global keys it exchanged, one observation per key and exchange",
            regions.share.clone(),
        );
        registry.register(
            REGION_DISAGREEMENTS,
            "Live replicas (of any region) whose settings for sharing global limits (regions, weights, floor, lease, global limits) differ from this replica's: each region then holds the smallest share any of them gives",
            regions.disagreements.clone(),
        );
        Metrics {
            rlqs,
            regions,
            hot,
            registry: Mutex::new(registry),
            decisions,
            request_counts: RequestCounts::new(&requests),
            requests,
            request_duration,
            global_shadow,
            late_decisions,
            rules_reloads,
            counter_api,
            rules_loaded,
            store: StoreMetrics {
                errors: store_errors,
                call_duration,
                connections,
                fallback_active,
                breaker_transitions,
                wait_short,
                deadline_misses,
                batch_ops,
            },
            replicas,
            replicas_from_membership,
            refused,
            unknown_domains,
            statsd: Statsd::default(),
        }
    }

    /// The Prometheus text exposition of every family.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let r = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &r);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_decisions_with_their_labels() {
        let m = Metrics::new();
        m.decisions
            .get_or_create(&DecisionLabels {
                domain: "edge".into(),
                class: "tenant".into(),
                outcome: Outcome::over_limit,
            })
            .inc();
        let text = m.render();
        assert!(
            text.contains(
                r#"tollgate_decisions_total{domain="edge",class="tenant",outcome="over_limit"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains("tollgate_request_duration_seconds_bucket"),
            "{text}"
        );
    }

    #[test]
    fn each_request_result_has_its_series_from_the_start_and_counts_in_it() {
        let m = Metrics::new();
        for code in RequestCounts::CODES {
            assert!(
                m.render()
                    .contains(&format!("tollgate_requests_total{{code=\"{code}\"}} 0")),
                "{code}"
            );
        }
        for (n, code) in RequestCounts::CODES.iter().enumerate() {
            for _ in 0..=n {
                m.request_counts.of(code).inc();
            }
        }
        let text = m.render();
        for (n, code) in RequestCounts::CODES.iter().enumerate() {
            let line = format!("tollgate_requests_total{{code=\"{code}\"}} {}", n + 1);
            assert!(text.contains(&line), "{line} in {text}");
        }
    }
}
