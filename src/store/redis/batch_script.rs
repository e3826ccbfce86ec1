//! `lua/batch.lua`: several ops in one script call. The script (`lua.rs`: the algorithm scripts
//! of `lua/`, unchanged but for their `TIME`, read once per batch) runs each op exactly as it
//! runs alone (`tests/lua_batch.rs` holds a batch to the same answers and state as the ops one
//! by one). Sent by [`eval_batch`] as one `EVALSHA`
//! (one `EVAL` retry on `NOSCRIPT`), followed by the `WAIT` when there is one. Its reply is
//! every op's four numbers packed in one string ([`packed_replies`]) when no op failed, or one
//! reply per op, each parsed as its own script's, when one did (an op's error stays its own). On a standalone Redis every op's key is
//! declared; on a cluster only the first, and the others travel in `ARGV`
//! ([`Layout::Routed`], `lua/batch.lua`'s second layout), since one node's ops hash to many slots.

use redis::aio::ConnectionLike;
use redis::{ServerErrorKind, Value};

use super::errors::CallError;
use super::lua::{Sources, packed_fixed_window_args, packed_token_bucket_args};
use super::scripts::{OpResults, ScriptCall, Scripts, outcome_of, parse_outcome};
use crate::quota::Op;

/// Where a batch call's keys go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// Every op's key in `KEYS` (a standalone Redis, Sentinel).
    Declared,
    /// The first op's key in `KEYS` (the cluster client routes by it), the others in `ARGV`
    /// after minus the number of ops: the ops of one cluster node, from any of its slots.
    Routed,
}

/// An op's script number in the batch and its `ARGV`.
fn numbered(call: &ScriptCall) -> u64 {
    match call {
        ScriptCall::TokenBucket(_) => 1,
        ScriptCall::FixedWindow(_) => 2,
        ScriptCall::SlidingWindow(_) => 3,
        ScriptCall::SlidingLog(_) => 4,
        ScriptCall::Lease(_) => 5,
    }
}

/// Appends one op's `ARGV` to a batch call: its script number, then its arguments as
/// `lua/batch.lua` reads them (a token bucket's five numbers and a fixed window's six packed in
/// one argument, the others' as their own scripts take them). Public so the tests send batches
/// exactly as the store does.
pub fn push_op(cmd: &mut redis::Cmd, call: &ScriptCall) {
    cmd.arg(numbered(call));
    match call {
        ScriptCall::TokenBucket(args) => cmd.arg(&packed_token_bucket_args(args)[..]),
        ScriptCall::FixedWindow(args) => cmd.arg(&packed_fixed_window_args(args)[..]),
        other => cmd.arg(other.argv()),
    };
}

/// The bytes of one op's answer in a batch's packed reply: five little-endian doubles (the
/// fifth -1 for an op that answers four: every op but a fixed window's take).
pub const PACKED_REPLY_BYTES: usize = 40;

/// A batch's packed reply (`lua/batch.lua`: when every op answered its numbers, one string
/// of them as little-endian doubles, which Redis passes on as it is, where an array of
/// arrays costs Redis a reply per number and this client a parse per number): each op's
/// numbers as Redis would have sent them as integers. Redis turns a Lua number into an
/// integer reply with C's `(long long)` cast, which on x86-64 gives `i64::MIN` for a number
/// out of its range; so does this, so the two forms read alike (only a `remaining` of 2^63
/// tokens or more is out of range: the waits are capped at 2^53). Public for the tests.
pub fn packed_replies(bytes: &[u8]) -> impl Iterator<Item = [i64; 5]> + '_ {
    bytes.chunks_exact(PACKED_REPLY_BYTES).map(|op| {
        std::array::from_fn(|i| {
            let mut double = [0u8; 8];
            double.copy_from_slice(&op[i * 8..i * 8 + 8]);
            as_redis_int(f64::from_le_bytes(double))
        })
    })
}

