//! Test harness for Redis: [`TestRedis`] (one `redis-server`) and [`TestCluster`] (three
//! primaries formed with `redis-cli --cluster create`, with a replica each for
//! [`TestCluster::start_replicated`]), each on free loopback ports with a temp
//! directory of its own, polled (with a deadline, never a fixed sleep) until they answer, and
//! killed on drop. `redis-server` and `redis-cli` must be on the PATH (`make test` brings them);
//! when they are missing the tests fail with a message saying so, they do not skip.
//!
//! The harness talks to the servers through the `redis` crate's blocking client, so it needs
//! no runtime and works from any test.

#![allow(dead_code)]

use super::{free_port, poll, temp_dir};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// How long a server may take to answer PING, and a cluster to reach `cluster_state:ok`.
const START_DEADLINE: Duration = Duration::from_secs(20);
/// The cluster bus listens on port + 10000, so a cluster node's port must leave room for it.
const MAX_CLUSTER_PORT: u16 = 55_535;

/// A key prefix no other test (or test process) uses, for tests sharing a server.
pub fn unique_prefix(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "t{}-{}-{tag}:",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// One blocking connection, with timeouts so a dead server fails the test instead of hanging it.
pub fn connect(port: u16) -> ::redis::RedisResult<::redis::Connection> {
    let client = ::redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    conn.set_write_timeout(Some(Duration::from_secs(10)))?;
    Ok(conn)
}

/// Runs one command on the server at `port` and returns its reply.
pub fn command<T: ::redis::FromRedisValue>(port: u16, args: &[&str]) -> ::redis::RedisResult<T> {
    let mut conn = connect(port)?;
    let (name, rest) = args.split_first().expect("a command");
    ::redis::cmd(name).arg(rest).query(&mut conn)
}

/// A token bucket's stored state, `(tokens, ts_ms)`, in either format `token_bucket.lua`
/// reads: the packed string (three little-endian doubles, or two) or 0.1.0's hash (`t`, `ts`). `None`
/// when the key is missing (a full bucket) or is something else.
#[allow(dead_code)]
pub fn token_state(port: u16, key: &str) -> Option<(f64, u64)> {
    let kind: String = command(port, &["TYPE", key]).ok()?;
    match kind.as_str() {
        "string" => {
            let bytes: Vec<u8> = command(port, &["GET", key]).ok()?;
            unpack_token_state(&bytes)
        }
        "hash" => {
            let fields: Vec<Option<String>> = command(port, &["HMGET", key, "t", "ts"]).ok()?;
            Some((
                fields[0].as_deref()?.parse().ok()?,
                fields[1].as_deref()?.parse().ok()?,
            ))
        }
        _ => None,
    }
}

/// The packed state's first two numbers as `(tokens, ts_ms)`: a token bucket's
/// (`struct.pack('<ddd', tokens, ts, capacity)`, or the previous release's two) or a fixed
/// window's (`start, count`).
#[allow(dead_code)]
pub fn unpack_token_state(bytes: &[u8]) -> Option<(f64, u64)> {
    let (tokens, rest) = bytes.split_first_chunk::<8>()?;
    let (ts, _) = rest.split_first_chunk::<8>()?;
    Some((f64::from_le_bytes(*tokens), f64::from_le_bytes(*ts) as u64))
}

/// One `redis-server` process.
pub struct TestRedis {
    port: u16,
    dir: PathBuf,
    /// Extra arguments (cluster mode, TLS) kept for [`TestRedis::restart`].
    extra: Vec<String>,
    /// The TLS port of a server from [`TestRedis::start_tls`].
    tls_port: Option<u16>,
    child: Option<Child>,
    /// The server binary: `redis-server`, or `valkey-server` ([`TestRedis::start_valkey`]).
    server: &'static str,
    /// The temp directory `dir` is, when this value owns it (a cluster owns its nodes'
    /// directories itself); removed on drop, after the server is killed.
    _owned: Option<tempfile::TempDir>,
}

impl TestRedis {
    /// Starts a standalone server on a free port.
    pub fn start() -> TestRedis {
        let mut last = String::new();
        for _ in 0..5 {
            match TestRedis::try_start(free_port(), Owned(temp_dir("redis")), Vec::new()) {
                Ok(r) => return r,
                // Another process took the port between our check and redis-server's bind.
                Err(e) => last = e,
            }
        }
        panic!("redis-server did not start: {last}");
    }

    /// Starts a standalone server that also listens with TLS (certificates from `certs`) on
    /// [`TestRedis::tls_url`]; with `mutual`, a TLS client must show a certificate signed by
    /// the test CA. The plain port stays open for the test's own inspection.
    pub fn start_tls(certs: &super::tls::TestCerts, mutual: bool) -> TestRedis {
        TestRedis::start_tls_with(certs, mutual, &[])
    }

    /// [`TestRedis::start_tls`] with extra `redis-server` arguments (e.g. `--replicaof` with
    /// `--tls-replication yes`: the server certificate is also a client certificate).
    pub fn start_tls_with(certs: &super::tls::TestCerts, mutual: bool, more: &[&str]) -> TestRedis {
        let mut last = String::new();
        for _ in 0..5 {
            let tls_port = free_port();
            let mut extra = vec![
                "--tls-port".to_string(),
                tls_port.to_string(),
                "--tls-cert-file".to_string(),
                certs.file("server.crt"),
                "--tls-key-file".to_string(),
                certs.file("server.key"),
                "--tls-ca-cert-file".to_string(),
                certs.file("ca.crt"),
                "--tls-auth-clients".to_string(),
                if mutual { "yes" } else { "no" }.to_string(),
            ];
            extra.extend(more.iter().map(|s| s.to_string()));
            match TestRedis::try_start(free_port(), Owned(temp_dir("redis-tls")), extra) {
                Ok(mut r) => {
                    r.tls_port = Some(tls_port);
                    return r;
                }
                Err(e) => last = e,
            }
        }
        panic!("redis-server with TLS did not start: {last}");
    }

    /// The TLS port of a server from [`TestRedis::start_tls`].
    pub fn tls_port(&self) -> u16 {
        self.tls_port.expect("started with start_tls")
    }

    /// `rediss://127.0.0.1:<tls port>` of a server from [`TestRedis::start_tls`].
    pub fn tls_url(&self) -> String {
        let port = self.tls_port.expect("started with start_tls");
        format!("rediss://127.0.0.1:{port}")
    }

    /// Starts a standalone server with extra `redis-server` arguments (e.g. a
    /// `--maxmemory-policy`).
    pub fn start_with(extra: &[&str]) -> TestRedis {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let mut last = String::new();
        for _ in 0..5 {
            match TestRedis::try_start(free_port(), Owned(temp_dir("redis")), extra.clone()) {
                Ok(r) => return r,
                Err(e) => last = e,
            }
        }
        panic!("redis-server did not start: {last}");
    }

    /// Starts a standalone server that also listens on a unix socket in its own directory
    /// ([`TestRedis::unix_url`]); the TCP port stays open for the test's own inspection.
    pub fn start_unix() -> TestRedis {
        let mut last = String::new();
        for _ in 0..5 {
            let dir = temp_dir("redis-unix");
            let socket = dir.path().join("redis.sock");
            let extra = vec![
                "--unixsocket".to_string(),
                socket.display().to_string(),
                "--unixsocketperm".to_string(),
                "700".to_string(),
            ];
            match TestRedis::try_start(free_port(), Owned(dir), extra) {
                Ok(r) => return r,
                Err(e) => last = e,
            }
        }
        panic!("redis-server on a unix socket did not start: {last}");
    }

    /// `redis+unix://<dir>/redis.sock` of a server from [`TestRedis::start_unix`].
    pub fn unix_url(&self) -> String {
        assert!(
            self.extra.iter().any(|a| a == "--unixsocket"),
            "started with start_unix"
        );
        format!("redis+unix://{}", self.dir.join("redis.sock").display())
    }

    /// Starts a standalone Valkey server (Redis's fork) on a free port: the same protocol and
    /// scripting, another implementation.
    pub fn start_valkey() -> TestRedis {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let dir = temp_dir("valkey");
            let (path, owned) = (dir.path().to_path_buf(), Some(dir));
            let mut r = TestRedis {
                port,
                dir: path,
                extra: Vec::new(),
                tls_port: None,
                child: None,
                server: "valkey-server",
                _owned: owned,
            };
            match r.spawn() {
                Ok(()) => return r,
                Err(e) => last = e,
            }
        }
        panic!("valkey-server did not start: {last}");
    }

    /// Starts a standalone server on `port` (which must be free).
    pub fn start_on(port: u16) -> TestRedis {
        TestRedis::try_start(port, Owned(temp_dir("redis")), Vec::new())
            .unwrap_or_else(|e| panic!("redis-server did not start on {port}: {e}"))
    }

    fn try_start(port: u16, dir: Dir, extra: Vec<String>) -> Result<TestRedis, String> {
        let (dir, owned) = match dir {
            Owned(t) => (t.path().to_path_buf(), Some(t)),
            Borrowed(p) => (p, None),
        };
        let mut r = TestRedis {
            port,
            dir,
            extra,
            tls_port: None,
            child: None,
            server: "redis-server",
            _owned: owned,
        };
        r.spawn()?;
        Ok(r)
    }

    fn spawn(&mut self) -> Result<(), String> {
        let log = self.dir.join(format!("redis-{}.log", self.port));
        // The priority a dedicated Redis host gives Redis: here the server shares two cores
        // with the test binaries, tollgate replicas and load generators of a parallel suite, and
        // at their priority a burst can leave it unscheduled past the product's default
        // `store_timeout_ms` (10 ms), which on a real deployment only a failing Redis does.
        // Without the privilege to raise it (not root), `nice` runs it at the usual priority.
        let child = Command::new("nice")
            .args(["-n", "-5", self.server])
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run nice ({e})"));
        self.child = Some(child);
        let port = self.port;
        let ready = poll(START_DEADLINE, || {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                if status.code() == Some(127) {
                    panic!(
                        "cannot run {}: the Redis tests need redis-server, redis-cli and valkey-server on the PATH \
                         (`make test` installs them: scripts/deps.sh)",
                        self.server
                    );
                }
                return Some(Err(format!("exited with {status}")));
            }
            // The server answering must be the one just started: with test binaries running
            // side by side, another process may have taken the port between `free_port` and
            // this bind (this server then exits), and its server would answer instead.
            let info = command::<String>(port, &["INFO", "server"]).ok()?;
            let pid = info
                .lines()
                .find_map(|l| l.strip_prefix("process_id:"))
                .and_then(|p| p.trim().parse::<u32>().ok());
            let ours = self.child.as_ref().map(Child::id);
            Some(if pid == ours {
                Ok(())
            } else {
                Err(format!(
                    "port {port} answers for another server (pid {pid:?})"
                ))
            })
        });
        match ready {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => {
                // Killed (and reaped) in case it still runs: a server whose port another
                // process answers on may not have exited yet.
                self.kill();
                Err(format!("{e}; log: {}", tail(&log)))
            }
            None => {
                self.kill();
                Err(format!(
                    "no PONG within {START_DEADLINE:?}; log: {}",
                    tail(&log)
                ))
            }
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A blocking connection for the test to inspect or disturb the server.
    pub fn conn(&self) -> ::redis::Connection {
        connect(self.port).expect("connect to test redis")
    }

    /// Runs one command and returns its reply.
    pub fn cmd<T: ::redis::FromRedisValue>(&self, args: &[&str]) -> T {
        command(self.port, args).unwrap_or_else(|e| panic!("{args:?} on :{}: {e}", self.port))
    }

    /// A token bucket's stored state on this server ([`token_state`]).
    #[allow(dead_code)]
    pub fn token_state(&self, key: &str) -> Option<(f64, u64)> {
        token_state(self.port, key)
    }

    /// The server's process id (while it runs).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILLs the server (no shutdown, no save) and waits for it to go.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port (empty: nothing is persisted).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn()
            .unwrap_or_else(|e| panic!("redis-server did not restart on {}: {e}", self.port));
    }
}

