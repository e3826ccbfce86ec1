//! Test harness: tollgate in this process or as the real binary, and real Redis and Envoy
//! processes, on loopback ports, stopped on drop.
//!
//! - [`InProcess`] runs `tollgate::app::serve` on listeners it binds itself (`127.0.0.1:0`,
//!   so no port race), on a runtime of its own: the default for anything that does not need
//!   a separate process.
//! - [`TestServer`] runs the real `tollgate` binary, for what only a process shows: flags and
//!   environment, exit codes, signals, the OTLP exporter. It also binds port 0 and reads the
//!   ports it got from its "tollgate ready" log line.
//! - [`redis`] and [`envoy`] start external processes; they need a port up front, which is
//!   what [`free_port`] (the only one) is for.
//!
//! Everything waits by polling with a deadline, never with a fixed sleep; each test gets its own
//! ports, temp directory and store key prefix, so tests run in parallel.

#![allow(dead_code)]

pub mod envoy;
pub mod fleet;
pub mod ideal;
pub mod inproc;
pub mod load;
pub mod proxy;
pub mod redis;
pub mod sentinel;
pub mod store;
pub mod tls;
pub mod xds;

// Not every test binary starts one.
#[allow(unused_imports)]
pub use inproc::InProcess;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

/// How long a server may take to become ready.
pub const READY_DEADLINE: Duration = Duration::from_secs(20);

/// A small `edge` rule set: a per-tenant limit with a per-(tenant, /search) one below it, and
/// a shadow-mode downstream limit.
pub const EDGE_RULES: &str = r#"
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 3}
    descriptors:
      - key: endpoint
        value: /search
        rate_limit: {unit: minute, requests_per_unit: 1, name: search}
  - key: downstream
    value: payments
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
"#;

/// The tollgate binary the servers run: this build's, or `TOLLGATE_TEST_BINARY` (`make bench`
/// runs the attack tests on the release binary that way, to time what ships).
pub fn tollgate_binary() -> PathBuf {
    std::env::var_os("TOLLGATE_TEST_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tollgate")))
}

/// A loopback port that was free a moment ago (the OS picks it), for an external process
/// that must be told its port before it starts (redis-server, Envoy) or for an address
/// nobody listens on. tollgate itself never needs it: it binds port 0.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

/// The seed every property test of `make test` draws its cases from (src/testing.rs holds the
/// same seed and rule for the unit tests).
pub const PROPTEST_SEED: u64 = 0x7011_6a7e_2026_1207;

/// A property test's configuration: `cases` cases from [`PROPTEST_SEED`], after every failure
/// saved in `proptest-regressions/tests/<name>.txt` (replayed first); under
/// `TOLLGATE_EXPLORE=1` (`make explore`) ten times the cases from a random seed, and a failure
/// found is saved to that file, so that once committed it reaches `make test`.
pub fn proptest_config(cases: u32, name: &str) -> proptest::test_runner::Config {
    use proptest::test_runner::{Config, FileFailurePersistence, RngSeed};
    let explore = std::env::var_os("TOLLGATE_EXPLORE").is_some_and(|v| v == "1");
    let file = format!(
        "{}/proptest-regressions/tests/{name}.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    Config {
        cases: if explore { cases * 10 } else { cases },
        rng_seed: if explore {
            RngSeed::Random
        } else {
            RngSeed::Fixed(PROPTEST_SEED)
        },
        // A test config lives as long as the test binary: leaking the path is how proptest's
        // `&'static str` takes a path built at run time.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(file.leak()))),
        ..Config::default()
    }
}

/// The seed of the service's own random draws (replica ids, shard picks: src/random.rs) in
/// every server the harness starts: [`PROPTEST_SEED`], or `TOLLGATE_TEST_SEED` to try another.
pub fn test_seed() -> u64 {
    std::env::var("TOLLGATE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(PROPTEST_SEED)
}

/// A fresh temp directory, removed on drop.
pub fn temp_dir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("tollgate-test-{tag}-"))
        .tempdir()
        .expect("create temp dir")
}

/// How late this machine wakes a sleeping thread right now: the 99th percentile of how far a
/// 1 ms sleep overshoots, over 200 sleeps (about a quarter of a second). A test that holds the
/// product to a deadline states the lag it tolerates and prints this beside its result, so a
/// failure says whether the machine, not the product, was slower than that.
pub fn scheduling_lag() -> Duration {
    let mut over: Vec<Duration> = (0..200)
        .map(|_| {
            let start = Instant::now();
            std::thread::sleep(Duration::from_millis(1));
            start.elapsed().saturating_sub(Duration::from_millis(1))
        })
        .collect();
    over.sort_unstable();
    over[over.len() * 99 / 100]
}

