//! What only the real `tollgate` binary shows: settings from the environment, flags and a
//! settings file, `tollgate check`, exit codes when `serve` refuses to start, and SIGTERM
//! (drain, unready first). The service itself is tested in-process (`rls_grpc.rs`,
//! `http_surface.rs`).

mod common;

use std::time::Duration;

use common::redis::{TestRedis, unique_prefix};
use common::{TestServer, get, poll, readyz, request, run_tollgate, temp_dir};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

/// The small `edge` rule set both suites use (tests/common).
const RULES: &str = common::EDGE_RULES;

#[tokio::test]
async fn settings_from_env_and_flags_with_flags_winning() {
    // Kubernetes-style service variables must not break startup; env turns shadow mode on.
    let server = TestServer::builder(RULES)
        .env("TOLLGATE_PORT", "tcp://10.0.0.1:8081")
        .env("TOLLGATE_SERVICE_HOST", "10.0.0.1")
        .env("TOLLGATE_SHADOW_MODE", "true")
        .env("TOLLGATE_KEY_PREFIX", "cfg:")
        .start();
    // The effective settings, from the environment, are what `/config` shows.
    let config: serde_json::Value =
        serde_json::from_str(&get(server.admin, "/config").1).expect("/config is JSON");
    assert_eq!(config["settings"]["key_prefix"], "cfg:", "{config}");
    assert_eq!(config["settings"]["shadow_mode"], true, "{config}");
    let mut client = server.client().await;
    let req = request("edge", &[&[("tenant", "s"), ("endpoint", "/search")]]);
    client.should_rate_limit(req.clone()).await.unwrap();
    let r = client
        .should_rate_limit(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.overall_code,
        Code::Ok as i32,
        "global shadow mode from the environment"
    );
    assert_eq!(
        r.statuses[0].code,
        Code::OverLimit as i32,
        "statuses stay as decided"
    );

    let server = TestServer::builder(RULES)
        .env("TOLLGATE_SHADOW_MODE", "true")
        .arg("shadow-mode", "false")
        .start();
    let mut client = server.client().await;
    client.should_rate_limit(req.clone()).await.unwrap();
    let r = client.should_rate_limit(req).await.unwrap().into_inner();
    assert_eq!(
        r.overall_code,
        Code::OverLimit as i32,
        "the flag overrides the environment"
    );
}

#[tokio::test]
async fn fixed_window_default_algorithm_from_a_settings_file() {
    let dir = temp_dir("settings");
    let file = dir.path().join("tollgate.yaml");
    std::fs::write(&file, "default_algorithm: fixed_window\n").unwrap();
    let server = TestServer::builder("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")
        .arg("config", file.to_str().unwrap())
        .start();
    let mut client = server.client().await;
    // A fixed window resets at the next minute boundary of the wall clock; a token bucket of
    // 2/minute with one token spent reports 30 s whatever the time. A moment within 2 s of
    // half past the minute cannot tell them apart: wait it out and ask again, for a fresh key.
    for attempt in 0.. {
        let r = client
            .should_rate_limit(request("d", &[&[("k", &format!("v{attempt}"))]]))
            .await
            .unwrap()
            .into_inner();
        let now_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let to_boundary = 60 - now_s % 60;
        if to_boundary.abs_diff(30) <= 2 {
            assert!(attempt < 2, "the clock stays at half past the minute");
            tokio::time::sleep(Duration::from_secs(3)).await;
            continue;
        }
        let reset = r.statuses[0].duration_until_reset.unwrap().seconds as u64;
        assert!(
            reset.abs_diff(to_boundary) <= 1 || (reset + 60).abs_diff(to_boundary) <= 1,
            "reset in {reset} s; the minute ends in {to_boundary} s (a token bucket says 30)"
        );
        break;
    }
    let text = get(server.admin, "/metrics").1;
    assert!(text.contains("outcome=\"ok\""), "{text}");
}

#[test]
fn check_prints_a_summary_or_every_error_with_file_and_line() {
    let (code, out, _) = run_tollgate(&["check", "examples/rules"], &[]);
    assert_eq!(code, 0);
    assert!(out.contains("1 domain(s) [edge]"), "{out}");
    let dir = temp_dir("check");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - key: b\n    colour: red\n").unwrap();
    let (code, _, err) = run_tollgate(&["check", bad.to_str().unwrap()], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("2 errors"), "{err}");
    assert!(err.contains("bad.yaml:4:"), "{err}");
    assert!(err.contains("bad.yaml:6:"), "{err}");
    assert!(err.contains("fortnight"), "{err}");
}

