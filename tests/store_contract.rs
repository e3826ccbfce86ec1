//! The store contract: one set of cases run against every store — the memory store, a real
//! `redis-server` and a real three-primary Redis Cluster — so the Lua scripts and the Rust
//! bucket math give the same answers. Then the Redis-only properties: the scripts mirror
//! `limiter::bucket` exactly under a controlled clock (token bucket, fixed window, sliding
//! window), NOSCRIPT recovery, a paused, killed or
//! absent Redis, several replicas sharing one quota, cluster routing of any key, and the
//! EVALSHA count and key size reported in the README.
//!
//! Redis cannot be given a fake clock, so cases that read reset/retry times use hour- or
//! day-long windows (refill during a test is negligible) and compare times with a tolerance;
//! the exact comparison happens in `lua_*_mirrors_*`, which runs the scripts with `TIME`
//! replaced by a clock the test drives.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::redis::{TestCluster, TestRedis, unique_prefix};
use tollgate::clock::Clock;
use tollgate::keys;
use tollgate::limiter::bucket::{
    self, SlidingWindowState, TokenBucketParams, TokenBucketState, WindowState,
};
use tollgate::rules::{Algorithm, Rate, Unit};
use tollgate::settings::Settings;
use tollgate::store::redis::{FIXED_WINDOW_LUA, SLIDING_WINDOW_LUA, ScriptCall, TOKEN_BUCKET_LUA};
use tollgate::store::{Op, OpKind, Outcome, Store, StoreError, StoreErrorKind};
use tollgate::telemetry::Metrics;

const HOUR: u64 = 3_600_000;
const DAY: u64 = 86_400_000;
/// The largest wait the scripts report (2^53 ms); see `token_bucket.lua`.
const MAX_WAIT: u64 = 1 << 53;

// ---------------------------------------------------------------------------------------------
// Helpers

fn settings(url: &str, timeout_ms: u64) -> Settings {
    Settings {
        store: url.to_string(),
        store_pool_size: 4,
        store_connect_timeout_ms: 1_000,
        store_timeout_ms: timeout_ms,
        ..Settings::default()
    }
}

async fn connect(url: &str, timeout_ms: u64) -> Store {
    Store::connect(&settings(url, timeout_ms), Clock::system(), &Metrics::new())
        .await
        .unwrap_or_else(|e| panic!("store for {url}: {e}"))
}

/// Contract stores get a generous timeout: the machine running the suite may be busy.
async fn contract_store(url: &str) -> Arc<Store> {
    Arc::new(connect(url, 2_000).await)
}

fn tb(key: &str, capacity: u64, refill: u64, window_ms: u64, cost: u64) -> Op {
    Op {
        key: key.to_string(),
        kind: OpKind::TokenBucket {
            capacity,
            refill,
            window_ms,
        },
        cost,
    }
}

fn fw(key: &str, limit: u64, window_ms: u64, cost: u64) -> Op {
    Op {
        key: key.to_string(),
        kind: OpKind::FixedWindow { limit, window_ms },
        cost,
    }
}

fn sw(key: &str, limit: u64, window_ms: u64, cost: u64) -> Op {
    Op {
        key: key.to_string(),
        kind: OpKind::SlidingWindow { limit, window_ms },
        cost,
    }
}

/// A key of its own hash tag, so keys of one case spread over a cluster.
fn key(prefix: &str, name: &str) -> String {
    format!("{prefix}{{{name}}}")
}

