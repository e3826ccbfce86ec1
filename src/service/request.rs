//! The proto request → the limiter's [`Request`], checked against the request [`Bounds`].
//!
//! Malformed input (empty domain, no descriptors, too many or too long of anything) is answered
//! with INVALID_ARGUMENT and a message saying which limit was passed; nothing is decided. The
//! [`Request`] borrows the proto's strings: nothing is copied on the way to the limiter.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use crate::limiter::{LimitOverride, Request, RequestDescriptor};
use crate::rules::Unit;

/// Limits on what one request may carry (each a setting).
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub max_descriptors: usize,
    pub max_entries: usize,
    pub max_key_bytes: usize,
    pub max_value_bytes: usize,
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
            refund: d.is_negative_hits,
        });
    }
    Ok(Request {
        domain: &req.domain,
        descriptors,
        hits_addend: u64::from(req.hits_addend),
    })
}
