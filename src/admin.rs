//! The admin HTTP port (axum). Routes:
//!
//! | route          | answer |
//! |----------------|--------|
//! | `GET /healthz` | 200 `ok` while the process runs (liveness) |
//! | `GET /readyz`  | 200 once rules are loaded and both servers listen, 503 before and while draining (and, with `unready_without_rules`, while no domain is loaded; with `unready_until_store_answers`, until the store first answered); a JSON body: status, rules (domains, limits, when loaded, the last failed reload's error), store (kind, state), fallback (mode, open circuits, replicas and where that count comes from), and with `global_store` set regions (this region, regions heard from and their last beat's age, contact age, partitioned, disagreements, the share held of each global key) |
//! | `GET /healthcheck` | envoyproxy/ratelimit's probe (Envoy Gateway's readiness probe): 200 `OK` when `/readyz` is 200, else 500 with the reason |
//! | `GET /metrics` | every family in `telemetry/mod.rs` and the `process_*` ones: OpenMetrics when the `Accept` header names it, else the Prometheus text format |
//! | `POST /json`   | a RateLimitRequest in proto3 JSON → the response JSON; 200 OK, 429 OVER_LIMIT, 400 bad input, 503 store error or overload; 404 with `admin_json: false` (it spends tokens: with `/counters/reset`, behind its token, the only routes that change state) |
//! | `GET /config`  | the effective settings (secrets redacted) and the rules in force, one row per limit, and the `regions` object `/readyz` shows; `?pretty`: indented |
//! | `POST /counters/read`, `POST /counters/reset` | the counter API (`counter_api.rs`): a descriptor's buckets read or reset, behind a bearer token; 404 unless `counter_api_token_file` is set |
//!
//! Readiness is about tollgate itself: a store outage does not pull replicas out of the
//! Service (that would turn a Redis blip into a full outage); the store state is reported
//! in the body and in metrics instead.
//!
//! The port speaks HTTP/1 only ([`serve`]): at most `admin_max_connections` connections
//! (past it one is closed at once), each request's headers within `admin_header_timeout_ms`,
//! a `/json` body of at most `max_message_bytes`. A stop signal stops accepting and lets the
//! connections finish their requests in flight.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use serde_json::json;

use crate::service::json::{JsonRequest, JsonResponse, RulesView};
use crate::service::{Handler, RemoteParent};
use crate::settings::Settings;
use crate::telemetry::{exposition, reference_metrics};

/// Global keys whose share `/readyz` and `/config` list at most (by name; `keys` counts all).
const REGION_KEYS_SHOWN: usize = 100;

/// Shared by the routes.
#[derive(Debug)]
pub struct AdminState {
    pub ready: AtomicBool,
    pub handler: Arc<Handler>,
    /// Already redacted: shown as is on `/config`.
    pub settings: Settings,
    /// When the rules in force were loaded, and the last failed reload since.
    pub reload: Arc<crate::rules::reload::ReloadStatus>,
    /// The counter API, when `counter_api_token_file` is set.
    pub counter_api: Option<crate::counter_api::CounterApi>,
    /// Told when `ready` changes, so the gRPC health service follows at once (a drain's first
    /// moment included) rather than at its next look (`app/grpc.rs`).
    pub ready_changed: tokio::sync::Notify,
}

impl AdminState {
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
        self.ready_changed.notify_one();
    }

    /// Whether this replica is ready, and the status word `/readyz` shows: what `/readyz`,
    /// `/healthcheck` and the gRPC health service all answer from.
    pub fn readiness(&self) -> (bool, &'static str) {
        readiness(self)
    }
}

pub fn router(state: Arc<AdminState>) -> Router {
    let router = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/healthcheck", get(healthcheck))
        .route("/metrics", get(metrics))
        .route("/config", get(config));
    // `/json` is the one admin route that changes state (it spends tokens): `admin_json: false`
    // leaves it out, with an answer that says why rather than a bare 404.
    let router = if state.settings.admin_json {
        // The same bound as a gRPC message: a body past it is refused (413) unread.
        let limit = axum::extract::DefaultBodyLimit::max(state.settings.max_message_bytes);
        router.route("/json", post(json_decide).layer(limit))
    } else {
        router.route("/json", any(json_off))
    };
    let counters = state.counter_api.clone().map(|api| {
        crate::counter_api::router(api, state.handler.clone(), state.settings.max_message_bytes)
    });
    let router = router.with_state(state);
    match counters {
        Some(counters) => router.merge(counters),
        None => router,
    }
}

