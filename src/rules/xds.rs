//! Rules over xDS: the rule set from a management server (Envoy Gateway's, or any ADS server)
//! instead of files, as envoyproxy/ratelimit's `CONFIG_TYPE=GRPC_XDS_SOTW` takes it.
//!
//! Data flows in a loop: connect to `rules_xds_server` (TLS when its files are set) → open the
//! Aggregated Discovery Service stream (state of the world) and ask for every
//! `RateLimitConfig` for node `rules_xds_node_id` → each response is the whole rule set: its
//! configs become rules sources (one per config, named `xds:<name>`, as JSON, which the YAML
//! reader reads) and are validated by the same code as files ([`load_sources`]) → a valid set
//! is swapped in at once and ACKed with its version; a refused one is NACKed with every error
//! (the version in force stays, and keeps serving). A lost stream reconnects after a backoff
//! (0.5 s doubling to 30 s); the last good rules serve meanwhile. `/readyz` and `/config` show
//! the version in force and when it arrived (`ReloadStatus`).

use std::path::PathBuf;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::rpc::Status;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitUnit,
};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::load::load_sources;
use super::model::{LoadOptions, RuleSet};
use super::reload::{Reloaded, refuse, swap_in};

/// The resource type the reference's xDS client asks for.
pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Where the rules come from, and how to reach it.
#[derive(Clone, Debug)]
pub struct XdsSource {
    /// `host:port`, or a URL (`http://`, `https://`).
    pub server: String,
    pub node_id: String,
    /// PEM files: the server's CA, and a client certificate and key (mutual TLS), each
    /// optional; TLS is on when any is set.
    pub tls_ca: String,
    pub tls_cert: String,
    pub tls_key: String,
}

/// The rule set of one xDS response: every resource must be a `RateLimitConfig`; each is
/// checked as a rules file would be (errors name `xds:<config name>` and the field).
pub fn rule_set(resources: &[Any], opts: LoadOptions) -> Result<RuleSet, String> {
    let mut sources = Vec::new();
    for (i, any) in resources.iter().enumerate() {
        if any.type_url != TYPE_URL {
            return Err(format!(
                "resource {i}: type {} is not {TYPE_URL}",
                any.type_url
            ));
        }
        let config: RateLimitConfig = prost::Message::decode(any.value.as_slice())
            .map_err(|e| format!("resource {i}: not a RateLimitConfig: {e}"))?;
        let name = if config.name.is_empty() {
            format!("resource-{i}")
        } else {
            config.name.clone()
        };
        let text = serde_json::to_string_pretty(&config_json(&config)).unwrap_or_default();
        sources.push((PathBuf::from(format!("xds:{name}")), text));
    }
    load_sources(&sources, opts).map_err(|e| e.to_string())
}

/// A `RateLimitConfig` in the rules files' shape (JSON is YAML): the same fields, the same
/// names.
fn config_json(config: &RateLimitConfig) -> Value {
    json!({
        "domain": config.domain,
        "descriptors": config.descriptors.iter().map(descriptor_json).collect::<Vec<_>>(),
    })
}

fn descriptor_json(d: &RateLimitDescriptor) -> Value {
    let mut out = json!({ "key": d.key });
    if !d.value.is_empty() {
        out["value"] = json!(d.value);
    }
    if let Some(policy) = &d.rate_limit {
        let mut limit = json!({});
        if let Ok(unit) = RateLimitUnit::try_from(policy.unit)
            && unit != RateLimitUnit::Unknown
        {
            limit["unit"] = json!(unit.as_str_name().to_ascii_lowercase());
        }
        if policy.requests_per_unit > 0 || !policy.unlimited {
            limit["requests_per_unit"] = json!(policy.requests_per_unit);
        }
        if policy.unlimited {
            limit["unlimited"] = json!(true);
        }
        if !policy.name.is_empty() {
            limit["name"] = json!(policy.name);
        }
        if !policy.replaces.is_empty() {
            limit["replaces"] = policy
                .replaces
                .iter()
                .map(|r| json!({ "name": r.name }))
                .collect();
        }
        out["rate_limit"] = limit;
    }
    if !d.descriptors.is_empty() {
        out["descriptors"] = d.descriptors.iter().map(descriptor_json).collect();
    }
    if let Some(metadata) = &d.metadata {
        out["metadata"] = crate::structpb::from_struct(metadata);
    }
    for (field, on) in [
        ("shadow_mode", d.shadow_mode),
        ("detailed_metric", d.detailed_metric),
        ("quota_mode", d.quota_mode),
    ] {
        if on {
            out[field] = json!(true);
        }
    }
    out
}