/// `serve` checks the rules, the settings and the files they name before it binds anything.
/// Proof: the gRPC port given is taken, so binding it fails (the control shows that error);
/// with broken rules, bad settings or a missing file the error is theirs, not the bind
/// error, so nothing was bound first.
#[test]
fn serve_refuses_broken_rules_bad_settings_and_missing_files_before_binding() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port to occupy");
    let taken = taken.local_addr().unwrap().to_string();
    let serve = |rules: &str, env: &[(&str, &str)]| {
        run_tollgate(
            &[
                "serve",
                "--rules",
                rules,
                "--grpc-addr",
                &taken,
                "--admin-addr",
                "127.0.0.1:0",
            ],
            env,
        )
    };
    // Control: with good rules and settings, the taken port is what stops it.
    let (code, _, err) = serve("examples/rules", &[]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("cannot listen on {taken} (gRPC)")),
        "{err}"
    );

    let dir = temp_dir("broken");
    std::fs::write(dir.path().join("r.yaml"), "domain: \"\"\n").unwrap();
    let rules = dir.path().to_str().unwrap();
    let (code, _, err) = serve(rules, &[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("r.yaml:1:") && err.contains("must not be empty"),
        "{err}"
    );
    assert!(
        !err.contains("cannot listen"),
        "the rules were checked first: {err}"
    );

    let (code, _, err) = serve(rules, &[("TOLLGATE_STORE_TIMEOUT_MS", "zero")]);
    assert_eq!(code, 1);
    assert!(err.contains("store_timeout_ms"), "{err}");
    assert!(
        !err.contains("cannot listen"),
        "the settings were checked first: {err}"
    );

    // Every file a setting names is read before binding too (good rules this time).
    for (files, named) in [
        (
            &[
                ("TOLLGATE_GRPC_TLS_CERT", "/nonexistent/cert.pem"),
                ("TOLLGATE_GRPC_TLS_KEY", "/nonexistent/key.pem"),
            ][..],
            "grpc_tls_cert",
        ),
        (
            &[
                ("TOLLGATE_STORE", "rediss://127.0.0.1:1"),
                ("TOLLGATE_STORE_TLS_CA", "/nonexistent/ca.pem"),
            ][..],
            "store_tls_ca",
        ),
        (
            &[
                ("TOLLGATE_STORE", "redis://127.0.0.1:1"),
                ("TOLLGATE_STORE_PASSWORD_FILE", "/nonexistent/password"),
            ][..],
            "store_password_file",
        ),
        (
            &[("TOLLGATE_COUNTER_API_TOKEN_FILE", "/nonexistent/token")][..],
            "counter_api_token_file",
        ),
    ] {
        let (code, _, err) = serve("examples/rules", files);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains(named) && err.contains("/nonexistent/"),
            "{named}: {err}"
        );
        assert!(
            !err.contains("cannot listen"),
            "{named} was read before binding: {err}"
        );
    }
}

