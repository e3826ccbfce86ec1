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
//!
//! Flow: the `bench` flags ([`BenchArgs`]) become a [`BenchConfig`] in [`run_cli`], which
//! runs [`run`] or [`check_limit`] and prints the report; `bench-baseline` is
//! [`serve_baseline`]. Both are async: the binary runs them on its one runtime.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, TryFromFloatSecsError};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf, ZipfError};
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

/// Load-test any Envoy RLS v3 server: closed-loop gRPC requests, or `--check-limit`.
#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// host:port of the RateLimitService.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub target: String,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Requests in flight (closed loop).
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Seconds to measure.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Seconds of warm-up before measuring.
    #[arg(long, default_value_t = 2.0)]
    pub warmup: f64,
    #[arg(long, default_value = "bench")]
    pub domain: String,
    /// Descriptor key; values are `k0`, `k1`, … from the key space.
    #[arg(long, default_value = "tenant")]
    pub key: String,
    /// Number of distinct values.
    #[arg(long, default_value_t = 1)]
    pub keys: u64,
    /// Zipf exponent for skewed keys (e.g. 1.1); uniform when absent.
    #[arg(long)]
    pub zipf: Option<f64>,
    /// Descriptors per request.
    #[arg(long, default_value_t = 1)]
    pub descriptors: usize,
    /// Name of the scenario in the output.
    #[arg(long, default_value = "bench")]
    pub label: String,
    /// Instead of a load run: fire --requests concurrent requests at one key and compare the
    /// number admitted with this limit (exit 1 if they differ).
    #[arg(long)]
    pub check_limit: Option<u64>,
    /// Requests for --check-limit (default 4 × the limit).
    #[arg(long)]
    pub requests: Option<u64>,
    /// No per-second progress lines.
    #[arg(long)]
    pub quiet: bool,
}

impl BenchArgs {
    /// The run these flags describe.
    pub fn config(&self) -> Result<BenchConfig, BenchError> {
        let secs = |s: f64, flag: &'static str| {
            Duration::try_from_secs_f64(s).map_err(|source| BenchError::Seconds { flag, source })
        };
        Ok(BenchConfig {
            target: self.target.clone(),
            connections: self.connections,
            concurrency: self.concurrency,
            duration: secs(self.duration, "duration")?,
            warmup: secs(self.warmup, "warmup")?,
            domain: self.domain.clone(),
            key: self.key.clone(),
            keys: self.keys,
            zipf: self.zipf,
            descriptors: self.descriptors,
            label: self.label.clone(),
            // Short runs (tests, `make bench` smoke runs) stay quiet without being told.
            progress: !self.quiet && self.duration > 5.0,
        })
    }
}

/// `tollgate bench`: runs what `args` ask for and prints the report, as text and as one JSON
/// line (the last line of stdout, for scripts). `Ok(false)`: `--check-limit` was not exact.
pub async fn run_cli(args: BenchArgs) -> Result<bool, BenchError> {
    let cfg = args.config()?;
    if let Some(limit) = args.check_limit {
        let requests = args.requests.unwrap_or(limit.saturating_mul(4).max(1));
        let r = check_limit(cfg, limit, requests).await?;
        println!(
            "admitted {} of {} requests (limit {}): {}",
            r.admitted,
            r.requests,
            r.limit,
            if r.exact() { "exact" } else { "NOT exact" }
        );
        println!("{}", serde_json::to_string(&r)?);
        return Ok(r.exact());
    }
    let r = run(cfg).await?;
    println!("{}", r.text());
    println!("{}", serde_json::to_string(&r)?);
    Ok(true)
}

/// `tollgate bench-baseline`: the no-op server on `addr` until `shutdown` resolves.
pub async fn serve_baseline(
    addr: SocketAddr,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), BenchError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| BenchError::Bind { addr, source })?;
    eprintln!("no-op RLS baseline on {addr}");
    serve_noop(listener, shutdown)
        .await
        .map_err(BenchError::Serve)
}

/// What to run; [`BenchArgs::config`] fills it from flags.
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

