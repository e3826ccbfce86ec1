//! tollgate: an Envoy-compatible global rate-limit service.
//!
//! # How one request flows
//!
//! (RLQS, Envoy enforcing locally, is [`rlqs`] behind [`service::rlqs`]: its assignments use
//! steps 2 and 3's matching, keys and store ops.)
//!
//! 1. [`service::rls`] receives Envoy's `ShouldRateLimit` over gRPC and hands it to the one
//!    [`service::Handler`] (the admin port's `/json` takes the same path), which admits it,
//!    checks its bounds and borrows it as a [`limiter::Request`] ([`service::request`]).
//! 2. [`rules`] finds, per descriptor, the limits that apply (envoyproxy/ratelimit matching:
//!    exact, wildcard, bare key; depth = number of entries).
//! 3. [`limiter`] plans one store op per counted limit (`limiter::plan`), named by [`keys`]
//!    (a hash-tagged store key that cannot collide or break the tag; a sharded limit picks a
//!    sub-bucket), answers what it can from memory (`limiter::hot`: token leases kept by
//!    [`quota::lease`], the over-limit cache), sends the rest to the [`store`] in one call and
//!    folds the answers into one status per descriptor (`limiter::status`); the bucket math is
//!    [`quota::bucket`], mirrored by `lua/*.lua`, and every "part of a quota" (a fallback
//!    share, a shard, a lease grant) is [`quota::share`].
//!    Ops the store cannot answer (a failure, a timeout, a node whose circuit is open) are
//!    decided by [`limiter::fallback`]: a local share of the quota, open, closed or error.
//! 4. [`service::response`] turns the decision into Envoy's response (statuses, headers);
//!    [`telemetry`] counts it; [`admin`] exposes health, readiness and metrics.
//!
//! # Layout, and which way the imports run
//!
//! From the bottom up; a module imports only modules on its own line or below it, and no two
//! import each other (`farm-studio look`: no circle, no arrow running back up):
//!
//! 1. [`clock`] (the one handle for time and background tasks: system or manual),
//!    [`error_text`] (an error and its causes, printed once), [`telemetry`]
//!    (metric families declared once; logs and OTLP traces), [`redact`], [`structpb`]
//!    (`google.protobuf.Struct` ↔ JSON, for rule metadata), [`quota`] (the core
//!    with no store, clock or request in it: ops and outcomes, `bucket/` one file per
//!    algorithm, `share`, `lease`: lease accounting that does not know who holds a lease).
//! 2. [`rules`] (YAML with positions, loading, validation with file:line, matching, reload) and
//!    [`store`] (the store interface: memory, `store::redis` (standalone, cluster, Sentinel), and
//!    any other [`store::Backend`], a test's or a simulator's).
//! 3. [`keys`] (Limit + entries (+ shard) → store key), [`fleet`] (membership heartbeats and the
//!    live replica count), [`regions`] (this region's shares of the `global: true` limits, agreed
//!    with the other regions through a global store), [`settings`] (every setting once; flags,
//!    env and file derive from it).
//! 4. [`limiter`] (plan, hot keys, fallback, fold).
//! 5. [`rlqs`] (Envoy's quota streams: bucket id → rule, assignments claimed from the same
//!    shared buckets through the limiter, settled at the next report).
//! 6. [`service`] (gRPC RLS and RLQS, the shared handler, request bounds, response; the
//!    listeners' bounds), then [`configs`] (each part's typed config from the settings, so no
//!    part below imports [`settings`]), [`counter_api`] (the admin port's counter routes and
//!    the follower of the fleet's reset log), [`admin`] and [`fuzzing`] (the fuzz targets' bodies,
//!    which `make test` replays on the committed seeds), then [`app`] (wiring: `app::serve` on
//!    listeners the caller bound, tests bind port 0; `app::grpc` builds the gRPC server).
//!    [`loadgen`] (`tollgate bench`) stands apart.
//! 7. [`sim`] (`tollgate simulate`): many limiters, built as [`app`] builds one, on one
//!    virtual clock against a simulated store; above everything it runs.

#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod clock;
pub mod configs;
pub mod counter_api;
pub mod error_text;
pub mod fleet;
pub mod fuzzing;
pub mod keys;
pub mod limiter;
pub mod loadgen;
pub mod quota;
pub mod random;
pub mod redact;
pub mod regions;
pub mod rlqs;
pub mod rules;
pub mod service;
pub mod settings;
pub mod sim;
pub mod store;
pub mod structpb;
pub mod telemetry;
#[cfg(test)]
mod testing;
