//! The gRPC server: Envoy's `RateLimitService`, its `RateLimitQuotaService` (RLQS) and
//! `grpc.health.v1` on the gRPC listener (its status follows the replica's readiness, as
//! `/readyz` does: [`follow_readiness`]),
//! with every bound of the settings on its connections and requests (the connection cap and
//! the handshake deadline in `service/listener.rs`, the request-bytes budget in
//! `service/inflight.rs`, HTTP/2 stream caps, keepalive and the request deadline here).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;
use tokio::sync::watch;

use tonic::server::NamedService;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use super::AppError;
use crate::admin::AdminState;
use crate::configs;
use crate::rlqs::Rlqs;
use crate::service::rlqs::RlqsService;
use crate::service::rls::Rls;
use crate::service::{Handler, deadline, decode_errors, inflight, listener, tls};
use crate::settings::Settings;
use crate::telemetry::RefusedLabels;

/// Streams the server may reset for a peer's protocol errors on one connection (refused past
/// the stream cap, frames on a closed stream) before it closes the connection: hyper's own
/// default, which tonic does not pass on (see `serve`).
const MAX_LOCAL_ERROR_RESETS: usize = 1_024;

/// How often the gRPC health status looks at readiness besides when `ready` changes: the rules
/// loaded and the store's first answer change it too (`admin::readiness`).
const HEALTH_LOOK: Duration = Duration::from_millis(100);

/// The gRPC health status of the server (`""`) and of each service, as `/readyz` answers:
/// NOT_SERVING until the replica is ready (a store never reached keeps it so, with
/// `unready_until_store_answers`) and from the first moment of a drain, so Envoy's gRPC health
/// checks and Kubernetes' `grpc:` probes see what `/readyz` shows.
async fn follow_readiness(
    reporter: HealthReporter,
    state: Arc<AdminState>,
    mut stop: watch::Receiver<bool>,
) {
    let mut serving = false;
    loop {
        let (ready, _) = state.readiness();
        if ready != serving {
            set_health(&reporter, ready).await;
            serving = ready;
        }
        tokio::select! {
            _ = state.ready_changed.notified() => {}
            _ = tokio::time::sleep(HEALTH_LOOK) => {}
            // Stopping (with no drain, the stop follows the unready at once and may win this
            // race): NOT_SERVING, whatever the last look saw.
            _ = stop.changed() => {
                set_health(&reporter, false).await;
                return;
            }
        }
    }
}

async fn set_health(reporter: &HealthReporter, serving: bool) {
    let status = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    for name in [
        "",
        <RateLimitServiceServer<Rls> as NamedService>::NAME,
        <RateLimitQuotaServiceServer<RlqsService> as NamedService>::NAME,
    ] {
        reporter.set_service_status(name, status).await;
    }
}