/// Why a bench run or the baseline server stopped. Each variant keeps its cause as
/// `source()` rather than as text, so the binary's `{:#}` prints the whole chain.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("cannot connect to {target}")]
    Connect {
        target: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("--{flag} must be a number of seconds")]
    Seconds {
        flag: &'static str,
        #[source]
        source: TryFromFloatSecsError,
    },
    #[error("bad setting: concurrency and descriptors must be at least 1")]
    NothingToSend,
    #[error("bad setting: --zipf")]
    Zipf(#[source] ZipfError),
    #[error("cannot write the JSON report")]
    Json(#[from] serde_json::Error),
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the baseline server failed")]
    Serve(#[source] tonic::transport::Error),
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

/// Picks key indexes in `0..n`: uniform, or Zipf-skewed (index 0 the hottest).
enum KeySpace {
    Uniform(u64),
    Zipf { n: u64, ranks: Zipf<f64> },
}

impl KeySpace {
    /// `keys` distinct keys (at least one); `zipf`: the exponent, `None` for uniform.
    fn new(keys: u64, zipf: Option<f64>) -> Result<KeySpace, BenchError> {
        let n = keys.max(1);
        Ok(match zipf {
            None => KeySpace::Uniform(n),
            Some(s) => KeySpace::Zipf {
                n,
                ranks: Zipf::new(n as f64, s).map_err(BenchError::Zipf)?,
            },
        })
    }

    fn pick(&self, rng: &mut SmallRng) -> u64 {
        match self {
            KeySpace::Uniform(n) => rng.random_range(0..*n),
            // A sample is a rank in 1..=n (a whole f64); rank 1 is key 0. The clamp only
            // guards the float-to-int conversion.
            KeySpace::Zipf { n, ranks } => {
                let rank = ranks.sample(rng) as u64;
                rank.saturating_sub(1).min(n - 1)
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
    let endpoint = Endpoint::from_shared(uri).map_err(|source| BenchError::Connect {
        target: target.to_string(),
        source,
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
            .map_err(|source| BenchError::Connect {
                target: target.to_string(),
                source,
            })?;
        out.push(RateLimitServiceClient::new(ch));
    }
    Ok(out)
}

fn build_request(cfg: &BenchConfig, keys: &KeySpace, rng: &mut SmallRng) -> RateLimitRequest {
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
        return Err(BenchError::NothingToSend);
    }
    let keys = Arc::new(KeySpace::new(cfg.keys, cfg.zipf)?);
    let clients = connect(&cfg.target, cfg.connections).await?;
    let cfg = Arc::new(cfg);
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
            // A fixed seed per task: runs are repeatable, tasks do not pick in lockstep.
            let mut rng = SmallRng::seed_from_u64(0x9E37_79B9_7F4A_7C15 ^ ((i as u64 + 1) << 17));
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
        let mut rng = SmallRng::seed_from_u64(7);
        let zipf = KeySpace::new(1000, Some(1.1)).unwrap();
        let hits = (0..10_000).filter(|_| zipf.pick(&mut rng) == 0).count();
        assert!(hits > 1000, "the hottest key gets a large share: {hits}");
        let uniform = KeySpace::new(1000, None).unwrap();
        let hits = (0..10_000).filter(|_| uniform.pick(&mut rng) == 0).count();
        assert!(hits < 50, "{hits}");
        // Every key can come up, and nothing outside the key space does.
        let picked: std::collections::HashSet<u64> =
            (0..100_000).map(|_| zipf.pick(&mut rng)).collect();
        assert!(picked.iter().all(|&k| k < 1000));
        assert!(picked.contains(&999) && picked.contains(&0));
        let uniform: std::collections::HashSet<u64> =
            (0..100_000).map(|_| uniform.pick(&mut rng)).collect();
        assert_eq!(uniform.len(), 1000);
    }

    #[test]
    fn one_key_and_a_bad_exponent() {
        let mut rng = SmallRng::seed_from_u64(1);
        for keys in [0, 1] {
            for space in [KeySpace::new(keys, None), KeySpace::new(keys, Some(1.1))] {
                let space = space.unwrap();
                assert!((0..100).all(|_| space.pick(&mut rng) == 0));
            }
        }
        assert!(matches!(
            KeySpace::new(10, Some(-1.0)),
            Err(BenchError::Zipf(_))
        ));
    }

    /// The `bench` flags, parsed as the binary parses them.
    fn args(flags: &[&str]) -> BenchArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let argv = std::iter::once("bench").chain(flags.iter().copied());
        <Cli as clap::Parser>::try_parse_from(argv).unwrap().bench
    }

    #[test]
    fn flags_become_the_config() {
        let cfg = args(&[]).config().unwrap();
        assert_eq!(
            (cfg.target.as_str(), cfg.connections, cfg.concurrency),
            ("127.0.0.1:8081", 4, 32)
        );
        assert_eq!(
            (cfg.duration, cfg.warmup, cfg.progress),
            (Duration::from_secs(10), Duration::from_secs(2), true)
        );
        let cfg = args(&["--duration", "1.5", "--zipf", "1.1", "--keys", "9"])
            .config()
            .unwrap();
        assert_eq!(
            (cfg.duration, cfg.zipf, cfg.keys, cfg.progress),
            (Duration::from_millis(1500), Some(1.1), 9, false)
        );
        assert!(!args(&["--quiet"]).config().unwrap().progress);
        for bad in ["-1", "NaN", "inf", "1e300"] {
            let e = args(&[&format!("--warmup={bad}")]).config().unwrap_err();
            assert_eq!(
                e.to_string(),
                "--warmup must be a number of seconds",
                "{bad}"
            );
        }
    }
}
