//! `tollgate bench`: a gRPC load generator for any Envoy RLS v3 server, and the no-op server
//! used as the baseline (the gRPC ceiling of this machine: the same tonic stack, no decision).
//!
//! Closed loop (the default): `concurrency` tasks share `connections` HTTP/2 connections; each
//! task sends one `ShouldRateLimit`, waits for the answer, records its latency and sends the
//! next, until the duration ends: the peak rate. Open loop (`--rate R`): requests go out on a
//! fixed schedule of R per second whatever the server does, latency counted from the scheduled
//! time: the latency Envoy sees at a given load. The first `warmup` seconds are not recorded.
//! Keys come from a key space of `keys` distinct values, uniform or Zipf-skewed (`--zipf 1.1`:
//! a few hot tenants). `--target-pid` adds the server's CPU µs per request. The result is
//! printed as text and as one JSON line for scripts (`make bench`).
//!
//! `--check-limit L` instead fires `requests` concurrent requests at one key and reports how
//! many were admitted against L: the quick test of "one quota across every replica".
//!
//! Flow: the `bench` flags ([`BenchArgs`]) become a [`BenchConfig`] in [`run_cli`], which
//! runs [`run`] or [`check_limit`] and prints the report; `bench-baseline` is
//! [`serve_baseline`]. Both are async: the binary runs them on its one runtime.
//!
//! Files: [`load`] (the closed-loop run, key choice, the report), [`open`] (the open loop),
//! [`cpu`] (a process's CPU time), [`check`] (`--check-limit`), [`baseline`] (the no-op server).

mod baseline;
mod check;
mod cpu;
mod load;
mod open;

pub use baseline::{Noop, serve_baseline, serve_noop};
pub use check::{CheckReport, check_limit};
pub(crate) use load::histogram as latency_histogram;
pub use load::{BenchReport, run};
pub use open::{REQUEST_TIMEOUT, run_open};

use std::net::SocketAddr;
use std::time::{Duration, TryFromFloatSecsError};

use rand_distr::ZipfError;

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
    /// Open loop: send this many requests per second on a fixed schedule, whatever the server
    /// does; latency counts from each scheduled send. Closed loop when absent.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Open loop: at most this many requests waiting for answers; past it, requests are dropped
    /// and the run is marked invalid (never delayed: that would hide the server's queue). The
    /// default is a fifth of a second of backlog at 50,000 req/s: far past any useful latency,
    /// and before the generator's own queues grow into errors of their own.
    #[arg(long, default_value_t = 10_000)]
    pub max_in_flight: usize,
    /// The server's PID, when it runs on this machine: report its CPU µs per request.
    #[arg(long)]
    pub target_pid: Option<u32>,
    /// The store's PIDs, when it runs on this machine (a redis-server; repeat the flag for each
    /// node of a cluster): report their CPU µs per request too (closed loop).
    #[arg(long = "store-pid")]
    pub store_pid: Vec<u32>,
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
    /// Send each request with this `grpc-timeout`, as Envoy sends its `timeout` (20 ms by
    /// default): the server then decides within it (its `decision_margin_ms` kept back). The
    /// client does not give up itself at it (a late answer still counts, as an answer). At
    /// most 99,999,999 µs are sent (gRPC's eight digits).
    #[arg(long)]
    pub grpc_timeout_ms: Option<u64>,
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
            max_in_flight: self.max_in_flight,
            target_pid: self.target_pid,
            store_pids: self.store_pid.clone(),
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
            grpc_timeout: self.grpc_timeout_ms.map(Duration::from_millis),
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
    let r = match args.rate {
        Some(rate) => run_open(cfg, rate).await?,
        None => run(cfg).await?,
    };
    println!("{}", r.text());
    println!("{}", serde_json::to_string(&r)?);
    Ok(true)
}

/// What to run; [`BenchArgs::config`] fills it from flags.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub target: String,
    pub connections: usize,
    pub concurrency: usize,
    /// Open loop: the cap on requests waiting for answers.
    pub max_in_flight: usize,
    /// The server's PID, for its CPU time per request.
    pub target_pid: Option<u32>,
    /// The store's processes, for their CPU time per request (closed loop).
    pub store_pids: Vec<u32>,
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
    /// The `grpc-timeout` each request carries (`--grpc-timeout-ms`), if any.
    pub grpc_timeout: Option<Duration>,
}

impl BenchConfig {
    /// `req` as sent: with the run's `grpc-timeout` header, when it has one. Set as a header
    /// rather than with tonic's `set_timeout`, which would also make the client give up at it.
    pub fn request(
        &self,
        req: envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest,
    ) -> tonic::Request<envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest> {
        let mut req = tonic::Request::new(req);
        if let Some(t) = self.grpc_timeout
            && let Ok(v) = format!("{}u", t.as_micros().min(99_999_999)).parse()
        {
            req.metadata_mut().insert("grpc-timeout", v);
        }
        req
    }
}

/// Why a bench run or the baseline server stopped. Each variant keeps its cause as
/// `source()` rather than as text; the binary prints the whole chain (`error_text::chain`).
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
    #[error("bad setting: concurrency, max-in-flight and descriptors must be at least 1")]
    NothingToSend,
    #[error("--rate must be a positive number of requests per second, at most 10,000,000")]
    Rate,
    #[error("--warmup plus --duration is too long to schedule")]
    Window,
    #[error("cannot read the CPU time of --target-pid {pid}")]
    TargetPid {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse /proc/{pid}/stat (--target-pid {pid})")]
    TargetPidStat { pid: u32 },
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
    #[error("cannot start an open-loop sender thread")]
    SenderThread(#[source] std::io::Error),
    #[error("an open-loop sender thread stopped unexpectedly")]
    SenderGone,
}

#[cfg(test)]
mod tests {
    use super::*;

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
