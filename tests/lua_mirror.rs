//! The Lua scripts mirror `tollgate::quota::bucket` exactly: random sequences of takes
//! (proptest: times that go forward, stand still, jump a window or step back as after a
//! failover to a skewed host; costs of 0, 1, the limit, above it and `u64::MAX`) run through the
//! script in a real `redis-server` and through the Rust function, and must give identical
//! outcomes, bit-identical stored state and the TTL the Rust math implies; each with and
//! without overdraft (a take that does not fit charged anyway). The sliding log's hits, one
//! sorted-set member each, are the Rust log's runs. A call now and then runs with other
//! numbers (a rules edit: the bucket's key names none), so what an edit keeps
//! (`TokenBucketState::capacity`, `WindowState::limit`, the sliding counts and entries) is held
//! to the Rust too.
//!
//! Redis cannot be given a fake clock, so each script runs with `TIME` replaced by two extra
//! ARGV the test sets, and each TTL it sets (`PEXPIRE`, `SET … PX`) replaced by writing the
//! TTL into a key of its own, `<key>:ttl`, which the test reads back ([`with_test_clock`]).
//! The token bucket's state has two formats (the packed string and 0.1.0's hash,
//! `store_state_format`): the token bucket and lease tests pick the writer at random for each
//! call, so one bucket goes back and forth between them, as it does when old and new replicas
//! share a Redis. One redis-server serves every case of a test; each case starts from a
//! deleted key.

mod common;

use std::cell::{Cell, RefCell};

use common::redis::TestRedis;
use common::store::{
    DAY, HOUR, MAX_WAIT, charged, claim, fw, give_back, receipt_near, refund_with, sw, tb,
};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseResult, TestRunner};
use tollgate::quota::bucket::{
    self, SlidingLog, SlidingWindowState, TokenBucketParams, TokenBucketState, WindowState,
};
use tollgate::quota::{Action, Op, OpKind, Outcome};
use tollgate::store::redis::{
    FIXED_WINDOW_LUA, LEASE_LUA, SLIDING_LOG_LUA, SLIDING_WINDOW_LUA, ScriptCall, TOKEN_BUCKET_LUA,
    writing_hash,
};

/// Cases per test: each is a sequence of up to [`MAX_TAKES`] takes on one bucket.
const CASES: u32 = 64;
const MAX_TAKES: usize = 40;
/// Around when the sequences start (Nov 2023), plus up to a day.
const BASE_MS: u64 = 1_700_000_000_123;

/// Runs `test` on `CASES` values of `strategy`; on a failure, panics with the smallest
/// failing input proptest found. The cases come from the committed seed
/// (`common::proptest_config`); a failure `make explore` finds is saved as a regression.
fn check<S: Strategy>(strategy: S, test: impl Fn(S::Value) -> TestCaseResult) {
    let mut runner = TestRunner::new(common::proptest_config(CASES, "lua_mirror"));
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{e}");
    }
}

/// How the test clock moves before a take.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Backwards by up to 3 s (a failover to a host whose clock is behind).
    Back(u64),
    Stay,
    /// Past the end of the window, plus up to 1 s.
    NextWindow(u64),
    /// Forward by up to 2 s (less within short windows).
    Forward(u64),
}

impl Step {
    fn apply(self, now: u64, window_ms: u64) -> u64 {
        match self {
            Step::Back(d) => now - d,
            Step::Stay => now,
            Step::NextWindow(d) => now + window_ms + d,
            Step::Forward(r) => now + r % window_ms.clamp(1, 2_000),
        }
    }
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => (0..3_000u64).prop_map(Step::Back),
        3 => Just(Step::Stay),
        1 => (0..1_000u64).prop_map(Step::NextWindow),
        5 => any::<u64>().prop_map(Step::Forward),
    ]
}

/// A take's cost, relative to the bucket's limit (capacity).
#[derive(Clone, Copy, Debug)]
enum Cost {
    Zero,
    One,
    Limit,
    AboveLimit,
    Max,
    /// `r % (limit + 2)`: anything from 0 to just above the limit.
    Upto(u64),
    Third,
}

impl Cost {
    fn of(self, limit: u64) -> u64 {
        match self {
            Cost::Zero => 0,
            Cost::One => 1,
            Cost::Limit => limit,
            Cost::AboveLimit => limit.saturating_add(1),
            Cost::Max => u64::MAX,
            Cost::Upto(r) => r % limit.saturating_add(2),
            Cost::Third => limit / 3,
        }
    }
}

fn cost() -> impl Strategy<Value = Cost> {
    prop_oneof![
        1 => Just(Cost::Zero),
        3 => Just(Cost::One),
        1 => Just(Cost::Limit),
        1 => Just(Cost::AboveLimit),
        1 => Just(Cost::Max),
        1 => any::<u64>().prop_map(Cost::Upto),
        1 => Just(Cost::Third),
    ]
}

/// A limit: mostly the edge values (0, 1, huge), sometimes anything small.
fn limit(edges: &[u64]) -> impl Strategy<Value = u64> + use<> {
    prop_oneof![3 => prop::sample::select(edges.to_vec()), 1 => 0..5_000u64]
}

fn window_ms(edges: &[u64]) -> impl Strategy<Value = u64> + use<> {
    prop_oneof![3 => prop::sample::select(edges.to_vec()), 1 => 1..100_000u64]
}

/// Which format each call of a sequence writes the token bucket's state in: `true` = 0.1.0's
/// hash, `false` = packed.
fn writers() -> impl Strategy<Value = Vec<bool>> {
    prop::collection::vec(any::<bool>(), MAX_TAKES)
}

/// A start time and a sequence of (clock step, cost) takes.
fn takes() -> impl Strategy<Value = (u64, Vec<(Step, Cost)>)> {
    (
        0..DAY,
        prop::collection::vec((step(), cost()), 1..=MAX_TAKES),
    )
}

