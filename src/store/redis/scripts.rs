//! The Lua scripts and how they are called: `EVALSHA` by SHA1, with one `EVAL` retry on
//! `NOSCRIPT`, and the replies parsed into [`Outcome`]s.
//!
//! Each bucket op becomes one `EVALSHA` of a script from `lua/` (`token_bucket.lua`,
//! `fixed_window.lua`, `sliding_window.lua`, `sliding_log.lua`): the read-decide-write runs
//! atomically inside Redis, on Redis `TIME`, mirroring `quota::bucket` line for line. The ops
//! of one call go out as one pipeline. When Redis answers `NOSCRIPT` (a restart, a failover to
//! a fresh replica, `SCRIPT FLUSH`), the failed ops, and only those, are retried once with
//! `EVAL` and the full source, which runs them and caches the script again on that node; ops
//! of the same pipeline that did run are not repeated. [`Scripts::load`] preloads the scripts
//! on every new connection (`SCRIPT LOAD`).
//!
//! With `store_wait_replicas` set ([`Wait`]), each pipeline ends with `WAIT <replicas>
//! <timeout>`: the call's answer waits until that many replicas hold its writes, or the
//! timeout. On a cluster the `WAIT` rides in the slot's pipeline, so it goes to the node that
//! ran the scripts (alone, the client would send it to every primary). Redis replication is
//! asynchronous, so without it a primary that dies right after answering can take the last
//! writes with it and a promoted replica readmits their tokens; with it, only writes whose
//! `WAIT` came back short (counted, logged) can be lost that way. It narrows the window; it
//! cannot close it.

use redis::aio::ConnectionLike;
use redis::{RedisError, ServerErrorKind, Value};

use super::errors::CallError;
use super::lua::{SLIDING_LOG_LUA, SLIDING_WINDOW_LUA, Sources, StateFormat};
use super::outage::OutageLog;
use crate::quota::bucket;
use crate::quota::{Action, Op, OpKind, Outcome};
use crate::store::{StoreError, StoreErrorKind};

/// Which script an op runs and its `ARGV`, exactly as sent (see the scripts' headers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScriptCall {
    /// `token_bucket.lua`: capacity, refill, window_ms, cost (unclamped: the script reads it
    /// as the same double Rust's `cost as f64` is), overdraft (1: charge a take that does
    /// not fit).
    TokenBucket([u64; 5]),
    /// `fixed_window.lua`: limit, window_ms, cost clamped to limit + 1 (2 × limit + 1 with
    /// overdraft: same answers, exact numbers; see the script's header; a give-back's
    /// unclamped), mode (0 take, 1 overdraft, 2 give back, 3 reserve: a refused take counts
    /// nothing), calendar (0: epoch-aligned windows), the calendar's UTC offset in minutes +
    /// 1080, a give-back's receipt: the end of the window it names (0: none).
    FixedWindow([u64; 7]),
    /// `sliding_window.lua`: limit, window_ms, cost (unclamped, as for the token bucket:
    /// a count is capped before it is stored), mode (0 take, 1 overdraft, 2 give back), a
    /// give-back's receipt (0: none).
    SlidingWindow([u64; 5]),
    /// `sliding_log.lua`: limit, window_ms, cost (unclamped: only a cost within the limit is
    /// recorded).
    SlidingLog([u64; 3]),
    /// `lease.lua`: algorithm (1 token bucket, 2 fixed window), action (1 claim, 2 give
    /// back), capacity or limit, refill, window_ms, need, want (a give-back: its receipt's
    /// window end, 0 for none), share.
    Lease([u64; 8]),
}

/// `fixed_window.lua`'s offset argument for UTC (the offset in minutes + 1080).
const UTC_ARG: u64 = crate::quota::calendar::MAX_OFFSET_MIN as u64;

