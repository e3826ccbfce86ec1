//! The simulator's replicas run the Redis client's own circuit breaker and give-up rule
//! (`src/store/breaker.rs`); this holds the two clients around it to the same moments.
//!
//! The same schedule of calls (one every 50 ms, each awaited) meets the same outage: scripts
//! that get no answer from 0.4 s to 1.2 s. On a real `redis-server` that is `CLIENT PAUSE 800
//! WRITE` (scripts wait, `PING` still answers, so the connections stay); in the simulator, a
//! partition of the node for those 800 ms. Each call's outcome (ok, timed out, circuit open) is
//! recorded with its time, and the two runs must agree on how many calls time out before the
//! breaker opens, and on when it opens and closes, within one call of each other (the real run
//! is on a shared, noisy machine). At the defaults, `store_timeout_ms` is 10; the probe bound
//! is the connect timeout.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis::{TestRedis, command};
use tollgate::clock::Clock;
use tollgate::quota::{Op, OpKind};
use tollgate::settings::Settings;
use tollgate::sim::scenario::{Fault, FaultKind, Latency, StoreModel};
use tollgate::sim::store::{ClassCalls, ReplicaStore, SimStore};
use tollgate::store::breaker::Policy;
use tollgate::store::{Backend, Store, StoreErrorKind};
use tollgate::telemetry::Metrics;

const CALL_EVERY_MS: u64 = 50;
const CALLS: u64 = 44;
const OUTAGE_FROM_MS: u64 = 400;
const OUTAGE_MS: u64 = 800;

fn settings(url: &str) -> Settings {
    Settings {
        store: url.to_string(),
        store_pool_size: 2,
        store_connect_timeout_ms: 200,
        breaker_failures: 3,
        breaker_probe_ms: 300,
        ..Settings::default()
    }
}

fn op(key: &str) -> Op {
    Op::take(
        key.to_string(),
        OpKind::TokenBucket {
            capacity: 1_000_000,
            refill: 1_000_000,
            window_ms: 1_000,
        },
        1,
    )
}

/// How one call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    Ok,
    TimedOut,
    Open,
}

fn seen(result: &Result<tollgate::quota::Outcome, tollgate::store::StoreError>) -> Seen {
    match result {
        Ok(_) => Seen::Ok,
        Err(e) if e.kind == StoreErrorKind::Timeout => Seen::TimedOut,
        Err(e) if e.kind == StoreErrorKind::CircuitOpen => Seen::Open,
        Err(e) => panic!("unexpected store error: {e}"),
    }
}

/// The moments a run's outcomes show: timeouts before the first open call, the first open
/// call's time, the first ok call's time after it (ms from the start).
#[derive(Debug)]
struct Moments {
    timeouts_before_open: usize,
    opened_ms: u64,
    closed_ms: u64,
}

fn moments(calls: &[(u64, Seen)]) -> Moments {
    let first_open = calls
        .iter()
        .position(|(_, s)| *s == Seen::Open)
        .unwrap_or_else(|| panic!("the breaker never opened: {calls:?}"));
    let closed = calls[first_open..]
        .iter()
        .find(|(_, s)| *s == Seen::Ok)
        .unwrap_or_else(|| panic!("the breaker never closed: {calls:?}"));
    assert!(
        calls[..first_open]
            .iter()
            .all(|(t, s)| *t >= OUTAGE_FROM_MS || *s == Seen::Ok),
        "every call before the outage succeeds: {calls:?}"
    );
    Moments {
        timeouts_before_open: calls[..first_open]
            .iter()
            .filter(|(_, s)| *s == Seen::TimedOut)
            .count(),
        opened_ms: calls[first_open].0,
        closed_ms: closed.0,
    }
}

