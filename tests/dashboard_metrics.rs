//! The alerts and the dashboard the chart ships (`charts/tollgate/files/`) query tollgate's
//! metrics by name. This test runs a tollgate with every feature that adds metrics switched on
//! (a real Redis store, leasing, a sharded key with the retry, membership, the fallback),
//! drives traffic through each of them, kills Redis so the fallback and error families appear,
//! reloads the rules, then scrapes `/metrics` and checks that every `tollgate_*` name the
//! alerts and the dashboard use is exposed. A renamed metric then fails here instead of
//! silently emptying a panel or muting an alert.
//!
//! Labelled families without samples are not rendered at all, which is why each feature has
//! to see traffic before the scrape.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::inproc::InProcess;
use common::redis::{TestRedis, unique_prefix};
use common::{get, poll, request};

const RULES: &str = "domain: dash
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 4, shards: 4}
";

const FILES: [&str; 2] = [
    "charts/tollgate/files/tollgate-alerts.yaml",
    "charts/tollgate/files/tollgate-dashboard.json",
];

/// Every `tollgate_*` name in `text`.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("tollgate_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        // Skip identifiers that merely contain the word (e.g. a `$tollgate_job` variable).
        let starts_word = at == 0
            || !rest[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$');
        if starts_word {
            names.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    names
}

/// The sample names `/metrics` exposes right now (`name{labels} value` or `name value`).
fn exposed(admin: std::net::SocketAddr) -> BTreeSet<String> {
    get(admin, "/metrics")
        .1
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// A name as queried is exposed when it is a sample name, or a family whose samples carry
/// one of the suffixes Prometheus adds (a histogram queried by its base name in a label
/// matcher such as `{__name__=~...}` or in a panel description).
fn is_exposed(name: &str, samples: &BTreeSet<String>) -> bool {
    samples.contains(name)
        || ["_total", "_bucket", "_count", "_sum"]
            .iter()
            .any(|s| samples.contains(&format!("{name}{s}")))
}

const RLQS_RULES: &str = "domain: dashq
rlqs: true
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 100}
";

/// Two reports on one RLQS stream, as Envoy sends them (assigned, then some returned).
async fn rlqs_reports(server: &InProcess) {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
        BucketId, RateLimitQuotaUsageReports,
    };
    let mut client = RateLimitQuotaServiceClient::connect(format!("http://{}", server.grpc))
        .await
        .unwrap();
    let report = |domain: &str, allowed: u64| RateLimitQuotaUsageReports {
        domain: domain.into(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: [("tenant".to_string(), "a".to_string())].into(),
            }),
            time_elapsed: None,
            num_requests_allowed: allowed,
            num_requests_denied: 0,
        }],
    };
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let outbound =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut inbound = client
        .stream_rate_limit_quotas(outbound)
        .await
        .unwrap()
        .into_inner();
    for (domain, allowed) in [("dashq", 1), ("", 2)] {
        tx.send(report(domain, allowed)).await.unwrap();
        inbound.message().await.unwrap().expect("an assignment");
    }
}

async fn send(server: &InProcess, key: &str, value: &str, n: usize) {
    let mut client = server.client().await;
    for _ in 0..n {
        // Answers only matter for the metrics they leave behind.
        let _ = client
            .should_rate_limit(request("dash", &[&[(key, value)]]))
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_alerts_and_the_dashboard_query_is_exposed() {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut used = BTreeSet::new();
    for f in FILES {
        let text = std::fs::read_to_string(format!("{root}/{f}")).unwrap();
        let names = names_in(&text);
        assert!(!names.is_empty(), "{f} queries no tollgate metric");
        used.extend(names);
    }

    let mut redis = TestRedis::start();
    let server = InProcess::builder(RULES)
        .file("quota.yaml", RLQS_RULES)
        .settings(|s| {
            s.store = redis.url();
            s.key_prefix = unique_prefix("dash");
            s.store_timeout_ms = 200;
            s.lease_max_batch = 2;
            s.shard_retry = true;
            s.membership_interval_ms = 100;
            s.breaker_probe_ms = 100;
            s.reload_interval_ms = 100;
        })
        .start();

    // Plain decisions up to over the limit (ok, near_limit, over_limit), leased tokens, and a
    // sharded key driven past its limit so empty shards are retried.
    send(&server, "tenant", "a", 8).await;
    send(&server, "hot", "h", 12).await;
    // An Envoy's RLQS stream: a report, its assignment, then a report that settles it.
    rlqs_reports(&server).await;
    // A request for a domain the rules do not declare (the unknown-domain alert's series).
    let _ = server
        .client()
        .await
        .should_rate_limit(request("Dash", &[&[("tenant", "a")]]))
        .await;

    // A rules reload: a changed file is picked up by the watcher.
    std::fs::write(
        server.rules_dir().join("extra.yaml"),
        "domain: dash2\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .unwrap();
    let reloaded = poll(Duration::from_secs(10), || {
        exposed(server.admin)
            .contains("tollgate_rules_reloads_total")
            .then_some(())
    });
    assert!(reloaded.is_some(), "no reload counted:\n{}", server.log());

    // Redis gone: store errors, the breaker opens, the fallback decides.
    redis.kill();
    send(&server, "tenant", "b", 20).await;
    let fell_back = poll(Duration::from_secs(10), || {
        let samples = exposed(server.admin);
        [
            "tollgate_fallback_active",
            "tollgate_breaker_transitions_total",
        ]
        .iter()
        .all(|n| samples.contains(*n))
        .then_some(())
    });
    assert!(fell_back.is_some(), "no fallback seen:\n{}", server.log());
    send(&server, "tenant", "c", 5).await;

    let samples = exposed(server.admin);
    let missing: Vec<&String> = used.iter().filter(|n| !is_exposed(n, &samples)).collect();
    assert!(
        missing.is_empty(),
        "queried by the alerts or the dashboard but not on /metrics: {missing:?}\nexposed: {samples:#?}"
    );
    eprintln!(
        "{} metric names used by the alerts and the dashboard, all exposed",
        used.len()
    );
}

#[test]
fn names_are_read_whole_and_only_as_words() {
    let n = names_in(
        r#"rate(tollgate_decisions_total{x="1"}[5m]) / tollgate_store_call_duration_seconds_bucket $tollgate_job"#,
    );
    let want: BTreeSet<String> = [
        "tollgate_decisions_total",
        "tollgate_store_call_duration_seconds_bucket",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(n, want);
}
