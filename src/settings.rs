//! Service settings: one flat set of keys, read from defaults < a YAML file < `TOLLGATE_*`
//! environment variables < command-line flags, then validated before any port is bound.
//!
//! Each key has the same name everywhere: `store_timeout_ms` in the file,
//! `TOLLGATE_STORE_TIMEOUT_MS` in the environment, `--store-timeout-ms` on the command line.
//! Only the documented names ([`KEYS`]) are read from the environment: Kubernetes injects
//! variables such as `TOLLGATE_PORT=tcp://…` for a Service named tollgate, and those must not
//! break startup. Unknown keys in the file are errors.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::redact::redact_url;
use crate::rules::Algorithm;
use crate::rules::FallbackMode;
use crate::telemetry::LogFormat;

/// One setting as the schema declares it: everything else (flag, variable, file key, the
/// `/config` row, the README table check) is derived from it.
#[derive(Clone, Copy, Debug)]
pub struct Key {
    /// The file key, e.g. `store_timeout_ms`.
    pub name: &'static str,
    /// One line for `--help` and the README.
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

    /// The default as text, as the README's table shows it (`(empty)` for an empty string).
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

        /// Every setting, in the order of `--help` and the README table.
        pub const KEYS: &[Key] = &[ $( Key { name: stringify!($name), doc: $doc }, )* ];
    };
}