/// Where a server keeps its files: a temp directory of its own, or one inside its cluster's.
enum Dir {
    Owned(tempfile::TempDir),
    Borrowed(PathBuf),
}
use Dir::{Borrowed, Owned};

impl Drop for TestRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

/// A Redis Cluster of three primaries (and a replica of each, when replicated), all slots
/// assigned.
pub struct TestCluster {
    nodes: Vec<TestRedis>,
    /// The nodes' directories; removed on drop, after the nodes are killed.
    dir: tempfile::TempDir,
}

impl TestCluster {
    /// Starts three cluster-mode servers and joins them into one cluster.
    pub fn start() -> TestCluster {
        TestCluster::start_nodes(0, 5000)
    }

    /// Starts 3 primaries + 3 replicas (one each), for failover tests: a node is considered
    /// failed after 1 s (`cluster-node-timeout`), so a killed primary's replica takes over
    /// within a few seconds. Returns once every replica has synced with its primary.
    pub fn start_replicated() -> TestCluster {
        TestCluster::start_nodes(1, 1000)
    }

    fn start_nodes(replicas: usize, node_timeout_ms: u32) -> TestCluster {
        let mut last = String::new();
        for _ in 0..5 {
            match TestCluster::try_start(replicas, node_timeout_ms) {
                Ok(c) => return c,
                Err(e) => last = e,
            }
        }
        panic!("redis cluster did not start: {last}");
    }

