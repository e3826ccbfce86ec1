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

use crate::rules::Algorithm;

/// Every setting: (key, help). The README's settings table lists the same.
pub const KEYS: &[(&str, &str)] = &[
    ("rules", "rules file or directory of *.yaml/*.yml files"),
    ("grpc_addr", "address of the Envoy RateLimitService (gRPC)"),
    (
        "admin_addr",
        "address of the admin HTTP port (/healthz /readyz /metrics /config /json)",
    ),
    (
        "store",
        "`memory`, or redis://… / redis+cluster://… (see README)",
    ),
    (
        "default_algorithm",
        "token_bucket, fixed_window or sliding_window, for limits that name none",
    ),
    (
        "shadow_mode",
        "global shadow mode: the overall code is always OK",
    ),
    (
        "response_headers",
        "add RateLimit-* and Retry-After to responses",
    ),
    ("key_prefix", "prefix of every store key"),
    ("store_pool_size", "connections to the store"),
    (
        "store_connect_timeout_ms",
        "timeout to connect to the store",
    ),
    ("store_timeout_ms", "timeout of one store call"),
    ("max_descriptors", "most descriptors in one request"),
    ("max_entries", "most entries in one descriptor"),
    ("max_key_bytes", "longest descriptor key"),
    ("max_value_bytes", "longest descriptor value"),
    ("max_message_bytes", "largest gRPC request message"),
    (
        "reload_interval_ms",
        "how often to look for changed rules files (0: never)",
    ),
    ("log_level", "log filter, e.g. info or tollgate=debug"),
    (
        "drain_ms",
        "after SIGTERM: how long to stay up, unready, before closing the listeners",
    ),
    (
        "otlp_endpoint",
        "OTLP/gRPC collector for request spans, e.g. http://collector:4317 (empty: off)",
    ),
];

/// The effective settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    pub rules: PathBuf,
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub store: String,
    pub default_algorithm: Algorithm,
    pub shadow_mode: bool,
    pub response_headers: bool,
    pub key_prefix: String,
    pub store_pool_size: usize,
    pub store_connect_timeout_ms: u64,
    pub store_timeout_ms: u64,
    pub max_descriptors: usize,
    pub max_entries: usize,
    pub max_key_bytes: usize,
    pub max_value_bytes: usize,
    pub max_message_bytes: usize,
    pub reload_interval_ms: u64,
    pub log_level: String,
    pub drain_ms: u64,
    pub otlp_endpoint: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            rules: PathBuf::from("/etc/tollgate/rules"),
            grpc_addr: SocketAddr::from(([0, 0, 0, 0], 8081)),
            admin_addr: SocketAddr::from(([0, 0, 0, 0], 8080)),
            store: "memory".to_string(),
            default_algorithm: Algorithm::TokenBucket,
            shadow_mode: false,
            response_headers: false,
            key_prefix: "tollgate:".to_string(),
            store_pool_size: 8,
            store_connect_timeout_ms: 1_000,
            store_timeout_ms: 10,
            max_descriptors: 64,
            max_entries: 16,
            max_key_bytes: 256,
            max_value_bytes: 4_096,
            max_message_bytes: 1 << 20,
            reload_interval_ms: 2_000,
            log_level: "info".to_string(),
            drain_ms: 0,
            otlp_endpoint: String::new(),
        }
    }
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
        .filter_map(|(key, _)| {
            let v = get(&format!("TOLLGATE_{}", key.to_ascii_uppercase()))?;
            (!v.is_empty()).then_some((*key, v))
        })
        .collect();
    (file, vars)
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
            ]
            .iter()
            .any(|s| self.store.starts_with(s))
        {
            return bad(
                "store",
                "expected `memory`, redis://…, rediss://…, redis+cluster://… or rediss+cluster://…",
            );
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
        ] {
            if v == 0 {
                return bad(key, "must be at least 1");
            }
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
            ..self.clone()
        }
    }
}

/// `scheme://user:secret@host` → `scheme://user:***@host` (each host of a cluster URL too).
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((auth, hosts)) = rest.rsplit_once('@') else {
        return url.to_string();
    };
    let user = auth.split_once(':').map_or("", |(u, _)| u);
    format!("{scheme}://{user}:***@{hosts}")
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
        let dir = std::env::temp_dir().join(format!("tollgate-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("tollgate.yaml");
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
        std::fs::remove_dir_all(&dir).unwrap();
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
        assert!(load("store", "memcached://x").contains("store:"));
        assert!(load("key_prefix", "a{b").contains("key_prefix"));
        assert!(
            load("grpc_addr", "not-an-address").contains("grpc_addr"),
            "{}",
            load("grpc_addr", "x")
        );
        assert!(load("default_algorithm", "leaky").contains("default_algorithm"));
        assert!(load("otlp_endpoint", "collector:4317").contains("otlp_endpoint"));
    }

    #[test]
    fn unknown_keys_in_the_file_are_errors() {
        let dir =
            std::env::temp_dir().join(format!("tollgate-settings-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("s.yaml");
        std::fs::write(&file, "store_timeout: 5\n").unwrap();
        let err = Settings::load(&Sources {
            file: Some(file),
            ..Sources::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("store_timeout"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
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
    }
}