/// The script with `TIME` replaced by the last two ARGV (seconds, microseconds) and each of
/// its `ttl_sites` TTLs (`redis.call('PEXPIRE', KEYS[1], ttl)` or `…, 'PX', ttl)`) replaced by
/// writing `ttl` into the key `<key>:ttl`, so the test drives the clock and reads the TTL the
/// script chose. Each count must match: if the script changes shape, this test fails instead
/// of silently testing something else.
fn with_test_clock(source: &str, ttl_sites: usize) -> String {
    let time = "redis.call('TIME')";
    assert_eq!(
        source.matches(time).count(),
        1,
        "the script reads TIME once"
    );
    // The key is `KEYS[1]`, or `key` inside `take_token` and `take_window`; a packed state is
    // a token bucket's `tokens, ts, capacity`, a window's `start_ms, count, limit` or
    // lease.lua's `a, b, c`.
    let sites = |key: &str| {
        let packed = |format: &str, state: &str| {
            (
                format!("redis.call('SET', {key}, struct.pack('{format}', {state}), 'PX', ttl_ms)"),
                format!(
                    "redis.call('SET', {key}, struct.pack('{format}', {state})) \
                     redis.call('SET', {key} .. ':ttl', ttl_ms)"
                ),
            )
        };
        [
            (
                format!("redis.call('PEXPIRE', {key}, "),
                format!("redis.call('SET', {key} .. ':ttl', "),
            ),
            packed("<ddd", "tokens, ts, capacity"),
            packed("<ddd", "start_ms, count, limit"),
            // lease.lua's `write_state`, for either algorithm.
            packed("<ddd", "a, b, c"),
        ]
    };
    let mut out = source.replace(time, "{ARGV[#ARGV - 1], ARGV[#ARGV]}");
    let mut found = 0;
    for (site, written) in sites("KEYS[1]").into_iter().chain(sites("key")) {
        found += out.matches(&site).count();
        out = out.replace(&site, &written);
    }
    assert_eq!(found, ttl_sites, "the script's TTLs moved");
    out
}

/// The TTL the last call set on `k` (see [`with_test_clock`]), and forgets it, so the next
/// read says whether the next call set one.
fn take_ttl(conn: &mut ::redis::Connection, k: &str) -> Option<u64> {
    let ttl_key = format!("{k}:ttl");
    let ttl: Option<u64> = ::redis::cmd("GET").arg(&ttl_key).query(conn).unwrap();
    del(conn, &ttl_key);
    ttl
}

/// A bucket's stored numbers, in either format, bit for bit: the packed string's doubles (two,
/// or a token bucket's three), or 0.1.0's hash `fields` parsed as the script's `tonumber`
/// reads them (a missing field: NaN).
fn stored_numbers<const N: usize>(
    conn: &mut ::redis::Connection,
    k: &str,
    fields: [&str; N],
) -> Option<[f64; N]> {
    let kind: String = ::redis::cmd("TYPE").arg(k).query(conn).unwrap();
    match kind.as_str() {
        "string" => {
            let bytes: Vec<u8> = ::redis::cmd("GET").arg(k).query(conn).unwrap();
            assert_eq!(bytes.len(), 8 * N, "{k}: the packed state is {N} doubles");
            Some(std::array::from_fn(|i| {
                f64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().unwrap())
            }))
        }
        "hash" => {
            let got: Vec<Option<String>> = ::redis::cmd("HMGET")
                .arg(k)
                .arg(&fields)
                .query(conn)
                .unwrap();
            Some(std::array::from_fn(|i| {
                got[i].as_deref().map_or(f64::NAN, |v| v.parse().unwrap())
            }))
        }
        "none" => None,
        other => panic!("{k} is a {other}"),
    }
}

/// A token bucket's stored `(tokens, ts, capacity)`, in either format, bit for bit.
fn token_state(conn: &mut ::redis::Connection, k: &str) -> Option<(f64, u64, f64)> {
    stored_numbers(conn, k, ["t", "ts", "c"]).map(|[tokens, ts, c]| (tokens, ts as u64, c))
}

/// A fixed window's stored `(start, count, limit)`, in either format.
fn window_state(conn: &mut ::redis::Connection, k: &str) -> Option<(u64, u64, Option<u64>)> {
    stored_numbers(conn, k, ["w", "c", "l"])
        .map(|[w, c, l]| (w as u64, c as u64, (!l.is_nan()).then_some(l as u64)))
}

/// Which numbers each call of a sequence runs with: `true` = the edited ones (a rules edit
/// between two calls, back and forth).
fn edits() -> impl Strategy<Value = Vec<bool>> {
    prop::collection::vec(prop::bool::weighted(0.2), MAX_TAKES)
}

/// The token bucket, fixed window and lease scripts on the test clock, writing the packed state
/// (`[0]`) and 0.1.0's hash (`[1]`).
fn both_formats(source: &str, ttl_sites: usize) -> [String; 2] {
    [
        with_test_clock(source, ttl_sites),
        with_test_clock(&writing_hash(source), ttl_sites),
    ]
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
    // Takes answer `allowed`; `lease.lua` answers what it granted (see the scripts' headers
    // and `store/redis/scripts.rs`, which reads them the same way).
    let (allowed, granted) = match op.action {
        Action::Take | Action::Charge | Action::Reserve => {
            (reply[0] == 1, if reply[0] == 1 { op.cost } else { 0 })
        }
        Action::Claim(_) => (reply[0] > 0, reply[0] as u64),
        Action::Return { .. } => (true, 0),
    };
    Outcome {
        allowed,
        remaining: reply[1] as u64,
        reset_ms: reply[2] as u64,
        retry_ms: u64::try_from(reply[3]).ok(),
        granted,
        // A fixed window's take adds the count it found (`fixed_window.lua`'s header).
        found: reply.get(4).and_then(|&f| u64::try_from(f).ok()),
    }
}

/// Deletes `key` and its test TTL key.
fn del(conn: &mut ::redis::Connection, key: &str) {
    ::redis::cmd("DEL")
        .arg(key)
        .arg(format!("{key}:ttl"))
        .query::<()>(conn)
        .unwrap_or_else(|e| panic!("DEL {key}: {e}"));
}

