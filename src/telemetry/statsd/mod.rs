//! statsd: envoyproxy/ratelimit's per-rule counters, under its names, for dashboards and
//! exporters built on them (Envoy Gateway's Prometheus telemetry is a statsd exporter fed by
//! its rate-limit Deployment). Off unless `statsd_addr` is set; Prometheus on `/metrics` is
//! served either way.
//!
//! Data flow: the limiter adds each decided limit's hits to [`Statsd`] (`limiter/status.rs`),
//! keyed by domain and the limit's reference path; [`run`] sends every counter's growth since
//! its last send each `statsd_flush_interval_ms` (the reference's `STATS_FLUSH_INTERVAL`), and
//! once more at shutdown, as statsd counter lines: over UDP in datagrams packed by cadence's
//! buffered sink, or over TCP (`tcp://host:port`), as the reference sends them. The names, as the reference makes them:
//! - `ratelimit.service.rate_limit.<domain>.<path>.{total_hits,within_limit,near_limit,over_limit,shadow_mode}`,
//!   where `<path>` is the rule's levels, `key` or `key_value` each (`tenant_acme.endpoint`),
//!   with a value from the request in place where the rule says `value_to_metric`, or every
//!   entry's `key_value` with `detailed_metric` (up to `detailed_metric_max_series` per limit);
//! - `ratelimit.service.rate_limit.<domain>.domain_not_found`;
//! - `ratelimit.service.config_load_success`, `config_load_error`, `global_shadow_mode`;
//! - `ratelimit.service.call.should_rate_limit.{redis_error,service_error}`;
//! - `ratelimit_server.ShouldRateLimit.total_requests` and its `response_time` timer ([`Timings`]).
//!
//! Counts are hits (the descriptor's `hits_addend`), as the reference counts them, not
//! decisions, split as it splits them ([`Split`]: a request that crosses the limit counts its
//! hits past the limit as `over_limit` and the rest of the near band as `near_limit` (a fixed
//! window's refused take says the count it found: `Outcome::found`); an
//! admitted one that crosses ⌊limit × near_limit_ratio⌋ counts only the part past it as
//! `near_limit`); names are sanitized as its `SanitizeStatName` does (`:`, `|` and an IPv4
//! address's dots become `_`), and the startup load counts as a `config_load_success`. Sending happens off the request path; counting on it costs one map read and
//! one atomic add per limit, and nothing while statsd is off.

mod send;

pub use send::{Target, run};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use super::{Metrics, ResultLabels};

/// Every name starts with this, as the reference's do.
const PREFIX: &str = "ratelimit.service";

/// How one limit's hits went, split as the reference splits them (`base_limiter.go`): the
/// counters besides `total_hits`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub within: u64,
    pub near: u64,
    pub over: u64,
    pub shadow: u64,
}

/// What a decided limit's counters are made from.
#[derive(Clone, Copy, Debug)]
pub struct Hits {
    /// The limit (its capacity) and ⌊limit × near_limit_ratio⌋.
    pub limit: u64,
    pub near_threshold: u64,
    /// The count before this request's hits (`limit − remaining` as the store reported it:
    /// for a refused hit that charged nothing, the count it found).
    pub before: u64,
    pub hits: u64,
}

impl Split {
    /// Admitted: every hit is within, and the part past the near threshold is near too.
    pub fn admitted(h: Hits) -> Split {
        let after = h.before.saturating_add(h.hits);
        let near = if after <= h.near_threshold {
            0
        } else if h.before >= h.near_threshold {
            h.hits
        } else {
            after - h.near_threshold
        };
        Split {
            within: h.hits,
            near,
            ..Split::default()
        }
    }

    /// Refused (`shadow`: over, but its limit is in shadow mode): the part past the limit is
    /// over and the part between the near threshold and the limit is near, when the count was
    /// below the limit; all of it is over when it already was at the limit.
    pub fn refused(h: Hits, shadow: bool) -> Split {
        let after = h.before.saturating_add(h.hits);
        let (over, near) = if h.before >= h.limit {
            (h.hits, 0)
        } else {
            (
                after.saturating_sub(h.limit),
                h.limit - h.near_threshold.max(h.before),
            )
        };
        Split {
            over,
            near,
            shadow: if shadow { h.hits } else { 0 },
            ..Split::default()
        }
    }