/// Polls `f` until it returns `Some` or `timeout` passes.
pub fn poll<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// [`poll`] for async checks: awaits `f()` until it returns `Some` or `timeout` passes.
pub async fn poll_async<T, F, Fut>(timeout: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The sum of `/metrics` samples of the metric `name` whose line contains every one of `parts`
/// (label fragments such as `outcome="ok"`); 0 when there are none.
pub fn metric_sum(admin: SocketAddr, name: &str, parts: &[&str]) -> f64 {
    let (_, text) = get(admin, "/metrics");
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>()
        // An empty f64 sum is -0.0, which prints as "-0".
        + 0.0
}

/// Whether a connection to loopback `port` has bytes waiting that the process holding it has
/// not read (`/proc/net/tcp`: an established socket with that local port and a non-zero
/// receive queue): a stopped process's peer has connected and written to it.
pub fn unread_bytes_on(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table.lines().skip(1).any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let local_port = f.get(1).and_then(|a| a.rsplit(':').next());
        let rx_queue = f.get(4).and_then(|q| q.split(':').nth(1));
        local_port.and_then(|p| u16::from_str_radix(p, 16).ok()) == Some(port)
            && f.get(3) == Some(&"01")
            && rx_queue.and_then(|q| u64::from_str_radix(q, 16).ok()) > Some(0)
    })
}

/// A minimal HTTP/1.1 request (the admin port speaks plain HTTP/1.1). Returns (status, body).
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    // The form type is what `curl -d` sends: `/json` must accept it (README examples use curl).
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// A parsed HTTP/1.1 response; header names lowercased.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `method path` with extra request headers and a body; `None` when the connection fails.
pub fn request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Option<HttpResponse> {
    exchange(addr, method, path, headers, body, Duration::from_secs(5))
}

/// GET `path` with extra request headers; `None` when the connection fails.
pub fn get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Option<HttpResponse> {
    get_with_timeout(addr, path, headers, Duration::from_secs(5))
}

/// [`get_with`], waiting up to `read_timeout` for the answer (a backend that holds requests).
pub fn get_with_timeout(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    read_timeout: Duration,
) -> Option<HttpResponse> {
    exchange(addr, "GET", path, headers, "", read_timeout)
}

/// One HTTP/1.1 request and its whole answer, read until the server closes.
fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
    read_timeout: Duration,
) -> Option<HttpResponse> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(read_timeout)).ok()?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    if !body.is_empty() {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Some(HttpResponse {
        status,
        headers,
        body: body.to_string(),
    })
}

pub fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    http(addr, "GET", path, "").unwrap_or((0, String::new()))
}

/// `/readyz`: the status code and the body parsed as JSON; `(0, null)` when nothing answers.
/// Panics if an answer's body is not JSON.
pub fn readyz(admin: SocketAddr) -> (u16, serde_json::Value) {
    let (code, body) = get(admin, "/readyz");
    if code == 0 {
        return (0, serde_json::Value::Null);
    }
    let json = serde_json::from_str(&body).unwrap_or_else(|e| {
        panic!("/readyz answered {code} with a body that is not JSON ({e}): {body:?}")
    });
    (code, json)
}

/// A gRPC client of the RateLimitService at `addr`.
pub async fn client_of(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .expect("connect to tollgate gRPC")
}

/// The real tollgate binary, started with a rules dir and flags; killed on drop.
pub struct TestServer {
    child: Child,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    pub dir: tempfile::TempDir,
    log: PathBuf,
}

pub struct TestServerBuilder {
    rules: Vec<(String, String)>,
    args: Vec<(String, String)>,
    env: Vec<(String, String)>,
    /// The gRPC address to bind (a free port when `None`): a restarted server keeps its
    /// predecessor's, so the Envoy in front of it reconnects.
    grpc_addr: Option<SocketAddr>,
    /// The `/readyz` status `start` waits for (200 unless the test expects otherwise, e.g.
    /// 503 for a Redis that never answers).
    ready_status: u16,
}

impl TestServer {
    /// A server whose rules directory holds `rules` as `rules.yaml`.
    pub fn builder(rules: &str) -> TestServerBuilder {
        TestServerBuilder {
            rules: vec![("rules.yaml".into(), rules.into())],
            args: Vec::new(),
            env: Vec::new(),
            grpc_addr: None,
            ready_status: 200,
        }
    }

    pub fn rules_dir(&self) -> PathBuf {
        self.dir.path().join("rules")
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        client_of(self.grpc).await
    }