/// What Redis makes of a Lua number in an integer reply (see [`packed_replies`]).
fn as_redis_int(x: f64) -> i64 {
    // 2^63: the first double past i64::MAX; -2^63 is i64::MIN itself.
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if (-TWO_63..TWO_63).contains(&x) {
        x as i64
    } else {
        i64::MIN
    }
}

/// Runs `ops` as one batch script call on `conn` (every key on this node): one `EVALSHA`,
/// retried once as `EVAL` on `NOSCRIPT` (nothing ran then), then the `WAIT` if there is one.
/// One result per op; `Err` only when the call itself failed.
pub(super) async fn eval_batch<C: ConnectionLike>(
    conn: &mut C,
    ops: &[&Op],
    scripts: &Scripts,
    layout: Layout,
) -> Result<OpResults, CallError> {
    let reply = match send(conn, ops, scripts, layout, false).await? {
        Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript) => {
            send(conn, ops, scripts, layout, true).await?
        }
        reply => reply,
    };
    let replies = match reply {
        // Every op answered its numbers: one string of doubles (`lua/batch.lua`).
        Value::BulkString(bytes) if bytes.len() == ops.len() * PACKED_REPLY_BYTES => {
            return Ok(packed_replies(&bytes)
                .zip(ops)
                .map(|(numbers, op)| Ok(outcome_of(numbers, op)))
                .collect());
        }
        // Some op failed: one reply per op, as each script answers alone.
        Value::Array(replies) if replies.len() == ops.len() => replies,
        Value::ServerError(e) => return Err(CallError::Redis(e.into())),
        other => {
            return Err(CallError::Reply(format!(
                "a batch of {} ops answered {other:?}",
                ops.len()
            )));
        }
    };
    Ok(replies
        .into_iter()
        .zip(ops)
        .map(|(reply, op)| parse_outcome(reply, op).map_err(CallError::into_store_error))
        .collect())
}

/// One batch call (`EVALSHA`, or `EVAL` with the source), then the `WAIT`; the script's reply,
/// an error reply included.
async fn send<C: ConnectionLike>(
    conn: &mut C,
    ops: &[&Op],
    scripts: &Scripts,
    layout: Layout,
    source: bool,
) -> Result<Value, CallError> {
    let mut cmd = redis::Cmd::with_capacity(
        3 + ops.len() * 10,
        64 + ops.iter().map(|op| op.key.len() + 180).sum::<usize>(),
    );
    if source {
        cmd.arg("EVAL").arg(Sources::of(scripts.format()).batch);
    } else {
        cmd.arg("EVALSHA").arg(scripts.batch_sha());
    }
    match layout {
        Layout::Declared => {
            cmd.arg(ops.len());
            for op in ops {
                cmd.arg(&op.key);
            }
        }
        Layout::Routed => {
            cmd.arg(1).arg(ops.first().map_or("", |op| op.key.as_str()));
            cmd.arg(-(ops.len() as i64));
            for op in ops.iter().skip(1) {
                cmd.arg(&op.key);
            }
        }
    }
    for op in ops {
        push_op(&mut cmd, &ScriptCall::for_op(op));
    }
    let mut pipe = redis::Pipeline::with_capacity(2);
    pipe.ignore_errors();
    pipe.add_command(cmd);
    let wait = scripts.wait();
    if let Some(w) = wait {
        pipe.cmd("WAIT").arg(w.replicas).arg(w.timeout_ms);
    }
    let mut replies: Vec<Value> = pipe.query_async(conn).await?;
    if replies.len() != 1 + usize::from(wait.is_some()) {
        return Err(CallError::Reply(format!(
            "{} replies for a batch{}",
            replies.len(),
            if wait.is_some() { " and a WAIT" } else { "" }
        )));
    }
    if let Some(w) = wait
        && let Some(reply) = replies.pop()
    {
        w.record(&reply);
    }
    Ok(replies.remove(0))
}

#[cfg(test)]
mod tests {
    use super::super::lua::{BATCH_LUA, BATCHED_LUA, DISPATCH_LUA, StateFormat, TIME};
    use super::*;