#[test]
fn lua_token_bucket_mirrors_take_token_exactly() {
    let redis = TestRedis::start();
    let conn = RefCell::new(redis.conn());
    // Two TTL sites: the packed state's `SET … PX` and the hash's `PEXPIRE`.
    let sources = both_formats(TOKEN_BUCKET_LUA, 2);
    let params = (
        limit(&[
            0,
            1,
            2,
            3,
            5,
            10,
            100,
            1_000,
            1_000_000,
            // Where the plain wait comes out one ulp short (see `wait_ms`).
            128_952_046,
            u64::from(u32::MAX),
        ]),
        limit(&[0, 1, 2, 3, 7, 10, 100, 1_000_000]),
        window_ms(&[1, 7, 1_000, 60_000, HOUR, 353 * DAY, 365 * DAY]),
    )
        .prop_map(|(capacity, refill, window_ms)| TokenBucketParams {
            capacity,
            refill,
            window_ms,
        });
    // A rules edit: the same bucket read with other numbers (its key has none).
    let edited = (
        limit(&[0, 1, 2, 5, 8, 100, 1_000_000]),
        limit(&[0, 1, 5, 8, 100]),
    );
    let (cases, checked, stored_states) = (Cell::new(0), Cell::new(0), Cell::new(0));
    let (switched, edited_reads) = (Cell::new(0), Cell::new(0));
    check(
        (params, edited, takes(), any::<bool>(), writers(), edits()),
        |(p0, (capacity, refill), (start, takes), overdraft, writers, edits)| {
            let conn = &mut *conn.borrow_mut();
            let k = "mirror:{tb}";
            del(conn, k);
            let p1 = TokenBucketParams {
                capacity,
                refill,
                ..p0
            };
            let mut now = BASE_MS + start;
            let mut state: Option<TokenBucketState> = None;
            for (i, (step, cost)) in takes.into_iter().enumerate() {
                let p = if edits[i] { p1 } else { p0 };
                let source = &sources[usize::from(writers[i])];
                let before = token_state(conn, k);
                take_ttl(conn, k);
                now = step.apply(now, p.window_ms);
                let cost = cost.of(p.capacity);
                let op = charged(tb(k, p.capacity, p.refill, p.window_ms, cost), overdraft);
                let (next, mut want) = bucket::take_token(state, now, p, cost, overdraft);
                if state.is_some_and(|s| s.capacity != Some(p.capacity as f64)) {
                    edited_reads.set(edited_reads.get() + 1);
                }
                // The script caps waits at 2^53 ms (~285,000 years) to keep Redis's integer
                // conversion defined; Rust saturates at 2^64. Only absurd configurations get there.
                want.reset_ms = want.reset_ms.min(MAX_WAIT);
                want.retry_ms = want.retry_ms.map(|r| r.min(MAX_WAIT));
                let got = eval_at(conn, source, &op, now);
                let at = format!(
                    "{p:?} cost {cost} overdraft {overdraft} at {now} from {state:?}, writing {}",
                    if writers[i] { "the hash" } else { "packed" }
                );
                prop_assert_eq!(got, want, "{}", at);
                // The stored state: a full bucket is no key (the memory store sweeps it too);
                // otherwise the same three numbers, bit for bit, in the format this call
                // writes, and the TTL is time-to-full.
                let stored = token_state(conn, k);
                if next.tokens >= p.capacity as f64 {
                    prop_assert!(stored.is_none(), "{}: a full bucket is not stored", at);
                    state = None;
                } else {
                    let kind: String = ::redis::cmd("TYPE").arg(k).query(conn).unwrap();
                    let want_kind = if writers[i] { "hash" } else { "string" };
                    prop_assert_eq!(kind.as_str(), want_kind, "{}", at);
                    if before.is_some() && kind != "none" {
                        switched.set(
                            switched.get()
                                + usize::from(writers[i] != writers[i.saturating_sub(1)]),
                        );
                    }
                    let (t, ts, c) = stored.expect("stored");
                    let ttl = take_ttl(conn, k).expect("a stored bucket has a TTL");
                    prop_assert_eq!(
                        (t.to_bits(), ts, Some(c)),
                        (next.tokens.to_bits(), next.ts_ms, next.capacity),
                        "{}: {} {} {} vs {:?}",
                        at,
                        t,
                        ts,
                        c,
                        next
                    );
                    prop_assert_eq!(
                        ttl,
                        bucket::token_idle_after_ms(next, p).min(MAX_WAIT),
                        "{}",
                        at
                    );
                    state = Some(next);
                    stored_states.set(stored_states.get() + 1);
                }
                checked.set(checked.get() + 1);
            }
            cases.set(cases.get() + 1);
            Ok(())
        },
    );
    eprintln!(
        "token bucket: {} cases, {} takes, {} left a stored bucket, {} read the other format, {} read a state counted against another capacity",
        cases.get(),
        checked.get(),
        stored_states.get(),
        switched.get(),
        edited_reads.get()
    );
    assert!(cases.get() >= CASES, "{} cases ran", cases.get());
    assert!(
        edited_reads.get() > 50,
        "{} edited reads",
        edited_reads.get()
    );
    assert!(switched.get() > 100, "{} format switches", switched.get());
    // The sequences reached partly drained buckets, not only full ones.
    assert!(
        stored_states.get() > checked.get() / 2,
        "{} of {} takes left a stored bucket",
        stored_states.get(),
        checked.get()
    );
}

