//! Test support for the limiter's unit tests (`mod.rs`, `plan.rs`, `status.rs`): one rules
//! file covering every kind of limit, a [`Limiter`] over the memory store with a manual clock,
//! and a shorthand for requests.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Code, Decision, Limiter, LimiterConfig, Request, RequestDescriptor};
use crate::clock::Clock;
use crate::rules::LoadOptions;
use crate::rules::load::load_sources;
use crate::rules::{Algorithm, RuleSet};
use crate::store::{MemoryStore, Store};
use crate::telemetry::Metrics;

const RULES: &str = r#"
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: tenant
    value: vip
    rate_limit: {unit: hour, requests_per_unit: 1, name: vip, replaces: [{name: plan}]}
  - key: plan
    rate_limit: {unit: hour, requests_per_unit: 1, name: plan}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: zero
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: both
    rate_limits:
      - {unit: second, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 2, name: sustained}
  - key: group
    value: "g-*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: pool
    value: "p-*"
    share_threshold: true
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: ten
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: window
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: fixed_window}
  - key: slide
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_window}
  - key: leased
    rate_limit: {unit: hour, requests_per_unit: 100, lease: {max_batch: 10, ttl_ms: 1000}}
    descriptors:
      - key: settle
        charge_parent: true
  - key: leased_fast
    rate_limit: {unit: second, requests_per_unit: 10, lease: {max_batch: 5, ttl_ms: 1000}}
  - key: sharded
    rate_limit: {unit: hour, requests_per_unit: 8, shards: 4}
  - key: user
    quota_mode: true
    value_to_metric: true
    metadata: {budget: user, tier: {name: free}}
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: team
    quota_mode: true
    metadata: {budget: team, tier: {name: paid, seats: 5}}
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: monthly
    rate_limit: {unit: month, requests_per_unit: 2, calendar: utc}
  - key: month_budget
    rate_limit: {unit: month, requests_per_unit: 10, calendar: utc}
    descriptors:
      - key: settle
        value: held
        charge_parent: true
  - key: budget
    rate_limit: {unit: hour, requests_per_unit: 10}
    descriptors:
      - key: settle
        value: held
        charge_parent: true
"#;

/// The rules above, loaded.
pub(super) fn rules() -> RuleSet {
    load_sources(
        &[(PathBuf::from("t.yaml"), RULES.to_string())],
        LoadOptions::default(),
    )
    .unwrap()
}

pub(super) struct Fixture {
    pub(super) rules: RuleSet,
    pub(super) config: LimiterConfig,
    pub(super) limiter: Limiter,
    pub(super) metrics: Arc<Metrics>,
    pub(super) clock: Clock,
}

/// The rules above, a memory store at 1.7e12 ms (20 s into a minute), key prefix `t:`.
pub(super) fn fixture(shadow_mode: bool) -> Fixture {
    with_hot_keys(shadow_mode, super::HotKeyConfig::default())
}

/// [`fixture`] with hot-key settings; `shared_store: true` turns leasing and the over-limit
/// cache on over the memory store (which runs the same claim math as `lease.lua`), so their
/// unit tests run on the manual clock.
pub(super) fn with_hot_keys(shadow_mode: bool, hot: super::HotKeyConfig) -> Fixture {
    with_config(|c| {
        c.shadow_mode = shadow_mode;
        c.hot = hot;
    })
}

/// [`fixture`] with the limiter's config changed by `configure`.
pub(super) fn with_config(configure: impl FnOnce(&mut LimiterConfig)) -> Fixture {
    with_store(|clock| Store::Memory(MemoryStore::new(clock)), configure)
}

/// [`with_config`] on the store `store` makes from the fixture's clock.
pub(super) fn with_store(
    store: impl FnOnce(Clock) -> Store,
    configure: impl FnOnce(&mut LimiterConfig),
) -> Fixture {
    let rules = rules();
    let clock = Clock::manual(1_700_000_000_000);
    let metrics = Arc::new(Metrics::new());
    let mut config = LimiterConfig {
        key_prefix: "t:".into(),
        default_algorithm: Algorithm::TokenBucket,
        ..LimiterConfig::new(clock.clone())
    };
    configure(&mut config);
    let limiter = Limiter::new(store(clock.clone()), config.clone(), metrics.clone());
    Fixture {
        rules,
        config,
        limiter,
        metrics,
        clock,
    }
}

/// A request with one descriptor per entry list, no costs, no overrides.
pub(super) fn req<'a>(domain: &'a str, descs: &[&[(&'a str, &'a str)]]) -> Request<'a> {
    Request {
        domain,
        descriptors: descs
            .iter()
            .map(|e| RequestDescriptor {
                entries: e.to_vec(),
                hits_addend: None,
                limit_override: None,
                refund: false,
            })
            .collect(),
        hits_addend: 0,
    }
}

impl Fixture {
    pub(super) fn decide(&self, r: &Request<'_>) -> Decision {
        block_on(self.limiter.decide(&self.rules, r)).unwrap()
    }

    pub(super) fn codes(&self, r: &Request<'_>) -> Vec<Code> {
        self.decide(r).statuses.iter().map(|s| s.code).collect()
    }
}

/// Runs a future to completion on a fresh current-thread runtime.
pub(super) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}
