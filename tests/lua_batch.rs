//! `lua/batch.lua` runs each op exactly as its own script would, in order: random sequences of
//! batches (proptest: 1 to 8 ops over four buckets, one per algorithm, the same bucket several
//! times in one batch; takes of cost 0, 1, the limit, above it and `u64::MAX`, with and
//! without overdraft, lease claims and give-backs; times that go forward, stand still, jump a
//! window or step back) run in a real `redis-server` once as one batch script call and once
//! as the single scripts one by one, on a copy of the buckets, at the same instant: every op's
//! reply (the batch's packed form, read as the store reads it) and every bucket's stored state
//! (`DUMP`) and TTL must be identical.
//!
//! As in `tests/lua_mirror.rs`, Redis cannot be given a fake clock: both run with `TIME`
//! replaced by two trailing ARGV the test sets, and `PEXPIRE` (or the token bucket's `SET … PX`)
//! writes its TTL into a key of its own, so a state never expires in the middle of a case and
//! the TTLs are compared exactly. Half the cases write the token bucket's state as 0.1.0's hash
//! (`store_state_format: hash`), and half send the batch in the cluster's layout (one key
//! declared, the others in `ARGV`), crossed with the formats.

mod common;

use ::redis::Value;
use common::redis::TestRedis;
use common::store::{charged, claim, fw, give_back, receipt_near, refund_with, sw, tb};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use tollgate::quota::{Op, OpKind};
use tollgate::store::redis::{
    BATCHED_LUA, PACKED_REPLY_BYTES, ScriptCall, StateFormat, batch_lua, packed_replies,
    push_batch_op,
};

const BASE_MS: u64 = 1_700_000_000_123;
const TIME: &str = "redis.call('TIME')";
/// The names a script's key goes by where it sets a TTL: `KEYS[1]`, or `key` inside
/// `take_token` and `take_window` (which a batch calls with each op's key).
const KEY_NAMES: [&str; 2] = ["KEYS[1]", "key"];

/// What a packed state packs: a token bucket's `tokens, ts`, a fixed window's `start_ms, count`,
/// either in lease.lua's `write_state` (`a, b`).
/// The packed states the scripts write (`struct.pack(<format>, <state>)`): a token bucket's
/// three numbers, a window's three, and lease.lua's either.
const PACKED_STATES: [(&str, &str); 3] = [
    ("<ddd", "tokens, ts, capacity"),
    ("<ddd", "start_ms, count, limit"),
    ("<ddd", "a, b, c"),
];

/// `script` with each TTL it sets (`PEXPIRE`, or the packed state's `SET … PX`) written to
/// `<key>~ttl` instead.
fn ttl_to_key(script: &str) -> String {
    let mut out = script.to_string();
    let mut sites = 0;
    for key in KEY_NAMES {
        let pexpire = format!("redis.call('PEXPIRE', {key}, ");
        sites += out.matches(&pexpire).count();
        out = out.replace(&pexpire, &format!("redis.call('SET', {key} .. '~ttl', "));
        for (format, state) in PACKED_STATES {
            let px =
                format!("redis.call('SET', {key}, struct.pack('{format}', {state}), 'PX', ttl_ms)");
            sites += out.matches(&px).count();
            out = out.replace(
                &px,
                &format!(
                    "redis.call('SET', {key}, struct.pack('{format}', {state})) \
                     redis.call('SET', {key} .. '~ttl', ttl_ms)"
                ),
            );
        }
    }
    assert!(sites > 0, "every script sets a TTL");
    assert!(
        !out.contains("redis.call('PEXPIRE'") && !out.contains("'PX', "),
        "every TTL a script sets is written to a key"
    );
    out
}

/// `script` on the test clock (the last two ARGV), its TTL written to `<key>~ttl`.
fn on_test_clock(script: &str) -> String {
    assert_eq!(script.matches(TIME).count(), 1);
    ttl_to_key(script).replace(TIME, "{ARGV[#ARGV - 1], ARGV[#ARGV]}")
}