/// Serves `router` on the connections `accept` gives (HTTP/1, with a header read timeout of
/// `header_timeout`) until `stop`; then stops accepting, asks every connection to close after
/// its request in flight, and returns once they have.
pub async fn serve(
    accept: crate::service::listener::Accept,
    router: Router,
    header_timeout: std::time::Duration,
    stop: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let (closing, closed) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    loop {
        let conn = tokio::select! {
            conn = accept.next() => conn,
            _ = &mut stop => break,
        };
        // Who is on the other end, for the counter API's log.
        let peer = crate::counter_api::Peer(conn.peer());
        let service = hyper_util::service::TowerToHyperService::new(
            router.clone().layer(axum::Extension(peer)),
        );
        let mut closed = closed.clone();
        connections.spawn(async move {
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout);
            let conn = http.serve_connection(hyper_util::rt::TokioIo::new(conn), service);
            tokio::pin!(conn);
            let ended = tokio::select! {
                _ = conn.as_mut() => true,
                // (The guard `wait_for` returns is dropped inside: it is not Send.)
                _ = async { let _ = closed.wait_for(|c| *c).await; } => false,
            };
            if !ended {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
        });
        // Reap the connections that ended, so the set holds only open ones.
        while connections.try_join_next().is_some() {}
    }
    let _ = closing.send(true);
    while connections.join_next().await.is_some() {}
    Ok(())
}

async fn json_off() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({ "error": "POST /json is turned off on this server (admin_json: false)" })),
    )
        .into_response()
}

/// Whether this replica is ready, and the status word `/readyz` shows.
fn readiness(s: &AdminState) -> (bool, &'static str) {
    let (domains, _, _) = s.handler.rules.load().counts();
    if !s.ready.load(Ordering::SeqCst) {
        (false, "not ready")
    } else if domains == 0 && s.settings.unready_without_rules {
        (false, "no rules loaded")
    } else if s.settings.unready_until_store_answers && !s.handler.limiter.store().answered_once() {
        (false, "store never answered")
    } else {
        (true, "ready")
    }
}

/// The reference's `/healthcheck`: `OK` (200) when ready, else 500 and why, as it answers.
async fn healthcheck(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    match readiness(&s) {
        (true, _) => (StatusCode::OK, "OK".to_string()),
        (false, why) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{why}\n")),
    }
}

/// 200 when ready, 503 before and while draining; the body says why, in JSON:
/// `{"status", "rules": {"domains", "limits"}, "store": {"kind", "state", "error"?,
/// "warnings"?}}` (`error`: why the last connection attempt failed, while the store is not
/// connected; `warnings`: a Redis configuration that makes limits wrong). Later features
/// (fallback, fleet membership) add their own objects.
async fn readyz(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    let store = s.handler.limiter.store();
    let (domains, _, limits) = s.handler.rules.load().counts();
    let (ready, status) = readiness(&s);
    // The store's state is information, not a condition: see the module doc.
    let limiter = &s.handler.limiter;
    let replicas = limiter.replicas();
    let mut store_body = json!({ "kind": store.name(), "state": store.state() });
    if let Some(error) = store.connect_error() {
        store_body["error"] = json!(error);
    }
    let warnings = store.warnings();
    if !warnings.is_empty() {
        store_body["warnings"] = json!(warnings);
    }
    let mut rules_body = rules_status(domains, limits, &s.reload.view());
    let unknown = limiter.unknown_domains();
    if !unknown.is_empty() {
        // Requests named these domains and no rules file declares them: their descriptors
        // are not limited (often Envoy's `domain` differs from the rules' in case or spelling).
        rules_body["unknown_domains"] = json!(unknown);
    }
    let mut body = json!({
        "status": status,
        "rules": rules_body,
        "store": store_body,
        "fallback": {
            "mode": limiter.fallback_mode().name(),
            "open_circuits": store.open_circuits(),
            "replicas": replicas.count(),
            "replicas_source": replicas.source(),
        },
    });
    if let Some(shares) = limiter.regions() {
        body["regions"] = shares.report(REGION_KEYS_SHOWN);
    }
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body))
}

