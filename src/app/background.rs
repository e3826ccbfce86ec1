//! The tasks that run beside the two servers, and how they end.
//!
//! [`drain_on`] turns the shutdown signal into: unready, `drain_ms` of serving still, then the
//! stop every task watches. [`Tasks::start`] starts the limiter's housekeeping and the fleet
//! membership heartbeat (on the clock, so a test's manual clock drives them), the regions'
//! exchange of global-limit demand (with `global_store`), the rules' reloads (a file watch or the xDS stream), and the reference's telemetry (statsd counters,
//! its Prometheus port). [`Tasks::finish`], after the servers stopped, gives unspent leased
//! tokens back, leaves the membership set and sends the last statsd counts, each bounded: the
//! store may be down.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::load::{load_options, reference_mapper};
use super::{AppError, bind, http_accept, local_addr, stopped};
use crate::admin::{self, AdminState};
use crate::clock::Clock;
use crate::configs;
use crate::fleet;
use crate::fleet::Replicas;
use crate::rules;
use crate::service::Handler;
use crate::settings::{Settings, SettingsError};
use crate::telemetry;

/// On `shutdown`: unready first and keep serving for `drain`, so load balancers and Envoy move
/// to other replicas before the listeners close; then `stop` every task (the servers drain
/// what is in flight).
pub(super) fn drain_on(
    shutdown: impl Future<Output = ()> + Send + 'static,
    admin_state: Arc<AdminState>,
    drain: Duration,
    stop: watch::Sender<bool>,
) {
    tokio::spawn(async move {
        shutdown.await;
        admin_state.set_ready(false);
        if !drain.is_zero() {
            tracing::info!(
                drain_ms = drain.as_millis() as u64,
                "shutting down: unready, still serving"
            );
            tokio::time::sleep(drain).await;
        }
        tracing::info!("shutting down: draining requests in flight");
        let _ = stop.send(true);
    });
}

/// An HTTP server's task (the reference's Prometheus port).
type Server = JoinHandle<std::io::Result<()>>;

/// The background tasks waited for at the end.
pub(super) struct Tasks {
    membership: JoinHandle<()>,
    reference_prometheus: Option<Server>,
    statsd: Option<JoinHandle<()>>,
}

