//! Redis credentials outside the URL: an ACL user limited to the commands tollgate's scripts
//! run and to its key prefix, its password in a file (as a mounted Kubernetes Secret), a
//! rotated password picked up on reconnect, and a wrong password as a clear, secret-free error.
//! Also the other production-Redis check: an evicting `maxmemory-policy` is a `/readyz` warning.

mod common;

use std::time::Duration;

use common::redis::{TestRedis, unique_prefix};
use common::{TestServer, get, readyz, request, temp_dir};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

const RULES: &str = "domain: acl\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 3}\n";

/// An ACL user that may run tollgate's commands on keys under `prefix` and nothing else.
fn acl_user(redis: &TestRedis, user: &str, password: &str, prefix: &str) {
    let _: String = redis.cmd(&[
        "ACL",
        "SETUSER",
        user,
        "reset",
        "on",
        &format!(">{password}"),
        &format!("~{prefix}*"),
        "+evalsha",
        "+eval",
        "+script|load",
        "+ping",
        "+hello",
        "+select",
        // What the scripts themselves call.
        "+time",
        "+get",
        "+set",
        // 0.1.0's token bucket state (read while it lasts; written with store_state_format: hash).
        "+hmget",
        "+hset",
        "+del",
        "+pexpire",
        "+zadd",
        "+zcard",
        "+zrem",
        "+zremrangebyscore",
    ]);
}

