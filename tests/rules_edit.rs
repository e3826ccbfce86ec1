//! Editing the rules keeps each unchanged limit's bucket. A bucket's store key names the limit
//! by its numbers (algorithm, window, `requests_per_unit`, `burst`), not by its position in
//! `rate_limits:`, so inserting a limit before a spent one, reordering or removing others and
//! reloading leaves the spent one spent (a position-keyed bucket started full again: over-
//! admission up to its capacity, fleet-wide), and a limit whose numbers change starts clean.
//! On the memory store and on Redis.

mod common;

use std::time::Duration;

use common::inproc::InProcess;
use common::redis::{TestRedis, unique_prefix};
use common::{poll, request};
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

async fn edits_keep_unchanged_limits(store: Option<String>) {
    let prefix = unique_prefix("edit");
    let server = InProcess::start(&rules(&[HOURLY]), |s| {
        if let Some(url) = &store {
            s.store = url.clone();
        }
        s.key_prefix = prefix.clone();
        s.reload_interval_ms = 100;
    });
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
    // A limit whose numbers changed is another limit: it starts clean.
    reload(&server, &rules(&["{unit: hour, requests_per_unit: 6}"]), 4);
    assert_eq!(
        code().await,
        Code::Ok as i32,
        "a changed limit starts clean"
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
