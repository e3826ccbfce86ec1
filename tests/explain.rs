//! "Why was this request limited?" answered in one call: `POST /counters/explain` on the admin
//! port (behind the counter API's token) names, per bucket of a request, the rule, the
//! capacity enforced here, the balance signed and what would decide a request of it now. With
//! a real Redis, a tenant is driven into each source of refusal this replica has (the store,
//! its over-limit cache, its lease, the fallback with the store gone) and the answer names each;
//! explaining spends nothing (100 explains leave the bucket as it was) and a call without the
//! token is refused.

mod common;

use std::time::Duration;

use common::proxy::Proxy;
use common::redis::{TestRedis, unique_prefix};
use common::{InProcess, poll, request, request_with};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use serde_json::Value;

const RULES: &str = "domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 1000, lease: {max_batch: 50, ttl_ms: 60000}}
  - key: charged
    rate_limit: {unit: hour, requests_per_unit: 2, overdraft: true}
";

const TOKEN: &str = "expl41n-t0ken";

/// A tollgate on `store` with the counter API on, and `configure`.
fn server_with(
    rules: &str,
    store: &str,
    configure: impl FnOnce(&mut tollgate::settings::Settings),
) -> (InProcess, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, TOKEN).unwrap();
    let (path, store, prefix) = (
        file.to_string_lossy().to_string(),
        store.to_string(),
        unique_prefix("explain"),
    );
    let server = InProcess::start(rules, move |s| {
        s.counter_api_token_file = path;
        s.store = store;
        s.key_prefix = prefix;
        s.store_timeout_ms = 200;
        configure(s);
    });
    (server, dir)
}

fn server(store: &str) -> (InProcess, tempfile::TempDir) {
    server_with(RULES, store, |_| {})
}

fn body(domain: &str, key: &str, value: &str) -> String {
    format!(
        r#"{{"domain": "{domain}", "descriptors": [{{"entries": [{{"key": "{key}", "value": "{value}"}}]}}]}}"#
    )
}

/// The explain call for `key=value` in domain `api`: (status, the one bucket's answer).
fn explain(server: &InProcess, key: &str, value: &str, token: Option<&str>) -> (u16, Value) {
    explain_in(server, "api", key, value, token)
}

fn explain_in(
    server: &InProcess,
    domain: &str,
    key: &str,
    value: &str,
    token: Option<&str>,
) -> (u16, Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    let r = request_with(
        server.admin,
        "POST",
        "/counters/explain",
        &headers,
        &body(domain, key, value),
    )
    .expect("the admin port answers");
    let json: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
    (r.status, json["buckets"][0].clone())
}

fn explained(server: &InProcess, key: &str, value: &str) -> Value {
    let (status, bucket) = explain(server, key, value, Some(TOKEN));
    assert_eq!(status, 200, "{bucket}");
    bucket
}