/// The schedule on the real Redis client.
async fn real_run() -> Vec<(u64, Seen)> {
    let redis = TestRedis::start();
    let store = Store::connect(
        tollgate::configs::store_config(&settings(&redis.url())),
        Clock::system(),
        &Metrics::new(),
    )
    .await
    .expect("connect");
    let port = redis.port();
    let start = Instant::now();
    let mut out = Vec::new();
    for i in 0..CALLS {
        let at = Duration::from_millis(i * CALL_EVERY_MS);
        tokio::time::sleep_until((start + at).into()).await;
        if i * CALL_EVERY_MS == OUTAGE_FROM_MS {
            let ms = OUTAGE_MS.to_string();
            // The test's own connection: PAUSE holds every client's scripts but not this.
            tokio::task::spawn_blocking(move || {
                command::<String>(port, &["CLIENT", "PAUSE", &ms, "WRITE"]).expect("pause")
            })
            .await
            .expect("pause ran");
        }
        let t = start.elapsed().as_millis() as u64;
        let result = store.apply_each(&[op("parity")]).await;
        out.push((t, seen(&result[0])));
    }
    out
}

/// The same schedule on a simulated replica, on a manual clock.
async fn simulated_run() -> Vec<(u64, Seen)> {
    let s = settings("redis://simulated");
    let clock = Clock::manual(1_700_000_000_000);
    let model = StoreModel {
        nodes: 1,
        latency: Latency {
            p50_ms: 0.2,
            p99_ms: 0.5,
        },
        ops_per_s: 100_000.0,
        faults: vec![Fault {
            at_s: OUTAGE_FROM_MS as f64 / 1e3,
            for_s: OUTAGE_MS as f64 / 1e3,
            kind: FaultKind::Partition { from: 0, to: 1 },
            node: None,
        }],
    };
    let policy = Policy::new(
        Duration::from_millis(s.store_timeout_ms),
        Duration::from_millis(s.store_connect_timeout_ms),
        s.breaker_failures,
        Duration::from_millis(s.breaker_probe_ms),
    );
    let store = Arc::new(SimStore::new(
        &model,
        policy,
        clock.clone(),
        7,
        5,
        Arc::default(),
        Arc::new(ClassCalls::new(5)),
    ));
    let replica = ReplicaStore::new(store, 0, Metrics::new().store);
    let c = clock.clone();
    let run = tokio::spawn(async move {
        let mut out = Vec::new();
        for i in 0..CALLS {
            let at_us = i * CALL_EVERY_MS * 1_000;
            c.sleep(Duration::from_micros(at_us.saturating_sub(c.mono_us())))
                .await;
            let t = c.mono_us() / 1_000;
            let result = replica.apply_each(&[op("parity")]).await;
            out.push((t, seen(&result[0])));
        }
        out
    });
    while !run.is_finished() {
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        clock.advance_us(100);
    }
    run.await.expect("the simulated run")
}

#[test]
fn the_simulated_and_the_real_client_open_and_close_their_breaker_at_the_same_moments() {
    // The simulator's way: one thread, the clock moved only when every task has run.
    let simulated = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
        .block_on(simulated_run());
    let real = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(real_run());
    let (sim, live) = (moments(&simulated), moments(&real));
    let context = format!("simulated {sim:?} {simulated:?}\nreal {live:?} {real:?}");
    assert_eq!(sim.timeouts_before_open, 3, "{context}");
    assert_eq!(live.timeouts_before_open, 3, "{context}");
    for (what, a, b) in [
        ("opened", sim.opened_ms, live.opened_ms),
        ("closed", sim.closed_ms, live.closed_ms),
    ] {
        assert!(
            a.abs_diff(b) <= CALL_EVERY_MS + 10,
            "{what}: simulated at {a} ms, real at {b} ms\n{context}"
        );
    }
    // And both where the rule puts them: closed by the first probe after the outage.
    let outage_end = OUTAGE_FROM_MS + OUTAGE_MS;
    assert!(
        (outage_end..outage_end + 300 + 2 * CALL_EVERY_MS).contains(&sim.closed_ms),
        "{context}"
    );
}
