//! The environment of envoyproxy/ratelimit (the reference), for a drop-in swap of its image:
//! started as `ratelimit` (argv[0]) or with `serve --reference-env`, tollgate reads the
//! reference's variables ([`from_reference_env`]) and maps each to its own setting.
//!
//! Data flows one way: the reference's variables → `(setting, value)` pairs, layered where the
//! `TOLLGATE_*` variables go (so those, and flags, still win and add what the reference lacks:
//! leasing, fallback, algorithms) → `Settings::load`. A variable with no tollgate meaning is
//! named in one startup warning ([`Mapped::ignored`]); a value tollgate cannot honour safely
//! (a Redis type it does not know, a unix socket to a cluster, a client-certificate SAN it
//! would not check) stops startup with the reason ([`Refused`]), because serving anyway would
//! limit other traffic than the operator configured. The variables table of
//! docs/migrating.md#coming-from-envoyproxyratelimit is this module's mapping.
//!
//! How it is laid out: a variable that sets one setting is an entry of `table.rs` (name,
//! setting, how its value is read, the reference's default); what combines variables, refuses
//! a combination or chooses among values is a small step here (listeners, rules), in
//! `redis.rs` (the store URL) or in `telemetry.rs` (traces and stats sinks); `ignored.rs`
//! names what changes nothing; `read.rs` is the reader they share; `differences.rs` says,
//! after loading, where the settings decide otherwise than the reference.

use std::time::Duration;

mod differences;
mod ignored;
mod read;
mod redis;
mod table;
mod telemetry;

pub use differences::differences;
use ignored::name_ignored;
use read::{Reader, refuse};
use table::{Group, apply};

