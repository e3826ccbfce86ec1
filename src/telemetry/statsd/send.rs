//! Sending the statsd counters (`telemetry/statsd/mod.rs` counts them): every
//! `statsd_flush_interval_ms`, each counter's growth since its last send, as statsd counter
//! lines, and the response times kept since, as timer lines, over UDP (datagrams packed by cadence's buffered sink) or TCP (`tcp://host:port`), as
//! the reference sends them; a failed send keeps the growth for the next one.

use std::collections::HashMap;
use std::io::{BufWriter, Write};
use std::net::{TcpStream, ToSocketAddrs, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cadence::{BufferedUdpMetricSink, Counted, MetricSink, StatsdClient, Timed};

use super::{PREFIX, Timings};
use crate::telemetry::Metrics;

/// Sends the counters' growth to `target` every `every`, and once more when `stop`
/// resolves. A send that fails (the name does not resolve, the socket refuses) keeps the
/// growth for the next one and is logged once until a send works again.
pub async fn run(
    metrics: Arc<Metrics>,
    target: Target,
    every: Duration,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut sent: HashMap<String, u64> = HashMap::new();
    let mut failing = false;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    tokio::pin!(stop);
    loop {
        let last = tokio::select! {
            _ = tick.tick() => false,
            _ = &mut stop => true,
        };
        let mut snapshot: Vec<(String, u64)> = metrics
            .statsd
            .snapshot(&metrics)
            .into_iter()
            .map(|(name, v)| (format!("{PREFIX}.{name}"), v))
            .collect();
        // The reference's gRPC server counts its calls under a scope of its own.
        snapshot.push((
            format!("{SERVER}.total_requests"),
            metrics
                .statsd
                .calls
                .load(std::sync::atomic::Ordering::Relaxed),
        ));
        let growth: Vec<(String, u64)> = snapshot
            .iter()
            .filter_map(|(name, v)| {
                let delta = v.saturating_sub(sent.get(name).copied().unwrap_or(0));
                (delta > 0).then(|| (name.clone(), delta))
            })
            .collect();
        // Timings are sent once, lost with a failed send (a timer is a sample, not a total).
        let timings = metrics.statsd.take_timings();
        if !growth.is_empty() || !timings.kept.is_empty() {
            let to = target.clone();
            // Resolving a name and writing to a socket block: not on the runtime's threads.
            let result = tokio::task::spawn_blocking(move || send(&to, &growth, &timings))
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
            match result {
                Ok(()) => {
                    if failing {
                        tracing::info!(?target, "statsd sends work again");
                    }
                    failing = false;
                    sent = snapshot.into_iter().collect();
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(
                            ?target,
                            "statsd counters not sent (kept for the next send): {e}"
                        );
                    }
                    failing = true;
                }
            }
        }
        if last {
            return;
        }
    }
}

/// Where statsd lines go: `host:port` or `udp://host:port` over UDP (statsd's usual), or
/// `tcp://host:port` over TCP (what the reference sends: gostats' TCP sink).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Udp(String),
    Tcp(String),
}

impl Target {
    /// The target `statsd_addr` names (checked by the settings: `[udp://|tcp://]host:port`).
    pub fn parse(addr: &str) -> Target {
        match addr.split_once("://") {
            Some(("tcp", rest)) => Target::Tcp(rest.to_string()),
            Some((_, rest)) => Target::Udp(rest.to_string()),
            None => Target::Udp(addr.to_string()),
        }
    }
}

/// How long a TCP send may take to connect, and each write.
const TCP_TIMEOUT: Duration = Duration::from_secs(2);

/// The reference's gRPC server's stats scope: `ratelimit_server.ShouldRateLimit.*`.
const SERVER: &str = "ratelimit_server.ShouldRateLimit";

/// One send: each counter as `<name>:<n>|c` (`ratelimit.service.…`, and the server's
/// `total_requests`), and each kept response time as `ratelimit_server.ShouldRateLimit.
/// response_time:<ms>|ms` (with `|@<rate>` when more calls were seen than kept), one line
/// each; over UDP in datagrams of at most 512 bytes, over TCP on one connection opened for
/// the send. The name is resolved at each send, so a statsd server that moves is followed.
fn send(target: &Target, growth: &[(String, u64)], timings: &Timings) -> Result<(), String> {
    let client = match target {
        Target::Udp(addr) => {
            let socket = UdpSocket::bind("0.0.0.0:0").map_err(|e| format!("bind: {e}"))?;
            let sink =
                BufferedUdpMetricSink::from(addr.as_str(), socket).map_err(|e| e.to_string())?;
            StatsdClient::from_sink("", sink)
        }
        Target::Tcp(addr) => StatsdClient::from_sink("", TcpSink::connect(addr)?),
    };
    for (name, n) in growth {
        client.count(name, *n).map_err(|e| e.to_string())?;
    }
    let name = format!("{SERVER}.response_time");
    let rate = timings.kept.len() as f64 / timings.seen.max(1) as f64;
    for ms in &timings.kept {
        let mut timer = client.time_with_tags(&name, ms.round() as u64);
        if rate < 1.0 {
            timer = timer.with_sampling_rate(rate);
        }
        timer.try_send().map_err(|e| e.to_string())?;
    }
    client.flush().map_err(|e| e.to_string())
}

/// cadence's sink for one TCP connection: lines buffered, written at flush (cadence ships UDP
/// and unix-socket sinks only).
struct TcpSink(Mutex<BufWriter<TcpStream>>);

impl TcpSink {
    fn connect(addr: &str) -> Result<TcpSink, String> {
        let mut last = format!("{addr}: the name resolves to no address");
        for a in addr.to_socket_addrs().map_err(|e| format!("{addr}: {e}"))? {
            match TcpStream::connect_timeout(&a, TCP_TIMEOUT) {
                Ok(stream) => {
                    stream
                        .set_write_timeout(Some(TCP_TIMEOUT))
                        .map_err(|e| e.to_string())?;
                    return Ok(TcpSink(Mutex::new(BufWriter::new(stream))));
                }
                Err(e) => last = format!("{a}: {e}"),
            }
        }
        Err(last)
    }
}

impl MetricSink for TcpSink {
    fn emit(&self, metric: &str) -> std::io::Result<usize> {
        let mut w = self.0.lock().unwrap_or_else(|p| p.into_inner());
        w.write_all(metric.as_bytes())?;
        w.write_all(b"\n")?;
        Ok(metric.len() + 1)
    }

    fn flush(&self) -> std::io::Result<()> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).flush()
    }
}
