//! The reference's variables that tollgate reads and that change nothing here, each with why,
//! and the naming of those that are set in one startup warning.
//!
//! Data flows one way: [`IGNORED`] and what the other steps read (the [`Reader`]) →
//! [`name_ignored`], the last step of `from_reference_env` → one `NAME (why)` line each for
//! the set variables no step read for a setting.

use super::read::Reader;

/// The xDS variables read when `CONFIG_TYPE=GRPC_XDS_SOTW` (named as ignored otherwise).
const XDS_MAPPED: &[&str] = &[
    "CONFIG_GRPC_XDS_NODE_ID",
    "CONFIG_GRPC_XDS_SERVER_URL",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
];

/// Names each variable of [`IGNORED`] that is set and was not read for a setting, in the
/// table's order. With rules over xDS, the xDS variables tollgate maps are not named (even
/// when their TLS is off), and the other xDS ones say why tollgate's client does without them.
pub(super) fn name_ignored(r: &mut Reader, from_xds: bool) {
    for (name, why) in IGNORED {
        if r.was_read(name) {
            continue;
        }
        let xds = name.starts_with("CONFIG_GRPC_XDS_") || name.starts_with("XDS_CLIENT_");
        if from_xds && XDS_MAPPED.contains(name) {
            continue;
        }
        let why = if from_xds && xds {
            "not used by tollgate's xDS client: it reconnects backing off from 0.5 s to 30 s, and the server's certificate must name the host it is reached by"
        } else {
            why
        };
        if r.peek(name).is_some() {
            r.ignore(format!("{name} ({why})"));
        }
    }
}

