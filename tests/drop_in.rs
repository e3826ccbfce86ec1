//! Drop-in by default: what a platform team replacing envoyproxy/ratelimit gets without
//! setting anything of tollgate's.
//!
//! - A replica that has never reached its Redis (a wrong password, none, an unknown host, a
//!   wrong port, the reference's default unix socket) is not ready, in `serve` and as
//!   `ratelimit`, so it never rolls out green while every replica decides from its local
//!   share; a refused password is one ERROR with the cause; it becomes ready once Redis
//!   answers; `REDIS_STARTUP_MAX_ELAPSED_TIME` makes it give up and exit, as the reference does.
//! - Started as `ratelimit`, it decides as the reference does: a fixed window (12 quick hits on
//!   10 a second admit 10, and the reset is the window's end), an error when Redis is away, the
//!   rules of every subdirectory loaded, and one startup line that says so, or names each
//!   setting that makes it decide otherwise.
//!
//! Every process here is the real binary against a real `redis-server` on its own port.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::redis::TestRedis;
use common::{
    client_of, envoy_gateway_env, free_port, get, poll, ratelimit_link, readyz, request,
    start_clean, temp_dir, tollgate_binary,
};

const RULES: &str = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 10}\n";

/// A Redis that wants the password `right-password` (set after the start: the harness checks
/// the server with a PING of its own).
fn password_protected() -> TestRedis {
    let redis = TestRedis::start();
    redis.cmd::<()>(&["CONFIG", "SET", "requirepass", "right-password"]);
    redis
}

