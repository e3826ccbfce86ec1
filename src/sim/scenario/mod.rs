//! The scenario file of `tollgate simulate`: what fleet, store, faults and traffic to run.
//!
//! Read with the rules' YAML reader (`rules::yaml`), so every problem (an unknown key, a
//! number out of range, a rules path without rules, a setting `serve` would refuse) is
//! reported as `file:line:col: field: message`, all of them in one run, as `tollgate check`
//! reports rules. The names are part of the interface: docs/simulate.md documents them.
//!
//! Flow: [`Scenario::load`] parses the file → [`read`](read::read) walks it into a
//! [`Scenario`] (the settings through [`Settings::load`], the rules through
//! [`crate::rules::load_path`], both relative to the scenario file; each section through its
//! own reader) → the checks that need more than one section (`check.rs`) → `sim::run`.
//!
//! Here: the whole scenario, its entry points and its bounds. `read.rs`: the walk, the
//! `settings:` and `rules:` it loads, and the field readers every section uses; one file per
//! section, its types with their reader: `store.rs` (`store:`, nodes, latency and faults),
//! `replicas.rs` (`replicas:`, the fleet size over time), `traffic.rs` (`traffic:`, the
//! streams and their value templates), `envoy.rs` (`envoy:`, Envoy's timeout and failure mode),
//! `regions.rs` (`regions:`, regions sharing the global limits through a global store).

use std::path::{Path, PathBuf};

use crate::rules::RuleSet;
use crate::rules::error::{Pos, Problems, RuleError, RulesError};
use crate::rules::yaml;
use crate::settings::Settings;

mod check;
mod envoy;
mod fields;
mod read;
mod regions;
mod replicas;
mod store;
mod traffic;

pub use envoy::EnvoyModel;
pub use regions::{Cut, RegionsModel};
pub use replicas::FleetSize;
pub use store::{Fault, FaultKind, Latency, StoreModel};
pub use traffic::{Arrivals, Pick, Routing, Template, Traffic};

/// A whole scenario, checked.
#[derive(Debug)]
pub struct Scenario {
    /// The scenario file (relative paths inside it are relative to its directory).
    pub file: PathBuf,
    /// Virtual seconds to run.
    pub duration_s: u64,
    pub seed: u64,
    pub rules_path: PathBuf,
    pub rules: RuleSet,
    /// Every `serve` setting, the scenario's over the defaults.
    pub settings: Settings,
    pub store: StoreModel,
    pub replicas: FleetSize,
    pub traffic: Vec<Traffic>,
    /// What the Envoy in front of the fleet does with a slow or failed decision.
    pub envoy: EnvoyModel,
    /// Regions sharing the global limits: a fleet of `replicas` and a store like `store` in
    /// each, and the global store between them.
    pub regions: Option<RegionsModel>,
}

/// The most of a few numbers, so a typo cannot ask for a week of virtual time or a million
/// replicas (the simulation would run out of memory instead of saying why).
pub(crate) const MAX_DURATION_S: u64 = 86_400;
pub(crate) const MAX_REPLICAS: u64 = 5_000;
pub(crate) const MAX_NODES: u64 = 64;
pub(crate) const MAX_RATE: f64 = 10_000_000.0;

impl Scenario {
    /// Reads and checks the scenario file at `path`.
    pub fn load(path: &Path) -> Result<Scenario, RulesError> {
        let whole = |message: String| RulesError {
            errors: vec![RuleError::whole_file(path, message)],
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| whole(format!("cannot read the scenario: {e}")))?;
        Scenario::parse(path, &text)
    }

