//! tollgate in envoyproxy/ratelimit's place: the binary started as `ratelimit` (a link, as
//! `/bin/ratelimit` in the image) with no arguments and the reference's environment, as Envoy
//! Gateway's rate-limit Deployment sets it (but rules from files, `CONFIG_TYPE=FILE`: rules
//! over xDS are `rules_xds.rs`'s), against a
//! real Redis. It serves the reference's config layout (`RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/
//! config/*.yaml`) with the reference's key prefix, answers `/healthcheck`, names the
//! variables that change nothing in one warning, and refuses a value it cannot honour. The
//! reference's default, Redis over a unix socket, works too, and statsd gets the reference's
//! counters under its names.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::redis::TestRedis;
use common::{
    client_of, envoy_gateway_env, free_port, get, poll, ratelimit_link, request, start_clean,
    temp_dir,
};

/// A temporary `RUNTIME_ROOT` (its `data/`) holding the reference's layout,
/// `data/ratelimit/config/edge.yaml` with `rules`; the config directory is the second value.
fn runtime_root(tag: &str, rules: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = temp_dir(tag);
    let config = dir.path().join("data/ratelimit/config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("edge.yaml"), rules).unwrap();
    (dir, config)
}

/// The reference's README example, one level deep: 2 an hour per tenant.
const CONFIG: &str = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit:\n      unit: hour\n      requests_per_unit: 2\n";

#[tokio::test]
async fn started_as_ratelimit_it_serves_the_references_environment() {
    let redis = TestRedis::start();
    let (dir, config) = runtime_root("reference-env", CONFIG);
    // A ConfigMap mount's hidden copy: skipped, as RUNTIME_IGNOREDOTFILES asks.
    std::fs::write(config.join(".edge.yaml"), "not: [yaml").unwrap();
    let (grpc_port, http_port) = (free_port(), free_port());
    let mut vars = envoy_gateway_env(redis.port(), &dir.path().join("data"), grpc_port, http_port);
    vars.extend([
        ("CACHE_KEY_PREFIX", "ref_".to_string()),
        // tollgate's own settings still apply on top, as extra env.
        ("TOLLGATE_RESPONSE_HEADERS", "true".to_string()),
    ]);
    let log = dir.path().join("tollgate.log");
    let mut child = start_clean(&ratelimit_link(dir.path()), &vars, &log);
    let admin: SocketAddr = format!("127.0.0.1:{http_port}").parse().unwrap();
    let healthy = poll(Duration::from_secs(20), || {
        (get(admin, "/healthcheck") == (200, "OK".to_string())).then_some(())
    });
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(healthy.is_some(), "no /healthcheck OK; log:\n{}", text());

    let grpc: SocketAddr = format!("127.0.0.1:{grpc_port}").parse().unwrap();
    let mut client = client_of(grpc).await;
    let mut codes = Vec::new();
    for _ in 0..3 {
        let r = client
            .should_rate_limit(request("edge", &[&[("tenant", "acme")]]))
            .await
            .expect("ShouldRateLimit")
            .into_inner();
        codes.push(r.overall_code);
        if r.overall_code == 2 {
            assert!(
                r.response_headers_to_add
                    .iter()
                    .any(|h| h.key == "Retry-After"),
                "TOLLGATE_RESPONSE_HEADERS applies on top: {r:?}"
            );
        }
    }
    assert_eq!(codes, vec![1, 1, 2], "OK, OK, OVER_LIMIT");
    let keys: Vec<String> = redis.cmd(&["KEYS", "*"]);
    assert!(
        keys.iter()
            .any(|k| k.starts_with("ref_") && k.contains("acme")),
        "the bucket is in Redis under CACHE_KEY_PREFIX: {keys:?}"
    );
    let log_text = text();
    let warning = log_text
        .lines()
        .find(|l| l.contains("envoyproxy/ratelimit variables that change nothing here"))
        .unwrap_or_else(|| panic!("no warning naming the ignored variables; log:\n{log_text}"));
    for name in [
        "FORCE_START_WITHOUT_INITIAL_CONFIG",
        "RUNTIME_IGNOREDOTFILES",
        "RUNTIME_WATCH_ROOT",
    ] {
        assert!(warning.contains(name), "{name} not named: {warning}");
    }
    assert!(!warning.contains("REDIS_URL"), "{warning}");
    let _ = child.kill();
    let _ = child.wait();
}

/// The reference's default socket type, a unix socket (`REDIS_SOCKET_TYPE` unset), reaches a
/// real Redis listening on one.
#[tokio::test]
async fn the_references_default_unix_socket_reaches_redis() {
    let redis = TestRedis::start_unix();
    let (dir, _) = runtime_root("reference-unix", CONFIG);
    let (grpc_port, http_port) = (free_port(), free_port());
    let mut vars = envoy_gateway_env(redis.port(), &dir.path().join("data"), grpc_port, http_port);
    vars.retain(|(k, _)| !k.starts_with("REDIS_"));
    let socket = redis
        .unix_url()
        .trim_start_matches("redis+unix://")
        .to_string();
    vars.push(("REDIS_URL", socket));
    let log = dir.path().join("tollgate.log");
    let mut child = start_clean(&ratelimit_link(dir.path()), &vars, &log);
    let admin: SocketAddr = format!("127.0.0.1:{http_port}").parse().unwrap();
    let healthy = poll(Duration::from_secs(20), || {
        (get(admin, "/healthcheck") == (200, "OK".to_string())).then_some(())
    });
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(healthy.is_some(), "no /healthcheck OK; log:\n{}", text());
    let grpc: SocketAddr = format!("127.0.0.1:{grpc_port}").parse().unwrap();
    let mut client = client_of(grpc).await;
    let mut codes = Vec::new();
    for _ in 0..3 {
        let r = client
            .should_rate_limit(request("edge", &[&[("tenant", "sock")]]))
            .await
            .expect("ShouldRateLimit")
            .into_inner();
        codes.push(r.overall_code);
    }
    assert_eq!(codes, vec![1, 1, 2], "OK, OK, OVER_LIMIT; log:\n{}", text());
    let keys: Vec<String> = redis.cmd(&["KEYS", "*sock*"]);
    assert!(
        !keys.is_empty(),
        "the bucket is in the Redis behind the socket"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// `USE_STATSD=true` (the reference's default) with `STATSD_HOST`/`STATSD_PORT`: the
/// reference's per-rule counters arrive at a statsd server over TCP, as the reference sends
/// them, under its names, counting hits.
#[tokio::test]
async fn statsd_gets_the_references_counters_under_its_names() {
    let redis = TestRedis::start();
    let (dir, _) = runtime_root(
        "reference-statsd",
        "domain: edge\ndescriptors:\n  - key: tenant\n    value: acme\n    rate_limit: {unit: hour, requests_per_unit: 2}\n  - key: tenant\n    value: beta\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
    );
    // The statsd server: every line it is sent, from every connection.
    let statsd = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let statsd_port = statsd.local_addr().unwrap().port();
    let lines = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for conn in statsd.incoming() {
                let Ok(mut conn) = conn else { return };
                let mut text = String::new();
                let _ = std::io::Read::read_to_string(&mut conn, &mut text);
                lines.lock().unwrap().push_str(&text);
            }
        });
    }
    let (grpc_port, http_port) = (free_port(), free_port());
    let mut vars = envoy_gateway_env(redis.port(), &dir.path().join("data"), grpc_port, http_port);
    vars.retain(|(k, _)| *k != "USE_STATSD");
    vars.extend([
        ("STATSD_HOST", "127.0.0.1".to_string()),
        ("STATSD_PORT", statsd_port.to_string()),
        ("STATS_FLUSH_INTERVAL", "200ms".to_string()),
    ]);
    let log = dir.path().join("tollgate.log");
    let mut child = start_clean(&ratelimit_link(dir.path()), &vars, &log);
    let admin: SocketAddr = format!("127.0.0.1:{http_port}").parse().unwrap();
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    let healthy = poll(Duration::from_secs(20), || {
        (get(admin, "/healthcheck") == (200, "OK".to_string())).then_some(())
    });
    assert!(healthy.is_some(), "no /healthcheck OK; log:\n{}", text());
    let grpc: SocketAddr = format!("127.0.0.1:{grpc_port}").parse().unwrap();
    let mut client = client_of(grpc).await;
    let mut codes = Vec::new();
    for hits in [1, 1, 5] {
        let mut r = request("edge", &[&[("tenant", "acme")]]);
        r.hits_addend = hits;
        codes.push(
            client
                .should_rate_limit(r)
                .await
                .unwrap()
                .into_inner()
                .overall_code,
        );
    }
    // 7 hits at once on a fresh 5 an hour: refused, split as base_limiter.go splits it (2 past
    // the limit over, the near band 5 − ⌊5 × 0.8⌋ = 1 near), from the count the fixed window
    // found (0), not all 7 over.
    let mut r = request("edge", &[&[("tenant", "beta")]]);
    r.hits_addend = 7;
    let beta = client.should_rate_limit(r).await.unwrap().into_inner();
    assert_eq!(beta.overall_code, 2);
    client
        .should_rate_limit(request("nowhere", &[&[("tenant", "acme")]]))
        .await
        .unwrap();
    assert_eq!(codes, vec![1, 1, 2]);
    // Each send carries the growth since the last: the sums are the totals.
    let sum = |name: &str| -> u64 {
        let prefix = format!("ratelimit.service.{name}:");
        lines
            .lock()
            .unwrap()
            .lines()
            .filter_map(|l| {
                l.strip_prefix(&prefix)?
                    .strip_suffix("|c")?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    };
    let want = [
        ("rate_limit.edge.tenant_acme.total_hits", 7),
        ("rate_limit.edge.tenant_acme.within_limit", 2),
        // 2 an hour, near_limit_ratio 0.8: the second hit passes ⌊2 × 0.8⌋ = 1.
        ("rate_limit.edge.tenant_acme.near_limit", 1),
        ("rate_limit.edge.tenant_acme.over_limit", 5),
        ("rate_limit.edge.tenant_beta.total_hits", 7),
        ("rate_limit.edge.tenant_beta.within_limit", 0),
        ("rate_limit.edge.tenant_beta.near_limit", 1),
        ("rate_limit.edge.tenant_beta.over_limit", 2),
        ("rate_limit.nowhere.domain_not_found", 1),
        // The startup load counts, as every load does in the reference.
        ("config_load_success", 1),
    ];
    let arrived = poll(Duration::from_secs(10), || {
        want.iter().all(|(n, v)| sum(n) == *v).then_some(())
    });
    assert!(
        arrived.is_some(),
        "want {want:?}; statsd got:\n{}\nlog:\n{}",
        lines.lock().unwrap(),
        text()
    );
    // The reference's gRPC server stats: a count of the 5 calls, and a timer line for each
    // (a call is timed as it ends, so its line may come a send after its counters).
    let server = |suffix: &str| -> Vec<String> {
        lines
            .lock()
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("ratelimit_server.ShouldRateLimit."))
            .filter(|l| l.ends_with(suffix))
            .map(str::to_string)
            .collect()
    };
    let calls = || -> u64 {
        server("|c")
            .iter()
            .filter_map(|l| {
                l.strip_prefix("total_requests:")?
                    .strip_suffix("|c")?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    };
    let counted = poll(Duration::from_secs(10), || {
        (calls() == 5 && server("|ms").len() == 5).then_some(())
    });
    assert!(counted.is_some(), "{}", lines.lock().unwrap());
    let timers = server("|ms");
    assert!(
        timers.iter().all(|t| t.starts_with("response_time:")),
        "{timers:?}"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Envoy Gateway's telemetry: `USE_STATSD=false`, `USE_PROMETHEUS=true`, `PROMETHEUS_ADDR` and
/// its mapping file. The series its dashboard queries are served on that port, with the
/// reference's names, labels and counts; tollgate's own stay on the admin port.
#[tokio::test]
async fn envoy_gateways_prometheus_port_serves_the_references_series() {
    let redis = TestRedis::start();
    let (dir, _) = runtime_root(
        "reference-prometheus",
        "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 2}\n    descriptors:\n      - key: path\n        rate_limit: {unit: hour, requests_per_unit: 10}\n",
    );
    let mapping = dir.path().join("conf.yaml");
    std::fs::write(&mapping, common::ENVOY_GATEWAY_MAPPING).unwrap();
    let (grpc_port, http_port, prom_port) = (free_port(), free_port(), free_port());
    let mut vars = envoy_gateway_env(redis.port(), &dir.path().join("data"), grpc_port, http_port);
    vars.extend([
        ("USE_PROMETHEUS", "true".to_string()),
        ("PROMETHEUS_ADDR", format!("127.0.0.1:{prom_port}")),
        ("PROMETHEUS_MAPPER_YAML", mapping.display().to_string()),
    ]);
    let log = dir.path().join("tollgate.log");
    let mut child = start_clean(&ratelimit_link(dir.path()), &vars, &log);
    let admin: SocketAddr = format!("127.0.0.1:{http_port}").parse().unwrap();
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    let healthy = poll(Duration::from_secs(20), || {
        (get(admin, "/healthcheck") == (200, "OK".to_string())).then_some(())
    });
    assert!(healthy.is_some(), "no /healthcheck OK; log:\n{}", text());
    let grpc: SocketAddr = format!("127.0.0.1:{grpc_port}").parse().unwrap();
    let mut client = client_of(grpc).await;
    for _ in 0..3 {
        client
            .should_rate_limit(request("edge", &[&[("tenant", "acme")]]))
            .await
            .unwrap();
    }
    client
        .should_rate_limit(request("edge", &[&[("tenant", "acme"), ("path", "/a")]]))
        .await
        .unwrap();
    let prom: SocketAddr = format!("127.0.0.1:{prom_port}").parse().unwrap();
    let (code, scraped) = get(prom, "/metrics");
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(code, 200, "log:\n{}", text());
    for line in [
        // 2 an hour: 3 hits, 2 within, the second one near (⌊2 × 0.8⌋ = 1), 1 over.
        r#"ratelimit_service_rate_limit_total_hits{domain="edge",key1="tenant"} 3"#,
        r#"ratelimit_service_rate_limit_within_limit{domain="edge",key1="tenant"} 2"#,
        r#"ratelimit_service_rate_limit_near_limit{domain="edge",key1="tenant"} 1"#,
        r#"ratelimit_service_rate_limit_over_limit{domain="edge",key1="tenant"} 1"#,
        // Two levels: the regex mapping's key2.
        r#"ratelimit_service_rate_limit_total_hits{domain="edge",key1="tenant",key2="path"} 1"#,
        r#"ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 4"#,
        r#"ratelimit_service_response_time_seconds_count{grpc_method="ShouldRateLimit"} 4"#,
        "ratelimit_service_config_load_success 1",
        "# TYPE ratelimit_service_rate_limit_total_hits counter",
    ] {
        assert!(scraped.contains(line), "{line} not scraped:\n{scraped}");
    }
    assert!(
        scraped.contains("\nprocess_resident_memory_bytes "),
        "{scraped}"
    );
    assert!(
        !scraped.contains("tollgate_"),
        "tollgate's own stay on /metrics of the admin port"
    );
}

#[test]
fn a_value_it_cannot_honour_stops_startup_with_the_reason() {
    let dir = temp_dir("reference-refused");
    let link = ratelimit_link(dir.path());
    for (vars, says) in [
        (
            vec![
                ("REDIS_SOCKET_TYPE", "tcp".to_string()),
                ("REDIS_URL", "127.0.0.1:1".to_string()),
                ("REDIS_TYPE", "CLUSTERED".to_string()),
            ],
            "REDIS_TYPE=CLUSTERED: not a Redis type: SINGLE, CLUSTER or SENTINEL",
        ),
        // A unix socket reaches one Redis: not a cluster.
        (
            vec![
                ("REDIS_URL", "/run/redis.sock".to_string()),
                ("REDIS_TYPE", "CLUSTER".to_string()),
            ],
            "REDIS_SOCKET_TYPE=unix: a unix socket reaches one Redis",
        ),
        (
            vec![
                ("REDIS_SOCKET_TYPE", "tcp".to_string()),
                ("REDIS_URL", "127.0.0.1:1".to_string()),
                ("CONFIG_TYPE", "GRPC_XDS".to_string()),
            ],
            "CONFIG_TYPE=GRPC_XDS: not a config type: FILE or GRPC_XDS_SOTW",
        ),
    ] {
        let log = dir.path().join("refused.log");
        let mut child = start_clean(&link, &vars, &log);
        let status = poll(Duration::from_secs(10), || child.try_wait().ok().flatten());
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let Some(status) = status else {
            let _ = child.kill();
            panic!("still running with {vars:?}; log:\n{text}");
        };
        assert!(!status.success(), "{vars:?} started; log:\n{text}");
        assert!(text.contains(says), "{vars:?}: {text}");
    }
}

/// `serve --reference-env` is the same mode as the name `ratelimit`.
#[test]
fn the_reference_env_flag_reads_the_same_variables() {
    let (code, _, err) = common::run_tollgate(
        &["serve", "--reference-env"],
        &[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "127.0.0.1:1"),
            ("REDIS_TYPE", "CLUSTERED"),
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("REDIS_TYPE=CLUSTERED: not a Redis type"),
        "{err}"
    );
}

/// `/healthcheck` is 500 with the reason while the replica is not ready: here
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED` and no config loaded.
#[test]
fn healthcheck_is_500_while_not_ready() {
    let redis = TestRedis::start();
    let dir = temp_dir("reference-unhealthy");
    std::fs::create_dir_all(dir.path().join("data/ratelimit/config")).unwrap();
    let (grpc_port, http_port) = (free_port(), free_port());
    let mut vars = envoy_gateway_env(redis.port(), &dir.path().join("data"), grpc_port, http_port);
    vars.push((
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        "true".to_string(),
    ));
    let log = dir.path().join("tollgate.log");
    let mut child = start_clean(&ratelimit_link(dir.path()), &vars, &log);
    let admin: SocketAddr = format!("127.0.0.1:{http_port}").parse().unwrap();
    // Until both ports listen it says "not ready"; then why it is still not ready.
    let answer = poll(Duration::from_secs(20), || {
        let answer = get(admin, "/healthcheck");
        (answer == (500, "no rules loaded\n".to_string())).then_some(answer)
    });
    let last = get(admin, "/healthcheck");
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(answer.is_some(), "last {last:?}; log:\n{text}");
}