/// A request in flight when SIGTERM arrives is answered, by the store, before the process
/// exits 0. The request is held in flight by a stopped redis-server (SIGSTOP: the kernel keeps
/// tollgate's bytes unread, which is how the test knows the request reached the store), which
/// is resumed only after the SIGTERM was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_a_request_in_flight_and_exits_cleanly() {
    let redis = TestRedis::start();
    let mut server = TestServer::builder(RULES)
        .arg("store", &redis.url())
        .arg("key-prefix", &unique_prefix("drain"))
        .arg("store-timeout-ms", "5000")
        .arg("grpc-request-timeout-ms", "30000")
        // No heartbeat during the test: the only bytes sent to Redis are the request's.
        .arg("membership-interval-ms", "60000")
        .start();
    let mut client = server.client().await;
    let warm = client
        .should_rate_limit(request("edge", &[&[("tenant", "warm")]]))
        .await;
    assert!(warm.is_ok(), "{warm:?}");
    let signal = |sig: &str, pid: u32| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    };
    let redis_pid = redis.pid().expect("redis-server runs");
    signal("-STOP", redis_pid);
    let in_flight = tokio::spawn(async move {
        let r = client
            .should_rate_limit(request("edge", &[&[("tenant", "in-flight")]]))
            .await;
        (r, std::time::Instant::now())
    });
    let reached_store = common::poll(Duration::from_secs(10), || {
        common::unread_bytes_on(redis.port()).then_some(())
    });
    if reached_store.is_none() {
        signal("-CONT", redis_pid);
        panic!("the request never reached the store:\n{}", server.log());
    }
    let terminated_at = std::time::Instant::now();
    signal("-TERM", server.pid());
    // The server is shutting down now, with the request still waiting on the store.
    tokio::time::sleep(Duration::from_millis(300)).await;
    signal("-CONT", redis_pid);
    let (answer, answered_at) = in_flight.await.unwrap();
    let answer = answer.unwrap_or_else(|e| panic!("dropped in the drain: {e}\n{}", server.log()));
    assert_eq!(answer.get_ref().overall_code, Code::Ok as i32);
    assert!(answered_at > terminated_at, "answered before the SIGTERM");
    let exited = poll(Duration::from_secs(10), || server.try_wait());
    let status = exited.unwrap_or_else(|| panic!("still running:\n{}", server.log()));
    assert!(status.success(), "{status}: {}", server.log());
    let log = server.log();
    assert!(log.contains("draining requests in flight"), "{log}");
    assert!(log.contains("stopped"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_drain_ms_sigterm_unreadies_first_and_keeps_serving() {
    let mut server = TestServer::builder(RULES).arg("drain-ms", "1500").start();
    let mut client = server.client().await;
    let _ = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(server.pid().to_string())
        .status();
    let unready = poll(Duration::from_secs(5), || {
        let (code, ready) = readyz(server.admin);
        (code == 503).then_some(ready)
    });
    let Some(unready) = unready else {
        panic!("never unready:\n{}", server.log())
    };
    assert_eq!(unready["status"], "not ready", "{unready}");
    // Still answering while unready.
    let r = client
        .should_rate_limit(request("edge", &[&[("tenant", "drain")]]))
        .await;
    assert!(r.is_ok(), "{r:?}");
    let status = server.terminate();
    assert!(status.success(), "{}", server.log());
}

#[tokio::test]
async fn json_logs_are_one_object_per_line() {
    let mut server = TestServer::builder(RULES)
        .env("TOLLGATE_LOG_FORMAT", "json")
        .start();
    let status = server.terminate();
    assert!(status.success());
    let log = server.log();
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(lines.len() >= 3, "startup, ready, shutdown: {log}");
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}\n{log}"));
        assert!(
            v["timestamp"].is_string() && v["level"].is_string(),
            "{line}"
        );
        assert!(v["fields"]["message"].is_string(), "{line}");
    }
    let ready = lines
        .iter()
        .find(|l| l.contains("tollgate ready"))
        .expect("the ready line");
    let v: serde_json::Value = serde_json::from_str(ready).unwrap();
    assert_eq!(v["level"], "INFO");
    assert!(
        v["fields"]["grpc_addr"].is_string(),
        "fields stay fields: {v}"
    );
}

/// With `log_format: json`, stderr is JSON to the last line, the fatal error included: a bad
/// setting (before the settings, and so the logger, exist), a broken rules file and a taken
/// port (after the logger started) each end in one ERROR object naming the cause.
#[test]
fn fatal_startup_errors_are_json_lines_too() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port to occupy");
    let taken = taken.local_addr().unwrap().to_string();
    let dir = temp_dir("broken-json");
    std::fs::write(dir.path().join("r.yaml"), "domain: \"\"\n").unwrap();
    let broken = dir.path().to_str().unwrap().to_string();
    for (rules, env, flag, cause) in [
        (
            "examples/rules",
            vec![("TOLLGATE_STORE_TIMEOUT_MS", "zero")],
            false,
            "store_timeout_ms",
        ),
        (
            "examples/rules",
            vec![("TOLLGATE_STORE_TIMEOUT_MS", "zero")],
            true,
            "store_timeout_ms",
        ),
        (broken.as_str(), vec![], false, "must not be empty"),
        ("examples/rules", vec![], false, "cannot listen on"),
        // The logger itself cannot start: the line is still JSON.
        (
            "examples/rules",
            vec![("RUST_LOG", "[[not a filter")],
            false,
            "log_level",
        ),
    ] {
        let mut env = env;
        let mut args = vec![
            "serve",
            "--rules",
            rules,
            "--grpc-addr",
            &taken,
            "--admin-addr",
            "127.0.0.1:0",
        ];
        if flag {
            args.extend(["--log-format", "json"]);
        } else {
            env.push(("TOLLGATE_LOG_FORMAT", "json"));
        }
        let (code, _, err) = run_tollgate(&args, &env);
        assert_eq!(code, 1, "{err}");
        let lines: Vec<serde_json::Value> = err
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{cause}: {e}: {l:?}")))
            .collect();
        let last = lines
            .last()
            .unwrap_or_else(|| panic!("{cause}: no line: {err}"));
        assert_eq!(last["level"], "ERROR", "{cause}: {last}");
        let message = last["fields"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("tollgate: ") && message.contains(cause),
            "{cause}: {last}"
        );
    }
    // Text stays text.
    let (code, _, err) = run_tollgate(
        &[
            "serve",
            "--rules",
            "examples/rules",
            "--grpc-addr",
            &taken,
            "--admin-addr",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(
        err.lines()
            .last()
            .is_some_and(|l| l.starts_with("tollgate: cannot listen on")),
        "{err}"
    );
}
