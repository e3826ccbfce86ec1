//! Envoy's `envoy.service.ratelimit.v3.RateLimitService` over gRPC, and the proto → [`Request`]
//! conversion with its bounds.
//!
//! Malformed input (empty domain, no descriptors, too many or too long of anything) is answered
//! with INVALID_ARGUMENT and a message saying which limit was passed; nothing is decided.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use super::{Bounds, Handler, RemoteParent};
use crate::limiter::{LimitOverride, Request, RequestDescriptor};
use crate::rules::Unit;

/// The tonic service: a thin shell around [`Handler`].
#[derive(Clone, Debug)]
pub struct Rls(pub Arc<Handler>);

#[tonic::async_trait]
impl RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let metadata = request.metadata();
        let parent = RemoteParent::from_headers(|name| metadata.get(name)?.to_str().ok());
        self.0
            .should_rate_limit(request.get_ref(), parent)
            .await
            .map(tonic::Response::new)
    }
}

/// Checks `req` against `bounds` and borrows it as a limiter [`Request`].
pub fn to_request<'a>(
    req: &'a RateLimitRequest,
    bounds: &Bounds,
) -> Result<Request<'a>, tonic::Status> {
    let invalid = |m: String| Err(tonic::Status::invalid_argument(m));
    if req.domain.is_empty() {
        return invalid("rate limit domain must not be empty".into());
    }
    if req.descriptors.is_empty() {
        return invalid("rate limit descriptor list must not be empty".into());
    }
    if req.descriptors.len() > bounds.max_descriptors {
        return invalid(format!(
            "{} descriptors in one request; at most {} (max_descriptors)",
            req.descriptors.len(),
            bounds.max_descriptors
        ));
    }
    let mut descriptors = Vec::with_capacity(req.descriptors.len());
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.len() > bounds.max_entries {
            return invalid(format!(
                "descriptor {i} has {} entries; at most {} (max_entries)",
                d.entries.len(),
                bounds.max_entries
            ));
        }
        if d.is_negative_hits {
            return invalid(format!(
                "descriptor {i}: is_negative_hits (refunds) is not supported"
            ));
        }
        let mut entries = Vec::with_capacity(d.entries.len());
        for e in &d.entries {
            if e.key.len() > bounds.max_key_bytes {
                return invalid(format!(
                    "descriptor {i}: a key of {} bytes; at most {} (max_key_bytes)",
                    e.key.len(),
                    bounds.max_key_bytes
                ));
            }
            if e.value.len() > bounds.max_value_bytes {
                return invalid(format!(
                    "descriptor {i}: the value of key '{}' has {} bytes; at most {} (max_value_bytes)",
                    e.key,
                    e.value.len(),
                    bounds.max_value_bytes
                ));
            }
            entries.push((e.key.as_str(), e.value.as_str()));
        }
        let limit_override = match &d.limit {
            None => None,
            Some(l) => match Unit::from_proto(l.unit) {
                Some(unit) => Some(LimitOverride {
                    requests_per_unit: l.requests_per_unit,
                    unit,
                }),
                None => {
                    return invalid(format!(
                        "descriptor {i}: limit override has an unknown unit ({})",
                        l.unit
                    ));
                }
            },
        };
        descriptors.push(RequestDescriptor {
            entries,
            hits_addend: d.hits_addend.as_ref().map(|h| h.value),
            limit_override,
        });
    }
    Ok(Request {
        domain: &req.domain,
        descriptors,
        hits_addend: u64::from(req.hits_addend),
    })
}
