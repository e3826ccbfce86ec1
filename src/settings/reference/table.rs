//! The reference's variables that map one to one onto a tollgate setting, declared as a table
//! the way the reference declares its environment (struct tags `envconfig:"NAME"
//! default:"…"` in its `src/settings/settings.go`): which variable, which setting, how its
//! value is read, and the default where tollgate sets the setting even when it is unset.
//!
//! Data flows one way: [`TABLE`] → [`apply`], called once per [`Group`] by the steps of
//! [`from_reference_env`](super::from_reference_env) at the place that group is read, and only
//! where its condition holds (`GRPC_SERVER_USE_TLS=true`, …) → each set variable's value,
//! converted, as a `(setting, value)` pair of the [`Reader`]; a value that cannot be converted
//! is refused. What combines several variables, refuses a combination or chooses among
//! values (the listeners' addresses, the rules' path, the store URL, the stats sinks) stays
//! hand-written in the steps.

use super::read::{Reader, bool_value, refuse};
use super::{Refused, go_duration, go_duration_too_long};

/// Where a table entry is read. Each group is applied at one place of the reading, and the
/// first value refused is the one reported: so a group's place, not only its condition,
/// decides which of two bad values is named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Group {
    /// After the gRPC and admin addresses.
    Listeners,
    /// With `GRPC_SERVER_USE_TLS=true`.
    GrpcTls,
    Logs,
    /// With `CONFIG_TYPE=GRPC_XDS_SOTW`.
    Xds,
    /// With `CONFIG_TYPE=GRPC_XDS_SOTW` and `CONFIG_GRPC_XDS_SERVER_USE_TLS=true`.
    XdsTls,
    /// Readiness and how answers are decided, after the rules' path.
    Decisions,
    /// After the Redis address, before its type and TLS.
    StoreStartup,
    /// After the store URL and `REDIS_AUTH`.
    Store,
    /// With `REDIS_TLS=true`.
    StoreTls,
    /// With statsd on (`USE_STATSD`, its default, and no `DISABLE_STATS`).
    Statsd,
    /// With the reference's Prometheus port on (`USE_PROMETHEUS=true`, statsd off).
    Prometheus,
}

