//! The gRPC `RateLimitQuotaService` (RLQS): one task per `StreamRateLimitQuotas` stream,
//! turning Envoy's usage reports into [`Usage`]s for its [`Session`] (`rlqs/`) and the
//! session's [`Action`]s into `RateLimitQuotaResponse`s.
//!
//! The task waits for the next report, for the session's next refused bucket to have tokens
//! again ([`Session::wake`]), or for shutdown; a stream that sends nothing for three report
//! intervals (Envoy reports every one) is ended with DEADLINE_EXCEEDED. At shutdown every
//! bucket is told its assignment again with a TTL of 0, so each Envoy moves to its
//! `expired_assignment_behavior` before the listener closes, and the stream ends.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Kind, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
use futures_util::Stream;
use tokio::sync::{mpsc, watch};

use super::Handler;
use crate::rlqs::{Action, Assignment, FILL_SECS, Rlqs, RlqsError, Session, Usage};

/// Responses queued for one stream before its task waits for Envoy to read them.
const QUEUE: usize = 8;

/// The tonic service: the shared [`Handler`] (rules, limiter), the RLQS state, and the
/// shutdown flag.
#[derive(Clone, Debug)]
pub struct RlqsService {
    pub handler: Arc<Handler>,
    pub rlqs: Arc<Rlqs>,
    pub stop: watch::Receiver<bool>,
}

type Responses = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = Responses;

    async fn stream_rate_limit_quotas(
        &self,
        request: tonic::Request<tonic::Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<tonic::Response<Responses>, tonic::Status> {
        let peer = request.remote_addr().map(|a| a.ip());
        let session = Session::open(&self.rlqs, peer).map_err(|e| status(&e))?;
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(
            session,
            request.into_inner(),
            tx,
            self.handler.clone(),
            self.stop.clone(),
        ));
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        Ok(tonic::Response::new(Box::pin(stream)))
    }
}

/// The gRPC status that ends a stream for `e`.
fn status(e: &RlqsError) -> tonic::Status {
    let m = e.to_string();
    match e {
        RlqsError::NoDomain | RlqsError::DomainChanged { .. } => tonic::Status::invalid_argument(m),
        RlqsError::UnknownDomain(_) => tonic::Status::not_found(m),
        RlqsError::NotRlqs(_) => tonic::Status::failed_precondition(m),
        RlqsError::TooManyStreams(_) | RlqsError::TooManyStreamsFromPeer { .. } => {
            tonic::Status::resource_exhausted(m)
        }
    }
}

/// One stream, until Envoy closes it, it fails, it goes silent, or tollgate shuts down.
async fn run(
    mut session: Session,
    mut inbound: tonic::Streaming<RateLimitQuotaUsageReports>,
    tx: mpsc::Sender<Result<RateLimitQuotaResponse, tonic::Status>>,
    handler: Arc<Handler>,
    mut stop: watch::Receiver<bool>,
) {
    let config = session.config().clone();
    let clock = config.clock.clone();
    let silent = Duration::from_millis(config.report_interval_ms.saturating_mul(3).max(10_000));
    // Silence is counted from the last report that named a bucket (held, or told DENY_ALL past
    // a cap), whatever wake-ups happen meanwhile: a stream that only sends empty reports holds
    // a place in rlqs_max_streams for nothing, and is ended like a silent one.
    let mut heard_ms = clock.mono_ms();
    loop {
        let quiet = Duration::from_millis(clock.mono_ms().saturating_sub(heard_ms));
        let wake_in = session
            .next_wake_ms()
            .map(|at| Duration::from_millis(at.saturating_sub(clock.mono_ms())));
        let actions = tokio::select! {
            biased;
            () = stopped(&mut stop) => {
                // Bounded, so an Envoy that stopped reading cannot hold shutdown up.
                let actions = session.closing();
                let _ = clock
                    .timeout(Duration::from_secs(1), tx.send(Ok(response(&actions))))
                    .await;
                return;
            }
            message = clock.timeout(silent.saturating_sub(quiet), inbound.message()) => match message {
                Err(_) => {
                    session.refused("idle_stream");
                    let _ = tx.send(Err(tonic::Status::deadline_exceeded(format!(
                        "no RLQS report naming a bucket for {} s: Envoy reports its buckets every interval",
                        silent.as_secs()
                    )))).await;
                    return;
                }
                // Envoy closed its side, or the stream broke: nothing more to say.
                Ok(Ok(None)) | Ok(Err(_)) => return,
                Ok(Ok(Some(report))) => {
                    let usages = usages(report.bucket_quota_usages);
                    let rules = handler.rules.load();
                    match session
                        .report(&handler.limiter, &rules, &report.domain, usages)
                        .await
                    {
                        Ok(actions) => {
                            // Held a bucket, or was told something (ids refused by a cap are
                            // told DENY_ALL, and such a stream is an Envoy to keep denying).
                            if session.buckets() > 0 || !actions.is_empty() {
                                heard_ms = clock.mono_ms();
                            }
                            actions
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "RLQS stream refused");
                            let _ = tx.send(Err(status(&e))).await;
                            return;
                        }
                    }
                }
            },
            () = sleep_or_never(&clock, wake_in) => session.wake(&handler.limiter).await,
        };
        if !actions.is_empty() && tx.send(Ok(response(&actions))).await.is_err() {
            return; // Envoy went away.
        }
    }
}

