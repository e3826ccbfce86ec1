//! Test harness: real processes on free loopback ports, killed on drop.
//!
//! [`TestServer`] runs the real `tollgate` binary with a rules directory of its own and waits
//! (polling `/readyz` with a deadline, never a fixed sleep) until it is ready. Each test gets
//! its own ports and temp directory, so tests run in parallel.

#![allow(dead_code)]

pub mod envoy;
pub mod redis;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

/// A loopback port that was free a moment ago (the OS picks it).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

/// A fresh directory under the system temp dir, removed by [`TempDir`]'s drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tollgate-test-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
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

/// GET `path` with extra request headers; `None` when the connection fails.
pub fn get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Option<HttpResponse> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
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

/// The real tollgate binary, started with a rules dir and flags; killed on drop.
pub struct TestServer {
    child: Child,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    pub dir: TempDir,
    log: PathBuf,
}

pub struct TestServerBuilder {
    rules: Vec<(String, String)>,
    args: Vec<(String, String)>,
    env: Vec<(String, String)>,
}

impl TestServer {
    /// A server whose rules directory holds `rules` as `rules.yaml`.
    pub fn builder(rules: &str) -> TestServerBuilder {
        TestServerBuilder {
            rules: vec![("rules.yaml".into(), rules.into())],
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    pub fn rules_dir(&self) -> PathBuf {
        self.dir.path().join("rules")
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("connect to tollgate gRPC")
    }

    /// What the server has logged so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
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

    /// Starts the binary and waits for `/readyz`; panics with its log if it never gets ready.
    pub fn start(self) -> TestServer {
        let dir = TempDir::new("server");
        let rules = dir.path().join("rules");
        std::fs::create_dir_all(&rules).expect("rules dir");
        for (name, text) in &self.rules {
            std::fs::write(rules.join(name), text).expect("write rules");
        }
        let (grpc, admin) = (free_port(), free_port());
        let log = dir.path().join("tollgate.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tollgate"));
        cmd.arg("serve")
            .arg("--rules")
            .arg(&rules)
            .arg("--grpc-addr")
            .arg(format!("127.0.0.1:{grpc}"))
            .arg("--admin-addr")
            .arg(format!("127.0.0.1:{admin}"))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"));
        for (k, v) in &self.args {
            cmd.arg(format!("--{k}")).arg(v);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start tollgate");
        let mut server = TestServer {
            child,
            grpc: SocketAddr::from(([127, 0, 0, 1], grpc)),
            admin: SocketAddr::from(([127, 0, 0, 1], admin)),
            dir,
            log,
        };
        let ready = poll(Duration::from_secs(20), || {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("tollgate exited early ({status}):\n{}", server.log());
            }
            (get(server.admin, "/readyz").0 == 200).then_some(())
        });
        if ready.is_none() {
            panic!("tollgate not ready within 20 s:\n{}", server.log());
        }
        server
    }
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
