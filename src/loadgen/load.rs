//! The closed-loop load run: `concurrency` tasks over `connections` HTTP/2 connections, each
//! sending one `ShouldRateLimit` at a time with a key from the key space (uniform or Zipf),
//! recording latencies after the warm-up; the result is a [`BenchReport`]. Also what the open
//! loop ([`super::open`]) shares: the connections, the key space, the requests, the report.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use super::cpu::{CpuClock, CpuTime};
use super::{BenchConfig, BenchError};

/// The result of a load run, closed or open loop.
#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub label: String,
    pub target: String,
    /// `closed` (`concurrency` requests always in flight) or `open` (a fixed schedule).
    pub mode: &'static str,
    pub seconds: f64,
    /// Requests measured: answered in the window (closed loop), or due in it (open loop).
    pub requests: u64,
    /// Every request answered, warm-up included (to relate server-side counters to requests).
    pub total_requests: u64,
    /// Achieved rate: answers per second within the measured window.
    pub rps: f64,
    /// Open loop: the scheduled rate (`--rate`).
    pub offered_rps: Option<f64>,
    pub ok: u64,
    pub over_limit: u64,
    /// Answers in which no descriptor had a limit (no rule matched on the server): a run of
    /// only these measured the no-rule path, not decisions (the text says so).
    pub no_rule: u64,
    pub errors: u64,
    /// The first error's text (gRPC code and message), when there was one.
    pub first_error: Option<String>,
    /// Latency percentiles, in µs: from the send (closed loop), from the scheduled send
    /// time (open loop, so a stalled server or client cannot hide its queue).
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    /// Open loop: how late the generator sent, p99 in µs (its own lag, not the server's).
    pub send_lag_p99_us: Option<u64>,
    /// Open loop: measured requests not sent because `max_in_flight` were already waiting.
    pub dropped: u64,
    /// False when the generator, not the server, limited the run (`invalid_reason` says how).
    pub valid: bool,
    pub invalid_reason: Option<String>,
    /// `--target-pid`: the server's CPU time (user + system) over the window ÷ `requests`.
    pub server_cpu_us_per_request: Option<f64>,
    /// Its two parts: the server's own code (user time) and the kernel working for it (system
    /// time: sockets, wake-ups), which shows what a cheaper client can and cannot remove.
    pub server_user_us_per_request: Option<f64>,
    pub server_system_us_per_request: Option<f64>,
    /// `--store-pid`: the store processes' CPU time (user + system, summed) over the window ÷
    /// `requests` (the store's cost of a decision, its protocol work included).
    pub store_cpu_us_per_request: Option<f64>,
    pub concurrency: usize,
    pub connections: usize,
    pub keys: u64,
    pub descriptors: usize,
    /// The descriptor the requests carried: `domain` and `key` (values `k0`, `k1`, …).
    pub domain: String,
    pub key: String,
}

