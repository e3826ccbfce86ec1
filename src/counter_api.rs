//! The counter API on the admin port: what an operator asks of a tenant's quota ("what is
//! left right now", "reset it after this support ticket"), off unless
//! `counter_api_token_file` is set.
//!
//! | route | answer |
//! |---|---|
//! | `POST /counters/read`  | the buckets of a RateLimitRequest in proto3 JSON (as `/json` takes it): one per counted limit that applies, with remaining, reset, the key, a sharded limit's shards and what this replica's lease holds; nothing is spent |
//! | `POST /counters/reset` | the same buckets, as they were, and then deleted: each starts over, full |
//! | `POST /counters/explain` | the same buckets, each with the rule it comes from (file:line, path), the capacity enforced here, the balance signed (debt below zero) and what would decide a request of it now (`decided_by`: this replica's lease, its over-limit cache, the store, or the fallback and why); nothing is spent, no lease is claimed; answered when the store is down too |
//!
//! A domain no rules file declares is answered 404 with the domains in force (and the nearest
//! one by spelling), not an empty list of buckets.
//!
//! A call flows: the bearer token (`Authorization: Bearer …`) is compared with the file's,
//! read at each call (a rotated Secret applies at once; missing or wrong: 401, nothing read or
//! changed) → the body becomes a limiter request through the same checks as `/json` and gRPC →
//! `limiter/counters.rs` reads the buckets from the store, or resets them → JSON. Each call is
//! counted (`tollgate_counter_api_calls_total{action, result}`) and logged with who asked: the
//! peer address and the optional `x-tollgate-operator` and `x-tollgate-reason` headers. The
//! token itself is never logged or shown.
//!
//! A reset on Redis is written to the fleet's reset log; [`follow_resets`] runs on every
//! replica with the API on and forgets, each membership interval, what the replica holds of
//! buckets reset anywhere (its over-limit cache entries, which would go on refusing the tenant
//! until the old wait ends, and its lease tokens, claimed from the old count).

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use serde_json::json;

use crate::clock::Clock;
use crate::limiter::Limiter;
use crate::service::Handler;
use crate::service::json::JsonRequest;
use crate::service::request::to_request;
use crate::telemetry::CounterApiLabels;

/// The counter API's settings, once `counter_api_token_file` is set.
#[derive(Clone, Debug)]
pub struct CounterApi {
    pub token_file: PathBuf,
    /// The membership set's key, `<key_prefix>{members}`: the fleet's reset log hangs off it.
    pub members_key: String,
}

/// What the routes share.
struct Api {
    config: CounterApi,
    handler: Arc<Handler>,
}

/// The routes, on `handler`'s rules and limiter; a body of at most `max_body` bytes.
pub fn router(config: CounterApi, handler: Arc<Handler>, max_body: usize) -> Router {
    let state = Arc::new(Api { config, handler });
    Router::new()
        .route("/counters/read", post(read))
        .route("/counters/reset", post(reset))
        .route("/counters/explain", post(explain))
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// The peer of an admin connection, put in each of its requests by `admin::serve`.
#[derive(Clone, Copy, Debug)]
pub struct Peer(pub Option<SocketAddr>);

/// Reads the token in `path`: its content without surrounding whitespace (a Secret's file
/// often ends with a newline). `Err` says what is wrong, never what the file holds.
pub fn read_token(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(token.to_string())
}

/// Equal byte strings, compared in a time that depends on neither where they first differ
/// nor whether their lengths do (only on the longer one's length).
fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..n {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0);
    }
    diff == 0
}

/// The credentials of an `Authorization: Bearer <token>` header (the scheme in any case, as
/// RFC 9110 has it); `None` without one.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

enum Action {
    Read,
    Reset,
    Explain,
}

impl Action {
    fn name(&self) -> &'static str {
        match self {
            Action::Read => "read",
            Action::Explain => "explain",
            Action::Reset => "reset",
        }
    }
}

