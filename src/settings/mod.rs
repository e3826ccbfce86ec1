//! Service settings: one flat set of keys, read from defaults < a YAML file < `TOLLGATE_*`
//! environment variables < command-line flags, then validated before any port is bound.
//!
//! Each key has the same name everywhere: `store_timeout_ms` in the file,
//! `TOLLGATE_STORE_TIMEOUT_MS` in the environment, `--store-timeout-ms` on the command line.
//! Only the documented names ([`KEYS`]) are read from the environment: Kubernetes injects
//! variables such as `TOLLGATE_PORT=tcp://…` for a Service named tollgate, and those must not
//! break startup. Unknown keys in the file are errors.
//!
//! Here: the schema (every key once: name, type, default, doc; [`KEYS`] and the struct derive
//! from it) and the layering; `env.rs` reads the environment (and warns about `TOLLGATE_*`
//! variables that are not settings), `reference.rs` maps envoyproxy/ratelimit's variables
//! when tollgate runs in its place, `cli.rs` makes the flags, `validate.rs` checks what
//! serde cannot. The parts' typed configs are built from the result by `configs.rs`.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::redact::redact_url;
use crate::rules::Algorithm;
use crate::rules::FallbackMode;
use crate::store::redis::StateFormat;
use crate::telemetry::LogFormat;

/// One setting as the schema declares it: everything else (flag, variable, file key, the
/// `/config` row, the docs/settings.md table check) is derived from it.
#[derive(Clone, Copy, Debug)]
pub struct Key {
    /// The file key, e.g. `store_timeout_ms`.
    pub name: &'static str,
    /// One line for `--help` and docs/settings.md.
    pub doc: &'static str,
}

impl Key {
    /// The flag without its dashes: `store-timeout-ms`.
    pub fn flag(&self) -> String {
        self.name.replace('_', "-")
    }

    /// `TOLLGATE_STORE_TIMEOUT_MS`.
    pub fn env(&self) -> String {
        format!("TOLLGATE_{}", self.name.to_ascii_uppercase())
    }

    /// The default as text, as docs/settings.md's table shows it (`(empty)` for an empty string).
    pub fn default_text(&self) -> String {
        let defaults = serde_json::to_value(Settings::default()).unwrap_or_default();
        match defaults.get(self.name) {
            Some(serde_json::Value::String(s)) if s.is_empty() => "(empty)".to_string(),
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => String::new(),
        }
    }
}

/// Declares every setting once: `name: type = default, "doc";`. Expands to the [`Settings`]
/// struct, its `Default` and [`KEYS`]; the flag, the variable and the file key are the name.
macro_rules! settings {
    ($( $name:ident : $ty:ty = $default:expr, $doc:literal; )*) => {
        /// The effective settings.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct Settings {
            $( #[doc = $doc] pub $name: $ty, )*
        }

        impl Default for Settings {
            fn default() -> Self {
                Settings { $( $name: $default, )* }
            }
        }

        /// Every setting, in the order of `--help` and the docs/settings.md table.
        pub const KEYS: &[Key] = &[ $( Key { name: stringify!($name), doc: $doc }, )* ];
    };
}