/// The bucket of algorithm `which` (0 token bucket, 1 fixed window, 2 sliding window,
/// 3 sliding log, 4 a calendar day at UTC+05:30) under `prefix`, and an op on it.
fn op_on(prefix: &str, which: usize, cost: u64, variant: u8) -> Op {
    let key = format!("{prefix}{{b{which}}}");
    let limit = 5;
    let base = match which {
        0 => tb(&key, limit, 2, 1_000, cost),
        1 => fw(&key, limit, 1_000, cost),
        2 => sw(&key, limit, 1_000, cost),
        4 => Op::take(
            key,
            OpKind::CalendarWindow {
                limit,
                calendar: tollgate::rules::Calendar {
                    unit: tollgate::rules::CalendarUnit::Day,
                    offset_min: 330,
                },
                window_ms: 86_400_000,
            },
            cost,
        ),
        _ => Op::take(
            key,
            OpKind::SlidingLog {
                limit,
                window_ms: 1_000,
            },
            cost,
        ),
    };
    // Leases only on a token bucket or a fixed window (the rules allow no others); a
    // give-back (a lease's, or a refund) on those, on a sliding window and a calendar window.
    match variant % 4 {
        1 => charged(base, true),
        2 if which < 2 => {
            let need = cost.clamp(1, limit + 1);
            claim(base, need, need.max(limit), 2)
        }
        // Half of them refunds with a receipt (the batch's packed fixed-window argument
        // carries it in its last double), around the cases' start.
        3 if which != 3 && cost.is_multiple_of(2) => give_back(base, cost.min(limit)),
        3 if which != 3 => {
            let receipt = receipt_near(BASE_MS, 1_000, cost ^ limit);
            refund_with(base, cost.min(limit), receipt)
        }
        _ => base,
    }
}

/// Each reply as its integers (an error reply as its message, so a difference shows).
fn ints(reply: &Value) -> Result<Vec<i64>, String> {
    match reply {
        Value::Array(items) => items
            .iter()
            .map(|v| match v {
                Value::Int(n) => Ok(*n),
                other => Err(format!("{other:?}")),
            })
            .collect(),
        other => Err(format!("{other:?}")),
    }
}

fn dump(conn: &mut ::redis::Connection, key: &str) -> (Option<Vec<u8>>, Option<String>) {
    let state: Option<Vec<u8>> = ::redis::cmd("DUMP").arg(key).query(conn).unwrap();
    let ttl: Option<String> = ::redis::cmd("GET")
        .arg(format!("{key}~ttl"))
        .query(conn)
        .unwrap();
    (state, ttl)
}