async fn read(
    State(s): State<Arc<Api>>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    call(&s, Action::Read, peer, &headers, &body).await
}

async fn reset(
    State(s): State<Arc<Api>>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    call(&s, Action::Reset, peer, &headers, &body).await
}

async fn explain(
    State(s): State<Arc<Api>>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    call(&s, Action::Explain, peer, &headers, &body).await
}

/// An optional header for the log: at most 200 characters, without control characters.
fn logged_header(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.chars().filter(|c| !c.is_control()).take(200).collect())
        .unwrap_or_default()
}

async fn call(
    s: &Api,
    action: Action,
    peer: Option<Extension<Peer>>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let api = &s.config;
    let peer = peer
        .and_then(|Extension(Peer(p))| p)
        .map_or_else(|| "unknown".to_string(), |p| p.to_string());
    let operator = logged_header(headers, "x-tollgate-operator");
    let reason = logged_header(headers, "x-tollgate-reason");
    let count = |result: &'static str| {
        s.handler
            .metrics
            .counter_api
            .get_or_create(&CounterApiLabels {
                action: action.name(),
                result,
            })
            .inc();
    };
    let error = |code: StatusCode, message: String| {
        (code, Json(json!({ "error": message }))).into_response()
    };

    // 1. Who asks: a caller without credentials is refused before the file is read.
    let refuse = |why: &'static str| {
        tracing::warn!(action = action.name(), %peer, %operator, why, "counter API: refused");
        count("unauthorized");
        let mut r = error(StatusCode::UNAUTHORIZED, why.to_string());
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer realm=\"tollgate counters\""),
        );
        r
    };
    let Some(given) = bearer(headers) else {
        return refuse("missing: send Authorization: Bearer <token>");
    };
    let path = api.token_file.clone();
    let token = match tokio::task::spawn_blocking(move || read_token(&path)).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            tracing::error!(error = %e, "counter API: the token file cannot be read; every call is refused");
            count("error");
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the counter API's token file cannot be read (see the server's log)".into(),
            );
        }
        Err(e) => {
            count("error");
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the token check failed: {e}"),
            );
        }
    };
    if !same(given.as_bytes(), token.as_bytes()) {
        return refuse("wrong bearer token");
    }

    // 2. What about: a RateLimitRequest, checked as any.
    let proto = match serde_json::from_slice::<JsonRequest>(body) {
        Ok(req) => req.into_proto(),
        Err(e) => {
            count("invalid");
            return error(
                StatusCode::BAD_REQUEST,
                format!("not a RateLimitRequest in JSON: {e}"),
            );
        }
    };
    let req = match to_request(&proto, &s.handler.bounds) {
        Ok(r) => r,
        Err(status) => {
            count("invalid");
            return error(StatusCode::BAD_REQUEST, status.message().to_string());
        }
    };

    // 3. Read, or reset: a domain the rules do not declare has no buckets to read, and an
    // empty list would read as "nothing counted yet" (often the request's domain is spelt
    // otherwise than the rules').
    let rules = s.handler.rules.load();
    if !rules.domains.contains_key(&proto.domain) {
        count("invalid");
        let mut known: Vec<&str> = rules.domains.keys().map(String::as_str).collect();
        known.sort_unstable();
        let near = crate::error_text::closest(&proto.domain, &known, 3)
            .map(|d| format!(" (did you mean `{d}`?)"))
            .unwrap_or_default();
        let listed = known
            .iter()
            .take(20)
            .copied()
            .collect::<Vec<_>>()
            .join(", ");
        return error(
            StatusCode::NOT_FOUND,
            format!(
                "no rules declare the domain `{}`{near}; the domains in force: {listed}",
                proto.domain
            ),
        );
    }
    let limiter = &s.handler.limiter;
    if let Action::Explain = action {
        // Answered whatever the store says: when it cannot be read, each bucket says the
        // fallback decides and why.
        let explained = limiter.explain(&rules, &req).await;
        count("ok");
        let keys: Vec<&str> = explained.iter().map(|b| b.bucket.key.as_str()).collect();
        tracing::info!(%peer, %operator, %reason, domain = %proto.domain, ?keys, "counter API: explain");
        return Json(json!({ "domain": proto.domain, "buckets": explained })).into_response();
    }
    let result = match action {
        Action::Read | Action::Explain => limiter.read_buckets(&rules, &req).await,
        Action::Reset => limiter.reset_buckets(&rules, &req, &api.members_key).await,
    };
    match result {
        Ok(buckets) => {
            count("ok");
            let keys: Vec<&str> = buckets.iter().map(|b| b.key.as_str()).collect();
            match action {
                Action::Read | Action::Explain => tracing::info!(
                    %peer, %operator, %reason, domain = %proto.domain, ?keys,
                    "counter API: read"
                ),
                Action::Reset => tracing::warn!(
                    %peer, %operator, %reason, domain = %proto.domain, ?keys,
                    "counter API: reset"
                ),
            }
            let field = match action {
                Action::Read | Action::Explain => "buckets",
                Action::Reset => "reset",
            };
            Json(json!({ "domain": proto.domain, field: buckets })).into_response()
        }
        Err(e) => {
            count("error");
            tracing::warn!(action = action.name(), %peer, %operator, error = %e, "counter API: the store did not answer");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the store did not answer: {e}"),
            )
        }
    }
}

