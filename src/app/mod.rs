//! Wiring: settings → rules, store, limiter → the gRPC and admin servers, until shutdown.
//!
//! [`serve`] takes listeners that are already bound, the clock and the shutdown signal as a
//! future (as mini-redis does), so tests bind port 0 themselves, drive time where it helps and
//! decide when to stop; [`run`] binds the configured addresses and calls it (what `tollgate
//! serve` does). Order matters: the rules are loaded and both ports bound before `/readyz`
//! turns 200; on shutdown readiness drops first, then both servers drain the requests in
//! flight.
//!
//! - this file: the errors that stop tollgate, `serve`'s order of things, the decision side.
//! - [`load`]: the rules and every file a setting names, read before any port is bound.
//! - [`background`]: the tasks beside the servers (housekeeping, reloads, membership, the
//!   reference's telemetry), the drain on shutdown, and what is done after the servers stop.
//! - [`readiness`]: the startup line and the wait for the store's first answer.
//! - [`grpc`]: the gRPC server (RLS, RLQS, health, TLS); [`shutdown`]: the signals.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admin::{self, AdminState};
use crate::clock::Clock;
use crate::configs;
use crate::fleet::Replicas;
use crate::limiter::Limiter;
use crate::rules::{self, RulesError};
use crate::service::Handler;
use crate::settings::{self, Settings, SettingsError, Sources};
use crate::store::{Store, StoreError};
use crate::telemetry::{self, Metrics, TelemetryError};

mod background;
mod grpc;
mod load;
mod readiness;
mod shutdown;

