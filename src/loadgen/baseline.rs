//! The no-op RLS server `make bench` measures against: the same tonic stack, no decision, so
//! it is the gRPC ceiling of the machine.

use std::net::SocketAddr;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

use super::BenchError;

/// `tollgate bench-baseline`: the no-op server on `addr` until `shutdown` resolves.
pub async fn serve_baseline(
    addr: SocketAddr,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), BenchError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| BenchError::Bind { addr, source })?;
    eprintln!("no-op RLS baseline on {addr}");
    serve_noop(listener, shutdown)
        .await
        .map_err(BenchError::Serve)
}

/// The baseline server: answers every request OK, one status per descriptor, no decision.
#[derive(Clone, Copy, Debug, Default)]

pub struct Noop;

#[tonic::async_trait]
impl RateLimitService for Noop {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let n = request.get_ref().descriptors.len();
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![
                DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                };
                n
            ],
            ..Default::default()
        }))
    }
}

/// Serves [`Noop`] on `addr` until `shutdown` resolves, with the server settings `app/grpc.rs` uses.
pub async fn serve_noop(
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(Noop))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
}
