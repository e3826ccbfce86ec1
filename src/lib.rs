//! tollgate: an Envoy-compatible global rate-limit service.
//!
//! # How one request flows
//!
//! 1. [`service::rls`] receives Envoy's `ShouldRateLimit` over gRPC, checks its bounds and
//!    borrows it as a [`limiter::Request`] (the admin port's `/json` takes the same path,
//!    through the same [`service::Handler`]).
//! 2. [`rules`] finds, per descriptor, the limits that apply (envoyproxy/ratelimit matching:
//!    exact, wildcard, bare key; depth = number of entries).
//! 3. [`limiter`] plans one store op per counted limit (`limiter::plan`), named by [`keys`]
//!    (a hash-tagged store key that cannot collide or break the tag; a sharded limit picks a
//!    sub-bucket), answers what it can from memory (`limiter::hot`: token leases, the
//!    over-limit cache), sends the rest to the [`store`] in one call and folds the answers
//!    into one status per descriptor (`limiter::status`); the bucket math is
//!    [`quota::bucket`], mirrored by `lua/*.lua`.
//!    Ops the store cannot answer (a failure, a timeout, a node whose circuit is open) are
//!    decided by [`limiter::fallback`]: a local share of the quota, open, closed or error.
//! 4. [`service::response`] turns the decision into Envoy's response (statuses, headers);
//!    [`telemetry`] counts it; [`admin`] exposes health, readiness and metrics.
//!
//! # Layout
//!
//! - [`app`]: wiring, and `app::serve` on listeners the caller bound (tests bind port 0).
//! - [`settings`]: every setting declared once; flags, `TOLLGATE_*` and file keys derive from it.
//! - [`rules`]: YAML with positions, loading, validation with file:line, matching, reload.
//! - [`quota`]: the core with no store, clock or request in it: bucket ops and outcomes, and
//!   the bucket math (`quota::bucket`).
//! - [`keys`], [`limiter`] (plan, hot keys: lease, over-limit cache, shard; status,
//!   fallback), [`store`] (memory, and `store::redis`:
//!   connect, pool, scripts, errors, outage, breaker, slots): the decision and where its state
//!   lives. [`configs`] builds each part's config from the settings, so the parts never see
//!   [`settings`]; [`redact`] keeps secrets out of what is shown.
//! - [`service`], [`admin`], [`telemetry`]: the surfaces.
//! - [`fleet`]: membership heartbeats and the live replica count.
//! - [`clock`]: the one handle for time and background tasks, so tests control both.
//!   [`loadgen`]: `tollgate bench`.

#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod clock;
pub mod configs;
pub mod fleet;
pub mod keys;
pub mod limiter;
pub mod loadgen;
pub mod quota;
pub mod redact;
pub mod rules;
pub mod service;
pub mod settings;
pub mod store;
pub mod telemetry;
