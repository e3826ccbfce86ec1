//! `tollgate bench` against the real service: a short load run and the exactness check.

mod common;

use common::{TestServer, run_tollgate};

const RULES: &str = "domain: bench\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 20}\n";

#[test]
fn load_run_reports_throughput_latency_and_outcomes_as_json() {
    let server = TestServer::builder(RULES).start();
    let target = server.grpc.to_string();
    let (code, out, err) = run_tollgate(
        &[
            "bench",
            "--target",
            &target,
            "--duration",
            "1",
            "--warmup",
            "0.2",
            "--keys",
            "1000",
            "--zipf",
            "1.1",
            "--descriptors",
            "2",
            "--concurrency",
            "8",
            "--label",
            "smoke",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let json = out.lines().last().unwrap();
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(v["label"], "smoke");
    assert_eq!(v["errors"], 0, "{out}");
    assert!(v["requests"].as_u64().unwrap() > 0);
    assert!(
        v["over_limit"].as_u64().unwrap() > 0,
        "a Zipf-hot tenant passes 20/hour: {out}"
    );
    assert!(v["p99_us"].as_u64().unwrap() >= v["p50_us"].as_u64().unwrap());
}

#[test]
fn check_limit_admits_exactly_the_limit() {
    let server = TestServer::builder(RULES).start();
    let target = server.grpc.to_string();
    let (code, out, err) = run_tollgate(
        &[
            "bench",
            "--target",
            &target,
            "--check-limit",
            "20",
            "--requests",
            "200",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("admitted 20 of 200 requests (limit 20): exact"),
        "{out}"
    );
    // A wrong expectation is reported and fails.
    let (code, out, _) = run_tollgate(
        &[
            "bench",
            "--target",
            &target,
            "--check-limit",
            "5",
            "--requests",
            "10",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(out.contains("NOT exact"), "{out}");
}

#[test]
fn unreachable_target_is_a_clear_error() {
    let port = common::free_port();
    let (code, _, err) = run_tollgate(
        &[
            "bench",
            "--target",
            &format!("127.0.0.1:{port}"),
            "--duration",
            "1",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(err.contains("cannot connect"), "{err}");
}
