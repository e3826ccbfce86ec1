//! `--check-limit`: fire `requests` concurrent requests at one key and compare the number
//! admitted with the limit: the quick test of "one quota across every replica".

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use serde::Serialize;

use super::load::connect;
use super::{BenchConfig, BenchError};

/// The result of `--check-limit`.
#[derive(Debug, Serialize)]
pub struct CheckReport {
    pub target: String,
    pub limit: u64,
    pub requests: u64,
    pub admitted: u64,
    pub over_limit: u64,
    pub errors: u64,
}

impl CheckReport {
    pub fn exact(&self) -> bool {
        self.admitted == self.limit && self.errors == 0
    }
}

/// Fires `requests` requests at once (over the connections) at one key; counts admissions.
pub async fn check_limit(
    cfg: BenchConfig,
    limit: u64,
    requests: u64,
) -> Result<CheckReport, BenchError> {
    let clients = connect(&cfg.target, cfg.connections).await?;
    let req = RateLimitRequest {
        domain: cfg.domain.clone(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: cfg.key.clone(),
                value: "check".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let mut tasks = Vec::with_capacity(requests as usize);
    for i in 0..requests as usize {
        let mut client = clients[i % clients.len()].clone();
        let req = req.clone();
        tasks.push(tokio::spawn(
            async move { client.should_rate_limit(req).await },
        ));
    }
    let (mut admitted, mut over, mut errors) = (0, 0, 0);
    for t in tasks {
        match t.await {
            Ok(Ok(r)) if r.get_ref().overall_code == Code::Ok as i32 => admitted += 1,
            Ok(Ok(_)) => over += 1,
            _ => errors += 1,
        }
    }
    Ok(CheckReport {
        target: cfg.target,
        limit,
        requests,
        admitted,
        over_limit: over,
        errors,
    })
}