/// The reference's variables, as tollgate settings.
#[derive(Debug, Default, PartialEq)]
pub struct Mapped {
    /// `(setting, value)`, in the schema's names.
    pub env: Vec<(&'static str, String)>,
    /// `(setting, variables)`: which of the reference's variables each setting of `env` came
    /// from, so the settings' own refusal of a value names the variable the user set.
    pub origins: Vec<(&'static str, String)>,
    /// `NAME (why)` for each reference variable that is set and has no effect here.
    pub ignored: Vec<String>,
    /// The reference variables that were set and went into `env`.
    pub read: Vec<String>,
    /// `(setting, value)` that make tollgate decide as the reference does where their own
    /// defaults differ ([`REFERENCE_DEFAULTS`]): under the settings file, so any source wins.
    pub defaults: Vec<(&'static str, String)>,
}

/// Where tollgate's defaults decide otherwise than the reference, the reference's choice:
/// started as `ratelimit`, these are the defaults (a settings file, a `TOLLGATE_*` variable
/// or a flag still changes them; [`differences`] names the ones that do).
pub const REFERENCE_DEFAULTS: &[(&str, &str)] = &[
    // The reference's only algorithm: a counter per window of the unit, reset at its end.
    ("default_algorithm", "fixed_window"),
    // The reference answers an error when Redis fails; Envoy's failure_mode_deny decides.
    ("fallback", "error"),
];

/// A reference variable whose value tollgate cannot honour safely.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("envoyproxy/ratelimit environment: {name}={value}: {why}")]
pub struct Refused {
    pub name: &'static str,
    pub value: String,
    pub why: String,
}

/// Reads the reference's variables through `get` (empty counts as unset, as in envconfig
/// with no default) and maps them, or refuses the first value that cannot be honoured.
///
/// The steps run in a fixed order, by topic, and that order is the refusals' precedence (the
/// first value refused is the one reported): each table group (`table.rs`) is read at
/// its place in it, and the hand-written steps do what a table cannot.
pub fn from_reference_env(get: impl Fn(&str) -> Option<String>) -> Result<Mapped, Refused> {
    let mut r = Reader::new(&get);
    listeners(&mut r)?;
    grpc_tls(&mut r)?;
    apply(&mut r, Group::Logs)?;
    let from_xds = rules_source(&mut r)?;
    rules_dir(&mut r);
    apply(&mut r, Group::Decisions)?;
    redis::store(&mut r)?;
    telemetry::tracing(&mut r)?;
    telemetry::stats(&mut r)?;
    name_ignored(&mut r, from_xds);
    Ok(r.finish())
}

/// The listeners: the reference's HTTP port (PORT, /healthcheck and /json) is tollgate's
/// admin port; its gRPC port is tollgate's, on TCP only.
fn listeners(r: &mut Reader) -> Result<(), Refused> {
    if let Some(uds) = r.var("GRPC_UDS") {
        return Err(refuse(
            "GRPC_UDS",
            &uds,
            "tollgate serves gRPC on TCP only: unset it and use GRPC_HOST/GRPC_PORT",
        ));
    }
    let grpc = address(r.var("GRPC_HOST"), r.var("GRPC_PORT"), "8081");
    r.set_from(&["GRPC_HOST", "GRPC_PORT"], "grpc_addr", grpc);
    let admin = address(r.var("HOST"), r.var("PORT"), "8080");
    r.set_from(&["HOST", "PORT"], "admin_addr", admin);
    apply(r, Group::Listeners)
}

/// `GRPC_SERVER_USE_TLS=true`: the server's certificate and the clients' CA. A client SAN to
/// check is refused: tollgate does not check it, and would admit clients it refuses.
fn grpc_tls(r: &mut Reader) -> Result<(), Refused> {
    if !r.flag("GRPC_SERVER_USE_TLS")?.unwrap_or(false) {
        return Ok(());
    }
    apply(r, Group::GrpcTls)?;
    if let Some(san) = r.var("GRPC_CLIENT_TLS_SAN") {
        return Err(refuse(
            "GRPC_CLIENT_TLS_SAN",
            &san,
            "tollgate does not check client certificates' SANs: it would admit clients this SAN refuses (use a client CA of their own)",
        ));
    }
    Ok(())
}

/// Where the rules come from, `CONFIG_TYPE`: files (`FILE`, the default) or an xDS server
/// (`GRPC_XDS_SOTW`, with its table groups). Whether from xDS.
fn rules_source(r: &mut Reader) -> Result<bool, Refused> {
    let config_type = r.var("CONFIG_TYPE").unwrap_or_else(|| "FILE".to_string());
    let from_xds = if config_type.eq_ignore_ascii_case("GRPC_XDS_SOTW") {
        true
    } else if config_type.eq_ignore_ascii_case("FILE") {
        false
    } else {
        return Err(refuse(
            "CONFIG_TYPE",
            &config_type,
            "not a config type: FILE or GRPC_XDS_SOTW",
        ));
    };
    if from_xds {
        apply(r, Group::Xds)?;
        if r.flag("CONFIG_GRPC_XDS_SERVER_USE_TLS")?.unwrap_or(false) {
            apply(r, Group::XdsTls)?;
        }
    }
    Ok(from_xds)
}

/// The rules' files, under RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY, as the
/// reference's runtime loader reads them.
fn rules_dir(r: &mut Reader) {
    let mut rules = std::path::PathBuf::from(
        r.var("RUNTIME_ROOT")
            .unwrap_or_else(|| "/srv/runtime_data/current".to_string()),
    );
    if let Some(sub) = r.var("RUNTIME_SUBDIRECTORY") {
        rules.push(sub);
    }
    rules.push(
        r.var("RUNTIME_APPDIRECTORY")
            .unwrap_or_else(|| "config".to_string()),
    );
    r.set_from(
        &[
            "RUNTIME_ROOT",
            "RUNTIME_SUBDIRECTORY",
            "RUNTIME_APPDIRECTORY",
        ],
        "rules",
        rules.display().to_string(),
    );
}

/// `host:port` from the reference's pair (either may be unset).
fn address(host: Option<String>, port: Option<String>, default_port: &str) -> String {
    let host = host.unwrap_or_else(|| "0.0.0.0".to_string());
    let port = port.unwrap_or_else(|| default_port.to_string());
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Go's `strconv.ParseBool`.
fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `time.ParseDuration` for what the reference's defaults use: a sequence of a number and
/// a unit (`h`, `m`, `s`, `ms`, `us`, `ns`), e.g. `24h`, `1h30m`, `500ms`; `0` alone too.
fn go_duration(v: &str) -> Option<Duration> {
    if v == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = v;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&i| i > 0)?;
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    // Go's durations are int64 nanoseconds: past about 292 years it refuses them too
    // (`go_duration_too_long` says so).
    if total > GO_MAX_DURATION_S {
        return None;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// Whether `v` is refused by [`go_duration`] only for being longer than Go's durations go.
fn go_duration_too_long(v: &str) -> bool {
    go_duration(v).is_none()
        && v.trim_end_matches(|c: char| c.is_ascii_alphabetic() || c == 'µ')
            .chars()
            .all(|c| c.is_ascii_digit() || c == '.')
        && v.chars().next().is_some_and(|c| c.is_ascii_digit())
        && v.ends_with(['h', 'm', 's'])
}

/// The longest duration Go's `time.ParseDuration` takes (2^63 − 1 ns, about 292 years, or
/// 2562047h47m16.854775807s), in seconds.
const GO_MAX_DURATION_S: f64 = 9_223_372_036.854_775;

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::settings::{Settings, Sources};

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        let map: HashMap<&str, &str> = vars.iter().copied().collect();
        move |k| map.get(k).map(|v| v.to_string())
    }

    /// What Envoy Gateway's rate-limit Deployment sets (v1.8), with rules from files.
    #[test]
    fn envoy_gateways_variables_map_to_settings_that_load() {
        let mapped = from_reference_env(env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.infra:6379"),
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("LOG_LEVEL", "info"),
            ("USE_STATSD", "false"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
            ("GRPC_CLIENT_TLS_CACERT", "/certs/ca.crt"),
        ]))
        .unwrap();
        let get = |k: &str| {
            mapped
                .env
                .iter()
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("store"), Some("redis://redis.infra:6379"));
        assert_eq!(get("rules"), Some("/data/ratelimit/config"));
        assert_eq!(get("grpc_addr"), Some("0.0.0.0:8081"));
        assert_eq!(get("admin_addr"), Some("0.0.0.0:8080"));
        assert_eq!(get("grpc_tls_client_ca"), Some("/certs/ca.crt"));
        assert_eq!(get("log_level"), Some("info"));
        assert_eq!(
            mapped.ignored,
            vec![
                "FORCE_START_WITHOUT_INITIAL_CONFIG (tollgate always starts, with or without rules)",
                "RUNTIME_IGNOREDOTFILES (dotfiles are always skipped)",
                "RUNTIME_WATCH_ROOT (changed rules files are found by reload_interval_ms)",
            ]
        );
        // The settings themselves validate (the TLS files are read later, at startup).
        let s = Settings::load(&Sources {
            env: mapped.env,
            ..Sources::default()
        })
        .unwrap();
        assert_eq!(s.grpc_tls_cert, "/certs/tls.crt");
    }

    /// Every variable Envoy Gateway's rate-limit Deployment sets (v1.8, rules over xDS with
    /// mutual TLS, Redis over TLS), each read for a setting or named in the warning.
    const ENVOY_GATEWAY: &[(&str, &str)] = &[
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", "redis.infra:6379"),
        ("REDIS_TLS", "true"),
        ("REDIS_TLS_CLIENT_CERT", "/redis-certs/tls.crt"),
        ("REDIS_TLS_CLIENT_KEY", "/redis-certs/tls.key"),
        ("RUNTIME_ROOT", "/data"),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_IGNOREDOTFILES", "true"),
        ("RUNTIME_WATCH_ROOT", "false"),
        ("LOG_LEVEL", "info"),
        ("USE_STATSD", "false"),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
        ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ];

    /// The reference's choices are the defaults of this mode, under every source: a settings
    /// file still changes them. `REDIS_STARTUP_MAX_ELAPSED_TIME` is the startup give-up time,
    /// and the startup variables tollgate does not map are named.
    #[test]
    fn the_references_choices_are_defaults_any_source_changes() {
        let mapped = from_reference_env(env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "r:6379"),
            ("REDIS_STARTUP_MAX_ELAPSED_TIME", "5m"),
            ("REDIS_STARTUP_INITIAL_INTERVAL", "1s"),
            ("REDIS_POOL_ON_EMPTY_BEHAVIOR", "WAIT"),
            ("REDIS_CLUSTER_PIPELINE_PARALLELISM", "4"),
            ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "true"),
        ]))
        .unwrap();
        for name in [
            "REDIS_STARTUP_INITIAL_INTERVAL",
            "REDIS_POOL_ON_EMPTY_BEHAVIOR",
            "REDIS_CLUSTER_PIPELINE_PARALLELISM",
            "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
        ] {
            assert!(
                mapped
                    .ignored
                    .iter()
                    .any(|w| w.starts_with(&format!("{name} ("))),
                "{name}: {:?}",
                mapped.ignored
            );
        }
        let s = Settings::load(&Sources {
            env: mapped.env.clone(),
            defaults: mapped.defaults.clone(),
            ..Sources::default()
        })
        .unwrap();
        assert_eq!(s.default_algorithm, crate::rules::Algorithm::FixedWindow);
        assert_eq!(s.fallback, crate::rules::FallbackMode::Error);
        assert_eq!(s.store_startup_timeout_ms, 300_000);
        assert!(s.unready_until_store_answers);
        assert!(differences(&s).is_empty(), "{:?}", differences(&s));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("s.yaml");
        std::fs::write(&file, "fallback: local\n").unwrap();
        let s = Settings::load(&Sources {
            file: Some(file),
            env: mapped.env,
            defaults: mapped.defaults,
            ..Sources::default()
        })
        .unwrap();
        assert_eq!(s.fallback, crate::rules::FallbackMode::Local);
        assert_eq!(
            differences(&s)
                .iter()
                .map(|d| d.setting)
                .collect::<Vec<_>>(),
            ["fallback"]
        );
        assert!(
            from_reference_env(env(&[("REDIS_STARTUP_MAX_ELAPSED_TIME", "soon")]))
                .unwrap_err()
                .to_string()
                .contains("REDIS_STARTUP_MAX_ELAPSED_TIME=soon")
        );
    }

    #[test]
    fn every_variable_envoy_gateway_sets_is_read_or_named() {
        let mapped = from_reference_env(env(ENVOY_GATEWAY)).unwrap();
        for (name, _) in ENVOY_GATEWAY {
            let read = mapped.read.iter().any(|r| r == name);
            let named = mapped
                .ignored
                .iter()
                .any(|w| w.starts_with(&format!("{name} (")));
            assert!(read ^ named, "{name}: read {read}, named {named}");
        }
        let s = Settings::load(&Sources {
            env: mapped.env,
            ..Sources::default()
        })
        .unwrap();
        assert_eq!(s.store, "rediss://redis.infra:6379");
        assert_eq!(s.store_tls_cert, "/redis-certs/tls.crt");
        assert_eq!(s.rules_xds_server, "envoy-gateway:18001");
        assert_eq!(s.rules_xds_node_id, "envoy-ratelimit");
        assert_eq!(
            (
                s.rules_xds_tls_ca.as_str(),
                s.rules_xds_tls_cert.as_str(),
                s.rules_xds_tls_key.as_str()
            ),
            ("/certs/ca.crt", "/certs/tls.crt", "/certs/tls.key")
        );
        // As in the reference, which reads the clients' CA from GRPC_CLIENT_TLS_CACERT only.
        assert_eq!(s.grpc_tls_client_ca, "");
        assert_eq!(s.grpc_tls_cert, "/certs/tls.crt");
    }

    #[test]
    fn redis_types_auth_and_tls_map_to_the_store_url() {
        let base = [("REDIS_SOCKET_TYPE", "tcp")];
        let store = |extra: &[(&str, &str)]| {
            let vars: Vec<(&str, &str)> = base.iter().chain(extra).copied().collect();
            let mapped = from_reference_env(env(&vars)).unwrap();
            let value = |k: &str| {
                mapped
                    .env
                    .iter()
                    .find(|(key, _)| *key == k)
                    .map(|(_, v)| v.clone())
            };
            (
                value("store"),
                value("store_username"),
                value("store_password"),
            )
        };
        // The reference's defaults: its nutcracker sidecar's socket.
        let unix = from_reference_env(env(&[])).unwrap();
        assert!(
            unix.env.contains(&(
                "store",
                "redis+unix:///var/run/nutcracker/ratelimit.sock".into()
            )),
            "{:?}",
            unix.env
        );
        let sock = from_reference_env(env(&[
            ("REDIS_SOCKET_TYPE", "unix"),
            ("REDIS_URL", "/run/redis.sock"),
            ("REDIS_AUTH", "pw"),
        ]))
        .unwrap();
        assert!(
            sock.env
                .contains(&("store", "redis+unix:///run/redis.sock".into()))
                && sock.env.contains(&("store_password", "pw".into())),
            "{:?}",
            sock.env
        );
        assert_eq!(
            store(&[
                ("REDIS_URL", "a:1,b:2"),
                ("REDIS_TYPE", "cluster"),
                ("REDIS_TLS", "true")
            ])
            .0
            .unwrap(),
            "rediss+cluster://a:1,b:2"
        );
        assert_eq!(
            store(&[
                ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
                ("REDIS_TYPE", "SENTINEL")
            ])
            .0
            .unwrap(),
            "redis+sentinel://s1:26379,s2:26379/mymaster"
        );
        let (_, user, password) = store(&[("REDIS_URL", "r:6379"), ("REDIS_AUTH", "app:s3cret")]);
        assert_eq!(
            (user.as_deref(), password.as_deref()),
            (Some("app"), Some("s3cret"))
        );
        let (_, user, password) = store(&[("REDIS_URL", "r:6379"), ("REDIS_AUTH", "s3cret")]);
        assert_eq!((user, password.as_deref()), (None, Some("s3cret")));
    }

    #[test]
    fn values_that_cannot_be_honoured_stop_startup_with_the_reason() {
        let refused = |vars: &[(&str, &str)]| from_reference_env(env(vars)).unwrap_err();
        // Unix sockets: one Redis, no TLS, an absolute path.
        let unix = ("REDIS_SOCKET_TYPE", "unix");
        let e = refused(&[unix, ("REDIS_TYPE", "CLUSTER"), ("REDIS_URL", "/r.sock")]);
        assert_eq!(e.name, "REDIS_SOCKET_TYPE");
        assert!(e.to_string().contains("REDIS_SOCKET_TYPE=tcp"), "{e}");
        assert_eq!(
            refused(&[unix, ("REDIS_TLS", "true")]).name,
            "REDIS_SOCKET_TYPE"
        );
        assert_eq!(refused(&[unix, ("REDIS_URL", "r:6379")]).name, "REDIS_URL");
        assert_eq!(
            refused(&[("REDIS_SOCKET_TYPE", "udp")]).name,
            "REDIS_SOCKET_TYPE"
        );
        let tcp = ("REDIS_SOCKET_TYPE", "tcp");
        let url = ("REDIS_URL", "r:6379");
        assert_eq!(refused(&[tcp]).name, "REDIS_URL");
        let e = refused(&[tcp, url, ("REDIS_TYPE", "CLUSTERED")]);
        assert_eq!(
            e.to_string(),
            "envoyproxy/ratelimit environment: REDIS_TYPE=CLUSTERED: not a Redis type: SINGLE, CLUSTER or SENTINEL"
        );
        for (extra, name) in [
            (&[("CONFIG_TYPE", "GRPC_XDS")][..], "CONFIG_TYPE"),
            (&[("BACKEND_TYPE", "memcache")], "BACKEND_TYPE"),
            (&[("GRPC_UDS", "/tmp/rl.sock")], "GRPC_UDS"),
            (&[("SHADOW_MODE", "yes")], "SHADOW_MODE"),
            (
                &[
                    ("GRPC_SERVER_USE_TLS", "true"),
                    ("GRPC_CLIENT_TLS_SAN", "envoy"),
                ],
                "GRPC_CLIENT_TLS_SAN",
            ),
            (
                &[
                    ("REDIS_TLS", "true"),
                    ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
                ],
                "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
            ),
        ] {
            let vars: Vec<(&str, &str)> = [tcp, url].iter().chain(extra).copied().collect();
            assert_eq!(refused(&vars).name, name, "{extra:?}");
        }
        // The skip maps onto the name to expect, with a warning, when that name is given.
        let e = refused(&[
            tcp,
            url,
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
        ]);
        assert!(
            e.to_string().contains("TOLLGATE_STORE_TLS_SERVER_NAME"),
            "{e}"
        );
        let named = from_reference_env(env(&[
            tcp,
            url,
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
            ("TOLLGATE_STORE_TLS_SERVER_NAME", "redis.example.com"),
        ]))
        .unwrap();
        assert!(
            named
                .ignored
                .iter()
                .any(|w| w.contains("TOLLGATE_STORE_TLS_SERVER_NAME=redis.example.com")),
            "{:?}",
            named.ignored
        );
    }

    #[test]
    fn durations_and_the_rest_map_as_the_reference_reads_them() {
        let mapped = from_reference_env(env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "r:6379"),
            ("GRPC_MAX_CONNECTION_AGE", "1h30m"),
            ("GRPC_MAX_CONNECTION_AGE_GRACE", "500ms"),
            ("GRPC_PORT", "9081"),
            ("HOST", "::1"),
            ("LOG_LEVEL", "WARNING"),
            ("LOG_FORMAT", "JSON"),
            ("SHADOW_MODE", "1"),
            ("QUOTA_MODE", "true"),
            ("RESPONSE_DYNAMIC_METADATA", "t"),
            ("NEAR_LIMIT_RATIO", "0.9"),
            ("CACHE_KEY_PREFIX", "rl_"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_REQUEST_HEADERS_ENABLED", "true"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
            ("STATSD_HOST", "localhost"),
        ]))
        .unwrap();
        let s = Settings::load(&Sources {
            env: mapped.env,
            ..Sources::default()
        })
        .unwrap();
        assert_eq!(s.grpc_max_connection_age_ms, 5_400_000);
        assert_eq!(s.grpc_max_connection_age_grace_ms, 500);
        assert_eq!(s.grpc_addr, "0.0.0.0:9081".parse().unwrap());
        assert_eq!(s.admin_addr, "[::1]:8080".parse().unwrap());
        assert_eq!(s.log_level, "warn");
        assert_eq!(s.log_format, crate::telemetry::LogFormat::Json);
        assert!(s.shadow_mode && s.response_headers && s.unready_without_rules);
        assert!(s.request_headers);
        assert!(s.quota_mode && s.response_dynamic_metadata);
        assert_eq!(s.near_limit_ratio, 0.9);
        assert_eq!(s.key_prefix, "rl_");
        assert_eq!(
            s.rules,
            std::path::PathBuf::from("/srv/runtime_data/current/config")
        );
        // statsd is on by default, as in the reference, over TCP.
        assert!(mapped.ignored.is_empty(), "{:?}", mapped.ignored);
        assert_eq!(s.statsd_addr, "tcp://localhost:8125");
        assert_eq!(go_duration("24h"), Some(Duration::from_secs(86_400)));
        assert_eq!(go_duration("1.5s"), Some(Duration::from_millis(1_500)));
        assert_eq!(go_duration("10"), None);
        assert_eq!(go_duration("5x"), None);
        // Past Go's range (2^63 ns) Go refuses it; so does this, and without a panic.
        assert_eq!(
            go_duration("2562047h"),
            Some(Duration::from_secs(2_562_047 * 3600))
        );
        assert_eq!(go_duration("2562048h"), None);
        assert_eq!(go_duration("99999999999999999999h"), None);
        assert!(go_duration_too_long("99999999999999999999h"));
        assert!(!go_duration_too_long("5x"));
    }

    #[test]
    fn statsd_maps_as_the_reference_sends_it() {
        let load = |vars: &[(&str, &str)]| {
            let mut all = vec![("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "r:6379")];
            all.extend_from_slice(vars);
            let mapped = from_reference_env(env(&all))?;
            let s = Settings::load(&Sources {
                env: mapped.env,
                ..Sources::default()
            })
            .unwrap();
            Ok::<_, Refused>((s.statsd_addr, s.statsd_flush_interval_ms, mapped.ignored))
        };
        let (addr, every, ignored) = load(&[
            ("STATSD_HOST", "statsd.infra"),
            ("STATSD_PORT", "9125"),
            ("STATS_FLUSH_INTERVAL", "1.5s"),
        ])
        .unwrap();
        assert_eq!((addr.as_str(), every), ("tcp://statsd.infra:9125", 1_500));
        assert!(ignored.is_empty(), "{ignored:?}");
        // Off: the variables it would read are named, and nothing is sent.
        let (addr, _, ignored) = load(&[("USE_STATSD", "false"), ("STATSD_PORT", "9125")]).unwrap();
        assert_eq!(addr, "");
        assert_eq!(
            ignored,
            vec!["STATSD_PORT (statsd is off: USE_STATSD=false, or another stats sink is named)"]
        );
        let (addr, _, ignored) = load(&[("DISABLE_STATS", "true")]).unwrap();
        assert_eq!(addr, "");
        assert!(ignored.is_empty(), "acted on, not ignored: {ignored:?}");
        let (addr, _, ignored) = load(&[("DISABLE_STATS", "false")]).unwrap();
        assert_eq!(addr, "tcp://localhost:8125");
        assert_eq!(
            ignored,
            vec!["DISABLE_STATS (not true: the stats sinks are as the other variables say)"]
        );
        // Envoy Gateway's telemetry: Prometheus, with statsd off, on its own port.
        let mapped = from_reference_env(env(&[
            ("USE_STATSD", "false"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001"),
            ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
        ]))
        .unwrap();
        let get = |k: &str| {
            mapped
                .env
                .iter()
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("statsd_addr"), None);
        assert_eq!(get("prometheus_addr"), Some("0.0.0.0:19001"));
        assert_eq!(
            get("prometheus_mapper"),
            Some("/etc/statsd-exporter/conf.yaml")
        );
        assert!(mapped.ignored.is_empty(), "{:?}", mapped.ignored);
        let localhost = from_reference_env(env(&[
            ("USE_STATSD", "false"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", "localhost:9090"),
        ]))
        .unwrap();
        assert!(
            localhost
                .env
                .contains(&("prometheus_addr", "127.0.0.1:9090".to_string())),
            "{:?}",
            localhost.env
        );
        // DISABLE_STATS wins, as there; two sinks stop startup, as there.
        let disabled = from_reference_env(env(&[
            ("USE_STATSD", "false"),
            ("USE_PROMETHEUS", "true"),
            ("DISABLE_STATS", "true"),
        ]))
        .unwrap();
        assert!(!disabled.env.iter().any(|(k, _)| *k == "prometheus_addr"));
        let e = from_reference_env(env(&[
            ("USE_STATSD", "false"),
            ("USE_PROMETHEUS", "true"),
            ("USE_DOG_STATSD", "true"),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("one stats sink"), "{e}");
        // Without USE_PROMETHEUS its address changes nothing, and says so.
        let mapped = from_reference_env(env(&[("PROMETHEUS_ADDR", ":19001")])).unwrap();
        assert!(
            mapped
                .ignored
                .iter()
                .any(|w| w.starts_with("PROMETHEUS_ADDR (")),
            "{:?}",
            mapped.ignored
        );
        // Two sinks stop the reference, and tollgate.
        let e = load(&[("USE_PROMETHEUS", "true")]).unwrap_err().to_string();
        assert!(
            e.contains("USE_PROMETHEUS") && e.contains("USE_STATSD=false"),
            "{e}"
        );
        let e = load(&[("STATS_FLUSH_INTERVAL", "0s")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("STATS_FLUSH_INTERVAL"), "{e}");
    }

    /// Every variable of the reference's environment, with any value a user could write (huge
    /// and negative numbers, durations past Go's range, typos of booleans and log levels, any
    /// text): the mapping and the settings' load never panic, and a refusal names the variable
    /// the user set (the issue: `99999999999999999999h` panicked, `LOG_LEVEL=warnings`
    /// silenced every line, a large `STATS_FLUSH_INTERVAL` named only tollgate's setting).
    mod any_value {
        use super::*;
        use crate::settings::ServeArgs;
        use proptest::prelude::*;

        /// The table's variables, the ignored ones and those the hand-written steps read.
        fn names() -> Vec<&'static str> {
            let mut names: Vec<&'static str> = table::TABLE.iter().map(|e| e.name).collect();
            names.extend(ignored::IGNORED.iter().map(|(n, _)| *n));
            names.extend([
                "BACKEND_TYPE",
                "CONFIG_TYPE",
                "DISABLE_STATS",
                "GRPC_CLIENT_TLS_SAN",
                "GRPC_HOST",
                "GRPC_PORT",
                "GRPC_UDS",
                "HOST",
                "PORT",
                "REDIS_AUTH",
                "REDIS_TYPE",
                "REDIS_URL",
                "RUNTIME_APPDIRECTORY",
                "RUNTIME_ROOT",
                "RUNTIME_SUBDIRECTORY",
                "STATSD_PORT",
                "REDIS_SOCKET_TYPE",
                "USE_STATSD",
                "USE_PROMETHEUS",
                "LOG_LEVEL",
            ]);
            names.sort_unstable();
            names.dedup();
            names
        }

        fn value() -> impl Strategy<Value = String> {
            prop_oneof![
                "[0-9]{1,25}(\\.[0-9]{1,3})?(h|m|s|ms|us|ns|µs|d|x)?",
                "-?[0-9]{1,22}",
                "(1h30m|0|0s|-1s|1e9s|.5s|5m5|h|)",
                "(true|false|TRUE|True|t|f|1|0|yes|no|on)",
                "(trace|debug|info|warn|warning|error|fatal|panic|warnings|WARN|Info|verbose)",
                "(tcp|unix|single|sentinel|cluster|FILE|GRPC_XDS_SOTW|json|text)",
                "[a-z0-9:/.@_-]{0,30}",
                ".{0,40}",
            ]
        }

        /// The cases, every time: each duration variable past Go's range, a large
        /// flush interval, a mistyped log level.
        #[test]
        fn the_reported_values_are_refused_by_name() {
            for (name, value, says) in [
                (
                    "REDIS_STARTUP_MAX_ELAPSED_TIME",
                    "99999999999999999999h",
                    "longer than a Go duration",
                ),
                (
                    "GRPC_MAX_CONNECTION_AGE",
                    "99999999999999999999h",
                    "longer than a Go duration",
                ),
                (
                    "GRPC_MAX_CONNECTION_AGE_GRACE",
                    "99999999999999999999h",
                    "longer than a Go duration",
                ),
                (
                    "STATS_FLUSH_INTERVAL",
                    "99999999999999999999h",
                    "longer than a Go duration",
                ),
                ("STATS_FLUSH_INTERVAL", "2h", "must be from 1 to 3600000"),
                ("LOG_LEVEL", "warnings", "not a log level"),
                ("PORT", "99999", "admin_addr"),
                // A URL where the reference takes host:port, and host:port with the socket type
                // left at the reference's default, unix: each says what to write instead.
                (
                    "REDIS_URL",
                    "redis://127.0.0.1:16379",
                    "with no redis:// in front",
                ),
                (
                    "REDIS_SOCKET_TYPE",
                    "",
                    "unix is the reference's default when REDIS_SOCKET_TYPE is unset): for host:port set REDIS_SOCKET_TYPE=tcp",
                ),
            ] {
                let mut vars = vec![
                    ("REDIS_SOCKET_TYPE", "tcp"),
                    ("REDIS_URL", "127.0.0.1:6379"),
                ];
                vars.retain(|(k, _)| *k != name);
                vars.push((name, value));
                let get = |k: &str| {
                    vars.iter()
                        .find(|(n, _)| *n == k)
                        .map(|(_, v)| v.to_string())
                };
                let sources = ServeArgs {
                    reference_env: true,
                    ..ServeArgs::default()
                }
                .sources(get);
                let e = Settings::load(&sources).unwrap_err().to_string();
                assert!(e.contains(name) && e.contains(says), "{name}={value}: {e}");
            }
        }

        proptest! {
            #![proptest_config(crate::testing::proptest_config(1_024))]
            #[test]
            fn any_value_of_any_variable_is_mapped_or_refused_by_its_name(
                which in any::<prop::sample::Index>(),
                value in value(),
            ) {
                let names = names();
                let name = names[which.index(names.len())];
                let mut vars = vec![("REDIS_SOCKET_TYPE", "tcp".to_string()), ("REDIS_URL", "127.0.0.1:6379".to_string())];
                vars.retain(|(k, _)| *k != name);
                vars.push((name, value.clone()));
                let get = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
                // A refusal names the variable that varies; where it is refused for what it
                // makes of another variable, that one too (`REDIS_TYPE=sentinel` refuses the
                // `REDIS_URL` that is not a Sentinel list: `make explore` found that one).
                let names_a_set_variable = |text: &str| {
                    text.contains(name)
                        || (matches!(name, "REDIS_TYPE" | "REDIS_SOCKET_TYPE" | "REDIS_TLS")
                            && text.contains("REDIS_URL"))
                };
                match from_reference_env(get) {
                    Err(refused) => prop_assert!(
                        names_a_set_variable(&refused.to_string()),
                        "{name}={value:?}: refused without naming it: {refused}"
                    ),
                    Ok(_) => {
                        let sources = ServeArgs { reference_env: true, ..ServeArgs::default() }.sources(get);
                        if let Err(e) = Settings::load(&sources) {
                            prop_assert!(
                                names_a_set_variable(&e.to_string()),
                                "{name}={value:?}: the settings refused it without naming it: {e}"
                            );
                        }
                    }
                }
            }
        }
    }
}