/// Variables that are read but change nothing here, with why (named in the startup warning
/// when set). Those that tollgate covers another way say how.
pub(super) const IGNORED: &[(&str, &str)] = &[
    ("PROTO", "tollgate listens on TCP"),
    (
        "GRPC_SERVER_TLS_CA_CERT",
        "envoyproxy/ratelimit does not read it either: the clients' CA is GRPC_CLIENT_TLS_CACERT",
    ),
    (
        "DEBUG_HOST",
        "no debug port: profiles and stats are not served",
    ),
    (
        "DEBUG_PORT",
        "no debug port: profiles and stats are not served",
    ),
    (
        "FORCE_START_WITHOUT_INITIAL_CONFIG",
        "tollgate always starts, with or without rules",
    ),
    ("CONFIG_GRPC_XDS_NODE_ID", "rules are read from files"),
    ("CONFIG_GRPC_XDS_NODE_METADATA", "rules are read from files"),
    ("CONFIG_GRPC_XDS_SERVER_URL", "rules are read from files"),
    (
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "rules are read from files",
    ),
    (
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
        "rules are read from files",
    ),
    (
        "CONFIG_GRPC_XDS_SERVER_USE_TLS",
        "rules are read from files",
    ),
    (
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        "rules are read from files",
    ),
    (
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        "rules are read from files",
    ),
    (
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        "rules are read from files",
    ),
    (
        "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        "rules are read from files",
    ),
    (
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        "rules are read from files",
    ),
    (
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        "rules are read from files",
    ),
    (
        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        "rules are read from files",
    ),
    ("XDS_CLIENT_BACKOFF_JITTER", "rules are read from files"),
    (
        "USE_DOG_STATSD",
        "metrics are Prometheus on the admin port's /metrics",
    ),
    (
        "USE_DOG_STATSD_MOGRIFIERS",
        "metrics are Prometheus on the admin port's /metrics",
    ),
    (
        "STATSD_HOST",
        "statsd is off: USE_STATSD=false, or another stats sink is named",
    ),
    (
        "STATSD_PORT",
        "statsd is off: USE_STATSD=false, or another stats sink is named",
    ),
    (
        "EXTRA_TAGS",
        "metrics are Prometheus on the admin port's /metrics",
    ),
    (
        "STATS_FLUSH_INTERVAL",
        "statsd is off: USE_STATSD=false, or another stats sink is named",
    ),
    (
        "DISABLE_STATS",
        "not true: the stats sinks are as the other variables say",
    ),
    ("RUNTIME_IGNOREDOTFILES", "dotfiles are always skipped"),
    (
        "RUNTIME_WATCH_ROOT",
        "changed rules files are found by reload_interval_ms",
    ),
    (
        "EXPIRATION_JITTER_MAX_SECONDS",
        "buckets expire when full again, no jitter needed",
    ),
    (
        "LOCAL_CACHE_SIZE_IN_BYTES",
        "the over-limit cache is sized in keys: over_limit_cache_max_keys",
    ),
    (
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
        "a refused request never spends tokens",
    ),
    (
        "LIMIT_LIMIT_HEADER",
        "the headers are RateLimit-Limit/-Remaining/-Reset and Retry-After",
    ),
    (
        "LIMIT_REMAINING_HEADER",
        "the headers are RateLimit-Limit/-Remaining/-Reset and Retry-After",
    ),
    (
        "LIMIT_RESET_HEADER",
        "the headers are RateLimit-Limit/-Remaining/-Reset and Retry-After",
    ),
    (
        "LIMIT_REQUEST_LIMIT_HEADER",
        "the upstream request's headers are RateLimit-Limit/-Remaining/-Reset",
    ),
    (
        "LIMIT_REQUEST_REMAINING_HEADER",
        "the upstream request's headers are RateLimit-Limit/-Remaining/-Reset",
    ),
    (
        "LIMIT_REQUEST_RESET_HEADER",
        "the upstream request's headers are RateLimit-Limit/-Remaining/-Reset",
    ),
    (
        "REDIS_POOL_SIZE",
        "connections are multiplexed: store_pool_size (2) is enough",
    ),
    (
        "REDIS_TIMEOUT",
        "store_timeout_ms (10 ms) decides: past it the fallback answers, Envoy would not wait seconds",
    ),
    (
        "REDIS_USE_EXPLICIT_PIPELINE",
        "calls in flight are pipelined on their own",
    ),
    (
        "REDIS_PIPELINE_WINDOW",
        "calls in flight are pipelined on their own",
    ),
    (
        "REDIS_PIPELINE_LIMIT",
        "calls in flight are pipelined on their own",
    ),
    ("REDIS_PERSECOND", "one store holds every limit"),
    ("REDIS_PERSECOND_SOCKET_TYPE", "one store holds every limit"),
    ("REDIS_PERSECOND_TYPE", "one store holds every limit"),
    ("REDIS_PERSECOND_URL", "one store holds every limit"),
    ("REDIS_PERSECOND_POOL_SIZE", "one store holds every limit"),
    ("REDIS_PERSECOND_AUTH", "one store holds every limit"),
    ("REDIS_PERSECOND_TLS", "one store holds every limit"),
    (
        "REDIS_PERSECOND_PIPELINE_WINDOW",
        "one store holds every limit",
    ),
    (
        "REDIS_PERSECOND_PIPELINE_LIMIT",
        "one store holds every limit",
    ),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "a replica is unready until Redis first answers; a later outage never fails readiness (the fallback decides)",
    ),
    (
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "Redis is retried every 50 ms doubling to 2 s, at startup and after an outage, while unready",
    ),
    (
        "REDIS_STARTUP_MAX_INTERVAL",
        "Redis is retried every 50 ms doubling to 2 s, at startup and after an outage, while unready",
    ),
    (
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        "connections are multiplexed: a call never waits for a free one",
    ),
    (
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        "each cluster node's calls are pipelined on its own connections, all nodes at once",
    ),
    (
        "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        "the response time's unit is the mapping's: seconds with the default one (a mapping file's `scale` decides)",
    ),
    ("MEMCACHE_HOST_PORT", "the store is Redis"),
    ("MEMCACHE_MAX_IDLE_CONNS", "the store is Redis"),
    ("MEMCACHE_SRV", "the store is Redis"),
    ("MEMCACHE_SRV_REFRESH", "the store is Redis"),
    ("MEMCACHE_TLS", "the store is Redis"),
    ("MEMCACHE_TLS_CLIENT_CERT", "the store is Redis"),
    ("MEMCACHE_TLS_CLIENT_KEY", "the store is Redis"),
    ("MEMCACHE_TLS_CACERT", "the store is Redis"),
    (
        "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
        "the store is Redis",
    ),
    (
        "MERGE_DOMAIN_CONFIG",
        "a domain's rules are in one file (two files of one domain are refused)",
    ),
    ("TRACING_SERVICE_NAME", "spans are named tollgate"),
    ("TRACING_SERVICE_NAMESPACE", "spans are named tollgate"),
    ("TRACING_SERVICE_INSTANCE_ID", "spans are named tollgate"),
    (
        "TRACING_SAMPLING_RATE",
        "every request is traced; the collector samples",
    ),
];
