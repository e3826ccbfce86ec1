//! Each part's typed config, built from the validated [`Settings`]: the store's, the
//! limiter's, the request bounds and the gRPC port's TLS files. The parts never see `Settings`, so they can be built by a test, a simulator or
//! another front end from their own configs, and `settings.rs` knows nothing of them.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::fleet::Replicas;
use crate::limiter::{HotKeyConfig, LimiterConfig};
use crate::service::Bounds;
use crate::service::tls::GrpcTlsFiles;
use crate::settings::Settings;
use crate::store::{RedisConfig, StoreConfig};

/// The decision loop's config. `shared_store`: the store is shared by replicas (Redis), which
/// turns leasing and the over-limit cache on.
pub fn limiter_config(
    s: &Settings,
    replicas: Arc<Replicas>,
    clock: Clock,
    shared_store: bool,
) -> LimiterConfig {
    LimiterConfig {
        key_prefix: s.key_prefix.clone(),
        shadow_mode: s.shadow_mode,
        quota_mode: s.quota_mode,
        default_algorithm: s.default_algorithm,
        sliding_log_max_limit: s.sliding_log_max_limit,
        fallback: s.fallback,
        replicas,
        // Set by the app once the global store is connected (`region_config`).
        regions: None,
        closed_retry_ms: s.breaker_probe_ms,
        hot: HotKeyConfig {
            shared_store,
            lease_max_batch: s.lease_max_batch,
            lease_ttl_ms: s.lease_ttl_ms,
            lease_max_keys: s.lease_max_keys,
            over_limit_cache_max_keys: s.over_limit_cache_max_keys,
            shard_retry: s.shard_retry,
            // A claim is one store call; waiting a little longer covers its scheduling.
            claim_wait_ms: s.store_timeout_ms.saturating_mul(2).max(10),
        },
        clock,
        near_limit_ratio: s.near_limit_ratio,
        fallback_max_keys: s.memory_max_keys,
        detailed_metric_max_series: s.detailed_metric_max_series,
        decision_log_per_s: s.decision_log_per_s,
        decision_log_values: s.decision_log_values,
    }
}

/// The request bounds (`max_descriptors`, `max_entries`, …).
/// The RLQS server's settings.
pub fn rlqs_config(s: &Settings, clock: Clock) -> crate::rlqs::RlqsConfig {
    crate::rlqs::RlqsConfig {
        report_interval_ms: s.rlqs_report_interval_ms,
        assignment_ttl_ms: s.rlqs_assignment_ttl_ms,
        max_streams: s.rlqs_max_streams,
        max_streams_per_peer: s.rlqs_max_streams_per_peer,
        max_buckets_per_stream: s.rlqs_max_buckets_per_stream,
        max_state_bytes: s.rlqs_max_state_bytes,
        idle_ms: s.rlqs_idle_ms,
        max_entries: s.max_entries,
        max_key_bytes: s.max_key_bytes,
        max_value_bytes: s.max_value_bytes,
        clock,
    }
}

pub fn bounds(s: &Settings) -> Bounds {
    Bounds {
        max_descriptors: s.max_descriptors,
        max_entries: s.max_entries,
        max_key_bytes: s.max_key_bytes,
        max_value_bytes: s.max_value_bytes,
    }
}

/// The gRPC port's TLS files.
pub fn grpc_tls_files(s: &Settings) -> GrpcTlsFiles {
    GrpcTlsFiles {
        cert: s.grpc_tls_cert.clone(),
        key: s.grpc_tls_key.clone(),
        client_ca: s.grpc_tls_client_ca.clone(),
    }
}

/// The store the `store` setting names, with its settings.
pub fn store_config(s: &Settings) -> StoreConfig {
    if s.store == "memory" {
        StoreConfig::Memory {
            max_keys: s.memory_max_keys,
        }
    } else {
        StoreConfig::Redis(Box::new(redis_config(s)))
    }
}

/// How this replica shares `global: true` limits across regions, and the global store it
/// exchanges demand through: `None` without `global_store`. The global store takes the
/// store's TLS files and timeouts, its own URL's credentials (none of the store's), no
/// `WAIT`, and at least 5 s to connect (a connection's setup is several round trips, each
/// across regions) and to answer an exchange's call.
pub fn region_config(s: &Settings) -> Option<(crate::regions::RegionConfig, RedisConfig)> {
    if s.global_store.is_empty() {
        return None;
    }
    let exchange = Duration::from_millis(s.region_exchange_ms);
    let regions = crate::regions::RegionConfig {
        region: s.region.clone(),
        regions: s.region_names().into_iter().map(String::from).collect(),
        weights: s.region_weights(),
        exchange,
        lease: Duration::from_millis(s.region_lease_ms),
        floor: s.region_floor,
        beat_key: format!("{}{{regions}}", s.key_prefix),
        contact_key: format!("{}{{regions-contact}}", s.key_prefix),
        replica: crate::fleet::replica_id(),
        global_store: crate::redact::redact_url(&s.global_store),
    };
    let global = RedisConfig {
        url: s.global_store.clone(),
        pool_size: 1,
        connect_timeout: Duration::from_millis(s.store_connect_timeout_ms.max(5_000)),
        timeout: exchange.max(Duration::from_secs(1)),
        username: String::new(),
        password: String::new(),
        password_file: String::new(),
        sentinel_username: String::new(),
        sentinel_password: String::new(),
        tls_server_name: String::new(),
        wait_replicas: 0,
        batch_max_ops: 1,
        role: "global store",
        ..redis_config(s)
    };
    Some((regions, global))
}

/// What the Redis store needs from the settings.
pub fn redis_config(s: &Settings) -> RedisConfig {
    RedisConfig {
        url: s.store.clone(),
        pool_size: s.store_pool_size.max(1),
        connect_timeout: Duration::from_millis(s.store_connect_timeout_ms),
        timeout: Duration::from_millis(s.store_timeout_ms),
        breaker_failures: s.breaker_failures,
        breaker_probe: Duration::from_millis(s.breaker_probe_ms),
        key_prefix: s.key_prefix.clone(),
        tls_ca: s.store_tls_ca.clone(),
        tls_cert: s.store_tls_cert.clone(),
        tls_key: s.store_tls_key.clone(),
        tls_server_name: s.store_tls_server_name.clone(),
        username: s.store_username.clone(),
        password: s.store_password.clone(),
        password_file: s.store_password_file.clone(),
        sentinel_username: s.store_sentinel_username.clone(),
        sentinel_password: s.store_sentinel_password.clone(),
        wait_replicas: s.store_wait_replicas,
        wait_timeout_ms: s.store_wait_timeout_ms,
        batch_in_flight: s.store_batch_in_flight,
        batch_max_ops: s.store_batch_max_ops,
        state_format: s.store_state_format,
        role: "store",
    }
}

/// Where `rules::xds` takes the rules from (`rules_xds_*`).
pub fn xds_source(settings: &Settings) -> crate::rules::xds::XdsSource {
    crate::rules::xds::XdsSource {
        server: settings.rules_xds_server.clone(),
        node_id: settings.rules_xds_node_id.clone(),
        tls_ca: settings.rules_xds_tls_ca.clone(),
        tls_cert: settings.rules_xds_tls_cert.clone(),
        tls_key: settings.rules_xds_tls_key.clone(),
    }
}
