//! A Sentinel deployment on loopback: a primary, one replica and three Sentinels
//! (`redis-server --sentinel` with a config file each, since Sentinel rewrites its config),
//! all killed on drop. [`TestSentinels::failover`] forces a failover and waits until the
//! Sentinels name the former replica as the primary. [`TestSentinels::start_tls`] runs the
//! same set over mutual TLS (replication and Sentinel links too); every server keeps a plain
//! port for the test's own inspection, and the Sentinels name the primaries' TLS ports.

#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::redis::{TestRedis, command};
use super::tls::TestCerts;
use super::{free_port, poll, temp_dir};

pub const MASTER: &str = "mymaster";
const DEADLINE: Duration = Duration::from_secs(30);

pub struct TestSentinels {
    pub primary: TestRedis,
    pub replica: TestRedis,
    /// Each Sentinel's plain port (for the test) and TLS port (for tollgate, over TLS).
    sentinels: Vec<(u16, Option<u16>, Child)>,
    tls: bool,
    _dir: tempfile::TempDir,
}

impl TestSentinels {
    pub fn start() -> TestSentinels {
        TestSentinels::start_with(None)
    }

    /// The same set over mutual TLS with `certs`: clients (tollgate) must show a certificate
    /// signed by the test CA; the servers replicate and the Sentinels monitor over TLS.
    pub fn start_tls(certs: &TestCerts) -> TestSentinels {
        TestSentinels::start_with(Some(certs))
    }

    fn start_with(certs: Option<&TestCerts>) -> TestSentinels {
        let (primary, replica) = match certs {
            None => {
                let primary = TestRedis::start();
                let replica = TestRedis::start_with(&[
                    "--replicaof",
                    "127.0.0.1",
                    &primary.port().to_string(),
                ]);
                (primary, replica)
            }
            Some(certs) => {
                let primary = TestRedis::start_tls_with(certs, true, &["--tls-replication", "yes"]);
                let replica = TestRedis::start_tls_with(
                    certs,
                    true,
                    &[
                        "--tls-replication",
                        "yes",
                        "--replicaof",
                        "127.0.0.1",
                        &primary.tls_port().to_string(),
                    ],
                );
                (primary, replica)
            }
        };
        let synced = poll(DEADLINE, || {
            let info: String = replica.cmd(&["INFO", "replication"]);
            info.contains("master_link_status:up").then_some(())
        });
        assert!(synced.is_some(), "the replica never synced");
        let dir = temp_dir("sentinel");
        let monitored = match certs {
            None => primary.port(),
            Some(_) => primary.tls_port(),
        };
        let sentinels = (0..3)
            .map(|i| spawn_sentinel(&dir, i, certs, monitored))
            .collect();
        let set = TestSentinels {
            primary,
            replica,
            sentinels,
            tls: certs.is_some(),
            _dir: dir,
        };
        // Ready when every Sentinel sees the replica and the two other Sentinels (a failover
        // needs them: quorum 2, and a majority to authorise it).
        for (port, _, _) in &set.sentinels {
            let port = *port;
            let ready = poll(DEADLINE, || {
                let replicas: Vec<::redis::Value> =
                    command(port, &["SENTINEL", "REPLICAS", MASTER]).ok()?;
                let others: Vec<::redis::Value> =
                    command(port, &["SENTINEL", "SENTINELS", MASTER]).ok()?;
                (!replicas.is_empty() && others.len() == 2).then_some(())
            });
            assert!(
                ready.is_some(),
                "sentinel {port} never saw its peers; the Sentinels' logs:\n{}",
                (0..3)
                    .map(|i| log_tail(&set._dir, i))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
        set
    }

    /// `redis+sentinel://…/mymaster` (`rediss+sentinel://` and the TLS ports, for a set
    /// from [`TestSentinels::start_tls`]).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(p, tls, _)| format!("127.0.0.1:{}", tls.unwrap_or(*p)))
            .collect();
        let scheme = if self.tls { "rediss" } else { "redis" };
        format!("{scheme}+sentinel://{}/{MASTER}", hosts.join(","))
    }

    /// The (plain) port of the server the Sentinels name as the primary now.
    pub fn primary_port(&self) -> u16 {
        let (port, _, _) = &self.sentinels[0];
        let addr: Vec<String> =
            command(*port, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER]).expect("master addr");
        let named: u16 = addr[1].parse().expect("a port");
        if !self.tls {
            return named;
        }
        // Over TLS the Sentinels name TLS ports.
        [&self.primary, &self.replica]
            .iter()
            .find(|r| r.tls_port() == named)
            .map(|r| r.port())
            .unwrap_or_else(|| panic!("the Sentinels name :{named}, no server of the set"))
    }

