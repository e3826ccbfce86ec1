//! Each part's typed config, built from the validated [`Settings`]: the parts themselves
//! (the store today) never see `Settings`, so they can be built by a test, a simulator or
//! another front end from their own configs, and `settings.rs` knows nothing of them.

use std::time::Duration;

use crate::settings::Settings;
use crate::store::{RedisConfig, StoreConfig};

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
        username: s.store_username.clone(),
        password: s.store_password.clone(),
        password_file: s.store_password_file.clone(),
        sentinel_username: s.store_sentinel_username.clone(),
        sentinel_password: s.store_sentinel_password.clone(),
        wait_replicas: s.store_wait_replicas,
        wait_timeout_ms: s.store_wait_timeout_ms,
    }
}