/// The `rules` object of `/readyz` and `/config`: counts, when the rules in force were loaded
/// (Unix ms), and, while the files on disk are broken, the last failed reload's error.
fn rules_status(
    domains: usize,
    limits: usize,
    view: &crate::rules::reload::StatusView,
) -> serde_json::Value {
    let mut rules =
        json!({ "domains": domains, "limits": limits, "loaded_at_unix_ms": view.loaded_at_ms });
    if let Some(version) = &view.version {
        rules["xds_version"] = json!(version);
    }
    if let Some((at, error)) = &view.failed {
        rules["reload_failed_at_unix_ms"] = json!(at);
        rules["reload_error"] = json!(error);
    }
    rules
}

/// The reference's Prometheus port (`prometheus_addr`): its metrics at `path`, mapped by
/// `mapper` (`telemetry/reference_metrics.rs`), in the text format its statsd exporter serves.
pub fn reference_metrics_router(
    metrics: Arc<crate::telemetry::Metrics>,
    mapper: Arc<reference_metrics::Mapper>,
    path: &str,
) -> Router {
    Router::new().route(
        path,
        get(move || {
            let text = reference_metrics::render(&metrics, &mapper);
            async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        exposition::Format::Text.content_type(),
                    )],
                    text,
                )
            }
        }),
    )
}

/// OpenMetrics when the scraper asks for it (Prometheus does), else the Prometheus text format
/// (`curl`, `promtool check metrics`, older agents): `telemetry/exposition.rs`.
async fn metrics(State(s): State<Arc<AdminState>>, headers: HeaderMap) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = exposition::Format::from_accept(accept);
    (
        [(header::CONTENT_TYPE, format.content_type())],
        exposition::render(&s.handler.metrics.render(), format),
    )
}

/// The body is read as JSON whatever its `Content-Type` (`curl -d` sends a form type), as the
/// reference's `/json` does.
async fn json_decide(
    State(s): State<Arc<AdminState>>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let req = match serde_json::from_slice::<JsonRequest>(&body) {
        Ok(req) => req.into_proto(),
        Err(e) => {
            let error = format!("not a RateLimitRequest in JSON: {e}");
            return (StatusCode::BAD_REQUEST, Json(json!({ "error": error }))).into_response();
        }
    };
    let parent = || RemoteParent::from_headers(|name| headers.get(name)?.to_str().ok());
    match s.handler.should_rate_limit(&req, parent, None).await {
        Ok(resp) => {
            let out = JsonResponse::from_proto(&resp);
            let code = if out.is_over_limit() {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (code, Json(out)).into_response()
        }
        Err(status) => {
            let code = if status.code() == tonic::Code::InvalidArgument {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            (code, Json(json!({ "error": status.message() }))).into_response()
        }
    }
}

/// `/config`: one line of JSON for scripts; `/config?pretty` indented, for people with curl.
async fn config(State(s): State<Arc<AdminState>>, RawQuery(query): RawQuery) -> Response {
    let rules = s.handler.rules.load();
    let (domains, _, limits) = rules.counts();
    let mut body = json!({
        "settings": s.settings,
        "store": s.handler.limiter.store().name(),
        "store_state": s.handler.limiter.store().state(),
        "rules": RulesView::new(&rules),
        "rules_status": rules_status(domains, limits, &s.reload.view()),
    });
    if let Some(shares) = s.handler.limiter.regions() {
        body["regions"] = shares.report(REGION_KEYS_SHOWN);
    }
    let pretty = query.as_deref().is_some_and(|q| {
        q.split('&')
            .any(|p| p == "pretty" || p.starts_with("pretty="))
    });
    if !pretty {
        return Json(body).into_response();
    }
    // A serde_json::Value always serialises.
    let text = serde_json::to_string_pretty(&body).unwrap_or_default() + "\n";
    ([(header::CONTENT_TYPE, "application/json")], text).into_response()
}
