//! The open-loop load run (`--rate R`): request *i* is due at `start + i / R` and is sent then,
//! whatever the server is doing, so a slow answer cannot delay the next request (no coordinated
//! omission). Latency is measured from the *scheduled* time, so a queue anywhere (the server,
//! the connection, this generator) shows in the percentiles instead of hiding in a lower rate.
//!
//! Flow: a pacer on a blocking thread walks the schedule, sleeping until the next request is due
//! (thread sleeps are precise to tens of µs; the runtime's timer only to 1 ms, which would add
//! up to 1 ms to every latency) and handing what is due to the runtime as one batch, where each
//! request becomes a task that records its latency and outcome. Requests due in the warm-up are sent but not measured.
//! After the schedule ends, the run waits for every answer (each bounded by
//! [`REQUEST_TIMEOUT`]).
//!
//! The run is marked invalid, rather than quietly wrong, when the generator limited it: when it
//! sent late (send lag p99 over [`MAX_SEND_LAG`]: it lacked CPU) or when `max_in_flight`
//! requests were already waiting and it dropped some. It never waits for a free slot: a cap
//! that stalls the schedule would bring coordinated omission back.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use hdrhistogram::Histogram;
use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::cpu::CpuClock;
use super::load::{
    BenchReport, Client, KeySpace, build_request, connect, histogram, per_request, percentiles,
    record,
};
use super::{BenchConfig, BenchError};

/// A request unanswered after this long counts as an error (and as this latency).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Sending later than this at p99 means the generator, not the server, set the pace.
pub const MAX_SEND_LAG: Duration = Duration::from_millis(1);

/// What the request tasks record, shared with the pacer.
struct Shared {
    latencies: Mutex<Histogram<u64>>,
    in_flight: AtomicUsize,
    ok: AtomicU64,
    over: AtomicU64,
    errors: AtomicU64,
    /// Answers (any outcome) of requests due in the measured window.
    measured: AtomicU64,
    /// Answers that arrived inside the measured window (the achieved rate).
    answered_in_window: AtomicU64,
    /// Every answer, warm-up included.
    total: AtomicU64,
    /// The first error's text, for the report.
    first_error: Mutex<Option<String>>,
}

impl Shared {
    fn note_error(&self, text: impl FnOnce() -> String) {
        let mut first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some(text());
        }
    }
}

/// What the pacer did.
struct Paced {
    /// Measured requests dropped because `max_in_flight` were waiting.
    dropped: u64,
    send_lag: Histogram<u64>,
    cpu_used: Option<Duration>,
}

/// Runs the open-loop load at `rate` requests per second and returns the report.
pub async fn run_open(cfg: BenchConfig, rate: f64) -> Result<BenchReport, BenchError> {
    if cfg.descriptors == 0 || cfg.max_in_flight == 0 {
        return Err(BenchError::NothingToSend);
    }
    if !(rate.is_finite() && rate > 0.0) {
        return Err(BenchError::Rate);
    }
    let cpu = cfg.target_pid.map(CpuClock::open).transpose()?;
    let keys = KeySpace::new(cfg.keys, cfg.zipf)?;
    let clients = connect(&cfg.target, cfg.connections).await?;
    let shared = Arc::new(Shared {
        latencies: Mutex::new(histogram()),
        in_flight: AtomicUsize::new(0),
        ok: AtomicU64::new(0),
        over: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        measured: AtomicU64::new(0),
        answered_in_window: AtomicU64::new(0),
        total: AtomicU64::new(0),
        first_error: Mutex::new(None),
    });
    let runtime = tokio::runtime::Handle::current();
    let connections = clients.len();
    let (pacer_cfg, pacer_shared) = (cfg.clone(), shared.clone());
    let paced = tokio::task::spawn_blocking(move || {
        let pacer = Pacer {
            cfg: &pacer_cfg,
            rate,
            keys: &keys,
            clients: &clients,
            cpu,
        };
        pacer.pace(&pacer_shared, &runtime)
    })
    .await
    .expect("the pacer does not panic")?;
    // Every request task ends within REQUEST_TIMEOUT of its send.
    while shared.in_flight.load(Ordering::SeqCst) > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let latencies = shared.latencies.lock().unwrap_or_else(|p| p.into_inner());
    let [p50_us, p90_us, p99_us, p999_us, max_us] = percentiles(&latencies);
    let seconds = cfg.duration.as_secs_f64();
    let requests = shared.measured.load(Ordering::SeqCst);
    let lag_p99 = percentiles(&paced.send_lag)[2];
    let invalid_reason = if paced.dropped > 0 {
        Some(format!(
            "{} requests not sent: {} were already waiting for answers (the server fell far behind; --max-in-flight)",
            paced.dropped, cfg.max_in_flight
        ))
    } else if Duration::from_micros(lag_p99) > MAX_SEND_LAG {
        Some(format!(
            "the generator fell behind its schedule (send lag p99 {lag_p99} µs > {} µs): it lacked CPU, so the latencies measure it as much as the server",
            MAX_SEND_LAG.as_micros()
        ))
    } else {
        None
    };
    Ok(BenchReport {
        label: cfg.label.clone(),
        target: cfg.target.clone(),
        mode: "open",
        seconds,
        requests,
        total_requests: shared.total.load(Ordering::SeqCst),
        rps: shared.answered_in_window.load(Ordering::SeqCst) as f64 / seconds.max(1e-9),
        offered_rps: Some(rate),
        ok: shared.ok.load(Ordering::SeqCst),
        over_limit: shared.over.load(Ordering::SeqCst),
        errors: shared.errors.load(Ordering::SeqCst),
        first_error: shared
            .first_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(),
        p50_us,
        p90_us,
        p99_us,
        p999_us,
        max_us,
        send_lag_p99_us: Some(lag_p99),
        dropped: paced.dropped,
        valid: invalid_reason.is_none(),
        invalid_reason,
        server_cpu_us_per_request: paced.cpu_used.map(|d| per_request(d, requests)),
        concurrency: cfg.max_in_flight,
        connections,
        keys: cfg.keys,
        descriptors: cfg.descriptors,
    })
}