use load::{LoadedRules, check_files, load_rules};
pub use shutdown::shutdown_signal;
use shutdown::stopped;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("{0}")]
    Rules(#[from] RulesError),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("gRPC server failed: {0}")]
    Grpc(#[source] tonic::transport::Error),
    #[error("TLS of the gRPC port: {0}")]
    GrpcTlsFile(#[from] crate::service::tls::TlsFileError),
    #[error("TLS of the gRPC port: {0}")]
    GrpcTls(#[source] tonic::transport::Error),
    #[error("admin server failed: {0}")]
    Admin(#[source] std::io::Error),
    #[error("{0}")]
    Settings(#[from] SettingsError),
    #[error("{0}")]
    Telemetry(#[from] TelemetryError),
    #[error("prometheus_mapper {path}: {error}")]
    PrometheusMapper { path: String, error: String },
    #[error(
        "the store did not answer within store_startup_timeout_ms ({} ms) of the start: {error}",
        .waited.as_millis()
    )]
    StoreNeverAnswered { waited: Duration, error: String },
}

/// The two listeners tollgate serves on, bound by the caller.
#[derive(Debug)]
pub struct Listeners {
    /// Envoy's RateLimitService (gRPC) and `grpc.health.v1`.
    pub grpc: TcpListener,
    /// The admin HTTP port (see `admin.rs`).
    pub admin: TcpListener,
}

impl Listeners {
    /// Binds both addresses of the settings.
    pub async fn bind(settings: &Settings) -> Result<Listeners, AppError> {
        Ok(Listeners {
            grpc: bind("gRPC", settings.grpc_addr).await?,
            admin: bind("admin", settings.admin_addr).await?,
        })
    }
}

/// How long graceful shutdown waits for clients to close their connections.
const CLOSE_DEADLINE: Duration = Duration::from_secs(10);

/// `tollgate serve`: settings from `sources` (validated before anything starts), logging and
/// traces, a warning per `TOLLGATE_*` variable of the process that is not a setting, then
/// [`run`] until Ctrl-C or SIGTERM; buffered spans are flushed on the way out. Returns whether
/// it started and stopped cleanly: a fatal error is reported here, in the log format the
/// settings ask for (`log_format: json` makes stderr JSON from the first line to the last, the
/// fatal error included), so the caller prints nothing more.
pub async fn run_with_env(sources: &Sources) -> bool {
    let settings = match Settings::load(sources) {
        Ok(settings) => settings,
        Err(e) => {
            // The settings did not load, so their log_format is the flag's or the variable's
            // as given (a settings file that cannot be read reports in text).
            report_fatal(&AppError::from(e), log_format_hint(sources), false);
            return false;
        }
    };
    let telemetry = match telemetry::init(
        &settings.log_level,
        settings.log_format,
        &settings.otlp_endpoint,
    ) {
        Ok(telemetry) => telemetry,
        Err(e) => {
            report_fatal(&AppError::from(e), settings.log_format, false);
            return false;
        }
    };
    let names = std::env::vars_os().filter_map(|(name, _)| name.into_string().ok());
    for warning in settings::unknown_env_warnings(names) {
        tracing::warn!("{warning}");
    }
    if !sources.reference_ignored.is_empty() {
        tracing::warn!(
            "envoyproxy/ratelimit variables that change nothing here: {}",
            sources.reference_ignored.join("; ")
        );
    }
    if sources.as_reference {
        // One line that says whether this replica decides as the reference would.
        let differences = settings::differences(&settings);
        if differences.is_empty() {
            tracing::info!("started as envoyproxy/ratelimit: decides as it does");
        } else {
            let list: Vec<String> = differences.iter().map(|d| d.to_string()).collect();
            tracing::warn!(
                "started as envoyproxy/ratelimit, decides otherwise in {} way(s): {}",
                list.len(),
                list.join("; ")
            );
        }
    }
    let format = settings.log_format;
    let result = run(settings, shutdown_signal()).await;
    if let Err(e) = &result {
        report_fatal(e, format, true);
    }
    // Flush the spans still buffered, also after a failed start.
    telemetry.shutdown();
    result.is_ok()
}

/// Writes the error that stops tollgate to stderr: `tollgate: <error>` as a plain line, or, in
/// JSON, one log object of level ERROR (`logging`: the JSON logger is already installed).
fn report_fatal(e: &AppError, format: telemetry::LogFormat, logging: bool) {
    let e = crate::error_text::chain(e);
    match format {
        telemetry::LogFormat::Text => eprintln!("tollgate: {e}"),
        telemetry::LogFormat::Json => {
            // Errors only: the report is the one line this logger writes. The logger cannot
            // start when RUST_LOG is not a filter: the line is then written by hand, in the
            // same shape, rather than lost.
            if logging || telemetry::init("error", format, "").is_ok() {
                tracing::error!("tollgate: {e}");
            } else {
                let line = serde_json::json!({
                    "level": "ERROR",
                    "target": "tollgate",
                    "fields": { "message": format!("tollgate: {e}") },
                });
                eprintln!("{line}");
            }
        }
    }
}

/// The log format a flag or a `TOLLGATE_LOG_FORMAT` variable asks for (flags win), when the
/// settings as a whole did not load.
fn log_format_hint(sources: &Sources) -> telemetry::LogFormat {
    let given = |list: &[(&'static str, String)]| {
        list.iter()
            .rev()
            .find(|(key, _)| *key == "log_format")
            .map(|(_, v)| v.trim().eq_ignore_ascii_case("json"))
    };
    match given(&sources.flags).or_else(|| given(&sources.env)) {
        Some(true) => telemetry::LogFormat::Json,
        _ => telemetry::LogFormat::Text,
    }
}

/// Runs tollgate on the configured addresses with the system clock until `shutdown` resolves.
pub async fn run(
    settings: Settings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AppError> {
    // Rules and every file a setting names first: a broken rules file, a missing certificate
    // or password file is reported before any port is taken.
    let rules = load_rules(&settings)?;
    check_files(&settings)?;
    let listeners = Listeners::bind(&settings).await?;
    serve_loaded(listeners, settings, rules, Clock::system(), shutdown).await
}

/// Runs tollgate on `listeners` until `shutdown` resolves. `clock` is the time source of the
/// memory store (the Redis store uses Redis `TIME`).
pub async fn serve(
    listeners: Listeners,
    settings: Settings,
    clock: Clock,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AppError> {
    let rules = load_rules(&settings)?;
    serve_loaded(listeners, settings, rules, clock, shutdown).await
}

async fn serve_loaded(
    listeners: Listeners,
    settings: Settings,
    loaded: LoadedRules,
    clock: Clock,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), AppError> {
    // store_startup_timeout_ms counts from here, before the store's first connection attempt.
    let started = tokio::time::Instant::now();
    let (handler, replicas, regional) = decision_side(&settings, loaded.set, &clock).await?;
    let grpc_addr = local_addr(&listeners.grpc, "gRPC", settings.grpc_addr)?;
    let admin_addr = local_addr(&listeners.admin, "admin", settings.admin_addr)?;

    // One shutdown signal fanned out to every task.
    let (stop_tx, stop_rx) = watch::channel(false);
    let reload_status = Arc::new(rules::reload::ReloadStatus::default());
    if settings.rules_xds_server.is_empty() {
        reload_status.loaded();
    }
    let counter_api = load::counter_api(&settings)?;
    let admin_state = Arc::new(AdminState {
        ready: false.into(),
        handler: handler.clone(),
        settings: settings.redacted(),
        reload: reload_status.clone(),
        counter_api: counter_api.clone(),
        ready_changed: tokio::sync::Notify::new(),
    });
    background::drain_on(
        shutdown,
        admin_state.clone(),
        Duration::from_millis(settings.drain_ms),
        stop_tx,
    );
    let tasks = background::Tasks::start(
        &settings,
        &handler,
        replicas,
        regional,
        (loaded.fingerprint, reload_status),
        &clock,
        &stop_rx,
    )
    .await?;

    let rlqs = crate::rlqs::Rlqs::new(
        configs::rlqs_config(&settings, clock.clone()),
        handler.metrics.rlqs.clone(),
    );
    let grpc = grpc::server(
        &settings,
        handler.clone(),
        rlqs,
        listeners.grpc,
        admin_state.clone(),
        stop_rx.clone(),
    )
    .await?;
    let admin = admin::serve(
        http_accept(listeners.admin, "admin", &settings, &handler.metrics),
        admin::router(admin_state.clone()),
        Duration::from_millis(settings.admin_header_timeout_ms),
        stopped(stop_rx.clone()),
    );

    admin_state.set_ready(true);
    let gated = readiness::announce(&settings, &handler, grpc_addr, admin_addr);
    let first_answer = readiness::first_store_answer(
        admin_state.clone(),
        gated,
        (
            started,
            Duration::from_millis(settings.store_startup_timeout_ms),
        ),
        stopped(stop_rx.clone()),
    );
    // If either server fails, stop the other too: a half-alive replica would stay "ready".
    let grpc = async { grpc.await.map_err(AppError::Grpc) };
    let admin = async { admin.await.map_err(AppError::Admin) };
    // Graceful shutdown waits for clients to close their connections; one that never does
    // must not keep the process alive past a bound.
    let servers = async { tokio::try_join!(grpc, admin, first_answer).map(|_| ()) };
    let deadline = async {
        stopped(stop_rx.clone()).await;
        tokio::time::sleep(CLOSE_DEADLINE).await;
    };
    tokio::select! {
        result = servers => result?,
        _ = deadline => tracing::warn!(
            "connections still open {} s after shutdown began; stopping anyway",
            CLOSE_DEADLINE.as_secs()
        ),
    }
    tasks.finish(&handler).await;
    tracing::info!("stopped");
    Ok(())
}

/// A region's shares of the global limits and the global store it exchanges them through.
pub(super) type Regional = (
    Arc<crate::regions::Shares>,
    Arc<dyn crate::regions::GlobalStore>,
);

/// The decision side: metrics, the rules, the store (a Redis that is down at startup is not an
/// error: it reconnects in the background and the fallback decides meanwhile; a bad URL is),
/// the global store when limits are shared across regions (likewise), the replica count and
/// the limiter, behind the request handler.
async fn decision_side(
    settings: &Settings,
    set: rules::RuleSet,
    clock: &Clock,
) -> Result<(Arc<Handler>, Arc<Replicas>, Option<Regional>), AppError> {
    let metrics = Arc::new(Metrics::new());
    metrics.rules_loaded.set(set.counts().2 as i64);
    let store = Store::connect(configs::store_config(settings), clock.clone(), &metrics).await?;
    let replicas = Arc::new(Replicas::new(
        settings.fallback_replicas,
        settings.fallback_min_replicas,
    ));
    metrics.replicas.set(replicas.count() as i64);
    let shared_store = store.name() != "memory";
    let regional = match configs::region_config(settings) {
        None => {
            if set.has_global_limits() {
                tracing::warn!(
                    "the rules have `global: true` limits but global_store is not set: each is enforced in this region alone, as an ordinary limit"
                );
            }
            None
        }
        Some((config, global)) => {
            // Its own metrics registry: the global store's calls are not the store's
            // (tollgate_store_* and its alerts stay about the region's own store); the
            // exchanges are counted in tollgate_region_*.
            let global = crate::store::redis::RedisStore::connect(global, &Metrics::new())
                .await
                .map_err(load::global_store_error)?;
            tracing::info!(
                region = %config.region,
                regions = ?config.regions,
                global_store = %config.global_store,
                exchange_ms = config.exchange.as_millis() as u64,
                lease_ms = config.lease.as_millis() as u64,
                "sharing global limits across regions: this region's share of each is agreed with the others through the global store"
            );
            let shares =
                crate::regions::Shares::new(config, clock.clone(), metrics.regions.clone());
            shares.set_rules_digest(set.global_digest());
            let global: Arc<dyn crate::regions::GlobalStore> = Arc::new(global);
            Some((Arc::new(shares), global))
        }
    };
    let mut config =
        configs::limiter_config(settings, replicas.clone(), clock.clone(), shared_store);
    config.regions = regional.as_ref().map(|(shares, _)| shares.clone());
    let limiter = Limiter::new(store, config, metrics.clone());
    if !shared_store && settings.lease_max_batch > 0 {
        tracing::info!(
            "lease_max_batch is set, but leasing is off on the memory store: one process is already exact"
        );
    }
    let handler = Arc::new(Handler {
        rules: Arc::new(ArcSwap::from_pointee(set)),
        limiter,
        metrics,
        bounds: configs::bounds(settings),
        headers: crate::service::response::HeaderOptions {
            response: settings.response_headers,
            request: settings.request_headers,
            every_limit: settings.headers_for_every_limit,
        },
        response_dynamic_metadata: settings.response_dynamic_metadata,
        admission: tokio::sync::Semaphore::new(settings.max_concurrent_requests),
        decision_margin: std::time::Duration::from_millis(settings.decision_margin_ms),
    });
    Ok((handler, replicas, regional))
}

/// An HTTP port's accept loop (admin, prometheus): at most `admin_max_connections` open, each
/// refused one counted as `<port>_connections` in `tollgate_refused_total`.
fn http_accept(
    listener: TcpListener,
    port: &'static str,
    settings: &Settings,
    metrics: &Metrics,
) -> crate::service::listener::Accept {
    let what = if port == "admin" {
        "admin_connections"
    } else {
        "prometheus_connections"
    };
    crate::service::listener::Accept::new(
        listener,
        crate::service::listener::Limits {
            port,
            max_connections: settings.admin_max_connections,
            handshake_timeout: None,
            refused: metrics
                .refused
                .get_or_create(&crate::telemetry::RefusedLabels { what })
                .clone(),
        },
    )
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, AppError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| AppError::Bind { what, addr, source })
}

/// The address a listener is bound to (the configured one may say port 0).
fn local_addr(
    listener: &TcpListener,
    what: &'static str,
    configured: SocketAddr,
) -> Result<SocketAddr, AppError> {
    listener.local_addr().map_err(|source| AppError::Bind {
        what,
        addr: configured,
        source,
    })
}