#[test]
fn lua_fixed_window_mirrors_take_window_exactly() {
    let redis = TestRedis::start();
    let conn = RefCell::new(redis.conn());
    // Two TTL sites: the packed state's `SET … PX` and the hash's `PEXPIRE`.
    let sources = both_formats(FIXED_WINDOW_LUA, 2);
    let params = (
        limit(&[0, 1, 2, 3, 10, 1_000, u64::from(u32::MAX)]),
        window_ms(&[7, 1_000, 60_000, HOUR, DAY]),
    );
    let (cases, refused, switched) = (Cell::new(0), Cell::new(0), Cell::new(0));
    let over_new_limit = Cell::new(0);
    check(
        (
            params,
            limit(&[0, 1, 2, 5, 50, 120]),
            takes(),
            any::<bool>(),
            writers(),
            edits(),
        ),
        |((limit0, window_ms), limit1, (start, takes), overdraft, writers, edits)| {
            let conn = &mut *conn.borrow_mut();
            let k = "mirror:{fw}";
            del(conn, k);
            let mut now = BASE_MS + start;
            let mut state: Option<WindowState> = None;
            for (i, (step, cost)) in takes.into_iter().enumerate() {
                // A rules edit between calls: the same window read with another limit.
                let limit = if edits[i] { limit1 } else { limit0 };
                if state.is_some_and(|s| s.limit != Some(limit) && s.count > limit) {
                    over_new_limit.set(over_new_limit.get() + 1);
                }
                let source = &sources[usize::from(writers[i])];
                let before = window_state(conn, k);
                now = step.apply(now, window_ms);
                let cost = cost.of(limit);
                // Every third case reserves instead of taking (`Action::Reserve`: a refusal
                // counts nothing); the others take, with or without overdraft.
                let reserve = !overdraft && start % 3 == 0;
                let (next, want) = if reserve {
                    let windows = bucket::Windows::Every(window_ms);
                    bucket::reserve_windows(state, now, limit, windows, cost)
                } else {
                    bucket::take_window(state, now, limit, window_ms, cost, overdraft)
                };
                let op = if reserve {
                    Op {
                        action: Action::Reserve,
                        ..fw(k, limit, window_ms, cost)
                    }
                } else {
                    charged(fw(k, limit, window_ms, cost), overdraft)
                };
                let got = eval_at(conn, source, &op, now);
                let at = format!(
                    "limit {limit} window {window_ms} cost {cost} overdraft {overdraft} at {now} from {state:?}, writing {}",
                    if writers[i] { "the hash" } else { "packed" }
                );
                prop_assert_eq!(got, want, "{}", at);
                if cost > 0 {
                    let ttl = take_ttl(conn, k).expect("a counted hit sets the TTL");
                    prop_assert_eq!(
                        ttl,
                        want.reset_ms,
                        "{}: expires when the window (or its debt) ends",
                        at
                    );
                    // A counted hit stores the Rust's window and count, in the format this
                    // call writes, whichever the key held.
                    let kind: String = ::redis::cmd("TYPE").arg(k).query(conn).unwrap();
                    let want_kind = if writers[i] { "hash" } else { "string" };
                    prop_assert_eq!(kind.as_str(), want_kind, "{}", at);
                    prop_assert_eq!(
                        window_state(conn, k),
                        Some((next.start_ms, next.count, next.limit)),
                        "{}: stored",
                        at
                    );
                    if before.is_some() && i > 0 && writers[i] != writers[i - 1] {
                        switched.set(switched.get() + 1);
                    }
                }
                refused.set(refused.get() + usize::from(!want.allowed && want.retry_ms.is_some()));
                state = Some(next);
            }
            cases.set(cases.get() + 1);
            Ok(())
        },
    );
    eprintln!(
        "fixed window: {} cases, {} refusals with a retry, {} read the other format, {} read a count past the limit in force, kept against another",
        cases.get(),
        refused.get(),
        switched.get(),
        over_new_limit.get()
    );
    assert!(over_new_limit.get() > 10, "{} reads", over_new_limit.get());
    assert!(cases.get() >= CASES, "{} cases ran", cases.get());
    assert!(switched.get() > 100, "{} format switches", switched.get());
    // Refusals that fit once the window ends, not only costs that never fit.
    assert!(
        refused.get() > 100,
        "{} refusals with a retry",
        refused.get()
    );
}

/// How the clock moves before a calendar window's op: near the window's edge, where the
/// calendar's arithmetic decides.
#[derive(Clone, Copy, Debug)]
enum CalendarStep {
    Stay,
    /// Forward by up to 2 s.
    Forward(u64),
    /// Back by up to 3 s.
    Back(u64),
    /// To `d` ms (up to 2 s) before the current window's end.
    BeforeEdge(u64),
    /// To `d` ms (up to 2 s) after the current window's end: the next window.
    AfterEdge(u64),
    /// Two windows on, plus `d`.
    Skip(u64),
}

fn calendar_step() -> impl Strategy<Value = CalendarStep> {
    prop_oneof![
        2 => Just(CalendarStep::Stay),
        3 => (0..2_000u64).prop_map(CalendarStep::Forward),
        1 => (0..3_000u64).prop_map(CalendarStep::Back),
        2 => (1..2_000u64).prop_map(CalendarStep::BeforeEdge),
        2 => (0..2_000u64).prop_map(CalendarStep::AfterEdge),
        1 => (0..DAY).prop_map(CalendarStep::Skip),
    ]
}

