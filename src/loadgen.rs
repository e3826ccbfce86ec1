//! `tollgate bench`: a closed-loop gRPC load generator for any Envoy RLS v3 server, and the
//! no-op server used as the baseline (the gRPC ceiling of this machine: the same tonic stack,
//! no decision).
//!
//! `concurrency` tasks share `connections` HTTP/2 connections; each task sends one
//! `ShouldRateLimit`, waits for the answer, records its latency and sends the next, until the
//! duration ends. The first `warmup` seconds are not recorded. Keys come from a key space of
//! `keys` distinct values, uniform or Zipf-skewed (`--zipf 1.1`: a few hot tenants). The
//! result is printed as text and as one JSON line for scripts (`make bench`).
//!
//! `--check-limit L` instead fires `requests` concurrent requests at one key and reports how
//! many were admitted against L: the quick test of "one quota across every replica".

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

/// What to run; `main.rs` fills it from flags.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub target: String,
    pub connections: usize,
    pub concurrency: usize,
    pub duration: Duration,
    pub warmup: Duration,
    pub domain: String,
    pub key: String,
    pub keys: u64,
    /// Zipf exponent; `None` = uniform.
    pub zipf: Option<f64>,
    pub descriptors: usize,
    /// A name for the JSON line (the scenario).
    pub label: String,
    /// Print a progress line every second.
    pub progress: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("cannot connect to {target}: {message}")]
    Connect { target: String, message: String },
    #[error("bad setting: {0}")]
    Config(String),
}

/// The result of a load run.
#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub label: String,
    pub target: String,
    pub seconds: f64,
    /// Requests answered in the measured window.
    pub requests: u64,
    /// Every request answered, warm-up included (to relate server-side counters to requests).
    pub total_requests: u64,
    pub rps: f64,
    pub ok: u64,
    pub over_limit: u64,
    pub errors: u64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub concurrency: usize,
    pub connections: usize,
    pub keys: u64,
    pub descriptors: usize,
}

impl BenchReport {
    pub fn text(&self) -> String {
        format!(
            "{label}: {rps:.0} req/s over {secs:.1} s ({n} requests; ok {ok}, over_limit {over}, errors {err})\n  latency p50 {p50} µs, p90 {p90} µs, p99 {p99} µs, p99.9 {p999} µs\n  {c} in flight over {conn} connection(s), {keys} key(s), {d} descriptor(s)/request",
            label = self.label,
            rps = self.rps,
            secs = self.seconds,
            n = self.requests,
            ok = self.ok,
            over = self.over_limit,
            err = self.errors,
            p50 = self.p50_us,
            p90 = self.p90_us,
            p99 = self.p99_us,
            p999 = self.p999_us,
            c = self.concurrency,
            conn = self.connections,
            keys = self.keys,
            d = self.descriptors,
        )
    }
}

/// A small, fast generator (xorshift64*): load generation needs speed, not cryptography.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Picks key indexes: uniform, or Zipf by inverse CDF over a precomputed table.
enum KeySpace {
    Uniform(u64),
    Zipf(Vec<f64>),
}

impl KeySpace {
    fn new(keys: u64, zipf: Option<f64>) -> KeySpace {
        match zipf {
            None => KeySpace::Uniform(keys.max(1)),
            Some(s) => {
                let mut cdf = Vec::with_capacity(keys as usize);
                let mut sum = 0.0;
                for i in 0..keys.max(1) {
                    sum += 1.0 / ((i + 1) as f64).powf(s);
                    cdf.push(sum);
                }
                for c in &mut cdf {
                    *c /= sum;
                }
                KeySpace::Zipf(cdf)
            }
        }
    }

    fn pick(&self, rng: &mut Rng) -> u64 {
        match self {
            KeySpace::Uniform(n) => rng.next() % n,
            KeySpace::Zipf(cdf) => {
                let u = rng.unit();
                cdf.partition_point(|&c| c < u).min(cdf.len() - 1) as u64
            }
        }
    }
}

async fn connect(
    target: &str,
    n: usize,
) -> Result<Vec<RateLimitServiceClient<Channel>>, BenchError> {
    let uri = if target.contains("://") {
        target.to_string()
    } else {
        format!("http://{target}")
    };
    let endpoint = Endpoint::from_shared(uri).map_err(|e| BenchError::Connect {
        target: target.to_string(),
        message: e.to_string(),
    })?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        // Each `connect` is its own HTTP/2 connection.
        let ch = endpoint
            .clone()
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| BenchError::Connect {
                target: target.to_string(),
                message: e.to_string(),
            })?;
        out.push(RateLimitServiceClient::new(ch));
    }
    Ok(out)
}

