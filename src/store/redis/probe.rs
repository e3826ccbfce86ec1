//! The probe of an open circuit breaker on a Redis node (the breakers themselves, shared with
//! the simulator, are `store/breaker.rs`).
//!
//! The probe runs a real script on a key in the node's slots, not a `PING`: a Redis at
//! `maxmemory` with `noeviction` answers `PING` while it refuses every script with `OOM`, and a
//! breaker that closed on `PING` would reopen three calls later, every half second. The
//! probe's key is routed by the current slot map, so a node that left the map (a failed-over
//! primary, a pod that came back with another address) is forgotten rather than probed at its
//! old address for ever.

use super::pool::Pool;
use super::scripts;
use crate::quota::{Op, OpKind};
use crate::store::breaker::Probe;

/// The node name of a standalone Redis.
pub(super) const STANDALONE: &str = "store";

/// Runs the token bucket script once on a key of `node` (a key whose slot the current map gives
/// to `node`; any key on a standalone Redis), bounded by the connect timeout. The key is under
/// `prefix` (so an ACL limited to tollgate's keys allows it) and holds one token for a second.
pub(super) async fn probe(pool: &Pool, node: &str, prefix: &str) -> Probe {
    let key = match pool.slots() {
        None => format!("{prefix}probe"),
        Some(slots) => match slots.key_on(node, &format!("{prefix}probe")) {
            Some(key) => key,
            None => return Probe::Gone,
        },
    };
    let Some(picked) = pool.pick() else {
        return Probe::Failed;
    };
    let op = Op::take(
        key,
        OpKind::TokenBucket {
            capacity: 1,
            refill: 1,
            window_ms: 1_000,
        },
        1,
    );
    let mut conn = (*picked.conn).clone();
    let ran = tokio::time::timeout(pool.connect_timeout(), async {
        match &mut conn {
            super::connect::Conn::Standalone(c) => {
                scripts::eval_ops(c, &[&op], &pool.scripts).await
            }
            super::connect::Conn::Cluster(c) => scripts::eval_ops(c, &[&op], &pool.scripts).await,
        }
    })
    .await;
    match ran {
        Ok(Ok(results)) if results.iter().all(|r| r.is_ok()) => Probe::Ran,
        _ => Probe::Failed,
    }
}