/// How a variable's value becomes its setting's.
#[derive(Clone, Copy, Debug)]
pub(super) enum Parse {
    /// As given.
    Text,
    /// Lowercased: the reference takes `JSON` as `json`.
    Lowercase,
    /// Lowercased, with Go's `warning` as tollgate's `warn`.
    LogLevel,
    /// Go's `strconv.ParseBool`, as `true` or `false`.
    Bool,
    /// Go's `time.ParseDuration`, in milliseconds; refused with this reason.
    Millis(&'static str),
    /// The same, above 0.
    MillisAboveZero(&'static str),
    /// Go's listen address: `:port` is every interface (`0.0.0.0:port`), `localhost` is
    /// loopback (`127.0.0.1:port`); anything else as given.
    ListenAddr,
}

/// One reference variable that sets one tollgate setting.
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry {
    /// The reference's variable.
    pub name: &'static str,
    /// The setting, in the schema's names.
    pub setting: &'static str,
    pub group: Group,
    pub parse: Parse,
    /// The reference's default, used when the variable is unset (converted as a value is);
    /// without one an unset variable leaves the setting to the other sources.
    pub default: Option<&'static str>,
}

impl Entry {
    const fn new(name: &'static str, setting: &'static str, group: Group, parse: Parse) -> Self {
        Entry {
            name,
            setting,
            group,
            parse,
            default: None,
        }
    }

    /// The same entry with the reference's default.
    const fn or(self, default: &'static str) -> Self {
        Entry {
            default: Some(default),
            ..self
        }
    }
}

use Group::*;
use Parse::*;

/// The regular mappings, in the order their groups are read; within a group, the order in
/// which the settings are set.
pub(super) const TABLE: &[Entry] = &[
    // GoAway after this long, so Envoy spreads over replicas added later.
    Entry::new(
        "GRPC_MAX_CONNECTION_AGE",
        "grpc_max_connection_age_ms",
        Listeners,
        Millis("not a duration such as 24h or 90s"),
    ),
    Entry::new(
        "GRPC_MAX_CONNECTION_AGE_GRACE",
        "grpc_max_connection_age_grace_ms",
        Listeners,
        Millis("not a duration such as 1h or 10s"),
    ),
    Entry::new("GRPC_SERVER_TLS_CERT", "grpc_tls_cert", GrpcTls, Text),
    Entry::new("GRPC_SERVER_TLS_KEY", "grpc_tls_key", GrpcTls, Text),
    // The clients' CA, from here only as in the reference (not GRPC_SERVER_TLS_CA_CERT).
    Entry::new(
        "GRPC_CLIENT_TLS_CACERT",
        "grpc_tls_client_ca",
        GrpcTls,
        Text,
    ),
    Entry::new("LOG_LEVEL", "log_level", Logs, LogLevel),
    Entry::new("LOG_FORMAT", "log_format", Logs, Lowercase),
    // Over xDS the reference's defaults stand even unset: tollgate's own are empty (off).
    Entry::new("CONFIG_GRPC_XDS_SERVER_URL", "rules_xds_server", Xds, Text).or("localhost:18000"),
    Entry::new("CONFIG_GRPC_XDS_NODE_ID", "rules_xds_node_id", Xds, Text).or("default"),
    Entry::new(
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
        "rules_xds_tls_ca",
        XdsTls,
        Text,
    ),
    Entry::new(
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        "rules_xds_tls_cert",
        XdsTls,
        Text,
    ),
    Entry::new(
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        "rules_xds_tls_key",
        XdsTls,
        Text,
    ),
    Entry::new(
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        "unready_without_rules",
        Decisions,
        Bool,
    ),
    // A number: the settings check its range (above 0, at most 1).
    Entry::new("NEAR_LIMIT_RATIO", "near_limit_ratio", Decisions, Text),
    Entry::new("CACHE_KEY_PREFIX", "key_prefix", Decisions, Text),
    Entry::new("SHADOW_MODE", "shadow_mode", Decisions, Bool),
    Entry::new("QUOTA_MODE", "quota_mode", Decisions, Bool),
    Entry::new(
        "LIMIT_RESPONSE_HEADERS_ENABLED",
        "response_headers",
        Decisions,
        Bool,
    ),
    Entry::new(
        "LIMIT_REQUEST_HEADERS_ENABLED",
        "request_headers",
        Decisions,
        Bool,
    ),
    Entry::new(
        "RESPONSE_DYNAMIC_METADATA",
        "response_dynamic_metadata",
        Decisions,
        Bool,
    ),
    // The reference retries Redis at startup with back-off and opens no port until it
    // answers (since May 2026; it panicked before): tollgate listens, unready, until then
    // (unready_until_store_answers), and gives up, as the reference does, only when told to.
    Entry::new(
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        "store_startup_timeout_ms",
        StoreStartup,
        Millis("not a duration such as 5m or 0 (for ever)"),
    ),
    Entry::new(
        "REDIS_SENTINEL_AUTH",
        "store_sentinel_password",
        Store,
        Text,
    ),
    Entry::new("REDIS_TLS_CACERT", "store_tls_ca", StoreTls, Text),
    Entry::new("REDIS_TLS_CLIENT_CERT", "store_tls_cert", StoreTls, Text),
    Entry::new("REDIS_TLS_CLIENT_KEY", "store_tls_key", StoreTls, Text),
    Entry::new(
        "STATS_FLUSH_INTERVAL",
        "statsd_flush_interval_ms",
        Statsd,
        MillisAboveZero("not a duration above 0 such as 10s or 500ms"),
    ),
    // Its own port, `/metrics` by default; tollgate's own metrics stay on the admin port.
    Entry::new("PROMETHEUS_ADDR", "prometheus_addr", Prometheus, ListenAddr).or(":9090"),
    Entry::new("PROMETHEUS_PATH", "prometheus_path", Prometheus, Text),
    Entry::new(
        "PROMETHEUS_MAPPER_YAML",
        "prometheus_mapper",
        Prometheus,
        Text,
    ),
];

/// Sets the setting of each entry of `group` whose variable is set (or has a default), in
/// the table's order; refuses the first value that cannot be converted.
pub(super) fn apply(r: &mut Reader, group: Group) -> Result<(), Refused> {
    for entry in TABLE.iter().filter(|e| e.group == group) {
        let Some(value) = r
            .var(entry.name)
            .or_else(|| entry.default.map(str::to_string))
        else {
            continue;
        };
        let value = entry.parse.value(entry.name, value)?;
        r.set_from(&[entry.name], entry.setting, value);
    }
    Ok(())
}

/// The variables of `group`, in the table's order.
pub(super) fn names(group: Group) -> impl Iterator<Item = &'static str> {
    TABLE
        .iter()
        .filter(move |e| e.group == group)
        .map(|e| e.name)
}

impl Parse {
    /// `value` of the variable `name`, as its setting takes it.
    fn value(self, name: &'static str, value: String) -> Result<String, Refused> {
        let millis = |why: &str, above_zero: bool| {
            if go_duration_too_long(&value) {
                return Err(refuse(
                    name,
                    &value,
                    "longer than a Go duration can be (2562047h, about 292 years)",
                ));
            }
            go_duration(&value)
                .filter(|d| !(above_zero && d.is_zero()))
                .map(|d| d.as_millis().to_string())
                .ok_or_else(|| refuse(name, &value, why))
        };
        Ok(match self {
            Text => value,
            Lowercase => value.to_ascii_lowercase(),
            // logrus's levels, as the reference's `logger.ParseLevel` takes them (it stops on
            // anything else; as a tollgate filter, `warnings` would silence every line).
            LogLevel => match value.to_ascii_lowercase().as_str() {
                "warning" | "warn" => "warn".to_string(),
                "panic" | "fatal" | "error" => "error".to_string(),
                level @ ("info" | "debug" | "trace") => level.to_string(),
                _ => {
                    return Err(refuse(
                        name,
                        &value,
                        "not a log level: trace, debug, info, warn (or warning), error, fatal or panic",
                    ));
                }
            },
            Bool => bool_value(name, &value)?.to_string(),
            Millis(why) => millis(why, false)?,
            MillisAboveZero(why) => millis(why, true)?,
            ListenAddr => match value.rsplit_once(':') {
                Some(("", port)) => format!("0.0.0.0:{port}"),
                Some(("localhost", port)) => format!("127.0.0.1:{port}"),
                _ => value,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::KEYS;

    /// Every entry sets a setting of the schema, and each variable has one entry.
    #[test]
    fn every_entry_names_a_setting_once() {
        for (i, entry) in TABLE.iter().enumerate() {
            assert!(
                KEYS.iter().any(|k| k.name == entry.setting),
                "{}: {} is not a setting",
                entry.name,
                entry.setting
            );
            assert!(
                !TABLE[..i].iter().any(|e| e.name == entry.name),
                "{} twice",
                entry.name
            );
        }
    }
}