/// Calendar windows (`calendar:`, `rules/calendar.rs`): random takes, charges and refunds
/// through `fixed_window.lua`'s calendar mode and through `take_windows` / `return_windows`,
/// at times near the windows' edges (month ends of every length, leap Februaries, week and
/// year ends) from 2024 to 2100, at UTC and at offsets on both sides of it: identical
/// outcomes, stored window and count, and TTL.
#[test]
fn lua_calendar_window_mirrors_rust() {
    use tollgate::rules::{Calendar, CalendarUnit};
    let redis = TestRedis::start();
    let conn = RefCell::new(redis.conn());
    let sources = both_formats(FIXED_WINDOW_LUA, 2);
    let unit = prop::sample::select(vec![
        CalendarUnit::Day,
        CalendarUnit::Week,
        CalendarUnit::Month,
        CalendarUnit::Year,
    ]);
    let offset = prop::sample::select(vec![0i16, 0, 540, -300, 330, -720, 840, 1080, -1080]);
    // 2024-01-01 to 2100-03-01 (2100 is not a leap year).
    let start = 1_704_067_200_000..4_107_542_400_000u64;
    let ops = prop::collection::vec(
        (
            calendar_step(),
            cost(),
            prop::sample::select(vec![0u8, 0, 0, 1, 2, 3]),
        ),
        1..=MAX_TAKES,
    );
    let (cases, edges, refunds) = (Cell::new(0), Cell::new(0), Cell::new(0));
    check(
        (unit, offset, limit(&[0, 1, 2, 3, 10, 1_000]), start, ops),
        |(unit, offset_min, limit, start, ops)| {
            let conn = &mut *conn.borrow_mut();
            let k = "mirror:{cw}";
            del(conn, k);
            let calendar = Calendar { unit, offset_min };
            let windows = bucket::Windows::Calendar(calendar);
            let mut now = start;
            let mut state: Option<WindowState> = None;
            for (step, cost, what) in ops {
                let end = calendar.next(calendar.start(now));
                now = match step {
                    CalendarStep::Stay => now,
                    CalendarStep::Forward(d) => now + d,
                    CalendarStep::Back(d) => now - d,
                    CalendarStep::BeforeEdge(d) => end - d,
                    CalendarStep::AfterEdge(d) => end + d,
                    CalendarStep::Skip(d) => calendar.next(end) + d,
                };
                edges.set(edges.get() + usize::from(matches!(step, CalendarStep::AfterEdge(_))));
                let cost = cost.of(limit);
                // 0 take, 1 charge (overdraft), 2 refund, 3 reservation.
                // A refund's receipt, drawn around now: this window, an earlier one, or none.
                let receipt = receipt_near(now, 30 * DAY, now ^ cost);
                let (next, want) = match what {
                    2 => bucket::return_windows(state, now, limit, windows, cost, receipt),
                    3 => bucket::reserve_windows(state, now, limit, windows, cost),
                    _ => bucket::take_windows(state, now, limit, windows, cost, what == 1),
                };
                let action = match what {
                    1 => Action::Charge,
                    2 => Action::Return {
                        receipt_ms: receipt,
                    },
                    3 => Action::Reserve,
                    _ => Action::Take,
                };
                let op = Op {
                    key: k.into(),
                    kind: OpKind::CalendarWindow {
                        limit,
                        calendar,
                        window_ms: 30 * DAY,
                    },
                    cost,
                    action,
                };
                // Either format, by case.
                let got = eval_at(conn, &sources[(start % 2) as usize], &op, now);
                let at =
                    format!("{calendar} limit {limit} {action:?} {cost} at {now} from {state:?}");
                prop_assert_eq!(got, want, "{}", at);
                let wrote = take_ttl(conn, k);
                if what != 2 && cost > 0 {
                    prop_assert_eq!(wrote, Some(want.reset_ms), "{}: the TTL", at);
                }
                // A refund in the window of a stored count writes it (and its TTL).
                if what == 2
                    && state.is_some_and(|s| s.start_ms == calendar.start(now) && s.count > 0)
                {
                    refunds.set(refunds.get() + 1);
                    prop_assert_eq!(wrote, Some(want.reset_ms), "{}: the refund's TTL", at);
                }
                // What is stored is what the Rust keeps (a missing key or count 0 are alike).
                if let Some((w, c, l)) = window_state(conn, k) {
                    prop_assert_eq!(
                        (w, c, l),
                        (next.start_ms, next.count, next.limit),
                        "{}: stored",
                        at
                    );
                } else {
                    prop_assert!(
                        next.count == 0 || state.is_some_and(|s| s == next),
                        "{}: {:?}",
                        at,
                        next
                    );
                }
                state = Some(next);
            }
            cases.set(cases.get() + 1);
            Ok(())
        },
    );
    eprintln!(
        "calendar window: {} cases, {} steps across an edge, {} refunds in their window",
        cases.get(),
        edges.get(),
        refunds.get()
    );
    assert!(cases.get() >= CASES, "{} cases ran", cases.get());
    assert!(
        edges.get() > 100 && refunds.get() > 20,
        "too few edges or refunds"
    );
}

