//! When a started replica says it is ready: the startup line (ready, or why not: no rules with
//! `unready_without_rules`, no answer from the store yet with `unready_until_store_answers`),
//! and the wait for the store's first answer that turns `/readyz` to 200 or, past
//! `store_startup_timeout_ms`, stops tollgate.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::AppError;
use crate::admin::AdminState;
use crate::service::Handler;
use crate::settings::Settings;

/// Logs the startup line; true when readiness waits for the store's first answer.
pub(super) fn announce(
    settings: &Settings,
    handler: &Handler,
    grpc_addr: SocketAddr,
    admin_addr: SocketAddr,
) -> bool {
    // "ready" only when /readyz says so: with no rules and unready_without_rules it answers 503,
    // and until the store first answered with unready_until_store_answers.
    let store_name = handler.limiter.store().name();
    let gated = settings.unready_until_store_answers && !handler.limiter.store().answered_once();
    if settings.unready_without_rules && handler.rules.load().counts().0 == 0 {
        tracing::warn!(%grpc_addr, %admin_addr, store = store_name, "tollgate listening, not ready: no rules loaded (unready_without_rules)");
    } else if gated {
        let error = handler.limiter.store().connect_error().unwrap_or_default();
        tracing::warn!(%grpc_addr, %admin_addr, store = store_name, %error, "tollgate listening, not ready until the store answers (unready_until_store_answers)");
    } else {
        tracing::info!(%grpc_addr, %admin_addr, store = store_name, "tollgate ready");
    }
    gated
}

/// Waits for the store's first answer: says when the replica becomes ready (`gated`: it was
/// not, for want of one), or fails with the last connection error when `timeout` (not zero)
/// passes first, which stops tollgate: a crash loop is what an operator sees, as the
/// reference's `REDIS_STARTUP_MAX_ELAPSED_TIME` gives.
pub(super) async fn first_store_answer(
    admin: Arc<AdminState>,
    gated: bool,
    (started, timeout): (tokio::time::Instant, Duration),
    stop: impl Future<Output = ()>,
) -> Result<(), AppError> {
    let store = admin.handler.limiter.store();
    tokio::pin!(stop);
    while !store.answered_once() {
        // Once shutdown began (unready, draining) there is nothing to give up on.
        if !admin.ready.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        if !timeout.is_zero() && started.elapsed() >= timeout {
            return Err(AppError::StoreNeverAnswered {
                waited: timeout,
                error: store.connect_error().unwrap_or_default(),
            });
        }
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    if gated {
        tracing::info!(store = store.name(), "the store answered: tollgate ready");
    }
    Ok(())
}