/// `tollgate serve` with only `vars` in its environment, its stderr in `log`.
fn serve(vars: &[(&str, String)], log: &Path) -> Child {
    common::start_clean_with(&tollgate_binary(), &["serve"], vars, log)
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn read(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// Waits until both ports listen and `/readyz` says the store never answered; panics with
/// the log otherwise. Returns the `/readyz` body.
fn assert_unready_for_want_of_the_store(
    admin: SocketAddr,
    log: &Path,
    case: &str,
) -> serde_json::Value {
    let body = poll(Duration::from_secs(20), || {
        let (code, body) = readyz(admin);
        (code == 503 && body["status"] == "store never answered").then_some(body)
    })
    .unwrap_or_else(|| {
        panic!(
            "{case}: /readyz never said 'store never answered' (last {:?}); log:\n{}",
            readyz(admin),
            read(log)
        )
    });
    // The reference's probe path says the same.
    assert_eq!(
        get(admin, "/healthcheck"),
        (500, "store never answered\n".to_string()),
        "{case}"
    );
    body
}

/// A wrong password, no password, an unknown host and a wrong port: each replica listens,
/// unready, and says why; a refused password is one ERROR, not one per attempt.
#[test]
fn a_replica_that_never_reached_its_redis_is_not_ready() {
    let redis = password_protected();
    let dir = temp_dir("drop-in-unready");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).unwrap();
    let port = redis.port();
    let cases = [
        (
            "a wrong password",
            format!("redis://:wrong@127.0.0.1:{port}"),
            Some("authentication failed"),
        ),
        (
            "no password",
            format!("redis://127.0.0.1:{port}"),
            Some("noauth"),
        ),
        (
            "an unknown host",
            "redis://no-such-redis.invalid:6379".to_string(),
            None,
        ),
        (
            "a wrong port",
            format!("redis://127.0.0.1:{}", free_port()),
            None,
        ),
    ];
    for (case, store, cause) in cases {
        let (grpc, admin) = (free_port(), free_port());
        let log = dir.path().join(format!("{}.log", case.replace(' ', "-")));
        let child = serve(
            &[
                ("TOLLGATE_STORE", store),
                ("TOLLGATE_RULES", rules.display().to_string()),
                ("TOLLGATE_GRPC_ADDR", format!("127.0.0.1:{grpc}")),
                ("TOLLGATE_ADMIN_ADDR", format!("127.0.0.1:{admin}")),
            ],
            &log,
        );
        let admin: SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
        let body = assert_unready_for_want_of_the_store(admin, &log, case);
        assert_eq!(body["store"]["state"], "disconnected", "{case}: {body}");
        if let Some(cause) = cause {
            let error = body["store"]["error"].as_str().unwrap_or_default();
            assert!(
                error.to_lowercase().contains(cause),
                "{case}: /readyz's store error {error:?}"
            );
            // Several reconnect attempts (50 ms doubling) later, still one ERROR line.
            std::thread::sleep(Duration::from_secs(2));
            let text = read(&log);
            let errors: Vec<&str> = text
                .lines()
                .filter(|l| l.contains("ERROR") && l.contains("refused the credentials"))
                .collect();
            assert_eq!(
                errors.len(),
                1,
                "{case}: one ERROR with the cause; log:\n{text}"
            );
            assert!(
                errors[0].to_lowercase().contains(cause),
                "{case}: {}",
                errors[0]
            );
        }
        let text = read(&log);
        assert!(
            text.contains("not ready until the store answers") && !text.contains("tollgate ready"),
            "{case}: log:\n{text}"
        );
        stop(child);
    }
}

/// As `ratelimit`: a wrong `REDIS_AUTH` and the reference's default unix socket (no
/// `REDIS_SOCKET_TYPE`, nothing at `/var/run/nutcracker/ratelimit.sock`) leave it unready;
/// once Redis takes the password it becomes ready, and `/healthcheck` says `OK`.
#[test]
fn started_as_ratelimit_a_wrong_redis_keeps_it_unready_until_redis_answers() {
    let redis = password_protected();
    let dir = temp_dir("drop-in-reference-unready");
    std::fs::create_dir_all(dir.path().join("data/ratelimit/config")).unwrap();
    std::fs::write(dir.path().join("data/ratelimit/config/edge.yaml"), RULES).unwrap();
    let link = ratelimit_link(dir.path());

    let (grpc, http) = (free_port(), free_port());
    let mut vars = envoy_gateway_env(redis.port(), &dir.path().join("data"), grpc, http);
    vars.retain(|(k, _)| !k.starts_with("REDIS_"));
    let log = dir.path().join("unix.log");
    let child = start_clean(&link, &vars, &log);
    let admin: SocketAddr = format!("127.0.0.1:{http}").parse().unwrap();
    assert_unready_for_want_of_the_store(admin, &log, "the default unix socket");
    stop(child);

    let (grpc, http) = (free_port(), free_port());
    let mut vars = envoy_gateway_env(redis.port(), &dir.path().join("data"), grpc, http);
    vars.push(("REDIS_AUTH", "wrong".to_string()));
    let log = dir.path().join("auth.log");
    let child = start_clean(&link, &vars, &log);
    let admin: SocketAddr = format!("127.0.0.1:{http}").parse().unwrap();
    assert_unready_for_want_of_the_store(admin, &log, "a wrong REDIS_AUTH");
    // What the log tells a migrating user: in reference mode a decision without Redis is
    // UNAVAILABLE (`fallback: error`), not a local fallback's.
    let text = read(&log);
    assert!(
        text.contains("store unreachable at startup")
            && text
                .contains("fallback: error, the default started as ratelimit, answers UNAVAILABLE")
            && !text.contains("go to the fallback"),
        "log:\n{text}"
    );
    // Redis now takes that password: the replica reconnects and becomes ready.
    let mut admin_conn = ::redis::Client::open(format!(
        "redis://:right-password@127.0.0.1:{}",
        redis.port()
    ))
    .unwrap()
    .get_connection()
    .unwrap();
    ::redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "wrong"])
        .query::<()>(&mut admin_conn)
        .unwrap();
    let ready = poll(Duration::from_secs(15), || {
        (get(admin, "/healthcheck") == (200, "OK".to_string())).then_some(())
    });
    let said = poll(Duration::from_secs(5), || {
        read(&log)
            .contains("the store answered: tollgate ready")
            .then_some(())
    });
    let text = read(&log);
    stop(child);
    assert!(
        ready.is_some(),
        "never ready once Redis answered; log:\n{text}"
    );
    assert!(said.is_some(), "{text}");
}

