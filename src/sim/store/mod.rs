//! The simulated Redis of `tollgate simulate`: nodes that hold buckets, take time, queue
//! when busy and fail on the scenario's schedule, seen by each replica through its own client
//! (with its own circuit breakers, as each real replica has).
//!
//! What is the real code and what is a model:
//! - The buckets are the quota core's ([`MemoryStore`]: the same math `lua/` mirrors, held to
//!   it by `tests/lua_mirror.rs`), one per node, on the virtual clock; the membership set is
//!   the one `lua/membership.lua` keeps (entries with an expiry, counted live).
//! - The network and Redis itself are a model: a round trip drawn from a log-normal through
//!   the scenario's p50 and p99; a node runs `ops_per_s` scripts a second, one at a time, so
//!   past it calls queue; the ops of a call run when the node gets to them, **whether or not
//!   the caller still waits** (a timed-out call's tokens are spent, as in Redis).
//! - The client's breakers and give-up rule are the Redis client's own (`store/breaker.rs`,
//!   [`Breakers`]), one set per replica on the virtual clock: a call gives up when its node
//!   has been silent to this replica for `store_timeout_ms` (after one last short pause), or
//!   after max(`store_connect_timeout_ms`, `store_timeout_ms`); a refused connection opens
//!   the node's breaker at once, `breaker_failures` failed calls in a row open it too; an open
//!   breaker fails its node's ops at once (`CircuitOpen`), and [`probe_until_closed`] probes
//!   it every `breaker_probe_ms` with a script that must run within the connect timeout,
//!   queue included ([`SimStore::probe`]: the model's part). Membership heartbeats pass the
//!   breakers, bounded by the connect timeout alone, as `RedisStore::membership` is. Left out:
//!   the connection pool's reconnect back-off after an outage (a real fleet returns to the
//!   store up to a couple of seconds later than this one).
//! - Slots: a key's node is its hash-tag slot's, the slots split over the nodes in order as
//!   `redis-cli --cluster create` splits them.
//!
//! Flow: a replica's limiter calls [`ReplicaStore`] (a [`Backend`]) → the ops are grouped by
//! node → each node's group is one call ([`ReplicaStore::call`]): breaker, fault, round trip
//! → the call joins the store's list of calls in flight, which one task on the virtual clock
//! works through: it reaches the node, queues, its ops run at the node's turn → the reply
//! comes back half a round trip later, or the caller has given up.
//!
//! Here: the parts and what they share. `node.rs`: the nodes ([`SimStore`]: slots, faults,
//! latency, queue, the buckets and the membership set, what one call runs); `in_flight.rs`:
//! the calls on their way (to the node, in its queue, the reply back) as one list of events;
//! `replica.rs`: one replica's client ([`ReplicaStore`]: breakers, the call and its wait, the
//! `Backend`); `classes.rs`: the scripts each limit class ran per second ([`ClassCalls`]).
//!
//! [`MemoryStore`]: crate::store::MemoryStore
//! [`Breakers`]: crate::store::breaker::Breakers
//! [`probe_until_closed`]: crate::store::breaker::probe_until_closed
//! [`Backend`]: crate::store::Backend

use std::sync::Mutex;

mod classes;
mod in_flight;
mod node;
mod replica;

pub use classes::ClassCalls;
pub use node::SimStore;
pub(in crate::sim) use node::round_trip_us;
pub use replica::ReplicaStore;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the tests of the nodes and of the replicas' client build on: a small store on a
/// manual clock, an op, and a way to run a call to its end.
#[cfg(test)]
mod testing {
    use std::future::Future;
    use std::sync::Arc;
    use std::time::Duration;

    use super::SimStore;
    use crate::clock::Clock;
    use crate::quota::Op;
    use crate::quota::OpKind;
    use crate::sim::scenario::{Fault, Latency, StoreModel};
    use crate::store::breaker::Policy;

    /// A store of `nodes` nodes on a manual clock: 1 ms round trips, 1,000 scripts a second,
    /// a 10 ms timeout, 1 s connect timeout, breakers after 3 failures probed every 500 ms.
    pub(super) fn store_of(nodes: u32, faults: Vec<Fault>) -> (Clock, Arc<SimStore>) {
        let clock = Clock::manual(1_700_000_000_000);
        let model = StoreModel {
            nodes,
            latency: Latency {
                p50_ms: 1.0,
                p99_ms: 1.0,
            },
            ops_per_s: 1_000.0,
            faults,
        };
        let policy = Policy::new(
            Duration::from_millis(10),
            Duration::from_secs(1),
            3,
            Duration::from_millis(500),
        );
        let s = SimStore::new(
            &model,
            policy,
            clock.clone(),
            1,
            10,
            Arc::default(),
            Arc::default(),
        );
        (clock, Arc::new(s))
    }

    pub(super) fn store(faults: Vec<Fault>) -> (Clock, Arc<SimStore>) {
        store_of(1, faults)
    }

    pub(super) fn take(key: &str) -> Op {
        Op::take(
            key.into(),
            OpKind::TokenBucket {
                capacity: 10,
                refill: 10,
                window_ms: 3_600_000,
            },
            1,
        )
    }

    /// Runs `f` to its end, moving the clock 100 µs at a time; its result and how long it
    /// took in virtual µs.
    pub(super) async fn drive<T: Send + 'static>(
        clock: &Clock,
        f: impl Future<Output = T> + Send + 'static,
    ) -> (T, u64) {
        let start = clock.mono_us();
        let task = tokio::spawn(f);
        while !task.is_finished() {
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
            clock.advance_us(100);
        }
        (task.await.expect("ran"), clock.mono_us() - start)
    }
}