/// `fixed_window.lua`'s ARGV for `op` (see [`ScriptCall::FixedWindow`]).
fn window_args(op: &Op, limit: u64, window_ms: u64, calendar: u64, offset: u64) -> [u64; 7] {
    let (mode, most) = match op.action {
        Action::Charge => (1, bucket::overdraft_cap(limit)),
        Action::Return { .. } => (2, u64::MAX - 1),
        Action::Reserve => (3, limit),
        Action::Take | Action::Claim(_) => (0, limit),
    };
    let cost = op.cost.min(most.saturating_add(1));
    [
        limit,
        window_ms,
        cost,
        mode,
        calendar,
        offset,
        receipt_arg(op),
    ]
}

/// A give-back's receipt as the scripts read it: the end of the window it names, 0 for none
/// (an instant of 0 names no window a store is in).
fn receipt_arg(op: &Op) -> u64 {
    match op.action {
        Action::Return {
            receipt_ms: Some(end),
        } => end.max(1),
        _ => 0,
    }
}

/// The cost a take script is sent: 0 (a check) for a give-back.
fn take_cost(op: &Op) -> u64 {
    if op.action.is_return() { 0 } else { op.cost }
}

impl ScriptCall {
    pub fn for_op(op: &Op) -> Self {
        let lease = |algorithm, capacity, refill, window_ms| match op.action {
            Action::Claim(ask) => Some(ScriptCall::Lease([
                algorithm, 1, capacity, refill, window_ms, ask.need, ask.want, ask.share,
            ])),
            Action::Return { .. } => Some(ScriptCall::Lease([
                algorithm,
                2,
                capacity,
                refill,
                window_ms,
                op.cost,
                receipt_arg(op),
                1,
            ])),
            // A reservation is never leased: it goes to the window's own script (mode 3).
            Action::Take | Action::Charge | Action::Reserve => None,
        };
        let leased = match op.kind {
            OpKind::TokenBucket {
                capacity,
                refill,
                window_ms,
            } => lease(1, capacity, refill, window_ms),
            OpKind::FixedWindow { limit, window_ms } => lease(2, limit, 0, window_ms),
            // No leases on a sliding window or log, or a calendar window (the rules refuse
            // them): a take.
            OpKind::SlidingWindow { .. }
            | OpKind::SlidingLog { .. }
            | OpKind::CalendarWindow { .. } => None,
        };
        if let Some(call) = leased {
            return call;
        }
        let overdraft = op.action == Action::Charge;
        let flag = u64::from(overdraft);
        match op.kind {
            OpKind::TokenBucket {
                capacity,
                refill,
                window_ms,
            } => ScriptCall::TokenBucket([capacity, refill, window_ms, op.cost, flag]),
            OpKind::FixedWindow { limit, window_ms } => {
                ScriptCall::FixedWindow(window_args(op, limit, window_ms, 0, UTC_ARG))
            }
            // A calendar window's give-back (a refund: it has no leases) is mode 2 of the
            // fixed window's script.
            OpKind::CalendarWindow {
                limit,
                calendar,
                window_ms,
            } => ScriptCall::FixedWindow(window_args(
                op,
                limit,
                window_ms,
                calendar.unit.code(),
                calendar.offset_arg(),
            )),
            // A give-back (a refund: no leases on these) is mode 2 of the sliding window's
            // script, and a check of a log (which takes no refunds), as on the memory store.
            OpKind::SlidingWindow { limit, window_ms } => {
                let mode = if op.action.is_return() { 2 } else { flag };
                ScriptCall::SlidingWindow([limit, window_ms, op.cost, mode, receipt_arg(op)])
            }
            OpKind::SlidingLog { limit, window_ms } => {
                ScriptCall::SlidingLog([limit, window_ms, take_cost(op)])
            }
        }
    }

    /// The script as sent when the buckets' state is written as `format`.
    pub fn source(&self, format: StateFormat) -> &'static str {
        let sources = Sources::of(format);
        match self {
            ScriptCall::TokenBucket(_) => sources.token_bucket,
            ScriptCall::FixedWindow(_) => sources.fixed_window,
            ScriptCall::SlidingWindow(_) => SLIDING_WINDOW_LUA,
            ScriptCall::SlidingLog(_) => SLIDING_LOG_LUA,
            ScriptCall::Lease(_) => sources.lease,
        }
    }

    pub fn argv(&self) -> &[u64] {
        match self {
            ScriptCall::TokenBucket(a) => a,
            ScriptCall::FixedWindow(a) => a,
            ScriptCall::SlidingWindow(a) => a,
            ScriptCall::SlidingLog(a) => a,
            ScriptCall::Lease(a) => a,
        }
    }
}