/// `REDIS_STARTUP_MAX_ELAPSED_TIME`: past it without an answer the process exits non-zero with
/// the cause, as the reference does (a crash loop is what an operator sees).
#[test]
fn started_as_ratelimit_it_gives_up_after_redis_startup_max_elapsed_time() {
    let dir = temp_dir("drop-in-give-up");
    std::fs::create_dir_all(dir.path().join("data/ratelimit/config")).unwrap();
    let (grpc, http) = (free_port(), free_port());
    let mut vars = envoy_gateway_env(free_port(), &dir.path().join("data"), grpc, http);
    vars.push(("REDIS_STARTUP_MAX_ELAPSED_TIME", "2s".to_string()));
    let log = dir.path().join("give-up.log");
    let mut child = start_clean(&ratelimit_link(dir.path()), &vars, &log);
    let status = poll(Duration::from_secs(20), || child.try_wait().ok().flatten());
    let text = read(&log);
    let Some(status) = status else {
        stop(child);
        panic!("still running 20 s after a 2 s REDIS_STARTUP_MAX_ELAPSED_TIME; log:\n{text}");
    };
    assert!(!status.success(), "{text}");
    assert!(
        text.contains("the store did not answer within store_startup_timeout_ms (2000 ms)")
            && text.contains("refused"),
        "the cause is named; log:\n{text}"
    );
}

/// Milliseconds into the current second of the wall clock (Redis's `TIME` on this machine).
fn epoch_second() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn ms_into_second() -> u64 {
    (SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 1000) as u64
}