async fn admitted_of(server: &TestServer, tenant: &str, n: usize) -> usize {
    let mut client = server.client().await;
    let mut admitted = 0;
    for _ in 0..n {
        let r = client
            .should_rate_limit(request("acl", &[&[("tenant", tenant)]]))
            .await
            .expect("answered");
        admitted += usize::from(r.get_ref().overall_code == Code::Ok as i32);
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_with_a_password_file_works_and_a_rotation_applies_on_reconnect() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("acl");
    acl_user(&redis, "tollgate", "first-secret", &prefix);
    let dir = temp_dir("secret");
    let file = dir.path().join("password");
    std::fs::write(&file, "first-secret\n").unwrap();
    let server = TestServer::builder(RULES)
        .arg("store", &redis.url())
        .arg("key-prefix", &prefix)
        .arg("store-username", "tollgate")
        .arg("store-password-file", &file.display().to_string())
        // One connection: once a call has gone through after the rotation, it is the new one.
        .arg("store-pool-size", "1")
        .arg("store-timeout-ms", "500")
        .arg("breaker-probe-ms", "100")
        .start();
    assert_eq!(readyz(server.admin).1["store"]["state"], "connected");
    assert_eq!(admitted_of(&server, "a", 5).await, 3, "{}", server.log());
    let keys: Vec<String> = redis.cmd(&["KEYS", &format!("{prefix}*")]);
    assert!(keys.iter().any(|k| k.contains("tenant=a")), "{keys:?}");

    // The Secret rotates: Redis takes the new password, the file gets it, and the old
    // connections are cut. tollgate reconnects with the file's new content.
    let _: String = redis.cmd(&["ACL", "SETUSER", "tollgate", "resetpass", ">second-secret"]);
    std::fs::write(&file, "second-secret\n").unwrap();
    let _: i64 = redis.cmd(&["CLIENT", "KILL", "USER", "tollgate"]);
    // Until tollgate has reconnected, requests are answered by the fallback: probe with fresh
    // tenants until one's bucket shows up in Redis (a call that went through).
    let mut probe = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        probe += 1;
        let tenant = format!("probe{probe}");
        admitted_of(&server, &tenant, 1).await;
        let keys: Vec<String> = redis.cmd(&["KEYS", &format!("{prefix}*tenant={tenant}|*")]);
        if !keys.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never reconnected with the rotated password:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Spent in Redis before the rotation, so still spent: the shared bucket, not a fallback.
    assert_eq!(admitted_of(&server, "a", 2).await, 0, "{}", server.log());
    assert_eq!(admitted_of(&server, "b", 5).await, 3, "{}", server.log());
    assert!(!server.log().contains("second-secret") && !server.log().contains("first-secret"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_wants_a_password_none_given_is_an_auth_failure_not_connected() {
    // `requirepass` and no credentials: the connection opens, then every command but AUTH and
    // HELLO answers NOAUTH. That used to pass as "store connected", NOAUTH counted as a script
    // error, and "SCRIPT LOAD refused" logged several times a second.
    let redis = TestRedis::start();
    // Set after the start: the harness checks the server with a PING of its own.
    redis.cmd::<()>(&["CONFIG", "SET", "requirepass", "set-but-not-given"]);
    let prefix = unique_prefix("noauth");
    let server = common::InProcess::builder(RULES)
        .settings(|s| {
            s.store = redis.url();
            s.key_prefix = prefix.clone();
        })
        .ready_status(503)
        .start();
    let body = common::poll(Duration::from_secs(5), || {
        let (_, body) = readyz(server.admin);
        (body["store"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("NOAUTH")))
        .then_some(body)
    })
    .unwrap_or_else(|| readyz(server.admin).1);
    assert_ne!(body["store"]["state"], "connected", "{body}");
    assert!(
        body["store"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("NOAUTH")),
        "/readyz says why: {body}"
    );
    let mut client = server.client().await;
    client
        .should_rate_limit(request("acl", &[&[("tenant", "x")]]))
        .await
        .expect("answered (by the fallback)");
    let (_, metrics) = get(server.admin, "/metrics");
    assert!(
        metrics.contains("tollgate_store_errors_total{kind=\"auth\"}"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("tollgate_store_errors_total{kind=\"script\"}"),
        "NOAUTH is not a script error: {metrics}"
    );
    let log = server.log();
    assert!(!log.contains("store connected"), "{log}");
    assert!(!log.contains("SCRIPT LOAD refused"), "{log}");
}

#[test]
fn a_wrong_password_is_a_clear_error_without_the_secret() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("acl-bad");
    acl_user(&redis, "tollgate", "right-secret", &prefix);
    let server = TestServer::builder(RULES)
        .arg("store", &redis.url())
        .arg("key-prefix", &prefix)
        .arg("store-username", "tollgate")
        .arg("store-password", "wrong-secret")
        .ready_status(503)
        .start();
    let (status, body) = readyz(server.admin);
    assert_eq!(
        (status, body["status"].as_str()),
        (503, Some("store never answered")),
        "a Redis tollgate cannot use is no crash, and the replica is not ready: {body}"
    );
    // One ERROR line with the cause, however many reconnect attempts.
    let log = server.log();
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("ERROR") && l.contains("refused the credentials"))
            .count(),
        1,
        "{log}"
    );
    assert_eq!(body["store"]["state"], "disconnected", "{body}");
    let error = body["store"]["error"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        error.contains("WRONGPASS") || error.to_lowercase().contains("auth"),
        "/readyz says why: {body}"
    );
    let (_, metrics) = get(server.admin, "/metrics");
    assert!(
        metrics.contains("tollgate_store_errors_total{kind=\"auth\"}"),
        "{metrics}"
    );
    let (_, config) = get(server.admin, "/config");
    for text in [server.log(), config, body.to_string()] {
        assert!(
            !text.contains("wrong-secret"),
            "the password leaked: {text}"
        );
    }
}

#[test]
fn an_evicting_maxmemory_policy_is_a_readyz_warning() {
    let evicting =
        TestRedis::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]);
    let server = TestServer::builder(RULES)
        .arg("store", &evicting.url())
        .arg("key-prefix", &unique_prefix("evict"))
        .start();
    // Read on each new connection: poll until the first one is made.
    let body = common::poll(std::time::Duration::from_secs(10), || {
        let (_, body) = readyz(server.admin);
        body["store"].get("warnings").is_some().then_some(body)
    })
    .expect("a warning in /readyz");
    let warnings = body["store"]["warnings"].to_string();
    assert!(
        warnings.contains("allkeys-lru") && warnings.contains("volatile-ttl"),
        "{body}"
    );
    assert!(
        server.log().contains("maxmemory-policy is allkeys-lru"),
        "{}",
        server.log()
    );

    // The recommended policy: no warning.
    let fine =
        TestRedis::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", "volatile-ttl"]);
    let server = TestServer::builder(RULES)
        .arg("store", &fine.url())
        .arg("key-prefix", &unique_prefix("evict"))
        .start();
    let connected = common::poll(std::time::Duration::from_secs(10), || {
        let (_, body) = readyz(server.admin);
        (body["store"]["state"] == "connected").then_some(body)
    })
    .expect("connected");
    assert!(connected["store"].get("warnings").is_none(), "{connected}");
}