    /// What the server has logged so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, if the process has exited.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        poll(Duration::from_secs(10), || {
            self.child.try_wait().ok().flatten()
        })
        .expect("tollgate did not stop on SIGTERM")
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl TestServerBuilder {
    pub fn file(mut self, name: &str, text: &str) -> Self {
        self.rules.push((name.into(), text.into()));
        self
    }

    /// `--name value` on the command line.
    pub fn arg(mut self, name: &str, value: &str) -> Self {
        self.args.push((name.into(), value.into()));
        self
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Binds the gRPC listener on `addr` instead of a free port.
    pub fn grpc_addr(mut self, addr: SocketAddr) -> Self {
        self.grpc_addr = Some(addr);
        self
    }

    /// Waits at the start for `/readyz` to answer `status` instead of 200.
    pub fn ready_status(mut self, status: u16) -> Self {
        self.ready_status = status;
        self
    }

    /// Starts the binary on port 0, reads the addresses it bound from its "tollgate ready"
    /// log line and waits for `/readyz`; panics with its log if it never gets ready.
    pub fn start(self) -> TestServer {
        let dir = temp_dir("server");
        let rules = dir.path().join("rules");
        std::fs::create_dir_all(&rules).expect("rules dir");
        for (name, text) in &self.rules {
            std::fs::write(rules.join(name), text).expect("write rules");
        }
        let log = dir.path().join("tollgate.log");
        let mut cmd = Command::new(tollgate_binary());
        cmd.arg("serve")
            .arg("--rules")
            .arg(&rules)
            .arg("--grpc-addr")
            .arg(
                self.grpc_addr
                    .map_or_else(|| "127.0.0.1:0".to_string(), |a| a.to_string()),
            )
            .args(["--admin-addr", "127.0.0.1:0"])
            .env_remove("RUST_LOG")
            // Plain log lines: the addresses are read from the log.
            .env("NO_COLOR", "1")
            .env("TOLLGATE_SEED", test_seed().to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"));
        for (k, v) in &self.args {
            cmd.arg(format!("--{k}")).arg(v);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start tollgate");
        let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
        let bound = poll(READY_DEADLINE, || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("tollgate exited early ({status}):\n{}", read_log());
            }
            ready_addrs(&read_log())
        });
        let Some((grpc, admin)) = bound else {
            let _ = child.kill();
            panic!(
                "no \"tollgate ready\" log line within {READY_DEADLINE:?}:\n{}",
                read_log()
            );
        };
        let mut server = TestServer {
            child,
            grpc,
            admin,
            dir,
            log,
        };
        let ready = poll(READY_DEADLINE, || {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("tollgate exited early ({status}):\n{}", server.log());
            }
            (get(server.admin, "/readyz").0 == self.ready_status).then_some(())
        });
        if ready.is_none() {
            panic!(
                "tollgate not ready within {READY_DEADLINE:?}:\n{}",
                server.log()
            );
        }
        server
    }
}

/// The gRPC and admin addresses of the "tollgate ready" log line
/// (`… tollgate ready grpc_addr=127.0.0.1:p admin_addr=127.0.0.1:q …`), or of "tollgate
/// listening, not ready" (listening while `/readyz` says why not).
fn ready_addrs(log: &str) -> Option<(SocketAddr, SocketAddr)> {
    let line = strip_ansi(
        log.lines()
            .find(|l| l.contains("tollgate ready") || l.contains("tollgate listening"))?,
    );
    // `log_format: json`: the fields are an object.
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
        let field = |name: &str| v["fields"][name].as_str()?.parse().ok();
        return Some((field("grpc_addr")?, field("admin_addr")?));
    }
    let field = |name: &str| -> Option<SocketAddr> {
        let at = line.find(&format!("{name}="))? + name.len() + 1;
        line[at..].split_whitespace().next()?.parse().ok()
    };
    Some((field("grpc_addr")?, field("admin_addr")?))
}

/// `text` without ANSI colour sequences (`ESC [ … m`), should a log be coloured after all.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A link named `ratelimit` to this build's binary, in `dir`.
pub fn ratelimit_link(dir: &std::path::Path) -> std::path::PathBuf {
    let link = dir.join("ratelimit");
    std::os::unix::fs::symlink(tollgate_binary(), &link).expect("link ratelimit");
    link
}

/// Starts `bin` (no arguments) with only `vars` in its environment (nothing of this process's leaks in).
pub fn start_clean(bin: &std::path::Path, vars: &[(&str, String)], log: &std::path::Path) -> Child {
    start_clean_with(bin, &[], vars, log)
}

