//! What `serve` reads before it binds anything: the rules (or none, until the xDS server's
//! first snapshot) with the fingerprint reloads compare against, and every file a setting
//! names, so a broken rules file, a missing certificate or a bad metrics mapping is reported
//! before any port is taken.

use super::AppError;
use crate::configs;
use crate::rules::{self, LoadOptions};
use crate::settings::Settings;
use crate::store::Store;
use crate::telemetry;

/// A global store's error, saying which store it is.
pub(super) fn global_store_error(mut e: crate::store::StoreError) -> crate::store::StoreError {
    e.message = format!("global_store: {}", e.message);
    e
}

/// Reads every file a setting names (the gRPC port's TLS files; the store's TLS files and
/// password file; the counter API's token file) and checks what it holds, without binding or connecting anything: `serve`
/// reads them again when it starts the parts.
pub(super) fn check_files(settings: &Settings) -> Result<(), AppError> {
    crate::service::tls::server_config(&configs::grpc_tls_files(settings))?;
    Store::check(&configs::store_config(settings))?;
    if let Some((_, global)) = configs::region_config(settings) {
        crate::store::redis::RedisStore::check(&global).map_err(global_store_error)?;
    }
    reference_mapper(settings)?;
    counter_api(settings)?;
    Ok(())
}

/// The counter API's config when `counter_api_token_file` is set; its token file must be
/// readable and hold a token now (a typo in the path stops the rollout, rather than failing
/// the first support call).
pub(super) fn counter_api(
    settings: &Settings,
) -> Result<Option<crate::counter_api::CounterApi>, AppError> {
    if settings.counter_api_token_file.is_empty() {
        return Ok(None);
    }
    let token_file = std::path::PathBuf::from(&settings.counter_api_token_file);
    crate::counter_api::read_token(&token_file).map_err(|message| {
        AppError::Settings(crate::settings::SettingsError::Invalid {
            key: "counter_api_token_file",
            message,
        })
    })?;
    Ok(Some(crate::counter_api::CounterApi {
        token_file,
        members_key: format!("{}{{members}}", settings.key_prefix),
    }))
}

/// The statsd exporter mapping of the reference's Prometheus port: the file `prometheus_mapper`
/// names, else the reference's default.
pub(super) fn reference_mapper(
    settings: &Settings,
) -> Result<telemetry::reference_metrics::Mapper, AppError> {
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
    let (mapper, unread) = Mapper::from_yaml_noting(&text).map_err(fail)?;
    if !unread.is_empty() {
        tracing::warn!(
            path = %path,
            at = %unread.join(", "),
            "prometheus_mapper: histogram_options is not read: the histograms have Prometheus's default buckets"
        );
    }
    Ok(mapper)
}

/// The rules at startup, and the fingerprint taken just before reading them (see `reload.rs`).
pub(super) struct LoadedRules {
    pub(super) set: rules::RuleSet,
    pub(super) fingerprint: rules::reload::Fingerprint,
}

pub(super) fn load_rules(settings: &Settings) -> Result<LoadedRules, AppError> {
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

pub(super) fn load_options(settings: &Settings) -> LoadOptions {
    LoadOptions {
        default_algorithm: settings.default_algorithm,
        sliding_log_max_limit: settings.sliding_log_max_limit,
        rlqs_report_interval_ms: settings.rlqs_report_interval_ms,
    }
}
