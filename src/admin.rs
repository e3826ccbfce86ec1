//! The admin HTTP port (axum). Routes:
//!
//! | route          | answer |
//! |----------------|--------|
//! | `GET /healthz` | 200 `ok` while the process runs (liveness) |
//! | `GET /readyz`  | 200 once rules are loaded and both servers listen, 503 before and while draining; the body names the store |
//! | `GET /metrics` | Prometheus/OpenMetrics text of every family in `telemetry.rs` |
//!
//! Readiness is about tollgate itself: a store outage does not pull replicas out of the
//! Service (that would turn a Redis blip into a full outage); the store state is reported
//! in the body and in metrics instead.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::service::RateLimiter;

/// Shared by the routes.
#[derive(Debug)]
pub struct AdminState {
    pub ready: AtomicBool,
    pub limiter: Arc<RateLimiter>,
}

impl AdminState {
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }
}

pub fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn readyz(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    let store = s.limiter.limiter.store().name();
    if s.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, format!("ready\nstore: {store}\n"))
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_string())
    }
}

async fn metrics(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.limiter.metrics.render(),
    )
}
