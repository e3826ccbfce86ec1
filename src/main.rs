//! The `tollgate` command: `serve` runs the service, `check` validates rules files.
//! Everything else lives in the library; this file only parses arguments and reports errors.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use tollgate::loadgen::{self, BenchArgs};
use tollgate::rules::{self, Algorithm, LoadOptions};
use tollgate::settings::{self, Settings, Sources};

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
    Serve(Box<ServeArgs>),
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

fn parse_algorithm(s: &str) -> Result<Algorithm, String> {
    Algorithm::parse(s).ok_or_else(|| format!("unknown algorithm '{s}' ({})", Algorithm::NAMES))
}

/// Flags for `serve`: each overrides the same key from TOLLGATE_* and the --config file.
#[derive(Args, Default)]
struct ServeArgs {
    /// YAML settings file with the same keys as these flags (env: TOLLGATE_CONFIG).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Rules file or directory [env: TOLLGATE_RULES] [default: /etc/tollgate/rules]
    #[arg(long)]
    rules: Option<String>,
    /// gRPC listen address [env: TOLLGATE_GRPC_ADDR] [default: 0.0.0.0:8081]
    #[arg(long)]
    grpc_addr: Option<String>,
    /// Admin HTTP listen address [env: TOLLGATE_ADMIN_ADDR] [default: 0.0.0.0:8080]
    #[arg(long)]
    admin_addr: Option<String>,
    /// `memory`, redis://…, rediss://…, redis+cluster://… [env: TOLLGATE_STORE]
    #[arg(long)]
    store: Option<String>,
    /// token_bucket, fixed_window or sliding_window [env: TOLLGATE_DEFAULT_ALGORITHM]
    #[arg(long)]
    default_algorithm: Option<String>,
    /// Global shadow mode: never answer OVER_LIMIT overall [env: TOLLGATE_SHADOW_MODE]
    #[arg(long)]
    shadow_mode: Option<String>,
    /// Add RateLimit-* / Retry-After headers [env: TOLLGATE_RESPONSE_HEADERS]
    #[arg(long)]
    response_headers: Option<String>,
    /// Prefix of every store key [env: TOLLGATE_KEY_PREFIX] [default: tollgate:]
    #[arg(long)]
    key_prefix: Option<String>,
    /// Store connections [env: TOLLGATE_STORE_POOL_SIZE]
    #[arg(long)]
    store_pool_size: Option<String>,
    /// Store connect timeout [env: TOLLGATE_STORE_CONNECT_TIMEOUT_MS]
    #[arg(long)]
    store_connect_timeout_ms: Option<String>,
    /// Timeout of one store call [env: TOLLGATE_STORE_TIMEOUT_MS]
    #[arg(long)]
    store_timeout_ms: Option<String>,
    /// Most descriptors per request [env: TOLLGATE_MAX_DESCRIPTORS]
    #[arg(long)]
    max_descriptors: Option<String>,
    /// Most entries per descriptor [env: TOLLGATE_MAX_ENTRIES]
    #[arg(long)]
    max_entries: Option<String>,
    /// Longest descriptor key in bytes [env: TOLLGATE_MAX_KEY_BYTES]
    #[arg(long)]
    max_key_bytes: Option<String>,
    /// Longest descriptor value in bytes [env: TOLLGATE_MAX_VALUE_BYTES]
    #[arg(long)]
    max_value_bytes: Option<String>,
    /// Largest gRPC request in bytes [env: TOLLGATE_MAX_MESSAGE_BYTES]
    #[arg(long)]
    max_message_bytes: Option<String>,
    /// Rules poll interval, 0 = off [env: TOLLGATE_RELOAD_INTERVAL_MS]
    #[arg(long)]
    reload_interval_ms: Option<String>,
    /// Log filter, e.g. info or tollgate=debug [env: TOLLGATE_LOG_LEVEL]
    #[arg(long)]
    log_level: Option<String>,
    /// After SIGTERM, stay up (unready) this long before closing the listeners [env: TOLLGATE_DRAIN_MS]
    #[arg(long)]
    drain_ms: Option<String>,
    /// OTLP/gRPC collector for request spans, e.g. http://collector:4317 [env: TOLLGATE_OTLP_ENDPOINT]
    #[arg(long)]
    otlp_endpoint: Option<String>,
}

impl ServeArgs {
    /// The flags that were given, as (settings key, value).
    fn overrides(&self) -> Vec<(&'static str, String)> {
        let all: [(&'static str, &Option<String>); 20] = [
            ("rules", &self.rules),
            ("grpc_addr", &self.grpc_addr),
            ("admin_addr", &self.admin_addr),
            ("store", &self.store),
            ("default_algorithm", &self.default_algorithm),
            ("shadow_mode", &self.shadow_mode),
            ("response_headers", &self.response_headers),
            ("key_prefix", &self.key_prefix),
            ("store_pool_size", &self.store_pool_size),
            ("store_connect_timeout_ms", &self.store_connect_timeout_ms),
            ("store_timeout_ms", &self.store_timeout_ms),
            ("max_descriptors", &self.max_descriptors),
            ("max_entries", &self.max_entries),
            ("max_key_bytes", &self.max_key_bytes),
            ("max_value_bytes", &self.max_value_bytes),
            ("max_message_bytes", &self.max_message_bytes),
            ("reload_interval_ms", &self.reload_interval_ms),
            ("log_level", &self.log_level),
            ("drain_ms", &self.drain_ms),
            ("otlp_endpoint", &self.otlp_endpoint),
        ];
        debug_assert_eq!(all.len(), settings::KEYS.len());
        all.into_iter()
            .filter_map(|(k, v)| v.clone().map(|v| (k, v)))
            .collect()
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check {
            path,
            default_algorithm,
        } => check(&path, default_algorithm),
        Command::Serve(args) => report(serve(&args).map(|()| true)),
        Command::Bench(args) => report(bench(*args)),
        Command::BenchBaseline { grpc_addr } => report(bench_baseline(grpc_addr)),
    }
}

fn report(result: anyhow::Result<bool>) -> ExitCode {
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("tollgate: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn bench(args: BenchArgs) -> anyhow::Result<bool> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    Ok(runtime.block_on(loadgen::run_cli(args))?)
}

fn bench_baseline(addr: std::net::SocketAddr) -> anyhow::Result<bool> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(loadgen::serve_baseline(addr, shutdown_signal()))?;
    Ok(true)
}

fn check(path: &std::path::Path, default_algorithm: Algorithm) -> ExitCode {
    match rules::load_path(path, LoadOptions { default_algorithm }) {
        Ok(set) => {
            for w in &set.warnings {
                println!("warning: {w}");
            }
            let (domains, nodes, limits) = set.counts();
            let mut names: Vec<&String> = set.domains.keys().collect();
            names.sort();
            println!(
                "ok: {} file(s), {domains} domain(s) [{}], {nodes} descriptor(s), {limits} limit(s)",
                set.files.len(),
                names
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let (env_file, env) = settings::from_env(|k| std::env::var(k).ok());
    let settings = Settings::load(&Sources {
        file: args.config.clone().or(env_file),
        env,
        flags: args.overrides(),
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let telemetry = tollgate::telemetry::init(&settings.log_level, &settings.otlp_endpoint)?;
        let result = tollgate::app::run(settings, shutdown_signal()).await;
        // Flush the spans still buffered, also after a failed start.
        telemetry.shutdown();
        Ok(result?)
    })
}

/// Ctrl-C or SIGTERM (what Kubernetes sends).
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
