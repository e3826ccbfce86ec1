//! What the Redis store needs to know: [`RedisConfig`], built from the settings by
//! `configs.rs` (the store never sees the settings).

use std::time::Duration;

pub use super::lua::StateFormat;

/// What the Redis store needs to know (built from the settings by `configs.rs`).
#[derive(Clone, Debug)]
pub struct RedisConfig {
    /// `redis://…`, `rediss://…`, `redis+cluster://…` or `rediss+cluster://…`.
    pub url: String,
    /// Multiplexed connections (cluster: cluster connections) to hold.
    pub pool_size: usize,
    /// Bound on making one connection (TCP, AUTH/SELECT, script load) and on keeper pings.
    pub connect_timeout: Duration,
    /// How long a node may stay silent before a call to it gives up (see the module doc).
    pub timeout: Duration,
    /// Consecutive failed calls to a node that open its circuit.
    pub breaker_failures: u32,
    /// How often an open circuit's node is probed.
    pub breaker_probe: Duration,
    /// The bucket keys' prefix: the probe's key is under it too (ACLs that name key patterns).
    pub key_prefix: String,
    /// `rediss://`: the CA file (empty: the system roots), and the client certificate and key
    /// for mutual TLS (both or neither).
    pub tls_ca: String,
    pub tls_cert: String,
    pub tls_key: String,
    /// `rediss://` to one Redis: the name its certificate must carry, when not the URL's host
    /// (empty: the host). See `connect.rs`.
    pub tls_server_name: String,
    /// Credentials from the settings (else the URL's); `password_file` is read at each new
    /// connection.
    pub username: String,
    pub password: String,
    pub password_file: String,
    /// The Sentinels' own credentials (`redis+sentinel://`).
    pub sentinel_username: String,
    pub sentinel_password: String,
    /// `WAIT` after each call's scripts: this many replicas (0: no `WAIT`), within this
    /// many ms (see [`scripts`]).
    pub wait_replicas: u64,
    pub wait_timeout_ms: u64,
    /// Batching (`batch.rs`): calls a replica keeps in flight to one node before new
    /// decisions queue, and the most ops one batch call carries (1: no batching).
    pub batch_in_flight: usize,
    pub batch_max_ops: usize,
    /// How the token bucket's state is written (`store_state_format`; both are read).
    pub state_format: StateFormat,
    /// What the logs call this Redis: `store` (the region's), or `global store` (the one the
    /// regions share global limits through).
    pub role: &'static str,
}

#[cfg(test)]
impl RedisConfig {
    /// A config for `url` with the given pool and timeouts and nothing else set (tests).
    pub(crate) fn for_tests(url: &str, pool_size: usize, connect_ms: u64, timeout_ms: u64) -> Self {
        RedisConfig {
            url: url.to_string(),
            pool_size,
            connect_timeout: Duration::from_millis(connect_ms),
            timeout: Duration::from_millis(timeout_ms),
            breaker_failures: 3,
            breaker_probe: Duration::from_millis(500),
            key_prefix: "tollgate:".to_string(),
            tls_ca: String::new(),
            tls_cert: String::new(),
            tls_key: String::new(),
            tls_server_name: String::new(),
            username: String::new(),
            password: String::new(),
            password_file: String::new(),
            sentinel_username: String::new(),
            sentinel_password: String::new(),
            wait_replicas: 0,
            wait_timeout_ms: 5,
            batch_in_flight: 2,
            batch_max_ops: 64,
            state_format: StateFormat::Packed,
            role: "store",
        }
    }
}
