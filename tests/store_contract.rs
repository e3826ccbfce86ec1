//! The store contract: one set of cases run against every store — the memory store, a real
//! `redis-server` (over plain TCP, over TLS, `rediss://` with a CA the test generates, and over
//! a unix socket, `redis+unix://`), a real `valkey-server` (Valkey 8, the fork Envoy AI
//! Gateway's users run) and a
//! real three-primary Redis Cluster — so the Lua scripts and the Rust bucket math give the same
//! answers through `Store::apply`.
//!
//! Redis cannot be given a fake clock, so cases that read reset/retry times use hour- or
//! day-long windows (refill during a test is negligible) and compare times with a tolerance;
//! the exact comparison is `lua_mirror.rs`. What else the Redis store must do lives next door:
//! `faults.rs` (NOSCRIPT, a paused, killed or absent Redis), `cluster.rs` (routing of any
//! key), `redis_footprint.rs` (EVALSHA count and key size), `shared_quota.rs` (replicas).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::poll_async;
use common::redis::{TestCluster, TestRedis, unique_prefix};
use common::store::{
    Charged, DAY, HOUR, assert_near, claim, clear_of_window_edge, contract_store, fw, give_back,
    key, one, settings, sw, tb, wall_ms,
};
use common::tls::TestCerts;
use tollgate::clock::Clock;
use tollgate::quota::{Op, OpKind};
use tollgate::store::Store;
use tollgate::telemetry::Metrics;

// ---------------------------------------------------------------------------------------------
// The contract: every case runs against every store.

async fn new_bucket_is_full_and_drains(store: Arc<Store>, p: String) {
    let k = key(&p, "drain");
    for left in (0..5).rev() {
        let o = one(&store, tb(&k, 5, 5, HOUR, 1)).await;
        assert!(o.allowed);
        assert_eq!(o.remaining, left);
        assert_eq!(o.retry_ms, Some(0));
    }
    let o = one(&store, tb(&k, 5, 5, HOUR, 1)).await;
    assert!(!o.allowed);
    assert_eq!(o.remaining, 0);
    // One token per 720 s; a few ms may have refilled since the bucket was drained.
    assert_near("retry", o.retry_ms.unwrap(), 720_000, 5_000);
    assert_near("reset", o.reset_ms, HOUR, 5_000);
}

async fn check_only_does_not_consume(store: Arc<Store>, p: String) {
    let k = key(&p, "check");
    let o = one(&store, tb(&k, 3, 3, HOUR, 0)).await;
    assert!(o.allowed && o.remaining == 3);
    assert_eq!(o.reset_ms, 0, "a full bucket is full now");
    assert_eq!(one(&store, tb(&k, 3, 3, HOUR, 2)).await.remaining, 1);
    for _ in 0..3 {
        let o = one(&store, tb(&k, 3, 3, HOUR, 0)).await;
        assert!(o.allowed && o.remaining == 1, "{o:?}");
    }
    assert!(one(&store, tb(&k, 3, 3, HOUR, 1)).await.allowed);
    let o = one(&store, tb(&k, 3, 3, HOUR, 0)).await;
    assert!(!o.allowed, "check-only needs one whole token");
    assert_near("retry", o.retry_ms.unwrap(), 1_200_000, 5_000);
    // Fixed window: check-only does not count.
    clear_of_window_edge(DAY).await;
    let w = key(&p, "check-fw");
    for _ in 0..3 {
        let o = one(&store, fw(&w, 1, DAY, 0)).await;
        assert!(o.allowed && o.remaining == 1, "{o:?}");
    }
    assert!(one(&store, fw(&w, 1, DAY, 1)).await.allowed);
    assert!(!one(&store, fw(&w, 1, DAY, 0)).await.allowed);
}

