//! The reference's telemetry variables as tollgate's: traces (`TRACING_*`, OTLP over gRPC
//! only), its statsd sink (on by default) and its Prometheus port (`USE_PROMETHEUS`).
//!
//! Data flows one way: the [`Reader`]'s variables → [`tracing`] and [`stats`] → the
//! `otlp_endpoint`, `statsd_*` and `prometheus_*` settings, or a line of the warning for what
//! is set and not served. As in the reference, one stats sink only: statsd (on unless
//! `USE_STATSD=false`) beside another is refused, and `DISABLE_STATS` turns every sink off.
//! Prometheus on the admin port's /metrics is tollgate's own and is served either way.

use super::read::{Reader, refuse};
use super::table::{Group, apply, names};
use super::{Refused, address};

/// `TRACING_ENABLED=true`: spans to the OTLP endpoint when the protocol is gRPC, else the
/// variable is named in the warning with what tollgate needs.
pub(super) fn tracing(r: &mut Reader) -> Result<(), Refused> {
    if !r.flag("TRACING_ENABLED")?.unwrap_or(false) {
        return Ok(());
    }
    let protocol = r
        .var("TRACING_EXPORTER_PROTOCOL")
        .unwrap_or_else(|| "http".to_string());
    let endpoint = r
        .var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .or_else(|| r.var("OTEL_EXPORTER_OTLP_ENDPOINT"));
    match endpoint {
        Some(endpoint) if protocol.eq_ignore_ascii_case("grpc") => {
            r.set_from(
                &["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"],
                "otlp_endpoint",
                endpoint,
            )
        }
        _ => r.ignore(format!(
            "TRACING_ENABLED (spans go over OTLP/gRPC: TRACING_EXPORTER_PROTOCOL=grpc with OTEL_EXPORTER_OTLP_ENDPOINT, got protocol {protocol})"
        )),
    }
    Ok(())
}

/// The stats sinks: statsd, then the Prometheus port.
pub(super) fn stats(r: &mut Reader) -> Result<(), Refused> {
    let use_statsd = statsd(r)?;
    prometheus(r, use_statsd)
}

/// statsd as the reference sends it: on unless `USE_STATSD=false` (its default is true) or
/// `DISABLE_STATS`, over TCP to `STATSD_HOST:STATSD_PORT`, every `STATS_FLUSH_INTERVAL`.
/// Whether it is on.
fn statsd(r: &mut Reader) -> Result<bool, Refused> {
    if r.on("DISABLE_STATS") {
        // Acted on (every sink off): not one of the variables the warning names as ignored.
        r.var("DISABLE_STATS");
    }
    let use_statsd = r.flag("USE_STATSD")?.unwrap_or(true) && !r.on("DISABLE_STATS");
    if !use_statsd {
        return Ok(false);
    }
    if let Some(other) = ["USE_DOG_STATSD", "USE_PROMETHEUS"]
        .into_iter()
        .find(|n| r.on(n))
    {
        // The reference stops too: it sends to one stats sink only.
        return Err(refuse(
            other,
            "true",
            "envoyproxy/ratelimit uses one stats sink and USE_STATSD is true (its default): set USE_STATSD=false",
        ));
    }
    let host = r
        .var("STATSD_HOST")
        .unwrap_or_else(|| "localhost".to_string());
    let port = r.var("STATSD_PORT").unwrap_or_else(|| "8125".to_string());
    r.set_from(
        &["STATSD_HOST", "STATSD_PORT"],
        "statsd_addr",
        format!("tcp://{}", address(Some(host), Some(port), "")),
    );
    apply(r, Group::Statsd)?;
    Ok(true)
}

/// Prometheus as the reference serves it (`USE_PROMETHEUS=true`, with statsd off): its statsd
/// counters through a statsd exporter mapping, on a port of its own. `DISABLE_STATS` comes
/// first there (no sink, no port), and one sink only. Off, its variables that are set are
/// named in the warning.
fn prometheus(r: &mut Reader, use_statsd: bool) -> Result<(), Refused> {
    if !use_statsd && !r.on("DISABLE_STATS") && r.flag("USE_PROMETHEUS")?.unwrap_or(false) {
        if r.on("USE_DOG_STATSD") {
            return Err(refuse(
                "USE_DOG_STATSD",
                "true",
                "envoyproxy/ratelimit uses one stats sink and USE_PROMETHEUS is true: unset one",
            ));
        }
        return apply(r, Group::Prometheus);
    }
    for name in names(Group::Prometheus) {
        if r.peek(name).is_some() {
            r.ignore(format!(
                "{name} (the reference's Prometheus port is off: USE_PROMETHEUS=true with USE_STATSD=false)"
            ));
        }
    }
    Ok(())
}
