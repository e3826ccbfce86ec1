//! Where the running settings make tollgate decide otherwise than envoyproxy/ratelimit, each
//! with the setting that changes it: the one startup line of a replica started as the
//! reference (`app/mod.rs`) and the table "What differs from the reference" of
//! docs/migrating.md#what-differs-from-the-reference, which a test holds to this list.
//!
//! Data flows one way: the loaded [`Settings`] → a list of differences (empty: this replica
//! decides as the reference does). Only what changes a decision is listed, not what changes
//! how tollgate gets there (connections, pipelining, its store timeout: Envoy's own 20 ms
//! cuts the reference's 10 s wait short, and its failure mode decides either way).

use crate::rules::{Algorithm, FallbackMode};
use crate::settings::Settings;

/// One way the running settings decide otherwise than the reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    /// The setting that changes it, and the value that decides as the reference does.
    pub setting: &'static str,
    pub reference_value: String,
    /// What tollgate does, and what the reference does instead.
    pub what: String,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (set {}={} to decide as the reference does)",
            self.what, self.setting, self.reference_value
        )
    }
}

/// Every setting [`differences`] may name, for the docs test below.
#[cfg(test)]
const SETTINGS_NAMED: &[&str] = &[
    "default_algorithm",
    "fallback",
    "lease_max_batch",
    "unready_until_store_answers",
];

/// The ways `s` decides otherwise than the reference, in a fixed order.
pub fn differences(s: &Settings) -> Vec<Difference> {
    let mut out = Vec::new();
    let mut differ = |setting: &'static str, reference_value: &str, what: String| {
        out.push(Difference {
            setting,
            reference_value: reference_value.to_string(),
            what,
        })
    };
    if s.default_algorithm != Algorithm::FixedWindow {
        differ(
            "default_algorithm",
            "fixed_window",
            format!(
                "limits that name no algorithm count with {} (the reference: a fixed window, reset at the end of each unit)",
                s.default_algorithm.name()
            ),
        );
    }
    if s.fallback != FallbackMode::Error {
        differ(
            "fallback",
            "error",
            format!(
                "while Redis cannot answer, the {} fallback decides (the reference fails the call and Envoy's failure_mode_deny decides)",
                s.fallback.name()
            ),
        );
    }
    if s.lease_max_batch > 0 {
        differ(
            "lease_max_batch",
            "0",
            format!(
                "hot keys are leased, up to {} tokens per replica at a time (the reference counts every hit in Redis)",
                s.lease_max_batch
            ),
        );
    }
    if !s.unready_until_store_answers {
        differ(
            "unready_until_store_answers",
            "true",
            "before Redis first answers, the replica is ready and the fallback decides (the reference opens no port until Redis answers)".to_string(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// tollgate's own defaults differ in two ways, each named with its setting; the table
    /// "What differs from the reference" (docs/migrating.md) lists every setting this file can
    /// name.
    #[test]
    fn tollgates_defaults_differ_in_named_ways_the_readme_lists() {
        let named: Vec<&str> = differences(&Settings::default())
            .iter()
            .map(|d| d.setting)
            .collect();
        assert_eq!(named, ["default_algorithm", "fallback"]);
        let all = Settings {
            lease_max_batch: 20,
            unready_until_store_answers: false,
            ..Settings::default()
        };
        let named: Vec<&str> = differences(&all).iter().map(|d| d.setting).collect();
        assert_eq!(named, SETTINGS_NAMED);
        let page = include_str!("../../../docs/migrating.md");
        let table = page
            .split("### What differs from the reference")
            .nth(1)
            .expect("docs/migrating.md has the table")
            .split("\n#")
            .next()
            .unwrap();
        for setting in SETTINGS_NAMED {
            assert!(
                table.contains(&format!("`{setting}")),
                "docs/migrating.md's table misses {setting}"
            );
        }
        let line = differences(&all)[0].to_string();
        assert!(
            line.ends_with("(set default_algorithm=fixed_window to decide as the reference does)"),
            "{line}"
        );
    }
}