impl BenchReport {
    pub fn text(&self) -> String {
        let mut out = format!(
            "{label}: {rps:.0} req/s over {secs:.1} s ({n} requests; ok {ok}, over_limit {over}, errors {err})\n  latency p50 {p50} µs, p90 {p90} µs, p99 {p99} µs, p99.9 {p999} µs, max {max} µs",
            label = self.label,
            rps = self.rps,
            secs = self.seconds,
            n = self.requests,
            ok = self.ok,
            over = self.over_limit,
            err = self.errors,
            p50 = self.p50_us,
            p90 = self.p90_us,
            p99 = self.p99_us,
            p999 = self.p999_us,
            max = self.max_us,
        );
        match self.offered_rps {
            Some(offered) => {
                out += &format!(
                    "\n  open loop: offered {offered:.0} req/s, achieved {rps:.0}; send lag p99 {lag} µs; {c} connection(s), {keys} key(s), {d} descriptor(s)/request",
                    rps = self.rps,
                    lag = self.send_lag_p99_us.unwrap_or(0),
                    c = self.connections,
                    keys = self.keys,
                    d = self.descriptors,
                )
            }
            None => {
                out += &format!(
                    "\n  {c} in flight over {conn} connection(s), {keys} key(s), {d} descriptor(s)/request",
                    c = self.concurrency,
                    conn = self.connections,
                    keys = self.keys,
                    d = self.descriptors,
                )
            }
        }
        if let (Some(cpu), Some(user), Some(system)) = (
            self.server_cpu_us_per_request,
            self.server_user_us_per_request,
            self.server_system_us_per_request,
        ) {
            out += &format!(
                "\n  server CPU {cpu:.1} µs per request (user {user:.1}, system {system:.1})"
            );
        }
        if let Some(cpu) = self.store_cpu_us_per_request {
            out += &format!("\n  store CPU {cpu:.1} µs per request");
        }
        if let Some(e) = &self.first_error {
            out += &format!("\n  first error: {e}");
        }
        if self.no_rule > 0 && self.no_rule == self.ok + self.over_limit {
            out += &format!(
                "\n  note: no answer carried a limit: no rule matched domain '{}', key '{}' on the server, so this measured the no-rule path, not decisions (--domain and --key name a rule's; `make run`'s rules: --domain edge --key tenant)",
                self.domain, self.key
            );
        }
        if let Some(why) = &self.invalid_reason {
            out += &format!("\n  INVALID RUN: {why}");
        }
        out
    }
}

/// Whether no descriptor of the answer had a limit: no rule matched it on the server.
pub(super) fn no_limit(r: &RateLimitResponse) -> bool {
    r.statuses.iter().all(|s| s.current_limit.is_none())
}

/// A latency histogram in µs, 1 µs to 60 s at 3 significant digits (0.1 % error); also the
/// simulator's (in virtual µs).
pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("constant, valid bounds")
}

/// Records `d` in µs (at least 1; beyond 60 s, as 60 s).
pub(super) fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record(d.as_micros().clamp(1, u128::from(u64::MAX)) as u64);
}

/// p50, p90, p99, p99.9 and the maximum, in µs (0 for an empty histogram).
pub(super) fn percentiles(h: &Histogram<u64>) -> [u64; 5] {
    if h.is_empty() {
        return [0; 5];
    }
    [
        h.value_at_quantile(0.50),
        h.value_at_quantile(0.90),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.max(),
    ]
}

/// Picks key indexes in `0..n`: uniform, or Zipf-skewed (index 0 the hottest).
pub(super) enum KeySpace {
    Uniform(u64),
    Zipf { n: u64, ranks: Zipf<f64> },
}

impl KeySpace {
    /// `keys` distinct keys (at least one); `zipf`: the exponent, `None` for uniform.
    pub(super) fn new(keys: u64, zipf: Option<f64>) -> Result<KeySpace, BenchError> {
        let n = keys.max(1);
        Ok(match zipf {
            None => KeySpace::Uniform(n),
            Some(s) => KeySpace::Zipf {
                n,
                ranks: Zipf::new(n as f64, s).map_err(BenchError::Zipf)?,
            },
        })
    }

    fn pick(&self, rng: &mut SmallRng) -> u64 {
        match self {
            KeySpace::Uniform(n) => rng.random_range(0..*n),
            // A sample is a rank in 1..=n (a whole f64); rank 1 is key 0. The clamp only
            // guards the float-to-int conversion.
            KeySpace::Zipf { n, ranks } => {
                let rank = ranks.sample(rng) as u64;
                rank.saturating_sub(1).min(n - 1)
            }
        }
    }
}

/// One connection's client (cheap to clone: clones share the connection).
pub(super) type Client = RateLimitServiceClient<Channel>;

/// `n` HTTP/2 connections to `target` (`host:port` or a URI).
pub(super) async fn connect(target: &str, n: usize) -> Result<Vec<Client>, BenchError> {
    let uri = if target.contains("://") {
        target.to_string()
    } else {
        format!("http://{target}")
    };
    let endpoint = Endpoint::from_shared(uri).map_err(|source| BenchError::Connect {
        target: target.to_string(),
        source,
    })?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        // Each `connect` is its own HTTP/2 connection.
        let ch = endpoint
            .clone()
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|source| BenchError::Connect {
                target: target.to_string(),
                source,
            })?;
        out.push(RateLimitServiceClient::new(ch));
    }
    Ok(out)
}