async fn one(store: &Store, op: Op) -> Outcome {
    let what = format!("{op:?}");
    let mut out = store
        .apply(&[op])
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(out.len(), 1);
    out.remove(0)
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Waits out the end of the current fixed window if it is about to end (Redis runs on this
/// host, so its `TIME` is this clock), so a case's hits all land in one window.
async fn clear_of_window_edge(window_ms: u64) {
    let left = window_ms - wall_ms() % window_ms;
    if left < 5_000 {
        tokio::time::sleep(Duration::from_millis(left + 50)).await;
    }
}

fn assert_near(what: &str, actual: u64, expected: u64, tolerance: u64) {
    assert!(
        actual.abs_diff(expected) <= tolerance,
        "{what}: {actual} not within {tolerance} of {expected}"
    );
}

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
    let reference = Store::connect(&settings("memory", 1), Clock::system(), &Metrics::new())
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
    let refused = one(&store, sw(&k, 4, W, 1)).await;
    let since = Instant::now();
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
);

async fn poll_async<T, F, Fut>(timeout: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// The scripts mirror the bucket math exactly, under a clock the test drives.

/// A small deterministic generator (xorshift64), so failures reproduce without a new crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[(self.next() % from.len() as u64) as usize]
    }
}

/// The script with `TIME` replaced by the last two ARGV (seconds, microseconds) and its
/// `PEXPIRE` replaced by writing the TTL into a `ttl` field, so the test drives the clock and
/// reads the TTL the script chose. Each replacement must hit exactly once: if the script
/// changes shape, this test fails instead of silently testing something else.
fn with_test_clock(source: &str, pexpire: &str, ttl: &str) -> String {
    let time = "redis.call('TIME')";
    assert_eq!(
        source.matches(time).count(),
        1,
        "the script reads TIME once"
    );
    assert_eq!(
        source.matches(pexpire).count(),
        1,
        "the script sets its TTL once: {pexpire}"
    );
    source
        .replace(time, "{ARGV[#ARGV - 1], ARGV[#ARGV]}")
        .replace(
            pexpire,
            &format!("redis.call('HSET', KEYS[1], 'ttl', {ttl})"),
        )
}

fn eval_at(conn: &mut ::redis::Connection, source: &str, op: &Op, now_ms: u64) -> Outcome {
    let call = ScriptCall::for_op(op);
    let reply: Vec<i64> = ::redis::cmd("EVAL")
        .arg(source)
        .arg(1)
        .arg(&op.key)
        .arg(call.argv())
        .arg(now_ms / 1000)
        .arg((now_ms % 1000) * 1000)
        .query(conn)
        .unwrap_or_else(|e| panic!("{op:?} at {now_ms}: {e}"));
    Outcome {
        allowed: reply[0] == 1,
        remaining: reply[1] as u64,
        reset_ms: reply[2] as u64,
        retry_ms: u64::try_from(reply[3]).ok(),
    }
}

/// The next test time: mostly forward, sometimes standing still, sometimes backwards (a
/// failover to a host with a skewed clock).
fn step(rng: &mut Rng, now: u64, window_ms: u64) -> u64 {
    match rng.next() % 10 {
        0 => now - rng.next() % 3_000,
        1..=3 => now,
        4 => now + window_ms + rng.next() % 1_000,
        _ => now + rng.next() % window_ms.clamp(1, 2_000),
    }
}