async fn cost_above_capacity_never_fits(store: Arc<Store>, p: String) {
    let k = key(&p, "big");
    for cost in [11, 1_000, u64::from(u32::MAX), u64::MAX - 1, u64::MAX] {
        let o = one(&store, tb(&k, 10, 10, HOUR, cost)).await;
        assert!(!o.allowed, "cost {cost}");
        assert_eq!((o.remaining, o.retry_ms), (10, None), "cost {cost}");
    }
    assert!(
        one(&store, tb(&k, 10, 10, HOUR, 10)).await.allowed,
        "refusals took nothing"
    );
    clear_of_window_edge(DAY).await;
    let w = key(&p, "big-fw");
    let o = one(&store, fw(&w, 3, DAY, 4)).await;
    assert!(!o.allowed);
    assert_eq!((o.remaining, o.retry_ms), (0, None));
    let o = one(&store, fw(&w, 3, DAY, u64::MAX)).await;
    assert!(!o.allowed && o.retry_ms.is_none());
    // Like the reference, refused hits count: the window is spent.
    let o = one(&store, fw(&w, 3, DAY, 1)).await;
    assert!(!o.allowed);
    assert_eq!(o.retry_ms, Some(o.reset_ms));
}

async fn zero_limit_refuses_without_infinite_waits(store: Arc<Store>, p: String) {
    let k = key(&p, "zero");
    for cost in [1, 0] {
        let o = one(&store, tb(&k, 0, 0, HOUR, cost)).await;
        assert!(!o.allowed);
        assert_eq!((o.remaining, o.reset_ms, o.retry_ms), (0, 0, None));
    }
    // A burst that never refills drains once and stays empty.
    let once = key(&p, "once");
    assert!(one(&store, tb(&once, 2, 0, HOUR, 2)).await.allowed);
    let o = one(&store, tb(&once, 2, 0, HOUR, 1)).await;
    assert!(!o.allowed);
    assert_eq!((o.retry_ms, o.reset_ms), (None, HOUR));
    let w = key(&p, "zero-fw");
    for cost in [1, 0] {
        let o = one(&store, fw(&w, 0, DAY, cost)).await;
        assert!(!o.allowed);
        assert_eq!((o.remaining, o.retry_ms), (0, None));
    }
}

async fn refills_over_time(store: Arc<Store>, p: String) {
    // 2 tokens per 400 ms: one every 200 ms.
    let k = key(&p, "refill");
    assert!(one(&store, tb(&k, 2, 2, 400, 2)).await.allowed);
    let refused = one(&store, tb(&k, 2, 2, 400, 1)).await;
    let since = Instant::now();
    assert!(!refused.allowed);
    let retry = refused.retry_ms.unwrap();
    assert!(retry > 0 && retry <= 200, "{refused:?}");
    let allowed = poll_async(Duration::from_secs(5), || async {
        one(&store, tb(&k, 2, 2, 400, 1))
            .await
            .allowed
            .then_some(())
    })
    .await;
    assert!(allowed.is_some(), "no token refilled within 5 s");
    // Not earlier than promised (with slack for the two clocks' read times).
    assert!(
        since.elapsed().as_millis() as u64 + 30 >= retry,
        "refilled before retry_ms"
    );
    // The bucket refills to its capacity and no further.
    let full = poll_async(Duration::from_secs(5), || async {
        let o = one(&store, tb(&k, 2, 2, 400, 0)).await;
        (o.remaining == 2).then_some(o)
    })
    .await
    .expect("full again within 5 s");
    assert_eq!(full.reset_ms, 0);
    tokio::time::sleep(Duration::from_millis(500)).await; // more than a window: still 2
    assert_eq!(one(&store, tb(&k, 2, 2, 400, 0)).await.remaining, 2);
}

