//! Wiring: settings → rules, store, limiter → the gRPC and admin servers, until shutdown.
//!
//! [`run`] takes the shutdown signal as a future (as mini-redis does), so tests and `main`
//! decide when to stop. Order matters: the rules are loaded and both ports bound before
//! `/readyz` turns 200; on shutdown readiness drops first, then both servers drain the
//! requests in flight.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admin::{self, AdminState};
use crate::clock::Clock;
use crate::limiter::{Limiter, LimiterConfig};
use crate::rules::{self, LoadOptions, RulesError};
use crate::service::rls::Rls;
use crate::service::{Bounds, RateLimiter};
use crate::settings::Settings;
use crate::store::Store;
use crate::telemetry::Metrics;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("{0}")]
    Rules(#[from] RulesError),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("store: {0}")]
    Store(String),
    #[error("{what} server failed: {message}")]
    Serve { what: &'static str, message: String },
}

/// How long graceful shutdown waits for clients to close their connections.
const CLOSE_DEADLINE: Duration = Duration::from_secs(10);

/// How often the store's housekeeping runs (the memory store drops idle buckets).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Runs tollgate until `shutdown` resolves.
pub async fn run(
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AppError> {
    let opts = LoadOptions {
        default_algorithm: settings.default_algorithm,
    };
    let loaded = rules::reload::fingerprint(&settings.rules);
    let rule_set = rules::load_path(&settings.rules, opts)?;
    for w in &rule_set.warnings {
        tracing::warn!("{w}");
    }
    let (domains, _, limits) = rule_set.counts();
    tracing::info!(path = %settings.rules.display(), domains, limits, "rules loaded");
    let metrics = Arc::new(Metrics::new());
    metrics.rules_loaded.set(limits as i64);
    let rules = Arc::new(ArcSwap::from_pointee(rule_set));

    let clock = Clock::system();
    let store = build_store(&settings, clock, &metrics).await?;
    let limiter = Limiter::new(
        store,
        LimiterConfig {
            key_prefix: settings.key_prefix.clone(),
            shadow_mode: settings.shadow_mode,
            default_algorithm: settings.default_algorithm,
        },
        metrics.clone(),
    );
    let service = Arc::new(RateLimiter {
        rules: rules.clone(),
        limiter,
        metrics: metrics.clone(),
        bounds: Bounds {
            max_descriptors: settings.max_descriptors,
            max_entries: settings.max_entries,
            max_key_bytes: settings.max_key_bytes,
            max_value_bytes: settings.max_value_bytes,
        },
        response_headers: settings.response_headers,
    });

    let grpc_listener = bind("gRPC", settings.grpc_addr).await?;
    let admin_listener = bind("admin", settings.admin_addr).await?;
    let grpc_addr = grpc_listener.local_addr().unwrap_or(settings.grpc_addr);
    let admin_addr = admin_listener.local_addr().unwrap_or(settings.admin_addr);

    // One shutdown signal fanned out to every task.
    let (stop_tx, stop_rx) = watch::channel(false);
    let admin_state = Arc::new(AdminState {
        ready: false.into(),
        limiter: service.clone(),
        settings: settings.redacted(),
    });
    {
        let admin_state = admin_state.clone();
        let drain = Duration::from_millis(settings.drain_ms);
        tokio::spawn(async move {
            shutdown.await;
            // Unready first and keep serving for `drain_ms`, so load balancers and Envoy move
            // to other replicas before the listeners close; then drain what is in flight.
            admin_state.set_ready(false);
            if !drain.is_zero() {
                tracing::info!(
                    drain_ms = drain.as_millis() as u64,
                    "shutting down: unready, still serving"
                );
                tokio::time::sleep(drain).await;
            }
            tracing::info!("shutting down: draining requests in flight");
            let _ = stop_tx.send(true);
        });
    }

    {
        let service = service.clone();
        let stop = stopped(stop_rx.clone());
        tokio::spawn(async move {
            tokio::pin!(stop);
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            loop {
                tokio::select! {
                    _ = &mut stop => return,
                    _ = tick.tick() => {}
                }
                service.limiter.store().maintain();
            }
        });
    }
    if settings.reload_interval_ms > 0 {
        tokio::spawn(rules::reload::watch(
            settings.rules.clone(),
            loaded,
            opts,
            rules,
            metrics,
            Duration::from_millis(settings.reload_interval_ms),
            stopped(stop_rx.clone()),
        ));
    }

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<RateLimitServiceServer<Rls>>()
        .await;
    let rls = RateLimitServiceServer::new(Rls(service.clone()))
        .max_decoding_message_size(settings.max_message_bytes);
    let grpc = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(rls)
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(grpc_listener).with_nodelay(Some(true)),
            stopped(stop_rx.clone()),
        );
    let admin = axum::serve(admin_listener, admin::router(admin_state.clone()))
        .with_graceful_shutdown(stopped(stop_rx.clone()));

    admin_state.set_ready(true);
    tracing::info!(%grpc_addr, %admin_addr, store = service.limiter.store().name(), "tollgate ready");
    // If either server fails, stop the other too: a half-alive replica would stay "ready".
    let grpc = async {
        grpc.await.map_err(|e| AppError::Serve {
            what: "gRPC",
            message: e.to_string(),
        })
    };
    let admin = async {
        admin.await.map_err(|e| AppError::Serve {
            what: "admin",
            message: e.to_string(),
        })
    };
    // Graceful shutdown waits for clients to close their connections; one that never does
    // must not keep the process alive past a bound.
    let servers = async { tokio::try_join!(grpc, admin).map(|_| ()) };
    let deadline = async {
        stopped(stop_rx.clone()).await;
        tokio::time::sleep(CLOSE_DEADLINE).await;
    };
    tokio::select! {
        result = servers => result?,
        _ = deadline => tracing::warn!(
            "connections still open {} s after shutdown began; stopping anyway",
            CLOSE_DEADLINE.as_secs()
        ),
    }
    tracing::info!("stopped");
    Ok(())
}

/// The store the settings name. A Redis that is down at startup is not an error (the store
/// reconnects in the background and requests get UNAVAILABLE meanwhile); a bad URL is.
async fn build_store(
    settings: &Settings,
    clock: Clock,
    metrics: &Metrics,
) -> Result<Store, AppError> {
    Store::connect(settings, clock, metrics)
        .await
        .map_err(|e| AppError::Store(e.message))
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, AppError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| AppError::Bind { what, addr, source })
}

/// Resolves once the shutdown flag is set (or its sender is gone).
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}
