//! Decisions batched per node (`store/redis/batch.rs`), on a real Redis: under a burst the
//! decisions that queue behind busy calls go together as few script calls, each keeping its own
//! exact answer; a caller that gives up mid-call (Envoy's timeout) takes nobody else's answer
//! with it, and a queued one that gives up before its batch goes is never sent.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::proxy::Proxy;
use common::redis::TestRedis;
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