async fn fixed_window_counts_every_hit(store: Arc<Store>, p: String) {
    clear_of_window_edge(DAY).await;
    let w = key(&p, "fw");
    let o = one(&store, fw(&w, 3, DAY, 2)).await;
    assert!(o.allowed);
    assert_eq!(o.remaining, 1);
    // Epoch-aligned: the window ends at the next multiple of a day.
    assert_near("reset", o.reset_ms, DAY - wall_ms() % DAY, 1_000);
    let o = one(&store, fw(&w, 3, DAY, 2)).await;
    assert!(!o.allowed, "2 + 2 > 3");
    assert_eq!(o.remaining, 0);
    assert_eq!(
        o.retry_ms,
        Some(o.reset_ms),
        "fits again when the window ends"
    );
    let o = one(&store, fw(&w, 3, DAY, 1)).await;
    assert!(!o.allowed, "the refused hit was counted: 4 + 1 > 3");
    assert!(!one(&store, fw(&w, 3, DAY, 0)).await.allowed);
}

/// A calendar window (`calendar:`): a month at UTC and a day at UTC+09:00 end at their
/// calendar's midnight, whatever their length; a charge goes into debt, a refund comes off the
/// month's count. The exact arithmetic near every kind of edge is `lua_mirror.rs`'s.
async fn calendar_windows_end_at_the_calendars_midnight(store: Arc<Store>, p: String) {
    use tollgate::rules::{Calendar, CalendarUnit};
    clear_of_window_edge(DAY).await;
    let month = Calendar {
        unit: CalendarUnit::Month,
        offset_min: 0,
    };
    let tokyo_day = Calendar {
        unit: CalendarUnit::Day,
        offset_min: 540,
    };
    let op = |k: &str, calendar, limit, cost| {
        Op::take(
            k.to_string(),
            OpKind::CalendarWindow {
                limit,
                calendar,
                window_ms: 30 * DAY,
            },
            cost,
        )
    };
    let (m, d) = (key(&p, "month"), key(&p, "tokyo"));
    let now = wall_ms();
    let o = one(&store, op(&m, month, 3, 2)).await;
    assert!(o.allowed);
    assert_eq!(o.remaining, 1);
    assert_near(
        "month reset",
        o.reset_ms,
        month.next(month.start(now)) - now,
        1_000,
    );
    let o = one(&store, op(&d, tokyo_day, 3, 1)).await;
    assert_near(
        "Tokyo day reset",
        o.reset_ms,
        tokyo_day.next(tokyo_day.start(now)) - now,
        1_000,
    );
    // Refused, counted up to the limit; a refund of 2 makes room for 2.
    let o = one(&store, op(&m, month, 3, 2)).await;
    assert!(!o.allowed);
    assert_eq!(
        o.retry_ms,
        Some(o.reset_ms),
        "fits again when the month ends"
    );
    let back = one(&store, give_back(op(&m, month, 3, 0), 2)).await;
    assert_eq!(back.remaining, 2);
    assert!(one(&store, op(&m, month, 3, 2)).await.allowed);
    // A charge of 4 on 3: into debt, paid off by the next month.
    let charged = Op {
        action: tollgate::quota::Action::Charge,
        ..op(&m, month, 3, 4)
    };
    let o = one(&store, charged).await;
    assert!(!o.allowed);
    let end = month.next(month.start(now));
    assert_near(
        "debt paid with the next month",
        o.reset_ms,
        month.next(end) - now,
        1_000,
    );

    // A reservation (`Action::Reserve`, the take of a `charge_parent` node's parent) that does
    // not fit counts nothing, on a calendar month and on a plain fixed window.
    let kinds = [
        OpKind::CalendarWindow {
            limit: 10,
            calendar: month,
            window_ms: 30 * DAY,
        },
        OpKind::FixedWindow {
            limit: 10,
            window_ms: DAY,
        },
    ];
    for (i, kind) in kinds.into_iter().enumerate() {
        let reserve = |cost| Op {
            action: tollgate::quota::Action::Reserve,
            ..Op::take(key(&p, &format!("reserved{i}")), kind, cost)
        };
        assert_eq!(one(&store, reserve(6)).await.remaining, 4, "{kind:?}");
        assert!(!one(&store, reserve(6)).await.allowed, "{kind:?}");
        let o = one(&store, reserve(4)).await;
        assert!(
            o.allowed && o.remaining == 0,
            "{kind:?}: the refused 6 was counted"
        );
    }
}

