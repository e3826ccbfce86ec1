//! A request's ops on their nodes: one call when every op is on one node (always, on a
//! standalone Redis), else one call per node, concurrently; a node whose circuit is open is not
//! called. What each call's result tells the pool (the connection), the node's breaker, the
//! error counter and the log is settled here; the call itself is `call.rs`.

use std::sync::Arc;

use futures_util::future::join_all;

use super::batch::{Slot, Turn, unanswered};
use super::scripts::OpResults;
use super::{RedisStore, errors, pool};
use crate::quota::{Op, Outcome};
use crate::store::{StoreError, StoreErrorKind};
use crate::telemetry::KindLabels;

impl RedisStore {
    /// Every op of `ops` on `node`: now, as one call, or (when this replica's calls to the node
    /// are all in flight) queued to go with others as one batch (`batch.rs`).
    pub(super) async fn apply_on(
        self: &Arc<Self>,
        node: Arc<str>,
        ops: &[Op],
    ) -> Vec<Result<Outcome, StoreError>> {
        let now = self.breakers.clock().mono_us();
        if !self.batches(&node) {
            let group: Vec<&Op> = ops.iter().collect();
            return self.apply_now(&node, &group, now).await;
        }
        let batching = self.batching.of(&node);
        match batching.enter(ops, now) {
            Turn::Now => {
                // Passed on to the queue when the call is done, or if this caller gives up.
                let _slot = Slot {
                    store: self.clone(),
                    batching,
                };
                let group: Vec<&Op> = ops.iter().collect();
                self.apply_now(&node, &group, now).await
            }
            Turn::Queued(answer) => answer.await.unwrap_or_else(|_| unanswered(ops.len())),
        }
    }

    /// Whether ops for `node` are batched: batching is on, and `node` is a node (on a cluster
    /// before the first slot map, every key maps to one placeholder name, not to its node).
    pub(super) fn batches(&self, node: &str) -> bool {
        self.batching.enabled() && self.pool.slots().is_none_or(|slots| slots.knows(node))
    }

    /// Every op of `ops` on `node`, as one call now; `since`: when the oldest of its callers
    /// started waiting (the give-up rule counts from then).
    pub(super) async fn apply_now(
        &self,
        node: &Arc<str>,
        ops: &[&Op],
        since: u64,
    ) -> Vec<Result<Outcome, StoreError>> {
        let result = if self.breakers.is_open(node) {
            Err(circuit_open(node))
        } else {
            let result = match self.pool.pick() {
                None => Err(self.not_connected()),
                Some(picked) => {
                    let mut conn = (*picked.conn).clone();
                    let result = self.call(node, &mut conn, ops, since).await;
                    self.judge(&picked, std::slice::from_ref(&result));
                    result
                }
            };
            self.settle(node, &result);
            result
        };
        match result {
            Ok(results) => results,
            Err(e) => vec![Err(e); ops.len()],
        }
    }

    /// Ops on several nodes (a cluster request whose descriptors hash to different slots): one
    /// call per node, concurrently, on one cluster connection.
    pub(super) async fn apply_grouped(&self, ops: &[Op]) -> Vec<Result<Outcome, StoreError>> {
        // Few ops per request: a linear scan beats hashing.
        let mut groups: Vec<(Arc<str>, Vec<usize>)> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let node = self.node_of(&op.key);
            match groups.iter_mut().find(|g| g.0 == node) {
                Some(g) => g.1.push(i),
                None => groups.push((node, vec![i])),
            }
        }
        let mut out: Vec<Option<Result<Outcome, StoreError>>> = vec![None; ops.len()];
        let mut calls = Vec::with_capacity(groups.len());
        for (node, at) in &groups {
            if self.breakers.is_open(node) {
                let e = circuit_open(node);
                for &i in at {
                    out[i] = Some(Err(e.clone()));
                }
            } else {
                calls.push((node, at));
            }
        }
        if !calls.is_empty() {
            let results = match self.pool.pick() {
                None => {
                    let e = self.not_connected();
                    calls.iter().map(|_| Err(e.clone())).collect()
                }
                Some(picked) => {
                    let now = self.breakers.clock().mono_us();
                    let results = join_all(calls.iter().map(|(node, at)| {
                        let group: Vec<&Op> = at.iter().map(|&i| &ops[i]).collect();
                        let mut conn = (*picked.conn).clone();
                        async move { self.call(node, &mut conn, &group, now).await }
                    }))
                    .await;
                    self.judge(&picked, &results);
                    results
                }
            };
            for ((node, at), result) in calls.iter().zip(results) {
                self.settle(node, &result);
                match result {
                    Ok(results) => {
                        for (&i, r) in at.iter().zip(results) {
                            out[i] = Some(r);
                        }
                    }
                    Err(e) => {
                        for &i in at.iter() {
                            out[i] = Some(Err(e.clone()));
                        }
                    }
                }
            }
        }
        out.into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(StoreError::new(
                        StoreErrorKind::Protocol,
                        "an op got no answer",
                    ))
                })
            })
            .collect()
    }

    /// The connection itself is judged by its calls of one request: failed when all failed.
    fn judge(&self, picked: &pool::Picked, results: &[Result<OpResults, StoreError>]) {
        let failed: Vec<&StoreError> = results.iter().filter_map(call_error).collect();
        match failed.first() {
            Some(e) if failed.len() == results.len() => {
                self.pool
                    .call_failed(picked, e.kind, errors::is_readonly(e))
            }
            _ => self.pool.call_succeeded(picked),
        }
    }

    /// One node's call, for its breaker, the error counter (one count per failed op) and the
    /// log. The node failed when the call did or every op of it did.
    fn settle(&self, node: &Arc<str>, result: &Result<OpResults, StoreError>) {
        let count = |e: &StoreError| {
            self.metrics
                .errors
                .get_or_create(&KindLabels {
                    kind: e.kind.label(),
                })
                .inc();
            if !e.is_transient() {
                // Auth, OOM-like script errors, bad replies: these will not heal by
                // themselves, so they get a line of their own (rate-limited).
                self.fatal.record(&Err::<(), _>(e.clone()));
            }
        };
        match result {
            Ok(results) => results
                .iter()
                .filter_map(|r| r.as_ref().err())
                .for_each(count),
            Err(e) => count(e),
        }
        if let Ok(results) = result {
            self.breakers.answered(node, results.len());
        }
        if self
            .breakers
            .settle(node, call_error(result).map(|e| e.kind))
        {
            self.start_probe(node.clone());
        }
    }

    pub(super) fn not_connected(&self) -> StoreError {
        StoreError::new(
            StoreErrorKind::Connection,
            format!(
                "not connected to Redis ({})",
                self.pool.last_connect_error()
            ),
        )
    }
}

/// The error that fails a node's call as a whole: the call's own, or the first op's when every
/// op failed.
fn call_error(result: &Result<OpResults, StoreError>) -> Option<&StoreError> {
    match result {
        Err(e) => Some(e),
        Ok(results) if !results.is_empty() && results.iter().all(|r| r.is_err()) => {
            results.first().and_then(|r| r.as_ref().err())
        }
        Ok(_) => None,
    }
}

fn circuit_open(node: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::CircuitOpen,
        format!("circuit open for {node}"),
    )
}