/// Follows the fleet's reset log (`lua/resets.lua`) every `interval` until `stop`: each
/// bucket reset since the last look, on any replica, is forgotten here (its over-limit cache
/// entry and lease tokens). The first look only learns where the log is: a replica that has
/// just started holds nothing of earlier resets.
pub async fn follow_resets(
    limiter: &Limiter,
    members_key: &str,
    interval: Duration,
    clock: &Clock,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut seen: Option<u64> = None;
    let mut warned = false;
    loop {
        match limiter.store().resets_since(members_key, seen).await {
            Ok(log) => {
                if seen.is_some() && !log.complete {
                    let dropped = limiter.forget_all_cached();
                    tracing::warn!(
                        entries = dropped,
                        "counter API: resets may be missing from the fleet's log (more than it keeps, or it was lost): forgot the whole over-limit cache"
                    );
                }
                if seen.is_some() && !log.keys.is_empty() {
                    let dropped = limiter.forget_buckets(&log.keys);
                    tracing::info!(
                        buckets = log.keys.len(),
                        leased_tokens_dropped = dropped,
                        "counter API: forgot buckets reset in the fleet"
                    );
                }
                let seq = log.seq;
                seen = Some(seq);
                warned = false;
            }
            Err(e) if !warned => {
                warned = true;
                tracing::warn!(error = %e, "counter API: cannot read the fleet's reset log; will retry");
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = &mut stop => break,
            () = clock.sleep(interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole_and_files_say_what_is_wrong() {
        assert!(same(b"s3cret", b"s3cret"));
        assert!(!same(b"s3cret", b"s3cre"));
        assert!(!same(b"s3cret", b"s3creT"));
        assert!(
            !same(b"s3cret", b"s3cret\0"),
            "a padded token is another token"
        );
        assert!(!same(b"", b"x") && same(b"", b""));
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        for (value, want) in [
            ("Bearer abc", Some("abc")),
            ("bearer abc ", Some("abc")),
            ("BEARER abc", Some("abc")),
            ("Basic abc", None),
            ("abc", None),
        ] {
            h.insert(header::AUTHORIZATION, value.parse().unwrap());
            assert_eq!(bearer(&h), want, "{value}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cret\n").unwrap();
        assert_eq!(read_token(&path).unwrap(), "s3cret");
        std::fs::write(&path, " \n").unwrap();
        let e = read_token(&path).unwrap_err();
        assert!(e.contains("is empty"), "{e}");
        let e = read_token(&dir.path().join("missing")).unwrap_err();
        assert!(e.contains("cannot read") && !e.contains("s3cret"), "{e}");
    }
}
