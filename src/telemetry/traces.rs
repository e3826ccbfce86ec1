//! Logs and traces: log lines to stderr (text or JSON, `log_format`) through `tracing`, and,
//! with `otlp_endpoint` set, one span per `ShouldRateLimit` call exported over OTLP/gRPC.

/// How log lines are written to stderr (`log_format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// `tracing`'s human-readable lines (colour only on a terminal).
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `target`, `fields.message`, the other
    /// fields, and the spans the line was logged in), for Loki, Elasticsearch, Cloud Logging….
    Json,
}

impl LogFormat {
    /// What `log_format` accepts, for error messages.
    pub const NAMES: &'static str = "text or json";
}

/// The tracing target of the one span per `ShouldRateLimit` call. Only the OTLP exporter
/// listens to it (the log output never does), so without an endpoint the span costs nothing.
pub const REQUEST_SPAN_TARGET: &str = "tollgate::request";

#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("otlp_endpoint: {0}")]
    Otlp(String),
    #[error("log_level: {0}")]
    Filter(String),
}

/// What [`init`] started; [`Telemetry::shutdown`] flushes the spans still buffered.
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    pub fn shutdown(self) {
        // Bounded: an unreachable collector must not hold up the exit.
        if let Some(p) = self.provider
            && let Err(e) = p.shutdown_with_timeout(std::time::Duration::from_secs(5))
        {
            tracing::warn!("flushing traces at shutdown: {e}");
        }
    }
}

/// Starts logging to stderr and, when `otlp_endpoint` is set (e.g. `http://collector:4317`),
/// exports one span per request over OTLP/gRPC. `log_filter` is a `tracing` filter such as
/// `info` or `tollgate=debug,info`; `RUST_LOG`, when set, wins. Call inside a Tokio runtime
/// (the exporter's gRPC channel runs on it).
pub fn init(
    log_filter: &str,
    log_format: LogFormat,
    otlp_endpoint: &str,
) -> Result<Telemetry, TelemetryError> {
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
    use tracing_subscriber::prelude::*;

    let env = std::env::var("RUST_LOG").ok().filter(|v| !v.is_empty());
    let filter = EnvFilter::try_new(own_level(env.as_deref().unwrap_or(log_filter)))
        .map_err(|e| TelemetryError::Filter(e.to_string()))?
        .add_directive(
            format!("{REQUEST_SPAN_TARGET}=off")
                .parse()
                .map_err(|e| TelemetryError::Filter(format!("{e}")))?,
        );
    // Colour only on a terminal: containers write logs to a pipe or a file, where escape
    // codes are noise in every log viewer.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    // Boxed: the two formats are different layer types, and the choice is made once.
    let fmt: Box<dyn tracing_subscriber::Layer<_> + Send + Sync> = match log_format {
        LogFormat::Text => fmt.with_ansi(ansi).with_filter(filter).boxed(),
        LogFormat::Json => fmt
            .json()
            .with_current_span(false)
            .with_span_list(true)
            .with_filter(filter)
            .boxed(),
    };
    let (otel, provider) = if otlp_endpoint.is_empty() {
        (None, None)
    } else {
        use opentelemetry_otlp::WithExportConfig;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(otlp_endpoint)
            .with_timeout(std::time::Duration::from_secs(3))
            .build()
            .map_err(|e| TelemetryError::Otlp(e.to_string()))?;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name("tollgate")
                    .build(),
            )
            .build();
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("tollgate"))
            .with_filter(Targets::new().with_target(REQUEST_SPAN_TARGET, LevelFilter::INFO));
        (Some(layer), Some(provider))
    };
    // A second init (tests) is harmless: the first subscriber stays.
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init();
    Ok(Telemetry { provider })
}

/// A bare `debug` or `trace` (`LOG_LEVEL=debug`, `RUST_LOG=trace`) is about tollgate's own
/// lines: the dependencies stay at `info` (h2 alone writes hundreds of frame lines a second at
/// `debug`, burying every decision line). Any other filter is used as written, so
/// `debug,h2=debug` or `trace` for a target still reaches them.
pub fn own_level(filter: &str) -> String {
    match filter.trim().to_ascii_lowercase().as_str() {
        level @ ("debug" | "trace") => format!("info,tollgate={level}"),
        _ => filter.to_string(),
    }
}

/// Logging only, for tests and tools: [`init`] without an exporter.
pub fn init_logging(filter: &str) {
    let _ = init(filter, LogFormat::Text, "");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_debug_level_is_tollgates_own_and_anything_else_is_as_written() {
        assert_eq!(own_level("debug"), "info,tollgate=debug");
        assert_eq!(own_level(" TRACE "), "info,tollgate=trace");
        assert_eq!(own_level("info"), "info");
        assert_eq!(own_level("debug,h2=debug"), "debug,h2=debug");
        assert_eq!(own_level("tollgate=debug"), "tollgate=debug");
    }
}
