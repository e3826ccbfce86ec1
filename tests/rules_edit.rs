//! Editing the rules keeps what was spent. A bucket's store key names a limit by its
//! descriptor, its algorithm and its window (`keys::bucket_key`), not by its numbers nor its
//! position in `rate_limits:`, so:
//!
//! - inserting a limit before a spent one, reordering or removing others and reloading leaves
//!   the spent one spent;
//! - raising a spent limit admits only the difference, on every algorithm (5 an hour, 5
//!   spent, raised to 8: 3 more, not 8; a calendar month of 1,000 with 600 spent, raised to
//!   1,200: 600 more, not 1,200), and lowering it below what was spent refuses;
//! - a change of algorithm or window starts clean.
//!
//! On the memory store, one Redis and a 3-node Redis Cluster, through a file reload (and, in
//! `tests/rules_xds.rs`, through xDS). The rule each assertion holds is docs/rules.md's "What
//! a rules edit keeps".

mod common;

use std::time::Duration;

use common::inproc::InProcess;
use common::redis::{TestCluster, TestRedis, unique_prefix};
use common::{poll, request};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const HOURLY: &str = "{unit: hour, requests_per_unit: 5}";
const MINUTELY: &str = "{unit: minute, requests_per_unit: 1000}";

fn rules(limits: &[&str]) -> String {
    let mut s = String::from("domain: edit\ndescriptors:\n  - key: tenant\n    rate_limits:\n");
    for l in limits {
        s.push_str(&format!("      - {l}\n"));
    }
    s
}

/// Writes `text` as the rules and waits until the server has reloaded it `reloads` times.
fn reload(server: &InProcess, text: &str, reloads: usize) {
    std::fs::write(server.rules_dir().join("rules.yaml"), text).unwrap();
    let done = poll(Duration::from_secs(10), || {
        (server.log().matches("rules reloaded").count() >= reloads).then_some(())
    });
    assert!(done.is_some(), "not reloaded:\n{}", server.log());
}

fn start(rules: &str, store: &Option<String>) -> InProcess {
    let prefix = unique_prefix("edit");
    InProcess::start(rules, |s| {
        if let Some(url) = store {
            s.store = url.clone();
        }
        s.key_prefix = prefix.clone();
        s.reload_interval_ms = 100;
    })
}