settings! {
    rules: PathBuf = PathBuf::from("/etc/tollgate/rules"),
        "rules file or directory of *.yaml/*.yml files";
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
    store: String = "memory".to_string(),
        "`memory`, or redis://… / redis+cluster://… / redis+sentinel://… (rediss… over TLS; see README)";
    default_algorithm: Algorithm = Algorithm::TokenBucket,
        "token_bucket, fixed_window or sliding_window, for limits that name none";
    shadow_mode: bool = false,
        "global shadow mode: the overall code is always OK";
    response_headers: bool = false,
        "add RateLimit-* and Retry-After to responses";
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
    unready_until_store_answers: bool = false,
        "/readyz answers 503 until the store has answered once since start (a wrong Redis address keeps the replica out of service); later outages do not unready it";
    reload_interval_ms: u64 = 2_000,
        "how often to look for changed rules files (0: never)";
    log_level: String = "info".to_string(),
        "log filter, e.g. info or tollgate=debug";
    log_format: LogFormat = LogFormat::Text,
        "log lines on stderr: text (for people) or json (one object per line, for log pipelines)";
    drain_ms: u64 = 0,
        "after SIGTERM: how long to stay up, unready, before closing the listeners";
    otlp_endpoint: String = String::new(),
        "OTLP/gRPC collector for request spans, e.g. http://collector:4317 (empty: off)";
}

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("settings: {0}")]
    Read(#[from] config::ConfigError),
    #[error("settings: {key}: {message}")]
    Invalid { key: &'static str, message: String },
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
}

/// Warnings for `TOLLGATE_*` variables that are not settings: a typo such as
/// `TOLLGATE_STOR=redis://…` would otherwise leave the replica on the memory store without a
/// word. The variables Kubernetes injects for a Service whose name starts with `tollgate`
/// (`TOLLGATE_PORT`, `TOLLGATE_SERVICE_HOST`, `TOLLGATE_PORT_8081_TCP_ADDR`, …) are not ours
/// and pass silently.
pub fn unknown_env_warnings(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let known: Vec<String> = KEYS.iter().map(Key::env).collect();
    let mut out: Vec<String> = names
        .into_iter()
        .filter(|n| n.starts_with("TOLLGATE_") && n != "TOLLGATE_CONFIG")
        .filter(|n| !known.contains(n) && !is_kubernetes_service_variable(n))
        .map(|n| {
            let closest = known
                .iter()
                .map(|k| (edit_distance(&n, k), k))
                .filter(|(d, _)| *d <= 3)
                .min();
            match closest {
                Some((_, k)) => {
                    format!("{n} is not a tollgate setting and is ignored (did you mean {k}?)")
                }
                None => format!("{n} is not a tollgate setting and is ignored"),
            }
        })
        .collect();
    out.sort();
    out
}

/// `<SVC>_SERVICE_HOST`, `<SVC>_SERVICE_PORT[_<name>]`, `<SVC>_PORT` and
/// `<SVC>_PORT_<n>_<TCP|UDP|SCTP>[_PORT|_PROTO|_ADDR]`: Kubernetes' service links.
fn is_kubernetes_service_variable(name: &str) -> bool {
    if name.ends_with("_SERVICE_HOST")
        || name.ends_with("_SERVICE_PORT")
        || name.contains("_SERVICE_PORT_")
        || name.ends_with("_PORT")
    {
        return true;
    }
    let parts: Vec<&str> = name.split('_').collect();
    parts.windows(3).any(|w| {
        w[0] == "PORT"
            && !w[1].is_empty()
            && w[1].bytes().all(|b| b.is_ascii_digit())
            && matches!(w[2], "TCP" | "UDP" | "SCTP")
    })
}

/// Levenshtein distance, for "did you mean": the names are short, so the simple table is fine.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The documented `TOLLGATE_*` variables that are set (empty counts as unset), read through
/// `get` so tests need not touch the process environment.
pub fn from_env(
    get: impl Fn(&str) -> Option<String>,
) -> (Option<PathBuf>, Vec<(&'static str, String)>) {
    let file = get("TOLLGATE_CONFIG")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let vars = KEYS
        .iter()
        .filter_map(|key| {
            let v = get(&key.env())?;
            (!v.is_empty()).then_some((key.name, v))
        })
        .collect();
    (file, vars)
}

/// The flags of `tollgate serve`, built from [`KEYS`]: `--config FILE` and one
/// `--<key-with-dashes> VALUE` per setting. No clap defaults and no clap `env`: a clap default
/// would beat the file, and clap passes an empty variable through as a value; the layering
/// (flag > env > file > default) is [`Settings::load`]'s job.
#[derive(Clone, Debug, Default)]
pub struct ServeArgs {
    /// `--config`: the YAML settings file.
    pub config: Option<PathBuf>,
    /// `(key, value)` of the flags that were given.
    pub flags: Vec<(&'static str, String)>,
}

impl ServeArgs {
    /// The sources of the settings: these flags, the documented `TOLLGATE_*` variables read
    /// through `get`, and the file (`--config`, else `TOLLGATE_CONFIG`).
    pub fn sources(self, get: impl Fn(&str) -> Option<String>) -> Sources {
        let (env_file, env) = from_env(get);
        Sources {
            file: self.config.or(env_file),
            env,
            flags: self.flags,
        }
    }
}

impl clap::FromArgMatches for ServeArgs {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut args = ServeArgs::default();
        args.update_from_arg_matches(matches)?;
        Ok(args)
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        if let Some(file) = matches.get_one::<PathBuf>("config") {
            self.config = Some(file.clone());
        }
        for key in KEYS {
            if let Some(value) = matches.get_one::<String>(key.name) {
                self.flags.push((key.name, value.clone()));
            }
        }
        Ok(())
    }
}

impl clap::Args for ServeArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        use clap::{Arg, value_parser};
        cmd.arg(
            Arg::new("config")
                .long("config")
                .value_name("FILE")
                .value_parser(value_parser!(PathBuf))
                .help(
                    "YAML settings file with the same keys as these flags [env: TOLLGATE_CONFIG]",
                ),
        )
        .args(KEYS.iter().map(|key| {
            Arg::new(key.name)
                .long(key.flag())
                .value_name("VALUE")
                .help(format!(
                    "{} [env: {}] [default: {}]",
                    key.doc,
                    key.env(),
                    key.default_text()
                ))
        }))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl Settings {
    /// Layers the sources (file < env < flags) over the defaults and validates the result.
    pub fn load(sources: &Sources) -> Result<Settings, SettingsError> {
        let mut b = config::Config::builder();
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
        let settings: Settings = b.build()?.try_deserialize()?;
        settings.validate()
    }

    /// Checks what serde cannot: ranges, the store URL's scheme, the key prefix.
    pub fn validate(self) -> Result<Settings, SettingsError> {
        let bad = |key, message: &str| {
            Err(SettingsError::Invalid {
                key,
                message: message.to_string(),
            })
        };
        if self.store != "memory"
            && ![
                "redis://",
                "rediss://",
                "redis+cluster://",
                "rediss+cluster://",
                "redis+sentinel://",
                "rediss+sentinel://",
            ]
            .iter()
            .any(|s| self.store.starts_with(s))
        {
            return bad("store", &store_hint(&self.store));
        }
        let tls_url = self.store.starts_with("rediss");
        for (key, value) in [
            ("store_tls_ca", &self.store_tls_ca),
            ("store_tls_cert", &self.store_tls_cert),
            ("store_tls_key", &self.store_tls_key),
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
        if self.store_tls_cert.is_empty() != self.store_tls_key.is_empty() {
            return bad(
                "store_tls_cert",
                "store_tls_cert and store_tls_key go together (mutual TLS needs both)",
            );
        }
        if self.grpc_keepalive_interval_ms > 0 && self.grpc_keepalive_timeout_ms == 0 {
            return bad(
                "grpc_keepalive_timeout_ms",
                "must be at least 1 while grpc_keepalive_interval_ms is on (0 turns the PINGs off)",
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
        if self.key_prefix.contains(['{', '}']) {
            return bad(
                "key_prefix",
                "must not contain `{` or `}` (they would move the Redis Cluster hash tag)",
            );
        }
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
        ] {
            if v == 0 {
                return bad(key, "must be at least 1");
            }
        }
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
        if self.lease_max_batch > 1_000_000 {
            return bad("lease_max_batch", "must be at most 1000000");
        }
        if self.lease_ttl_ms > 3_600_000 {
            return bad("lease_ttl_ms", "must be at most 3600000 (an hour)");
        }
        let otlp = &self.otlp_endpoint;
        if !otlp.is_empty() && !otlp.starts_with("http://") {
            return bad(
                "otlp_endpoint",
                "expected http://host:port (OTLP over gRPC; TLS is not built in), or empty for off",
            );
        }
        if self.grpc_addr == self.admin_addr && self.grpc_addr.port() != 0 {
            return bad("admin_addr", "must differ from grpc_addr");
        }
        Ok(self)
    }

    /// A copy safe to log or show on `/config`: the store URL's password is replaced.
    pub fn redacted(&self) -> Settings {
        Settings {
            store: redact_url(&self.store),
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
    let expected = "expected `memory`, redis://…, redis+cluster://…, redis+sentinel://…, or one of them over TLS (rediss://…, rediss+cluster://…, rediss+sentinel://…)";
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
    use std::collections::HashMap;

    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn defaults_are_valid() {
        let s = Settings::load(&Sources::default()).unwrap();
        assert_eq!(s, Settings::default());
    }

    #[test]
    fn precedence_is_flag_then_env_then_file_then_default() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tollgate.yaml");
        std::fs::write(
            &file,
            "store_timeout_ms: 7\nmax_entries: 3\nshadow_mode: true\nkey_prefix: file\n",
        )
        .unwrap();
        let (f, vars) = from_env(env(&[
            ("TOLLGATE_CONFIG", file.to_str().unwrap()),
            ("TOLLGATE_MAX_ENTRIES", "5"),
            ("TOLLGATE_KEY_PREFIX", "env"),
            ("TOLLGATE_GRPC_ADDR", "127.0.0.1:9001"),
        ]));
        let sources = Sources {
            file: f,
            env: vars,
            flags: vec![("key_prefix", "flag".into())],
        };
        let s = Settings::load(&sources).unwrap();
        assert_eq!(s.store_timeout_ms, 7, "file over default");
        assert_eq!(s.max_entries, 5, "env over file");
        assert_eq!(s.key_prefix, "flag", "flag over env");
        assert!(s.shadow_mode);
        assert_eq!(s.grpc_addr, "127.0.0.1:9001".parse().unwrap());
        assert_eq!(s.max_descriptors, 64, "default");
    }

    #[test]
    fn undocumented_tollgate_variables_are_ignored() {
        let (_, vars) = from_env(env(&[
            ("TOLLGATE_PORT", "tcp://10.0.0.1:8081"),
            ("TOLLGATE_SERVICE_HOST", "10.0.0.1"),
            ("TOLLGATE_STORE", ""),
        ]));
        assert!(vars.is_empty());
        assert!(
            Settings::load(&Sources {
                env: vars,
                ..Sources::default()
            })
            .is_ok()
        );
    }

    #[test]
    fn unknown_tollgate_variables_are_named_with_the_closest_setting() {
        let names = [
            "TOLLGATE_STOR",
            "TOLLGATE_STORE",
            "TOLLGATE_CONFIG",
            "TOLLGATE_PORT",
            "TOLLGATE_SERVICE_HOST",
            "TOLLGATE_SERVICE_PORT",
            "TOLLGATE_SERVICE_PORT_GRPC",
            "TOLLGATE_PORT_8081_TCP",
            "TOLLGATE_PORT_8081_TCP_ADDR",
            "TOLLGATE_PORT_8081_TCP_PROTO",
            "TOLLGATE_ADMIN_SERVICE_HOST",
            "TOLLGATE_WHATEVER_THING",
            "HOME",
        ];
        let warnings = unknown_env_warnings(names.iter().map(|s| s.to_string()));
        assert_eq!(
            warnings,
            vec![
                "TOLLGATE_STOR is not a tollgate setting and is ignored (did you mean TOLLGATE_STORE?)",
                "TOLLGATE_WHATEVER_THING is not a tollgate setting and is ignored",
            ]
        );
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

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

    #[test]
    fn flags_are_derived_from_the_schema() {
        use clap::{Args, FromArgMatches};
        let cmd = ServeArgs::augment_args(clap::Command::new("serve"));
        let m = cmd
            .try_get_matches_from([
                "serve",
                "--store-timeout-ms",
                "7",
                "--config",
                "/x.yaml",
                "--otlp-endpoint",
                "",
            ])
            .unwrap();
        let args = ServeArgs::from_arg_matches(&m).unwrap();
        assert_eq!(args.config, Some(PathBuf::from("/x.yaml")));
        assert_eq!(
            args.flags,
            vec![
                ("store_timeout_ms", "7".to_string()),
                ("otlp_endpoint", String::new())
            ]
        );
        // Every key has its flag; nothing else is accepted.
        let cmd = ServeArgs::augment_args(clap::Command::new("serve"));
        for key in KEYS {
            let flag = format!("--{}", key.flag());
            assert!(
                cmd.clone()
                    .try_get_matches_from(["serve", &flag, "1"])
                    .is_ok(),
                "{flag}"
            );
        }
        assert!(cmd.try_get_matches_from(["serve", "--stor", "x"]).is_err());
    }

    /// The README's settings table lists exactly the schema's keys with their defaults, so the
    /// docs cannot drift from the code.
    #[test]
    fn the_readme_settings_table_matches_the_schema() {
        let readme = include_str!("../README.md");
        let section = readme
            .split("\n## Settings\n")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("README has a Settings section");
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
            "README rows vs settings schema (same order)"
        );
        for (key, default) in &rows {
            let key = KEYS.iter().find(|k| k.name == key).unwrap();
            assert_eq!(
                *default,
                key.default_text(),
                "README default of {}",
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
