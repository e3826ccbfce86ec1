//! The first day in production: mistakes every team makes on day one must fail loudly instead
//! of turning rate limiting off without a sign, and the signals an operator reads must say
//! what is true. (Store connection health after a Redis kill is in `faults.rs`; the response
//! headers through Envoy are in `envoy_e2e.rs`.)

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::inproc::InProcess;
use common::{get, poll, readyz, request, run_tollgate, temp_dir};

const RULES: &str = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 1000}\n";

#[test]
fn check_fails_on_a_path_without_rules_files() {
    let dir = temp_dir("check-empty");
    let rules = dir.path().join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    std::fs::write(rules.join("edge.yaml"), RULES).unwrap();
    // One level up holds them in a subdirectory: loaded, as the reference walks the tree.
    let (code, out, err) = run_tollgate(&["check", dir.path().to_str().unwrap()], &[]);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    assert!(out.contains("1 domain(s) [edge]"), "{out}");
    let (code, out, err) = run_tollgate(&["check", rules.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 domain(s) [edge]"), "{out}");
    // Rules under another extension are no rules files.
    let json = dir.path().join("json");
    std::fs::create_dir_all(&json).unwrap();
    std::fs::write(json.join("edge.json"), "{}").unwrap();
    let (code, out, err) = run_tollgate(&["check", json.to_str().unwrap()], &[]);
    assert_eq!(code, 1, "stdout: {out}\nstderr: {err}");
    assert!(err.contains("no rules files"), "{err}");
}

#[test]
fn a_mistyped_variable_is_named_at_startup_and_a_piped_log_has_no_colour() {
    let dir = temp_dir("typo");
    let missing = dir.path().join("no-such-rules");
    // Stops at once (no rules there), after the startup warnings.
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--rules"])
        .arg(&missing)
        .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .env("TOLLGATE_STOR", "redis://127.0.0.1:6379")
        // What Kubernetes injects for a Service named tollgate: not ours, not warned about.
        .env("TOLLGATE_PORT", "tcp://10.0.0.1:8081")
        .env("TOLLGATE_SERVICE_HOST", "10.0.0.1")
        .stdin(Stdio::null())
        .output()
        .expect("run tollgate");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("TOLLGATE_STOR is not a tollgate setting") && err.contains("TOLLGATE_STORE?"),
        "{err}"
    );
    assert!(!err.contains("TOLLGATE_PORT "), "{err}");
    assert!(!err.contains("TOLLGATE_SERVICE_HOST"), "{err}");
    assert!(
        !err.contains('\u{1b}'),
        "colour codes in a log written to a pipe: {err:?}"
    );
    // The error is printed once, not once per error in its chain.
    assert_eq!(
        err.matches("cannot read the rules path").count(),
        1,
        "{err}"
    );
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn unready_without_rules_until_a_domain_is_loaded() {
    let server = InProcess::builder("")
        .without_rules()
        .settings(|s| {
            s.unready_without_rules = true;
            s.reload_interval_ms = 100;
        })
        .ready_status(503)
        .start();
    let (code, body) = readyz(server.admin);
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["status"], "no rules loaded", "{body}");
    assert_eq!(body["rules"]["domains"], 0, "{body}");
    // The log does not say "ready" while /readyz says 503.
    let log = server.log();
    assert!(
        log.contains("tollgate listening, not ready: no rules loaded")
            && !log.contains("tollgate ready"),
        "{log}"
    );
    // The rules arrive (a ConfigMap fixed, say): the reload makes the replica ready.
    std::fs::write(server.rules_dir().join("edge.yaml"), RULES).unwrap();
    let ready = poll(Duration::from_secs(10), || {
        let (code, body) = readyz(server.admin);
        (code == 200).then_some(body)
    })
    .unwrap_or_else(|| panic!("never ready after the rules arrived:\n{}", server.log()));
    assert_eq!(ready["status"], "ready", "{ready}");
    assert_eq!(ready["rules"]["domains"], 1, "{ready}");

    // Without the setting, an empty directory is ready (and warned about), as before.
    let lenient = InProcess::builder("").without_rules().start();
    assert_eq!(readyz(lenient.admin).0, 200);
    assert!(
        lenient.log().contains("no rules files"),
        "{}",
        lenient.log()
    );
}

/// A TCP relay in front of `target` that counts the connections it accepted.
async fn counting_proxy(target: std::net::SocketAddr) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    (addr, accepted)
}

