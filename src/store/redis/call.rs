//! One node's call: its ops as one pipeline (standalone) or one pipeline per hash slot
//! (cluster), and when to give up on it (the node's silence, not this call's wait; see the
//! module doc of `redis/`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::join_all;
use redis::cluster_routing::Slot;

use super::RedisStore;
use super::connect::Conn;
use super::errors::CallError;
use super::scripts::{self, OpResults};
use crate::store::{Op, Outcome, StoreError, StoreErrorKind};

impl RedisStore {
    /// One node's ops on `conn`. Gives up only when `node` has been silent for the timeout
    /// (see the module doc), or after `max_wait`.
    pub(super) async fn call(
        &self,
        node: &Arc<str>,
        conn: &mut Conn,
        ops: &[&Op],
    ) -> Result<OpResults, StoreError> {
        let started = Instant::now();
        let hard = started + self.max_wait;
        let run = run(conn, ops, &self.pool.scripts);
        tokio::pin!(run);
        // Time this process was too busy to look at the call: how late its timer fired, and
        // how long it takes to get through the run queue once (a burst, CPU throttling). The
        // node's replies may be waiting unread all that time, so it is not node silence.
        let mut lag = Duration::ZERO;
        let mut deadline = started + self.timeout;
        // Whether the node's silence was confirmed by a last short pause (once per call).
        let mut confirmed = false;
        let done = loop {
            tokio::select! {
                biased;
                done = &mut run => break Some(done),
                _ = tokio::time::sleep_until(deadline.into()) => {}
            }
            let fired = Instant::now();
            lag += fired.saturating_duration_since(deadline);
            // Each yield lets the runtime poll its I/O driver and run the tasks queued ahead of
            // this one, the connection's reader among them, before the call is judged.
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
            if let Some(done) = (&mut run).now_or_never() {
                break Some(done);
            }
            let now = Instant::now();
            lag += now - fired;
            let heard = self
                .breakers
                .last_reply(node)
                .map_or(started, |t| t.max(started));
            let silent_until = heard + self.timeout + lag;
            if now >= hard {
                break None;
            }
            if now >= silent_until {
                if confirmed {
                    break None;
                }
                // Before giving up, one short pause (a quarter of the timeout): on an
                // overcommitted host the connection's reader can sit unscheduled on another
                // worker, or another thread, with the node's replies already in its socket.
                // The pause lets it run; a reply heard meanwhile (this call's or another's)
                // keeps the call waiting. A node that is really silent costs it a quarter of
                // the timeout more.
                confirmed = true;
                deadline = (now + (self.timeout / 4).max(Duration::from_millis(1))).min(hard);
                continue;
            }
            deadline = silent_until.min(hard);
        };
        match done {
            Some(Ok(results)) => {
                self.breakers.replied(node);
                Ok(results)
            }
            Some(Err(e)) => {
                let e = e.into_store_error();
                if !e.is_transient() {
                    // The node answered, with an error.
                    self.breakers.replied(node);
                }
                Err(e)
            }
            None => Err(StoreError::new(
                StoreErrorKind::Timeout,
                format!(
                    "no reply from Redis ({node}) to any call for {} ms",
                    self.timeout.as_millis()
                ),
            )),
        }
    }
}

/// Runs `ops` on `conn`: one pipeline (standalone) or one pipeline per hash slot, concurrently
/// (cluster). Results come back in the order of `ops`; a slot's pipeline that failed fails its
/// own ops only.
async fn run(
    conn: &mut Conn,
    ops: &[&Op],
    scripts: &scripts::Scripts,
) -> Result<OpResults, CallError> {
    let c = match conn {
        Conn::Standalone(c) => return scripts::eval_ops(c, ops, scripts).await,
        Conn::Cluster(c) => c,
    };
    // The common case (one descriptor, or all in one slot): one pipeline, nothing to group, so
    // nothing allocated for grouping.
    if let Some((first, rest)) = ops.split_first() {
        let slot = Slot::for_key(&first.key);
        if rest.iter().all(|op| Slot::for_key(&op.key) == slot) {
            return scripts::eval_ops(c, ops, scripts).await;
        }
    }
    // Few ops per request: a linear scan beats hashing.
    let mut groups: Vec<(Slot, Vec<&Op>, Vec<usize>)> = Vec::new();
    for (i, &op) in ops.iter().enumerate() {
        let slot = Slot::for_key(&op.key);
        match groups.iter_mut().find(|g| g.0 == slot) {
            Some(g) => {
                g.1.push(op);
                g.2.push(i);
            }
            None => groups.push((slot, vec![op], vec![i])),
        }
    }
    let calls = groups.iter().map(|(_, group, _)| {
        let mut c = c.clone();
        async move { scripts::eval_ops(&mut c, group, scripts).await }
    });
    let mut results = join_all(calls).await;
    if !results.is_empty()
        && results.iter().all(Result::is_err)
        && let Err(e) = results.swap_remove(0)
    {
        // No slot's pipeline answered: the call failed as a whole (a lost node, say).
        return Err(e);
    }
    let mut out: Vec<Option<Result<Outcome, StoreError>>> = vec![None; ops.len()];
    for ((_, _, at), result) in groups.iter().zip(results) {
        match result {
            Ok(outcomes) => {
                for (&i, o) in at.iter().zip(outcomes) {
                    out[i] = Some(o);
                }
            }
            Err(e) => {
                let e = e.into_store_error();
                for &i in at {
                    out[i] = Some(Err(e.clone()));
                }
            }
        }
    }
    Ok(out
        .into_iter()
        .map(|o| {
            o.unwrap_or_else(|| {
                Err(StoreError::new(
                    StoreErrorKind::Protocol,
                    "an op got no answer",
                ))
            })
        })
        .collect())
}
