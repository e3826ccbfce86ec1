//! Issue #3 through a real server (in-process, over real gRPC and HTTP): rule extensions,
//! Envoy limit overrides, RateLimit headers, `/json`, `/config`, the request bounds.

mod common;

use common::{InProcess, get, http, request};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::UInt64Value;
use tollgate::clock::Clock;

const RULES: &str = r#"
domain: api
descriptors:
  - key: tenant
    rate_limits:
      - {unit: second, requests_per_unit: 100, class: tenant-burst}
      - {unit: hour, requests_per_unit: 2, name: hourly, class: tenant-hourly}
  - key: export
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 1, algorithm: fixed_window}
  - key: bulk
    rate_limit: {unit: hour, requests_per_unit: 10, burst: 3}
"#;

fn headers(r: &RateLimitResponse) -> Vec<(String, String)> {
    r.response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

fn header<'a>(h: &'a [(String, String)], name: &str) -> Option<&'a str> {
    h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn several_limits_on_one_key_report_the_most_constrained_with_headers() {
    let server = InProcess::start(RULES, |s| s.response_headers = true);
    let mut client = server.client().await;
    let req = request("api", &[&[("tenant", "t")]]);
    let r = client
        .should_rate_limit(req.clone())
        .await
        .unwrap()
        .into_inner();
    let s = &r.statuses[0];
    assert_eq!(
        s.current_limit.as_ref().unwrap().name,
        "hourly",
        "1 left of 2/hour beats 99 of 100/s"
    );
    let h = headers(&r);
    assert_eq!(header(&h, "RateLimit-Limit"), Some("2"));
    assert_eq!(header(&h, "RateLimit-Remaining"), Some("1"));
    assert_eq!(header(&h, "RateLimit-Reset"), Some("1800"));
    assert_eq!(header(&h, "Retry-After"), None, "never on OK");
    client.should_rate_limit(req.clone()).await.unwrap();
    let r = client
        .should_rate_limit(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let h = headers(&r);
    assert_eq!(
        header(&h, "Retry-After"),
        Some("1800"),
        "until one token of 2/hour is back"
    );
    let text = get(server.admin, "/metrics").1;
    assert!(
        text.contains(r#"class="tenant-hourly",outcome="over_limit"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"class="tenant-burst",outcome="ok"} 3"#),
        "{text}"
    );
}

#[tokio::test]
async fn custom_periods_burst_and_retry_after_that_can_never_fit() {
    // On a manual clock 100 s into a 5-minute window of the epoch: the fixed window resets in
    // 200 s. Ignoring `unit_multiplier` (a 1-minute window) would say 20, and a token bucket
    // of 1 per 5 minutes 300.
    // 1_700_000_100_000 is a multiple of 300_000 ms: a window of the epoch starts there.
    let window_start_ms = 1_700_000_100_000;
    let server = InProcess::builder(RULES)
        .settings(|s| s.response_headers = true)
        .clock(Clock::manual(window_start_ms + 100_000))
        .start();
    let mut client = server.client().await;
    let r = client
        .should_rate_limit(request("api", &[&[("export", "e")]]))
        .await
        .unwrap()
        .into_inner();
    let reset = r.statuses[0].duration_until_reset.unwrap().seconds;
    assert_eq!(reset, 200, "a 5-minute fixed window, 100 s in");
    // burst 3 on 10/hour: three at once, then over.
    let bulk = request("api", &[&[("bulk", "b")]]);
    for _ in 0..3 {
        assert_eq!(
            client
                .should_rate_limit(bulk.clone())
                .await
                .unwrap()
                .into_inner()
                .overall_code,
            Code::Ok as i32
        );
    }
    let r = client
        .should_rate_limit(bulk.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(
        header(&headers(&r), "Retry-After"),
        Some("360"),
        "one of 10/hour"
    );
    // A cost above the capacity never fits: no Retry-After. u64::MAX must not overflow.
    let mut huge = request("api", &[&[("bulk", "other")]]);
    huge.descriptors[0].hits_addend = Some(UInt64Value { value: u64::MAX });
    let r = client.should_rate_limit(huge).await.unwrap().into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(header(&headers(&r), "Retry-After"), None);
}

#[tokio::test]
async fn envoy_limit_override_is_honoured() {
    let server = InProcess::start(RULES, |_| {});
    let mut client = server.client().await;
    let mut req = request("api", &[&[("anything", "x")]]);
    req.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 4, /* DAY */
    });
    let r = client
        .should_rate_limit(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        1
    );
    let r = client
        .should_rate_limit(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    req.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 0,
    });
    let err = client.should_rate_limit(req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let text = get(server.admin, "/metrics").1;
    assert!(text.contains(r#"class="envoy_override""#), "{text}");
    assert!(
        !text.contains("anything"),
        "raw values stay out of metrics: {text}"
    );
}

#[tokio::test]
async fn json_endpoint_answers_like_the_reference() {
    let server = InProcess::start(RULES, |_| {});
    let body = r#"{"domain":"api","descriptors":[{"entries":[{"key":"bulk","value":"j"}],"hitsAddend":"3"}]}"#;
    let (code, out) = http(server.admin, "POST", "/json", body).unwrap();
    assert_eq!(code, 200, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["overallCode"], "OK");
    assert_eq!(v["statuses"][0]["currentLimit"]["unit"], "HOUR");
    assert_eq!(v["statuses"][0]["currentLimit"]["requestsPerUnit"], 10);
    assert!(
        v["statuses"][0].get("limitRemaining").is_none(),
        "0 is omitted, as proto3 JSON does: {out}"
    );
    let snake = r#"{"domain":"api","descriptors":[{"entries":[{"key":"bulk","value":"j"}],"hits_addend":1}]}"#;
    let (code, out) = http(server.admin, "POST", "/json", snake).unwrap();
    assert_eq!(code, 429, "{out}");
    assert!(out.contains(r#""overallCode":"OVER_LIMIT""#), "{out}");
    let (code, out) = http(
        server.admin,
        "POST",
        "/json",
        r#"{"domain":"","descriptors":[]}"#,
    )
    .unwrap();
    assert_eq!(code, 400, "{out}");
    assert!(out.contains("domain"), "{out}");
    let (code, out) = http(
        server.admin,
        "POST",
        "/json",
        r#"{"domain":"api","bogus":1}"#,
    )
    .unwrap();
    assert_eq!(code, 400, "{out}");
    assert!(out.contains("bogus"), "{out}");
    let (code, _) = http(server.admin, "POST", "/json", "not json").unwrap();
    assert_eq!(code, 400);
}

#[tokio::test]
async fn config_shows_rules_and_settings_with_secrets_redacted() {
    // A non-default setting shows as in force. (Redaction: `faults.rs`, with a password.)
    let server = InProcess::start(RULES, |s| s.key_prefix = "cfg:".into());
    let (code, out) = get(server.admin, "/config");
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["settings"]["key_prefix"], "cfg:");
    let limits = v["rules"]["domains"][0]["limits"].as_array().unwrap();
    assert_eq!(limits.len(), 4, "{out}");
    assert_eq!(limits[0]["path"], "tenant");
    assert_eq!(limits[2]["rate"]["unit_multiplier"], 5);
    assert_eq!(v["store"], "memory");
    assert_eq!(out.lines().count(), 1, "one line of JSON for scripts");
    // `?pretty`: the same document, indented for people reading it with curl.
    let (code, pretty) = get(server.admin, "/config?pretty");
    assert_eq!(code, 200);
    assert!(
        pretty.lines().count() > 20 && pretty.contains("\n  \"settings\": {"),
        "{pretty}"
    );
    let p: serde_json::Value = serde_json::from_str(&pretty).unwrap();
    assert_eq!(p["settings"], v["settings"]);
    assert_eq!(p["rules"], v["rules"]);

    // A password given as a setting (nobody listens on the port: the store is down, and the
    // server is unready until it answers) shows only as `***`.
    let port = common::free_port();
    let secret = "hunter2-not-shown";
    let server = InProcess::builder(RULES)
        .settings(|s| {
            s.store = format!("redis://127.0.0.1:{port}");
            s.store_password = secret.into();
        })
        .ready_status(503)
        .start();
    let (code, out) = get(server.admin, "/config");
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["settings"]["store_password"], "***", "{out}");
    assert!(!out.contains(secret), "{out}");
}

#[tokio::test]
async fn oversized_messages_are_refused() {
    let server = InProcess::start(RULES, |s| s.max_message_bytes = 1024);
    let mut client = server.client().await;
    let big = "x".repeat(2000);
    let err = client
        .should_rate_limit(request("api", &[&[("k", &big)]]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err:?}");
    assert!(
        client
            .should_rate_limit(request("api", &[&[("tenant", "small")]]))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn a_limit_override_never_shares_the_rules_bucket() {
    // The rule on `bulk` is 10/hour with burst 3; the override is 1/hour, the same unit.
    let server = InProcess::start(RULES, |_| {});
    let mut client = server.client().await;
    let mut over = request("api", &[&[("bulk", "shared")]]);
    over.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 3, /* HOUR, the rule's unit too */
    });
    client.should_rate_limit(over.clone()).await.unwrap();
    let r = client.should_rate_limit(over).await.unwrap().into_inner();
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    // The rule's own bucket for the same entries is untouched: burst 3, 2 left after one.
    let plain = client
        .should_rate_limit(request("api", &[&[("bulk", "shared")]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(plain.statuses[0].limit_remaining, 2);
}

/// `/metrics` in both formats: OpenMetrics when the scraper asks for it (Prometheus does),
/// else the Prometheus text format, which `promtool check metrics` (Prometheus's own linter,
/// brought by `make deps`) accepts as it is; the `process_*` families are there in both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_serve_the_text_format_promtool_accepts_and_openmetrics_on_request() {
    use std::io::Write;
    let server = InProcess::start(RULES, |_| {});
    let mut client = server.client().await;
    for _ in 0..3 {
        client
            .should_rate_limit(request("api", &[&[("tenant", "acme")]]))
            .await
            .unwrap();
    }
    let text = common::get_with(server.admin, "/metrics", &[]).unwrap();
    assert_eq!(
        text.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert!(!text.body.contains("# EOF"), "{}", text.body);
    assert!(
        text.body
            .contains("# TYPE tollgate_decisions_total counter\n"),
        "{}",
        text.body
    );
    assert!(
        text.body.contains("\nprocess_resident_memory_bytes "),
        "{}",
        text.body
    );
    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (make deps brings it: Debian's prometheus package)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.body.as_bytes())
        .unwrap();
    let out = promtool.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let om = common::get_with(
        server.admin,
        "/metrics",
        &[(
            "Accept",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        )],
    )
    .unwrap();
    assert!(
        om.header("content-type")
            .is_some_and(|c| c.starts_with("application/openmetrics-text")),
        "{:?}",
        om.headers
    );
    assert!(om.body.ends_with("# EOF\n"), "{}", om.body);
    assert!(
        om.body.contains("# TYPE tollgate_decisions counter\n")
            && om.body.contains("\nprocess_resident_memory_bytes "),
        "{}",
        om.body
    );
}