/// [`start_clean`] with arguments: `serve`, or one a gateway passes to `/bin/ratelimit`.
pub fn start_clean_with(
    bin: &std::path::Path,
    args: &[&str],
    vars: &[(&str, String)],
    log: &std::path::Path,
) -> Child {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env_clear()
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log file"));
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.spawn().expect("start ratelimit")
}

/// A statsd exporter mapping as Envoy Gateway's rate-limit Deployment mounts it (its
/// `statsd_conf.yaml`: the reference's default mapping, response times unscaled).
pub const ENVOY_GATEWAY_MAPPING: &str = r#"mappings:
  - match: "ratelimit.service.rate_limit.*.*.total_hits"
    name: "ratelimit_service_rate_limit_total_hits"
    timer_type: "histogram"
    labels: {domain: "$1", key1: "$2"}
  - match: "ratelimit.service.rate_limit.*.*.within_limit"
    name: "ratelimit_service_rate_limit_within_limit"
    labels: {domain: "$1", key1: "$2"}
  - match: "ratelimit.service.rate_limit.*.*.near_limit"
    name: "ratelimit_service_rate_limit_near_limit"
    labels: {domain: "$1", key1: "$2"}
  - match: "ratelimit.service.rate_limit.*.*.over_limit"
    name: "ratelimit_service_rate_limit_over_limit"
    labels: {domain: "$1", key1: "$2"}
  - match: "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.total_hits"
    match_type: regex
    name: "ratelimit_service_rate_limit_total_hits"
    labels: {domain: "$1", key1: "$2", key2: "$3"}
  - match: "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.within_limit"
    match_type: regex
    name: "ratelimit_service_rate_limit_within_limit"
    labels: {domain: "$1", key1: "$2", key2: "$3"}
  - match: "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.near_limit"
    match_type: regex
    name: "ratelimit_service_rate_limit_near_limit"
    labels: {domain: "$1", key1: "$2", key2: "$3"}
  - match: "ratelimit\\.service\\.rate_limit\\.([^\\.]*)\\.([^\\.]*)\\.([^\\.]*)(\\..*)?\\.over_limit"
    match_type: regex
    name: "ratelimit_service_rate_limit_over_limit"
    labels: {domain: "$1", key1: "$2", key2: "$3"}
  - match: "ratelimit.service.call.should_rate_limit.*"
    name: "ratelimit_service_should_rate_limit_error"
    match_metric_type: counter
    labels: {err_type: "$1"}
  - match: "ratelimit_server.*.total_requests"
    name: "ratelimit_service_total_requests"
    match_metric_type: counter
    labels: {grpc_method: "$1"}
  - match: "ratelimit_server.*.response_time"
    name: "ratelimit_service_response_time_seconds"
    timer_type: histogram
    labels: {grpc_method: "$1"}
  - match: "ratelimit.service.config_load_success"
    name: "ratelimit_service_config_load_success"
    match_metric_type: counter
"#;

/// What Envoy Gateway's rate-limit Deployment sets whatever the rules source (v1.8): Redis
/// over TCP at `redis_port`, the reference's runtime layout under `root`, and, in place of its
/// fixed ports, `grpc_port` and `http_port` on loopback.
pub fn envoy_gateway_env(
    redis_port: u16,
    root: &std::path::Path,
    grpc_port: u16,
    http_port: u16,
) -> Vec<(&'static str, String)> {
    vec![
        ("REDIS_SOCKET_TYPE", "tcp".to_string()),
        ("REDIS_URL", format!("127.0.0.1:{redis_port}")),
        ("RUNTIME_ROOT", root.display().to_string()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".to_string()),
        ("RUNTIME_IGNOREDOTFILES", "true".to_string()),
        ("RUNTIME_WATCH_ROOT", "false".to_string()),
        ("LOG_LEVEL", "info".to_string()),
        ("USE_STATSD", "false".to_string()),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".to_string()),
        ("GRPC_HOST", "127.0.0.1".to_string()),
        ("GRPC_PORT", grpc_port.to_string()),
        ("HOST", "127.0.0.1".to_string()),
        ("PORT", http_port.to_string()),
    ]
}

/// Runs `tollgate` with `args` to completion: (exit code, stdout, stderr).
pub fn run_tollgate(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
    cmd.args(args).stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run tollgate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A request with one descriptor per entry list.
pub fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Entry {
                        key: (*k).into(),
                        value: (*v).into(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// Resident memory of `pid` (kB), from /proc.
pub fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmRSS:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// CPU time (user + system) the process `pid` has used, from /proc.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) closed by ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 (1-based, counting pid and comm): 11 and 12 here.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}