/// Started as `ratelimit` with nothing of tollgate's: the reference's fixed window (12 quick
/// hits on 10 a second admit exactly 10; the reset is the second's end), rules from a
/// subdirectory of the config directory, an error while Redis is away, and a startup line that
/// says it decides as the reference does. With `TOLLGATE_FALLBACK=local` the line names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_as_ratelimit_it_decides_as_the_reference_does() {
    let mut redis = TestRedis::start();
    let dir = temp_dir("drop-in-decides");
    let team = dir.path().join("data/ratelimit/config/team-b");
    std::fs::create_dir_all(&team).unwrap();
    std::fs::write(
        team.join("payments.yaml"),
        RULES.replace("edge", "payments"),
    )
    .unwrap();
    let link = ratelimit_link(dir.path());
    let (grpc_port, http) = (free_port(), free_port());
    let vars = envoy_gateway_env(redis.port(), &dir.path().join("data"), grpc_port, http);
    let log = dir.path().join("decides.log");
    let child = start_clean(&link, &vars, &log);
    let admin: SocketAddr = format!("127.0.0.1:{http}").parse().unwrap();
    let ready = poll(Duration::from_secs(20), || {
        (get(admin, "/healthcheck") == (200, "OK".to_string())).then_some(())
    });
    assert!(ready.is_some(), "not ready; log:\n{}", read(&log));
    let text = read(&log);
    assert!(
        text.contains("started as envoyproxy/ratelimit: decides as it does"),
        "log:\n{text}"
    );

    let grpc: SocketAddr = format!("127.0.0.1:{grpc_port}").parse().unwrap();
    let client = client_of(grpc).await;
    // 12 at once, early in a second, so they fall in one window (a busy machine that lets
    // them straddle a second's end gets another try, on a fresh tenant).
    let mut measured = None;
    for attempt in 0..5 {
        while !(50..300).contains(&ms_into_second()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let started = ms_into_second();
        let tenant = format!("acme-{attempt}");
        let calls = (0..12).map(|_| {
            let mut client = client.clone();
            let tenant = tenant.clone();
            async move {
                client
                    .should_rate_limit(request("payments", &[&[("tenant", &tenant)]]))
                    .await
                    .expect("ShouldRateLimit")
                    .into_inner()
            }
        });
        let second = epoch_second();
        let answers = futures_util::future::join_all(calls).await;
        let at = ms_into_second();
        // All 12 in one second: begun and ended in the same one (a batch slower than a
        // second can end later in the next second than it began in this one).
        if at >= started && epoch_second() == second {
            measured = Some((answers, started, at));
            break;
        }
    }
    let (answers, started, at) = measured.expect("12 calls within one second in 5 tries");
    let admitted = answers.iter().filter(|r| r.overall_code == 1).count();
    assert_eq!(
        admitted, 10,
        "a fixed window of 10 admits 10 of 12: {answers:?}"
    );
    let over = answers.iter().find(|r| r.overall_code == 2).unwrap();
    let reset = over.statuses[0]
        .duration_until_reset
        .as_ref()
        .map(|d| d.seconds as u64 * 1000 + d.nanos as u64 / 1_000_000)
        .unwrap_or_default();
    // The window's end, in whole seconds rounded up as the reference reports it: what is left
    // of this second is 1 s (the check once compared it with 1000 − the batch's end in ms, and
    // failed on a busy machine whose batch ended 206 ms into the second).
    assert_eq!(
        reset, 1000,
        "duration_until_reset {reset} ms for a batch from {started} to {at} ms into the second"
    );

    // Redis away: the call fails, so Envoy's failure_mode_deny decides, as with the reference.
    redis.kill();
    let mut failed = None;
    for _ in 0..100 {
        let mut client = client.clone();
        let answer = client
            .should_rate_limit(request("payments", &[&[("tenant", "other")]]))
            .await;
        if let Err(status) = answer {
            failed = Some(status);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = read(&log);
    stop(child);
    let status = failed.unwrap_or_else(|| panic!("no error while Redis is away; log:\n{text}"));
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");

    // A tollgate setting that decides otherwise is named with how to undo it.
    let (grpc_port, http) = (free_port(), free_port());
    let mut vars = envoy_gateway_env(free_port(), &dir.path().join("data"), grpc_port, http);
    vars.push(("TOLLGATE_FALLBACK", "local".to_string()));
    vars.push(("TOLLGATE_UNREADY_UNTIL_STORE_ANSWERS", "false".to_string()));
    let log = dir.path().join("differs.log");
    let child = start_clean(&link, &vars, &log);
    let admin: SocketAddr = format!("127.0.0.1:{http}").parse().unwrap();
    let listening = poll(Duration::from_secs(20), || {
        (get(admin, "/healthcheck").0 == 200).then_some(())
    });
    let text = read(&log);
    stop(child);
    assert!(listening.is_some(), "log:\n{text}");
    let line = text
        .lines()
        .find(|l| l.contains("started as envoyproxy/ratelimit, decides otherwise in 2 way(s)"))
        .unwrap_or_else(|| panic!("no line naming the differences; log:\n{text}"));
    assert!(line.contains("set fallback=error"), "{line}");
    assert!(
        line.contains("set unready_until_store_answers=true"),
        "{line}"
    );
}

/// A replica told to stop while it still waits for its Redis stops cleanly, even when
/// `store_startup_timeout_ms` runs out during its drain: giving up is for a start that never
/// ends, not for a stop.
#[test]
fn a_stop_during_the_wait_for_redis_is_clean_even_past_the_startup_timeout() {
    let port = free_port();
    let server = common::InProcess::builder(RULES)
        .settings(|s| {
            s.store = format!("redis://127.0.0.1:{port}");
            s.store_startup_timeout_ms = 1_000;
            s.drain_ms = 2_000;
        })
        .ready_status(503)
        .start();
    let started = std::time::Instant::now();
    let result = server.shutdown();
    assert!(
        started.elapsed() >= Duration::from_millis(1_900),
        "drained first"
    );
    assert_eq!(result, Ok(()), "a clean stop, not a startup timeout");
}