impl Tasks {
    /// Starts every background task; `reload` is the startup rules' fingerprint and the
    /// status `/readyz` reports of their reloads.
    pub(super) async fn start(
        settings: &Settings,
        handler: &Arc<Handler>,
        replicas: Arc<Replicas>,
        regional: Option<super::Regional>,
        reload: (rules::reload::Fingerprint, Arc<rules::reload::ReloadStatus>),
        clock: &Clock,
        stop: &watch::Receiver<bool>,
    ) -> Result<Tasks, AppError> {
        // Background work of the decision side runs on the clock, as the limiter's own does
        // (claims sent ahead): a test's manual clock drives housekeeping and heartbeats too.
        clock.spawn({
            let handler = handler.clone();
            let stop = stopped(stop.clone());
            async move { handler.limiter.housekeeping(stop).await }
        });
        watch_rules(settings, handler, reload, stop);
        let (reference_prometheus, statsd) = reference_telemetry(settings, handler, stop).await?;
        let membership = clock.spawn({
            let (handler, clock) = (handler.clone(), clock.clone());
            let stop = stopped(stop.clone());
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
        // Global limits: this region's shares exchanged with the other regions' demand.
        if let Some((shares, global)) = regional {
            let (clock2, store) = (clock.clone(), handler.limiter.store_handle());
            let stop = stopped(stop.clone());
            // The digest of the global limits in force, worked out again only after a reload.
            let rules = handler.rules.clone();
            let mut last: Option<(Arc<crate::rules::RuleSet>, String)> = None;
            let digest = move || {
                let set = rules.load_full();
                match &last {
                    Some((seen, digest)) if Arc::ptr_eq(seen, &set) => digest.clone(),
                    _ => {
                        let digest = set.global_digest();
                        last = Some((set, digest.clone()));
                        digest
                    }
                }
            };
            clock.spawn(async move {
                crate::regions::run(shares, global, store, digest, clock2, stop).await
            });
        }
        // With the counter API on, this replica follows the fleet's reset log (every replica
        // of a fleet has the same settings): what it holds of a bucket reset anywhere goes.
        if !settings.counter_api_token_file.is_empty() {
            clock.spawn({
                let (handler, clock) = (handler.clone(), clock.clone());
                let stop = stopped(stop.clone());
                let key = format!("{}{{members}}", settings.key_prefix);
                let interval = Duration::from_millis(settings.membership_interval_ms);
                async move {
                    crate::counter_api::follow_resets(
                        &handler.limiter,
                        &key,
                        interval,
                        &clock,
                        stop,
                    )
                    .await
                }
            });
        }
        Ok(Tasks {
            membership,
            reference_prometheus,
            statsd,
        })
    }

    /// After the servers stopped: leased tokens back, the membership left, the last sends.
    pub(super) async fn finish(self, handler: &Handler) {
        // Give unspent leased tokens back, so the fleet can spend them (bounded: the store may
        // be down, and then they expire with their leases).
        match tokio::time::timeout(Duration::from_secs(2), handler.limiter.return_leases()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(tokens = n, "gave unspent leased tokens back"),
            Err(_) => {
                tracing::warn!("giving leased tokens back timed out; they expire with their leases")
            }
        }
        // Leave the membership set, so the others' share grows at once (bounded: the store
        // may be down).
        let _ = tokio::time::timeout(Duration::from_secs(2), self.membership).await;
        if let Some(server) = self.reference_prometheus {
            let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
        }
        // The last statsd send: what was counted since the previous one.
        if let Some(statsd) = self.statsd {
            let _ = tokio::time::timeout(Duration::from_secs(2), statsd).await;
        }
    }
}

/// The rules' reloads: from the xDS server when one is set, else from the rules path every
/// `reload_interval_ms` (0: never).
fn watch_rules(
    settings: &Settings,
    handler: &Handler,
    (fingerprint, status): (rules::reload::Fingerprint, Arc<rules::reload::ReloadStatus>),
    stop: &watch::Receiver<bool>,
) {
    let reloaded = rules::reload::Reloaded {
        rules: handler.rules.clone(),
        metrics: handler.metrics.clone(),
        status,
    };
    if !settings.rules_xds_server.is_empty() {
        tokio::spawn(rules::xds::watch(
            configs::xds_source(settings),
            load_options(settings),
            reloaded,
            stopped(stop.clone()),
        ));
    } else if settings.reload_interval_ms > 0 {
        tokio::spawn(rules::reload::watch(
            settings.rules.clone(),
            fingerprint,
            load_options(settings),
            reloaded,
            Duration::from_millis(settings.reload_interval_ms),
            stopped(stop.clone()),
        ));
    }
}

/// The reference's per-rule counters: counted from now on, sent to statsd off the request
/// path (and once more at shutdown), and served on the reference's Prometheus port; both read
/// the same counters.
async fn reference_telemetry(
    settings: &Settings,
    handler: &Handler,
    stop: &watch::Receiver<bool>,
) -> Result<(Option<Server>, Option<JoinHandle<()>>), AppError> {
    if !settings.statsd_addr.is_empty() || !settings.prometheus_addr.is_empty() {
        handler.metrics.statsd.enable();
        if settings.rules_xds_server.is_empty() {
            handler.metrics.statsd.loaded_at_start();
        }
    }
    let prometheus = if settings.prometheus_addr.is_empty() {
        None
    } else {
        let addr: SocketAddr = settings.prometheus_addr.parse().map_err(|_| {
            AppError::Settings(SettingsError::Invalid {
                key: "prometheus_addr",
                message: format!("{}: expected ip:port", settings.prometheus_addr),
            })
        })?;
        let mapper = reference_mapper(settings)?;
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
            http_accept(listener, "prometheus", settings, &handler.metrics),
            router,
            Duration::from_millis(settings.admin_header_timeout_ms),
            stopped(stop.clone()),
        )))
    };
    let statsd = (!settings.statsd_addr.is_empty()).then(|| {
        tracing::info!(statsd_addr = %settings.statsd_addr, flush_interval_ms = settings.statsd_flush_interval_ms, "sending the reference's counters to statsd");
        tokio::spawn(telemetry::statsd::run(
            handler.metrics.clone(),
            telemetry::statsd::Target::parse(&settings.statsd_addr),
            Duration::from_millis(settings.statsd_flush_interval_ms),
            stopped(stop.clone()),
        ))
    });
    Ok((prometheus, statsd))
}