/// Follows the xDS server until `shutdown` resolves: each valid snapshot is swapped into
/// `into` and ACKed, each refused one NACKed (see the module doc).
pub async fn watch(
    source: XdsSource,
    opts: LoadOptions,
    into: Reloaded,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut backoff = Duration::from_millis(500);
    // The version in force, for NACKs and for a reconnect's first request.
    let mut version = String::new();
    loop {
        let started = tokio::time::Instant::now();
        tokio::select! {
            _ = &mut shutdown => return,
            ended = follow(&source, opts, &into, &mut version) => {
                tracing::warn!(server = %source.server, "rules xDS stream ended, the rules in force stay: {ended}");
            }
        }
        // A stream that lived a while was healthy: start the backoff over.
        if started.elapsed() > Duration::from_secs(30) {
            backoff = Duration::from_millis(500);
        }
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

/// One connection and stream, until it fails: why.
async fn follow(
    source: &XdsSource,
    opts: LoadOptions,
    into: &Reloaded,
    version: &mut String,
) -> String {
    let channel = match connect(source).await {
        Ok(channel) => channel,
        Err(e) => return e,
    };
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let (tx, rx) = mpsc::channel::<DiscoveryRequest>(4);
    let node = Node {
        id: source.node_id.clone(),
        ..Node::default()
    };
    let request = |version: &str, nonce: &str, error: Option<String>| DiscoveryRequest {
        version_info: version.to_string(),
        node: Some(node.clone()),
        type_url: TYPE_URL.to_string(),
        response_nonce: nonce.to_string(),
        error_detail: error.map(|message| Status {
            // INVALID_ARGUMENT, as the reference NACKs.
            code: 3,
            message,
            details: Vec::new(),
        }),
        ..DiscoveryRequest::default()
    };
    let _ = tx.send(request(version, "", None)).await;
    let outbound =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut inbound = match client.stream_aggregated_resources(outbound).await {
        Ok(response) => response.into_inner(),
        Err(status) => return format!("the server refused the stream: {status}"),
    };
    tracing::info!(server = %source.server, node = %source.node_id, "rules xDS stream open");
    loop {
        let response: DiscoveryResponse = match inbound.next().await {
            Some(Ok(response)) => response,
            Some(Err(status)) => return format!("{status}"),
            None => return "closed by the server".to_string(),
        };
        if response.type_url != TYPE_URL {
            // Not ours (an ADS server may push other types): NACK it, keep what is in force.
            let error = format!("type {} is not {TYPE_URL}", response.type_url);
            let _ = tx
                .send(request(version, &response.nonce, Some(error)))
                .await;
            continue;
        }
        let label = format!("xds version {}", response.version_info);
        let reply = match rule_set(&response.resources, opts) {
            Ok(set) => {
                for w in &set.warnings {
                    tracing::warn!(version = %response.version_info, "{w}");
                }
                swap_in(set, &label, &into.rules, &into.metrics, &into.status);
                into.status.version(&response.version_info);
                *version = response.version_info.clone();
                request(version, &response.nonce, None)
            }
            Err(e) => {
                refuse(&label, &e, &into.metrics, &into.status);
                request(version, &response.nonce, Some(e))
            }
        };
        if tx.send(reply).await.is_err() {
            return "the request stream closed".to_string();
        }
    }
}

/// A channel to the server: plain, or TLS with the CA and client identity the files give.
async fn connect(source: &XdsSource) -> Result<tonic::transport::Channel, String> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let tls = !(source.tls_ca.is_empty() && source.tls_cert.is_empty());
    let url = if source.server.contains("://") {
        source.server.clone()
    } else if tls {
        format!("https://{}", source.server)
    } else {
        format!("http://{}", source.server)
    };
    let read = |path: &str| std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"));
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| format!("rules_xds_server {url}: {e}"))?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    if tls {
        let mut config = ClientTlsConfig::new();
        if !source.tls_ca.is_empty() {
            config = config.ca_certificate(Certificate::from_pem(read(&source.tls_ca)?));
        }
        if !source.tls_cert.is_empty() {
            config = config.identity(Identity::from_pem(
                read(&source.tls_cert)?,
                read(&source.tls_key)?,
            ));
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| format!("TLS to {url}: {e}"))?;
    }
    endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::ratelimit::config::ratelimit::v3::{RateLimitPolicy, RateLimitReplace};

    use super::*;

    fn any(config: &RateLimitConfig) -> Any {
        Any {
            type_url: TYPE_URL.to_string(),
            value: prost::Message::encode_to_vec(config),
        }
    }

    fn limit(unit: RateLimitUnit, requests_per_unit: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit,
            ..RateLimitPolicy::default()
        })
    }

    #[test]
    fn a_snapshot_becomes_the_rules_the_same_yaml_would() {
        let config = RateLimitConfig {
            name: "edge-config".into(),
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "tenant".into(),
                rate_limit: limit(RateLimitUnit::Minute, 10),
                descriptors: vec![RateLimitDescriptor {
                    key: "path".into(),
                    value: "/login".into(),
                    rate_limit: Some(RateLimitPolicy {
                        unit: RateLimitUnit::Hour as i32,
                        requests_per_unit: 5,
                        name: "login".into(),
                        replaces: vec![RateLimitReplace {
                            name: "other".into(),
                        }],
                        ..RateLimitPolicy::default()
                    }),
                    shadow_mode: true,
                    ..RateLimitDescriptor::default()
                }],
                ..RateLimitDescriptor::default()
            }],
        };
        let from_xds = rule_set(&[any(&config)], LoadOptions::default()).unwrap();
        let yaml = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 10}\n    descriptors:\n      - key: path\n        value: /login\n        shadow_mode: true\n        rate_limit: {unit: hour, requests_per_unit: 5, name: login, replaces: [{name: other}]}\n";
        let from_file = load_sources(
            &[(PathBuf::from("edge.yaml"), yaml.to_string())],
            LoadOptions::default(),
        )
        .unwrap();
        assert_eq!(from_xds.counts(), from_file.counts());
        assert_eq!(
            from_xds.summary().to_string(),
            from_file.summary().to_string()
        );
        assert_eq!(from_xds.files, vec![PathBuf::from("xds:edge-config")]);
    }

    #[test]
    fn quota_mode_and_metadata_come_through_as_from_a_file() {
        use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
        let text = |s: &str| Value {
            kind: Some(Kind::StringValue(s.into())),
        };
        let config = RateLimitConfig {
            name: "budgets".into(),
            domain: "budgets".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "user".into(),
                rate_limit: limit(RateLimitUnit::Hour, 1),
                quota_mode: true,
                metadata: Some(Struct {
                    fields: [("tier".to_string(), text("gold"))].into(),
                }),
                ..RateLimitDescriptor::default()
            }],
        };
        let rules = rule_set(&[any(&config)], LoadOptions::default()).unwrap();
        let user = &rules.domains["budgets"].root.bare["user"];
        let limit = &user.limits[0];
        assert!(limit.quota_mode);
        assert_eq!(
            limit.metadata.as_deref(),
            Some(&serde_json::json!({"tier": "gold"}))
        );
    }

    #[test]
    fn a_bad_snapshot_is_refused_naming_the_config() {
        let good = RateLimitConfig {
            name: "a".into(),
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "tenant".into(),
                rate_limit: limit(RateLimitUnit::Second, 1),
                ..RateLimitDescriptor::default()
            }],
        };
        // No unit: refused as the same rule in a file would be.
        let bad = RateLimitConfig {
            name: "b".into(),
            domain: "api".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "tenant".into(),
                rate_limit: limit(RateLimitUnit::Unknown, 1),
                ..RateLimitDescriptor::default()
            }],
        };
        let e = rule_set(&[any(&good), any(&bad)], LoadOptions::default()).unwrap_err();
        assert!(e.contains("xds:b") && e.contains("unit"), "{e}");
        // The same domain in two configs, as in two files.
        let twice = rule_set(&[any(&good), any(&good)], LoadOptions::default()).unwrap_err();
        assert!(twice.contains("already defined in xds:a"), "{twice}");
        let wrong = Any {
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
            value: Vec::new(),
        };
        assert!(rule_set(&[wrong], LoadOptions::default()).is_err());
    }
}