    /// Forces a failover and waits until the Sentinels name the former replica, and it is a
    /// primary. The former primary may take writes a while longer, until the Sentinels demote
    /// it ([`TestSentinels::wait_demoted`]). Returns the former primary's port.
    pub fn failover(&self) -> u16 {
        let before = self.primary_port();
        let (port, _, _) = &self.sentinels[0];
        let _: String =
            command(*port, &["SENTINEL", "FAILOVER", MASTER]).expect("SENTINEL FAILOVER");
        let done = poll(DEADLINE, || {
            let now = self.primary_port();
            let new: String = command(now, &["INFO", "replication"]).ok()?;
            (now != before && new.contains("role:master")).then_some(())
        });
        assert!(done.is_some(), "the failover never completed");
        before
    }

    /// Waits until the server at `port` (a former primary) has become a replica.
    pub fn wait_demoted(&self, port: u16) {
        let done = poll(DEADLINE, || {
            let info: String = command(port, &["INFO", "replication"]).ok()?;
            info.contains("role:slave").then_some(())
        });
        assert!(done.is_some(), "the former primary was never demoted");
    }
}

/// Starts Sentinel `i` monitoring the primary at `monitored` and waits until it answers on
/// its port. Its ports are picked free before it binds them, so a test running beside it may
/// take one first: a Sentinel that exits or never answers is started again on new ports.
fn spawn_sentinel(
    dir: &tempfile::TempDir,
    i: usize,
    certs: Option<&TestCerts>,
    monitored: u16,
) -> (u16, Option<u16>, Child) {
    for _ in 0..5 {
        let port = free_port();
        let tls_port = certs.map(|_| free_port());
        let tls_conf = match (certs, tls_port) {
            (Some(certs), Some(tls_port)) => format!(
                "tls-port {tls_port}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-auth-clients yes\ntls-replication yes\n",
                certs.file("server.crt"),
                certs.file("server.key"),
                certs.file("ca.crt")
            ),
            _ => String::new(),
        };
        let conf = dir.path().join(format!("sentinel-{i}.conf"));
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\n{tls_conf}sentinel monitor {MASTER} 127.0.0.1 {monitored} 2\nsentinel down-after-milliseconds {MASTER} 1000\nsentinel failover-timeout {MASTER} 5000\nsentinel parallel-syncs {MASTER} 1\n",
            ),
        )
        .expect("write sentinel config");
        let mut child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .arg("--logfile")
            .arg(dir.path().join(format!("sentinel-{i}.log")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server --sentinel");
        let up = poll(Duration::from_secs(5), || {
            let pong: String = command(port, &["PING"]).ok()?;
            (pong == "PONG").then_some(())
        });
        if up.is_some() {
            return (port, tls_port, child);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!(
        "sentinel {i} never answered on five pairs of ports:\n{}",
        log_tail(dir, i)
    );
}

/// The last lines of Sentinel `i`'s log, for a failure's message.
fn log_tail(dir: &tempfile::TempDir, i: usize) -> String {
    let log = std::fs::read_to_string(dir.path().join(format!("sentinel-{i}.log")))
        .unwrap_or_else(|e| format!("(no log: {e})"));
    let lines: Vec<&str> = log.lines().collect();
    format!(
        "sentinel-{i}.log:\n{}",
        lines[lines.len().saturating_sub(15)..].join("\n")
    )
}

impl Drop for TestSentinels {
    fn drop(&mut self) {
        for (_, _, child) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