    /// One cluster shared by the tests of this process that are running at the same time; it
    /// stops when the last of them drops its handle (so nothing outlives the test run). Tests
    /// sharing it must use their own key prefixes ([`unique_prefix`]) and must not disturb it.
    pub fn shared() -> Arc<TestCluster> {
        static SHARED: Mutex<Weak<TestCluster>> = Mutex::new(Weak::new());
        let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = shared.upgrade() {
            return c;
        }
        let c = Arc::new(TestCluster::start());
        *shared = Arc::downgrade(&c);
        c
    }

    fn try_start(replicas: usize, node_timeout_ms: u32) -> Result<TestCluster, String> {
        // Built first so that an early return drops (kills and removes) what was started.
        let mut cluster = TestCluster {
            nodes: Vec::new(),
            dir: temp_dir("cluster"),
        };
        let ports = cluster_ports(3 * (1 + replicas));
        for &port in &ports {
            let node_dir = cluster.dir.path().join(port.to_string());
            std::fs::create_dir_all(&node_dir).map_err(|e| e.to_string())?;
            let extra = vec![
                "--cluster-enabled".to_string(),
                "yes".to_string(),
                "--cluster-config-file".to_string(),
                node_dir.join("nodes.conf").display().to_string(),
                "--cluster-node-timeout".to_string(),
                node_timeout_ms.to_string(),
                // Keep serving the other nodes' slots while one node is gone (what the README
                // recommends, and what per-node fallback needs).
                "--cluster-require-full-coverage".to_string(),
                "no".to_string(),
            ];
            cluster
                .nodes
                .push(TestRedis::try_start(port, Borrowed(node_dir), extra)?);
        }
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run redis-cli ({e}): the cluster tests need redis-cli on the PATH")
            });
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        // Every node must see the whole cluster before a client may trust any node's slot map,
        // and every replica must have synced, so a failover has a replica to promote.
        let known = format!("cluster_known_nodes:{}", ports.len());
        let formed = poll(START_DEADLINE, || {
            ports
                .iter()
                .all(|&p| {
                    let info = command::<String>(p, &["CLUSTER", "INFO"]).unwrap_or_default();
                    let repl = command::<String>(p, &["INFO", "replication"]).unwrap_or_default();
                    info.contains("cluster_state:ok")
                        && info.contains("cluster_slots_ok:16384")
                        && info.contains(&known)
                        && (repl.contains("role:master") || repl.contains("master_link_status:up"))
                })
                .then_some(())
        });
        formed.ok_or_else(|| {
            format!("cluster_state never became ok on every node within {START_DEADLINE:?}")
        })?;
        Ok(cluster)
    }

    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3`.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    pub fn nodes(&self) -> &[TestRedis] {
        &self.nodes
    }

    pub fn nodes_mut(&mut self) -> &mut [TestRedis] {
        &mut self.nodes
    }

    /// The port of the primary that holds `key` (`CLUSTER KEYSLOT`, then `CLUSTER SLOTS`),
    /// as the first live node sees it.
    pub fn port_of(&self, key: &str) -> u16 {
        let node = self
            .nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a live cluster node");
        let slot: i64 = node.cmd(&["CLUSTER", "KEYSLOT", key]);
        use ::redis::Value;
        let Value::Array(ranges) = node.cmd::<Value>(&["CLUSTER", "SLOTS"]) else {
            panic!("CLUSTER SLOTS is not an array");
        };
        ranges
            .iter()
            .find_map(|r| match r {
                Value::Array(f) => match (f.first(), f.get(1), f.get(2)) {
                    (
                        Some(Value::Int(start)),
                        Some(Value::Int(end)),
                        Some(Value::Array(primary)),
                    ) if (*start..=*end).contains(&slot) => match primary.get(1) {
                        Some(Value::Int(port)) => Some(*port as u16),
                        _ => None,
                    },
                    _ => None,
                },
                _ => None,
            })
            .unwrap_or_else(|| panic!("no node holds slot {slot}"))
    }

    /// The ports of the nodes that are primaries now (`INFO replication` says `role:master`),
    /// among the live ones.
    pub fn primary_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .filter(|n| {
                command::<String>(n.port, &["INFO", "replication"])
                    .is_ok_and(|r| r.contains("role:master"))
            })
            .map(|n| n.port)
            .collect()
    }

    /// Waits until every live node reports `cluster_state:ok` with all slots served and none
    /// of them by `gone` (a killed primary whose replica must take over); the deadline is
    /// `within`.
    pub fn wait_failed_over(&self, gone: u16, within: Duration) -> Result<(), String> {
        let live: Vec<u16> = self
            .nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect();
        let gone_marker = format!(":{gone}@");
        poll(within, || {
            live.iter()
                .all(|&p| {
                    let info = command::<String>(p, &["CLUSTER", "INFO"]).unwrap_or_default();
                    let nodes = command::<String>(p, &["CLUSTER", "NODES"]).unwrap_or_default();
                    // The killed node's line must no longer claim slots as a live master.
                    let gone_serves = nodes.lines().any(|l| {
                        l.contains(&gone_marker)
                            && l.contains("master")
                            && !l.contains("fail")
                            && l.split(' ').count() > 8
                    });
                    info.contains("cluster_state:ok")
                        && info.contains("cluster_slots_ok:16384")
                        && !gone_serves
                })
                .then_some(())
        })
        .ok_or_else(|| format!("no replica took over from :{gone} within {within:?}"))
    }

    /// Runs one command on every node.
    pub fn cmd_all(&self, args: &[&str]) {
        for n in &self.nodes {
            n.cmd::<::redis::Value>(args);
        }
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.kill();
        }
    }
}

/// `n` distinct free ports at most [`MAX_CLUSTER_PORT`] whose bus port (+10000) is free too.
/// The listeners are held until all are chosen so no port is picked twice.
fn cluster_ports(n: usize) -> Vec<u16> {
    let mut held: Vec<TcpListener> = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..10_000 {
        if ports.len() == n {
            break;
        }
        let Ok(l) = TcpListener::bind("127.0.0.1:0") else {
            continue;
        };
        let Ok(port) = l.local_addr().map(|a| a.port()) else {
            continue;
        };
        if port > MAX_CLUSTER_PORT {
            // Keep it bound so the OS hands out another one next time.
            held.push(l);
            continue;
        }
        let Ok(bus) = TcpListener::bind(("127.0.0.1", port + 10_000)) else {
            held.push(l);
            continue;
        };
        held.push(l);
        held.push(bus);
        ports.push(port);
    }
    assert_eq!(
        ports.len(),
        n,
        "could not find {n} free cluster ports below {MAX_CLUSTER_PORT}"
    );
    ports
}

/// Script calls `redis` has run so far (`INFO commandstats`: `EVALSHA` plus the `EVAL` of a
/// `NOSCRIPT` retry).
pub fn script_calls(redis: &TestRedis) -> u64 {
    let stats: String = redis.cmd(&["INFO", "commandstats"]);
    ["evalsha", "eval"]
        .iter()
        .filter_map(|name| {
            stats.lines().find_map(|l| {
                l.strip_prefix(&format!("cmdstat_{name}:calls="))?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
        })
        .sum()
}
