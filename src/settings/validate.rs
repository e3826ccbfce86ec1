//! What serde cannot check: ranges, combinations of settings, the store URL's form (with the
//! URL it probably means when it is given in another tool's form).
//!
//! Data flows one way: the layered [`Settings`] → [`Settings::validate`], which runs one
//! check per topic (store, TLS, timeouts, counts, limits, leases, RLQS, telemetry,
//! listeners) in a fixed order → the settings, or the first check's error.

use std::net::SocketAddr;

use super::{Settings, SettingsError};
use crate::redact::redact_url;

impl Settings {
    /// Checks what serde cannot: ranges, the store URL's scheme, the key prefix. The checks
    /// run by topic in a fixed order, and the first that fails is the error.
    pub fn validate(self) -> Result<Settings, SettingsError> {
        self.check_store_url()?;
        self.check_store_options()?;
        self.check_tls_pairs()?;
        self.check_grpc_timeouts()?;
        self.check_store_wait_and_keys()?;
        self.check_at_least_one()?;
        self.check_limits()?;
        self.check_leases()?;
        self.check_rlqs()?;
        self.check_regions()?;
        self.check_telemetry()?;
        self.check_listeners()?;
        Ok(self)
    }

    /// The store URL's scheme, and no credentials in a unix socket URL's query.
    fn check_store_url(&self) -> Result<(), SettingsError> {
        if self.store != "memory"
            && !NETWORK_SCHEMES
                .iter()
                .chain(&["redis+unix://", "unix://"])
                .any(|s| self.store.starts_with(s))
        {
            return bad("store", &store_hint(&self.store));
        }
        let unix = self.store.starts_with("redis+unix://") || self.store.starts_with("unix://");
        if unix {
            let query = self.store.split_once('?').map_or("", |(_, q)| q);
            if query
                .split('&')
                .any(|kv| kv.starts_with("pass=") || kv.starts_with("user="))
            {
                // Not echoed: the query would show the password.
                return bad(
                    "store",
                    "a redis+unix:// URL takes no user= or pass= (logs and /config would show them): set store_username and store_password or store_password_file",
                );
            }
        }
        Ok(())
    }

    /// The store's TLS files need a TLS URL, its credentials are given in one place, and the
    /// Sentinel credentials need a Sentinel URL.
    fn check_store_options(&self) -> Result<(), SettingsError> {
        let tls_url = self.store.starts_with("rediss");
        for (key, value) in [
            ("store_tls_ca", &self.store_tls_ca),
            ("store_tls_cert", &self.store_tls_cert),
            ("store_tls_key", &self.store_tls_key),
            ("store_tls_server_name", &self.store_tls_server_name),
        ] {
            if !value.is_empty() && !tls_url {
                return bad(
                    key,
                    "is set, but the store is not a TLS URL (rediss://…, rediss+cluster://… or rediss+sentinel://…)",
                );
            }
        }
        if !self.store_password.is_empty() && !self.store_password_file.is_empty() {
            return bad(
                "store_password",
                "give store_password or store_password_file, not both",
            );
        }
        let (url_user, url_password) = url_credentials(&self.store);
        if url_user && !self.store_username.is_empty() {
            return bad(
                "store_username",
                "the store URL names a user too: give the credentials in one place",
            );
        }
        if url_password && (!self.store_password.is_empty() || !self.store_password_file.is_empty())
        {
            return bad(
                "store_password",
                "the store URL has a password too: give the credentials in one place",
            );
        }
        let sentinel = self.store.starts_with("redis+sentinel://")
            || self.store.starts_with("rediss+sentinel://");
        for (key, value) in [
            ("store_sentinel_username", &self.store_sentinel_username),
            ("store_sentinel_password", &self.store_sentinel_password),
        ] {
            if !value.is_empty() && !sentinel {
                return bad(
                    key,
                    "is set, but the store is not a redis+sentinel:// (or rediss+sentinel://) URL",
                );
            }
        }
        Ok(())
    }

