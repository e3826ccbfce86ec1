//! The whole point: several tollgate replicas share one quota through Redis.
//!
//! Three tollgates (in-process servers, each with its own runtime, store and Redis connection
//! pool, so as separate as replicas in separate processes as far as Redis can tell) serve one
//! Redis or one 3-primary cluster. Concurrent clients hammer one key through all of them (an
//! hour-long unit, so refill cannot blur the count): exactly the limit is admitted, and the
//! store decided every call.
//!
//! The load is uneven on purpose (most of it through one replica, a little through the
//! others): split evenly, a fleet deciding wholly from the local fallback (limit ÷ replicas
//! each) would admit exactly the limit too, and the test could not tell.

mod common;

use common::InProcess;
use common::load::fallback_decisions;
use common::redis::{TestCluster, TestRedis, unique_prefix};
use common::request;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const LIMIT: usize = 300;
const RULES: &str = "domain: shared\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 300}\n";
const REPLICAS: usize = 3;
/// Clients per replica, each on a connection of its own, so the requests really race: 18, 4
/// and 2 of them, 600 attempts in all. On the fallback the fleet would admit 100 + 100 + 50.
const TASKS: [usize; REPLICAS] = [18, 4, 2];
const PER_TASK: usize = 25;
const ATTEMPTS: usize = (18 + 4 + 2) * PER_TASK;

/// Starts 3 tollgates on `store`, sends `PER_TASK` requests from `TASKS[i]` tasks through
/// replica i concurrently (600 for a limit of 300), and returns how many were admitted; the
/// fallback must have decided none of them.
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
    for (server, tasks_here) in servers.iter().zip(TASKS) {
        for _ in 0..tasks_here {
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
    let fallback: f64 = servers.iter().map(|s| fallback_decisions(s.admin)).sum();
    assert_eq!(fallback, 0.0, "the fallback decided on a healthy store");
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_on_one_redis_admit_exactly_the_limit() {
    let redis = TestRedis::start();
    assert_eq!(
        admitted_through_three_replicas(&redis.url()).await,
        LIMIT,
        "{ATTEMPTS} attempts through {REPLICAS} replicas, limit {LIMIT}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_on_a_redis_cluster_admit_exactly_the_limit() {
    let cluster = TestCluster::shared();
    assert_eq!(
        admitted_through_three_replicas(&cluster.url()).await,
        LIMIT,
        "{ATTEMPTS} attempts through {REPLICAS} replicas, limit {LIMIT}"
    );
}