/// A charge (`overdraft: true`) that does not fit is counted anyway: the budget goes into
/// debt, later checks are refused until it is refilled away, and the wait says when; on every
/// algorithm. The case: 100 tokens an hour, responses of 40.
async fn overdraft_charges_what_does_not_fit(store: Arc<Store>, p: String) {
    clear_of_window_edge(DAY).await;
    let t = key(&p, "od-tb");
    for left in [60, 20] {
        assert!(
            one(&store, tb(&t, 100, 100, HOUR, 0).charged())
                .await
                .allowed
        );
        let o = one(&store, tb(&t, 100, 100, HOUR, 40).charged()).await;
        assert!(o.allowed && o.remaining == left, "{o:?}");
    }
    assert!(
        one(&store, tb(&t, 100, 100, HOUR, 0).charged())
            .await
            .allowed
    );
    let o = one(&store, tb(&t, 100, 100, HOUR, 40).charged()).await;
    assert!(
        !o.allowed && o.remaining == 0,
        "20 - 40 does not fit: {o:?}"
    );
    // -20: 21 tokens to refill before a check (or a take of 1) fits, 36 s each.
    assert_near("retry", o.retry_ms.unwrap(), 21 * 36_000, 5_000);
    let o = one(&store, tb(&t, 100, 100, HOUR, 0).charged()).await;
    assert!(!o.allowed, "in debt: {o:?}");
    assert_near("retry of a check", o.retry_ms.unwrap(), 21 * 36_000, 5_000);
    assert_near("reset", o.reset_ms, 120 * 36_000, 5_000);
    // Without overdraft the same take is refused and not counted.
    let plain = key(&p, "od-plain");
    one(&store, tb(&plain, 100, 100, HOUR, 80)).await;
    assert!(!one(&store, tb(&plain, 100, 100, HOUR, 40)).await.allowed);
    assert_eq!(
        one(&store, tb(&plain, 100, 100, HOUR, 0)).await.remaining,
        20
    );
    // The debt is at most one capacity deep: -100, then 101 tokens to refill.
    let o = one(&store, tb(&t, 100, 100, HOUR, 1_000_000).charged()).await;
    assert_near(
        "retry at the floor",
        o.retry_ms.unwrap(),
        101 * 36_000,
        5_000,
    );

    // A fixed window carries the debt into the next window: 120 of 100 in this one.
    let f = key(&p, "od-fw");
    for _ in 0..3 {
        one(&store, fw(&f, 100, DAY, 40).charged()).await;
    }
    let o = one(&store, fw(&f, 100, DAY, 0).charged()).await;
    assert!(!o.allowed, "{o:?}");
    let window_left = DAY - wall_ms() % DAY;
    assert_near(
        "retry: the next window has room",
        o.retry_ms.unwrap(),
        window_left,
        1_000,
    );
    assert_near(
        "reset: the next window pays the debt",
        o.reset_ms,
        window_left + DAY,
        1_000,
    );

    // A sliding window counts the charge past the limit too.
    let s = key(&p, "od-sw");
    for _ in 0..3 {
        one(&store, sw(&s, 100, DAY, 40).charged()).await;
    }
    let o = one(&store, sw(&s, 100, DAY, 0).charged()).await;
    assert!(!o.allowed && o.remaining == 0, "{o:?}");
    let plain = key(&p, "od-sw-plain");
    for _ in 0..3 {
        one(&store, sw(&plain, 100, DAY, 40)).await;
    }
    assert_eq!(
        one(&store, sw(&plain, 100, DAY, 0)).await.remaining,
        20,
        "not counted without overdraft"
    );
}

