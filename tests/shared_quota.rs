//! The whole point: several tollgate replicas share one quota through Redis.
//!
//! Three tollgates (in-process servers, each with its own runtime, store and Redis connection
//! pool, so as separate as replicas in separate processes as far as Redis can tell) serve one
//! Redis or one 3-primary cluster. Concurrent clients hammer one key through all of them (an
//! hour-long unit, so refill cannot blur the count): exactly the limit is admitted.

mod common;

use common::InProcess;
use common::redis::{TestCluster, TestRedis, unique_prefix};
use common::request;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const LIMIT: usize = 300;
const RULES: &str = "domain: shared\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 300}\n";
const REPLICAS: usize = 3;
/// Clients per replica, each on a connection of its own, so the requests really race.
const TASKS: usize = 8;
const PER_TASK: usize = 25;

/// Starts 3 tollgates on `store`, sends `PER_TASK` requests from `TASKS` tasks per replica
/// concurrently (600 for a limit of 300), and returns how many were admitted.
async fn admitted_through_three_replicas(store: &str) -> usize {
    let prefix = unique_prefix("shared");
    let servers: Vec<InProcess> = (0..REPLICAS)
        .map(|_| {
            InProcess::start(RULES, |s| {
                s.store = store.to_string();
                s.key_prefix = prefix.clone();
                // The machine running the suite is small and busy: give Redis room.
                s.store_timeout_ms = 500;
            })
        })
        .collect();
    let mut tasks = Vec::new();
    for server in &servers {
        for _ in 0..TASKS {
            let mut client = server.client().await;
            tasks.push(tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..PER_TASK {
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
async fn three_replicas_on_one_redis_admit_exactly_the_limit() {
    let redis = TestRedis::start();
    assert_eq!(
        admitted_through_three_replicas(&redis.url()).await,
        LIMIT,
        "{} attempts through {REPLICAS} replicas, limit {LIMIT}",
        REPLICAS * TASKS * PER_TASK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_on_a_redis_cluster_admit_exactly_the_limit() {
    let cluster = TestCluster::shared();
    assert_eq!(
        admitted_through_three_replicas(&cluster.url()).await,
        LIMIT,
        "{} attempts through {REPLICAS} replicas, limit {LIMIT}",
        REPLICAS * TASKS * PER_TASK
    );
}