    /// TLS on the gRPC listener and to the store: certificates and keys go in pairs, a client
    /// CA needs TLS, and the store's expected name fits one Redis only.
    fn check_tls_pairs(&self) -> Result<(), SettingsError> {
        if self.grpc_tls_cert.is_empty() != self.grpc_tls_key.is_empty() {
            return bad(
                "grpc_tls_cert",
                "grpc_tls_cert and grpc_tls_key go together",
            );
        }
        if !self.grpc_tls_client_ca.is_empty() && self.grpc_tls_cert.is_empty() {
            return bad(
                "grpc_tls_client_ca",
                "mutual TLS needs TLS: set grpc_tls_cert and grpc_tls_key too",
            );
        }
        if !self.store_tls_server_name.is_empty() && !self.store.starts_with("rediss://") {
            // Cluster nodes and a Sentinel's primary are reached at the addresses they
            // announce, each checked against its own name: one override would not fit them.
            return bad(
                "store_tls_server_name",
                "applies to one Redis (rediss://) only: a cluster's nodes and a Sentinel's primary are checked against the names they are reached by",
            );
        }
        if self.store_tls_cert.is_empty() != self.store_tls_key.is_empty() {
            return bad(
                "store_tls_cert",
                "store_tls_cert and store_tls_key go together (mutual TLS needs both)",
            );
        }
        Ok(())
    }

    /// gRPC's keepalive and request timeout, the latter above the store's; the decision margin
    /// within reason.
    fn check_grpc_timeouts(&self) -> Result<(), SettingsError> {
        if self.grpc_keepalive_interval_ms > 0 && self.grpc_keepalive_timeout_ms == 0 {
            return bad(
                "grpc_keepalive_timeout_ms",
                "must be at least 1 while grpc_keepalive_interval_ms is on (0 turns the PINGs off)",
            );
        }
        if self.decision_margin_ms > 1_000 {
            return bad(
                "decision_margin_ms",
                "must be at most 1000: it is kept back from every caller's deadline (Envoy's 20 ms by default), so a margin larger than the deadline would send every decision to the fallback",
            );
        }
        if self.grpc_request_timeout_ms > 0 && self.grpc_request_timeout_ms <= self.store_timeout_ms
        {
            return bad(
                "grpc_request_timeout_ms",
                &format!(
                    "must be above store_timeout_ms ({} ms), or every request that waits for the store could be cancelled first (0: no timeout)",
                    self.store_timeout_ms
                ),
            );
        }
        Ok(())
    }

    /// WAIT for replicas needs Redis and a timeout below the store's; the key prefix must
    /// leave the Redis Cluster hash tag alone.
    fn check_store_wait_and_keys(&self) -> Result<(), SettingsError> {
        if self.store_wait_replicas > 0 {
            if self.store == "memory" {
                return bad(
                    "store_wait_replicas",
                    "WAIT is for Redis replicas: the memory store has none (set it to 0)",
                );
            }
            if self.store_wait_timeout_ms == 0
                || self.store_wait_timeout_ms >= self.store_timeout_ms
            {
                return bad(
                    "store_wait_timeout_ms",
                    &format!(
                        "must be at least 1 and below store_timeout_ms ({} ms): a WAIT blocks its connection, and 0 would block it for ever",
                        self.store_timeout_ms
                    ),
                );
            }
        }
        for (name, value) in [
            ("store_batch_in_flight", self.store_batch_in_flight),
            ("store_batch_max_ops", self.store_batch_max_ops),
        ] {
            if !(1..=1_024).contains(&value) {
                return bad(name, "must be between 1 and 1,024");
            }
        }
        if self.key_prefix.contains(['{', '}']) {
            return bad(
                "key_prefix",
                "must not contain `{` or `}` (they would move the Redis Cluster hash tag)",
            );
        }
        Ok(())
    }