/// The gRPC server on `grpc_listener`, configured from `settings`, serving `handler` until
/// `stop` resolves (then it drains the requests in flight). Fails on a TLS setting tonic
/// refuses.
pub(super) async fn server(
    settings: &Settings,
    handler: Arc<Handler>,
    rlqs: Arc<Rlqs>,
    grpc_listener: TcpListener,
    admin_state: Arc<AdminState>,
    stop_rx: watch::Receiver<bool>,
) -> Result<impl Future<Output = Result<(), tonic::transport::Error>> + Send + use<>, AppError> {
    let stop = super::stopped(stop_rx.clone());
    // Past the open-files limit, accept fails with EMFILE before the cap is reached (and the
    // store's and admin's sockets fail too): raise it as far as allowed, and say so now if
    // it is still too low rather than under an attack.
    if let Some(limit) = listener::raise_open_files_limit()
        && (settings.grpc_max_connections as u64).saturating_add(256) > limit
    {
        tracing::warn!(
            grpc_max_connections = settings.grpc_max_connections,
            open_files_limit = limit,
            "grpc_max_connections is near the open-files limit (nofile): raise the limit or lower the setting"
        );
    }
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    set_health(&health_reporter, false).await;
    let rls = RateLimitServiceServer::new(Rls(handler.clone()))
        .max_decoding_message_size(settings.max_message_bytes);
    // Each RLQS stream ends at shutdown (after telling its Envoy to fall back), so the drain
    // below does not wait for streams that would never end.
    let rlqs = RateLimitQuotaServiceServer::new(RlqsService {
        handler: handler.clone(),
        rlqs,
        stop: stop_rx.clone(),
    })
    .max_decoding_message_size(settings.max_message_bytes);
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = tls::server_config(&configs::grpc_tls_files(settings))? {
        server = server.tls_config(tls).map_err(AppError::GrpcTls)?;
    }
    // After the last setup that can fail, so a refused start leaves no task behind.
    tokio::spawn(follow_readiness(
        health_reporter,
        admin_state,
        stop_rx.clone(),
    ));
    if settings.grpc_max_connection_age_ms > 0 {
        // Envoy keeps its HTTP/2 connections for ever: without an age, replicas added by a
        // scale-out get no traffic. GOAWAY makes Envoy reconnect (and rebalance) while the
        // requests in flight finish within the grace.
        server = server
            .max_connection_age(Duration::from_millis(settings.grpc_max_connection_age_ms))
            .max_connection_age_grace(Duration::from_millis(
                settings.grpc_max_connection_age_grace_ms,
            ));
    }
    // Envoy opens another connection when a connection's streams are all in use: the cap bounds
    // what one connection can queue, and max_concurrent_requests bounds the whole process.
    server = server.max_concurrent_streams(Some(settings.grpc_max_concurrent_streams));
    // A peer that keeps opening streams past that cap (or sending on streams it was refused)
    // makes h2 queue a reset for each, in memory, for as long as it sends: 16 such peers grew a
    // replica by 118 MiB in 6 s. hyper closes such a connection (GOAWAY ENHANCE_YOUR_CALM)
    // after 1,024 of them, but tonic passes "no limit" down unless told; restore it.
    server = server.http2_max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS));
    // A peer that goes silent or stops reading (its window full, our responses unread) does not
    // answer PINGs either: it is disconnected instead of holding its streams' buffers for ever.
    if settings.grpc_keepalive_interval_ms > 0 {
        server = server
            .http2_keepalive_interval(Some(Duration::from_millis(
                settings.grpc_keepalive_interval_ms,
            )))
            .http2_keepalive_timeout(Some(Duration::from_millis(
                settings.grpc_keepalive_timeout_ms,
            )));
    }
    // A stream whose body never finishes (within the bytes budget below) or a client that
    // never reads its answer holds a stream slot; the deadline frees it. Envoy's own
    // grpc-timeout (its 20 ms) is shorter and applies instead.
    if settings.grpc_request_timeout_ms > 0 {
        server = server.timeout(Duration::from_millis(settings.grpc_request_timeout_ms));
    }
    // Request bytes being received, for the whole process (see service/inflight.rs).
    let budget = inflight::Budget::new(
        settings.max_request_bytes_in_flight,
        settings.max_message_bytes,
        handler
            .metrics
            .refused
            .get_or_create(&RefusedLabels {
                what: "request_bytes",
            })
            .clone(),
    );
    let grpc = server
        // First: each request's deadline is stamped when its headers arrive.
        .layer(deadline::DeadlineLayer)
        .layer(decode_errors::DecodeErrorsLayer)
        .layer(inflight::InFlightLayer::new(budget))
        .add_service(health_service)
        .add_service(rls)
        .add_service(rlqs)
        .serve_with_incoming_shutdown(
            listener::incoming(
                grpc_listener,
                listener::Limits {
                    port: "gRPC",
                    max_connections: settings.grpc_max_connections,
                    handshake_timeout: Some(Duration::from_millis(
                        settings.grpc_handshake_timeout_ms,
                    )),
                    refused: handler
                        .metrics
                        .refused
                        .get_or_create(&RefusedLabels {
                            what: "connections",
                        })
                        .clone(),
                },
            ),
            stop,
        );
    Ok(grpc)
}