/// `WAIT` after each call's scripts (`store_wait_replicas`, `store_wait_timeout_ms`).
#[derive(Debug)]
pub(super) struct Wait {
    pub(super) replicas: u64,
    /// Always > 0 (`WAIT … 0` would block for ever) and below `store_timeout_ms`, so a
    /// replica that lags does not make the node look silent.
    pub(super) timeout_ms: u64,
    /// `tollgate_store_wait_short_total`: calls whose `WAIT` came back short.
    pub(super) short: prometheus_client::metrics::counter::Counter,
    /// One log line when `WAIT`s start coming back short, one when they are full again.
    pub(super) log: OutageLog,
}

impl Wait {
    /// Notes a `WAIT` reply: the number of replicas that acknowledged (or an error).
    pub(super) fn record(&self, reply: &Value) {
        let acked = match reply {
            Value::Int(n) => u64::try_from(*n).ok(),
            _ => None,
        };
        let result = match acked {
            Some(n) if n >= self.replicas => Ok(()),
            _ => {
                self.short.inc();
                Err(StoreError::new(
                    StoreErrorKind::Timeout,
                    format!(
                        "WAIT {} {}: {} (the writes may be lost if this primary fails over now)",
                        self.replicas,
                        self.timeout_ms,
                        acked.map_or_else(
                            || format!("refused: {reply:?}"),
                            |n| format!("{n} replicas acknowledged")
                        )
                    ),
                ))
            }
        };
        self.log.record(&result);
    }
}

/// The SHA1s `EVALSHA` names the scripts by (for the token bucket's state format), and the
/// `WAIT` that follows them, if any.
#[derive(Debug)]
pub(super) struct Scripts {
    format: StateFormat,
    token_bucket: String,
    fixed_window: String,
    sliding_window: String,
    sliding_log: String,
    lease: String,
    /// `lua/batch.lua` around the scripts above (`lua.rs`).
    batch: String,
    wait: Option<Wait>,
}

impl Scripts {
    pub(super) fn new(format: StateFormat, wait: Option<Wait>) -> Self {
        let sources = Sources::of(format);
        let sha = |source: &str| redis::Script::new(source).get_hash().to_string();
        Scripts {
            format,
            token_bucket: sha(sources.token_bucket),
            fixed_window: sha(sources.fixed_window),
            sliding_window: sha(SLIDING_WINDOW_LUA),
            sliding_log: sha(SLIDING_LOG_LUA),
            lease: sha(sources.lease),
            batch: sha(sources.batch),
            wait,
        }
    }

    /// The state format the scripts write.
    pub(super) fn format(&self) -> StateFormat {
        self.format
    }

    pub(super) fn sha(&self, call: &ScriptCall) -> &str {
        match call {
            ScriptCall::TokenBucket(_) => &self.token_bucket,
            ScriptCall::FixedWindow(_) => &self.fixed_window,
            ScriptCall::SlidingWindow(_) => &self.sliding_window,
            ScriptCall::SlidingLog(_) => &self.sliding_log,
            ScriptCall::Lease(_) => &self.lease,
        }
    }

    /// The batch script's SHA1 (`batch_script.rs`).
    pub(super) fn batch_sha(&self) -> &str {
        &self.batch
    }

    /// The `WAIT` that follows each call's scripts, if any.
    pub(super) fn wait(&self) -> Option<&Wait> {
        self.wait.as_ref()
    }

