//! The `tollgate` command: `serve` runs the service, `check` validates rules files.
//! Everything else lives in the library; this file only parses arguments and reports errors.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use tollgate::rules::{self, Algorithm, LoadOptions};
use tollgate::settings::{self, ServeArgs, Settings};

#[derive(Parser)]
#[command(
    name = "tollgate",
    version,
    about = "An Envoy-compatible global rate-limit service"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the rate-limit service (gRPC RateLimitService + admin HTTP port).
    Serve(ServeArgs),
    /// Load-test any Envoy RLS v3 server (tollgate or another), or check a limit's exactness.
    Bench(Box<BenchArgs>),
    /// The no-op RLS server `make bench` uses as its baseline (answers OK, decides nothing).
    #[command(hide = true)]
    BenchBaseline {
        #[arg(long, default_value = "127.0.0.1:8091")]
        grpc_addr: std::net::SocketAddr,
    },
    /// Validate a rules file or directory: print a summary, or every error with file:line.
    Check {
        /// A *.yaml/*.yml file or a directory of them.
        path: PathBuf,
        /// Algorithm for limits that name none.
        #[arg(long, value_parser = parse_algorithm, default_value = "token_bucket")]
        default_algorithm: Algorithm,
    },
}

/// Load-test any Envoy RLS v3 server: closed-loop gRPC requests, or `--check-limit`.
#[derive(Args)]
struct BenchArgs {
    /// host:port of the RateLimitService.
    #[arg(long, default_value = "127.0.0.1:8081")]
    target: String,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Requests in flight (closed loop).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds to measure.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of warm-up before measuring.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    #[arg(long, default_value = "bench")]
    domain: String,
    /// Descriptor key; values are `k0`, `k1`, … from the key space.
    #[arg(long, default_value = "tenant")]
    key: String,
    /// Number of distinct values.
    #[arg(long, default_value_t = 1)]
    keys: u64,
    /// Zipf exponent for skewed keys (e.g. 1.1); uniform when absent.
    #[arg(long)]
    zipf: Option<f64>,
    /// Descriptors per request.
    #[arg(long, default_value_t = 1)]
    descriptors: usize,
    /// Name of the scenario in the output.
    #[arg(long, default_value = "bench")]
    label: String,
    /// Instead of a load run: fire --requests concurrent requests at one key and compare the
    /// number admitted with this limit (exit 1 if they differ).
    #[arg(long)]
    check_limit: Option<u64>,
    /// Requests for --check-limit (default 4 × the limit).
    #[arg(long)]
    requests: Option<u64>,
    /// No per-second progress lines.
    #[arg(long)]
    quiet: bool,
}

/// `--default-algorithm` of `check`: one of [`Algorithm::NAMES`].
#[derive(Debug, thiserror::Error)]
#[error("unknown algorithm '{0}' ({names})", names = Algorithm::NAMES)]
struct UnknownAlgorithm(String);

fn parse_algorithm(s: &str) -> Result<Algorithm, UnknownAlgorithm> {
    Algorithm::parse(s).ok_or_else(|| UnknownAlgorithm(s.to_string()))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check {
            path,
            default_algorithm,
        } => check(&path, default_algorithm),
        Command::Serve(args) => report(serve(args).map(|()| true)),
        Command::Bench(args) => report(bench(*args)),
        Command::BenchBaseline { grpc_addr } => report(bench_baseline(grpc_addr)),
    }
}

fn report(result: anyhow::Result<bool>) -> ExitCode {
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            // Every error of the library says its cause in its own text: print it once, not the chain.
            eprintln!("tollgate: {e}");
            ExitCode::FAILURE
        }
    }
}

fn bench(args: BenchArgs) -> anyhow::Result<bool> {
    use tollgate::loadgen;
    let secs = |s: f64, name: &str| {
        anyhow::ensure!(
            s.is_finite() && s >= 0.0,
            "--{name} must be a number of seconds"
        );
        Ok(std::time::Duration::from_secs_f64(s))
    };
    let cfg = loadgen::BenchConfig {
        target: args.target,
        connections: args.connections,
        concurrency: args.concurrency,
        duration: secs(args.duration, "duration")?,
        warmup: secs(args.warmup, "warmup")?,
        domain: args.domain,
        key: args.key,
        keys: args.keys,
        zipf: args.zipf,
        descriptors: args.descriptors,
        label: args.label,
        progress: !args.quiet && args.duration > 5.0,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if let Some(limit) = args.check_limit {
        let requests = args.requests.unwrap_or(limit.saturating_mul(4).max(1));
        let r = runtime.block_on(loadgen::check_limit(cfg, limit, requests))?;
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
    let r = runtime.block_on(loadgen::run(cfg))?;
    println!("{}", r.text());
    println!("{}", serde_json::to_string(&r)?);
    Ok(true)
}

fn bench_baseline(addr: std::net::SocketAddr) -> anyhow::Result<bool> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        eprintln!("no-op RLS baseline on {addr}");
        tollgate::loadgen::serve_noop(listener, tollgate::app::shutdown_signal()).await?;
        Ok(true)
    })
}

fn check(path: &std::path::Path, default_algorithm: Algorithm) -> ExitCode {
    match rules::load_path(path, LoadOptions { default_algorithm }) {
        Ok(set) if set.files.is_empty() => {
            // A path one level too high loads nothing: every request would pass.
            eprintln!(
                "{}: no rules files (*.yaml, *.yml) here: nothing would be limited",
                path.display()
            );
            ExitCode::FAILURE
        }
        Ok(set) => {
            for w in &set.warnings {
                println!("warning: {w}");
            }
            println!("{}", set.summary());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let settings = Settings::load(&args.sources(|k| std::env::var(k).ok()))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let telemetry = tollgate::telemetry::init(&settings.log_level, &settings.otlp_endpoint)?;
        for warning in settings::unknown_env_warnings(
            std::env::vars_os().filter_map(|(name, _)| name.into_string().ok()),
        ) {
            tracing::warn!("{warning}");
        }
        let result = tollgate::app::run(settings, tollgate::app::shutdown_signal()).await;
        // Flush the spans still buffered, also after a failed start.
        telemetry.shutdown();
        Ok(result?)
    })
}
