//! Budgets a client cannot talk its way around: what a refund (Envoy's `is_negative_hits`)
//! may give back, held on every store with real processes (issue 68; docs/usage-costs.md,
//! "What a refund can give back").
//!
//! - A refund after a window's edge gives nothing to the next window: the reservation's
//!   receipt names its window (a real one-minute edge; memory, Redis and a 3-node cluster on
//!   the same edge).
//! - A refund gives back at most what its receipt says was taken.
//! - A refund never pays overdraft debt (fixed window and token bucket).
//! - A shadow-mode limit that was over took nothing, so its descriptor's `metadata` (which may
//!   gate a refund) is not returned.
//!
//! Each talks gRPC to an in-process tollgate with `response_dynamic_metadata` on and reads the
//! receipt from the response, as Envoy's settlement would.

mod common;

use std::time::Duration;

use common::redis::{TestCluster, TestRedis, unique_prefix};
use common::{InProcess, request};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::Value as Json;

/// A tenant's reserved budget of 100 a minute on a fixed window, settled by `reservation`.
const MINUTE_BUDGET: &str = "domain: money
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: fixed_window}
    descriptors:
      - key: reservation
        charge_parent: true
";

/// Reserved budgets without windows (a token bucket of 100 an hour), and 10-an-hour overdraft
/// limits on a fixed window and a token bucket, refunded without a receipt.
const BUDGETS: &str = "domain: money
descriptors:
  - key: bucket
    rate_limit: {unit: hour, requests_per_unit: 100}
    descriptors:
      - key: reservation
        charge_parent: true
  - key: debt_window
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: fixed_window, overdraft: true}
  - key: debt_bucket
    rate_limit: {unit: hour, requests_per_unit: 10, overdraft: true}
  - key: tenant
    descriptors:
      - key: slot
        value: held
        metadata: {slot: held}
        shadow_mode: true
        rate_limit: {unit: hour, requests_per_unit: 3}
";

fn server(rules: &str, store: &str) -> InProcess {
    let (store, prefix) = (store.to_string(), unique_prefix("refund-bounds"));
    InProcess::start(rules, move |s| {
        s.store = store;
        s.key_prefix = prefix;
        s.response_dynamic_metadata = true;
    })
}

/// One descriptor of `entries` costing `hits`, given back when `refund`.
fn one(entries: &[(&str, &str)], hits: u64, refund: bool) -> RateLimitRequest {
    let mut r = request("money", &[entries]);
    r.descriptors[0].hits_addend = Some(UInt64Value { value: hits });
    r.descriptors[0].is_negative_hits = refund;
    r
}

/// What one call answered: the overall code, the first status's remaining and reset (s), and
/// the dynamic metadata's `metadata` map (Null when absent).
struct Answer {
    ok: bool,
    remaining: u32,
    reset_s: i64,
    metadata: Json,
}

async fn call(server: &InProcess, req: RateLimitRequest) -> Answer {
    let r = server
        .client()
        .await
        .should_rate_limit(req)
        .await
        .expect("answered")
        .into_inner();
    let status = &r.statuses[0];
    let metadata = r
        .dynamic_metadata
        .as_ref()
        .map(tollgate::structpb::from_struct)
        .and_then(|m| m.get("metadata").cloned())
        .unwrap_or(Json::Null);
    Answer {
        ok: r.overall_code == Code::Ok as i32,
        remaining: status.limit_remaining,
        reset_s: status
            .duration_until_reset
            .as_ref()
            .map_or(-1, |d| d.seconds),
        metadata,
    }
}