    /// Caches every script on `conn` (`SCRIPT LOAD`; on a cluster it goes to every primary).
    /// A refusal (an ACL without SCRIPT, say) is not fatal: `NOSCRIPT` falls back to `EVAL`.
    pub(super) async fn load<C: ConnectionLike>(&self, conn: &mut C) -> Result<(), RedisError> {
        let sources = Sources::of(self.format);
        for (source, sha) in [
            (sources.token_bucket, &self.token_bucket),
            (sources.fixed_window, &self.fixed_window),
            (SLIDING_WINDOW_LUA, &self.sliding_window),
            (SLIDING_LOG_LUA, &self.sliding_log),
            (sources.lease, &self.lease),
            (sources.batch, &self.batch),
        ] {
            let load = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(source)
                .query_async::<String>(conn)
                .await;
            match load {
                Ok(got) if got == *sha => {}
                Ok(got) => {
                    tracing::error!(expected = %sha, %got, "Redis computed another script SHA1")
                }
                // A lost connection, or one the server will not serve without credentials
                // (NOAUTH): the connection attempt fails, as an auth failure.
                Err(e)
                    if e.is_io_error()
                        || e.is_unrecoverable_error()
                        || super::errors::kind_of(&e) == crate::store::StoreErrorKind::Auth =>
                {
                    return Err(e);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "SCRIPT LOAD refused; scripts will be sent with EVAL")
                }
            }
        }
        Ok(())
    }
}

/// One result per op of a call: each op is judged by its own reply, so one op's error (an
/// `OOM`, a bad reply) neither hides the others' outcomes (tokens they spent, leases they were
/// granted) nor fails them.
pub(super) type OpResults = Vec<Result<Outcome, StoreError>>;

/// Runs `ops` as one pipeline of `EVALSHA`s on one connection; retries the ops that got
/// `NOSCRIPT`, and only those, once with `EVAL` (which caches the script again). `Err` only
/// when the pipeline itself failed (the connection, a reply count that does not match).
pub(super) async fn eval_ops<C: ConnectionLike>(
    conn: &mut C,
    ops: &[&Op],
    scripts: &Scripts,
) -> Result<OpResults, CallError> {
    let replies = pipeline(conn, ops.iter().copied(), scripts.wait.as_ref(), |call| {
        Script::Sha(scripts.sha(call))
    })
    .await?;
    // A `NOSCRIPT` op keeps a placeholder until its retry answers.
    let mut out: OpResults = Vec::with_capacity(ops.len());
    let mut missing: Vec<usize> = Vec::new();
    for (i, (reply, op)) in replies.into_iter().zip(ops).enumerate() {
        match reply {
            Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript) => {
                missing.push(i);
                out.push(Ok(Outcome::default()));
            }
            reply => out.push(parse_outcome(reply, op).map_err(CallError::into_store_error)),
        }
    }
    if !missing.is_empty() {
        let retry = missing.iter().map(|&i| ops[i]);
        let replies = pipeline(conn, retry, scripts.wait.as_ref(), |call| {
            Script::Source(call.source(scripts.format))
        })
        .await?;
        for (i, reply) in missing.into_iter().zip(replies) {
            out[i] = parse_outcome(reply, ops[i]).map_err(CallError::into_store_error);
        }
    }
    Ok(out)
}

