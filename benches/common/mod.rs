//! Pieces both benchmarks use: building a proto request, a limiter on the memory store, the
//! default request bounds, and driving a future without a runtime's overhead.

#![allow(dead_code)]

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tollgate::clock::Clock;
use tollgate::limiter::{Limiter, LimiterConfig};
use tollgate::rules::Algorithm;
use tollgate::service::Bounds;
use tollgate::store::{MemoryStore, Store};
use tollgate::telemetry::Metrics;

/// Rules for the decision benchmarks: limits of 10^9/s never run out, so every iteration
/// takes the same (admitted) path on buckets that already exist.
pub const DECIDE_RULES: &str = r#"
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000000000}
    descriptors:
      - key: path
        rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: plan
    value: gold
    rate_limit: {unit: second, requests_per_unit: 1000000000, name: gold, algorithm: fixed_window}
"#;

/// A request of domain `edge` with one descriptor per entry list.
pub fn proto(entries: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors: entries
            .iter()
            .map(|e| RateLimitDescriptor {
                entries: e
                    .iter()
                    .map(|(k, v)| Entry {
                        key: (*k).into(),
                        value: (*v).into(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// A limiter on a fresh memory store with the service's default settings.
pub fn memory_limiter() -> Limiter {
    Limiter::new(
        Store::Memory(MemoryStore::new(Clock::system())),
        LimiterConfig {
            key_prefix: "tg:".into(),
            shadow_mode: false,
            default_algorithm: Algorithm::TokenBucket,
            ..LimiterConfig::new(Clock::system())
        },
        Arc::new(Metrics::new()),
    )
}

/// [`memory_limiter`] with token leasing on, as on Redis (the memory store runs the same claim
/// math as `lease.lua`): the hot-key path's own cost, without a network.
pub fn leased_memory_limiter() -> Limiter {
    Limiter::new(
        Store::Memory(MemoryStore::new(Clock::system())),
        LimiterConfig {
            key_prefix: "tg:".into(),
            hot: tollgate::limiter::HotKeyConfig {
                shared_store: true,
                lease_max_batch: 1_000,
                ..Default::default()
            },
            ..LimiterConfig::new(Clock::system())
        },
        Arc::new(Metrics::new()),
    )
}

/// The default request bounds (settings.rs).
pub fn bounds() -> Bounds {
    Bounds {
        max_descriptors: 64,
        max_entries: 16,
        max_key_bytes: 256,
        max_value_bytes: 4096,
    }
}

/// Runs `f` to completion: one poll with a no-op waker (the memory store never waits), else
/// `rt.block_on`. Polling directly keeps the runtime's own bookkeeping out of the numbers.
pub fn run<F: Future>(rt: &tokio::runtime::Runtime, f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => rt.block_on(f),
    }
}