/// The schedule and what each request needs.
struct Pacer<'a> {
    cfg: &'a BenchConfig,
    rate: f64,
    keys: &'a KeySpace,
    clients: &'a [Client],
    cpu: Option<CpuClock>,
}

impl Pacer<'_> {
    /// Walks the schedule on this (blocking) thread, spawning each request on `runtime`.
    fn pace(
        self,
        shared: &Arc<Shared>,
        runtime: &tokio::runtime::Handle,
    ) -> Result<Paced, BenchError> {
        let Pacer {
            cfg,
            rate,
            keys,
            clients,
            cpu,
        } = self;
        let mut rng = SmallRng::seed_from_u64(0x9E37_79B9_7F4A_7C15);
        let mut send_lag = histogram();
        let mut dropped = 0;
        let mut cpu_start = None;
        let start = Instant::now();
        let window_start = start + cfg.warmup;
        let window_end = window_start + cfg.duration;
        let ns_per_request = 1e9 / rate;
        let due_at = |i: u64| start + Duration::from_nanos((i as f64 * ns_per_request) as u64);
        let mut i: u64 = 0;
        loop {
            let due = due_at(i);
            if due >= window_end {
                break;
            }
            let now = Instant::now();
            if due > now {
                // The kernel wakes this thread a little late; that lateness is part of the
                // measured latency (it counts from `due`) and of the send lag.
                std::thread::sleep(due - now);
                continue;
            }
            // Everything due by now goes out as one batch: one task handed to the runtime per
            // wake-up rather than one per request (a hand-off from this thread wakes a worker,
            // and at tens of thousands per second those wake-ups would be the generator's
            // largest cost).
            let mut batch = Vec::new();
            while due_at(i) <= now && due_at(i) < window_end {
                let due = due_at(i);
                let measured = due >= window_start;
                if measured {
                    if cpu_start.is_none() {
                        cpu_start = cpu.as_ref().map(CpuClock::read).transpose()?;
                    }
                    record(&mut send_lag, now - due);
                }
                let client = &clients[(i % clients.len() as u64) as usize];
                i += 1;
                if shared.in_flight.load(Ordering::Relaxed) + batch.len() >= cfg.max_in_flight {
                    dropped += u64::from(measured);
                    continue;
                }
                batch.push(Send {
                    due,
                    measured,
                    req: build_request(cfg, keys, &mut rng),
                    client: client.clone(),
                });
            }
            shared.in_flight.fetch_add(batch.len(), Ordering::SeqCst);
            let shared = shared.clone();
            runtime.spawn(async move {
                for send in batch {
                    // Spawned from a worker: onto its local queue, no cross-thread wake-up.
                    tokio::spawn(send.run(shared.clone(), window_start..window_end));
                }
            });
        }
        let cpu_used = match (&cpu, cpu_start) {
            (Some(clock), Some(start)) => Some(clock.read()?.saturating_sub(start)),
            _ => None,
        };
        Ok(Paced {
            dropped,
            send_lag,
            cpu_used,
        })
    }
}

/// One scheduled request.
struct Send {
    due: Instant,
    /// Due inside the measured window (not in the warm-up).
    measured: bool,
    req: RateLimitRequest,
    client: Client,
}

impl Send {
    /// Sends the request and records its latency from `due`, its outcome and its answer time.
    async fn run(self, shared: Arc<Shared>, window: Range<Instant>) {
        let Send {
            due,
            measured,
            req,
            mut client,
        } = self;
        let result = tokio::time::timeout(REQUEST_TIMEOUT, client.should_rate_limit(req)).await;
        let answered = Instant::now();
        shared.total.fetch_add(1, Ordering::Relaxed);
        if window.contains(&answered) {
            shared.answered_in_window.fetch_add(1, Ordering::Relaxed);
        }
        if measured {
            record(
                &mut shared.latencies.lock().unwrap_or_else(|p| p.into_inner()),
                answered - due,
            );
            shared.measured.fetch_add(1, Ordering::Relaxed);
            let counter = match result {
                Ok(Ok(r)) if r.get_ref().overall_code == Code::OverLimit as i32 => &shared.over,
                Ok(Ok(_)) => &shared.ok,
                Ok(Err(status)) => {
                    shared.note_error(|| format!("{}: {}", status.code(), status.message()));
                    &shared.errors
                }
                Err(_) => {
                    shared.note_error(|| format!("no answer within {REQUEST_TIMEOUT:?}"));
                    &shared.errors
                }
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        shared.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}
