//! What one tracked RLQS bucket id costs the process, counted exactly: this test binary's
//! allocator counts the bytes live, and the RLQS sessions run in-process on the memory store
//! (as `serve` builds them). `rlqs_max_state_bytes` counts each id as
//! [`tollgate::rlqs::tracked_bytes`]; that must never be less than what an id really holds, or
//! the bound would not bound.
//!
//! The allocator is the one `unsafe` here: `GlobalAlloc` is an unsafe trait. It only counts and
//! passes every call on to the system allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use tollgate::clock::Clock;
use tollgate::limiter::{Limiter, LimiterConfig};
use tollgate::rlqs::{Rlqs, RlqsConfig, Session, Usage, tracked_bytes};
use tollgate::rules::LoadOptions;
use tollgate::rules::load::load_sources;
use tollgate::store::{MemoryStore, Store};
use tollgate::telemetry::Metrics;

/// Bytes allocated and not yet freed by this process.
static LIVE: AtomicI64 = AtomicI64::new(0);

/// One measurement at a time: the tests of this binary share the count.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct Counting;

// SAFETY: every call is passed on to `System` unchanged; only the sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const RULES: &str = "domain: quota\nrlqs: true\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 600}\n";

/// Live bytes per id after `streams` streams report `ids` ids of `value`-byte values in all,
/// each stream in reports of 100 (the sessions and the memory store hold them).
fn bytes_per_id(ids: usize, value: usize, streams: usize) -> f64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let clock = Clock::manual(1_700_000_000_000);
        let metrics = Arc::new(Metrics::new());
        let store = Store::Memory(MemoryStore::new(clock.clone()));
        let limiter = Limiter::new(store, LimiterConfig::new(clock.clone()), metrics.clone());
        let rules = load_sources(
            &[(PathBuf::from("q.yaml"), RULES.to_string())],
            LoadOptions::default(),
        )
        .unwrap();
        let rlqs = Rlqs::new(
            RlqsConfig {
                report_interval_ms: 5_000,
                assignment_ttl_ms: 15_000,
                max_streams: 1_024,
                max_streams_per_peer: 1_024,
                max_buckets_per_stream: 1_000_000,
                max_state_bytes: u64::MAX,
                idle_ms: 60_000,
                max_entries: 16,
                max_key_bytes: 256,
                max_value_bytes: 4_096,
                clock: clock.clone(),
            },
            metrics.rlqs.clone(),
        );
        let mut sessions: Vec<Session> = (0..streams)
            .map(|_| Session::open(&rlqs, None).unwrap())
            .collect();
        // One id first, so what the first id of all sets up (the domain's maps, the limiter's
        // metrics) is not counted as the ids'.
        let id = |i: usize| vec![("tenant".to_string(), format!("{i:0value$}"))];
        let one = |i: usize| Usage {
            id: id(i),
            allowed: 1,
            denied: 0,
            elapsed_ms: 0,
        };
        for (n, s) in sessions.iter_mut().enumerate() {
            s.report(&limiter, &rules, "quota", vec![one(ids + n)])
                .await
                .unwrap();
        }
        let before = LIVE.load(Ordering::Relaxed);
        for chunk in (0..ids).collect::<Vec<_>>().chunks(100) {
            let s = &mut sessions[chunk[0] / 100 % streams];
            s.report(
                &limiter,
                &rules,
                "",
                chunk.iter().map(|&i| one(i)).collect(),
            )
            .await
            .unwrap();
        }
        let after = LIVE.load(Ordering::Relaxed);
        let held: usize = sessions.iter().map(Session::buckets).sum();
        assert_eq!(held, ids + streams);
        (after - before) as f64 / ids as f64
    })
}

#[test]
fn a_tracked_id_costs_no_more_than_rlqs_max_state_bytes_counts() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    // 7,200 ids: the maps have just grown (the least full, the most bytes per entry).
    for (ids, value) in [
        (5_000, 16),
        (7_200, 16),
        (5_000, 64),
        (7_200, 128),
        (5_000, 200),
        (7_200, 1_000),
        (5_000, 4_000),
    ] {
        let live = bytes_per_id(ids, value, 8);
        let counted = tracked_bytes(&[("tenant".into(), "v".repeat(value))]);
        eprintln!(
            "{ids} bucket ids of a {value}-byte value: {live:.0} bytes live each, counted as {counted}"
        );
        assert!(
            live <= counted as f64,
            "{value}-byte values: {live:.0} bytes live per id, counted as {counted}"
        );
    }
}

mod common;

/// Through the gRPC service (a server in this process, raw RLQS streams to it, 4 KB values):
/// the stream task keeps no copy of an id beside its session's (it kept Envoy's map too: two
/// more copies of the value, ~13 KB an id). The streams are opened and used first, so their
/// buffers are in place: what the second round adds is the ids' own cost.
#[test]
fn through_the_grpc_service_an_id_costs_no_more() {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
        BucketId, RateLimitQuotaUsageReports,
    };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let server = common::InProcess::start(RULES, |s| s.rlqs_max_buckets_per_stream = 1_000_000);
    let grpc = server.grpc;
    let rt = tokio::runtime::Runtime::new().unwrap();
    type Streams = Vec<(
        tokio::sync::mpsc::Sender<RateLimitQuotaUsageReports>,
        tonic::Streaming<RateLimitQuotaResponse>,
    )>;
    let mut streams: Streams = rt.block_on(async {
        let mut streams = Vec::new();
        for _ in 0..8 {
            let mut client = RateLimitQuotaServiceClient::connect(format!("http://{grpc}"))
                .await
                .unwrap();
            let (tx, rx) = tokio::sync::mpsc::channel::<RateLimitQuotaUsageReports>(16);
            let outbound = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|m| (m, rx))
            });
            let inbound = client
                .stream_rate_limit_quotas(outbound)
                .await
                .unwrap()
                .into_inner();
            streams.push((tx, inbound));
        }
        streams
    });
    let value = |round: usize, i: usize| {
        format!("r{round}-{i:07}{}", "v".repeat(4_000))[..4_000].to_string()
    };
    for (round, ids) in [(0usize, 800usize), (1, 4_000)] {
        let before = LIVE.load(Ordering::Relaxed);
        rt.block_on(async {
            for (stream, (tx, inbound)) in streams.iter_mut().enumerate() {
                let mine: Vec<usize> = (stream..ids).step_by(8).collect();
                // 12 ids of 4 KB: one message within max_message_bytes (64 KiB).
                for chunk in mine.chunks(12) {
                    let usages = chunk
                        .iter()
                        .map(|&i| BucketQuotaUsage {
                            bucket_id: Some(BucketId {
                                bucket: [("tenant".to_string(), value(round, i))]
                                    .into_iter()
                                    .collect(),
                            }),
                            time_elapsed: None,
                            num_requests_allowed: 1,
                            num_requests_denied: 0,
                        })
                        .collect();
                    tx.send(RateLimitQuotaUsageReports {
                        domain: "quota".into(),
                        bucket_quota_usages: usages,
                    })
                    .await
                    .unwrap();
                    inbound.message().await.unwrap().unwrap();
                }
            }
        });
        let live = (LIVE.load(Ordering::Relaxed) - before) as f64 / ids as f64;
        let counted = tracked_bytes(&[("tenant".into(), value(round, 0))]);
        eprintln!(
            "round {round}: {ids} ids of 4 KB through gRPC, {live:.0} bytes live each, counted as {counted}"
        );
        if round == 1 {
            assert!(
                live <= counted as f64,
                "{live:.0} bytes live per id, counted as {counted}"
            );
        }
    }
}