/// The sliding log: exact at the window edge, a refused take records nothing, the wait is when
/// the oldest hits leave; on every store (a sorted set in Redis).
async fn sliding_log_counts_each_hit_in_the_window(store: Arc<Store>, p: String) {
    let k = key(&p, "sl");
    let op = |cost| {
        Op::take(
            k.clone(),
            OpKind::SlidingLog {
                limit: 5,
                window_ms: HOUR,
            },
            cost,
        )
    };
    let o = one(&store, op(3)).await;
    assert!(o.allowed && o.remaining == 2, "{o:?}");
    assert_near(
        "reset: the newest hit leaves in an hour",
        o.reset_ms,
        HOUR,
        2_000,
    );
    let o = one(&store, op(3)).await;
    assert!(
        !o.allowed && o.remaining == 2,
        "3 + 3 > 5, and nothing recorded: {o:?}"
    );
    assert_near(
        "retry: the first three leave",
        o.retry_ms.unwrap(),
        HOUR,
        2_000,
    );
    assert!(one(&store, op(2)).await.allowed);
    let o = one(&store, op(0)).await;
    assert!(
        !o.allowed && o.remaining == 0,
        "a check of a full log: {o:?}"
    );
    assert_eq!(
        one(&store, op(6)).await.retry_ms,
        None,
        "above the limit never fits"
    );
}

async fn keys_are_independent(store: Arc<Store>, p: String) {
    let (a, b) = (key(&p, "a"), key(&p, "b"));
    assert!(one(&store, tb(&a, 1, 1, HOUR, 1)).await.allowed);
    assert!(!one(&store, tb(&a, 1, 1, HOUR, 1)).await.allowed);
    assert!(one(&store, tb(&b, 1, 1, HOUR, 1)).await.allowed);
    clear_of_window_edge(DAY).await;
    let (wa, wb) = (key(&p, "wa"), key(&p, "wb"));
    assert!(one(&store, fw(&wa, 1, DAY, 1)).await.allowed);
    assert!(!one(&store, fw(&wa, 1, DAY, 1)).await.allowed);
    assert!(one(&store, fw(&wb, 1, DAY, 1)).await.allowed);
    let (sa, sb) = (key(&p, "sa"), key(&p, "sb"));
    assert!(one(&store, sw(&sa, 1, DAY, 1)).await.allowed);
    assert!(!one(&store, sw(&sa, 1, DAY, 1)).await.allowed);
    assert!(one(&store, sw(&sb, 1, DAY, 1)).await.allowed);
}

async fn one_request_many_ops_answer_in_order(store: Arc<Store>, p: String) {
    clear_of_window_edge(DAY).await;
    let ops: Vec<Op> = (0..12u64)
        .map(|i| {
            let k = key(&p, &format!("multi{i}"));
            match i % 4 {
                0 => fw(&k, 10 + i, DAY, 1),
                1 => sw(&k, 10 + i, DAY, 1),
                _ => tb(&k, 10 + i, 1, HOUR, 1),
            }
        })
        .collect();
    for round in 1..=3u64 {
        let out = store.apply(&ops).await.expect("apply");
        assert_eq!(out.len(), ops.len());
        for (i, o) in out.iter().enumerate() {
            assert!(o.allowed);
            assert_eq!(o.remaining, 10 + i as u64 - round, "op {i} round {round}");
        }
    }
    assert!(store.apply(&[]).await.expect("empty").is_empty());
}