    /// Checks the scenario `text` (read from `path`, which relative paths start from).
    pub fn parse(path: &Path, text: &str) -> Result<Scenario, RulesError> {
        let mut out = Problems::new(path);
        let root = match yaml::parse(text) {
            Ok(Some(root)) => root,
            Ok(None) => {
                out.error(Pos { line: 1, col: 1 }, "", "the scenario is empty");
                return Err(RulesError { errors: out.errors });
            }
            Err(e) => {
                out.error(e.pos, "", e.message);
                return Err(RulesError { errors: out.errors });
            }
        };
        match read::read(&mut out, path, &root) {
            Some(s) if out.errors.is_empty() => Ok(s),
            _ => Err(RulesError { errors: out.errors }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, scenario: &str) -> Result<Scenario, RulesError> {
        std::fs::create_dir_all(dir.join("rules")).unwrap();
        std::fs::write(
            dir.join("rules/edge.yaml"),
            "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 100}\n",
        )
        .unwrap();
        let file = dir.join("s.yaml");
        std::fs::write(&file, scenario).unwrap();
        Scenario::load(&file)
    }

    const GOOD: &str = "duration_s: 30\nseed: 7\nrules: rules/\nsettings:\n  lease_max_batch: 20\n  store_timeout_ms: 10\n  fallback: local\nstore:\n  nodes: 3\n  latency_ms: {p50: 0.4, p99: 2.0}\n  ops_per_s: 100000\n  faults:\n    - {at_s: 10, for_s: 5, kind: down}\n    - {at_s: 20, for_s: 1, kind: slow, latency_ms: {p50: 5, p99: 30}}\n    - {at_s: 22, for_s: 1, kind: partition, replicas: [0, 2]}\nreplicas:\n  start: 3\n  changes: [{at_s: 15, to: 6}]\ntraffic:\n  - domain: edge\n    entries: [{key: tenant, value: \"t{zipf}\"}]\n    tenants: 1000\n    zipf_exponent: 1.1\n    rate_per_s: 2000\n    routing: sticky\n";

    #[test]
    fn a_full_scenario_reads_into_its_parts() {
        let dir = tempfile::tempdir().unwrap();
        let s = write(dir.path(), GOOD).unwrap();
        assert_eq!((s.duration_s, s.seed), (30, 7));
        assert_eq!(s.settings.lease_max_batch, 20);
        assert_eq!(s.store.nodes, 3);
        assert_eq!(s.store.faults.len(), 3);
        assert_eq!(
            s.store.faults[2].kind,
            FaultKind::Partition { from: 0, to: 2 }
        );
        assert_eq!(s.replicas.changes, [(15.0, 6)]);
        assert_eq!(s.traffic[0].routing, Routing::Sticky);
        let mut v = String::new();
        s.traffic[0].entries[0].1.render(42, &mut v);
        assert_eq!(v, "t42");
        assert!(s.rules.domains.contains_key("edge"));
    }

    #[test]
    fn every_problem_is_reported_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let bad = GOOD
            .replace("seed: 7", "seed: 7\nsped: 3")
            .replace("store_timeout_ms: 10", "store_timeout_ms: -1")
            .replace("lease_max_batch: 20", "lease_max_bach: 20")
            .replace("kind: down", "kind: gone")
            .replace("rate_per_s: 2000", "rate_per_s: lots")
            .replace("routing: sticky", "routing: sideways");
        let e = write(dir.path(), &bad).unwrap_err().to_string();
        for want in [
            "s.yaml:3:1: sped: unknown field",
            "s.yaml:6:3: settings.lease_max_bach: not a serve setting",
            "s.yaml:7:21: settings.store_timeout_ms:",
            "store.faults[0].kind: unknown fault kind `gone`",
            "traffic[0].rate_per_s: expected a number, found `lots`",
            "traffic[0].routing: unknown routing `sideways`",
        ] {
            assert!(e.contains(want), "missing {want:?} in:\n{e}");
        }
    }

    #[test]
    fn the_envoy_in_front_has_envoys_defaults_and_its_fields_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let s = write(dir.path(), GOOD).unwrap();
        assert_eq!(
            s.envoy,
            EnvoyModel {
                timeout_ms: Some(20),
                failure_mode_deny: false
            }
        );
        let waits = format!("{GOOD}envoy: {{timeout_ms: 0, failure_mode_deny: true}}\n");
        let s = write(dir.path(), &waits).unwrap();
        assert_eq!(
            s.envoy,
            EnvoyModel {
                timeout_ms: None,
                failure_mode_deny: true
            }
        );
        let bad = format!("{GOOD}envoy: {{timeout_ms: -5, failure_mode_deny: maybe, retry: 1}}\n");
        let e = write(dir.path(), &bad).unwrap_err().to_string();
        for want in [
            "envoy.timeout_ms: must not be negative",
            "envoy.failure_mode_deny: expected true or false",
            "envoy.retry: unknown field",
        ] {
            assert!(e.contains(want), "missing {want:?} in:\n{e}");
        }
    }

    #[test]
    fn a_partition_of_replicas_the_fleet_never_has_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = write(
            dir.path(),
            &GOOD.replace("replicas: [0, 2]", "replicas: [0, 9]"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("s.yaml:15:7: store.faults[2].replicas: names replicas up to 9, but only 6 are ever started"),
            "{e}"
        );
    }

    #[test]
    fn a_stream_for_a_domain_without_rules_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = write(
            dir.path(),
            &GOOD.replace("  - domain: edge", "  - domain: egde"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("s.yaml:20:13: traffic[0].domain: no rules for domain `egde` (the rules declare: edge)"),
            "{e}"
        );
    }

