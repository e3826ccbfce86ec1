//! Wiring: settings → rules, store, limiter → the gRPC and admin servers, until shutdown.
//!
//! [`serve`] takes listeners that are already bound, the clock and the shutdown signal as a
//! future (as mini-redis does), so tests bind port 0 themselves, drive time where it helps and
//! decide when to stop; [`run`] binds the configured addresses and calls it (what `tollgate
//! serve` does). Order matters: the rules are loaded and both ports bound before `/readyz`
//! turns 200; on shutdown readiness drops first, then both servers drain the requests in
//! flight.

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
use crate::fleet;
use crate::limiter::{Limiter, Replicas};
use crate::rules::{self, LoadOptions, RulesError};
use crate::service::Handler;
use crate::settings::{self, Settings, SettingsError, Sources};
use crate::store::{Store, StoreError};
use crate::telemetry::{self, Metrics, TelemetryError};

mod grpc;
mod shutdown;

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

/// Reads every file a setting names (the gRPC port's TLS files; the store's TLS files and
/// password file) and checks what it holds, without binding or connecting anything: `serve`
/// reads them again when it starts the parts.
fn check_files(settings: &Settings) -> Result<(), AppError> {
    crate::service::tls::server_config(&configs::grpc_tls_files(settings))?;
    Store::check(&configs::store_config(settings))?;
    reference_mapper(settings)?;
    Ok(())
}

