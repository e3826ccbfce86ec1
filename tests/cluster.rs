//! Redis Cluster routing: whatever the descriptor values, every op of a request reaches the
//! node that owns its key, in one call, and each bucket is one key.

mod common;

use std::cell::{Cell, RefCell};
use std::collections::HashSet;

use common::redis::{TestCluster, unique_prefix};
use common::store::{DAY, contract_store, fw, sw, tb};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use tollgate::keys;
use tollgate::quota::Op;
use tollgate::rules::{Algorithm, Rate, Unit};

/// What the values of a request's descriptors are made of: braces (the hash tag), separators,
/// escapes, whitespace and non-ASCII.
const ALPHABET: &[char] = &[
    'a', 'Z', '0', '%', '{', '}', '|', '=', '#', '\\', ':', '\n', ' ', 'é',
];

/// One op of a generated request.
#[derive(Clone, Debug)]
struct GenOp {
    key: String,
    value: String,
    algorithm: Algorithm,
    /// A shard index in the key (as `share_threshold` wildcard rules produce).
    sharded: bool,
    /// A raw key no `bucket_key` produces: stray and empty braces.
    raw: bool,
}

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(ALPHABET), 0..9).prop_map(String::from_iter)
}

fn request() -> impl Strategy<Value = Vec<GenOp>> {
    let op = (
        text(),
        text(),
        prop::sample::select(Algorithm::ALL.to_vec()),
        prop::bool::weighted(1.0 / 3.0),
        prop::bool::weighted(1.0 / 5.0),
    )
        .prop_map(|(key, value, algorithm, sharded, raw)| GenOp {
            key,
            value,
            algorithm,
            sharded,
            raw,
        });
    prop::collection::vec(op, 1..=8)
}

/// Property: every op of a request reaches the node owning its key, so no request fails with
/// CROSSSLOT or MOVED, and each bucket is one key (the second pass sees the first pass's
/// takes). 100 requests on the shared cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_routes_every_op_of_any_request() {
    let cluster = TestCluster::shared();
    let store = contract_store(&cluster.url()).await;
    let prefix = unique_prefix("route");
    let handle = tokio::runtime::Handle::current();
    let slots = RefCell::new(HashSet::new());
    let requests = Cell::new(0u64);
    let mut runner = TestRunner::new(common::proptest_config(100, "cluster"));
    // The property runs synchronously (proptest is not async): each case blocks on the store
    // call from a blocking section of this multi-threaded runtime.
    let result = tokio::task::block_in_place(|| {
        runner.run(&request(), |generated| {
            // Every case (a shrinking rerun too) is a new request with keys of its own.
            let request = requests.get();
            requests.set(request + 1);
            let ops: Vec<Op> = generated
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    let rate = Rate {
                        requests_per_unit: 50,
                        unit: Unit::Day,
                        unit_multiplier: 1,
                        burst: 50,
                        algorithm: g.algorithm,
                        calendar: None,
                    };
                    let key = if g.raw {
                        format!("{prefix}{}{{{}}}{{{i}}}{request}", g.key, g.value)
                    } else {
                        keys::bucket_key(
                            &prefix,
                            &format!("d{request}"),
                            [(g.key.as_str(), g.value.as_str())],
                            &rate,
                            i,
                            g.sharded.then_some(i as u32),
                        )
                    };
                    slots
                        .borrow_mut()
                        .insert(::redis::cluster_routing::Slot::for_key(&key));
                    match g.algorithm {
                        Algorithm::TokenBucket => tb(&key, 50, 50, DAY, 1),
                        Algorithm::FixedWindow => fw(&key, 50, DAY, 1),
                        Algorithm::SlidingWindow => sw(&key, 50, DAY, 1),
                        Algorithm::SlidingLog => Op::take(
                            key,
                            tollgate::quota::OpKind::SlidingLog {
                                limit: 50,
                                window_ms: DAY,
                            },
                            1,
                        ),
                    }
                })
                .collect();
            let first = handle
                .block_on(store.apply(&ops))
                .unwrap_or_else(|e| panic!("request {request}: {e} ({ops:?})"));
            let second = handle
                .block_on(store.apply(&ops))
                .unwrap_or_else(|e| panic!("request {request}: {e}"));
            for (i, (a, b)) in first.iter().zip(&second).enumerate() {
                // Duplicate keys inside one request are possible (empty values); count them.
                let same = ops.iter().filter(|o| o.key == ops[i].key).count() as u64;
                prop_assert!(a.allowed && b.allowed, "request {} op {}", request, i);
                prop_assert_eq!(
                    a.remaining - b.remaining,
                    same,
                    "request {} op {}: one bucket, one key",
                    request,
                    i
                );
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(requests.get() >= 100, "{} requests", requests.get());
    let slots = slots.into_inner();
    assert!(
        slots.len() > 200,
        "the keys spread over the slots ({})",
        slots.len()
    );
}