#[test]
fn lua_token_bucket_mirrors_take_token_exactly() {
    let redis = TestRedis::start();
    let mut conn = redis.conn();
    let source = with_test_clock(
        TOKEN_BUCKET_LUA,
        "redis.call('PEXPIRE', KEYS[1], math.max(reset_ms, 1))",
        "math.max(reset_ms, 1)",
    );
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let mut checked = 0;
    for bucket in 0..150 {
        let p = TokenBucketParams {
            capacity: rng.pick(&[
                0,
                1,
                2,
                3,
                5,
                10,
                100,
                1_000,
                1_000_000,
                u64::from(u32::MAX),
            ]),
            refill: rng.pick(&[0, 1, 2, 3, 7, 10, 100, 1_000_000]),
            window_ms: rng.pick(&[1, 7, 1_000, 60_000, HOUR, 365 * DAY]),
        };
        let k = format!("mirror:{{tb{bucket}}}");
        let mut now = 1_700_000_000_123 + rng.next() % DAY;
        let mut state: Option<TokenBucketState> = None;
        for _ in 0..40 {
            now = step(&mut rng, now, p.window_ms);
            let cost = match rng.next() % 8 {
                0 => 0,
                1 => p.capacity,
                2 => p.capacity.saturating_add(1),
                3 => u64::MAX,
                4 => rng.next() % (p.capacity + 2),
                _ => 1,
            };
            let op = tb(&k, p.capacity, p.refill, p.window_ms, cost);
            let (next, mut want) = bucket::take_token(state, now, p, cost);
            // The script caps waits at 2^53 ms (~285,000 years) to keep Redis's integer
            // conversion defined; Rust saturates at 2^64. Only absurd configurations get there.
            want.reset_ms = want.reset_ms.min(MAX_WAIT);
            want.retry_ms = want.retry_ms.map(|r| r.min(MAX_WAIT));
            let got = eval_at(&mut conn, &source, &op, now);
            let at = format!("{p:?} cost {cost} at {now} from {state:?}");
            assert_eq!(got, want, "{at}");
            // The stored state: a full bucket is no key (the memory store sweeps it too);
            // otherwise the same two numbers, bit for bit, and the TTL is time-to-full.
            let stored: Vec<Option<String>> = ::redis::cmd("HMGET")
                .arg(&k)
                .arg(&["t", "ts", "ttl"])
                .query(&mut conn)
                .unwrap();
            if next.tokens >= p.capacity as f64 {
                assert!(stored[0].is_none(), "{at}: a full bucket is not stored");
                state = None;
            } else {
                let t: f64 = stored[0].as_deref().expect("t").parse().unwrap();
                let ts: u64 = stored[1].as_deref().expect("ts").parse().unwrap();
                let ttl: u64 = stored[2].as_deref().expect("ttl").parse().unwrap();
                assert_eq!(
                    (t.to_bits(), ts),
                    (next.tokens.to_bits(), next.ts_ms),
                    "{at}: {t} {ts} vs {next:?}"
                );
                assert_eq!(
                    ttl,
                    bucket::token_idle_after_ms(next, p).min(MAX_WAIT),
                    "{at}"
                );
                state = Some(next);
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 150 * 40);
}

#[test]
fn lua_fixed_window_mirrors_take_window_exactly() {
    let redis = TestRedis::start();
    let mut conn = redis.conn();
    let source = with_test_clock(
        FIXED_WINDOW_LUA,
        "redis.call('PEXPIRE', KEYS[1], reset_ms)",
        "reset_ms",
    );
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for window in 0..150 {
        let limit = rng.pick(&[0, 1, 2, 3, 10, 1_000, u64::from(u32::MAX)]);
        let window_ms = rng.pick(&[7, 1_000, 60_000, HOUR, DAY]);
        let k = format!("mirror:{{fw{window}}}");
        let mut now = 1_700_000_000_123 + rng.next() % DAY;
        let mut state: Option<WindowState> = None;
        for _ in 0..40 {
            now = step(&mut rng, now, window_ms);
            let cost = match rng.next() % 7 {
                0 => 0,
                1 => limit,
                2 => limit.saturating_add(1),
                3 => u64::MAX,
                4 => rng.next() % (limit + 2),
                _ => 1,
            };
            let (next, want) = bucket::take_window(state, now, limit, window_ms, cost);
            let got = eval_at(&mut conn, &source, &fw(&k, limit, window_ms, cost), now);
            let at =
                format!("limit {limit} window {window_ms} cost {cost} at {now} from {state:?}");
            assert_eq!(got, want, "{at}");
            if cost > 0 {
                let ttl: u64 = ::redis::cmd("HGET")
                    .arg(&k)
                    .arg("ttl")
                    .query(&mut conn)
                    .unwrap();
                assert_eq!(ttl, want.reset_ms, "{at}: expires when the window ends");
            }
            state = Some(next);
        }
    }
}

#[test]
fn lua_sliding_window_mirrors_rust() {
    let redis = TestRedis::start();
    let mut conn = redis.conn();
    let source = with_test_clock(
        SLIDING_WINDOW_LUA,
        "redis.call('PEXPIRE', KEYS[1], reset_ms)",
        "reset_ms",
    );
    // Whole estimates stay whole: 25 hits of the previous window weigh exactly 14 at 440 ms
    // into a 1 s window, so 11 are left (`prev * (1 - elapsed / w)` gives 14.000000000000002
    // and 10 left). The random walk below rarely lands on such a point.
    let base = 1_700_000_000_000;
    let mut state = None;
    for (now, cost, remaining) in [(base, 25, 0), (base + 1_440, 0, 11), (base + 1_440, 11, 0)] {
        let (next, want) = bucket::take_sliding(state, now, 25, 1_000, cost);
        let got = eval_at(
            &mut conn,
            &source,
            &sw("mirror:{sw-exact}", 25, 1_000, cost),
            now,
        );
        assert_eq!(
            (got, want.remaining),
            (want, remaining),
            "cost {cost} at {now}"
        );
        state = Some(next);
    }
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let (mut checked, mut refused, mut weighed) = (0, 0, 0);
    for window in 0..200 {
        let limit = rng.pick(&[0, 1, 2, 3, 7, 10, 1_000, u64::from(u32::MAX)]);
        let window_ms = rng.pick(&[1, 7, 1_000, 60_000, HOUR, DAY, 365 * DAY]);
        let k = format!("mirror:{{sw{window}}}");
        let mut now = 1_700_000_000_123 + rng.next() % DAY;
        let mut state: Option<SlidingWindowState> = None;
        // When the script last wrote the hash and the TTL it set then.
        let mut expires_at: Option<u64> = None;
        for _ in 0..40 {
            now = step(&mut rng, now, window_ms);
            let cost = match rng.next() % 8 {
                0 => 0,
                1 => limit,
                2 => limit.saturating_add(1),
                3 => u64::MAX,
                4 => rng.next() % (limit + 2),
                5 => limit / 3,
                _ => 1,
            };
            let (next, want) = bucket::take_sliding(state, now, limit, window_ms, cost);
            let got = eval_at(&mut conn, &source, &sw(&k, limit, window_ms, cost), now);
            let at =
                format!("limit {limit} window {window_ms} cost {cost} at {now} from {state:?}");
            assert_eq!(got, want, "{at}");
            // The stored state: an empty one is no key (the memory store does not keep it
            // either); otherwise the same three numbers. The script rewrites the hash only
            // when the state changed, and its TTL always ends where the estimate reaches 0.
            let stored: Vec<Option<u64>> = ::redis::cmd("HMGET")
                .arg(&k)
                .arg(&["w", "p", "c", "ttl"])
                .query(&mut conn)
                .unwrap();
            if next.is_empty() {
                assert!(stored.iter().all(Option::is_none), "{at}: {stored:?}");
                state = None;
                expires_at = None;
            } else {
                assert_eq!(
                    stored[..3],
                    [Some(next.start_ms), Some(next.prev), Some(next.curr)],
                    "{at}"
                );
                if state != Some(next) {
                    expires_at = Some(now + stored[3].expect("ttl"));
                }
                assert_eq!(expires_at, Some(now + want.reset_ms), "{at}: TTL");
                weighed += usize::from(next.prev > 0 && next.curr > 0);
                state = Some(next);
            }
            refused += usize::from(!want.allowed && want.retry_ms.is_some());
            checked += 1;
        }
    }
    assert_eq!(checked, 200 * 40);
    // The sequence exercised both counts at once and refusals that can fit later.
    assert!(weighed > 100 && refused > 100, "{weighed} {refused}");
}

// ---------------------------------------------------------------------------------------------
// Redis in trouble: scripts flushed, paused, killed, absent.

async fn noscript_is_recovered(store: &Store, flush: impl Fn(), p: &str) {
    // Every script: each must come back after the flush.
    clear_of_window_edge(DAY).await;
    let ops: Vec<Op> = (0..6)
        .map(|i| {
            let k = key(p, &format!("ns{i}"));
            match i % 3 {
                0 => tb(&k, 5, 5, HOUR, 1),
                1 => sw(&k, 5, DAY, 1),
                _ => fw(&k, 5, DAY, 1),
            }
        })
        .collect();
    let first = store.apply(&ops).await.expect("before the flush");
    assert!(first.iter().all(|o| o.allowed && o.remaining == 4));
    flush();
    let second = store.apply(&ops).await.expect("after SCRIPT FLUSH");
    assert!(
        second.iter().all(|o| o.allowed && o.remaining == 3),
        "each op ran exactly once: {second:?}"
    );
    let third = store.apply(&ops).await.expect("scripts cached again");
    assert!(third.iter().all(|o| o.remaining == 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_noscript_is_recovered() {
    let redis = TestRedis::start();
    let store = connect(&redis.url(), 2_000).await;
    noscript_is_recovered(&store, || redis.cmd::<()>(&["SCRIPT", "FLUSH"]), "ns:").await;
    // The six ops that met NOSCRIPT were re-sent with EVAL, once each; after that EVALSHA
    // finds the scripts again (the third request needed no EVAL).
    let stats: String = redis.cmd(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_eval:calls=6,"), "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_noscript_is_recovered() {
    let cluster = TestCluster::start();
    let store = connect(&cluster.url(), 2_000).await;
    noscript_is_recovered(&store, || cluster.cmd_all(&["SCRIPT", "FLUSH"]), "ns:").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_times_out_fast_then_recovers() {
    let redis = TestRedis::start();
    let store = connect(&redis.url(), 100).await;
    let k = key("pause:", "k");
    assert_eq!(one(&store, tb(&k, 10, 10, HOUR, 1)).await.remaining, 9);
    redis.cmd::<()>(&["CLIENT", "PAUSE", "2000", "ALL"]);
    let paused_at = Instant::now();
    let err: StoreError = store.apply(&[tb(&k, 10, 10, HOUR, 1)]).await.unwrap_err();
    let took = paused_at.elapsed();
    assert!(
        err.is_transient() && err.kind == StoreErrorKind::Timeout,
        "{err:?}"
    );
    assert!(
        took < Duration::from_millis(1_000),
        "answered after {took:?}, the pause lasts 2 s"
    );
    // Poll with check-only calls: a take that times out here would still run later.
    poll_async(Duration::from_secs(10), || async {
        store.apply(&[tb(&k, 10, 10, HOUR, 0)]).await.ok()
    })
    .await
    .expect("calls succeed again after the pause");
    assert!(
        paused_at.elapsed() >= Duration::from_millis(1_500),
        "it was really paused"
    );
    // The take that timed out on our side still ran once Redis resumed (documented): one
    // before the pause plus the timed-out one.
    let spent = poll_async(Duration::from_secs(5), || async {
        let o = one(&store, tb(&k, 10, 10, HOUR, 0)).await;
        (o.remaining == 8).then_some(())
    })
    .await;
    assert!(spent.is_some(), "the timed-out take ran after the pause");
    let o = one(&store, tb(&k, 10, 10, HOUR, 1)).await;
    assert!(o.allowed && o.remaining == 7, "{o:?}");
    assert_eq!(store.state(), "connected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_errors_then_reconnects_on_restart() {
    let mut redis = TestRedis::start();
    let store = connect(&redis.url(), 500).await;
    let k = key("kill:", "k");
    assert!(one(&store, tb(&k, 10, 10, HOUR, 1)).await.allowed);
    assert_eq!(store.state(), "connected");
    redis.kill();
    for _ in 0..10 {
        let err = store.apply(&[tb(&k, 10, 10, HOUR, 1)]).await.unwrap_err();
        assert!(err.is_transient(), "{err:?}");
    }
    let down = poll_async(Duration::from_secs(10), || async {
        (store.state() == "disconnected").then_some(())
    })
    .await;
    assert!(down.is_some(), "state shows the outage: {}", store.state());
    redis.restart();
    let back = poll_async(Duration::from_secs(15), || async {
        store.apply(&[tb(&k, 10, 10, HOUR, 1)]).await.ok()
    })
    .await
    .expect("reconnected after the restart");
    assert_eq!(back[0].remaining, 9, "a fresh Redis: a fresh bucket");
    assert_eq!(store.state(), "connected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_at_startup_constructs_then_connects() {
    let port = free_port();
    let store = connect(&format!("redis://127.0.0.1:{port}"), 500).await;
    assert_eq!(store.state(), "disconnected");
    let started = Instant::now();
    let err = store
        .apply(&[tb("absent:{k}", 1, 1, HOUR, 1)])
        .await
        .unwrap_err();
    assert!(
        err.is_transient() && err.kind == StoreErrorKind::Connection,
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "fails fast: {:?}",
        started.elapsed()
    );
    let _redis = TestRedis::start_on(port);
    let ok = poll_async(Duration::from_secs(15), || async {
        store.apply(&[tb("absent:{k}", 1, 1, HOUR, 1)]).await.ok()
    })
    .await;
    assert!(ok.is_some(), "connected once Redis came up");

    // A cluster URL with no node up constructs too.
    let cluster = connect(&format!("redis+cluster://127.0.0.1:{}", free_port()), 500).await;
    assert!(
        cluster
            .apply(&[tb("absent:{k}", 1, 1, HOUR, 1)])
            .await
            .unwrap_err()
            .is_transient()
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_urls_are_refused_with_a_clear_error() {
    let err = Store::connect(
        &settings("rediss://u:secret@127.0.0.1:1", 10),
        Clock::system(),
        &Metrics::new(),
    )
    .await
    .unwrap_err();
    assert!(!err.is_transient());
    assert!(err.to_string().contains("TLS is not built"), "{err}");
    assert!(!err.to_string().contains("secret"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// One quota across replicas; cluster routing.

/// Three stores (three replicas' worth of connections) hammer one key: exactly the limit is
/// admitted across all of them.
async fn replicas_share_one_quota(url: &str, p: &str) {
    let mut stores: Vec<Arc<Store>> = Vec::new();
    for _ in 0..3 {
        stores.push(contract_store(url).await);
    }
    let k = key(p, "shared");
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for store in &stores {
        for _ in 0..8 {
            let (store, k, admitted) = (store.clone(), k.clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..25 {
                    if one(&store, tb(&k, 300, 300, HOUR, 1)).await.allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    assert_eq!(
        admitted.load(Ordering::Relaxed),
        300,
        "600 attempts through 3 stores, limit 300"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_replicas_share_one_quota() {
    let redis = TestRedis::start();
    replicas_share_one_quota(&redis.url(), "replicas:").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_replicas_share_one_quota() {
    let cluster = TestCluster::shared();
    replicas_share_one_quota(&cluster.url(), &unique_prefix("replicas")).await;
}

/// Property: whatever the descriptor values (braces, separators, escapes), every op of a
/// request reaches the node owning its key, so no request fails with CROSSSLOT or MOVED, and
/// each bucket is one key (the second pass sees the first pass's takes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_routes_every_op_of_any_request() {
    const ALPHABET: &[char] = &[
        'a', 'Z', '0', '%', '{', '}', '|', '=', '#', '\\', ':', '\n', ' ', 'é',
    ];
    let cluster = TestCluster::shared();
    let store = contract_store(&cluster.url()).await;
    let prefix = unique_prefix("route");
    let mut rng = Rng(0xDEAD_BEEF_CAFE_F00D);
    let value = |rng: &mut Rng| -> String {
        let len = rng.next() % 9;
        (0..len).map(|_| rng.pick(ALPHABET)).collect()
    };
    let mut slots = std::collections::HashSet::new();
    for request in 0..100 {
        let ops: Vec<Op> = (0..1 + rng.next() % 8)
            .map(|i| {
                let (k, v) = (value(&mut rng), value(&mut rng));
                let algorithm = rng.pick(&Algorithm::ALL);
                let rate = Rate {
                    requests_per_unit: 50,
                    unit: Unit::Day,
                    unit_multiplier: 1,
                    burst: 50,
                    algorithm,
                };
                let shard = rng.next().is_multiple_of(3).then_some(i as u32);
                let key = if rng.next().is_multiple_of(5) {
                    // Raw keys that no bucket_key produces: stray and empty braces.
                    format!("{prefix}{k}{{{v}}}{{{i}}}{request}")
                } else {
                    keys::bucket_key(
                        &prefix,
                        &format!("d{request}"),
                        [(k.as_str(), v.as_str())],
                        &rate,
                        i as usize,
                        shard,
                    )
                };
                slots.insert(::redis::cluster_routing::Slot::for_key(&key));
                match algorithm {
                    Algorithm::TokenBucket => tb(&key, 50, 50, DAY, 1),
                    Algorithm::FixedWindow => fw(&key, 50, DAY, 1),
                    Algorithm::SlidingWindow => sw(&key, 50, DAY, 1),
                }
            })
            .collect();
        let first = store
            .apply(&ops)
            .await
            .unwrap_or_else(|e| panic!("request {request}: {e} ({ops:?})"));
        let second = store
            .apply(&ops)
            .await
            .unwrap_or_else(|e| panic!("request {request}: {e}"));
        for (i, (a, b)) in first.iter().zip(&second).enumerate() {
            // Duplicate keys inside one request are possible (empty values); count them.
            let same = ops.iter().filter(|o| o.key == ops[i].key).count() as u64;
            assert!(a.allowed && b.allowed, "request {request} op {i}");
            assert_eq!(
                a.remaining - b.remaining,
                same,
                "request {request} op {i}: one bucket, one key"
            );
        }
    }
    assert!(
        slots.len() > 200,
        "the keys spread over the slots ({})",
        slots.len()
    );
}

// ---------------------------------------------------------------------------------------------
// Numbers reported in the README.

/// EVALSHA calls per decision: one per bucket op, all of a request's ops in one pipeline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_evalsha_per_bucket_op() {
    let redis = TestRedis::start();
    let metrics = Metrics::new();
    let store = Store::connect(&settings(&redis.url(), 2_000), Clock::system(), &metrics)
        .await
        .expect("store");
    redis.cmd::<()>(&["CONFIG", "RESETSTAT"]);
    let (requests, ops_per_request) = (100u64, 2u64);
    for i in 0..requests {
        let ops: Vec<Op> = (0..ops_per_request)
            .map(|j| {
                let k = key("stat:", &format!("k{}", (i + j) % 7));
                // Both ops of a request on different scripts: every script was loaded at
                // connect, so none needs an EVAL.
                if j == 0 {
                    tb(&k, 1_000, 1_000, HOUR, 1)
                } else {
                    sw(&format!("{k}sw"), 1_000, HOUR, 1)
                }
            })
            .collect();
        store.apply(&ops).await.expect("apply");
    }
    let stats: String = redis.cmd(&["INFO", "commandstats"]);
    let calls = |name: &str| -> u64 {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let evalsha = calls("evalsha");
    eprintln!(
        "EVALSHA calls: {evalsha} for {requests} requests of {ops_per_request} ops = {:.2} per decision (descriptor op), {:.2} per request; EVAL calls: {}",
        evalsha as f64 / (requests * ops_per_request) as f64,
        evalsha as f64 / requests as f64,
        calls("eval"),
    );
    assert_eq!(evalsha, requests * ops_per_request);
    assert_eq!(calls("eval"), 0, "no NOSCRIPT fallback on a healthy Redis");
    let text = metrics.render();
    assert!(
        text.contains(&format!(
            "tollgate_store_call_duration_seconds_count{{op=\"apply\"}} {requests}"
        )),
        "{text}"
    );
    assert!(
        text.contains("tollgate_store_connections{state=\"connected\"} 4"),
        "{text}"
    );
}

/// The size of one token bucket in Redis, with a ~40-byte key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_bucket_is_one_small_hash() {
    let redis = TestRedis::start();
    let store = contract_store(&redis.url()).await;
    let rate = Rate {
        requests_per_unit: 100,
        unit: Unit::Hour,
        unit_multiplier: 1,
        burst: 100,
        algorithm: Algorithm::TokenBucket,
    };
    let k = keys::bucket_key("tollgate:", "edge", [("tenant", "acme")], &rate, 0, None);
    assert!(one(&store, tb(&k, 100, 100, HOUR, 1)).await.allowed);
    let fields: Vec<String> = redis.cmd(&["HKEYS", &k]);
    assert_eq!(fields, ["t", "ts"]);
    let ttl: i64 = redis.cmd(&["PTTL", &k]);
    assert!(
        ttl > 0 && ttl <= 36_000,
        "expires when full again (one token per 36 s): {ttl}"
    );
    let bytes: i64 = redis.cmd(&["MEMORY", "USAGE", &k]);
    eprintln!(
        "MEMORY USAGE of a token bucket with a {}-byte key ({k}): {bytes} bytes",
        k.len()
    );
    assert!(bytes < 200, "{bytes} bytes");
    // A bucket that refills to full is deleted rather than kept.
    assert!(one(&store, tb(&k, 1, 1_000_000, HOUR, 0)).await.allowed);
    let exists: i64 = redis.cmd(&["EXISTS", &k]);
    assert_eq!(exists, 0, "a full bucket is no key");
}

/// The size of one sliding window in Redis, with a ~40-byte key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_window_is_one_small_hash() {
    let redis = TestRedis::start();
    let store = contract_store(&redis.url()).await;
    let rate = Rate {
        requests_per_unit: 100,
        unit: Unit::Hour,
        unit_multiplier: 1,
        burst: 100,
        algorithm: Algorithm::SlidingWindow,
    };
    let k = keys::bucket_key("tollgate:", "edge", [("tenant", "acme")], &rate, 0, None);
    // A check on an unseen key leaves no key behind.
    assert!(one(&store, sw(&k, 100, HOUR, 0)).await.allowed);
    let exists: i64 = redis.cmd(&["EXISTS", &k]);
    assert_eq!(exists, 0, "an empty sliding window is no key");
    let o = one(&store, sw(&k, 100, HOUR, 1)).await;
    assert!(o.allowed);
    let fields: Vec<String> = redis.cmd(&["HKEYS", &k]);
    assert_eq!(fields, ["w", "p", "c"]);
    let ttl: i64 = redis.cmd(&["PTTL", &k]);
    assert!(
        ttl > 0 && ttl.abs_diff(o.reset_ms as i64) < 1_000 && o.reset_ms > HOUR,
        "expires when the count has decayed, at the end of the next hour: {ttl} vs {o:?}"
    );
    // A check or a refusal rewrites nothing (the state and its TTL are still right).
    redis.cmd::<()>(&["CONFIG", "RESETSTAT"]);
    assert!(one(&store, sw(&k, 100, HOUR, 0)).await.allowed);
    assert!(!one(&store, sw(&k, 100, HOUR, 101)).await.allowed);
    let stats: String = redis.cmd(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_evalsha:calls=2,"), "{stats}");
    assert!(!stats.contains("cmdstat_hset"), "{stats}");
    let bytes: i64 = redis.cmd(&["MEMORY", "USAGE", &k]);
    eprintln!(
        "MEMORY USAGE of a sliding window with a {}-byte key ({k}): {bytes} bytes",
        k.len()
    );
    assert!(bytes <= 120, "{bytes} bytes");
}
