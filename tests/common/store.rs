//! Store-level helpers: a [`Store`] from a URL, bucket ops, and the clock handling the Redis
//! tests need.
//!
//! Redis cannot be given a fake clock, so cases that read reset/retry times through a real
//! store use hour- or day-long windows (refill during a test is negligible) and compare times
//! with a tolerance ([`assert_near`]); the exact comparison is `tests/lua_mirror.rs`, which runs
//! the scripts with `TIME` replaced by a clock the test drives.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tollgate::clock::Clock;
use tollgate::quota::{Action, ClaimAsk, Op, OpKind, Outcome};
use tollgate::settings::Settings;
use tollgate::store::Store;
use tollgate::telemetry::Metrics;

pub const HOUR: u64 = 3_600_000;
pub const DAY: u64 = 86_400_000;
/// The largest wait the scripts report (2^53 ms); see `token_bucket.lua`.
pub const MAX_WAIT: u64 = 1 << 53;

/// Settings for a store at `url` with a call timeout of `timeout_ms`.
pub fn settings(url: &str, timeout_ms: u64) -> Settings {
    Settings {
        store: url.to_string(),
        store_pool_size: 4,
        store_connect_timeout_ms: 1_000,
        store_timeout_ms: timeout_ms,
        ..Settings::default()
    }
}

pub async fn connect(url: &str, timeout_ms: u64) -> Store {
    Store::connect(
        tollgate::configs::store_config(&settings(url, timeout_ms)),
        Clock::system(),
        &Metrics::new(),
    )
    .await
    .unwrap_or_else(|e| panic!("store for {url}: {e}"))
}

/// Contract stores get a generous timeout: the machine running the suite may be busy.
pub async fn contract_store(url: &str) -> Arc<Store> {
    Arc::new(connect(url, 2_000).await)
}

pub fn tb(key: &str, capacity: u64, refill: u64, window_ms: u64, cost: u64) -> Op {
    let kind = OpKind::TokenBucket {
        capacity,
        refill,
        window_ms,
    };
    Op::take(key.to_string(), kind, cost)
}

pub fn fw(key: &str, limit: u64, window_ms: u64, cost: u64) -> Op {
    Op::take(
        key.to_string(),
        OpKind::FixedWindow { limit, window_ms },
        cost,
    )
}

pub fn sw(key: &str, limit: u64, window_ms: u64, cost: u64) -> Op {
    Op::take(
        key.to_string(),
        OpKind::SlidingWindow { limit, window_ms },
        cost,
    )
}

/// `op` as a lease claim of all of `need` and up to `want` tokens, split `share` ways.
pub fn claim(op: Op, need: u64, want: u64, share: u64) -> Op {
    Op {
        cost: need,
        action: Action::Claim(ClaimAsk { need, want, share }),
        ..op
    }
}

/// `.charged()`: an op as a charge (a rule's `overdraft: true`).
pub trait Charged {
    fn charged(self) -> Op;
}

impl Charged for Op {
    fn charged(self) -> Op {
        charged(self, true)
    }
}

/// `op` as a charge (a rule's `overdraft: true`) when `overdraft`, else as it is.
pub fn charged(op: Op, overdraft: bool) -> Op {
    if overdraft {
        Op {
            action: Action::Charge,
            ..op
        }
    } else {
        op
    }
}

/// `op` as a give-back of `n` leased tokens.
pub fn give_back(op: Op, n: u64) -> Op {
    Op {
        cost: n,
        action: Action::RETURN,
        ..op
    }
}

/// `op` as a refund of `n` with a receipt naming the window ending at `receipt_ms`.
pub fn refund_with(op: Op, n: u64, receipt_ms: Option<u64>) -> Op {
    Op {
        cost: n,
        action: Action::Return { receipt_ms },
        ..op
    }
}

/// A refund's receipt for a mirror test, drawn from `seed` around `now` (windows of
/// `window_ms`): none, an end a little after now (this window), one up to two windows back
/// (often an earlier window: nothing given back), or one long past.
pub fn receipt_near(now: u64, window_ms: u64, seed: u64) -> Option<u64> {
    let r = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 8;
    match r % 4 {
        0 => None,
        1 => Some(now + 1 + (r >> 2) % 1_000),
        2 => Some(
            now.saturating_sub((r >> 2) % window_ms.saturating_mul(2).max(1))
                .max(1),
        ),
        _ => Some(1),
    }
}

/// A key of its own hash tag, so keys of one case spread over a cluster.
pub fn key(prefix: &str, name: &str) -> String {
    format!("{prefix}{{{name}}}")
}

/// Applies one op and returns its outcome; panics on a store error.
pub async fn one(store: &Store, op: Op) -> Outcome {
    let what = format!("{op:?}");
    let mut out = store
        .apply(&[op])
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(out.len(), 1);
    out.remove(0)
}

pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Waits out the end of the current fixed window if it is about to end (Redis runs on this
/// host, so its `TIME` is this clock), so a case's hits all land in one window.
pub async fn clear_of_window_edge(window_ms: u64) {
    let left = window_ms - wall_ms() % window_ms;
    if left < 5_000 {
        tokio::time::sleep(Duration::from_millis(left + 50)).await;
    }
}

pub fn assert_near(what: &str, actual: u64, expected: u64, tolerance: u64) {
    assert!(
        actual.abs_diff(expected) <= tolerance,
        "{what}: {actual} not within {tolerance} of {expected}"
    );
}