/// The statsd exporter mapping of the reference's Prometheus port: the file `prometheus_mapper`
/// names, else the reference's default.
fn reference_mapper(settings: &Settings) -> Result<telemetry::reference_metrics::Mapper, AppError> {
    use telemetry::reference_metrics::Mapper;
    let path = &settings.prometheus_mapper;
    if path.is_empty() {
        return Ok(Mapper::reference_default());
    }
    let fail = |error: String| AppError::PrometheusMapper {
        path: path.clone(),
        error,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    Mapper::from_yaml(&text).map_err(fail)
}

/// The rules at startup, and the fingerprint taken just before reading them (see `reload.rs`).
struct LoadedRules {
    set: rules::RuleSet,
    fingerprint: rules::reload::Fingerprint,
}

fn load_rules(settings: &Settings) -> Result<LoadedRules, AppError> {
    if !settings.rules_xds_server.is_empty() {
        // The rules are the xDS server's: none until its first snapshot (`rules::xds`).
        tracing::info!(server = %settings.rules_xds_server, node = %settings.rules_xds_node_id, "rules from xDS: none until the first snapshot");
        return Ok(LoadedRules {
            set: rules::RuleSet::default(),
            fingerprint: Vec::new(),
        });
    }
    let fingerprint = rules::reload::fingerprint(&settings.rules);
    let set = rules::load_path(&settings.rules, load_options(settings))?;
    for w in &set.warnings {
        tracing::warn!("{w}");
    }
    let (domains, _, limits) = set.counts();
    tracing::info!(path = %settings.rules.display(), domains, limits, "rules loaded");
    Ok(LoadedRules { set, fingerprint })
}

fn load_options(settings: &Settings) -> LoadOptions {
    LoadOptions {
        default_algorithm: settings.default_algorithm,
        sliding_log_max_limit: settings.sliding_log_max_limit,
        rlqs_report_interval_ms: settings.rlqs_report_interval_ms,
    }
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
    let metrics = Arc::new(Metrics::new());
    metrics.rules_loaded.set(loaded.set.counts().2 as i64);
    let rules = Arc::new(ArcSwap::from_pointee(loaded.set));

    // A Redis that is down at startup is not an error (the store reconnects in the background
    // and the fallback decides meanwhile); a bad URL is.
    let store = Store::connect(configs::store_config(&settings), clock.clone(), &metrics).await?;
    let replicas = Arc::new(Replicas::new(
        settings.fallback_replicas,
        settings.fallback_min_replicas,
    ));
    metrics.replicas.set(replicas.count() as i64);
    let shared_store = store.name() != "memory";
    let limiter = Limiter::new(
        store,
        configs::limiter_config(&settings, replicas.clone(), clock.clone(), shared_store),
        metrics.clone(),
    );
    if !shared_store && settings.lease_max_batch > 0 {
        tracing::info!(
            "lease_max_batch is set, but leasing is off on the memory store: one process is already exact"
        );
    }
    let handler = Arc::new(Handler {
        rules: rules.clone(),
        limiter,
        metrics: metrics.clone(),
        bounds: configs::bounds(&settings),
        response_headers: settings.response_headers,
        response_dynamic_metadata: settings.response_dynamic_metadata,
        admission: tokio::sync::Semaphore::new(settings.max_concurrent_requests),
    });
    let grpc_addr = local_addr(&listeners.grpc, "gRPC", settings.grpc_addr)?;
    let admin_addr = local_addr(&listeners.admin, "admin", settings.admin_addr)?;

    // One shutdown signal fanned out to every task.
    let (stop_tx, stop_rx) = watch::channel(false);
    let reload_status = Arc::new(rules::reload::ReloadStatus::default());
    let from_xds = !settings.rules_xds_server.is_empty();
    if !from_xds {
        reload_status.loaded();
    }
    let admin_state = Arc::new(AdminState {
        ready: false.into(),
        handler: handler.clone(),
        settings: settings.redacted(),
        reload: reload_status.clone(),
    });
    {
        let admin_state = admin_state.clone();
        let drain = Duration::from_millis(settings.drain_ms);
        tokio::spawn(async move {
            shutdown.await;
            // Unready first and keep serving for `drain_ms`, so load balancers and Envoy move
            // to other replicas before the listeners close; then drain what is in flight.
            admin_state.set_ready(false);
            if !drain.is_zero() {
                tracing::info!(
                    drain_ms = drain.as_millis() as u64,
                    "shutting down: unready, still serving"
                );
                tokio::time::sleep(drain).await;
            }
            tracing::info!("shutting down: draining requests in flight");
            let _ = stop_tx.send(true);
        });
    }

    // Background work of the decision side runs on the clock, as the limiter's own does (claims
    // sent ahead): a test's manual clock drives housekeeping and heartbeats too.
    clock.spawn({
        let handler = handler.clone();
        let stop = stopped(stop_rx.clone());
        async move { handler.limiter.housekeeping(stop).await }
    });
    if from_xds {
        tokio::spawn(rules::xds::watch(
            configs::xds_source(&settings),
            load_options(&settings),
            rules::reload::Reloaded {
                rules,
                metrics,
                status: reload_status,
            },
            stopped(stop_rx.clone()),
        ));
    } else if settings.reload_interval_ms > 0 {
        tokio::spawn(rules::reload::watch(
            settings.rules.clone(),
            loaded.fingerprint,
            load_options(&settings),
            rules::reload::Reloaded {
                rules,
                metrics,
                status: reload_status,
            },
            Duration::from_millis(settings.reload_interval_ms),
            stopped(stop_rx.clone()),
        ));
    }

    // The reference's per-rule counters to statsd: counted from now on, sent off the request
    // path, and once more at shutdown.
    // Both the statsd sink and the reference's Prometheus port read the statsd counters.
    if !settings.statsd_addr.is_empty() || !settings.prometheus_addr.is_empty() {
        handler.metrics.statsd.enable();
        if !from_xds {
            handler.metrics.statsd.loaded_at_start();
        }
    }
    let reference_prometheus = if settings.prometheus_addr.is_empty() {
        None
    } else {
        let addr: SocketAddr = settings.prometheus_addr.parse().map_err(|_| {
            AppError::Settings(SettingsError::Invalid {
                key: "prometheus_addr",
                message: format!("{}: expected ip:port", settings.prometheus_addr),
            })
        })?;
        let mapper = reference_mapper(&settings)?;
        handler
            .metrics
            .statsd
            .response_times
            .set_scale(mapper.response_time_scale());
        let listener = bind("prometheus", addr).await?;
        let bound = local_addr(&listener, "prometheus", addr)?;
        tracing::info!(prometheus_addr = %bound, path = %settings.prometheus_path, "serving the reference's Prometheus metrics");
        let router = admin::reference_metrics_router(
            handler.metrics.clone(),
            Arc::new(mapper),
            &settings.prometheus_path,
        );
        Some(tokio::spawn(admin::serve(
            http_accept(listener, "prometheus", &settings, &handler.metrics),
            router,
            Duration::from_millis(settings.admin_header_timeout_ms),
            stopped(stop_rx.clone()),
        )))
    };
    let statsd = (!settings.statsd_addr.is_empty()).then(|| {
        tracing::info!(statsd_addr = %settings.statsd_addr, flush_interval_ms = settings.statsd_flush_interval_ms, "sending the reference's counters to statsd");
        tokio::spawn(telemetry::statsd::run(
            handler.metrics.clone(),
            telemetry::statsd::Target::parse(&settings.statsd_addr),
            Duration::from_millis(settings.statsd_flush_interval_ms),
            stopped(stop_rx.clone()),
        ))
    });
    let membership = clock.spawn({
        let (handler, clock) = (handler.clone(), clock.clone());
        let stop = stopped(stop_rx.clone());
        let key = format!("{}{{members}}", settings.key_prefix);
        let interval = Duration::from_millis(settings.membership_interval_ms);
        async move {
            fleet::membership(
                handler.limiter.store(),
                &replicas,
                &handler.metrics,
                fleet::MembershipConfig {
                    key,
                    replica: fleet::replica_id(),
                    interval,
                },
                &clock,
                stop,
            )
            .await
        }
    });

    let rlqs = crate::rlqs::Rlqs::new(
        configs::rlqs_config(&settings, clock.clone()),
        handler.metrics.rlqs.clone(),
    );
    let grpc = grpc::server(
        &settings,
        handler.clone(),
        rlqs,
        listeners.grpc,
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
    // "ready" only when /readyz says so: with no rules and unready_without_rules it answers 503,
    // and until the store first answered with unready_until_store_answers.
    let store_name = handler.limiter.store().name();
    let gated = settings.unready_until_store_answers && !handler.limiter.store().answered_once();
    if settings.unready_without_rules && handler.rules.load().counts().0 == 0 {
        tracing::warn!(%grpc_addr, %admin_addr, store = store_name, "tollgate listening, not ready: no rules loaded (unready_without_rules)");
    } else if gated {
        let error = handler.limiter.store().connect_error().unwrap_or_default();
        tracing::warn!(%grpc_addr, %admin_addr, store = store_name, %error, "tollgate listening, not ready until the store answers (unready_until_store_answers)");
    } else {
        tracing::info!(%grpc_addr, %admin_addr, store = store_name, "tollgate ready");
    }
    let first_answer = first_store_answer(
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
    // Give unspent leased tokens back, so the fleet can spend them (bounded: the store may be
    // down, and then they expire with their leases).
    match tokio::time::timeout(Duration::from_secs(2), handler.limiter.return_leases()).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(tokens = n, "gave unspent leased tokens back"),
        Err(_) => {
            tracing::warn!("giving leased tokens back timed out; they expire with their leases")
        }
    }
    // Leave the membership set, so the others' share grows at once (bounded: the store may
    // be down).
    let _ = tokio::time::timeout(Duration::from_secs(2), membership).await;
    if let Some(server) = reference_prometheus {
        let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    }
    // The last statsd send: what was counted since the previous one.
    if let Some(statsd) = statsd {
        let _ = tokio::time::timeout(Duration::from_secs(2), statsd).await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Waits for the store's first answer: says when the replica becomes ready (`gated`: it was
/// not, for want of one), or fails with the last connection error when `timeout` (not zero)
/// passes first, which stops tollgate: a crash loop is what an operator sees, as the
/// reference's `REDIS_STARTUP_MAX_ELAPSED_TIME` gives.
async fn first_store_answer(
    admin: Arc<AdminState>,
    gated: bool,
    (started, timeout): (tokio::time::Instant, Duration),
    stop: impl Future<Output = ()>,
) -> Result<(), AppError> {
    let store = admin.handler.limiter.store();
    tokio::pin!(stop);
    while !store.answered_once() {
        // Once shutdown began (unready, draining) there is nothing to give up on.
        if !admin.ready.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(());
        }
        if !timeout.is_zero() && started.elapsed() >= timeout {
            return Err(AppError::StoreNeverAnswered {
                waited: timeout,
                error: store.connect_error().unwrap_or_default(),
            });
        }
        tokio::select! {
            _ = &mut stop => return Ok(()),
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    if gated {
        tracing::info!(store = store.name(), "the store answered: tollgate ready");
    }
    Ok(())
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