    /// Decided without the store's count (the fallback, the over-limit cache): whole.
    pub fn whole(hits: u64, admitted: bool) -> Split {
        if admitted {
            Split {
                within: hits,
                ..Split::default()
            }
        } else {
            Split {
                over: hits,
                ..Split::default()
            }
        }
    }
}

/// One limit's counters (since start; [`run`] sends the growth).
#[derive(Debug, Default)]
struct RuleCounters {
    total_hits: AtomicU64,
    within_limit: AtomicU64,
    near_limit: AtomicU64,
    over_limit: AtomicU64,
    shadow_mode: AtomicU64,
}

impl RuleCounters {
    fn values(&self) -> [(&'static str, u64); 5] {
        [
            ("total_hits", self.total_hits.load(Ordering::Relaxed)),
            ("within_limit", self.within_limit.load(Ordering::Relaxed)),
            ("near_limit", self.near_limit.load(Ordering::Relaxed)),
            ("over_limit", self.over_limit.load(Ordering::Relaxed)),
            ("shadow_mode", self.shadow_mode.load(Ordering::Relaxed)),
        ]
    }
}

/// A limit's counters by (domain, reference path).
type RuleMap = HashMap<(Arc<str>, Arc<[String]>), Arc<RuleCounters>>;

/// The counters statsd is sent; their names are bounded by the rules (and the detailed
/// series bound), never by raw traffic.
#[derive(Debug, Default)]
pub struct Statsd {
    enabled: AtomicBool,
    rules: RwLock<RuleMap>,
    /// `domain_not_found`, by the bounded unknown-domain label.
    unknown_domains: RwLock<HashMap<Arc<str>, Arc<AtomicU64>>>,
    /// The rules files loaded at startup: a `config_load_success` in the reference, which
    /// counts every load; `tollgate_rules_reloads_total` counts reloads only.
    loaded_at_start: AtomicU64,
    /// `ShouldRateLimit` calls, as the reference's gRPC server counts them, and how long they
    /// took (for the Prometheus port, `reference_metrics.rs`).
    pub calls: AtomicU64,
    /// Calls that failed because the store could not answer (`redis_error`) or the request was
    /// refused (`service_error`): the reference's `call.should_rate_limit.*`.
    redis_errors: AtomicU64,
    service_errors: AtomicU64,
    pub response_times: ResponseTimes,
    /// The response times of the calls since the last send, for the reference's statsd timer.
    timings: std::sync::Mutex<Timings>,
}

/// Response times kept for the next send (`ratelimit_server.ShouldRateLimit.response_time`):
/// the first [`TIMINGS_KEPT`] calls of each flush interval, and how many there were. The
/// reference sends a timer line per call; past the cap the kept ones go with the statsd
/// sample rate kept ÷ seen, so an exporter counts every call while a send stays bounded.
#[derive(Debug, Default)]
pub(crate) struct Timings {
    pub(crate) seen: u64,
    /// Milliseconds.
    pub(crate) kept: Vec<f64>,
}

/// At most this many timer lines a send.
pub const TIMINGS_KEPT: usize = 1_000;

/// How a failed `ShouldRateLimit` call counts in the reference's error counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallError {
    /// The store could not answer.
    Redis,
    /// The request was refused (an empty domain, a value past the bounds, …).
    Service,
}

/// Response times as the statsd exporter's histogram holds them: Prometheus's default buckets
/// over the time in milliseconds × `scale` (0.001 by default: seconds, as the reference's
/// default mapping scales them).
#[derive(Debug)]
pub struct ResponseTimes {
    /// `f64` bits of the scale.
    scale: AtomicU64,
    /// Observations per bucket (not cumulative), the last one past every bound.
    buckets: [AtomicU64; BUCKETS.len() + 1],
    sum_micros: AtomicU64,
}

/// Prometheus's default buckets (client_golang's `DefBuckets`), the statsd exporter's too.
pub const BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