async fn edits_keep_unchanged_limits(store: Option<String>) {
    let server = start(&rules(&[HOURLY]), &store);
    let mut client = server.client().await;
    let mut code = async || {
        let r = client
            .should_rate_limit(request("edit", &[&[("tenant", "acme")]]))
            .await
            .expect("answered");
        r.get_ref().overall_code
    };
    for _ in 0..5 {
        assert_eq!(code().await, Code::Ok as i32);
    }
    assert_eq!(code().await, Code::OverLimit as i32, "5 per hour spent");

    // A limit inserted before the spent one: it stays spent.
    reload(&server, &rules(&[MINUTELY, HOURLY]), 1);
    assert_eq!(
        code().await,
        Code::OverLimit as i32,
        "inserting a limit before it reset the spent hourly bucket ({store:?})"
    );
    // Reordered, then the other one removed: still spent.
    reload(&server, &rules(&[HOURLY, MINUTELY]), 2);
    assert_eq!(code().await, Code::OverLimit as i32, "after a reorder");
    reload(&server, &rules(&[HOURLY]), 3);
    assert_eq!(code().await, Code::OverLimit as i32, "after a removal");
    // A limit whose window changed is another limit: it starts clean.
    reload(
        &server,
        &rules(&["{unit: minute, requests_per_unit: 5}"]),
        4,
    );
    assert_eq!(
        code().await,
        Code::Ok as i32,
        "a limit with another window starts clean"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_inserted_before_a_spent_one_keeps_it_spent_on_the_memory_store() {
    edits_keep_unchanged_limits(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_inserted_before_a_spent_one_keeps_it_spent_on_redis() {
    let redis = TestRedis::start();
    edits_keep_unchanged_limits(Some(redis.url())).await;
}

/// The four algorithms, each on its own descriptor key.
const ALGORITHMS: [&str; 4] = [
    "token_bucket",
    "fixed_window",
    "sliding_window",
    "sliding_log",
];

/// Rules with every algorithm at `n` per ten years (windows so long that none ends, and no
/// token refills, while a test runs), and a calendar month at `monthly`.
fn numbers(n: u32, monthly: u32) -> String {
    let mut s = String::from("domain: edit\ndescriptors:\n");
    for a in ALGORITHMS {
        s.push_str(&format!(
            "  - key: {a}\n    rate_limit: {{unit: day, unit_multiplier: 3650, requests_per_unit: {n}, algorithm: {a}}}\n"
        ));
    }
    s.push_str(&format!(
        "  - key: budget\n    rate_limit: {{unit: month, requests_per_unit: {monthly}, calendar: utc}}\n"
    ));
    s
}

/// A request of `hits` on descriptor `key=acme`.
fn hits(key: &str, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        hits_addend: hits,
        ..request("edit", &[&[(key, "acme")]])
    }
}

/// How many of `n` requests of 1 on `key` are admitted.
async fn admitted(server: &InProcess, key: &str, n: usize) -> usize {
    let mut client = server.client().await;
    let mut ok = 0;
    for _ in 0..n {
        let r = client
            .should_rate_limit(hits(key, 1))
            .await
            .expect("answered");
        ok += usize::from(r.get_ref().overall_code == Code::Ok as i32);
    }
    ok
}

async fn code_of(server: &InProcess, key: &str, n: u32) -> i32 {
    let mut client = server.client().await;
    let r = client
        .should_rate_limit(hits(key, n))
        .await
        .expect("answered");
    r.get_ref().overall_code
}

async fn raising_and_lowering_keeps_what_was_spent(store: Option<String>) {
    let server = start(&numbers(5, 1_000), &store);
    for a in ALGORITHMS {
        assert_eq!(admitted(&server, a, 7).await, 5, "{a}: 5 of 5 ({store:?})");
    }
    assert_eq!(code_of(&server, "budget", 600).await, Code::Ok as i32);

    // Raised: only the difference is admitted.
    reload(&server, &numbers(8, 1_200), 1);
    for a in ALGORITHMS {
        assert_eq!(
            admitted(&server, a, 6).await,
            3,
            "{a}: 5 spent, raised to 8: 3 more, not 8 ({store:?})"
        );
    }
    // (A calendar window is a fixed window: a refused hit counts up to the limit, as the
    // reference's does, so the 600 go first and the one past them shows nothing is left.)
    assert_eq!(
        code_of(&server, "budget", 600).await,
        Code::Ok as i32,
        "600 of a month's 1,000 spent, raised to 1,200: 600 more ({store:?})"
    );
    assert_eq!(
        code_of(&server, "budget", 1).await,
        Code::OverLimit as i32,
        "and no more: not 1,200 ({store:?})"
    );

    // Lowered below what was spent: refused, not a fresh bucket.
    reload(&server, &numbers(2, 500), 2);
    for a in ALGORITHMS {
        assert_eq!(
            admitted(&server, a, 3).await,
            0,
            "{a}: 8 spent, lowered to 2: refused ({store:?})"
        );
    }
    assert_eq!(code_of(&server, "budget", 1).await, Code::OverLimit as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raising_or_lowering_a_spent_limit_keeps_what_was_spent_on_the_memory_store() {
    raising_and_lowering_keeps_what_was_spent(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raising_or_lowering_a_spent_limit_keeps_what_was_spent_on_redis() {
    let redis = TestRedis::start();
    raising_and_lowering_keeps_what_was_spent(Some(redis.url())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raising_or_lowering_a_spent_limit_keeps_what_was_spent_on_a_cluster() {
    let cluster = TestCluster::shared();
    raising_and_lowering_keeps_what_was_spent(Some(cluster.url())).await;
}