/// A reservation's receipt, as the settlement reads it (`metadata.reservation`).
fn receipt(a: &Answer) -> String {
    a.metadata["reservation"]
        .as_str()
        .unwrap_or_else(|| panic!("a passing reservation has a receipt: {:?}", a.metadata))
        .to_string()
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// Waits (real time: the edge is the wall clock's, which Redis `TIME` reads too) until
/// `before_ms` before the next edge of `window_ms` windows; returns that edge.
async fn until_before_edge(window_ms: u64, before_ms: u64) -> u64 {
    let now = wall_ms();
    let mut edge = now - now % window_ms + window_ms;
    if edge - now < before_ms {
        edge += window_ms;
    }
    tokio::time::sleep(Duration::from_millis(edge - before_ms - now)).await;
    edge
}

/// Waits until `ms` after `edge`.
async fn until_after(edge: u64, ms: u64) {
    let now = wall_ms();
    if now < edge + ms {
        tokio::time::sleep(Duration::from_millis(edge + ms - now)).await;
    }
}

/// A reservation of 60 two seconds before a one-minute edge, one of 60 just after, then the
/// first settled (60 given back, 10 used charged), on each store at once on the same edge. The
/// first's give-back comes after its window ended, so it gives the new window nothing: the new
/// window has 100 − 60 − 10 = 30 left, and of three more reservations of 30 one passes. Before
/// receipts the late give-back landed in the new window (90 left, all three passed: 160 of 100
/// admitted in one window).
async fn late_refunds_give_the_next_window_nothing(stores: &[(&str, &InProcess)]) {
    // The setup must straddle the edge: the first reservations end under 2 s before it (their
    // reset, in whole seconds rounded up, at most 2), all before the edge.
    // A setup that missed (a slow start) waits for the next edge; the assertions run once.
    let mut attempt = 0;
    let (edge, tenant, firsts) = loop {
        attempt += 1;
        assert!(attempt <= 3, "three setups in a row missed their edge");
        let edge = until_before_edge(60_000, 1_700).await;
        let tenant = format!("t{attempt}");
        let mut firsts = Vec::new();
        for (_, s) in stores {
            firsts.push(call(s, one(&[("tenant", &tenant)], 60, false)).await);
        }
        let straddles = firsts.iter().all(|a| a.ok && a.reset_s <= 2) && wall_ms() < edge - 100;
        if straddles {
            break (edge, tenant, firsts);
        }
        eprintln!(
            "setup missed the edge (resets {:?}); the next one",
            firsts.iter().map(|a| a.reset_s).collect::<Vec<_>>()
        );
    };
    until_after(edge, 300).await;
    for ((name, s), first) in stores.iter().zip(&firsts) {
        let second = call(s, one(&[("tenant", &tenant)], 60, false)).await;
        assert!(
            second.ok && second.remaining == 40,
            "{name}: the new window"
        );
        // The first request's settlement: its estimate back, its usage charged, one call.
        let settle = RateLimitRequest {
            descriptors: vec![
                one(
                    &[("tenant", &tenant), ("reservation", &receipt(first))],
                    60,
                    true,
                )
                .descriptors
                .remove(0),
                one(
                    &[("tenant", &tenant), ("reservation", &receipt(first))],
                    10,
                    false,
                )
                .descriptors
                .remove(0),
            ],
            ..request("money", &[])
        };
        call(s, settle).await;
        let left = call(s, one(&[("tenant", &tenant)], 0, false)).await;
        let mut admitted = 0;
        for _ in 0..3 {
            admitted += usize::from(call(s, one(&[("tenant", &tenant)], 30, false)).await.ok);
        }
        eprintln!(
            "{name}: after the late settlement {} left, {admitted} of 3 reservations of 30 admitted",
            left.remaining
        );
        assert_eq!(
            (left.remaining, admitted),
            (30, 1),
            "{name}: a late give-back minted quota in the next window"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_after_the_windows_edge_gives_the_next_window_nothing() {
    let redis = TestRedis::start();
    let cluster = tokio::task::spawn_blocking(TestCluster::shared)
        .await
        .expect("cluster");
    let memory = server(MINUTE_BUDGET, "memory");
    let on_redis = server(MINUTE_BUDGET, &redis.url());
    let on_cluster = server(MINUTE_BUDGET, &cluster.url());
    late_refunds_give_the_next_window_nothing(&[
        ("memory", &memory),
        ("redis", &on_redis),
        ("cluster", &on_cluster),
    ])
    .await;
}

/// Waits while the wall clock is within 3 s of an hour's edge, so a test of hour windows runs
/// inside one window.
async fn away_from_an_hours_edge() {
    let into = wall_ms() % 3_600_000;
    if into > 3_597_000 {
        tokio::time::sleep(Duration::from_millis(3_600_000 - into + 100)).await;
    }
}

/// Debt, receipts' tokens and shadow limits on one store.
async fn bounds_on(store: &str) {
    away_from_an_hours_edge().await;
    let s = server(BUDGETS, store);

    // A refund gives back at most what its receipt says was taken: two reservations of 30
    // on a bucket of 100 (40 left), then a give-back of 90 on the first's receipt: 70.
    let first = call(&s, one(&[("bucket", "b")], 30, false)).await;
    assert!(call(&s, one(&[("bucket", "b")], 30, false)).await.ok);
    let back = one(
        &[("bucket", "b"), ("reservation", &receipt(&first))],
        90,
        true,
    );
    call(&s, back).await;
    let left = call(&s, one(&[("bucket", "b")], 0, false)).await.remaining;
    // 40 + 30, less nothing but rounding: the refill since the take (a few ms at 100 an hour)
    // is taken off the give-back and comes back as refill.
    assert!(
        (69..=70).contains(&left),
        "{store}: a give-back of 90 on a receipt of 30 left {left}"
    );

    // Debt from overdraft is never given back: 10 an hour, a charge of 25 (debt capped one
    // limit deep), a refund of 20: nothing is left, and nothing more is admitted.
    for key in ["debt_window", "debt_bucket"] {
        assert!(!call(&s, one(&[(key, "d")], 25, false)).await.ok);
        call(&s, one(&[(key, "d")], 20, true)).await;
        let mut admitted = 0;
        for _ in 0..10 {
            admitted += usize::from(call(&s, one(&[(key, "d")], 1, false)).await.ok);
        }
        eprintln!("{store} {key}: charge 25, refund 20: {admitted} of 10 admitted");
        assert_eq!(admitted, 0, "{store} {key}: a refund paid the debt");
    }

    // A shadow limit of 3 slots: 6 takes all answer OK, but only the 3 that took a slot
    // carry `slot: held`, the metadata that gates their refund.
    let mut held = 0;
    for _ in 0..6 {
        let a = call(&s, one(&[("tenant", "x"), ("slot", "held")], 1, false)).await;
        assert!(a.ok, "{store}: shadow mode answers OK");
        held += usize::from(a.metadata.get("slot").is_some());
    }
    eprintln!("{store}: shadow limit of 3: {held} of 6 answers carry slot: held");
    assert_eq!(held, 3, "{store}: metadata for takes that took nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_never_pay_debt_nor_exceed_their_receipt_on_memory() {
    bounds_on("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_never_pay_debt_nor_exceed_their_receipt_on_redis() {
    let redis = TestRedis::start();
    bounds_on(&redis.url()).await;
}