impl Default for ResponseTimes {
    fn default() -> Self {
        ResponseTimes {
            scale: AtomicU64::new(0.001f64.to_bits()),
            buckets: Default::default(),
            sum_micros: AtomicU64::new(0),
        }
    }
}

impl ResponseTimes {
    pub fn set_scale(&self, scale: f64) {
        self.scale.store(scale.to_bits(), Ordering::Relaxed);
    }

    pub fn scale(&self) -> f64 {
        f64::from_bits(self.scale.load(Ordering::Relaxed))
    }

    fn observe(&self, elapsed: Duration) {
        let v = elapsed.as_secs_f64() * 1000.0 * self.scale();
        let i = BUCKETS
            .iter()
            .position(|b| v <= *b)
            .unwrap_or(BUCKETS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
    }

    /// Cumulative counts per bound (then `+Inf`), and the sum, scaled.
    pub fn histogram(&self) -> (Vec<u64>, f64) {
        let mut total = 0;
        let cumulative = self
            .buckets
            .iter()
            .map(|b| {
                total += b.load(Ordering::Relaxed);
                total
            })
            .collect();
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1000.0 * self.scale();
        (cumulative, sum)
    }
}

impl Statsd {
    /// Turns counting on (the app does, when `statsd_addr` is set).
    pub fn enable(&self) {
        self.enabled.store(true, Ordering::Relaxed);
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Adds `hits` of one limit at `path` in `domain`, split as `split` says.
    pub fn add(&self, domain: &Arc<str>, path: &Arc<[String]>, hits: u64, split: Split) {
        if !self.enabled() {
            return;
        }
        let key = (domain.clone(), path.clone());
        let found = read(&self.rules).get(&key).cloned();
        let c = match found {
            Some(c) => c,
            None => write(&self.rules).entry(key).or_default().clone(),
        };
        for (counter, n) in [
            (&c.total_hits, hits),
            (&c.within_limit, split.within),
            (&c.near_limit, split.near),
            (&c.over_limit, split.over),
            (&c.shadow_mode, split.shadow),
        ] {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// Counts one `ShouldRateLimit` call, its time and how it failed, if it did.
    pub fn call(&self, elapsed: Duration, error: Option<CallError>) {
        if !self.enabled() {
            return;
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.response_times.observe(elapsed);
        {
            let mut t = self.timings.lock().unwrap_or_else(|p| p.into_inner());
            t.seen += 1;
            if t.kept.len() < TIMINGS_KEPT {
                t.kept.push(elapsed.as_secs_f64() * 1000.0);
            }
        }
        match error {
            Some(CallError::Redis) => self.redis_errors.fetch_add(1, Ordering::Relaxed),
            Some(CallError::Service) => self.service_errors.fetch_add(1, Ordering::Relaxed),
            None => 0,
        };
    }

    /// Counts the startup load of the rules files as the reference does.
    pub fn loaded_at_start(&self) {
        self.loaded_at_start.store(1, Ordering::Relaxed);
    }

    /// Counts a request for a domain no rules declare (`domain` is already the bounded label).
    pub fn domain_not_found(&self, domain: &Arc<str>) {
        if !self.enabled() {
            return;
        }
        let found = read(&self.unknown_domains).get(domain).cloned();
        let c = match found {
            Some(c) => c,
            None => write(&self.unknown_domains)
                .entry(domain.clone())
                .or_default()
                .clone(),
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The response times kept since the last call (see [`Timings`]).
    pub(crate) fn take_timings(&self) -> Timings {
        std::mem::take(&mut *self.timings.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Every counter's name (after `ratelimit.service.`) and value since start.
    pub(crate) fn snapshot(&self, metrics: &Metrics) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for ((domain, path), c) in read(&self.rules).iter() {
            let path = path.join(".");
            for (name, v) in c.values() {
                out.push((format!("rate_limit.{domain}.{path}.{name}"), v));
            }
        }
        for (domain, c) in read(&self.unknown_domains).iter() {
            out.push((
                format!("rate_limit.{domain}.domain_not_found"),
                c.load(Ordering::Relaxed),
            ));
        }
        let reloads = |result| {
            metrics
                .rules_reloads
                .get_or_create(&ResultLabels { result })
                .get()
        };
        out.push((
            "config_load_success".to_string(),
            reloads("ok") + self.loaded_at_start.load(Ordering::Relaxed),
        ));
        out.push(("config_load_error".to_string(), reloads("error")));
        out.push((
            "global_shadow_mode".to_string(),
            metrics.global_shadow.get(),
        ));
        out.push((
            "call.should_rate_limit.redis_error".to_string(),
            self.redis_errors.load(Ordering::Relaxed),
        ));
        out.push((
            "call.should_rate_limit.service_error".to_string(),
            self.service_errors.load(Ordering::Relaxed),
        ));
        for (name, _) in &mut out {
            *name = sanitize(name);
        }
        out
    }
}

/// The reference's `SanitizeStatName`: `:` and `|` (they would end a statsd line's name)
/// become `_`, then so do the dots of anything shaped like an IPv4 address
/// (`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`, matched leftmost and greedy as Go's regexp does),
/// so `remote_address_10.0.0.1` stays one level.
fn sanitize(name: &str) -> String {
    let name = name.replace([':', '|'], "_");
    let b = name.as_bytes();
    let mut out = String::with_capacity(name.len());
    let mut i = 0;
    while i < b.len() {
        match ipv4_at(b, i, 0) {
            Some(end) => {
                out.push_str(&name[i..end].replace('.', "_"));
                i = end;
            }
            None => {
                // Ascii or not, copy one char.
                let c = name[i..].chars().next().unwrap_or('?');
                out.push(c);
                i += c.len_utf8();
            }
        }
    }
    out
}

/// The end of an IPv4-shaped match of groups `group..4` starting at `i`: 1 to 3 digits (the
/// longest first, backing off as a regexp does), joined by dots.
fn ipv4_at(b: &[u8], i: usize, group: usize) -> Option<usize> {
    let digits = b[i..]
        .iter()
        .take(3)
        .take_while(|c| c.is_ascii_digit())
        .count();
    (1..=digits).rev().find_map(|n| {
        let end = i + n;
        if group == 3 {
            return Some(end);
        }
        (b.get(end) == Some(&b'.') && end + 1 < b.len())
            .then(|| ipv4_at(b, end + 1, group + 1))
            .flatten()
    })
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    #[test]
    fn counts_nothing_until_enabled_then_hits_by_path_under_the_references_names() {
        let metrics = Metrics::new();
        let d: Arc<str> = "edge".into();
        let p: Arc<[String]> = vec!["tenant_acme".to_string(), "endpoint".to_string()].into();
        metrics.statsd.add(&d, &p, 1, Split::whole(1, true));
        assert!(
            metrics
                .statsd
                .snapshot(&metrics)
                .iter()
                .all(|(n, _)| !n.starts_with("rate_limit"))
        );
        metrics.statsd.enable();
        metrics.statsd.add(&d, &p, 2, Split::whole(2, true));
        let near = Split {
            within: 1,
            near: 1,
            ..Split::default()
        };
        metrics.statsd.add(&d, &p, 1, near);
        metrics.statsd.add(&d, &p, 3, Split::whole(3, false));
        let shadow = Split {
            over: 4,
            shadow: 4,
            ..Split::default()
        };
        metrics.statsd.add(&d, &p, 4, shadow);
        metrics.statsd.domain_not_found(&"a:b|c".into());
        let got: HashMap<String, u64> = metrics.statsd.snapshot(&metrics).into_iter().collect();
        let at = |n: &str| {
            got.get(&format!("rate_limit.edge.tenant_acme.endpoint.{n}"))
                .copied()
        };
        assert_eq!(at("total_hits"), Some(10));
        assert_eq!(at("within_limit"), Some(3));
        assert_eq!(at("near_limit"), Some(1));
        assert_eq!(at("over_limit"), Some(7));
        assert_eq!(at("shadow_mode"), Some(4));
        assert_eq!(got.get("rate_limit.a_b_c.domain_not_found"), Some(&1));
        assert_eq!(got.get("config_load_success"), Some(&0));
    }

    /// The reference's split (`base_limiter.go`), limit 10, near threshold 8.
    #[test]
    fn hits_split_as_the_reference_splits_them() {
        let h = |before, hits| Hits {
            limit: 10,
            near_threshold: 8,
            before,
            hits,
        };
        let split = |within, near, over, shadow| Split {
            within,
            near,
            over,
            shadow,
        };
        // Admitted below the threshold, crossing it, past it.
        assert_eq!(Split::admitted(h(0, 5)), split(5, 0, 0, 0));
        assert_eq!(Split::admitted(h(6, 3)), split(3, 1, 0, 0));
        assert_eq!(Split::admitted(h(8, 2)), split(2, 2, 0, 0));
        // Refused from below the limit: the part past it over, the near band's rest near.
        assert_eq!(Split::refused(h(7, 5), false), split(0, 2, 2, 0));
        assert_eq!(Split::refused(h(9, 3), false), split(0, 1, 2, 0));
        // Refused at the limit: all over; in shadow mode, shadow too.
        assert_eq!(Split::refused(h(10, 3), false), split(0, 0, 3, 0));
        assert_eq!(Split::refused(h(10, 3), true), split(0, 0, 3, 3));
    }

    /// `SanitizeStatName`: `:` and `|` end a statsd name, and an IPv4 address's dots would
    /// split it into levels.
    #[test]
    fn names_are_sanitized_as_the_reference_does() {
        assert_eq!(
            sanitize("rate_limit.edge.remote_address_10.0.0.1.total_hits"),
            "rate_limit.edge.remote_address_10_0_0_1.total_hits"
        );
        assert_eq!(sanitize("a:b|c.1.2.3"), "a_b_c.1.2.3");
        assert_eq!(sanitize("v_1234.1.1.1.5"), "v_1234_1_1_1.5");
        assert_eq!(
            sanitize("x_192.168.1.10.near_limit"),
            "x_192_168_1_10.near_limit"
        );
    }

    #[tokio::test]
    async fn run_sends_the_growth_as_statsd_counter_lines_and_flushes_at_stop() {
        let listener = UdpSocket::bind("127.0.0.1:0").unwrap();
        listener
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let addr = Target::Udp(listener.local_addr().unwrap().to_string());
        let metrics = Arc::new(Metrics::new());
        metrics.statsd.enable();
        let d: Arc<str> = "edge".into();
        let p: Arc<[String]> = vec!["tenant".to_string()].into();
        metrics.statsd.add(&d, &p, 5, Split::whole(5, true));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(run(
            metrics.clone(),
            addr,
            Duration::from_secs(3600),
            async {
                let _ = stop_rx.await;
            },
        ));
        stop_tx.send(()).unwrap();
        task.await.unwrap();
        let mut buf = [0u8; 2048];
        let n = listener.recv(&mut buf).unwrap();
        let lines = String::from_utf8_lossy(&buf[..n]).to_string();
        assert!(
            lines.contains("ratelimit.service.rate_limit.edge.tenant.total_hits:5|c"),
            "{lines}"
        );
        assert!(
            lines.contains("ratelimit.service.rate_limit.edge.tenant.within_limit:5|c"),
            "{lines}"
        );
        // Counters that did not grow are not sent.
        assert!(!lines.contains("over_limit"), "{lines}");
    }

    #[tokio::test]
    async fn over_tcp_the_lines_arrive_on_one_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let target = Target::parse(&format!("tcp://{}", listener.local_addr().unwrap()));
        let metrics = Arc::new(Metrics::new());
        metrics.statsd.enable();
        let d: Arc<str> = "edge".into();
        let p: Arc<[String]> = vec!["tenant_a".to_string()].into();
        metrics.statsd.add(&d, &p, 2, Split::whole(2, false));
        let reader = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut text = String::new();
            std::io::Read::read_to_string(&mut conn, &mut text).unwrap();
            text
        });
        run(metrics, target, Duration::from_secs(3600), async {}).await;
        let text = reader.join().unwrap();
        assert!(
            text.lines()
                .any(|l| l == "ratelimit.service.rate_limit.edge.tenant_a.over_limit:2|c"),
            "{text}"
        );
        assert_eq!(Target::parse("h:1"), Target::Udp("h:1".into()));
        assert_eq!(Target::parse("udp://h:1"), Target::Udp("h:1".into()));
    }
}
