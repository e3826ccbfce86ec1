//! One node's call: its ops as one batch script call (several ops, batching on), else one
//! pipeline (standalone) or one pipeline per hash slot (cluster), and when to give up on it
//! (the node's silence, not this call's wait; see the module doc of `redis/`).

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::join_all;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;

use super::RedisStore;
use super::batch_script::{self, Layout};
use super::connect::Conn;
use super::errors::CallError;
use super::scripts::{self, OpResults};
use crate::quota::{Op, Outcome};
use crate::store::{StoreError, StoreErrorKind};

impl RedisStore {
    /// One node's ops on `conn`. Gives up by the breakers' rule (`store/breaker.rs`,
    /// [`crate::store::breaker::Wait`]): when `node` has been silent for the timeout, or after
    /// `max_wait`, both counted from `since` (when the call's oldest caller started waiting).
    pub(super) async fn call(
        &self,
        node: &Arc<str>,
        conn: &mut Conn,
        ops: &[&Op],
        since: u64,
    ) -> Result<OpResults, StoreError> {
        let run = run(conn, ops, &self.pool.scripts, self.batches(node));
        tokio::pin!(run);
        let clock = self.breakers.clock();
        let mut wait = self.breakers.wait_since(since);
        let mut deadline = wait.first_deadline(&self.breakers);
        let done = loop {
            // tokio's timer directly: this client runs on the system clock (the simulator's
            // runs the same rule on its own), and the clock handle would box the sleep.
            let sleep = tokio::time::sleep(Duration::from_micros(
                deadline.saturating_sub(clock.mono_us()),
            ));
            tokio::select! {
                biased;
                done = &mut run => break Some(done),
                _ = sleep => {}
            }
            let fired = clock.mono_us();
            // Each yield lets the runtime poll its I/O driver and run the tasks queued ahead of
            // this one, the connection's reader among them, before the call is judged.
            tokio::task::yield_now().await;
            tokio::task::yield_now().await;
            if let Some(done) = (&mut run).now_or_never() {
                break Some(done);
            }
            match wait.next(&self.breakers, node, deadline, fired, clock.mono_us()) {
                Some(next) => deadline = next,
                None => break None,
            }
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
                    self.breakers.policy().timeout.as_millis()
                ),
            )),
        }
    }
}

/// Runs `ops` (all on one node) on `conn`: as one batch script call when there are several
/// and `batch` is on; else, standalone, one pipeline of a script call each, and on a cluster
/// one pipeline per hash slot, concurrently. Results come back in the order of `ops`; a slot's
/// pipeline that failed fails its own ops only.
async fn run(
    conn: &mut Conn,
    ops: &[&Op],
    scripts: &scripts::Scripts,
    batch: bool,
) -> Result<OpResults, CallError> {
    match conn {
        Conn::Standalone(c) if batch && ops.len() > 1 => {
            batch_script::eval_batch(c, ops, scripts, Layout::Declared).await
        }
        Conn::Standalone(c) => scripts::eval_ops(c, ops, scripts).await,
        Conn::Cluster(c) if batch && ops.len() > 1 => run_routed(c, ops, scripts).await,
        Conn::Cluster(c) => run_by_slot(c, ops, scripts).await,
    }
}

/// One cluster node's ops, from any of its slots, as one batch call routed by the first op's
/// key. An op whose key that node does not serve (our slot map was stale: a slot moved, a
/// failover) did not run; it goes again by itself, routed by its own key, so it is answered
/// exactly, not failed.
async fn run_routed(
    c: &mut ClusterConnection,
    ops: &[&Op],
    scripts: &scripts::Scripts,
) -> Result<OpResults, CallError> {
    let mut out = batch_script::eval_batch(c, ops, scripts, Layout::Routed).await?;
    let strays: Vec<usize> = (0..out.len())
        .filter(|&i| matches!(&out[i], Err(e) if not_on_this_node(e)))
        .collect();
    if strays.is_empty() {
        return Ok(out);
    }
    let again: Vec<&Op> = strays.iter().map(|&i| ops[i]).collect();
    match run_by_slot(c, &again, scripts).await {
        Ok(results) => {
            for (i, r) in strays.into_iter().zip(results) {
                out[i] = r;
            }
        }
        Err(e) => {
            let e = e.into_store_error();
            for i in strays {
                out[i] = Err(e.clone());
            }
        }
    }
    Ok(out)
}

/// A script's error for a key of another node ("Script attempted to access a non local key in
/// a cluster node" in Redis 7, "Lua script attempted …" before), or for a key the call did not
/// declare on a server that wants every key declared (Dragonfly: "… undeclared key …"): raised
/// before the op's first command ran, so the op spent nothing.
fn not_on_this_node(e: &StoreError) -> bool {
    e.message.contains("non local key") || e.message.contains("undeclared key")
}

/// Ops on a cluster, one pipeline per hash slot, concurrently (the cluster client routes each).
async fn run_by_slot(
    c: &mut ClusterConnection,
    ops: &[&Op],
    scripts: &scripts::Scripts,
) -> Result<OpResults, CallError> {
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