#[test]
fn lua_sliding_window_mirrors_rust() {
    let redis = TestRedis::start();
    let conn = RefCell::new(redis.conn());
    let source = with_test_clock(SLIDING_WINDOW_LUA, 1);
    // Whole estimates stay whole: 25 hits of the previous window weigh exactly 14 at 440 ms
    // into a 1 s window, so 11 are left (`prev * (1 - elapsed / w)` gives 14.000000000000002
    // and 10 left). Random sequences rarely land on such a point.
    let base = 1_700_000_000_000;
    let mut state = None;
    for (now, cost, remaining) in [(base, 25, 0), (base + 1_440, 0, 11), (base + 1_440, 11, 0)] {
        let (next, want) = bucket::take_sliding(state, now, 25, 1_000, cost, false);
        let got = eval_at(
            &mut conn.borrow_mut(),
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

    let params = (
        limit(&[0, 1, 2, 3, 7, 10, 1_000, 128_952_046, u64::from(u32::MAX)]),
        window_ms(&[1, 7, 1_000, 60_000, HOUR, DAY, 353 * DAY, 365 * DAY]),
    );
    let (cases, refused, weighed) = (Cell::new(0), Cell::new(0), Cell::new(0));
    let refunds = Cell::new(0);
    check(
        (
            params,
            takes(),
            any::<bool>(),
            // About one op in four is a refund (Envoy's `is_negative_hits`) of its cost.
            prop::collection::vec(0u8..4, MAX_TAKES),
            // A rules edit between calls: the same counts read against another limit.
            (limit(&[0, 1, 2, 5, 8, 1_000]), edits()),
        ),
        |((limit0, window_ms), (start, takes), overdraft, kinds, (limit1, edits))| {
            let conn = &mut *conn.borrow_mut();
            let k = "mirror:{sw}";
            del(conn, k);
            let mut now = BASE_MS + start;
            let mut state: Option<SlidingWindowState> = None;
            // When the script last wrote the hash and the TTL it set then.
            let mut expires_at: Option<u64> = None;
            for (i, ((step, cost), kind)) in takes.into_iter().zip(kinds).enumerate() {
                let limit = if edits[i] { limit1 } else { limit0 };
                now = step.apply(now, window_ms);
                let cost = cost.of(limit);
                let refund = kind == 0;
                let (next, want, op) = if refund {
                    let receipt = receipt_near(now, window_ms, now ^ cost);
                    let (next, want) =
                        bucket::give_back_sliding(state, now, limit, window_ms, cost, receipt);
                    (
                        next,
                        want,
                        refund_with(sw(k, limit, window_ms, 0), cost, receipt),
                    )
                } else {
                    let (next, want) =
                        bucket::take_sliding(state, now, limit, window_ms, cost, overdraft);
                    (
                        next,
                        want,
                        charged(sw(k, limit, window_ms, cost), overdraft),
                    )
                };
                refunds
                    .set(refunds.get() + usize::from(refund && state.is_some_and(|s| s.curr > 0)));
                let got = eval_at(conn, &source, &op, now);
                let at = format!(
                    "limit {limit} window {window_ms} cost {cost} overdraft {overdraft} refund {refund} at {now} from {state:?}"
                );
                prop_assert_eq!(got, want, "{}", at);
                // The stored state: an empty one is no key (the memory store does not keep it
                // either); otherwise the same three numbers. The script rewrites the hash only
                // when the state changed, and its TTL always ends where the estimate reaches 0.
                let mut stored: Vec<Option<u64>> = ::redis::cmd("HMGET")
                    .arg(k)
                    .arg(&["w", "p", "c"])
                    .query(conn)
                    .unwrap();
                stored.push(take_ttl(conn, k));
                if next.is_empty() {
                    prop_assert!(stored.iter().all(Option::is_none), "{}: {:?}", at, stored);
                    state = None;
                    expires_at = None;
                } else {
                    prop_assert_eq!(
                        &stored[..3],
                        &[Some(next.start_ms), Some(next.prev), Some(next.curr)][..],
                        "{}",
                        at
                    );
                    if state != Some(next) {
                        expires_at = Some(now + stored[3].expect("ttl"));
                    }
                    prop_assert_eq!(expires_at, Some(now + want.reset_ms), "{}: TTL", at);
                    weighed.set(weighed.get() + usize::from(next.prev > 0 && next.curr > 0));
                    state = Some(next);
                }
                refused.set(refused.get() + usize::from(!want.allowed && want.retry_ms.is_some()));
            }
            cases.set(cases.get() + 1);
            Ok(())
        },
    );
    eprintln!(
        "sliding window: {} cases, {} takes weighed both counts, {} refusals with a retry, {} refunds of a count",
        cases.get(),
        weighed.get(),
        refused.get(),
        refunds.get()
    );
    assert!(
        refunds.get() > 100,
        "{} refunds found a count",
        refunds.get()
    );
    assert!(cases.get() >= CASES, "{} cases ran", cases.get());
    // The sequences exercised both counts at once and refusals that can fit later.
    assert!(
        weighed.get() > 100 && refused.get() > 100,
        "{} {}",
        weighed.get(),
        refused.get()
    );
}

#[test]
fn lua_sliding_log_mirrors_take_log_exactly() {
    let redis = TestRedis::start();
    let conn = RefCell::new(redis.conn());
    // The log is a sorted set, so its TTL goes to a key of its own (standalone Redis only,
    // as this test runs).
    let pexpire = "redis.call('PEXPIRE', KEYS[1], math.max(reset_ms, 1))";
    assert_eq!(
        SLIDING_LOG_LUA.matches(pexpire).count(),
        1,
        "the script sets its TTL once"
    );
    let time = "redis.call('TIME')";
    assert_eq!(
        SLIDING_LOG_LUA.matches(time).count(),
        1,
        "the script reads TIME once"
    );
    let source = SLIDING_LOG_LUA
        .replace(time, "{ARGV[#ARGV - 1], ARGV[#ARGV]}")
        .replace(
            pexpire,
            "redis.call('SET', KEYS[1] .. ':ttl', math.max(reset_ms, 1))",
        );
    let params = (
        limit(&[0, 1, 2, 3, 10, 100, 1_000]),
        window_ms(&[1, 7, 1_000, 60_000, HOUR]),
    );
    let (cases, refused, kept) = (Cell::new(0), Cell::new(0), Cell::new(0));
    // A rules edit between calls: the same entries read against another limit.
    let edited = (limit(&[0, 1, 2, 5, 8, 100]), edits());
    check(
        (params, takes(), edited),
        |((limit0, window_ms), (start, takes), (limit1, edits))| {
            let conn = &mut *conn.borrow_mut();
            let k = "mirror:{sl}";
            del(conn, k);
            del(conn, "mirror:{sl}:ttl");
            let mut now = BASE_MS + start;
            let mut log = SlidingLog::default();
            for (i, (step, cost)) in takes.into_iter().enumerate() {
                let limit = if edits[i] { limit1 } else { limit0 };
                now = step.apply(now, window_ms);
                let cost = cost.of(limit);
                let from = log.clone();
                let want = bucket::take_log(&mut log, now, limit, window_ms, cost);
                let op = Op::take(k.to_string(), OpKind::SlidingLog { limit, window_ms }, cost);
                let got = eval_at(conn, &source, &op, now);
                let at =
                    format!("limit {limit} window {window_ms} cost {cost} at {now} from {from:?}");
                prop_assert_eq!(got, want, "{}", at);
                // The stored hits, by time, are the Rust runs.
                let members: Vec<(String, u64)> = ::redis::cmd("ZRANGE")
                    .arg(k)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query(conn)
                    .unwrap();
                let mut runs: Vec<(u64, u64)> = Vec::new();
                for (_, t) in members {
                    match runs.last_mut() {
                        Some((u, n)) if *u == t => *n += 1,
                        _ => runs.push((t, 1)),
                    }
                }
                prop_assert_eq!(
                    &runs,
                    &log.runs.iter().copied().collect::<Vec<_>>(),
                    "{}",
                    at
                );
                if !log.is_empty() {
                    let ttl: u64 = ::redis::cmd("GET")
                        .arg("mirror:{sl}:ttl")
                        .query(conn)
                        .unwrap();
                    prop_assert_eq!(
                        ttl,
                        want.reset_ms.max(1),
                        "{}: expires when the newest hit leaves",
                        at
                    );
                    kept.set(kept.get() + 1);
                }
                refused.set(refused.get() + usize::from(!want.allowed && want.retry_ms.is_some()));
            }
            cases.set(cases.get() + 1);
            Ok(())
        },
    );
    eprintln!(
        "sliding log: {} cases, {} takes left hits, {} refusals with a retry",
        cases.get(),
        kept.get(),
        refused.get()
    );
    assert!(cases.get() >= CASES, "{} cases ran", cases.get());
    assert!(
        refused.get() > 50 && kept.get() > 100,
        "{} {}",
        refused.get(),
        kept.get()
    );
}

/// One step of a lease sequence: a plain take (the algorithm's own script), a lease claim or a
/// give-back, all on one bucket, so the test also holds the three to one shared state.
#[derive(Clone, Copy, Debug)]
enum LeaseStep {
    Take(Cost),
    /// A take charged even when it does not fit (overdraft, an RLQS Envoy's usage beyond its
    /// assignment): a fixed window's count goes past the limit, into debt.
    Charge(Cost),
    /// need (as a [`Cost`] of the limit), extra wanted beyond it, share.
    Claim(Cost, u64, u64),
    GiveBack(u64),
}

fn lease_step() -> impl Strategy<Value = LeaseStep> {
    prop_oneof![
        2 => cost().prop_map(LeaseStep::Take),
        1 => cost().prop_map(LeaseStep::Charge),
        4 => (cost(), prop_oneof![Just(0u64), 0..50u64, Just(u64::from(u32::MAX))], prop_oneof![Just(1u64), 1..5u64])
            .prop_map(|(need, extra, share)| LeaseStep::Claim(need, extra, share)),
        1 => prop_oneof![Just(1u64), 0..100u64, Just(u64::from(u32::MAX))].prop_map(LeaseStep::GiveBack),
    ]
}

/// `lease.lua` mirrors `claim_token` / `return_token` / `claim_window` / `return_window`, and
/// it shares its state with `token_bucket.lua` / `fixed_window.lua`: random interleavings of
/// takes, charges, claims and give-backs give the same outcomes, and the same stored state
/// (a fixed window's debt included), as the Rust.
#[test]
fn lua_lease_mirrors_the_claims_and_shares_state_with_takes() {
    let redis = TestRedis::start();
    let conn = RefCell::new(redis.conn());
    // lease.lua's TTLs: one `write_state` for both algorithms, its two formats.
    let lease = both_formats(LEASE_LUA, 2);
    let token = both_formats(TOKEN_BUCKET_LUA, 2);
    let window = both_formats(FIXED_WINDOW_LUA, 2);
    let params = (
        any::<bool>(),
        limit(&[0, 1, 2, 3, 10, 100, 1_000, u64::from(u32::MAX)]),
        limit(&[0, 1, 3, 10, 1_000]),
        window_ms(&[7, 1_000, 60_000, HOUR]),
    );
    let steps = (
        0..DAY,
        prop::collection::vec((step(), lease_step()), 1..=MAX_TAKES),
        writers(),
    );
    let (cases, granted_extra, returned) = (Cell::new(0), Cell::new(0), Cell::new(0));
    let ttls_checked = Cell::new(0);
    let debts = Cell::new(0);
    check(
        (params, steps),
        |((token_bucket, cap, refill, window_ms), (start, steps, writers))| {
            let conn = &mut *conn.borrow_mut();
            let k = "mirror:{lease}";
            del(conn, k);
            let p = TokenBucketParams {
                capacity: cap,
                refill,
                window_ms,
            };
            let mut now = BASE_MS + start;
            let mut tb_state: Option<TokenBucketState> = None;
            let mut fw_state: Option<WindowState> = None;
            for (i, (step, what)) in steps.into_iter().enumerate() {
                let format = usize::from(writers[i]);
                now = step.apply(now, window_ms);
                let base = if token_bucket {
                    tb(k, cap, refill, window_ms, 0)
                } else {
                    fw(k, cap, window_ms, 0)
                };
                let (op, source) = match what {
                    LeaseStep::Take(c) => (
                        Op {
                            cost: c.of(cap),
                            ..base
                        },
                        if token_bucket {
                            &token[format]
                        } else {
                            &window[format]
                        },
                    ),
                    LeaseStep::Charge(c) => (
                        charged(
                            Op {
                                cost: c.of(cap),
                                ..base
                            },
                            true,
                        ),
                        if token_bucket {
                            &token[format]
                        } else {
                            &window[format]
                        },
                    ),
                    LeaseStep::Claim(need, extra, share) => {
                        let need = need.of(cap).clamp(1, u64::from(u32::MAX));
                        (claim(base, need, need + extra, share), &lease[format])
                    }
                    LeaseStep::GiveBack(n) => (
                        refund_with(base, n, receipt_near(now, window_ms, now ^ n)),
                        &lease[format],
                    ),
                };
                let mut want = if token_bucket {
                    let (next, o) = match op.action {
                        Action::Take | Action::Charge => bucket::take_token(
                            tb_state,
                            now,
                            p,
                            op.cost,
                            op.action == Action::Charge,
                        ),
                        Action::Claim(ask) => bucket::claim_token(tb_state, now, p, ask),
                        Action::Return { receipt_ms } => bucket::return_token(
                            tb_state,
                            now,
                            p,
                            op.cost,
                            receipt_ms.map(|at| now.saturating_sub(at)),
                        ),
                        Action::Reserve => unreachable!("no reservations in this test"),
                    };
                    tb_state = (next.tokens < cap as f64).then_some(next);
                    o
                } else {
                    let (next, o) = match op.action {
                        Action::Take | Action::Charge => bucket::take_window(
                            fw_state,
                            now,
                            cap,
                            window_ms,
                            op.cost,
                            op.action == Action::Charge,
                        ),
                        Action::Claim(ask) => {
                            bucket::claim_window(fw_state, now, cap, window_ms, ask)
                        }
                        Action::Return { receipt_ms } => bucket::return_window(
                            fw_state, now, cap, window_ms, op.cost, receipt_ms,
                        ),
                        Action::Reserve => unreachable!("no reservations in this test"),
                    };
                    fw_state = Some(next);
                    o
                };
                want.reset_ms = want.reset_ms.min(MAX_WAIT);
                want.retry_ms = want.retry_ms.map(|r| r.min(MAX_WAIT));
                // The TTL key is cleared before each call, so after it the key is there
                // exactly when this call set a TTL.
                let read = |conn: &mut ::redis::Connection| {
                    if token_bucket {
                        let s = token_state(conn, k);
                        (s.map(|(t, ts, c)| (t.to_bits(), ts, c.to_bits())), None)
                    } else {
                        (None, window_state(conn, k))
                    }
                };
                take_ttl(conn, k);
                let before = read(conn);
                let got = eval_at(conn, source, &op, now);
                let at = format!("{op:?} at {now}");
                prop_assert_eq!(got, want, "{}", at);
                let stored = read(conn);
                // Wrote a state (a deleted key is no state, and needs no TTL).
                let wrote = stored != before && (stored.0.is_some() || stored.1.is_some());
                let ttl = take_ttl(conn, k);
                if token_bucket {
                    // The same two numbers, bit for bit, or no key for a full bucket; a call
                    // that stored a state set its TTL to the time until the bucket is full.
                    match tb_state {
                        None => prop_assert!(stored.0.is_none(), "{}: full is not stored", at),
                        Some(s) => {
                            let capacity = s.capacity.expect("written with its capacity");
                            prop_assert_eq!(
                                stored.0,
                                Some((s.tokens.to_bits(), s.ts_ms, capacity.to_bits())),
                                "{}",
                                at
                            );
                            prop_assert!(!wrote || ttl.is_some(), "{}: stored without a TTL", at);
                            if let Some(ttl) = ttl {
                                let full_in = bucket::token_idle_after_ms(s, p).min(MAX_WAIT);
                                prop_assert_eq!(ttl, full_in, "{}: TTL is time-to-full", at);
                            }
                        }
                    }
                } else {
                    // The count the current window starts from, as the script and the Rust
                    // hold it (this window's count; an earlier window's debt less a limit per
                    // window since; else 0), and a call that wrote the window set it to expire
                    // when the count is back at 0 (its `reset_ms`).
                    let start = now - now % window_ms;
                    let carried = |w: u64, c: u64| {
                        if w == start {
                            c
                        } else if w < start {
                            c.saturating_sub((start - w) / window_ms * cap)
                        } else {
                            0
                        }
                    };
                    let stored_count = stored.1.map_or(0, |(w, c, _)| carried(w, c));
                    let rust_count = fw_state.map_or(0, |w| carried(w.start_ms, w.count));
                    prop_assert_eq!(stored_count, rust_count, "{}: the window's count", at);
                    prop_assert!(!wrote || ttl.is_some(), "{}: stored without a TTL", at);
                    if let Some(ttl) = ttl {
                        prop_assert_eq!(
                            ttl.min(MAX_WAIT),
                            want.reset_ms,
                            "{}: expires when the count is back at 0",
                            at
                        );
                    }
                    if rust_count > cap {
                        debts.set(debts.get() + 1);
                    }
                }
                if ttl.is_some() {
                    ttls_checked.set(ttls_checked.get() + 1);
                }
                if let Action::Claim(ask) = op.action {
                    granted_extra.set(granted_extra.get() + usize::from(got.granted > ask.need));
                }
                if op.action.is_return() {
                    returned.set(returned.get() + 1);
                }
            }
            cases.set(cases.get() + 1);
            Ok(())
        },
    );
    eprintln!(
        "lease: {} cases, {} claims granted beyond their need, {} give-backs, {} TTLs compared, {} steps with a fixed window in debt",
        cases.get(),
        granted_extra.get(),
        returned.get(),
        ttls_checked.get(),
        debts.get()
    );
    assert!(debts.get() > 5, "{} steps in debt", debts.get());
    assert!(
        ttls_checked.get() > 200,
        "{} TTLs compared",
        ttls_checked.get()
    );
    assert!(cases.get() >= CASES, "{} cases ran", cases.get());
    assert!(
        granted_extra.get() > 50,
        "{} claims took extra tokens",
        granted_extra.get()
    );
}

/// The sequence the lease property test once found (a claim on a token bucket in debt after
/// overdraft charges, at the extreme sizes: a bucket of 2^32 − 1 refilling 3 an hour): the
/// wait `lease.lua` answers steps by the ulp of the larger of the target and the debt, as
/// `token_bucket.lua` and the Rust do; it was 1 ms off (6871947659993674 against …675). Fixed
/// steps, so this case runs every time, not when the random search happens on it.
#[test]
fn lua_lease_claim_on_a_bucket_in_debt_waits_as_the_rust_says() {
    let redis = TestRedis::start();
    let mut conn = redis.conn();
    let lease = with_test_clock(LEASE_LUA, 2);
    let token = with_test_clock(TOKEN_BUCKET_LUA, 2);
    let mut debt_claims = 0;
    for (cap, refill) in [
        (u64::from(u32::MAX), 3),
        (u64::from(u32::MAX), 1),
        (1_000, 3),
    ] {
        let k = "mirror:{lease-debt}";
        del(&mut conn, k);
        let p = TokenBucketParams {
            capacity: cap,
            refill,
            window_ms: HOUR,
        };
        let base = tb(k, cap, refill, HOUR, 0);
        // Into debt (one charge of the whole limit, then more), then claims of many sizes at
        // many moments, each refused with the wait until the bucket can hold it.
        let mut steps = vec![
            charged(
                Op {
                    cost: cap,
                    ..base.clone()
                },
                true,
            ),
            charged(
                Op {
                    cost: cap / 3 + 1,
                    ..base.clone()
                },
                true,
            ),
            charged(
                Op {
                    cost: cap,
                    ..base.clone()
                },
                true,
            ),
        ];
        for i in 0..60u64 {
            let need = [1, 2, 3, 7, cap / 3, cap / 2 + 7, cap][(i % 7) as usize].max(1);
            steps.push(claim(base.clone(), need, need.max(i), 1 + i % 3));
        }
        steps.push(give_back(base.clone(), 7));
        let mut state: Option<TokenBucketState> = None;
        let mut now = BASE_MS;
        for (i, op) in steps.into_iter().enumerate() {
            now += [1_234, 1, 17, 999, 3_601, 86_399][i % 6];
            let (next, mut want) = match op.action {
                Action::Take | Action::Charge => {
                    bucket::take_token(state, now, p, op.cost, op.action == Action::Charge)
                }
                Action::Claim(ask) => bucket::claim_token(state, now, p, ask),
                Action::Return { receipt_ms } => bucket::return_token(
                    state,
                    now,
                    p,
                    op.cost,
                    receipt_ms.map(|at| now.saturating_sub(at)),
                ),
                Action::Reserve => unreachable!("no reservations in this test"),
            };
            state = (next.tokens < cap as f64).then_some(next);
            want.reset_ms = want.reset_ms.min(MAX_WAIT);
            want.retry_ms = want.retry_ms.map(|r| r.min(MAX_WAIT));
            let source = match op.action {
                Action::Claim(_) | Action::Return { .. } => &lease,
                _ => &token,
            };
            let got = eval_at(&mut conn, source, &op, now);
            assert_eq!(
                got, want,
                "{op:?} at {now} (bucket of {cap} refilling {refill}/h)"
            );
            if matches!(op.action, Action::Claim(_)) && next.tokens < 0.0 {
                debt_claims += 1;
            }
        }
    }
    assert!(
        debt_claims >= 3,
        "{debt_claims} claims met a bucket in debt"
    );
}