#[test]
fn a_batch_answers_and_leaves_the_state_the_single_scripts_do_one_by_one() {
    let redis = TestRedis::start();
    let conn = std::cell::RefCell::new(redis.conn());
    // Odd cases write the token bucket's and the fixed window's state as 0.1.0's hashes
    // (store_state_format: hash), even ones packed.
    let formats = [StateFormat::Packed, StateFormat::Hash].map(|format| {
        let scripts: [String; 5] = std::array::from_fn(|i| {
            let call = [
                ScriptCall::TokenBucket([0; 5]),
                ScriptCall::FixedWindow([0; 7]),
                ScriptCall::SlidingWindow([0; 5]),
                ScriptCall::SlidingLog([0; 3]),
                ScriptCall::Lease([0; 8]),
            ][i];
            call.source(format).to_string()
        });
        let singles: Vec<String> = scripts.iter().map(|s| on_test_clock(s)).collect();
        let patched: Vec<String> = scripts.iter().map(|s| ttl_to_key(s)).collect();
        let batch = batch_lua(
            std::array::from_fn(|i| patched[i].as_str()),
            "{ARGV[#ARGV - 1], ARGV[#ARGV]}",
        );
        (singles, batch)
    });
    let cost = prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(5),
        Just(6),
        Just(u64::MAX)
    ];
    let step = (
        prop_oneof![Just(0i64), 1..400i64, Just(1_000), Just(2_500), -300..0i64],
        prop::collection::vec((0usize..5, cost, 0u8..4), 1..8),
    );
    let mut runner = TestRunner::new(common::proptest_config(48, "lua_batch"));
    let case = std::cell::Cell::new(0u32);
    let result = runner.run(&prop::collection::vec(step, 1..12), |steps| {
        case.set(case.get() + 1);
        let (singles, batch) = &formats[(case.get() % 2) as usize];
        let (a, b) = (format!("a{}:", case.get()), format!("s{}:", case.get()));
        let mut conn = conn.borrow_mut();
        let conn = &mut *conn;
        let mut now = BASE_MS as i64;
        for (dt, picks) in &steps {
            now += dt;
            let (secs, micros) = (now / 1000, (now % 1000) * 1000);
            // The batch on the `a` buckets; in cases 2 and 3 of every 4, in the cluster's layout
            // (only the first key declared, the others in ARGV after minus the op count).
            let ops: Vec<Op> = picks.iter().map(|&(w, c, v)| op_on(&a, w, c, v)).collect();
            let mut cmd = ::redis::cmd("EVAL");
            if case.get() % 4 >= 2 {
                cmd.arg(batch).arg(1).arg(&ops[0].key);
                cmd.arg(-(ops.len() as i64));
                for op in &ops[1..] {
                    cmd.arg(&op.key);
                }
            } else {
                cmd.arg(batch).arg(ops.len());
                for op in &ops {
                    cmd.arg(&op.key);
                }
            }
            for op in &ops {
                let call = ScriptCall::for_op(op);
                push_batch_op(&mut cmd, &call);
            }
            cmd.arg(secs).arg(micros);
            // No op fails here, so the batch answers in its packed form (`packed_replies`).
            let reply: Value = cmd.query(conn).unwrap();
            let Value::BulkString(packed) = reply else {
                panic!("expected the packed reply, got {reply:?}")
            };
            prop_assert_eq!(packed.len(), ops.len() * PACKED_REPLY_BYTES);
            let replies: Vec<Vec<i64>> = packed_replies(&packed).map(Vec::from).collect();
            // The same ops one by one on the `s` buckets, each with its own script.
            for ((&(w, c, v), batched), op) in picks.iter().zip(&replies).zip(&ops) {
                let single = op_on(&b, w, c, v);
                let call = ScriptCall::for_op(&single);
                let script = &singles[BATCHED_LUA
                    .iter()
                    .position(|s| *s == call.source(StateFormat::Packed))
                    .unwrap()];
                let reply: Value = ::redis::cmd("EVAL")
                    .arg(script)
                    .arg(1)
                    .arg(&single.key)
                    .arg(call.argv())
                    .arg(secs)
                    .arg(micros)
                    .query(conn)
                    .unwrap();
                // A script that answers four numbers is packed with a fifth of -1.
                let single = ints(&reply).map(|mut n| {
                    if n.len() == 4 {
                        n.push(-1);
                    }
                    n
                });
                prop_assert_eq!(Ok(batched.clone()), single, "{:?} at {}", op, now);
            }
            for w in 0..4 {
                let key_a = format!("{a}{{b{w}}}");
                let key_b = format!("{b}{{b{w}}}");
                prop_assert_eq!(
                    dump(conn, &key_a),
                    dump(conn, &key_b),
                    "bucket {} after {:?} at {}",
                    w,
                    picks,
                    now
                );
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn an_op_that_fails_in_a_batch_fails_alone() {
    let redis = TestRedis::start();
    let mut conn = redis.conn();
    // A key of the wrong type between two good ones, and a string that is not a bucket's
    // state after them.
    let _: () = ::redis::cmd("RPUSH")
        .arg("x{b0}")
        .arg("not a bucket")
        .query(&mut conn)
        .unwrap();
    let _: () = ::redis::cmd("SET")
        .arg("y{b0}")
        .arg("not a bucket")
        .query(&mut conn)
        .unwrap();
    let ops = [
        tb("ok{1}", 5, 1, 1_000, 1),
        tb("x{b0}", 5, 1, 1_000, 1),
        tb("ok{2}", 5, 1, 1_000, 2),
        tb("y{b0}", 5, 1, 1_000, 1),
    ];
    let lua = &*tollgate::store::redis::BATCH_LUA;
    let mut cmd = ::redis::cmd("EVAL");
    cmd.arg(lua).arg(ops.len());
    for op in &ops {
        cmd.arg(&op.key);
    }
    for op in &ops {
        push_batch_op(&mut cmd, &ScriptCall::for_op(op));
    }
    // As the store sends it (`store/redis/batch_script.rs`): in a pipeline that keeps errors
    // as replies, so an op's error reply inside the batch's array is the op's alone.
    let mut pipe = ::redis::pipe();
    pipe.ignore_errors().add_command(cmd);
    let mut replies: Vec<Value> = pipe.query(&mut conn).unwrap();
    let reply = replies.remove(0);
    let Value::Array(replies) = reply else {
        panic!("expected an array, got {reply:?}")
    };
    assert_eq!(ints(&replies[0]).unwrap()[..2], [1, 4]);
    match &replies[1] {
        Value::ServerError(e) => assert!(
            format!("{e:?}").contains("WRONGTYPE"),
            "the op's own error: {e:?}"
        ),
        other => panic!("expected an error reply, got {other:?}"),
    }
    assert_eq!(ints(&replies[2]).unwrap()[..2], [1, 3]);
    match &replies[3] {
        Value::ServerError(e) => assert!(
            format!("{e:?}").contains("holds something other than a token bucket"),
            "the op's own error: {e:?}"
        ),
        other => panic!("expected an error reply, got {other:?}"),
    }
}