fn build_request(cfg: &BenchConfig, keys: &KeySpace, rng: &mut Rng) -> RateLimitRequest {
    RateLimitRequest {
        domain: cfg.domain.clone(),
        descriptors: (0..cfg.descriptors)
            .map(|_| RateLimitDescriptor {
                entries: vec![Entry {
                    key: cfg.key.clone(),
                    value: format!("k{}", keys.pick(rng)),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    over: AtomicU64,
    errors: AtomicU64,
    sent: AtomicU64,
    total: AtomicU64,
}

/// Runs the closed-loop load and returns the report.
pub async fn run(cfg: BenchConfig) -> Result<BenchReport, BenchError> {
    if cfg.concurrency == 0 || cfg.descriptors == 0 {
        return Err(BenchError::Config(
            "concurrency and descriptors must be at least 1".into(),
        ));
    }
    let clients = connect(&cfg.target, cfg.connections).await?;
    let cfg = Arc::new(cfg);
    let keys = Arc::new(KeySpace::new(cfg.keys, cfg.zipf));
    let counts = Arc::new(Counts::default());
    let recording = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::with_capacity(cfg.concurrency);
    for i in 0..cfg.concurrency {
        let mut client = clients[i % clients.len()].clone();
        let (cfg, keys, counts, recording, stop) = (
            cfg.clone(),
            keys.clone(),
            counts.clone(),
            recording.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((i as u64 + 1) << 17));
            let mut latencies: Vec<u32> = Vec::with_capacity(1 << 14);
            while !stop.load(Ordering::Relaxed) {
                let req = build_request(&cfg, &keys, &mut rng);
                let started = Instant::now();
                let result = client.should_rate_limit(req).await;
                let took = started.elapsed();
                counts.total.fetch_add(1, Ordering::Relaxed);
                if !recording.load(Ordering::Relaxed) {
                    continue;
                }
                latencies.push(took.as_micros().min(u128::from(u32::MAX)) as u32);
                counts.sent.fetch_add(1, Ordering::Relaxed);
                match result {
                    Ok(r) if r.get_ref().overall_code == Code::OverLimit as i32 => &counts.over,
                    Ok(_) => &counts.ok,
                    Err(_) => &counts.errors,
                }
                .fetch_add(1, Ordering::Relaxed);
            }
            latencies
        }));
    }
    tokio::time::sleep(cfg.warmup).await;
    recording.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let mut last = 0;
    while started.elapsed() < cfg.duration {
        let left = cfg.duration.saturating_sub(started.elapsed());
        tokio::time::sleep(left.min(Duration::from_secs(1))).await;
        if cfg.progress {
            let sent = counts.sent.load(Ordering::Relaxed);
            eprintln!(
                "  {:>5.1} s  {:>8} req/s",
                started.elapsed().as_secs_f64(),
                sent - last
            );
            last = sent;
        }
    }
    recording.store(false, Ordering::SeqCst);
    let seconds = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::SeqCst);
    let mut all: Vec<u32> = Vec::new();
    for t in tasks {
        if let Ok(mut l) = t.await {
            all.append(&mut l);
        }
    }
    all.sort_unstable();
    let pct = |p: f64| -> u64 {
        if all.is_empty() {
            return 0;
        }
        let i = ((all.len() as f64 * p).ceil() as usize).clamp(1, all.len()) - 1;
        u64::from(all[i])
    };
    let requests = all.len() as u64;
    Ok(BenchReport {
        label: cfg.label.clone(),
        target: cfg.target.clone(),
        seconds,
        requests,
        total_requests: counts.total.load(Ordering::Relaxed),
        rps: requests as f64 / seconds.max(1e-9),
        ok: counts.ok.load(Ordering::Relaxed),
        over_limit: counts.over.load(Ordering::Relaxed),
        errors: counts.errors.load(Ordering::Relaxed),
        p50_us: pct(0.50),
        p90_us: pct(0.90),
        p99_us: pct(0.99),
        p999_us: pct(0.999),
        concurrency: cfg.concurrency,
        connections: clients.len(),
        keys: cfg.keys,
        descriptors: cfg.descriptors,
    })
}

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

/// The baseline server: answers every request OK, one status per descriptor, no decision.
#[derive(Clone, Copy, Debug, Default)]
pub struct Noop;

#[tonic::async_trait]
impl RateLimitService for Noop {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let n = request.get_ref().descriptors.len();
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: vec![
                DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                };
                n
            ],
            ..Default::default()
        }))
    }
}

/// Serves [`Noop`] on `addr` until `shutdown` resolves, with the server settings `app.rs` uses.
pub async fn serve_noop(
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(Noop))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_is_skewed_and_uniform_is_not() {
        let mut rng = Rng(7);
        let zipf = KeySpace::new(1000, Some(1.1));
        let hits = (0..10_000).filter(|_| zipf.pick(&mut rng) == 0).count();
        assert!(hits > 1000, "the hottest key gets a large share: {hits}");
        let uniform = KeySpace::new(1000, None);
        let hits = (0..10_000).filter(|_| uniform.pick(&mut rng) == 0).count();
        assert!(hits < 50, "{hits}");
        assert!((0..1000).all(|_| zipf.pick(&mut rng) < 1000));
    }
}
