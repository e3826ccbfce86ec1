//! tollgate: an Envoy-compatible global rate-limit service.
//!
//! # How one request flows
//!
//! 1. [`service::rls`] receives Envoy's `ShouldRateLimit` over gRPC, checks its bounds and
//!    borrows it as a [`limiter::Request`] (the admin port's `/json` takes the same path).
//! 2. [`rules`] finds, per descriptor, the limits that apply (envoyproxy/ratelimit matching:
//!    exact, wildcard, bare key; depth = number of entries).
//! 3. [`keys`] names each bucket: a hash-tagged store key that cannot collide or break the tag.
//! 4. [`limiter`] sends all of the request's bucket operations to the [`store`] in one call
//!    and folds the answers into one status per descriptor; the math is [`limiter::bucket`].
//! 5. [`service::response`] turns the decision into Envoy's response (statuses, headers);
//!    [`telemetry`] counts it; [`admin`] exposes health and metrics.
//!
//! [`app`] wires these together; [`settings`] reads the flat settings; [`clock`] is the one
//! time source, so tests control time. [`loadgen`] is `tollgate bench`, the load generator.

#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod clock;
pub mod keys;
pub mod limiter;
pub mod loadgen;
pub mod rules;
pub mod service;
pub mod settings;
pub mod store;
pub mod telemetry;