/// Sends requests on one channel for `for_ms`; returns (requests that failed, requests that
/// needed a retry, the errors seen). A request that races the connection's close is retried, as Envoy retries a
/// stream a server refused after its GOAWAY (the server never saw it): up to twice, 10 ms
/// apart, since the client channel may take a moment to notice the old connection is gone
/// and open the next one. A request that fails three times counts as failed.
async fn steady_traffic(addr: std::net::SocketAddr, for_ms: u64) -> (usize, usize, Vec<String>) {
    let mut client = common::client_of(addr).await;
    let deadline = tokio::time::Instant::now() + Duration::from_millis(for_ms);
    let (mut failed, mut retries, mut errors) = (0, 0, Vec::new());
    while tokio::time::Instant::now() < deadline {
        let req = request("edge", &[&[("tenant", "t")]]);
        let mut attempt = 0;
        loop {
            match client.should_rate_limit(req.clone()).await {
                Ok(_) => break,
                Err(e) => {
                    errors.push(format!("attempt {attempt}: {e}"));
                    attempt += 1;
                    if attempt == 1 {
                        retries += 1;
                    }
                    if attempt == 3 {
                        failed += 1;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (failed, retries, errors)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aged_grpc_connections_are_closed_gracefully_so_clients_rebalance() {
    let aged = InProcess::start(RULES, |s| {
        s.grpc_max_connection_age_ms = 300;
        s.grpc_max_connection_age_grace_ms = 1_000;
    });
    let (proxy, accepted) = counting_proxy(aged.grpc).await;
    let (failed, retries, errors) = steady_traffic(proxy, 2_000).await;
    assert_eq!(
        failed,
        0,
        "requests failed across the GOAWAY: {errors:#?}\n{}",
        aged.log()
    );
    let n = accepted.load(Ordering::SeqCst);
    assert!(n >= 2, "one connection for 2 s with a 300 ms age: {n}");
    assert!(
        retries < n,
        "at most one racing request per connection switch: {retries}, {n}"
    );

    // The default keeps the connection.
    let kept = InProcess::start(RULES, |_| {});
    let (proxy, accepted) = counting_proxy(kept.grpc).await;
    let (failed, retries, errors) = steady_traffic(proxy, 1_000).await;
    assert_eq!((failed, retries), (0, 0), "{errors:#?}");
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

/// A broken edit of the rules files is visible on `/readyz` and `/config` (the error with
/// file:line, and when), while the rules in force stay; fixing the file clears it.
#[test]
fn a_failed_reload_shows_on_readyz_and_config_until_fixed() {
    let server = InProcess::builder(RULES)
        .settings(|s| s.reload_interval_ms = 100)
        .start();
    let (_, before) = readyz(server.admin);
    let loaded_at = before["rules"]["loaded_at_unix_ms"].as_u64().unwrap();
    assert!(
        loaded_at > 0 && before["rules"].get("reload_error").is_none(),
        "{before}"
    );
    let file = std::fs::read_dir(server.rules_dir())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::write(&file, "domain: edge\nnot_a_field: 1\n").unwrap();
    let failed = poll(Duration::from_secs(10), || {
        let (code, body) = readyz(server.admin);
        body["rules"]
            .get("reload_error")
            .is_some()
            .then_some((code, body))
    })
    .unwrap_or_else(|| panic!("the failed reload never showed:\n{}", server.log()));
    let (code, body) = failed;
    assert_eq!(code, 200, "the rules in force still serve: {body}");
    let error = body["rules"]["reload_error"].as_str().unwrap();
    let name = file.file_name().unwrap().to_str().unwrap();
    assert!(
        error.contains(&format!("{name}:2")) && error.contains("not_a_field"),
        "{error}"
    );
    assert_eq!(
        body["rules"]["loaded_at_unix_ms"].as_u64(),
        Some(loaded_at),
        "{body}"
    );
    assert!(body["rules"]["reload_failed_at_unix_ms"].as_u64() >= Some(loaded_at));
    let (_, config) = get(server.admin, "/config");
    assert!(config.contains("not_a_field"), "{config}");
    // Fixed: reloaded, and the error is gone.
    std::fs::write(&file, RULES).unwrap();
    let fixed = poll(Duration::from_secs(10), || {
        let (_, body) = readyz(server.admin);
        body["rules"].get("reload_error").is_none().then_some(body)
    });
    assert!(
        fixed.is_some(),
        "the error stayed after the fix:\n{}",
        server.log()
    );
}

/// Envoy's `domain: Edge` against rules for `edge`: nothing limits those requests, so each
/// new name is logged once, counted by name, and listed on `/readyz`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_domain_is_logged_once_counted_and_listed() {
    let server = InProcess::start(RULES, |_| {});
    let mut client = server.client().await;
    for _ in 0..3 {
        let r = client
            .should_rate_limit(request("Edge", &[&[("tenant", "a")]]))
            .await
            .expect("answered (OK: no rule)");
        assert_eq!(r.get_ref().overall_code, 1, "OK");
    }
    let (_, body) = readyz(server.admin);
    assert_eq!(
        body["rules"]["unknown_domains"],
        serde_json::json!(["Edge"]),
        "{body}"
    );
    let log = server.log();
    assert_eq!(log.matches("no rules file declares").count(), 1, "{log}");
    let metrics = get(server.admin, "/metrics").1;
    assert!(
        metrics.contains(r#"tollgate_unknown_domain_requests_total{domain="Edge"} 3"#),
        "{metrics}"
    );
}
