//! A Sentinel deployment on loopback: a primary, one replica and three Sentinels
//! (`redis-server --sentinel` with a config file each, since Sentinel rewrites its config),
//! all killed on drop. [`TestSentinels::failover`] forces a failover and waits until the
//! Sentinels name the former replica as the primary.

#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::redis::{TestRedis, command};
use super::{free_port, poll, temp_dir};

pub const MASTER: &str = "mymaster";
const DEADLINE: Duration = Duration::from_secs(30);

pub struct TestSentinels {
    pub primary: TestRedis,
    pub replica: TestRedis,
    sentinels: Vec<(u16, Child)>,
    _dir: tempfile::TempDir,
}

impl TestSentinels {
    pub fn start() -> TestSentinels {
        let primary = TestRedis::start();
        let replica =
            TestRedis::start_with(&["--replicaof", "127.0.0.1", &primary.port().to_string()]);
        let synced = poll(DEADLINE, || {
            let info: String = replica.cmd(&["INFO", "replication"]);
            info.contains("master_link_status:up").then_some(())
        });
        assert!(synced.is_some(), "the replica never synced");
        let dir = temp_dir("sentinel");
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let port = free_port();
            let conf = dir.path().join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\nsentinel monitor {MASTER} 127.0.0.1 {} 2\nsentinel down-after-milliseconds {MASTER} 1000\nsentinel failover-timeout {MASTER} 5000\nsentinel parallel-syncs {MASTER} 1\n",
                    primary.port()
                ),
            )
            .expect("write sentinel config");
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .arg("--logfile")
                .arg(dir.path().join(format!("sentinel-{i}.log")))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start redis-server --sentinel");
            sentinels.push((port, child));
        }
        let set = TestSentinels {
            primary,
            replica,
            sentinels,
            _dir: dir,
        };
        // Ready when every Sentinel sees the replica and the two other Sentinels (a failover
        // needs them: quorum 2, and a majority to authorise it).
        for (port, _) in &set.sentinels {
            let port = *port;
            let ready = poll(DEADLINE, || {
                let replicas: Vec<::redis::Value> =
                    command(port, &["SENTINEL", "REPLICAS", MASTER]).ok()?;
                let others: Vec<::redis::Value> =
                    command(port, &["SENTINEL", "SENTINELS", MASTER]).ok()?;
                (!replicas.is_empty() && others.len() == 2).then_some(())
            });
            assert!(ready.is_some(), "sentinel {port} never saw its peers");
        }
        set
    }

    /// `redis+sentinel://…/mymaster`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(p, _)| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{MASTER}", hosts.join(","))
    }

    /// The port the Sentinels name as the primary now.
    pub fn primary_port(&self) -> u16 {
        let (port, _) = &self.sentinels[0];
        let addr: Vec<String> =
            command(*port, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER]).expect("master addr");
        addr[1].parse().expect("a port")
    }

    /// Forces a failover and waits until the Sentinels name the former replica, and it is a
    /// primary. The former primary may take writes a while longer, until the Sentinels demote
    /// it ([`TestSentinels::wait_demoted`]). Returns the former primary's port.
    pub fn failover(&self) -> u16 {
        let before = self.primary_port();
        let (port, _) = &self.sentinels[0];
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

impl Drop for TestSentinels {
    fn drop(&mut self) {
        for (_, child) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