/// How a pipeline names its script: by SHA1 (`EVALSHA`) or with the source (`EVAL`).
enum Script<'a> {
    Sha(&'a str),
    Source(&'static str),
}

/// Sends one `EVALSHA`/`EVAL` per op as one pipeline, then the `WAIT` if there is one; one
/// reply per op, errors included (one op's `NOSCRIPT` must not hide the others' answers).
async fn pipeline<'a, 'o, C: ConnectionLike>(
    conn: &mut C,
    ops: impl ExactSizeIterator<Item = &'o Op>,
    wait: Option<&Wait>,
    script: impl Fn(&ScriptCall) -> Script<'a>,
) -> Result<Vec<Value>, CallError> {
    let expected = ops.len();
    let mut pipe = redis::Pipeline::with_capacity(expected + 1);
    pipe.ignore_errors();
    for op in ops {
        let call = ScriptCall::for_op(op);
        // Sized up front: the command, the script, numkeys, the key and up to 8 numbers
        // (20 digits each), so building it never reallocates.
        let mut cmd = redis::Cmd::with_capacity(4 + call.argv().len(), 64 + op.key.len() + 160);
        match script(&call) {
            Script::Sha(sha) => cmd.arg("EVALSHA").arg(sha),
            Script::Source(source) => cmd.arg("EVAL").arg(source),
        };
        cmd.arg(1).arg(&op.key).arg(call.argv());
        pipe.add_command(cmd);
    }
    if let Some(w) = wait {
        pipe.cmd("WAIT").arg(w.replicas).arg(w.timeout_ms);
    }
    let mut replies: Vec<Value> = pipe.query_async(conn).await?;
    if replies.len() != expected + usize::from(wait.is_some()) {
        return Err(CallError::Reply(format!(
            "{} replies for {} ops{}",
            replies.len(),
            expected,
            if wait.is_some() { " and a WAIT" } else { "" }
        )));
    }
    if let Some(w) = wait
        && let Some(reply) = replies.pop()
    {
        w.record(&reply);
    }
    Ok(replies)
}

/// `{allowed, remaining, reset_ms, retry_ms[, found]}` (a take; a fixed window's adds the
/// count it found) or `{granted, remaining, reset_ms, retry_ms}` (`lease.lua`) → [`Outcome`].
pub(super) fn parse_outcome(reply: Value, op: &Op) -> Result<Outcome, CallError> {
    let items = match reply {
        Value::Array(items) => items,
        Value::ServerError(e) => return Err(CallError::Redis(e.into())),
        other => {
            return Err(CallError::Reply(format!(
                "expected 4 integers, got {other:?}"
            )));
        }
    };
    match items.as_slice() {
        [
            Value::Int(first),
            Value::Int(remaining),
            Value::Int(reset),
            Value::Int(retry),
            found @ ..,
        ] if found.len() <= 1 => {
            let found = match found {
                [Value::Int(found)] => *found,
                [] => -1,
                _ => {
                    return Err(CallError::Reply(format!(
                        "expected 4 or 5 integers, got {items:?}"
                    )));
                }
            };
            Ok(outcome_of([*first, *remaining, *reset, *retry, found], op))
        }
        _ => Err(CallError::Reply(format!(
            "expected 4 or 5 integers, got {items:?}"
        ))),
    }
}

/// A script's numbers (`{allowed or granted, remaining, reset_ms, retry_ms, found}`, as Redis
/// sends them: negative where the script said -1; `found` -1 when it answered four) →
/// [`Outcome`].
pub(super) fn outcome_of([first, remaining, reset, retry, found]: [i64; 5], op: &Op) -> Outcome {
    let first = u64::try_from(first).unwrap_or(0);
    let (allowed, granted) = match (ScriptCall::for_op(op), op.action) {
        (_, Action::Return { .. }) => (true, 0),
        (ScriptCall::Lease(_), _) => (first > 0, first),
        _ => (first == 1, if first == 1 { op.cost } else { 0 }),
    };
    Outcome {
        allowed,
        remaining: u64::try_from(remaining).unwrap_or(0),
        reset_ms: u64::try_from(reset).unwrap_or(0),
        retry_ms: u64::try_from(retry).ok(),
        granted,
        found: u64::try_from(found).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_calls_match_the_script_headers() {
        let tb = Op {
            key: "k".into(),
            kind: OpKind::TokenBucket {
                capacity: 10,
                refill: 5,
                window_ms: 1000,
            },
            cost: u64::MAX,
            action: Default::default(),
        };
        assert_eq!(
            ScriptCall::for_op(&tb).argv(),
            [10, 5, 1000, u64::MAX, 0],
            "sent unclamped"
        );
        let charge = Op {
            action: Action::Charge,
            ..tb.clone()
        };
        assert_eq!(ScriptCall::for_op(&charge).argv()[4], 1, "overdraft");
        let fw = Op {
            key: "k".into(),
            kind: OpKind::FixedWindow {
                limit: 3,
                window_ms: 60_000,
            },
            cost: u64::MAX,
            action: Default::default(),
        };
        assert_eq!(
            ScriptCall::for_op(&fw).argv(),
            [3, 60_000, 4, 0, 0, 1080, 0],
            "clamped to limit + 1; epoch-aligned windows (calendar 0, UTC)"
        );
        let charge = Op {
            action: Action::Charge,
            ..fw.clone()
        };
        assert_eq!(
            ScriptCall::for_op(&charge).argv(),
            [3, 60_000, 7, 1, 0, 1080, 0],
            "with overdraft the debt counts: clamped to 2 × limit + 1"
        );
        // A calendar window: its unit's code and offset; a refund is mode 2, unclamped.
        let month = Op {
            kind: OpKind::CalendarWindow {
                limit: 3,
                calendar: crate::rules::Calendar {
                    unit: crate::rules::CalendarUnit::Month,
                    offset_min: -300,
                },
                window_ms: 2_592_000_000,
            },
            action: Action::RETURN,
            cost: 9,
            ..fw.clone()
        };
        assert_eq!(
            ScriptCall::for_op(&month).argv(),
            [3, 2_592_000_000, 9, 2, 3, 780, 0]
        );
        // With a receipt, the end of the window it names.
        let receipted = Op {
            action: Action::Return {
                receipt_ms: Some(1_765_000_000_000),
            },
            ..month.clone()
        };
        assert_eq!(ScriptCall::for_op(&receipted).argv()[6], 1_765_000_000_000);
        let huge = Op {
            kind: OpKind::FixedWindow {
                limit: u64::MAX,
                window_ms: 1,
            },
            ..fw
        };
        assert_eq!(ScriptCall::for_op(&huge).argv()[2], u64::MAX);
        let sw = Op {
            key: "k".into(),
            kind: OpKind::SlidingWindow {
                limit: 3,
                window_ms: 60_000,
            },
            cost: u64::MAX,
            action: Default::default(),
        };
        let call = ScriptCall::for_op(&sw);
        assert_eq!(call.argv(), [3, 60_000, u64::MAX, 0, 0], "sent unclamped");
        assert_eq!(call.source(StateFormat::Packed), SLIDING_WINDOW_LUA);
        let sl = Op {
            kind: OpKind::SlidingLog {
                limit: 3,
                window_ms: 60_000,
            },
            ..sw.clone()
        };
        let call = ScriptCall::for_op(&sl);
        assert_eq!(call.argv(), [3, 60_000, u64::MAX]);
        assert_eq!(call.source(StateFormat::Hash), SLIDING_LOG_LUA);
        assert!(SLIDING_LOG_LUA.starts_with("-- sliding_log.lua"));
        assert!(SLIDING_WINDOW_LUA.starts_with("-- sliding_window.lua"));
        assert!(super::super::lua::TOKEN_BUCKET_LUA.starts_with("-- token_bucket.lua"));
        assert!(super::super::lua::FIXED_WINDOW_LUA.starts_with("-- fixed_window.lua"));
    }

    #[test]
    fn replies_parse_and_bad_ones_are_errors() {
        let op = Op::take(
            "k".into(),
            OpKind::TokenBucket {
                capacity: 10,
                refill: 5,
                window_ms: 1000,
            },
            3,
        );
        let take = &op;
        let ok = Value::Array(vec![
            Value::Int(1),
            Value::Int(4),
            Value::Int(100),
            Value::Int(0),
        ]);
        let o = parse_outcome(ok, take).unwrap();
        assert_eq!(
            (o.allowed, o.remaining, o.reset_ms, o.retry_ms),
            (true, 4, 100, Some(0))
        );
        let never = Value::Array(vec![
            Value::Int(0),
            Value::Int(0),
            Value::Int(5),
            Value::Int(-1),
        ]);
        assert_eq!(parse_outcome(never, take).unwrap().retry_ms, None);
        assert!(parse_outcome(Value::Nil, take).is_err());
        assert!(parse_outcome(Value::Array(vec![Value::Int(1)]), take).is_err());
    }
}