/// The same sequence of requests gives the same answers as the memory store (times within the
/// few ms the sequence takes).
async fn answers_equal_the_memory_store(store: Arc<Store>, p: String) {
    clear_of_window_edge(DAY).await;
    let reference = Store::connect(
        tollgate::configs::store_config(&settings("memory", 1)),
        Clock::system(),
        &Metrics::new(),
    )
    .await
    .expect("memory store");
    let (t, t2, w) = (key(&p, "eq-tb"), key(&p, "eq-tb2"), key(&p, "eq-fw"));
    let s = key(&p, "eq-sw");
    let costs = [0, 1, 3, 5, 0, 2, 1, 10, u64::MAX, 0, 1, 1];
    let requests: Vec<Vec<Op>> = costs
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            vec![
                tb(&t, 7, 3, HOUR, c),
                fw(&w, 4, DAY, costs[(i + 3) % costs.len()]),
                tb(&t2, 100, 100, DAY, c.min(40)),
                sw(&s, 6, DAY, costs[(i + 5) % costs.len()]),
            ]
        })
        .collect();
    let started = Instant::now();
    for (i, ops) in requests.iter().enumerate() {
        let got = store.apply(ops).await.expect("apply");
        let want = reference.apply(ops).await.expect("memory apply");
        let slack = started.elapsed().as_millis() as u64 + 5;
        for (j, (g, w)) in got.iter().zip(&want).enumerate() {
            let at = format!("request {i} op {j}");
            assert_eq!(
                (g.allowed, g.remaining),
                (w.allowed, w.remaining),
                "{at}: {g:?} vs {w:?}"
            );
            assert_eq!(
                g.retry_ms.is_some(),
                w.retry_ms.is_some(),
                "{at}: {g:?} vs {w:?}"
            );
            assert_near(&at, g.reset_ms, w.reset_ms, slack);
            assert_near(&at, g.retry_ms.unwrap_or(0), w.retry_ms.unwrap_or(0), slack);
        }
    }
}