    /// The sizes, counts and intervals for which 0 means nothing sensible.
    fn check_at_least_one(&self) -> Result<(), SettingsError> {
        for (key, v) in [
            ("store_pool_size", self.store_pool_size as u64),
            ("store_connect_timeout_ms", self.store_connect_timeout_ms),
            ("store_timeout_ms", self.store_timeout_ms),
            ("max_descriptors", self.max_descriptors as u64),
            ("max_entries", self.max_entries as u64),
            ("max_key_bytes", self.max_key_bytes as u64),
            ("max_value_bytes", self.max_value_bytes as u64),
            ("max_message_bytes", self.max_message_bytes as u64),
            (
                "max_request_bytes_in_flight",
                self.max_request_bytes_in_flight as u64,
            ),
            ("grpc_max_connections", self.grpc_max_connections as u64),
            ("admin_max_connections", self.admin_max_connections as u64),
            ("admin_header_timeout_ms", self.admin_header_timeout_ms),
            ("grpc_handshake_timeout_ms", self.grpc_handshake_timeout_ms),
            (
                "max_concurrent_requests",
                self.max_concurrent_requests as u64,
            ),
            (
                "grpc_max_concurrent_streams",
                u64::from(self.grpc_max_concurrent_streams),
            ),
            ("breaker_failures", u64::from(self.breaker_failures)),
            ("breaker_probe_ms", self.breaker_probe_ms),
            ("membership_interval_ms", self.membership_interval_ms),
            ("fallback_min_replicas", self.fallback_min_replicas),
            ("lease_ttl_ms", self.lease_ttl_ms),
            ("lease_max_keys", self.lease_max_keys as u64),
            ("rlqs_report_interval_ms", self.rlqs_report_interval_ms),
            ("rlqs_max_streams", self.rlqs_max_streams as u64),
            (
                "rlqs_max_streams_per_peer",
                self.rlqs_max_streams_per_peer as u64,
            ),
            ("rlqs_max_state_bytes", self.rlqs_max_state_bytes),
            (
                "rlqs_max_buckets_per_stream",
                self.rlqs_max_buckets_per_stream as u64,
            ),
            ("rlqs_idle_ms", self.rlqs_idle_ms),
        ] {
            if v == 0 {
                return bad(key, "must be at least 1");
            }
        }
        Ok(())
    }

    /// The near-limit ratio, and the ceiling on requests served at once.
    fn check_limits(&self) -> Result<(), SettingsError> {
        // NaN fails both comparisons, so it is refused too.
        if !(self.near_limit_ratio > 0.0 && self.near_limit_ratio <= 1.0) {
            return bad(
                "near_limit_ratio",
                "must be more than 0 and at most 1 (1 turns near_limit off)",
            );
        }
        if self.max_concurrent_requests > 1_000_000 {
            return bad("max_concurrent_requests", "must be at most 1000000");
        }
        Ok(())
    }

    /// Hot keys' leases: a batch and a lifetime with an upper bound.
    fn check_leases(&self) -> Result<(), SettingsError> {
        if self.lease_max_batch > 1_000_000 {
            return bad("lease_max_batch", "must be at most 1000000");
        }
        if self.lease_ttl_ms > 3_600_000 {
            return bad("lease_ttl_ms", "must be at most 3600000 (an hour)");
        }
        Ok(())
    }

    /// RLQS: the report interval, and assignments that outlive it.
    fn check_rlqs(&self) -> Result<(), SettingsError> {
        if self.rlqs_report_interval_ms > 3_600_000 {
            return bad(
                "rlqs_report_interval_ms",
                "must be at most 3600000 (an hour)",
            );
        }
        // Envoy reads an assignment's TTL in whole seconds, and one that ends before the next
        // report would send every Envoy to its expired_assignment_behavior between reports.
        if self.rlqs_assignment_ttl_ms < 1_000
            || self.rlqs_assignment_ttl_ms <= self.rlqs_report_interval_ms
            || self.rlqs_assignment_ttl_ms > 86_400_000
        {
            return bad(
                "rlqs_assignment_ttl_ms",
                "must be at least 1000, above rlqs_report_interval_ms (an assignment must outlive the interval to the next report), and at most 86400000",
            );
        }
        Ok(())
    }

