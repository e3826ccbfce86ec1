//! The flags of `tollgate serve`, derived from the schema ([`ServeArgs`]).

use std::path::PathBuf;

use super::{KEYS, Sources, from_env, from_reference_env};

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
    /// `--reference-env` (or started as `ratelimit`): read envoyproxy/ratelimit's variables.
    pub reference_env: bool,
}

impl ServeArgs {
    /// The sources of the settings: these flags, the documented `TOLLGATE_*` variables read
    /// through `get`, and the file (`--config`, else `TOLLGATE_CONFIG`). With `reference_env`,
    /// envoyproxy/ratelimit's variables too, under the `TOLLGATE_*` ones (which win).
    pub fn sources(self, get: impl Fn(&str) -> Option<String>) -> Sources {
        let (mut reference_ignored, mut reference_refused) = (Vec::new(), None);
        let (mut env, mut defaults, mut origins) = (Vec::new(), Vec::new(), Vec::new());
        if self.reference_env {
            match from_reference_env(&get) {
                Ok(mapped) => {
                    env = mapped.env;
                    defaults = mapped.defaults;
                    origins = mapped.origins;
                    reference_ignored = mapped.ignored;
                }
                Err(refused) => {
                    reference_refused = Some(refused.to_string());
                    // Still report that in the log format the reference's variable asks for.
                    if let Some(format) = get("LOG_FORMAT").filter(|f| !f.is_empty()) {
                        env.push(("log_format", format.to_ascii_lowercase()));
                    }
                }
            }
        }
        let (env_file, tollgate_env) = from_env(get);
        // A setting a flag or a `TOLLGATE_*` variable sets comes from there, not the reference.
        origins.retain(|(key, _)| {
            !tollgate_env
                .iter()
                .chain(&self.flags)
                .any(|(k, _)| k == key)
        });
        env.extend(tollgate_env);
        Sources {
            reference_origins: origins,
            file: self.config.or(env_file),
            env,
            flags: self.flags,
            defaults,
            as_reference: self.reference_env,
            reference_ignored,
            reference_refused,
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
        self.reference_env |= matches.get_flag("reference-env");
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
        .arg(
            Arg::new("reference-env")
                .long("reference-env")
                .action(clap::ArgAction::SetTrue)
                .help("read envoyproxy/ratelimit's environment (REDIS_URL, RUNTIME_ROOT, …) as its image would (as when started as `ratelimit`); TOLLGATE_* variables and flags still win"),
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