settings! {
    rules: PathBuf = PathBuf::from("/etc/tollgate/rules"),
        "rules file or directory of *.yaml/*.yml files";
    rules_xds_server: String = String::new(),
        "take the rules from this xDS management server instead (ADS, state of the world, RateLimitConfig resources, as Envoy Gateway serves them), e.g. envoy-gateway:18001 (empty: the rules files)";
    rules_xds_node_id: String = "tollgate".to_string(),
        "the node id tollgate gives the xDS server (Envoy Gateway's rate-limit snapshots are for envoy-ratelimit)";
    rules_xds_tls_ca: String = String::new(),
        "PEM CA of the xDS server's certificate (TLS to it when this or rules_xds_tls_cert is set)";
    rules_xds_tls_cert: String = String::new(),
        "PEM client certificate for mutual TLS to the xDS server (with rules_xds_tls_key)";
    rules_xds_tls_key: String = String::new(),
        "PEM private key of rules_xds_tls_cert";
    grpc_addr: SocketAddr = SocketAddr::from(([0, 0, 0, 0], 8081)),
        "address of the Envoy RateLimitService (gRPC)";
    admin_addr: SocketAddr = SocketAddr::from(([0, 0, 0, 0], 8080)),
        "address of the admin HTTP port (/healthz /readyz /metrics /config /json)";
    admin_max_connections: usize = 256,
        "open admin connections at most (probes and scrapers need a few); past it a new connection is accepted and closed at once";
    admin_header_timeout_ms: u64 = 5_000,
        "an admin request's headers must arrive within this long, or the connection is closed";
    admin_json: bool = true,
        "serve POST /json on the admin port (decisions over HTTP: it spends tokens); false where more than operators reach that port";
    counter_api_token_file: String = String::new(),
        "a file holding the bearer token of the counter API (POST /counters/read, /counters/reset and /counters/explain on the admin port: a descriptor's buckets read, reset, or explained); empty: the API is off. Read at each call (a rotated Secret applies at once); never logged or shown";
    store: String = "memory".to_string(),
        "`memory`, or redis://… / redis+cluster://… / redis+sentinel://… (rediss… over TLS) / redis+unix:///path (see docs/redis.md)";
    default_algorithm: Algorithm = Algorithm::TokenBucket,
        "token_bucket, fixed_window, sliding_window or sliding_log, for limits that name none";
    shadow_mode: bool = false,
        "global shadow mode: the overall code is always OK";
    quota_mode: bool = false,
        "global quota mode (envoyproxy/ratelimit's QUOTA_MODE): every limit is quota-mode, so a request is OVER_LIMIT only when all its limits are over";
    response_headers: bool = false,
        "add RateLimit-* and Retry-After to responses";
    request_headers: bool = false,
        "add the RateLimit-* headers to the request Envoy forwards upstream, so the service behind it sees its caller's quota (envoyproxy/ratelimit's LIMIT_REQUEST_HEADERS_ENABLED; strip clients' own copies first: docs/rules.md)";
    headers_for_every_limit: bool = false,
        "the RateLimit-* headers also list every limit that applied, not only the tightest: RateLimit-Policy and RateLimit in the IETF draft's list form, one item per limit";
    response_dynamic_metadata: bool = false,
        "return the request (domain, descriptors, hits_addend) and the passing descriptors' `metadata` as the response's dynamic metadata (envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA)";
    near_limit_ratio: f64 = 0.8,
        "an admitted decision past this share of its limit counts as outcome near_limit (as envoyproxy/ratelimit's NEAR_LIMIT_RATIO; 1 turns it off)";
    key_prefix: String = "tollgate:".to_string(),
        "prefix of every store key";
    store_tls_ca: String = String::new(),
        "PEM file of the CA(s) that sign the Redis server's certificate (rediss://; empty: the system roots)";
    store_tls_cert: String = String::new(),
        "PEM client certificate for mutual TLS to Redis (with store_tls_key)";
    store_tls_key: String = String::new(),
        "PEM private key of store_tls_cert";
    store_tls_server_name: String = String::new(),
        "the DNS name the Redis server's certificate must carry when it is not the URL's host (a managed Redis reached by IP, tunnel or private endpoint; rediss:// only; empty: the URL's host)";
    store_username: String = String::new(),
        "ACL user for Redis (or in the store URL, not both)";
    store_password: String = String::new(),
        "password for Redis (or in the URL, or store_password_file); never logged or shown";
    store_password_file: String = String::new(),
        "file holding the Redis password, read at each new connection (a mounted Secret: a rotation applies on reconnect)";
    store_sentinel_username: String = String::new(),
        "ACL user for the Sentinels themselves (redis+sentinel://; the URL's credentials are the data nodes')";
    store_sentinel_password: String = String::new(),
        "password for the Sentinels themselves; never logged or shown";
    store_pool_size: usize = 2,
        "connections to the store (multiplexed; fewer, busier ones coalesce more writes)";
    store_connect_timeout_ms: u64 = 1_000,
        "timeout to connect to the store";
    store_timeout_ms: u64 = 10,
        "how long a store node may stay silent (no reply to any call) before a call to it gives up; a busy replica's own queueing does not count";
    store_wait_replicas: u64 = 0,
        "after each store call's writes, WAIT until this many Redis replicas hold them (narrows what a failover can forget; 0: off)";
    store_wait_timeout_ms: u64 = 5,
        "how long that WAIT may take (1 ms or more, below store_timeout_ms); a WAIT that comes back short is counted, logged and not retried";
    store_batch_in_flight: usize = 2,
        "store calls a replica keeps in flight to each Redis node (a standalone Redis, Sentinel's primary, each cluster primary) before the decisions that arrive wait and go together, as one script call, when a call returns (1 to 1,024)";
    store_batch_max_ops: usize = 64,
        "the most bucket ops one batched store call carries (1 to 1,024; 1: no batching, one script call per op as before)";
    store_state_format: StateFormat = StateFormat::Packed,
        "how the token bucket's state is written in Redis: packed (one 24-byte string, the cheaper) or hash (0.1.0's two-field hash, which 0.1.0 replicas can read: set it for a rolling upgrade or rollback beside 0.1.0); both are read";
    grpc_tls_cert: String = String::new(),
        "PEM certificate chain for TLS on the gRPC port (with grpc_tls_key; empty: plain h2c)";
    grpc_tls_key: String = String::new(),
        "PEM private key of grpc_tls_cert";
    grpc_tls_client_ca: String = String::new(),
        "PEM CA that client certificates must chain to (mutual TLS; needs grpc_tls_cert)";
    grpc_max_connection_age_ms: u64 = 0,
        "close each gRPC connection gracefully (GOAWAY) after this long, so Envoy spreads over new replicas (0: never)";
    grpc_max_connection_age_grace_ms: u64 = 10_000,
        "after GOAWAY, how long requests in flight on an aged connection may take before it is closed";
    max_concurrent_requests: usize = 10_000,
        "requests being decided at once (gRPC and /json); past it a request is refused at once with RESOURCE_EXHAUSTED (Envoy applies its failure mode) rather than queued";
    grpc_max_concurrent_streams: u32 = 100,
        "HTTP/2 streams per gRPC connection, advertised to the client (Envoy opens another connection past it)";
    max_request_bytes_in_flight: usize = 16 << 20,
        "bytes of gRPC request messages being received at once, for the whole process; past it a stream's next data fails it with RESOURCE_EXHAUSTED instead of being buffered";
    grpc_max_connections: usize = 4_096,
        "open gRPC connections at most (keep it below the process's open-files limit); past it a new connection is accepted and closed at once";
    grpc_handshake_timeout_ms: u64 = 5_000,
        "a new gRPC connection must send its first 64 bytes (the HTTP/2 preface, or a TLS ClientHello) within this long, or it is closed";
    grpc_keepalive_interval_ms: u64 = 10_000,
        "HTTP/2 PING to each gRPC client after this long without a frame from it (0: off)";
    grpc_keepalive_timeout_ms: u64 = 20_000,
        "a client that does not answer that PING within this long is disconnected (a silent peer, or one that stopped reading)";
    decision_margin_ms: u64 = 5,
        "time kept back from the caller's deadline (Envoy's grpc-timeout, its `timeout`: 20 ms by default) for the answer to reach it: the store's part of a decision gets the rest, and past it the limit's fallback decides, before the deadline, so Envoy's failure mode never does; a request without a deadline is not bounded by it (docs/accuracy.md, \"Late decisions\")";
    grpc_request_timeout_ms: u64 = 5_000,
        "a gRPC request not answered within this long (its body included) ends with CANCELLED and frees its stream; a client's shorter grpc-timeout (Envoy sends its own) applies instead (0: none)";
    fallback: FallbackMode = FallbackMode::Local,
        "when the store cannot answer: local (quota ÷ live replicas, in memory), open, closed, or error (gRPC UNAVAILABLE)";
    breaker_failures: u32 = 3,
        "consecutive failed store calls to a node that open its circuit (its requests then go straight to the fallback)";
    breaker_probe_ms: u64 = 500,
        "how often a node with an open circuit is probed with one real script call (its circuit closes when the script runs)";
    membership_interval_ms: u64 = 1_000,
        "how often each replica heartbeats into the store's membership set";
    global_store: String = String::new(),
        "a Redis shared by every region (redis://…, rediss://…, redis+cluster://…; credentials in the URL, TLS files as the store's): `global: true` limits are shared across regions through it, no decision waiting for it (see docs/regions.md); empty: global limits are regional";
    region: String = String::new(),
        "this region's name, one of `regions` (with `global_store`)";
    regions: String = String::new(),
        "every region sharing the global limits, comma-separated (us-east,eu-west,ap-south), each with an optional weight (us-east=2): each is kept its partition share (its weight's part of a global limit, 1/N with equal weights) while the global store has not heard from it";
    region_exchange_ms: u64 = 1_000,
        "how often each replica exchanges its demand for global limits with the global store (100 to 60000)";
    region_lease_ms: u64 = 10_000,
        "how long a region's shares of global limits hold without an answer from the global store; then it holds each at its partition share (at least 3 exchanges)";
    region_floor: f64 = 0.1,
        "the part of its partition share each region always holds of every global limit, asked for or not (0 to 1): what a key new to a region admits before its first exchange";
    fallback_replicas: u64 = 0,
        "a fixed replica count for the local fallback's share (0: count live replicas)";
    fallback_min_replicas: u64 = 1,
        "the least the local fallback divides by (also the count of a replica that never reached the store)";
    lease_max_batch: u64 = 0,
        "most tokens one claim leases for a key, spent from memory until used or expired (0: leasing off; Redis store only)";
    lease_ttl_ms: u64 = 1_000,
        "how long leased tokens stay spendable; what is left then is given back to the bucket";
    lease_max_keys: usize = 100_000,
        "leases held at most per replica; past it a new key is not leased (its requests go to the store)";
    sliding_log_max_limit: u64 = crate::rules::model::SLIDING_LOG_MAX_LIMIT,
        "largest requests_per_unit of an algorithm: sliding_log limit (it keeps every admitted hit of the window: memory grows with the limit)";
    rlqs_report_interval_ms: u64 = crate::rules::model::RLQS_REPORT_INTERVAL_MS,
        "how often Envoy's rate_limit_quota filter reports (RLQS): each assignment is sized for one interval of demand (Envoy 1.40 reports every 5 s whatever its reporting_interval says); an rlqs: true domain's buckets must hold one interval of refill";
    rlqs_assignment_ttl_ms: u64 = 15_000,
        "how long an RLQS assignment holds in Envoy without a newer one (whole seconds, at least 1 s and above rlqs_report_interval_ms); then Envoy applies its expired_assignment_behavior";
    rlqs_max_streams: usize = 1_024,
        "RLQS streams open at once on this replica (an Envoy opens one per rate_limit_quota filter config); past it a new stream ends with RESOURCE_EXHAUSTED; a stream that names no bucket for three report intervals is ended";
    rlqs_max_streams_per_peer: usize = 16,
        "RLQS streams one peer (remote IP address) may hold of rlqs_max_streams (an Envoy opens one per rate_limit_quota filter config); past it its new stream ends with RESOURCE_EXHAUSTED, so one client cannot take every stream";
    rlqs_max_buckets_per_stream: usize = 2_000,
        "RLQS bucket ids one stream may hold; reports for more are told DENY_ALL (never left to Envoy's no_assignment_behavior) and counted in tollgate_rlqs_refused_total";
    rlqs_max_state_bytes: u64 = 67_108_864,
        "bytes of RLQS bucket-id state this replica holds at most, over all streams (an id counts its keys and values, twice more their first 64 bytes each, and 1,280 bytes: ~1.35 KB for {tenant: acme}, ~49,000 such ids in 64 MiB, which fits the chart's 256Mi limit); new ids past it are told DENY_ALL and counted";
    rlqs_idle_ms: u64 = 60_000,
        "an RLQS bucket with no requests for this long is abandoned (abandon_action): Envoy forgets it, and it costs nothing until its next request";
    detailed_metric_max_series: usize = 1_000,
        "series per detailed_metric limit (its values are caller input); past it, new values count as <class>.(overflow)";
    memory_max_keys: usize = 500_000,
        "buckets the memory store (and, on Redis, the local fallback) holds at most (~220 bytes each); a new key past it evicts the least-used, nearest-to-full buckets";
    over_limit_cache_max_keys: usize = 10_000,
        "spent keys answered OVER_LIMIT from memory until they can fit a request again, per replica (0: off; Redis store only)";
    shard_retry: bool = true,
        "a request whose shard is empty tries one other shard before answering OVER_LIMIT";
    max_descriptors: usize = 64,
        "most descriptors in one request";
    max_entries: usize = 16,
        "most entries in one descriptor";
    max_key_bytes: usize = 256,
        "longest descriptor key";
    max_value_bytes: usize = 4_096,
        "longest descriptor value";
    max_message_bytes: usize = 64 << 10,
        "largest gRPC request message (a real RLS request is a few hundred bytes)";
    unready_without_rules: bool = false,
        "/readyz answers 503 while no domain is loaded (a wrong rules path keeps the replica out of service)";
    unready_until_store_answers: bool = true,
        "/readyz and /healthcheck answer 503 until the store has answered once since start (a wrong Redis address or password keeps the replica out of service instead of every replica deciding from its local share); later outages do not unready it";
    store_startup_timeout_ms: u64 = 0,
        "tollgate exits with the store's last connection error when it has not answered within this long of the start (0: keeps trying, unready; the reference's REDIS_STARTUP_MAX_ELAPSED_TIME)";
    reload_interval_ms: u64 = 2_000,
        "how often to look for changed rules files (0: never)";
    log_level: String = "info".to_string(),
        "log filter, e.g. info or tollgate=debug";
    log_format: LogFormat = LogFormat::Text,
        "log lines on stderr: text (for people) or json (one object per line, for log pipelines)";
    decision_log_per_s: u64 = 20,
        "at most this many decision lines a second, logged at debug (log_level debug): the domain, each descriptor, each limit's rule, outcome and what answered it (store, lease, over_limit_cache, fallback/<why>); the rest are counted in the next line; 0: none";
    decision_log_values: bool = true,
        "show descriptor values in the decision lines; false: each value as a short hash (the same value, the same hash: a tenant can be followed without its identity in the log)";
    drain_ms: u64 = 0,
        "after SIGTERM: how long to stay up, unready, before closing the listeners";
    otlp_endpoint: String = String::new(),
        "OTLP/gRPC collector for request spans, e.g. http://collector:4317 (empty: off)";
    statsd_addr: String = String::new(),
        "statsd server sent the reference's per-rule counters under its names: host:port or udp://host:port over UDP, tcp://host:port over TCP (empty: off; /metrics serves Prometheus either way)";
    statsd_flush_interval_ms: u64 = 10_000,
        "how often the statsd counters' growth is sent (the reference's STATS_FLUSH_INTERVAL)";
    prometheus_addr: String = String::new(),
        "a port of its own serving the reference's Prometheus metrics (ratelimit_service_*, mapped from its statsd names as its USE_PROMETHEUS does), ip:port (empty: off; /metrics on the admin port is tollgate's own)";
    prometheus_path: String = "/metrics".to_string(),
        "the path of those metrics on prometheus_addr (the reference's PROMETHEUS_PATH)";
    prometheus_mapper: String = String::new(),
        "a statsd exporter mapping file (YAML) for those metrics, as the reference's PROMETHEUS_MAPPER_YAML (empty: the reference's default mapping)";
}

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("settings: {0}")]
    Read(#[from] config::ConfigError),
    #[error("settings: {key}: {message}")]
    Invalid { key: &'static str, message: String },
    /// A value that is not one of a setting's names (`fallback: lcoal`).
    #[error("settings: {key}: unknown value '{value}' (expected {expected})")]
    UnknownValue {
        key: String,
        value: String,
        expected: &'static str,
    },
    /// A variable of the reference's environment that cannot be honoured (`reference.rs`).
    #[error("{0}")]
    Reference(String),
}

/// Where the settings come from besides the defaults.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    /// The optional YAML settings file (`--config` / `TOLLGATE_CONFIG`).
    pub file: Option<PathBuf>,
    /// `(key, value)` from the environment, documented keys only (see [`from_env`]).
    pub env: Vec<(&'static str, String)>,
    /// `(key, value)` from command-line flags.
    pub flags: Vec<(&'static str, String)>,
    /// `(key, value)` defaults under every other source: the reference's choices when started
    /// as envoyproxy/ratelimit (`reference/mod.rs`).
    pub defaults: Vec<(&'static str, String)>,
    /// Started as envoyproxy/ratelimit (`reference.rs`): its variables that are set and change
    /// nothing here, for the one startup warning that names them.
    pub reference_ignored: Vec<String>,
    /// …or the reason its environment cannot be served, which stops startup.
    pub reference_refused: Option<String>,
    /// `(setting, variables)` for the settings only the reference's variables set (no flag or
    /// `TOLLGATE_*` variable overrides them): a refusal of such a setting names the variables.
    pub reference_origins: Vec<(&'static str, String)>,
    /// Started as envoyproxy/ratelimit: say at startup where it decides otherwise.
    pub as_reference: bool,
}

mod cli;
mod env;
mod reference;
mod validate;

pub use cli::ServeArgs;
pub use env::{from_env, unknown_env_warnings};
pub use reference::{Mapped, REFERENCE_DEFAULTS, Refused, differences, from_reference_env};

/// The config crate names the Rust type when a value is none of an enum setting's names
/// ("enum FallbackMode does not have variant constructor lcoal for key `fallback`"): say what
/// the setting accepts instead. Any other error is passed on as it is.
fn unknown_value(e: config::ConfigError) -> SettingsError {
    let text = e.to_string();
    let parsed = text
        .strip_prefix("enum ")
        .and_then(|rest| rest.split_once(" does not have variant constructor "))
        .and_then(|(ty, rest)| {
            let (value, key) = rest.rsplit_once(" for key `")?;
            Some((ty, value, key.strip_suffix('`')?))
        });
    let Some((ty, value, key)) = parsed else {
        return SettingsError::Read(e);
    };
    let expected = match ty {
        "Algorithm" => crate::rules::Algorithm::NAMES,
        "FallbackMode" => crate::rules::FallbackMode::NAMES,
        "LogFormat" => LogFormat::NAMES,
        "StateFormat" => crate::store::redis::StateFormat::NAMES,
        _ => return SettingsError::Read(e),
    };
    SettingsError::UnknownValue {
        key: key.to_string(),
        value: value.to_string(),
        expected,
    }
}

/// A refusal of a setting that one of the reference's variables set (`origins`), reworded to
/// lead with the variable the user wrote: `STATS_FLUSH_INTERVAL (statsd_flush_interval_ms):
/// must be …`, not the setting alone, which a migrating user never wrote.
fn name_reference_origin(e: SettingsError, origins: &[(&'static str, String)]) -> SettingsError {
    let text = e.to_string();
    let key = match &e {
        SettingsError::Invalid { key, .. } => Some(*key),
        SettingsError::UnknownValue { key, .. } => {
            origins.iter().map(|(k, _)| *k).find(|k| k == key)
        }
        // The config crate's own errors name the key in their text (`for key `x``).
        SettingsError::Read(_) => origins
            .iter()
            .map(|(k, _)| *k)
            .find(|k| text.contains(&format!("`{k}`")) || text.contains(&format!("{k}:"))),
        SettingsError::Reference(_) => None,
    };
    match key.and_then(|k| origins.iter().find(|(o, _)| *o == k)) {
        Some((key, vars)) => {
            let why = match &e {
                SettingsError::Invalid { message, .. } => message.clone(),
                _ => text.trim_start_matches("settings: ").to_string(),
            };
            SettingsError::Reference(format!(
                "envoyproxy/ratelimit environment: {vars} (tollgate's {key}): {why}"
            ))
        }
        None => e,
    }
}

impl Settings {
    /// Layers the sources (file < env < flags) over the defaults and validates the result.
    pub fn load(sources: &Sources) -> Result<Settings, SettingsError> {
        if let Some(refused) = &sources.reference_refused {
            return Err(SettingsError::Reference(refused.clone()));
        }
        let mut b = config::Config::builder();
        for (key, value) in &sources.defaults {
            b = b.set_default(*key, value.as_str())?;
        }
        if let Some(file) = &sources.file {
            b = b.add_source(
                config::File::from(file.as_path())
                    .format(config::FileFormat::Yaml)
                    .required(true),
            );
        }
        // Later overrides of the same key replace earlier ones: flags win over env.
        for (key, value) in sources.env.iter().chain(&sources.flags) {
            b = b.set_override(*key, value.as_str())?;
        }
        let settings: Settings = b
            .build()
            .and_then(|c| c.try_deserialize())
            .map_err(unknown_value)
            .map_err(|e| name_reference_origin(e, &sources.reference_origins))?;
        settings
            .validate()
            .map_err(|e| name_reference_origin(e, &sources.reference_origins))
    }

    /// A copy safe to log or show on `/config`: the store URL's password is replaced.
    pub fn redacted(&self) -> Settings {
        Settings {
            store: redact_url(&self.store),
            global_store: redact_url(&self.global_store),
            store_password: if self.store_password.is_empty() {
                String::new()
            } else {
                "***".to_string()
            },
            store_sentinel_password: if self.store_sentinel_password.is_empty() {
                String::new()
            } else {
                "***".to_string()
            },
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let s = Settings::load(&Sources::default()).unwrap();
        assert_eq!(s, Settings::default());
    }

    #[test]
    fn unknown_keys_in_the_file_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("s.yaml");
        std::fs::write(&file, "store_timeout: 5\n").unwrap();
        let err = Settings::load(&Sources {
            file: Some(file),
            ..Sources::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("store_timeout"), "{err}");
    }

    /// The settings page's table (docs/settings.md) lists exactly the schema's keys with their
    /// defaults, so the docs cannot drift from the code.
    #[test]
    fn the_settings_page_table_matches_the_schema() {
        let section = include_str!("../../docs/settings.md");
        let rows: Vec<(String, String)> = section
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| {
                let cells: Vec<&str> = l.split(" | ").collect();
                let strip = |c: &str| c.trim_matches(['|', ' ', '`']).to_string();
                (strip(cells[0]), strip(cells.get(1).copied().unwrap_or("")))
            })
            .collect();
        let documented: Vec<&str> = rows.iter().map(|(k, _)| k.as_str()).collect();
        let declared: Vec<&str> = KEYS.iter().map(|k| k.name).collect();
        assert_eq!(
            documented, declared,
            "docs/settings.md rows vs settings schema (same order)"
        );
        for (key, default) in &rows {
            let key = KEYS.iter().find(|k| k.name == key).unwrap();
            assert_eq!(
                *default,
                key.default_text(),
                "docs/settings.md default of {}",
                key.name
            );
        }
    }

    #[test]
    fn secrets_are_redacted() {
        assert_eq!(
            redact_url("redis://:hunter2@r:6379/0"),
            "redis://:***@r:6379/0"
        );
        assert_eq!(
            redact_url("redis+cluster://u:p@a:1,b:2"),
            "redis+cluster://u:***@a:1,b:2"
        );
        assert_eq!(redact_url("redis://r:6379"), "redis://r:6379");
        let s = Settings {
            store: "rediss://u:pw@h:1".into(),
            ..Settings::default()
        };
        assert!(!format!("{:?}", s.redacted()).contains("pw"));
        let s = Settings {
            store: "redis://h:1".into(),
            store_password: "hunter2".into(),
            ..Settings::default()
        };
        assert!(!format!("{:?}", s.redacted()).contains("hunter2"));
    }
}