    /// With `global_store`: a Redis URL, this region among `regions` (names without `|` or
    /// spaces, each once), and exchange, lease and floor in range.
    fn check_regions(&self) -> Result<(), SettingsError> {
        if self.global_store.is_empty() {
            return Ok(());
        }
        if !NETWORK_SCHEMES
            .iter()
            .any(|s| self.global_store.starts_with(s))
        {
            return bad(
                "global_store",
                "expected redis://, rediss://, redis+cluster:// or redis+sentinel:// (the global store is a Redis every region reaches)",
            );
        }
        let names = self.region_names();
        if names.is_empty() {
            return bad(
                "regions",
                "set every region sharing the global limits, comma-separated, when global_store is set",
            );
        }
        for (i, name) in names.iter().enumerate() {
            if name.is_empty()
                || name.len() > 64
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                return bad(
                    "regions",
                    "region names are 1 to 64 letters, digits, '-', '_' or '.'",
                );
            }
            if names[..i].contains(name) {
                return bad("regions", "a region is named twice");
            }
        }
        for (_, weight) in self.region_entries() {
            let fine = weight.is_none_or(|w| {
                w.parse::<f64>()
                    .is_ok_and(|w| w.is_finite() && (0.001..=1000.0).contains(&w))
            });
            if !fine {
                return bad(
                    "regions",
                    "a region's weight (name=weight) is a number from 0.001 to 1000",
                );
            }
        }
        let weights = self.region_weights();
        let total: f64 = weights.iter().sum();
        if weights.iter().any(|w| w / total < 0.001) {
            return bad(
                "regions",
                "every region's weight must be at least a thousandth of their sum (its partition share of a global limit)",
            );
        }
        if !names.contains(&self.region.as_str()) {
            return bad(
                "region",
                "must be one of `regions` when global_store is set (this region's name)",
            );
        }
        if !(100..=60_000).contains(&self.region_exchange_ms) {
            return bad("region_exchange_ms", "must be 100 to 60000");
        }
        if self.region_lease_ms < 3 * self.region_exchange_ms || self.region_lease_ms > 3_600_000 {
            return bad(
                "region_lease_ms",
                "must be at least 3 × region_exchange_ms (a share outlives a late exchange) and at most 3600000",
            );
        }
        if !(0.0..=1.0).contains(&self.region_floor) {
            return bad("region_floor", "must be 0 to 1");
        }
        Ok(())
    }

    /// `regions`' names, split at commas, each trimmed, without its weight (`name=weight`);
    /// empty parts dropped.
    pub fn region_names(&self) -> Vec<&str> {
        self.region_entries().map(|(name, _)| name).collect()
    }

    /// `regions`' weights, in the order of [`Settings::region_names`]: 1 where none is given
    /// (a malformed one, which validation refuses, counts as 1 too).
    pub fn region_weights(&self) -> Vec<f64> {
        self.region_entries()
            .map(|(_, w)| w.and_then(|w| w.parse().ok()).unwrap_or(1.0))
            .collect()
    }

    /// Each `regions` entry: its name and its weight's text, if it gives one.
    fn region_entries(&self) -> impl Iterator<Item = (&str, Option<&str>)> {
        self.regions
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|entry| match entry.split_once('=') {
                Some((name, weight)) => (name.trim(), Some(weight.trim())),
                None => (entry, None),
            })
    }

    /// Traces, statsd and the reference's Prometheus port: addresses of the forms they take.
    fn check_telemetry(&self) -> Result<(), SettingsError> {
        let otlp = &self.otlp_endpoint;
        if !otlp.is_empty() && !otlp.starts_with("http://") {
            return bad(
                "otlp_endpoint",
                "expected http://host:port (OTLP over gRPC; TLS is not built in), or empty for off",
            );
        }
        if !self.statsd_addr.is_empty() && !is_host_port(&self.statsd_addr) {
            return bad(
                "statsd_addr",
                "expected host:port or udp://host:port (UDP), or tcp://host:port (TCP, as the reference sends), with a port from 1 to 65535; or empty for off",
            );
        }
        if self.statsd_flush_interval_ms == 0 || self.statsd_flush_interval_ms > 3_600_000 {
            return bad(
                "statsd_flush_interval_ms",
                "must be from 1 to 3600000 (an hour)",
            );
        }
        if !self.prometheus_addr.is_empty() && self.prometheus_addr.parse::<SocketAddr>().is_err() {
            return bad(
                "prometheus_addr",
                "expected ip:port, e.g. 0.0.0.0:19001, or empty for off",
            );
        }
        if !self.prometheus_path.starts_with('/') {
            return bad("prometheus_path", "must start with /, e.g. /metrics");
        }
        Ok(())
    }

    /// The admin and gRPC listeners are two ports (port 0 picks a free one for each).
    fn check_listeners(&self) -> Result<(), SettingsError> {
        if self.grpc_addr == self.admin_addr && self.grpc_addr.port() != 0 {
            return bad("admin_addr", "must differ from grpc_addr");
        }
        Ok(())
    }
}