pub(super) fn build_request(
    cfg: &BenchConfig,
    keys: &KeySpace,
    rng: &mut SmallRng,
) -> RateLimitRequest {
    RateLimitRequest {
        domain: cfg.domain.clone(),
        descriptors: (0..cfg.descriptors)
            .map(|_| RateLimitDescriptor {
                entries: vec![Entry {
                    key: cfg.key.clone(),
                    value: format!("k{}", keys.pick(rng)),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    over: AtomicU64,
    no_rule: AtomicU64,
    errors: AtomicU64,
    sent: AtomicU64,
    total: AtomicU64,
    first_error: std::sync::Mutex<Option<String>>,
}

/// Runs the closed-loop load and returns the report.
pub async fn run(cfg: BenchConfig) -> Result<BenchReport, BenchError> {
    if cfg.concurrency == 0 || cfg.descriptors == 0 {
        return Err(BenchError::NothingToSend);
    }
    let cpu = cfg.target_pid.map(CpuClock::open).transpose()?;
    let store_cpu: Vec<CpuClock> = cfg
        .store_pids
        .iter()
        .map(|&pid| CpuClock::open(pid))
        .collect::<Result<_, _>>()?;
    let keys = Arc::new(KeySpace::new(cfg.keys, cfg.zipf)?);
    let clients = connect(&cfg.target, cfg.connections).await?;
    let cfg = Arc::new(cfg);
    let counts = Arc::new(Counts::default());
    let recording = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::with_capacity(cfg.concurrency);
    for i in 0..cfg.concurrency {
        let mut client = clients[i % clients.len()].clone();
        let (cfg, keys, counts, recording, stop) = (
            cfg.clone(),
            keys.clone(),
            counts.clone(),
            recording.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            // A fixed seed per task: runs are repeatable, tasks do not pick in lockstep.
            let mut rng = SmallRng::seed_from_u64(0x9E37_79B9_7F4A_7C15 ^ ((i as u64 + 1) << 17));
            let mut latencies = histogram();
            while !stop.load(Ordering::Relaxed) {
                let req = cfg.request(build_request(&cfg, &keys, &mut rng));
                let started = Instant::now();
                let result = client.should_rate_limit(req).await;
                let took = started.elapsed();
                counts.total.fetch_add(1, Ordering::Relaxed);
                if !recording.load(Ordering::Relaxed) {
                    continue;
                }
                record(&mut latencies, took);
                counts.sent.fetch_add(1, Ordering::Relaxed);
                if let Ok(r) = &result
                    && no_limit(r.get_ref())
                {
                    counts.no_rule.fetch_add(1, Ordering::Relaxed);
                }
                let counter = match result {
                    Ok(r) if r.get_ref().overall_code == Code::OverLimit as i32 => &counts.over,
                    Ok(_) => &counts.ok,
                    Err(status) => {
                        let mut first =
                            counts.first_error.lock().unwrap_or_else(|p| p.into_inner());
                        first.get_or_insert_with(|| {
                            format!("{}: {}", status.code(), status.message())
                        });
                        &counts.errors
                    }
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            latencies
        }));
    }
    tokio::time::sleep(cfg.warmup).await;
    recording.store(true, Ordering::SeqCst);
    let cpu_start = cpu.as_ref().map(CpuClock::read).transpose()?;
    let store_start: Vec<CpuTime> = store_cpu
        .iter()
        .map(CpuClock::read)
        .collect::<Result<_, _>>()?;
    let started = Instant::now();
    let mut last = 0;
    while started.elapsed() < cfg.duration {
        let left = cfg.duration.saturating_sub(started.elapsed());
        tokio::time::sleep(left.min(Duration::from_secs(1))).await;
        if cfg.progress {
            let sent = counts.sent.load(Ordering::Relaxed);
            eprintln!(
                "  {:>5.1} s  {:>8} req/s",
                started.elapsed().as_secs_f64(),
                sent - last
            );
            last = sent;
        }
    }
    recording.store(false, Ordering::SeqCst);
    let seconds = started.elapsed().as_secs_f64();
    let cpu_used = match (&cpu, cpu_start) {
        (Some(clock), Some(start)) => Some(clock.read()?.since(start)),
        _ => None,
    };
    let mut store_used = Duration::ZERO;
    for (clock, start) in store_cpu.iter().zip(store_start) {
        store_used += clock.read()?.since(start).total();
    }
    stop.store(true, Ordering::SeqCst);
    let mut all = histogram();
    for t in tasks {
        if let Ok(h) = t.await {
            all.add(&h).expect("same bounds");
        }
    }
    let [p50_us, p90_us, p99_us, p999_us, max_us] = percentiles(&all);
    let requests = counts.sent.load(Ordering::Relaxed);
    Ok(BenchReport {
        label: cfg.label.clone(),
        target: cfg.target.clone(),
        mode: "closed",
        seconds,
        requests,
        total_requests: counts.total.load(Ordering::Relaxed),
        rps: requests as f64 / seconds.max(1e-9),
        offered_rps: None,
        ok: counts.ok.load(Ordering::Relaxed),
        over_limit: counts.over.load(Ordering::Relaxed),
        no_rule: counts.no_rule.load(Ordering::Relaxed),
        errors: counts.errors.load(Ordering::Relaxed),
        first_error: counts
            .first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(),
        p50_us,
        p90_us,
        p99_us,
        p999_us,
        max_us,
        send_lag_p99_us: None,
        dropped: 0,
        valid: true,
        invalid_reason: None,
        server_cpu_us_per_request: cpu_used.map(|t| per_request(t.total(), requests)),
        server_user_us_per_request: cpu_used.map(|t| per_request(t.user, requests)),
        server_system_us_per_request: cpu_used.map(|t| per_request(t.system, requests)),
        store_cpu_us_per_request: (!store_cpu.is_empty())
            .then(|| per_request(store_used, requests)),
        concurrency: cfg.concurrency,
        connections: clients.len(),
        keys: cfg.keys,
        descriptors: cfg.descriptors,
        domain: cfg.domain.clone(),
        key: cfg.key.clone(),
    })
}

/// CPU µs per request (0 requests: 0).
pub(super) fn per_request(cpu: Duration, requests: u64) -> f64 {
    if requests == 0 {
        return 0.0;
    }
    cpu.as_secs_f64() * 1e6 / requests as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_is_skewed_and_uniform_is_not() {
        let mut rng = SmallRng::seed_from_u64(7);
        let zipf = KeySpace::new(1000, Some(1.1)).unwrap();
        let hits = (0..10_000).filter(|_| zipf.pick(&mut rng) == 0).count();
        assert!(hits > 1000, "the hottest key gets a large share: {hits}");
        let uniform = KeySpace::new(1000, None).unwrap();
        let hits = (0..10_000).filter(|_| uniform.pick(&mut rng) == 0).count();
        assert!(hits < 50, "{hits}");
        // Every key can come up, and nothing outside the key space does.
        let picked: std::collections::HashSet<u64> =
            (0..100_000).map(|_| zipf.pick(&mut rng)).collect();
        assert!(picked.iter().all(|&k| k < 1000));
        assert!(picked.contains(&999) && picked.contains(&0));
        let uniform: std::collections::HashSet<u64> =
            (0..100_000).map(|_| uniform.pick(&mut rng)).collect();
        assert_eq!(uniform.len(), 1000);
    }

    #[test]
    fn one_key_and_a_bad_exponent() {
        let mut rng = SmallRng::seed_from_u64(1);
        for keys in [0, 1] {
            for space in [KeySpace::new(keys, None), KeySpace::new(keys, Some(1.1))] {
                let space = space.unwrap();
                assert!((0..100).all(|_| space.pick(&mut rng) == 0));
            }
        }
        assert!(matches!(
            KeySpace::new(10, Some(-1.0)),
            Err(BenchError::Zipf(_))
        ));
    }
}
