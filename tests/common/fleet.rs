//! Several tollgates serving one quota: wait until they know of each other, and send them
//! requests for one key, spread or all at once, counting what was admitted.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

use super::{InProcess, poll, readyz, request};

/// Waits (10 s at most) until every server counts `n` live replicas from the membership set.
pub fn wait_for_replicas(servers: &[&InProcess], n: u64) {
    for s in servers {
        let seen = poll(Duration::from_secs(10), || {
            let (_, body) = readyz(s.admin);
            (body["fallback"]["replicas"] == n
                && body["fallback"]["replicas_source"] == "membership")
                .then_some(())
        });
        assert!(
            seen.is_some(),
            "never saw {n} replicas: {}",
            readyz(s.admin).1
        );
    }
}

/// `per_server` requests for `tenant` in `domain` through each server, from 4 clients each
/// sending one at a time; how many were admitted.
pub async fn admitted(
    servers: &[InProcess],
    domain: &str,
    tenant: &str,
    per_server: usize,
) -> usize {
    admitted_split(servers, domain, tenant, &vec![per_server; servers.len()]).await
}

/// `total` requests for `tenant` in `domain` split *unevenly* over `servers`: each server but
/// the first sends `total / (4 × servers)`, the first sends the rest; how many were admitted.
///
/// An even split cannot tell the shared quota from the local fallback: with `total` ≥ 2 ×
/// the limit, each of N replicas admits its share (limit ÷ N) and the fleet admits exactly the
/// limit either way. Split like this, a fleet on the fallback admits (N + 1) ÷ 2N of the limit
/// (N ≥ 2), and through one server of a fleet of N, 1 ÷ N of it.
pub async fn admitted_unevenly(
    servers: &[InProcess],
    domain: &str,
    tenant: &str,
    total: usize,
) -> usize {
    let small = total / (4 * servers.len());
    let mut counts = vec![small; servers.len()];
    counts[0] = total - small * (servers.len() - 1);
    admitted_split(servers, domain, tenant, &counts).await
}

/// `counts[i]` requests for `tenant` in `domain` through `servers[i]`, from 4 clients per
/// server each sending one at a time; how many were admitted.
pub async fn admitted_split(
    servers: &[InProcess],
    domain: &str,
    tenant: &str,
    counts: &[usize],
) -> usize {
    let mut tasks = Vec::new();
    for (server, &count) in servers.iter().zip(counts) {
        for client_no in 0..4 {
            let mut client = server.client().await;
            let (domain, tenant) = (domain.to_string(), tenant.to_string());
            // The first `count % 4` clients send one more, so the server sends exactly `count`.
            let sends = count / 4 + usize::from(client_no < count % 4);
            tasks.push(tokio::spawn(async move {
                let mut ok = 0;
                for _ in 0..sends {
                    let r = client
                        .should_rate_limit(request(&domain, &[&[("tenant", &tenant)]]))
                        .await
                        .expect("answered");
                    ok += usize::from(r.get_ref().overall_code == Code::Ok as i32);
                }
                ok
            }));
        }
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total
}

/// `calls` requests for `tenant` in `domain` released at once (a barrier), spread round-robin
/// over `clients`; how many were admitted.
pub async fn burst(
    clients: &[RateLimitServiceClient<Channel>],
    domain: &str,
    tenant: &str,
    calls: usize,
) -> usize {
    let start = Arc::new(tokio::sync::Barrier::new(calls));
    let tasks: Vec<_> = (0..calls)
        .map(|i| {
            let mut client = clients[i % clients.len()].clone();
            let (start, domain, tenant) = (start.clone(), domain.to_string(), tenant.to_string());
            tokio::spawn(async move {
                start.wait().await;
                let r = client
                    .should_rate_limit(request(&domain, &[&[("tenant", &tenant)]]))
                    .await
                    .expect("answered");
                r.get_ref().overall_code == Code::Ok as i32
            })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        admitted += usize::from(t.await.unwrap());
    }
    admitted
}