/// The error for `key`, with why.
/// The Redis URL schemes over the network (the store also takes a unix socket's).
const NETWORK_SCHEMES: [&str; 6] = [
    "redis://",
    "rediss://",
    "redis+cluster://",
    "rediss+cluster://",
    "redis+sentinel://",
    "rediss+sentinel://",
];

fn bad(key: &'static str, message: &str) -> Result<(), SettingsError> {
    Err(SettingsError::Invalid {
        key,
        message: message.to_string(),
    })
}

/// Whether `addr` is `[udp://|tcp://]host:port` (`[v6]:port` too) with a host and a port
/// from 1 to 65535.
fn is_host_port(addr: &str) -> bool {
    let addr = addr
        .strip_prefix("udp://")
        .or_else(|| addr.strip_prefix("tcp://"))
        .unwrap_or(addr);
    addr.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok_and(|p| p > 0)
    })
}

/// Whether a store URL names a user and a password (`scheme://user:pass@host…`).
fn url_credentials(url: &str) -> (bool, bool) {
    let Some((_, rest)) = url.split_once("://") else {
        return (false, false);
    };
    let Some((auth, _)) = rest.rsplit_once('@') else {
        return (false, false);
    };
    match auth.split_once(':') {
        Some((user, pass)) => (!user.is_empty(), !pass.is_empty()),
        None => (!auth.is_empty(), false),
    }
}

