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
    assert_eq!(v["no_rule"], 0, "every request matched the rule: {out}");
    assert!(!out.contains("no rule matched"), "{out}");
    // The latencies are the requests' own: a closed loop of 8 keeps 8 in flight, so the mean
    // latency is 8 × the measured time ÷ the requests (Little's law). The median and the p99
    // must sit around it (a unit slip, or a clock read in the wrong place, is off by far more
    // than these factors).
    let measured_us = v["seconds"].as_f64().unwrap() * 1e6;
    let mean_us = 8.0 * measured_us / v["requests"].as_f64().unwrap();
    let (p50, p99) = (v["p50_us"].as_f64().unwrap(), v["p99_us"].as_f64().unwrap());
    assert!(
        p50 > 0.0 && p50 <= 2.0 * mean_us && p99 >= 0.5 * mean_us,
        "p50 {p50} µs, p99 {p99} µs; Little's law gives a mean of {mean_us:.0} µs: {out}"
    );
}

/// A run whose descriptor no rule limits says so: it measured the no-rule path.
#[test]
fn a_run_that_matched_no_rule_says_so() {
    let server = TestServer::builder(RULES).start();
    let target = server.grpc.to_string();
    let (code, out, err) = run_tollgate(
        &[
            "bench",
            "--target",
            &target,
            "--duration",
            "0.5",
            "--warmup",
            "0",
            "--domain",
            "elsewhere",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert!(v["no_rule"].as_u64().unwrap() > 0, "{out}");
    assert_eq!(v["no_rule"], v["ok"], "{out}");
    assert!(
        out.contains("no rule matched domain 'elsewhere', key 'tenant'"),
        "{out}"
    );
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

/// A process's user + system CPU time so far, in ms, read from `/proc/<pid>/stat` (fields 14
/// and 15, counted after the command name's closing parenthesis; 10 ms ticks).
fn cpu_ms(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    let fields: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|f| f.parse().unwrap())
        .collect();
    (fields[0] + fields[1]) * 10
}

/// The bench's last stdout line, as JSON.
fn json_line(out: &str) -> serde_json::Value {
    serde_json::from_str(out.lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn open_loop_sends_on_schedule_and_reports_the_servers_cpu_per_request() {
    let server = TestServer::builder(RULES).start();
    let target = server.grpc.to_string();
    let pid = server.pid().to_string();
    let cpu_after = || cpu_ms(server.pid());
    // A busy machine can make the generator itself late (its run then says it is invalid, and
    // its window no longer holds the server's work): up to three runs, until one is valid.
    let mut attempt = 0;
    let (out, v, cpu_before) = loop {
        attempt += 1;
        let cpu_before = cpu_after();
        let (code, out, err) = run_tollgate(
            &[
                "bench",
                "--target",
                &target,
                "--rate",
                "400",
                "--duration",
                "1.5",
                "--warmup",
                "0.3",
                "--keys",
                "1000",
                "--target-pid",
                &pid,
            ],
            &[],
        );
        assert_eq!(code, 0, "{out}{err}");
        let v = json_line(&out);
        if v["valid"] == true || attempt == 3 {
            break (out, v, cpu_before);
        }
        eprintln!("attempt {attempt}: the generator sent late; again");
    };
    assert_eq!(v["mode"], "open", "{out}");
    assert_eq!(v["offered_rps"], 400.0);
    // The schedule decides the count: 400/s over the 1.5 s window, whatever the server does.
    let requests = v["requests"].as_u64().unwrap();
    assert!((599..=601).contains(&requests), "{out}");
    assert_eq!(v["errors"], 0, "{out}");
    assert_eq!(
        v["ok"].as_u64().unwrap() + v["over_limit"].as_u64().unwrap(),
        requests
    );
    // Warm-up requests were sent and answered too, just not measured.
    assert!(
        v["total_requests"].as_u64().unwrap() >= requests + 110,
        "{out}"
    );
    // The server's CPU time over the measured window, as the bench read it, against what this
    // test reads from /proc around the whole run (warm-up and start-up included, so more): at
    // most that, and most of it (the measured window is 1.5 s of the run's ~1.8 s). /proc
    // counts in 10 ms ticks, hence the slack.
    let cpu = v["server_cpu_us_per_request"].as_f64().unwrap();
    let user = v["server_user_us_per_request"].as_f64().unwrap();
    let in_window_ms = cpu * requests as f64 / 1000.0;
    let around_ms = (cpu_after() - cpu_before) as f64;
    eprintln!(
        "server CPU: {in_window_ms:.0} ms in the measured window (bench), {around_ms} ms around the run (/proc); {cpu:.0} µs per request, {user:.0} of them user"
    );
    assert!(user > 0.0 && user <= cpu, "{out}");
    if v["valid"] == true {
        assert!(
            in_window_ms <= around_ms + 20.0 && in_window_ms >= 0.5 * around_ms - 20.0,
            "the bench says {in_window_ms:.0} ms of server CPU in its window, /proc {around_ms} ms around the run: {out}"
        );
    } else {
        // Three late runs in a row: the machine is saturated. The run says so, and why.
        let why = v["invalid_reason"].as_str().unwrap_or_default();
        assert!(why.contains("sent late"), "{out}");
    }
    assert!(out.contains("open loop: offered 400 req/s"), "{out}");
}

/// A server that stops answering: an open loop keeps its schedule (it never waits for a free
/// slot), counts the stall from each request's scheduled time, and says the run is invalid once
/// it had to drop requests.
#[test]
fn open_loop_measures_a_stalled_server_from_the_schedule_and_marks_drops_invalid() {
    let server = TestServer::builder(RULES).start();
    let target = server.grpc.to_string();
    let pid = server.pid().to_string();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    // Resume the server once the bench has connected and written (the kernel holds its bytes
    // for the stopped server) and its 0.5 s schedule is over, while it still waits for its
    // answers: not at a fixed time after the bench was started, which a slow start would race.
    let port = server.grpc.port();
    let resume = {
        let pid = pid.clone();
        std::thread::spawn(move || {
            let connected = common::poll(std::time::Duration::from_secs(20), || {
                common::unread_bytes_on(port).then_some(())
            });
            std::thread::sleep(std::time::Duration::from_millis(1500));
            let resumed = std::process::Command::new("kill")
                .args(["-CONT", &pid])
                .status();
            (connected.is_some(), resumed)
        })
    };
    let (code, out, err) = run_tollgate(
        &[
            "bench",
            "--target",
            &target,
            "--rate",
            "200",
            "--duration",
            "0.5",
            "--warmup",
            "0",
            "--max-in-flight",
            "10",
        ],
        &[],
    );
    let (connected, resumed) = resume.join().unwrap();
    assert!(resumed.is_ok_and(|s| s.success()));
    assert!(
        connected,
        "the bench never wrote to the stopped server: {out}{err}"
    );
    assert_eq!(code, 0, "{out}{err}");
    let v = json_line(&out);
    assert_eq!(v["valid"], false, "{out}");
    assert_eq!(v["dropped"], 90, "100 due, 10 in flight: {out}");
    assert!(
        v["invalid_reason"]
            .as_str()
            .unwrap()
            .contains("90 requests not sent"),
        "{out}"
    );
    assert!(out.contains("INVALID RUN"), "{out}");
    // The 10 sent were answered after the stall, and their latency shows it.
    assert_eq!(
        (v["requests"].as_u64(), v["errors"].as_u64()),
        (Some(10), Some(0)),
        "{out}"
    );
    assert!(v["max_us"].as_u64().unwrap() >= 900_000, "{out}");
}

#[test]
fn bad_open_loop_flags_are_clear_errors() {
    for (flags, expect) in [
        (&["--rate", "0"][..], "--rate must be a positive number"),
        (&["--rate", "NaN"][..], "--rate must be a positive number"),
        // A schedule that could never be walked (and would have hung the pacer).
        (&["--rate", "1e300"][..], "at most 10,000,000"),
        (
            &["--rate", "10", "--warmup", "1e19"][..],
            "too long to schedule",
        ),
        (
            &["--rate", "10", "--max-in-flight", "0"][..],
            "max-in-flight",
        ),
    ] {
        let server = TestServer::builder(RULES).start();
        let target = server.grpc.to_string();
        let mut args = vec!["bench", "--target", &target, "--duration", "0.2"];
        args.extend_from_slice(flags);
        let (code, out, err) = run_tollgate(&args, &[]);
        assert_eq!(code, 1, "{flags:?}: {out}{err}");
        assert!(err.contains(expect), "{flags:?}: {err}");
    }
    let server = TestServer::builder(RULES).start();
    let target = server.grpc.to_string();
    let (code, _, err) = run_tollgate(
        &[
            "bench",
            "--target",
            &target,
            "--duration",
            "0.2",
            "--target-pid",
            "4294967295",
        ],
        &[],
    );
    assert_eq!(code, 1);
    assert!(err.contains("--target-pid 4294967295"), "{err}");
}

/// A run that cannot reach its target says why (the transport error's own cause), not only
/// that it could not connect: the binary prints an error's whole chain, each cause once.
#[test]
fn a_target_that_refuses_says_why() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let target = format!("127.0.0.1:{port}");
    let (code, out, err) = run_tollgate(&["bench", "--target", &target, "--duration", "1"], &[]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(
        err.contains(&format!("cannot connect to {target}")) && err.contains("refused"),
        "{err}"
    );
    assert_eq!(err.matches("refused").count(), 1, "each cause once: {err}");
}