/// `n` requests of `hits` on `key=value`; their codes (1 OK, 2 OVER_LIMIT).
async fn spend(server: &InProcess, key: &str, value: &str, hits: u32, n: usize) -> Vec<i32> {
    let mut client = server.client().await;
    let mut codes = Vec::new();
    for _ in 0..n {
        let req = RateLimitRequest {
            hits_addend: hits,
            ..request("api", &[&[(key, value)]])
        };
        codes.push(
            client
                .should_rate_limit(req)
                .await
                .unwrap()
                .into_inner()
                .overall_code,
        );
    }
    codes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_names_what_decides_and_spends_nothing() {
    let mut redis = TestRedis::start();
    let (server, dir) = server(&redis.url());

    // Without the token: refused, nothing read.
    let (status, _) = explain(&server, "tenant", "acme", None);
    assert_eq!(status, 401);
    let (status, _) = explain(&server, "tenant", "acme", Some("wrong"));
    assert_eq!(status, 401);

    // The rule, the key, what is enforced here: a fresh bucket, decided by the store.
    let fresh = explained(&server, "tenant", "acme");
    assert_eq!(fresh["decided_by"]["source"], "store", "{fresh}");
    let origin = fresh["rule"]["origin"].as_str().unwrap();
    assert!(
        origin.ends_with("/rules.yaml:4"),
        "the file and line: {origin}"
    );
    assert_eq!(fresh["rule"]["path"], "tenant", "{fresh}");
    assert_eq!(fresh["capacity_here"], 3);
    assert_eq!(
        (fresh["remaining"].as_u64(), fresh["balance"].as_i64()),
        (Some(3), Some(3))
    );
    assert!(
        fresh["key"]
            .as_str()
            .unwrap()
            .ends_with("|tenant=acme|tb:3600000:0}")
    );

    // The same from the command line: `tollgate explain` against the admin port.
    let token_file = dir.path().join("token");
    let admin = server.admin.to_string();
    let args = |file: &str| {
        [
            "explain",
            "api",
            "tenant=acme",
            "--admin",
            &admin,
            "--token-file",
            file,
        ]
        .map(String::from)
    };
    let (code, out, err) = common::run_tollgate(
        &args(token_file.to_str().unwrap())
            .each_ref()
            .map(String::as_str),
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let cli: Value = serde_json::from_str(&out).expect("the answer, as JSON");
    assert_eq!(cli["buckets"][0]["decided_by"]["source"], "store", "{out}");
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "nope").unwrap();
    let (code, _, err) = common::run_tollgate(
        &args(wrong.to_str().unwrap()).each_ref().map(String::as_str),
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains("401"), "{err}");
    // An entry that is not key=value: said so, nothing sent.
    let (code, _, err) = common::run_tollgate(
        &[
            "explain",
            "api",
            "tenant",
            "--admin",
            &admin,
            "--token-file",
            token_file.to_str().unwrap(),
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains("an entry is key=value"), "{err}");

    // 100 explains spend nothing: one spent of 3, and 2 left after them.
    assert_eq!(spend(&server, "tenant", "acme", 1, 1).await, [1]);
    for _ in 0..100 {
        assert_eq!(explained(&server, "tenant", "acme")["remaining"], 2);
    }
    assert_eq!(spend(&server, "tenant", "acme", 1, 3).await, [1, 1, 2]);

    // Spent and refused by the store: the refusal is cached here, and the cache decides now.
    let cached = explained(&server, "tenant", "acme");
    assert_eq!(
        cached["decided_by"]["source"], "over_limit_cache",
        "{cached}"
    );
    let retry = cached["decided_by"]["retry_ms"].as_u64().unwrap();
    assert!(
        retry > 0 && retry <= 1_200_000,
        "a token of 3 an hour: {retry}"
    );
    assert_eq!(cached["remaining"], 0);

    // Spent to the last token, never refused: the store decides, with nothing left.
    assert_eq!(spend(&server, "tenant", "beta", 1, 3).await, [1, 1, 1]);
    let spent = explained(&server, "tenant", "beta");
    assert_eq!(spent["decided_by"]["source"], "store", "{spent}");
    assert_eq!(spent["balance"], 0);

    // Debt is visible: 2 an hour with overdraft, charged 5 (one limit deep at most).
    assert_eq!(spend(&server, "charged", "acme", 5, 1).await, [2]);
    let debt = explained(&server, "charged", "acme");
    assert_eq!(
        (debt["remaining"].as_u64(), debt["balance"].as_i64()),
        (Some(0), Some(-2)),
        "{debt}"
    );

    // A leased key: this replica's lease holds tokens, and spends them here.
    assert_eq!(spend(&server, "hot", "acme", 1, 5).await, [1; 5]);
    let leased = explained(&server, "hot", "acme");
    assert_eq!(leased["decided_by"]["source"], "lease", "{leased}");
    let held = leased["decided_by"]["tokens"].as_u64().unwrap();
    assert!(
        held > 0 && held == leased["leased_here"].as_u64().unwrap(),
        "{leased}"
    );

    // The store gone: the breaker opens and the fallback decides, saying why.
    redis.kill();
    let _ = spend(&server, "tenant", "gamma", 1, 5).await;
    let fallback = explained(&server, "tenant", "gamma");
    assert_eq!(fallback["read"], false, "{fallback}");
    assert_eq!(fallback["decided_by"]["source"], "fallback", "{fallback}");
    assert_eq!(fallback["decided_by"]["mode"], "local", "{fallback}");
    assert!(
        fallback["decided_by"]["why"].as_str().unwrap().len() > 5,
        "{fallback}"
    );
    assert_eq!(fallback["balance"], Value::Null, "nothing read: no balance");
    for (what, answer) in [
        ("cached", &cached),
        ("debt", &debt),
        ("leased", &leased),
        ("fallback", &fallback),
    ] {
        eprintln!("{what}: {answer}");
    }
}

/// A `global: true` limit: the answer says what this region holds of it (its share, the
/// floor, whether it is cut off from the global store) and enforces (`capacity_here`: the
/// burst at the share), and a partition shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_a_global_limits_share_here_and_a_partition() {
    let global = TestRedis::start();
    let proxy = Proxy::start(format!("127.0.0.1:{}", global.port()).parse().unwrap()).await;
    let regional = TestRedis::start();
    let rules = "domain: global\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 100, burst: 10, global: true}\n";
    let global_url = proxy.url();
    let (server, _dir) = server_with(rules, &regional.url(), move |s| {
        s.global_store = global_url;
        s.region = "us".into();
        s.regions = "us,eu".into();
        s.region_exchange_ms = 250;
        s.region_lease_ms = 1_000;
    });
    let explained_global = || {
        let (status, bucket) = explain_in(&server, "global", "tenant", "acme", Some(TOKEN));
        assert_eq!(status, 200, "{bucket}");
        bucket
    };
    let mut client = server.client().await;
    for _ in 0..3 {
        client
            .should_rate_limit(request("global", &[&[("tenant", "acme")]]))
            .await
            .unwrap();
    }
    let shared = explained_global();
    let share = shared["region"]["share"].as_f64().expect("a region share");
    assert!(share > 0.0 && share <= 1.0, "{shared}");
    assert_eq!(shared["region"]["partitioned"], false, "{shared}");
    let capacity = shared["capacity_here"].as_u64().unwrap();
    assert!(capacity <= 10, "at most the burst: {shared}");
    assert_eq!(shared["burst"], 10, "the rule's burst beside it");

    // Cut off from the global store: a lease later it says so, and holds at most its
    // partition share (1/2 of two regions).
    proxy.set_delay(Duration::from_secs(600));
    proxy.cut_all();
    let cut = poll(Duration::from_secs(10), || {
        let b = explained_global();
        (b["region"]["partitioned"] == true).then_some(b)
    })
    .expect("the partition shows within the lease");
    assert!(cut["region"]["share"].as_f64().unwrap() <= 0.5, "{cut}");
    assert!(cut["capacity_here"].as_u64().unwrap() <= 5, "{cut}");
    eprintln!("shared: {shared}\ncut off: {cut}");
}

/// docs/troubleshooting.md's "Why was this request limited?" shows a curl of the explain call
/// and its answer: the same call (its `-d` body, read from the page) sent to a real replica
/// with the rules the answer names (3 an hour on `tenant`), the tenant spent and refused once,
/// answers every field the page shows, with the same values but the ones that depend on the
/// moment or the machine (`reset_ms`, `retry_ms`, the rules file's directory, the key prefix).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_explain_call_answers_as_the_page_shows() {
    let page = include_str!("../docs/troubleshooting.md");
    let section = page
        .split("### Why was this request limited?")
        .nth(1)
        .expect("the section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("its sh block");
    let body = block
        .split("-d '")
        .nth(1)
        .and_then(|b| b.split('\'').next())
        .expect("the curl's body");
    let shown: String = block
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(str::trim)
        .collect();
    let shown: Value = serde_json::from_str(&shown).expect("the answer shown is JSON");

    let redis = TestRedis::start();
    let rules = "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 3}\n";
    let (server, _dir) = server_with(rules, &redis.url(), |_| {});
    assert_eq!(spend(&server, "tenant", "acme", 1, 4).await, [1, 1, 1, 2]);
    let r = request_with(
        server.admin,
        "POST",
        "/counters/explain",
        &[("authorization", &format!("Bearer {TOKEN}"))],
        body,
    )
    .expect("the admin port answers");
    assert_eq!(r.status, 200, "{}", r.body);
    let got: Value = serde_json::from_str(&r.body).unwrap();
    let (want, got) = (&shown["buckets"][0], &got["buckets"][0]);
    assert_eq!(shown["domain"], "api");
    let fields = want.as_object().expect("a bucket");
    assert_eq!(
        fields.keys().collect::<Vec<_>>(),
        got.as_object().unwrap().keys().collect::<Vec<_>>(),
        "the page shows every field, and no other: {got}"
    );
    for (field, value) in fields {
        match field.as_str() {
            "reset_ms" => assert!(got[field].as_u64().unwrap() > 3_500_000, "{got}"),
            "key" => {
                let tail = value.as_str().unwrap().trim_start_matches("tollgate:");
                assert!(got[field].as_str().unwrap().ends_with(tail), "{got}");
            }
            "rule" => {
                assert_eq!(got["rule"]["path"], value["path"]);
                assert_eq!(got["rule"]["shadow_mode"], value["shadow_mode"]);
                assert!(
                    got["rule"]["origin"]
                        .as_str()
                        .unwrap()
                        .ends_with("/rules.yaml:4")
                );
            }
            "decided_by" => {
                assert_eq!(got[field]["source"], value["source"], "{got}");
                assert!(
                    got[field]["retry_ms"].as_u64().unwrap() > 1_000_000,
                    "{got}"
                );
            }
            _ => assert_eq!(&got[field], value, "{field}: {got}"),
        }
    }
}

/// The decision log through the real binary's settings: `--log-level debug` writes one line
/// per decision naming what answered it; `decision_log_per_s` bounds them (the rest counted in
/// the next line's `skipped`) and `decision_log_values: false` writes no tenant value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decision_log_is_rate_bounded_and_hides_values_when_asked() {
    let server = common::TestServer::builder(RULES)
        .arg("log-level", "debug")
        .arg("decision-log-per-s", "2")
        .arg("decision-log-values", "false")
        .start();
    let mut client = server.client().await;
    let started = std::time::Instant::now();
    for _ in 0..6 {
        client
            .should_rate_limit(request("api", &[&[("tenant", "secret-tenant")]]))
            .await
            .unwrap();
    }
    let burst_took = started.elapsed();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    client
        .should_rate_limit(request("api", &[&[("tenant", "secret-tenant")]]))
        .await
        .unwrap();
    let lines = poll(Duration::from_secs(5), || {
        let log = server.log();
        let lines: Vec<String> = log
            .lines()
            .filter(|l| l.contains(" decision "))
            .map(String::from)
            .collect();
        lines
            .iter()
            .any(|l| l.contains("skipped="))
            .then_some(lines)
    })
    .expect("decision lines");
    let log = server.log();
    assert!(!log.contains("secret-tenant"), "a value in the log:\n{log}");
    assert!(lines.iter().all(|l| l.contains("tenant=#")), "{lines:#?}");
    assert!(lines[0].contains("by store"), "{lines:#?}");
    // Six decisions in one second (they took well under one here) give at most two lines
    // per second they spanned; the one a second later says how many were skipped.
    if burst_took < Duration::from_millis(900) {
        let last = lines.last().unwrap();
        assert!(lines.len() <= 5, "{lines:#?}");
        assert!(
            !last.contains("skipped=0"),
            "the skipped ones counted: {last}"
        );
    }
}
