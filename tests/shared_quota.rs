//! The whole point: several tollgate **processes** share one quota through Redis.
//! Concurrent clients hammer one key through all of them (an hour-long unit, so refill cannot
//! blur the count); exactly the limit is admitted, on one Redis and on a 3-primary cluster.

mod common;

use common::redis::{TestCluster, TestRedis, unique_prefix};
use common::{TestServer, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const LIMIT: usize = 60;
const RULES: &str = "domain: shared\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 60}\n";

/// Starts 3 tollgate processes on `store`, sends `per_task` requests from 4 tasks per process
/// concurrently, and returns how many were admitted.
async fn admitted_through_three_replicas(store: &str, per_task: usize) -> usize {
    let prefix = unique_prefix("shared");
    let servers: Vec<TestServer> = (0..3)
        .map(|_| {
            TestServer::builder(RULES)
                .arg("store", store)
                .arg("key-prefix", &prefix)
                // The machine running the suite is small and busy: give Redis room.
                .arg("store-timeout-ms", "500")
                .start()
        })
        .collect();
    let mut tasks = Vec::new();
    for server in &servers {
        for _ in 0..4 {
            let mut client = server.client().await;
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..per_task {
                    let r = client
                        .should_rate_limit(request("shared", &[&[("tenant", "hot")]]))
                        .await
                        .expect("every request answered");
                    admitted += usize::from(r.get_ref().overall_code == Code::Ok as i32);
                }
                admitted
            }));
        }
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_processes_on_one_redis_admit_exactly_the_limit() {
    let redis = TestRedis::start();
    // 3 processes × 4 tasks × 15 = 180 requests for a limit of 60.
    assert_eq!(
        admitted_through_three_replicas(&redis.url(), 15).await,
        LIMIT
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_processes_on_a_redis_cluster_admit_exactly_the_limit() {
    let cluster = TestCluster::shared();
    assert_eq!(
        admitted_through_three_replicas(&cluster.url(), 15).await,
        LIMIT
    );
}
