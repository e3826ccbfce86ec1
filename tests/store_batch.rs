//! Decisions batched per node (`store/redis/batch.rs`), on a real Redis: under a burst the
//! decisions that queue behind busy calls go together as few script calls, each keeping its own
//! exact answer; a caller that gives up mid-call (Envoy's timeout) takes nobody else's answer
//! with it, and a queued one that gives up before its batch goes is never sent. On a cluster
//! the batches form per primary, over the node's many slots, and an op whose slot moved away
//! while the replica's slot map still named the old node is answered exactly all the same.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::proxy::Proxy;
use common::redis::{TestCluster, TestRedis, script_calls};
use common::store::{key, one, settings, tb};
use tollgate::clock::Clock;
use tollgate::store::Store;
use tollgate::telemetry::Metrics;

async fn store(url: &str, in_flight: usize, metrics: &Metrics) -> Arc<Store> {
    let s = tollgate::settings::Settings {
        store_batch_in_flight: in_flight,
        // Nothing gives up in these tests: the proxy's delays are well within it.
        store_connect_timeout_ms: 5_000,
        ..settings(url, 5_000)
    };
    Arc::new(
        Store::connect(
            tollgate::configs::store_config(&s),
            Clock::system(),
            metrics,
        )
        .await
        .unwrap_or_else(|e| panic!("store for {url}: {e}")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_goes_in_few_calls_and_every_decision_keeps_its_exact_answer() {
    let redis = TestRedis::start();
    let proxy = Proxy::start(format!("127.0.0.1:{}", redis.port()).parse().unwrap()).await;
    let metrics = Metrics::new();
    let store = store(&proxy.url(), 2, &metrics).await;
    let k = key("batch-burst:", "tenant");
    // Warm: the connections made and the scripts loaded.
    one(&store, tb(&key("batch-burst:", "warm"), 1, 1, 1_000, 1)).await;
    let before = proxy.evalsha_sent();
    let calls: Vec<_> = (0..300)
        .map(|_| {
            let (store, op) = (store.clone(), tb(&k, 100, 100, 3_600_000, 1));
            tokio::spawn(async move { store.apply(&[op]).await })
        })
        .collect();
    let mut remaining = Vec::new();
    for call in calls {
        let outcome = call.await.unwrap().unwrap().remove(0);
        if outcome.allowed {
            remaining.push(outcome.remaining);
        }
    }
    remaining.sort_unstable();
    assert_eq!(
        remaining,
        (0..100).collect::<Vec<u64>>(),
        "exactly the capacity admitted, each take seeing its own remaining"
    );
    let sent = proxy.evalsha_sent() - before;
    assert!(
        sent < 150,
        "{sent} script calls for 300 decisions: the queued ones went together"
    );
    let text = metrics.render();
    assert!(
        text.contains("tollgate_store_batch_ops_count"),
        "batches are counted: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_gives_up_takes_no_other_answer_and_a_queued_one_is_never_sent() {
    let redis = TestRedis::start();
    let proxy = Proxy::start(format!("127.0.0.1:{}", redis.port()).parse().unwrap()).await;
    let metrics = Metrics::new();
    let store = store(&proxy.url(), 1, &metrics).await;
    let prefix = "batch-cancel:";
    one(&store, tb(&key(prefix, "warm"), 1, 1, 1_000, 1)).await;
    // A slow link: each call takes ~200 ms there and back.
    proxy.set_delay(Duration::from_millis(100));
    let before = proxy.evalsha_sent();
    // Each call says when it starts (its turn is taken in the same poll).
    let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
    let take = |name: &str| {
        let (store, op) = (store.clone(), tb(&key(prefix, name), 10, 1, 3_600_000, 1));
        let started = started.clone();
        tokio::spawn(async move {
            let _ = started.send(());
            store.apply(&[op]).await
        })
    };
    // `first` holds the only call slot (its call is on the wire); the others queue behind it.
    let first = take("first");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while proxy.evalsha_sent() == before {
        assert!(std::time::Instant::now() < deadline, "first was never sent");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (second, third, gone) = (take("second"), take("third"), take("gone"));
    for _ in 0..4 {
        starts.recv().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    // `gone`'s caller gives up while it waits in the queue, then `first`'s while its call is
    // on the wire (as Envoy's timeout cancels a request): the slot passes on, and `second` and
    // `third` go as one call.
    // An abort only asks: the task is dropped when the runtime next gets to it, which on a busy
    // machine can come after `first`'s drop has passed the slot on and formed the batch. Wait
    // for `gone` to be gone (its place in the queue dropped with it) before `first` gives up.
    gone.abort();
    let _ = gone.await;
    first.abort();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // `second`'s caller gives up while that batch is on the wire: `third` keeps its answer.
    second.abort();
    let outcome = tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .expect("third never answered")
        .unwrap()
        .unwrap_or_else(|e| panic!("third: {e}"))
        .remove(0);
    assert!(outcome.allowed && outcome.remaining == 9, "{outcome:?}");
    assert_eq!(
        proxy.evalsha_sent() - before,
        2,
        "first's call, then one batch of second and third (gone never sent)"
    );
    proxy.set_delay(Duration::ZERO);
    let mut conn = redis.conn();
    let exists = |conn: &mut ::redis::Connection, name: &str| -> bool {
        ::redis::cmd("EXISTS")
            .arg(key(prefix, name))
            .query::<u64>(conn)
            .unwrap()
            == 1
    };
    // `first` and `second` were sent before their callers gave up: Redis ran them (their
    // tokens are spent).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    for name in ["first", "second"] {
        while !exists(&mut conn, name) {
            assert!(std::time::Instant::now() < deadline, "{name} never ran");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert!(
        !exists(&mut conn, "gone"),
        "a decision given up before its batch went is never sent"
    );
    // The slot was passed on: a new call goes through at once.
    let next = tokio::time::timeout(
        Duration::from_secs(5),
        one(&store, tb(&key(prefix, "next"), 10, 1, 3_600_000, 1)),
    )
    .await
    .expect("the call slot was released");
    assert!(next.allowed);
}

/// Bursts on a cluster: `tenants` buckets of capacity 10 (distinct hash tags, so spread over the
/// slots and nodes), 20 takes on each at once; each tenant admits exactly 10, each take seeing
/// its own remaining.
async fn exact_burst(store: &Arc<Store>, prefix: &str, tenants: usize) {
    let calls: Vec<_> = (0..20)
        .flat_map(|_| 0..tenants)
        .map(|t| {
            let (store, op) = (
                store.clone(),
                tb(&key(prefix, &format!("t{t}")), 10, 10, 3_600_000, 1),
            );
            tokio::spawn(async move { (t, store.apply(&[op]).await) })
        })
        .collect();
    let mut remaining = vec![Vec::new(); tenants];
    for call in calls {
        let (t, result) = call.await.unwrap();
        let outcome = result
            .unwrap_or_else(|e| panic!("tenant {t}: {e}"))
            .remove(0);
        if outcome.allowed {
            remaining[t].push(outcome.remaining);
        }
    }
    for (t, mut r) in remaining.into_iter().enumerate() {
        r.sort_unstable();
        assert_eq!(r, (0..10).collect::<Vec<u64>>(), "tenant {t}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_each_node_batches_its_own_slots_and_every_decision_is_exact() {
    let cluster = TestCluster::start();
    let metrics = Metrics::new();
    let store = store(&cluster.url(), 2, &metrics).await;
    let prefix = "cluster-batch:";
    // Warm: connections made, slot map read, scripts loaded on every node.
    for t in 0..30 {
        one(&store, tb(&key("warm:", &format!("t{t}")), 1, 1, 1_000, 1)).await;
    }
    let calls = |c: &TestCluster| c.nodes().iter().map(script_calls).sum::<u64>();
    let before = calls(&cluster);
    exact_burst(&store, prefix, 30).await;
    let sent = calls(&cluster) - before;
    // 600 decisions on 30 buckets over three primaries: one call each would be 600.
    assert!(
        sent < 300,
        "{sent} script calls for 600 decisions: each node's queued ones went together"
    );
    let text = metrics.render();
    assert!(
        !text.contains("tollgate_store_errors_total{"),
        "no store errors: {text}"
    );
}

/// The 40-character id of the node listening on `port` (`CLUSTER MYID`).
fn node_id(cluster: &TestCluster, port: u16) -> String {
    let node = cluster.nodes().iter().find(|n| n.port() == port).unwrap();
    node.cmd(&["CLUSTER", "MYID"])
}

/// Reads a node has refused (`INFO commandstats`: `GET` and `HMGET` calls rejected or failed).
/// The token bucket reads its state first, so a script sent a key of another node is refused
/// there, inside the script.
fn reads_refused(cluster: &TestCluster, port: u16) -> u64 {
    let node = cluster.nodes().iter().find(|n| n.port() == port).unwrap();
    let stats: String = node.cmd(&["INFO", "commandstats"]);
    stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_get:") || l.starts_with("cmdstat_hmget:"))
        .flat_map(|l| l.split(','))
        .filter_map(|f| {
            let n = f
                .strip_prefix("rejected_calls=")
                .or_else(|| f.strip_prefix("failed_calls="))?;
            n.trim().parse::<u64>().ok()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_op_whose_slot_moved_under_a_stale_slot_map_is_sent_again_and_answered_exactly() {
    let cluster = TestCluster::start();
    let metrics = Metrics::new();
    let store = store(&cluster.url(), 1, &metrics).await;
    for t in 0..30 {
        one(&store, tb(&key("warm:", &format!("t{t}")), 1, 1, 1_000, 1)).await;
    }
    let mut exercised = 0;
    for round in 0..3 {
        let prefix = format!("moved{round}:");
        // Twenty buckets on one node, `from`, and one more, `moving`, whose empty slot is
        // handed to another node, `to`, just before the burst: the replica's slot map (read
        // once a second) still sends it to `from` with the others.
        // Hash tags name the round: a key's slot is its tag's alone. The moving one's slot
        // must hold no key (a node hands over only an empty slot this way).
        let slot_of = |k: &str| -> i64 { cluster.nodes()[0].cmd(&["CLUSTER", "KEYSLOT", k]) };
        let moving = (0..)
            .map(|j| key(&prefix, &format!("m{round}.{j}")))
            .find(|k| {
                let node = cluster.port_of(k);
                let node = cluster.nodes().iter().find(|n| n.port() == node).unwrap();
                let slot = slot_of(k).to_string();
                node.cmd::<i64>(&["CLUSTER", "COUNTKEYSINSLOT", &slot]) == 0
            })
            .unwrap();
        let from = cluster.port_of(&moving);
        let to = *cluster
            .primary_ports()
            .iter()
            .find(|&&p| p != from)
            .unwrap();
        let others: Vec<String> = (0..)
            .map(|i| key(&prefix, &format!("r{round}o{i}")))
            .filter(|k| cluster.port_of(k) == from && slot_of(k) != slot_of(&moving))
            .take(20)
            .collect();
        let slot = slot_of(&moving);
        let (slot, to_id) = (slot.to_string(), node_id(&cluster, to));
        let refused_before = reads_refused(&cluster, from);
        for port in [from, to] {
            let node = cluster.nodes().iter().find(|n| n.port() == port).unwrap();
            node.cmd::<String>(&["CLUSTER", "SETSLOT", &slot, "NODE", &to_id]);
        }
        let node = cluster.nodes().iter().find(|n| n.port() == to).unwrap();
        node.cmd::<::redis::Value>(&["CLUSTER", "BUMPEPOCH"]);
        // All at once, so that they queue behind the one call in flight and go as batches.
        let burst: Vec<_> = std::iter::once(moving.clone())
            .chain(others.iter().cloned())
            .chain(std::iter::once(moving.clone()))
            .map(|k| {
                let (store, op) = (store.clone(), tb(&k, 10, 10, 3_600_000, 1));
                tokio::spawn(async move { store.apply(&[op]).await })
            })
            .collect();
        for call in burst {
            let outcome = call.await.unwrap().unwrap().remove(0);
            assert!(outcome.allowed, "{outcome:?}");
        }
        // `moving` was taken twice, on its new node, and nowhere else.
        let state = |port: u16| {
            let node = cluster.nodes().iter().find(|n| n.port() == port).unwrap();
            node.token_state(&moving)
        };
        let (tokens, _) = state(to).expect("the moved bucket lives on its new node");
        assert!((8.0..8.1).contains(&tokens), "{tokens} tokens left of 10");
        let old = cluster.nodes().iter().find(|n| n.port() == from).unwrap();
        let left: i64 = old.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot]);
        assert_eq!(left, 0, "nothing written on the old node");
        for k in &others {
            let node = cluster.nodes().iter().find(|n| n.port() == from).unwrap();
            let (tokens, _) = node.token_state(k).expect("every other bucket was taken");
            assert!((9.0..9.1).contains(&tokens), "{k}: {tokens}");
        }
        if reads_refused(&cluster, from) > refused_before {
            exercised += 1;
        }
    }
    // The map is read once a second: most rounds beat it.
    assert!(
        exercised > 0,
        "no round sent the moved key to its old node; the stray path never ran"
    );
    let text = metrics.render();
    assert!(
        !text.contains("tollgate_store_errors_total{"),
        "no op failed: {text}"
    );
}