    #[test]
    fn every_batched_script_reads_time_once_and_takes_one_key() {
        for script in BATCHED_LUA {
            let name = script.lines().next().unwrap_or_default();
            assert_eq!(script.matches(TIME).count(), 1, "{name}");
            assert!(!script.contains("KEYS[2]"), "{name}");
            // `batch_lua` turns `ARGV[n]` into `ARGV[B + n]`: sound only where each use is an
            // index of digits (no `#ARGV`, no `ARGV[i]`, no ARGV passed whole).
            for (at, _) in script.match_indices("ARGV") {
                let rest = &script[at + 4..];
                let digits = rest
                    .strip_prefix('[')
                    .map(|r| r.chars().take_while(char::is_ascii_digit).count());
                assert!(
                    digits.is_some_and(|d| d > 0 && rest[1 + d..].starts_with(']')),
                    "{name}: ARGV used other than as ARGV[<n>]: {}",
                    &rest[..rest.len().min(20)]
                );
            }
        }
        assert_eq!(Sources::of(StateFormat::Packed).batch, BATCH_LUA.as_str());
        for format in [StateFormat::Packed, StateFormat::Hash] {
            let lua = Sources::of(format).batch;
            assert_eq!(
                lua.matches(TIME).count(),
                1,
                "TIME once, for the whole batch"
            );
            assert_eq!(lua.matches("= function(KEY, B)").count(), 5);
            // The token bucket, the fixed window and the lease write the format asked for.
            let hash = usize::from(format == StateFormat::Hash);
            assert_eq!(lua.matches("local HASH_STATE = true").count(), 3 * hash);
            assert_eq!(
                lua.matches("local HASH_STATE = false").count(),
                3 - 3 * hash
            );
        }
    }

    #[test]
    fn a_packed_reply_reads_as_redis_sends_the_same_numbers_as_integers() {
        let numbers = [1.0, 0.0, 2_500.0, -1.0, -1.0, 12.7, 9_007_199_254_740_992.0];
        let mut bytes = Vec::new();
        for x in numbers
            .iter()
            .chain(&[9_223_372_036_854_775_808.0, u64::MAX as f64, 3.0])
        {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
        let read: Vec<[i64; 5]> = packed_replies(&bytes).collect();
        // Truncated toward zero, as C's cast; past i64 (a `remaining` of 2^63 or more) what
        // Redis's cast gives on x86-64, which the store reads as 0 as it does that integer.
        assert_eq!(
            read,
            [[1, 0, 2_500, -1, -1], [12, 1 << 53, i64::MIN, i64::MIN, 3]]
        );
        assert_eq!(as_redis_int(f64::NAN), i64::MIN);
        assert_eq!(as_redis_int(-9_223_372_036_854_775_808.0), i64::MIN);
        assert_eq!(
            as_redis_int(9_223_372_036_854_774_784.0),
            9_223_372_036_854_774_784
        );
    }

    #[test]
    fn each_call_has_the_number_and_the_argument_count_the_dispatcher_expects() {
        // NARGS in lua/batch.lua, by script number: the token bucket's five numbers and the
        // fixed window's seven go packed in one argument.
        let nargs = [1, 1, 5, 3, 8];
        assert!(DISPATCH_LUA.contains("local NARGS = {1, 1, 5, 3, 8}"));
        let calls = [
            ScriptCall::TokenBucket([0; 5]),
            ScriptCall::FixedWindow([0; 7]),
            ScriptCall::SlidingWindow([0; 5]),
            ScriptCall::SlidingLog([0; 3]),
            ScriptCall::Lease([0; 8]),
        ];
        for (i, call) in calls.iter().enumerate() {
            assert_eq!(numbered(call) as usize, i + 1);
            let mut cmd = redis::cmd("EVALSHA");
            push_op(&mut cmd, call);
            assert_eq!(cmd.args_iter().count(), 2 + nargs[i]);
            assert_eq!(call.source(StateFormat::Packed), BATCHED_LUA[i]);
        }
    }
}