    #[test]
    fn a_rules_path_without_rules_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let e = write(
            dir.path(),
            &GOOD.replace("rules: rules/", "rules: nothing/"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("s.yaml:3:8: rules:"), "{e}");
        std::fs::create_dir_all(dir.path().join("empty")).unwrap();
        let e = write(dir.path(), &GOOD.replace("rules: rules/", "rules: empty/"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no rules here"), "{e}");
    }

    const REGIONS: &str = "duration_s: 30\nrules: rules/\nsettings:\n  region_exchange_ms: 500\nstore: {}\nreplicas: {start: 2}\nregions:\n  names: [us, eu]\n  global_latency_ms: {p50: 160, p99: 200}\n  global_faults:\n    - {at_s: 10, for_s: 5}\n    - {at_s: 20, for_s: 5, regions: [eu]}\n    - {at_s: 27, for_s: 1, regions: [us], replicas: [1, 2]}\ntraffic:\n  - {region: us, domain: edge, entries: [{key: tenant, value: a}], rate_per_s: 10, from_s: 2, to_s: 9}\n  - {region: eu, domain: edge, entries: [{key: tenant, value: a}], rate_per_s: 10}\n";

    #[test]
    fn regions_read_with_their_global_store_and_each_stream_names_its_region() {
        let dir = tempfile::tempdir().unwrap();
        let s = write(dir.path(), REGIONS).unwrap();
        let r = s.regions.expect("regions");
        assert_eq!(r.names, ["us", "eu"]);
        assert_eq!(r.global_latency.p50_ms, 160.0);
        assert_eq!(r.cuts[1].regions, Some(vec![1]));
        // Every region cut off at 10-15 s, eu alone at 20-25 s.
        assert!(r.cut_off(0, 0, 12_000_000) && r.cut_off(1, 1, 12_000_000));
        assert!(!r.cut_off(0, 0, 22_000_000) && r.cut_off(1, 0, 22_000_000));
        assert!(!r.cut_off(1, 0, 25_000_000));
        // Replica 1 of us alone at 27-28 s.
        assert!(r.cut_off(0, 1, 27_500_000) && !r.cut_off(0, 0, 27_500_000));
        assert_eq!(s.traffic[0].region.as_deref(), Some("us"));
        assert_eq!((s.traffic[0].from_s, s.traffic[0].to_s), (2.0, Some(9.0)));
    }

    #[test]
    fn a_regions_scenario_refuses_what_serve_would_and_streams_without_their_region() {
        let dir = tempfile::tempdir().unwrap();
        let bad = REGIONS
            .replace("region_exchange_ms: 500", "region_exchange_ms: 5000")
            .replace("names: [us, eu]", "names: [us, eu, us]")
            .replace("to_s: 9", "to_s: 1");
        let e = write(dir.path(), &bad).unwrap_err().to_string();
        for want in [
            "regions.names: `us` is given twice",
            "traffic[0].to_s: must be after from_s (2 s)",
        ] {
            assert!(e.contains(want), "missing {want:?} in:\n{e}");
        }
        let e = write(
            dir.path(),
            &REGIONS.replace("regions: [eu]", "regions: [mars]"),
        )
        .unwrap_err()
        .to_string();
        let want = "regions.global_faults[1].regions: no region `mars` (regions.names: us, eu)";
        assert!(e.contains(want), "missing {want:?} in:\n{e}");
        let e = write(dir.path(), &REGIONS.replace("{region: us, ", "{"))
            .unwrap_err()
            .to_string();
        let want = "traffic[0].region: missing: with regions, a stream names its region (us, eu)";
        assert!(e.contains(want), "missing {want:?} in:\n{e}");
        let slow = REGIONS.replace("region_exchange_ms: 500", "region_exchange_ms: 5000");
        let e = write(dir.path(), &slow).unwrap_err().to_string();
        let want = "settings: region_lease_ms: must be at least 3 × region_exchange_ms";
        assert!(e.contains(want), "missing {want:?} in:\n{e}");
        let e = write(
            dir.path(),
            &GOOD.replace("routing: sticky", "routing: sticky\n    region: us"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("traffic[0].region: only a scenario with `regions:` routes a stream"),
            "{e}"
        );
        let e = write(
            dir.path(),
            &REGIONS.replace("replicas: [1, 2]", "replicas: [1, 3]"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("regions.global_faults[2].replicas: names replicas up to 3, but each region only ever starts 2"),
            "{e}"
        );
        let e = write(dir.path(), &REGIONS.replace("{start: 2}", "{start: 2600}"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("regions: 2 regions of up to 2600 replicas each is 5200 replicas; at most 5000 in all"),
            "{e}"
        );
        let e = write(
            dir.path(),
            &REGIONS.replace("region_exchange_ms: 500", "region: us"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("settings.region: set by the scenario's `regions:`"),
            "{e}"
        );
    }
}
