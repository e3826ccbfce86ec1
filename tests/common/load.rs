//! Steady load on a tollgate under test, recorded in phases: clients send one request at a
//! time (2 ms apart), each answer's latency and error go into the current [`Phase`]; the fault
//! tests take a phase per fault and report requests, errors and p99 for each.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use super::{client_of, request};

/// Latencies (µs) and errors of one phase.
#[derive(Default)]
pub struct Phase {
    pub latencies_us: Vec<u64>,
    pub errors: u64,
}

impl Phase {
    pub fn requests(&self) -> usize {
        self.latencies_us.len()
    }

    pub fn p99_ms(&self) -> f64 {
        let mut l = self.latencies_us.clone();
        l.sort_unstable();
        l.get((l.len() * 99 / 100).min(l.len().saturating_sub(1)))
            .map_or(0.0, |&us| us as f64 / 1000.0)
    }

    pub fn max_ms(&self) -> f64 {
        self.latencies_us
            .iter()
            .max()
            .map_or(0.0, |&us| us as f64 / 1000.0)
    }

    /// One line for the test's output.
    pub fn summary(&self, name: &str) -> String {
        format!(
            "{name}: {} requests, {} errors, p99 {:.1} ms, max {:.1} ms",
            self.requests(),
            self.errors,
            self.p99_ms(),
            self.max_ms()
        )
    }
}

pub struct Load {
    phase: Arc<Mutex<Phase>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Load {
    /// `clients` clients on `grpc`, each on its own tenant of `domain`'s `tenant` key.
    pub async fn start(grpc: SocketAddr, domain: &'static str, clients: usize) -> Load {
        let phase = Arc::new(Mutex::new(Phase::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for i in 0..clients {
            let (phase, stop) = (phase.clone(), stop.clone());
            let mut client = client_of(grpc).await;
            tasks.push(tokio::spawn(async move {
                let tenant = format!("t{i}");
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let r = client
                        .should_rate_limit(request(domain, &[&[("tenant", tenant.as_str())]]))
                        .await;
                    let took = started.elapsed().as_micros() as u64;
                    let mut p = phase.lock().await;
                    p.latencies_us.push(took);
                    p.errors += u64::from(r.is_err());
                    drop(p);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }));
        }
        Load { phase, stop, tasks }
    }

    /// What was recorded since the last call; a new phase starts.
    pub async fn take(&self) -> Phase {
        std::mem::take(&mut *self.phase.lock().await)
    }

    /// Stops the clients (a panicked client fails the test).
    pub async fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.expect("a client task panicked");
        }
    }
}

/// Decisions the fallback has made so far (`tollgate_decisions_total{outcome="fallback_*"}`).
pub fn fallback_decisions(admin: SocketAddr) -> f64 {
    super::metric_sum(admin, "tollgate_decisions_total", &["outcome=\"fallback_"])
}

/// How long until the fallback stops deciding (its count still for 300 ms), at most `limit`.
pub async fn until_fallback_stops(admin: SocketAddr, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut last = fallback_decisions(admin);
    while started.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = fallback_decisions(admin);
        if now == last {
            return Some(started.elapsed().saturating_sub(Duration::from_millis(300)));
        }
        last = now;
    }
    None
}
