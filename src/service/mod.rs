//! The request-facing side: gRPC `RateLimitService` and the admin port's `/json` both call one
//! shared [`Handler`].
//!
//! One request, in file order: [`rls`] (the tonic service; the caller's trace context,
//! [`trace_context`]) → [`handler`] (admission, span, metrics) → [`request`] (proto →
//! `limiter::Request` within [`Bounds`], else INVALID_ARGUMENT) → `Limiter::decide` against
//! the rules in force → [`response`] (statuses, headers). Around the gRPC server: [`listener`]
//! (connection cap, handshake deadline), [`inflight`] (the request-bytes budget),
//! [`decode_errors`] (undecodable input is INVALID_ARGUMENT), [`deadline`] (each request's
//! `grpc-timeout`, stamped on arrival), [`tls`]; [`json`] is `/json`'s shapes.

pub mod deadline;
pub mod decode_errors;
pub mod handler;
pub mod inflight;
pub mod json;
pub mod listener;
pub mod request;
pub mod response;
pub mod rlqs;
pub mod rls;
pub mod tls;
pub mod trace_context;

pub use handler::Handler;
pub use request::{Bounds, to_request};
pub use trace_context::RemoteParent;
