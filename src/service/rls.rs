//! Envoy's `envoy.service.ratelimit.v3.RateLimitService` over gRPC: a thin shell that reads
//! the caller's trace context and deadline (stamped by `deadline.rs` when the headers arrived)
//! and hands the request to the shared [`Handler`].

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use super::deadline::Deadline;
use super::{Handler, RemoteParent};
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
        let parent = || RemoteParent::from_headers(|name| metadata.get(name)?.to_str().ok());
        let deadline = request.extensions().get::<Deadline>().copied();
        self.0
            .should_rate_limit(request.get_ref(), parent, deadline)
            .await
            .map(tonic::Response::new)
    }
}
