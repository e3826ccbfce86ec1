//! The `tollgate` command: `serve` runs the service, `check` validates rules files, `bench`
//! load-tests an RLS server, `simulate` plans a fleet on a virtual clock. Everything else lives in the library; this file parses the
//! arguments, builds the one runtime and reports errors.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mimalloc::MiMalloc;
use tollgate::app;
use tollgate::loadgen::{self, BenchArgs};
use tollgate::rules::{self, Algorithm, LoadOptions};
use tollgate::settings::ServeArgs;
use tollgate::sim::SimulateArgs;

/// mimalloc rather than glibc's malloc: a request allocates and frees dozens of small buffers
/// across threads (HTTP/2 frames, protobuf, Redis commands), where glibc's arenas spent ~10 % of
/// the server's CPU (`perf`); see docs/performance.md for the measured change.
#[global_allocator]
static ALLOCATOR: MiMalloc = MiMalloc;

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
        grpc_addr: SocketAddr,
    },
    /// Plan a fleet: run the real limiter code for N replicas on a virtual clock against a
    /// simulated store, from a scenario file (see docs/simulate.md).
    Simulate(SimulateArgs),
    /// Ask a running tollgate why a request would be limited: its counter API's explain
    /// (`POST /counters/explain`): each bucket's rule, what is enforced, what would decide it
    /// now and why. Spends nothing.
    Explain {
        /// The domain, as Envoy sends it.
        domain: String,
        /// The descriptor's entries, `key=value` each, in order.
        #[arg(required = true)]
        entries: Vec<String>,
        /// The replica's admin address.
        #[arg(long, default_value = "127.0.0.1:8080")]
        admin: String,
        /// The file holding the counter API's token (the replica's `counter_api_token_file`).
        #[arg(long)]
        token_file: PathBuf,
    },
    /// Validate a rules file or directory: print a summary, or every error with file:line.
    Check {
        /// A *.yaml/*.yml file or a directory of them.
        path: PathBuf,
        /// Algorithm for limits that name none.
        #[arg(long, default_value = "token_bucket")]
        default_algorithm: Algorithm,
    },
}

fn main() -> ExitCode {
    let command = if started_as_reference() {
        // envoyproxy/ratelimit's image runs `/bin/ratelimit` with no arguments, configured by
        // its environment: serve as it would (settings/reference.rs).
        Command::Serve(ServeArgs {
            reference_env: true,
            ..ServeArgs::default()
        })
    } else {
        Cli::parse().command
    };
    let result = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(run(command)));
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            // The message and each cause it does not already say, once.
            eprintln!("tollgate: {}", tollgate::error_text::chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// Whether this binary was started under envoyproxy/ratelimit's name (`/bin/ratelimit`, a
/// link to tollgate, as in tollgate's image).
fn started_as_reference() -> bool {
    std::env::args_os()
        .next()
        .and_then(|argv0| {
            Path::new(&argv0)
                .file_name()
                .map(|name| name == "ratelimit")
        })
        .unwrap_or(false)
}

/// Runs one command; `Ok(false)` is a failure the command has already reported.
async fn run(command: Command) -> anyhow::Result<bool> {
    match command {
        Command::Serve(args) => {
            let sources = args.sources(|k| std::env::var(k).ok());
            // Reports its own fatal error, in the configured log format.
            Ok(app::run_with_env(&sources).await)
        }
        Command::Bench(args) => Ok(loadgen::run_cli(*args).await?),
        Command::BenchBaseline { grpc_addr } => {
            loadgen::serve_baseline(grpc_addr, app::shutdown_signal()).await?;
            Ok(true)
        }
        Command::Check {
            path,
            default_algorithm,
        } => Ok(check(&path, default_algorithm)),
        Command::Explain {
            domain,
            entries,
            admin,
            token_file,
        } => explain(&domain, &entries, &admin, &token_file),
        // Runs on its own single-threaded runtime and virtual clock (the same seed, the same
        // result), on a thread of its own.
        Command::Simulate(args) => {
            tollgate::sim::run_cli(&args)?;
            Ok(true)
        }
    }
}

/// `tollgate explain`: one `POST /counters/explain` over plain HTTP/1.1 (the admin port has
/// no TLS), its JSON answer printed; `Ok(false)` when the replica refused it (said why).
fn explain(
    domain: &str,
    entries: &[String],
    admin: &str,
    token_file: &Path,
) -> anyhow::Result<bool> {
    use std::io::{Read, Write};
    let entries = entries
        .iter()
        .map(|e| match e.split_once('=') {
            Some((k, v)) => Ok(serde_json::json!({ "key": k, "value": v })),
            None => Err(anyhow::anyhow!("`{e}`: an entry is key=value")),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let body = serde_json::json!({ "domain": domain, "descriptors": [{ "entries": entries }] })
        .to_string();
    let token = tollgate::counter_api::read_token(token_file)
        .map_err(|e| anyhow::anyhow!("{}: {e}", token_file.display()))?;
    let mut conn = std::net::TcpStream::connect(admin)
        .map_err(|e| anyhow::anyhow!("cannot reach the admin port at {admin}: {e}"))?;
    conn.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    write!(
        conn,
        "POST /counters/explain HTTP/1.1\r\nHost: {admin}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer)?;
    let (head, text) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let ok = head.starts_with("HTTP/1.1 200");
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(v) => println!("{}", serde_json::to_string_pretty(&v)?),
        Err(_) => println!("{text}"),
    }
    if !ok {
        eprintln!("{}", head.lines().next().unwrap_or(head));
    }
    Ok(ok)
}

fn check(path: &Path, default_algorithm: Algorithm) -> bool {
    let opts = LoadOptions {
        default_algorithm,
        ..LoadOptions::default()
    };
    match rules::load_path(path, opts) {
        Ok(set) if set.files.is_empty() => {
            // A path one level too high loads nothing: every request would pass.
            eprintln!(
                "{}: no rules files (*.yaml, *.yml) here: nothing would be limited",
                path.display()
            );
            false
        }
        Ok(set) => {
            for w in &set.warnings {
                println!("warning: {w}");
            }
            println!("{}", set.summary());
            true
        }
        Err(e) => {
            eprintln!("{}", tollgate::error_text::chain(&e));
            false
        }
    }
}