/// Many concurrent takes on one key: exactly the limit is admitted (an hour-long token bucket
/// and a day-long sliding window, so nothing refills or slides meanwhile).
async fn concurrent_takes_admit_exactly_the_limit(store: Arc<Store>, p: String) {
    clear_of_window_edge(DAY).await;
    let hot = [
        tb(&key(&p, "hot"), 200, 200, HOUR, 1),
        sw(&key(&p, "hot-sw"), 200, DAY, 1),
    ];
    for op in hot {
        let admitted = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (store, op, admitted) = (store.clone(), op.clone(), admitted.clone());
                tokio::spawn(async move {
                    for _ in 0..25 {
                        if one(&store, op.clone()).await.allowed {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(
            admitted.load(Ordering::Relaxed),
            200,
            "400 attempts on a limit of 200: {:?}",
            op.kind
        );
    }
}

/// Sliding window within one (day-long) window: allowed takes count, refused ones do not
/// (unlike the fixed window), and the times follow the decay of the count.
async fn sliding_window_counts_allowed_takes_only(store: Arc<Store>, p: String) {
    clear_of_window_edge(DAY).await;
    let k = key(&p, "sw");
    let o = one(&store, sw(&k, 3, DAY, 0)).await;
    assert!(o.allowed, "{o:?}");
    assert_eq!(
        (o.remaining, o.reset_ms, o.retry_ms),
        (3, 0, Some(0)),
        "an unseen key has nothing to decay"
    );
    let o = one(&store, sw(&k, 3, DAY, 2)).await;
    assert!(o.allowed && o.remaining == 1, "{o:?}");
    // Counted in this window, so weighed in the next one too: 0 when the next one ends.
    let end = DAY - wall_ms() % DAY;
    assert_near("reset", o.reset_ms, end + DAY, 1_000);
    let o = one(&store, sw(&k, 3, DAY, 2)).await;
    assert!(!o.allowed, "2 + 2 > 3");
    assert_eq!(o.remaining, 1);
    // 2 fits once the 2 counted here weigh 1: half-way through the next window.
    assert_near("retry", o.retry_ms.unwrap(), end + DAY / 2, 1_000);
    let o = one(&store, sw(&k, 3, DAY, 1)).await;
    assert!(o.allowed, "the refused take counted nothing: {o:?}");
    assert_eq!(o.remaining, 0);
    let o = one(&store, sw(&k, 3, DAY, 0)).await;
    assert!(!o.allowed, "check-only needs one whole unit");
    assert_near("retry", o.retry_ms.unwrap(), end + DAY / 3, 1_000);
    for cost in [4, u64::MAX] {
        let o = one(&store, sw(&k, 3, DAY, cost)).await;
        assert!(!o.allowed);
        assert_eq!((o.remaining, o.retry_ms), (0, None), "cost {cost}");
    }
    let z = key(&p, "sw-zero");
    for cost in [1, 0] {
        let o = one(&store, sw(&z, 0, DAY, cost)).await;
        assert!(!o.allowed);
        assert_eq!((o.remaining, o.reset_ms, o.retry_ms), (0, 0, None));
    }
    // A refund (Envoy's `is_negative_hits`) takes hits off this window's count, never below 0.
    let r = key(&p, "sw-refund");
    assert_eq!(one(&store, sw(&r, 3, DAY, 3)).await.remaining, 0);
    let o = one(&store, give_back(sw(&r, 3, DAY, 0), 2)).await;
    assert_eq!((o.allowed, o.remaining, o.granted), (true, 2, 0), "{o:?}");
    let o = one(&store, give_back(sw(&r, 3, DAY, 0), 50)).await;
    assert_eq!(o.remaining, 3, "{o:?}");
    assert!(one(&store, sw(&r, 3, DAY, 3)).await.allowed);
}

/// Sliding window across windows in real time (1 s windows): the previous window's count
/// fades out, a refused take fits again no earlier than promised, and with no more hits the
/// count decays to nothing.
async fn sliding_window_slides_over_time(store: Arc<Store>, p: String) {
    const W: u64 = 1_000;
    let k = key(&p, "slide");
    // Start just after a window edge, so the first takes share one window.
    tokio::time::sleep(Duration::from_millis(W - wall_ms() % W + 10)).await;
    let o = one(&store, sw(&k, 4, W, 4)).await;
    assert!(o.allowed && o.remaining == 0, "{o:?}");
    assert!(o.reset_ms > W && o.reset_ms <= 2 * W, "{o:?}");
    // From before the refused take is sent: Redis judged it after this, so a slow answer (a
    // busy machine) cannot make a later take look early.
    let since = Instant::now();
    let refused = one(&store, sw(&k, 4, W, 1)).await;
    assert!(!refused.allowed);
    let retry = refused.retry_ms.unwrap();
    // One of the 4 units is free once they weigh 3: a quarter into the next window.
    assert!(retry > W / 4 && retry <= W + W / 4, "{refused:?}");
    let allowed = poll_async(Duration::from_secs(5), || async {
        one(&store, sw(&k, 4, W, 1)).await.allowed.then_some(())
    })
    .await;
    assert!(allowed.is_some(), "nothing slid out within 5 s");
    assert!(
        since.elapsed().as_millis() as u64 + 30 >= retry,
        "allowed before retry_ms"
    );
    let empty = poll_async(Duration::from_secs(5), || async {
        let o = one(&store, sw(&k, 4, W, 0)).await;
        (o.remaining == 4).then_some(o)
    })
    .await
    .expect("decayed to nothing within 5 s");
    assert_eq!((empty.reset_ms, empty.retry_ms), (0, Some(0)));
}

async fn lease_claims_share_the_bucket_with_takes(store: Arc<Store>, p: String) {
    let k = key(&p, "lease");
    // A claim takes all of its need and up to its want.
    let o = one(&store, claim(tb(&k, 10, 10, HOUR, 0), 2, 6, 1)).await;
    assert_eq!((o.allowed, o.granted, o.remaining), (true, 6, 4));
    // A plain take sees what the claim left.
    assert_eq!(one(&store, tb(&k, 10, 10, HOUR, 1)).await.remaining, 3);
    // With 3 left, a claim split 2 ways gets its need plus half the rest.
    let o = one(&store, claim(tb(&k, 10, 10, HOUR, 0), 1, 10, 2)).await;
    assert_eq!((o.granted, o.remaining), (2, 1));
    // More than is there: nothing, and the wait for the need.
    let o = one(&store, claim(tb(&k, 10, 10, HOUR, 0), 3, 3, 1)).await;
    assert_eq!((o.allowed, o.granted, o.remaining), (false, 0, 1));
    assert_near("retry", o.retry_ms.unwrap(), 720_000, 5_000);
    // Giving back: capped at the capacity.
    let o = one(&store, give_back(tb(&k, 10, 10, HOUR, 0), 4)).await;
    assert_eq!((o.allowed, o.granted, o.remaining), (true, 0, 5));
    let o = one(&store, give_back(tb(&k, 10, 10, HOUR, 0), 100)).await;
    assert_eq!(o.remaining, 10);
    // A fixed window: claims count, give-backs uncount, within the window.
    clear_of_window_edge(DAY).await;
    let w = key(&p, "lease-fw");
    let o = one(&store, claim(fw(&w, 5, DAY, 0), 1, 4, 1)).await;
    assert_eq!((o.granted, o.remaining), (4, 1));
    assert!(!one(&store, claim(fw(&w, 5, DAY, 0), 2, 2, 1)).await.allowed);
    let o = one(&store, give_back(fw(&w, 5, DAY, 0), 3)).await;
    assert_eq!(o.remaining, 4);
    assert_eq!(one(&store, fw(&w, 5, DAY, 4)).await.remaining, 0);
}

/// A store over `rediss://`, trusting the test CA.
async fn tls_store(url: &str, certs: &TestCerts) -> Arc<Store> {
    let settings = tollgate::settings::Settings {
        store_tls_ca: certs.file("ca.crt"),
        ..settings(url, 2_000)
    };
    let store = Store::connect(
        tollgate::configs::store_config(&settings),
        Clock::system(),
        &Metrics::new(),
    )
    .await
    .unwrap_or_else(|e| panic!("store for {url}: {e}"));
    Arc::new(store)
}

macro_rules! contract {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let store = super::contract_store("memory").await;
                    super::$case(store, super::unique_prefix("mem")).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let redis = super::TestRedis::start();
                    let store = super::contract_store(&redis.url()).await;
                    super::$case(store, super::unique_prefix("redis")).await;
                }
            )*
        }
        mod valkey {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let valkey = super::TestRedis::start_valkey();
                    let store = super::contract_store(&valkey.url()).await;
                    super::$case(store, super::unique_prefix("valkey")).await;
                }
            )*
        }
        mod tls {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let certs = super::TestCerts::generate();
                    let redis = super::TestRedis::start_tls(&certs, false);
                    let store = super::tls_store(&redis.tls_url(), &certs).await;
                    super::$case(store, super::unique_prefix("tls")).await;
                }
            )*
        }
        mod unix {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let redis = super::TestRedis::start_unix();
                    let store = super::contract_store(&redis.unix_url()).await;
                    super::$case(store, super::unique_prefix("unix")).await;
                }
            )*
        }
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let cluster = super::TestCluster::shared();
                    let store = super::contract_store(&cluster.url()).await;
                    super::$case(store, super::unique_prefix("cluster")).await;
                }
            )*
        }
    };
}

contract!(
    new_bucket_is_full_and_drains,
    check_only_does_not_consume,
    cost_above_capacity_never_fits,
    zero_limit_refuses_without_infinite_waits,
    refills_over_time,
    fixed_window_counts_every_hit,
    keys_are_independent,
    one_request_many_ops_answer_in_order,
    answers_equal_the_memory_store,
    concurrent_takes_admit_exactly_the_limit,
    sliding_window_counts_allowed_takes_only,
    sliding_window_slides_over_time,
    lease_claims_share_the_bucket_with_takes,
    overdraft_charges_what_does_not_fit,
    sliding_log_counts_each_hit_in_the_window,
    calendar_windows_end_at_the_calendars_midnight,
);