/// Resolves once the shutdown flag is set (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn sleep_or_never(clock: &crate::clock::Clock, d: Option<Duration>) {
    match d {
        Some(d) => clock.sleep(d).await,
        None => std::future::pending().await,
    }
}

/// A report's usages as the session takes them: each id's map as its pairs, sorted (an
/// answer rebuilds the same map from them, so no copy of Envoy's map is kept).
fn usages(
    reported: Vec<
        envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage,
    >,
) -> Vec<Usage> {
    reported
        .into_iter()
        .map(|u| {
            let bucket = u.bucket_id.unwrap_or_default();
            let mut key: Vec<(String, String)> = bucket.bucket.into_iter().collect();
            key.sort();
            let elapsed_ms = u.time_elapsed.map_or(0, |d| {
                (d.seconds.max(0) as u64)
                    .saturating_mul(1000)
                    .saturating_add((d.nanos.max(0) / 1_000_000) as u64)
            });
            Usage {
                id: key,
                allowed: u.num_requests_allowed,
                denied: u.num_requests_denied,
                elapsed_ms,
            }
        })
        .collect()
}

/// The response carrying `actions`. A token bucket is sent after a `DENY_ALL` for the same
/// bucket, in the same response: Envoy 1.40 starts a token bucket that replaces another at
/// the old one's fill ratio (its leftover carries over), but one that replaces a blanket rule
/// full, and it applies a response's actions in order before its workers see any of them.
/// So each assignment holds exactly what was claimed for it.
fn response(actions: &[Action]) -> RateLimitQuotaResponse {
    let mut bucket_action = Vec::with_capacity(actions.len());
    for a in actions {
        let id = BucketId {
            bucket: a.id.iter().cloned().collect(),
        };
        // (Not for an expiry at shutdown: that one should carry the leftover into Envoy's
        // fallback, not a full bucket.)
        if let Assignment::Tokens { ttl_s, .. } = a.assignment
            && ttl_s > 0
        {
            bucket_action.push(BucketAction {
                bucket_id: Some(id.clone()),
                bucket_action: Some(kind(Assignment::DenyAll { ttl_s })),
            });
        }
        bucket_action.push(BucketAction {
            bucket_id: Some(id),
            bucket_action: Some(kind(a.assignment)),
        });
    }
    RateLimitQuotaResponse { bucket_action }
}

fn kind(a: Assignment) -> Kind {
    let assign = |ttl_s: u64, strategy: Strategy| {
        Kind::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(PbDuration {
                seconds: i64::try_from(ttl_s).unwrap_or(i64::MAX),
                nanos: 0,
            }),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })
    };
    match a {
        Assignment::Tokens { tokens, ttl_s } => assign(
            ttl_s,
            Strategy::TokenBucket(TokenBucket {
                max_tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
                tokens_per_fill: Some(UInt32Value {
                    value: u32::try_from(tokens).unwrap_or(u32::MAX),
                }),
                fill_interval: Some(PbDuration {
                    seconds: FILL_SECS,
                    nanos: 0,
                }),
            }),
        ),
        Assignment::AllowAll { ttl_s } => {
            assign(ttl_s, Strategy::BlanketRule(BlanketRule::AllowAll as i32))
        }
        Assignment::DenyAll { ttl_s } => {
            assign(ttl_s, Strategy::BlanketRule(BlanketRule::DenyAll as i32))
        }
        Assignment::Abandon => Kind::AbandonAction(AbandonAction {}),
    }
}