/// Why `store` is refused, with what was given (its password redacted) and, for the forms
/// other tools take (`host:port`, the reference's `REDIS_URL`; a comma list of cluster nodes),
/// the URL it probably means.
fn store_hint(store: &str) -> String {
    let shown = if store.contains("://") {
        redact_url(store)
    } else {
        // No scheme: redacted as if it had one, so `user:pass@host` shows no password.
        redact_url(&format!("redis://{store}"))
            .trim_start_matches("redis://")
            .to_string()
    };
    let expected = "expected `memory`, redis://…, redis+cluster://…, redis+sentinel://…, one of them over TLS (rediss://…, rediss+cluster://…, rediss+sentinel://…), or redis+unix:///path/to/redis.sock";
    let guess = if store.contains("://") || store.is_empty() {
        None
    } else if store.contains(',') {
        Some(format!("redis+cluster://{shown}"))
    } else {
        Some(format!("redis://{shown}"))
    };
    match guess {
        Some(url) => format!("'{shown}': {expected}; did you mean {url}?"),
        None => format!("'{shown}': {expected}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Sources;

    #[test]
    fn bad_values_name_their_key() {
        let load = |k: &'static str, v: &str| {
            Settings::load(&Sources {
                flags: vec![(k, v.to_string())],
                ..Sources::default()
            })
            .unwrap_err()
            .to_string()
        };
        assert!(load("store_timeout_ms", "0").contains("store_timeout_ms: must be at least 1"));
        // An RLQS assignment must outlive the interval to the next report, in whole seconds.
        for ttl in ["500", "5000"] {
            assert!(
                load("rlqs_assignment_ttl_ms", ttl).contains(
                    "rlqs_assignment_ttl_ms: must be at least 1000, above rlqs_report_interval_ms"
                ),
                "{ttl}"
            );
        }
        assert!(load("rlqs_max_buckets_per_stream", "0").contains("must be at least 1"));
        assert!(load("rlqs_report_interval_ms", "3600001").contains("at most 3600000"));
        for addr in ["localhost", "localhost:0", "http://h:8125", ":8125", "h:x"] {
            assert!(
                load("statsd_addr", addr).contains("statsd_addr: expected host:port"),
                "{addr}"
            );
        }
        for addr in [
            "localhost:8125",
            "udp://[::1]:8125",
            "tcp://statsd.infra:9125",
        ] {
            assert!(
                Settings::load(&Sources {
                    flags: vec![("statsd_addr", addr.to_string())],
                    ..Sources::default()
                })
                .is_ok(),
                "{addr}"
            );
        }
        assert!(
            load("statsd_flush_interval_ms", "0").contains("statsd_flush_interval_ms: must be")
        );
        assert!(load("store", "memcached://x").contains("store: 'memcached://x': expected"));
        // The reference's REDIS_URL form, and a node list: what was given, and the likely URL.
        assert!(
            load("store", "127.0.0.1:6379").contains("'127.0.0.1:6379'")
                && load("store", "127.0.0.1:6379").contains("did you mean redis://127.0.0.1:6379?")
        );
        assert!(load("store", "a:1,b:2").contains("did you mean redis+cluster://a:1,b:2?"));
        assert!(
            !load("store", "u:secret@h:1").contains("secret"),
            "the password is not echoed"
        );
        assert!(load("key_prefix", "a{b").contains("key_prefix"));
        assert!(
            load("grpc_addr", "not-an-address").contains("grpc_addr"),
            "{}",
            load("grpc_addr", "x")
        );
        assert!(load("default_algorithm", "leaky").contains("default_algorithm"));
        assert!(load("otlp_endpoint", "collector:4317").contains("otlp_endpoint"));
        assert!(load("log_format", "xml").contains("log_format"));
        // An enum setting's unknown value says what it accepts, not the Rust type's name.
        for (key, value, expected) in [
            ("store_state_format", "gcra", "packed or hash"),
            ("fallback", "lcoal", "local, open, closed or error"),
            ("log_format", "xml", "text or json"),
            (
                "default_algorithm",
                "leaky_bucket",
                "token_bucket, fixed_window",
            ),
        ] {
            let msg = load(key, value);
            assert!(
                msg.contains(&format!(
                    "{key}: unknown value '{value}' (expected {expected}"
                )),
                "{msg}"
            );
            assert!(!msg.contains("variant constructor"), "{msg}");
        }
        assert!(
            load("max_concurrent_requests", "0")
                .contains("max_concurrent_requests: must be at least 1")
        );
        assert!(
            load("max_concurrent_requests", "1000001")
                .contains("max_concurrent_requests: must be at most 1000000")
        );
        assert!(
            load("grpc_max_concurrent_streams", "0")
                .contains("grpc_max_concurrent_streams: must be at least 1")
        );
        assert!(load("admin_json", "perhaps").contains("admin_json"));
    }

    #[test]
    fn tls_and_sentinel_settings_need_a_url_that_uses_them() {
        let with = |store: &str, key: &'static str| {
            Settings::load(&Sources {
                flags: vec![("store", store.to_string()), (key, "x".to_string())],
                ..Sources::default()
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
        };
        assert!(with("rediss+sentinel://s:26379/m", "store_tls_ca").is_ok());
        assert!(with("rediss+sentinel://s:26379/m", "store_sentinel_password").is_ok());
        assert!(with("redis+sentinel://s:26379/m", "store_sentinel_username").is_ok());
        let e = with("redis+sentinel://s:26379/m", "store_tls_ca").unwrap_err();
        assert!(
            e.contains("store_tls_ca") && e.contains("not a TLS URL"),
            "{e}"
        );
        let e = with("rediss://r:6380", "store_sentinel_password").unwrap_err();
        assert!(e.contains("store_sentinel_password"), "{e}");
        // The expected certificate name: one Redis over TLS only.
        assert!(with("rediss://10.0.0.7:6380", "store_tls_server_name").is_ok());
        for store in [
            "redis://r:6379",
            "rediss+cluster://a:1,b:2",
            "rediss+sentinel://s:1/m",
        ] {
            let e = with(store, "store_tls_server_name").unwrap_err();
            assert!(e.contains("store_tls_server_name"), "{store}: {e}");
        }
        // A unix socket: no TLS, and no credentials in the URL's query (logs would show them).
        assert!(with("redis+unix:///run/redis.sock?db=2", "store_password").is_ok());
        let e = with("redis+unix:///run/redis.sock", "store_tls_ca").unwrap_err();
        assert!(e.contains("not a TLS URL"), "{e}");
        let e = with(
            "redis+unix:///run/redis.sock?db=1&pass=s3cret",
            "store_username",
        )
        .unwrap_err();
        assert!(
            e.contains("store_password_file") && !e.contains("s3cret"),
            "{e}"
        );
    }

    #[test]
    fn a_global_store_needs_this_region_among_the_regions_and_sane_intervals() {
        let with = |extra: &[(&'static str, &str)]| {
            let mut flags = vec![
                ("global_store", "rediss://:pw@global:6380".to_string()),
                ("region", "eu".to_string()),
                ("regions", "us, eu,ap".to_string()),
            ];
            for &(k, v) in extra {
                flags.retain(|(key, _)| *key != k);
                flags.push((k, v.to_string()));
            }
            Settings::load(&Sources {
                flags,
                ..Sources::default()
            })
            .map_err(|e| e.to_string())
        };
        let s = with(&[]).unwrap();
        assert_eq!(s.region_names(), ["us", "eu", "ap"]);
        assert_eq!(s.region_weights(), [1.0; 3]);
        assert!(!s.redacted().global_store.contains("pw"));
        // Weights, optional per region.
        let s = with(&[("regions", "us=4, eu,ap=0.5")]).unwrap();
        assert_eq!(s.region_names(), ["us", "eu", "ap"]);
        assert_eq!(s.region_weights(), [4.0, 1.0, 0.5]);
        // Off: nothing else is looked at.
        assert!(with(&[("global_store", ""), ("region", "nowhere")]).is_ok());
        for (extra, key) in [
            (vec![("global_store", "memory")], "global_store"),
            (vec![("regions", "")], "regions"),
            (vec![("regions", "us,eu,eu")], "regions"),
            (vec![("regions", "us|x,eu")], "regions"),
            (vec![("regions", "us=0,eu")], "weight"),
            (vec![("regions", "us=lots,eu")], "weight"),
            (vec![("regions", "us=NaN,eu")], "weight"),
            (vec![("regions", "us=0.001,eu=1000")], "thousandth"),
            (vec![("regions", "=2,eu"), ("region", "eu")], "regions"),
            (vec![("region", "mars")], "region"),
            (vec![("region_exchange_ms", "50")], "region_exchange_ms"),
            (vec![("region_lease_ms", "2000")], "region_lease_ms"),
            (vec![("region_floor", "1.5")], "region_floor"),
        ] {
            let e = with(&extra).unwrap_err();
            assert!(e.contains(key), "{extra:?}: {e}");
        }
    }

    #[test]
    fn wait_needs_redis_and_a_timeout_below_the_store_timeout() {
        let with = |store: &str, replicas: &str, timeout: &str| {
            Settings::load(&Sources {
                flags: vec![
                    ("store", store.to_string()),
                    ("store_wait_replicas", replicas.to_string()),
                    ("store_wait_timeout_ms", timeout.to_string()),
                ],
                ..Sources::default()
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
        };
        assert!(with("redis://r:6379", "1", "5").is_ok());
        // Off: the timeout is not looked at.
        assert!(with("memory", "0", "0").is_ok());
        let e = with("memory", "1", "5").unwrap_err();
        assert!(
            e.contains("store_wait_replicas") && e.contains("memory"),
            "{e}"
        );
        for timeout in ["0", "10", "50"] {
            let e = with("redis://r:6379", "1", timeout).unwrap_err();
            assert!(
                e.contains("store_wait_timeout_ms") && e.contains("below store_timeout_ms (10 ms)"),
                "{timeout}: {e}"
            );
        }
    }

    #[test]
    fn the_request_timeout_is_off_or_above_the_store_timeout() {
        let with = |timeout: &str| {
            Settings::load(&Sources {
                flags: vec![("grpc_request_timeout_ms", timeout.to_string())],
                ..Sources::default()
            })
            .map(|_| ())
            .map_err(|e| e.to_string())
        };
        assert!(with("0").is_ok());
        assert!(with("11").is_ok());
        for timeout in ["1", "10"] {
            let e = with(timeout).unwrap_err();
            assert!(
                e.contains("grpc_request_timeout_ms")
                    && e.contains("above store_timeout_ms (10 ms)"),
                "{timeout}: {e}"
            );
        }
    }

    #[test]
    fn the_decision_margin_has_a_default_and_a_ceiling() {
        let with = |margin: Option<&str>| {
            let flags = margin
                .map(|m| vec![("decision_margin_ms", m.to_string())])
                .unwrap_or_default();
            Settings::load(&Sources {
                flags,
                ..Sources::default()
            })
            .map(|s| s.decision_margin_ms)
            .map_err(|e| e.to_string())
        };
        assert_eq!(with(None), Ok(5));
        assert_eq!(with(Some("0")), Ok(0));
        assert_eq!(with(Some("1000")), Ok(1_000));
        let e = with(Some("1001")).unwrap_err();
        assert!(
            e.contains("decision_margin_ms") && e.contains("at most 1000"),
            "{e}"
        );
    }

    #[test]
    fn credentials_in_one_place_only() {
        let with = |store: &str, user: &str, pw: &str, file: &str| Settings {
            store: store.into(),
            store_username: user.into(),
            store_password: pw.into(),
            store_password_file: file.into(),
            ..Settings::default()
        };
        assert!(with("redis://h:1", "u", "p", "").validate().is_ok());
        assert!(with("redis://u:p@h:1", "", "", "").validate().is_ok());
        assert!(
            with("redis://:p@h:1", "u", "", "").validate().is_ok(),
            "user here, password there"
        );
        for (s, key) in [
            (with("redis://h:1", "", "p", "/run/pw"), "store_password"),
            (with("redis://u@h:1", "u", "", ""), "store_username"),
            (with("redis://:p@h:1", "", "", "/run/pw"), "store_password"),
            (
                with("redis+cluster://u:p@a:1,b:2", "", "q", ""),
                "store_password",
            ),
        ] {
            let Err(SettingsError::Invalid { key: k, message }) = s.validate() else {
                panic!("accepted")
            };
            assert_eq!(k, key, "{message}");
        }
    }
}
