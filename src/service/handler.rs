//! The one request path both surfaces share (gRPC's [`Rls`](super::rls::Rls) and the admin
//! port's `/json`): admission (`max_concurrent_requests`), the request span, the proto → request
//! check ([`request`](super::request)), [`Limiter::decide`] against the rules in force, and the
//! proto response ([`response`](super::response)); the request's metrics are recorded here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code as PbCode;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tokio::sync::Semaphore;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::deadline::Deadline;
use super::{Bounds, RemoteParent, request, response};
use crate::limiter::Limiter;
use crate::rules::RuleSet;
use crate::telemetry::{CallError, Metrics};

/// Everything a decision needs, shared by the gRPC service and the admin port's `/json`: the
/// rules in force, the [`Limiter`] (which decides against the store) and the request bounds.
#[derive(Debug)]
pub struct Handler {
    pub rules: Arc<ArcSwap<RuleSet>>,
    pub limiter: Limiter,
    pub metrics: Arc<Metrics>,
    pub bounds: Bounds,
    /// Where the `RateLimit-*` headers go (`response_headers`, `request_headers`,
    /// `headers_for_every_limit`).
    pub headers: response::HeaderOptions,
    /// Add the request and the passing descriptors' `metadata` as dynamic metadata
    /// (`response_dynamic_metadata`).
    pub response_dynamic_metadata: bool,
    /// Requests being decided now, capped at `max_concurrent_requests`: past the cap a request
    /// is refused at once, so an overload is answered fast instead of queueing without bound.
    pub admission: Semaphore,
    /// `decision_margin_ms`: kept back from a caller's deadline for the answer's way back.
    pub decision_margin: Duration,
}

impl Handler {
    /// Validates, decides and builds the response; records the request's metrics.
    /// `parent` reads the caller's span from Envoy's trace headers, when it sent one: called
    /// only when the request span is exported (`otlp_endpoint`), so a request pays no header
    /// look-ups for a trace nobody records. `deadline`: when the caller gives up (gRPC's
    /// `grpc-timeout`, stamped on arrival); the decision answers before it (see
    /// [`Limiter::decide_within`]).
    pub async fn should_rate_limit(
        &self,
        req: &RateLimitRequest,
        parent: impl FnOnce() -> Option<RemoteParent>,
        deadline: Option<Deadline>,
    ) -> Result<RateLimitResponse, tonic::Status> {
        let started = Instant::now();
        let Ok(_admitted) = self.admission.try_acquire() else {
            self.metrics.request_counts.of("overloaded").inc();
            return Err(tonic::Status::resource_exhausted(
                "tollgate is at max_concurrent_requests: refused without queueing (Envoy applies its failure mode)",
            ));
        };
        // Exported only when an OTLP endpoint is set (see telemetry/traces.rs); otherwise disabled.
        let span = tracing::info_span!(
            target: "tollgate::request",
            "ShouldRateLimit",
            domain = %req.domain,
            descriptors = req.descriptors.len(),
            result = tracing::field::Empty,
        );
        if !span.is_disabled()
            && let Some(parent) = parent()
        {
            // Fails only when no OpenTelemetry layer is installed, i.e. the span is not exported.
            let _ = span.set_parent(parent.context());
        }
        let budget = deadline.map(|d| d.budget(started, self.decision_margin));
        let result = self.decide(req, budget).instrument(span.clone()).await;
        let code = match &result {
            Ok(r) if r.overall_code == PbCode::OverLimit as i32 => "over_limit",
            Ok(_) => "ok",
            Err(s) if s.code() == tonic::Code::InvalidArgument => "invalid",
            Err(_) => "error",
        };
        span.record("result", code);
        self.metrics.request_counts.of(code).inc();
        let took = started.elapsed();
        self.metrics.request_duration.observe(took.as_secs_f64());
        let error = match code {
            "error" => Some(CallError::Redis),
            "invalid" => Some(CallError::Service),
            _ => None,
        };
        self.metrics.statsd.call(took, error);
        result
    }

    async fn decide(
        &self,
        req: &RateLimitRequest,
        budget: Option<Duration>,
    ) -> Result<RateLimitResponse, tonic::Status> {
        let request = request::to_request(req, &self.bounds)?;
        let rules = self.rules.load();
        // The store logs outages (once per state change, not per request); the caller only
        // learns that the store could not answer, never its error text.
        let decision = self
            .limiter
            .decide_within(&rules, &request, budget)
            .await
            .map_err(|_| tonic::Status::unavailable("store unavailable"))?;
        let mut response = response::to_proto(&decision, self.headers);
        if self.response_dynamic_metadata {
            response.dynamic_metadata = Some(response::dynamic_metadata(req, &decision));
        }
        Ok(response)
    }
}
