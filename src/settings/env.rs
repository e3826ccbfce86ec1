//! The environment: the documented `TOLLGATE_*` variables that are set ([`from_env`]), and a
//! warning for each `TOLLGATE_*` variable that is not a setting ([`unknown_env_warnings`]).

use std::path::PathBuf;

use super::{KEYS, Key};

/// Warnings for `TOLLGATE_*` variables that are not settings: a typo such as
/// `TOLLGATE_STOR=redis://…` would otherwise leave the replica on the memory store without a
/// word. The variables Kubernetes injects for a Service whose name starts with `tollgate`
/// (`TOLLGATE_PORT`, `TOLLGATE_SERVICE_HOST`, `TOLLGATE_PORT_8081_TCP_ADDR`, …) are not ours
/// and pass silently.
pub fn unknown_env_warnings(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let known: Vec<String> = KEYS.iter().map(Key::env).collect();
    let settings: Vec<&str> = known.iter().map(String::as_str).collect();
    let mut out: Vec<String> = names
        .into_iter()
        // Not settings, but read: the settings file, and the seed of the service's own random
        // draws (`random.rs`).
        .filter(|n| n.starts_with("TOLLGATE_") && n != "TOLLGATE_CONFIG" && n != "TOLLGATE_SEED")
        .filter(|n| !known.contains(n) && !is_kubernetes_service_variable(n))
        .map(|n| match crate::error_text::closest(&n, &settings, 3) {
            Some(k) => {
                format!("{n} is not a tollgate setting and is ignored (did you mean {k}?)")
            }
            None => format!("{n} is not a tollgate setting and is ignored"),
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::settings::{Settings, Sources};

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
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
            ..Sources::default()
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
        assert_eq!(crate::error_text::edit_distance("kitten", "sitting"), 3);
    }
}
