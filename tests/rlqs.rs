//! RLQS: real Envoys (1.40, `examples/envoy/rlqs/envoy.yaml`) enforce assignments that tollgate
//! claims out of one shared bucket in a real Redis; and the stream's bad input through a raw
//! gRPC client.
//!
//! The Envoy runs report every 5 s (Envoy 1.40 does, whatever `reporting_interval` says), so
//! each lasts a few intervals; they run in parallel with each other.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::envoy::TestEnvoy;
use common::redis::{TestRedis, unique_prefix};
use common::{InProcess, metric_sum, poll, request};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Kind;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
use tokio::sync::mpsc;

const EXAMPLE: &str = "examples/envoy/rlqs/envoy.yaml";

/// Sends `per_s` requests a second for tenant `tenant` through the Envoy at `front` for
/// `secs`, on one keep-alive connection (a connection per request would not keep up on a
/// busy machine); returns how many were admitted (200) and refused (429).
fn drive(front: SocketAddr, tenant: &str, per_s: u32, secs: u64) -> (u64, u64) {
    let log = drive_log(front, tenant, per_s, secs);
    let ok = log.iter().filter(|(_, admitted)| *admitted).count() as u64;
    (ok, log.len() as u64 - ok)
}

/// As [`drive`], with each answer: (seconds since the start, admitted).
fn drive_log(front: SocketAddr, tenant: &str, per_s: u32, secs: u64) -> Vec<(f64, bool)> {
    use std::io::{BufRead, BufReader, Read, Write};
    let connect = || {
        let s = std::net::TcpStream::connect(front).expect("connect to envoy");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.set_nodelay(true).unwrap();
        BufReader::new(s)
    };
    let mut conn = connect();
    let start = Instant::now();
    let mut log = Vec::new();
    let every = Duration::from_secs(1) / per_s;
    let mut next = start;
    let req = format!("GET / HTTP/1.1\r\nHost: localhost\r\nx-tenant: {tenant}\r\n\r\n");
    while start.elapsed() < Duration::from_secs(secs) {
        conn.get_mut().write_all(req.as_bytes()).expect("send");
        let mut status_line = String::new();
        conn.read_line(&mut status_line).expect("status line");
        let status: u16 = status_line
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let (mut length, mut close) = (0usize, false);
        loop {
            let mut line = String::new();
            conn.read_line(&mut line).expect("header");
            let line = line.trim_end().to_ascii_lowercase();
            if line.is_empty() {
                break;
            }
            if let Some(v) = line.strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
            close |= line == "connection: close";
        }
        let mut body = vec![0; length];
        conn.read_exact(&mut body).expect("body");
        match status {
            200 | 429 => log.push((start.elapsed().as_secs_f64(), status == 200)),
            other => panic!("envoy answered {other}: {status_line}"),
        }
        if close {
            conn = connect();
        }
        next += every;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    log
}

fn server(rules: &str, redis: &TestRedis, prefix: &str) -> InProcess {
    let (url, prefix) = (redis.url(), prefix.to_string());
    InProcess::start(rules, move |s| {
        s.store = url;
        s.key_prefix = prefix;
    })
}

/// The tollgate binary serving [`SMALL_RULES`] on a Redis of its own, with `args` (flag,
/// value) beside the store and a key prefix named for `tag`.
fn binary_on_redis(tag: &str, args: &[(&str, &str)]) -> (TestRedis, common::TestServer) {
    let redis = TestRedis::start();
    let mut b = common::TestServer::builder(SMALL_RULES)
        .arg("store", &redis.url())
        .arg("key-prefix", &unique_prefix(tag));
    for (flag, value) in args {
        b = b.arg(flag, value);
    }
    let tollgate = b.start();
    (redis, tollgate)
}

/// 720 a minute (12 a second) per tenant, holding one report interval's refill.
const FLEET_RULES: &str = "domain: quota
rlqs: true
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 720, burst: 60}
";

#[test]
fn two_envoys_on_two_tollgates_share_one_quota() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("rlqs-fleet");
    let (t1, t2) = (
        server(FLEET_RULES, &redis, &prefix),
        server(FLEET_RULES, &redis, &prefix),
    );
    let (e1, e2) = (
        TestEnvoy::start_example(EXAMPLE, t1.grpc, &[]),
        TestEnvoy::start_example(EXAMPLE, t2.grpc, &[]),
    );
    // Twice the quota's rate: 12 a second through each Envoy, for eight reports (the first
    // interval's claims leave part of the initial burst unused; over a longer run that counts
    // for less).
    let secs = 40;
    let started = Instant::now();
    let a = std::thread::spawn(move || drive(e1.front, "acme", 12, secs));
    let b = std::thread::spawn(move || drive(e2.front, "acme", 12, secs));
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    let span = started.elapsed().as_secs_f64();
    let admitted = a.0 + b.0;
    // The bucket held 60 and refilled 12 a second over the run. The bound (README, RLQS):
    // what Envoys admit beyond their assignments (each bucket's first request, and those its
    // old assignment admits while a report's answer is on its way), charged afterwards.
    let quota = 60.0 + 12.0 * span;
    let bound = 2.0 + 12.0 * 0.5;
    eprintln!("admitted {admitted} (A {a:?}, B {b:?}) of a quota of {quota:.0} over {span:.1} s");
    assert!(
        admitted as f64 <= quota + bound,
        "admitted {admitted} > quota {quota:.0} + bound {bound}"
    );
    assert!(
        admitted as f64 >= 0.8 * quota,
        "admitted {admitted} < 80 % of {quota:.0}"
    );
    assert!(
        a.0 > 0 && b.0 > 0,
        "both Envoys were assigned a share: {a:?} {b:?}"
    );
    // Both replicas assigned and settled.
    for t in [&t1, &t2] {
        assert!(metric_sum(t.admin, "tollgate_rlqs_tokens_total", &["assigned"]) > 0.0);
        assert!(metric_sum(t.admin, "tollgate_rlqs_reports_total", &[]) >= 3.0);
    }
}

#[test]
fn shares_move_toward_uneven_demand() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("rlqs-uneven");
    let tollgate = server(FLEET_RULES, &redis, &prefix);
    let (e1, e2) = (
        TestEnvoy::start_example(EXAMPLE, tollgate.grpc, &[]),
        TestEnvoy::start_example(EXAMPLE, tollgate.grpc, &[]),
    );
    // One Envoy asks 16 a second, the other 4: 20 of a quota of 12.
    let a = std::thread::spawn(move || drive_log(e1.front, "acme", 16, 25));
    let b = std::thread::spawn(move || drive_log(e2.front, "acme", 4, 25));
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    // After two report intervals.
    let late = |log: &[(f64, bool)]| log.iter().filter(|(t, ok)| *ok && *t >= 10.0).count();
    let (la, lb) = (late(&a), late(&b));
    eprintln!("admitted from 10 s on: A {la}, B {lb} (quota about 180)");
    assert!(
        la >= 2 * lb,
        "A {la} vs B {lb}: the shares did not follow the demand"
    );
    assert!(lb >= 10, "B {lb}: the floor keeps the smaller Envoy served");
    assert!(
        la + lb <= 60 + 12 * 15 + 8,
        "A {la} + B {lb} over the quota"
    );
}

/// A quota with no refill to speak of: 100 an hour.
const ONE_QUOTA_RULES: &str = "domain: quota
rlqs: true
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 100}
";

#[test]
fn an_rls_client_and_an_rlqs_envoy_draw_from_one_quota() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("rlqs-rls");
    let tollgate = server(ONE_QUOTA_RULES, &redis, &prefix);
    let envoy = TestEnvoy::start_example(EXAMPLE, tollgate.grpc, &[]);
    let front = envoy.front;
    // RLQS through Envoy, 15 a second; RLS (ShouldRateLimit, the same domain and tenant),
    // 10 a second; 15 s: 375 asked of a quota of 100.
    let rlqs = std::thread::spawn(move || drive(front, "shared", 15, 15));
    let rls = {
        let grpc = tollgate.grpc;
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async move {
                let mut client = common::client_of(grpc).await;
                let (mut ok, mut refused) = (0u64, 0u64);
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(15) {
                    let r = client
                        .should_rate_limit(request("quota", &[&[("tenant", "shared")]]))
                        .await
                        .unwrap()
                        .into_inner();
                    if r.overall_code == 1 {
                        ok += 1;
                    } else {
                        refused += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                (ok, refused)
            })
        })
    };
    let (q, r) = (rlqs.join().unwrap(), rls.join().unwrap());
    let admitted = q.0 + r.0;
    eprintln!("RLQS {q:?}, RLS {r:?}: {admitted} admitted of 100");
    // 100, the refill of 15 s (0.4), and the bucket's first request (admitted before its
    // first assignment, then charged).
    assert!(admitted <= 102, "admitted {admitted} of a quota of 100");
    assert!(admitted >= 80, "admitted {admitted}: under 80 % of 100");
    assert!(
        q.0 > 0 && r.0 > 0,
        "both sides were admitted some: {q:?} {r:?}"
    );
}

/// 60 a minute: an Envoy asking 12 a second is refused most of the time.
const SMALL_RULES: &str = "domain: quota
rlqs: true
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 60, burst: 5}
";

#[test]
fn a_restarted_tollgate_sends_envoy_to_its_fallback_and_back() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("rlqs-restart");
    let grpc = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let start = || {
        common::TestServer::builder(SMALL_RULES)
            .grpc_addr(grpc)
            .arg("store", &redis.url())
            .arg("key-prefix", &prefix)
            .start()
    };
    let mut first = start();
    let envoy = TestEnvoy::start_example(EXAMPLE, grpc, &[]);
    let front = envoy.front;
    let load = std::thread::spawn(move || drive_log(front, "acme", 12, 32));
    // Assigned for two reports, then SIGTERM: every assignment is expired first, so Envoy
    // moves to its expired_assignment_behavior (10 a second) at once, rather than holding a
    // DENY_ALL until its TTL (15 s).
    std::thread::sleep(Duration::from_secs(10));
    let stopped_at = 10.0;
    assert!(first.terminate().success(), "{}", first.log());
    std::thread::sleep(Duration::from_secs(6));
    let second = start();
    let restarted_at = 16.0;
    let log = load.join().unwrap();
    let admitted = |from: f64, to: f64| {
        log.iter()
            .filter(|(t, ok)| *ok && *t >= from && *t < to)
            .count()
    };
    let before = admitted(5.0, stopped_at);
    let down = admitted(stopped_at + 0.5, restarted_at);
    let after = admitted(restarted_at + 11.0, 32.0);
    eprintln!(
        "admitted: {before} in 5 s assigned, {down} in 5.5 s on the fallback, {after} in 5 s reassigned"
    );
    // Assigned: the quota, 1 a second (and what its burst held).
    assert!(
        before <= 10,
        "{before} admitted in 5 s of a 1-a-second quota"
    );
    // Down: the fallback bucket admits up to 10 a second (DENY_ALL would admit none).
    assert!(
        down >= 20,
        "only {down} admitted on the fallback: the assignments did not expire"
    );
    // Back: the new tollgate hears the Envoy's next report, charges what the fallback admitted
    // (the bucket goes into debt), and assigns again.
    let reports = poll(Duration::from_secs(10), || {
        let r = metric_sum(second.admin, "tollgate_rlqs_reports_total", &[]);
        (r >= 2.0).then_some(r)
    });
    assert!(
        reports.is_some(),
        "no reports on the new tollgate:\n{}",
        second.log()
    );
    assert!(metric_sum(second.admin, "tollgate_rlqs_tokens_total", &["charged"]) >= 10.0);
    assert!(
        after <= 6,
        "{after} admitted in 5 s after the restart: not back on the quota"
    );
}

/// Issue 45, case 2: Envoy 1.40 forgets what it admits while tollgate is away (its usage is
/// reset every report tick and the report dropped), so only the last interval of an outage is
/// ever charged: the bound during an outage is what the Envoy's own fallback admits. The
/// example holds each Envoy to a local bucket of 10 a second while its assignment is expired,
/// for a year (`expired_assignment_behavior_timeout`; after it Envoy 1.40 would go back to
/// `no_assignment_behavior`, and going back to a token bucket there crashes it), and a new
/// bucket to the same bucket before its first assignment: never `ALLOW_ALL`. tollgate is
/// killed (no graceful expiry: the last assignment runs out its TTL) and stays away for 37 s,
/// seven report intervals.
#[test]
fn an_outage_of_several_intervals_holds_each_envoy_to_its_fallback_bucket() {
    let example =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(EXAMPLE))
            .unwrap();
    assert!(
        !example.contains("blanket_rule: ALLOW_ALL"),
        "the example lets a bucket go unlimited"
    );
    assert!(example.contains("expired_assignment_behavior_timeout: 31536000s"));
    let (_redis, tollgate) = binary_on_redis("rlqs-outage", &[]);
    let envoy = TestEnvoy::start_example(EXAMPLE, tollgate.grpc, &[]);
    let front = envoy.front;
    let (rate, secs) = (30u32, 45u64);
    let load = std::thread::spawn(move || drive_log(front, "acme", rate, secs));
    std::thread::sleep(Duration::from_secs(8));
    let killed_at = 8.0;
    let killed = std::process::Command::new("kill")
        .args(["-9", &tollgate.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let log = load.join().unwrap_or_else(|_| {
        let l = envoy.log();
        panic!(
            "the load failed; envoy's log ends:\n{}",
            &l[l.len().saturating_sub(6_000)..]
        )
    });
    let admitted = |from: f64, to: f64| {
        log.iter()
            .filter(|(t, ok)| *ok && *t >= from && *t < to)
            .count() as f64
    };
    let asked = log.len();
    let outage = secs as f64 - killed_at;
    let (assigned, down) = (admitted(0.0, killed_at), admitted(killed_at, secs as f64));
    // The last assignment (TTL 15 s from a report before the kill) has run out by 23 s: from
    // 25 s on, only the expired behaviour decides.
    let late = admitted(25.0, secs as f64);
    eprintln!(
        "{asked} asked at {rate}/s; admitted: {assigned} in {killed_at} s assigned, {down} in {outage} s with tollgate away, {late} of them in the last 20 s"
    );
    // The bound (README, RLQS): with tollgate away, an Envoy admits at most its last
    // assignment's tokens (claimed: within the quota; here at most the burst of 5) plus what
    // its fallback bucket admits: M when it starts full, and F per fill interval I.
    let (m, f) = (10.0, 10.0);
    assert!(
        down <= 5.0 + m + f * outage + 2.0,
        "{down} admitted in {outage} s away: past the bound"
    );
    assert!(
        late <= m + f * 20.0 + 2.0,
        "{late} admitted in 20 s on the expired behaviour: not held to the fallback bucket"
    );
    assert!(
        late >= 100.0,
        "{late}: the fallback bucket admits its share"
    );
}

/// Envoy 1.40 segfaults when a bucket goes back to a token-bucket `no_assignment_behavior`
/// after an assignment (an expired one, or one whose expired behaviour timed out: seen here),
/// which is why the example's `expired_assignment_behavior_timeout` is a year. An abandoned
/// bucket (idle for `rlqs_idle_ms`) starts again as a new one, on the default token bucket:
/// that path is safe, and the Envoy keeps serving.
#[test]
fn an_abandoned_bucket_comes_back_on_the_example_without_harm() {
    let (_redis, tollgate) = binary_on_redis("rlqs-abandon", &[("rlqs-idle-ms", "1000")]);
    let envoy = TestEnvoy::start_example(EXAMPLE, tollgate.grpc, &[]);
    let first = drive(envoy.front, "idle", 5, 3);
    poll(Duration::from_secs(20), || {
        (metric_sum(
            tollgate.admin,
            "tollgate_rlqs_assignments_total",
            &["abandon"],
        ) >= 1.0)
            .then_some(())
    })
    .unwrap_or_else(|| panic!("the idle bucket was not abandoned:\n{}", tollgate.log()));
    let again = drive(envoy.front, "idle", 5, 6);
    eprintln!("before: {first:?}, after the abandon: {again:?}");
    assert!(again.0 >= 1, "{again:?}");
    // Back on an assignment: the reports go on.
    let reports = metric_sum(tollgate.admin, "tollgate_rlqs_reports_total", &[]);
    assert!(reports >= 3.0, "{reports}");
}

/// A raw RLQS stream: what a test sends and what tollgate answers.
struct Stream {
    tx: mpsc::Sender<RateLimitQuotaUsageReports>,
    rx: tonic::Streaming<RateLimitQuotaResponse>,
}

impl Stream {
    async fn open(grpc: SocketAddr) -> Stream {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
            .unwrap()
            .connect()
            .await
            .expect("connect");
        Stream::on(channel).await.expect("stream")
    }

    /// A stream on `channel`, or the status that refused it.
    async fn on(channel: tonic::transport::Channel) -> Result<Stream, tonic::Status> {
        let mut client = RateLimitQuotaServiceClient::new(channel);
        let (tx, rx) = mpsc::channel(16);
        let outbound =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
            );
        let rx = client
            .stream_rate_limit_quotas(outbound)
            .await?
            .into_inner();
        Ok(Stream { tx, rx })
    }

    async fn send(&self, domain: &str, usages: Vec<BucketQuotaUsage>) {
        self.tx
            .send(RateLimitQuotaUsageReports {
                domain: domain.into(),
                bucket_quota_usages: usages,
            })
            .await
            .expect("send");
    }

    /// The next response, or the status that ended the stream.
    async fn next(&mut self) -> Result<RateLimitQuotaResponse, tonic::Status> {
        match tokio::time::timeout(Duration::from_secs(20), self.rx.message()).await {
            Ok(Ok(Some(m))) => Ok(m),
            Ok(Ok(None)) => Err(tonic::Status::ok("stream ended")),
            Ok(Err(s)) => Err(s),
            Err(_) => panic!("no answer within 20 s"),
        }
    }
}

fn usage(pairs: &[(&str, &str)], allowed: u64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }),
        time_elapsed: None,
        num_requests_allowed: allowed,
        num_requests_denied: 0,
    }
}

/// Each bucket action as (its id's tenant, what it says).
fn actions(r: &RateLimitQuotaResponse) -> Vec<(String, &'static str)> {
    r.bucket_action
        .iter()
        .map(|a| {
            let id = a.bucket_id.as_ref().unwrap();
            let tenant = id.bucket.get("tenant").cloned().unwrap_or_default();
            let what = match &a.bucket_action {
                Some(Kind::AbandonAction(_)) => "abandon",
                Some(Kind::QuotaAssignmentAction(q)) => {
                    match q
                        .rate_limit_strategy
                        .as_ref()
                        .and_then(|s| s.strategy.as_ref())
                    {
                        Some(Strategy::TokenBucket(_)) => "token_bucket",
                        Some(Strategy::BlanketRule(0)) => "allow_all",
                        Some(Strategy::BlanketRule(1)) => "deny_all",
                        _ => "other",
                    }
                }
                None => "none",
            };
            (tenant, what)
        })
        .collect()
}

/// Issue 45, case 4: a new bucket's first claim was half of what the bucket could give (the
/// floor 1/(2n) with n = 1), and a stream that ended before its next report kept it: on
/// `1000/day`, two streams that each reported one request left 0.006 tokens (a day to refill).
/// Now a first claim is what the limit refills in one report interval (1 token here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_reports_once_and_leaves_takes_little_with_it() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("rlqs-first");
    let tollgate = server(
        "domain: quota\nrlqs: true\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: day, requests_per_unit: 1000}\n",
        &redis,
        &prefix,
    );
    let t = [("tenant", "daily")];
    for _ in 0..2 {
        let mut s = Stream::open(tollgate.grpc).await;
        s.send("quota", vec![usage(&t, 1)]).await;
        assert_eq!(granted(&s.next().await.unwrap()), [1]);
    }
    let mut client = common::client_of(tollgate.grpc).await;
    let r = client
        .should_rate_limit(request("quota", &[&t]))
        .await
        .unwrap()
        .into_inner();
    let left = r.statuses[0].limit_remaining;
    eprintln!("after two streams that reported one request each and left: {left} of 1000 left");
    // 2 admitted and charged, 2 assigned and gone with their streams, this request's 1.
    assert!(left >= 994, "{left} left");
}

/// Issue 45, case 4: a tenant stepping from 1 to 15 a second on a 600-a-minute bucket that is
/// almost full was refused 61 of its first 241 requests (its assignment was 1.25 × its last
/// demand). Demand may now grow at once by what the limit refills in an interval (50 here),
/// where the bucket can spare it: at most one interval's excess over 10 a second is refused.
#[test]
fn a_tenant_ramping_up_on_a_full_bucket_is_served() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("rlqs-ramp");
    let tollgate = server(
        "domain: quota\nrlqs: true\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 600}\n",
        &redis,
        &prefix,
    );
    let envoy = TestEnvoy::start_example(EXAMPLE, tollgate.grpc, &[]);
    let quiet = drive(envoy.front, "ramp", 1, 11);
    let log = drive_log(envoy.front, "ramp", 15, 16);
    let refused = log.iter().take(241).filter(|(_, ok)| !ok).count();
    eprintln!(
        "1 a second for 11 s ({quiet:?}), then 15 a second: {refused} of the first {} refused",
        log.len().min(241)
    );
    assert_eq!(quiet.1, 0, "{quiet:?}");
    assert!(
        refused <= 30,
        "{refused} refused of the first 241 on a full bucket"
    );
}

/// The tokens of each token-bucket action.
fn granted(r: &RateLimitQuotaResponse) -> Vec<u32> {
    r.bucket_action
        .iter()
        .filter_map(|a| match &a.bucket_action {
            Some(Kind::QuotaAssignmentAction(q)) => match q
                .rate_limit_strategy
                .as_ref()
                .and_then(|s| s.strategy.as_ref())
            {
                Some(Strategy::TokenBucket(tb)) => Some(tb.max_tokens),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// Issue 45's first case, through a real Redis and raw RLQS streams: on a fixed window of 100,
/// stream A holds 50, stream B reports 150 admitted outside any assignment (charged: the count
/// 200), A reports 10 used. The give-back of 40 leaves the count at 160, past the limit: A is
/// refused, and the window admits no more. (Capped at the limit before subtracting, the count
/// fell to 60 and A was granted 40 more: 200 admitted of 100.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_never_erases_debt_on_a_fixed_window() {
    // A window of 10 s (its refill over a 5 s interval, 50, is a new stream's first claim):
    // the run starts just after one begins and ends well within it.
    let into = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        % 10_000;
    tokio::time::sleep(Duration::from_millis((10_100 - into) as u64 % 10_000)).await;
    let redis = TestRedis::start();
    let prefix = unique_prefix("rlqs-debt");
    let tollgate = server(
        "domain: quota\nrlqs: true\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, unit_multiplier: 10, requests_per_unit: 100, algorithm: fixed_window}\n",
        &redis,
        &prefix,
    );
    let (mut a, mut b) = (
        Stream::open(tollgate.grpc).await,
        Stream::open(tollgate.grpc).await,
    );
    let t = [("tenant", "debtor")];
    a.send("quota", vec![usage(&t, 0)]).await;
    assert_eq!(
        granted(&a.next().await.unwrap()),
        [50],
        "the first claim's floor"
    );
    b.send("quota", vec![usage(&t, 150)]).await;
    assert_eq!(
        actions(&b.next().await.unwrap()),
        [("debtor".into(), "deny_all")]
    );
    a.send("", vec![usage(&t, 10)]).await;
    assert_eq!(
        actions(&a.next().await.unwrap()),
        [("debtor".into(), "deny_all")]
    );
    // Nothing more in this window, from either stream or RLS.
    a.send("", vec![usage(&t, 0)]).await;
    assert_eq!(
        actions(&a.next().await.unwrap()),
        [("debtor".into(), "deny_all")]
    );
    let mut client = common::client_of(tollgate.grpc).await;
    let r = client
        .should_rate_limit(request("quota", &[&t]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, 2, "RLS is over the limit too: {r:?}");
    assert_eq!(
        metric_sum(tollgate.admin, "tollgate_rlqs_tokens_total", &["assigned"]),
        50.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_removed_by_a_reload_abandons_its_buckets() {
    let tollgate = InProcess::start(
        "domain: quota\nrlqs: true\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 60}\n",
        |s| s.reload_interval_ms = 100,
    );
    let mut s = Stream::open(tollgate.grpc).await;
    s.send("quota", vec![usage(&[("tenant", "a")], 1)]).await;
    let first = s.next().await.unwrap();
    // A token bucket, sent after a DENY_ALL so Envoy starts it full (see service/rlqs.rs).
    assert_eq!(
        actions(&first),
        [("a".into(), "deny_all"), ("a".into(), "token_bucket")]
    );
    std::fs::write(
        tollgate.rules_dir().join("rules.yaml"),
        "domain: quota\nrlqs: true\ndescriptors:\n  - key: plan\n    rate_limit: {unit: minute, requests_per_unit: 60}\n",
    )
    .unwrap();
    poll(Duration::from_secs(10), || {
        (metric_sum(tollgate.admin, "tollgate_rules_reloads_total", &["ok"]) >= 1.0).then_some(())
    })
    .expect("the rules reloaded");
    s.send("", vec![usage(&[("tenant", "a")], 3)]).await;
    assert_eq!(actions(&s.next().await.unwrap()), [("a".into(), "abandon")]);
    // Back as a new bucket, it matches no rule: no limit, as RLS answers.
    s.send("", vec![usage(&[("tenant", "a")], 1)]).await;
    assert_eq!(
        actions(&s.next().await.unwrap()),
        [("a".into(), "allow_all")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_streams_get_clear_refusals_and_bounded_memory() {
    let tollgate = InProcess::builder(
        "domain: quota\nrlqs: true\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 60}\n",
    )
    .file(
        "plain.yaml",
        "domain: plain\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 60}\n",
    )
    .settings(|s| s.rlqs_max_buckets_per_stream = 500)
    .start();
    let grpc = tollgate.grpc;
    // An unknown domain, a domain that is not served over RLQS, no domain at all.
    for (domain, code, says) in [
        (
            "nowhere",
            tonic::Code::NotFound,
            "no rules file declares domain 'nowhere'",
        ),
        (
            "plain",
            tonic::Code::FailedPrecondition,
            "does not set rlqs: true",
        ),
        ("", tonic::Code::InvalidArgument, "must name its domain"),
    ] {
        let mut s = Stream::open(grpc).await;
        s.send(domain, vec![usage(&[("tenant", "a")], 1)]).await;
        let e = s.next().await.unwrap_err();
        assert_eq!(e.code(), code, "{e:?}");
        assert!(e.message().contains(says), "{e:?}");
    }
    // An empty bucket id gets nothing; the stream goes on.
    let mut s = Stream::open(grpc).await;
    s.send(
        "quota",
        vec![
            BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: HashMap::new(),
                }),
                ..usage(&[], 1)
            },
            usage(&[("tenant", "ok")], 1),
        ],
    )
    .await;
    assert_eq!(
        actions(&s.next().await.unwrap()),
        [("ok".into(), "deny_all"), ("ok".into(), "token_bucket")]
    );
    // 10,000 distinct ids from one stream, in reports of 1,000: 500 are held and assigned, the
    // others told DENY_ALL (never left to Envoy's no_assignment_behavior).
    let (mut assigned, mut denied) = (0, 0);
    for chunk in 0..10 {
        let usages = (0..1_000)
            .map(|i| usage(&[("tenant", &format!("t{chunk}-{i}"))], 1))
            .collect();
        s.send("", usages).await;
        for (_, what) in actions(&s.next().await.unwrap()) {
            match what {
                "token_bucket" => assigned += 1,
                "deny_all" => denied += 1,
                other => panic!("{other}"),
            }
        }
    }
    // Each assignment is sent after a DENY_ALL for its bucket (see service/rlqs.rs).
    assert_eq!(assigned, 499, "500 held, one of them the `ok` tenant");
    assert_eq!(denied - assigned, 9_501);
    let held = poll(Duration::from_secs(10), || {
        let refused = metric_sum(
            tollgate.admin,
            "tollgate_rlqs_refused_total",
            &["too_many_buckets"],
        );
        (refused >= 9_500.0).then_some(metric_sum(tollgate.admin, "tollgate_rlqs_buckets", &[]))
    })
    .unwrap_or_else(|| {
        panic!(
            "the ids past the cap were refused:\n{}\n{}",
            common::get(tollgate.admin, "/metrics").1,
            tollgate.log()
        )
    });
    assert_eq!(held, 500.0);
    let m = common::get(tollgate.admin, "/metrics").1;
    for line in [
        r#"tollgate_rlqs_refused_total{reason="empty_bucket_id"} 1"#,
        r#"tollgate_rlqs_refused_total{reason="unknown_domain"} 1"#,
        r#"tollgate_rlqs_refused_total{reason="no_domain"} 1"#,
        r#"tollgate_rlqs_refused_total{reason="not_rlqs"} 1"#,
    ] {
        assert!(m.contains(line), "{line}\n{m}");
    }
    drop(s);
    poll(Duration::from_secs(10), || {
        (metric_sum(tollgate.admin, "tollgate_rlqs_buckets", &[]) == 0.0).then_some(())
    })
    .expect("a closed stream frees its buckets");
}

/// A connector whose connections come from 127.0.0.2: another peer than the Envoys (which
/// connect from 127.0.0.1) on the same machine.
#[derive(Clone)]
struct From127002;

impl tower_service::Service<http::Uri> for From127002 {
    type Response = hyper_util::rt::TokioIo<tokio::net::TcpStream>;
    type Error = std::io::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        Box::pin(async move {
            let to: SocketAddr = format!(
                "{}:{}",
                uri.host().unwrap_or("127.0.0.1"),
                uri.port_u16().unwrap_or(80)
            )
            .parse()
            .map_err(std::io::Error::other)?;
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.bind("127.0.0.2:0".parse().unwrap())?;
            Ok(hyper_util::rt::TokioIo::new(socket.connect(to).await?))
        })
    }
}

impl Stream {
    /// A stream from 127.0.0.2, on a connection of its own.
    async fn open_from_another_peer(grpc: SocketAddr) -> Result<Stream, tonic::Status> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
            .unwrap()
            .connect_with_connector(From127002)
            .await
            .expect("connect from 127.0.0.2");
        Stream::on(channel).await
    }
}

/// Issue 45, case 3: with `rlqs_max_streams` counted over all peers, two idle raw-client
/// streams held a cap of 2 and the example Envoy, refused, admitted 900 of 900 asked for a
/// quota of 420. Now one peer holds at most `rlqs_max_streams_per_peer` of them, and a stream
/// that names no bucket is ended after three report intervals: the Envoy gets its stream and
/// its quota.
#[test]
fn one_peer_cannot_switch_rlqs_off_for_another() {
    let (_redis, tollgate) = binary_on_redis(
        "rlqs-peers",
        &[
            ("rlqs-max-streams", "3"),
            ("rlqs-max-streams-per-peer", "2"),
        ],
    );
    let grpc = tollgate.grpc;
    let rt = tokio::runtime::Runtime::new().unwrap();
    // The attacker: two streams that name the domain and hold nothing, and a third refused.
    let (mut idle, third) = rt.block_on(async {
        let mut idle = Vec::new();
        for _ in 0..2 {
            let s = Stream::open_from_another_peer(grpc).await.expect("stream");
            s.send("quota", vec![]).await;
            idle.push(s);
        }
        (idle, Stream::open_from_another_peer(grpc).await.err())
    });
    let third = third.expect("the third stream from one peer is refused");
    assert_eq!(third.code(), tonic::Code::ResourceExhausted, "{third:?}");
    assert!(
        third.message().contains("rlqs_max_streams_per_peer (2)"),
        "{third:?}"
    );
    // The Envoy takes the third place: on its quota (60 a minute, burst 5), not on its
    // no_assignment_behavior (10 a second).
    let envoy = TestEnvoy::start_example(EXAMPLE, grpc, &[]);
    let (ok, refused) = drive(envoy.front, "acme", 20, 8);
    eprintln!(
        "the Envoy beside two idle streams of another peer: {ok} admitted, {refused} refused"
    );
    assert!(
        ok <= 5 + 8 + 10,
        "{ok} admitted of a quota of 5 + 8: the Envoy was not served"
    );
    // The idle streams are ended (three report intervals, 15 s, after they were opened).
    rt.block_on(async {
        for s in &mut idle {
            let e = s.next().await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e:?}");
        }
    });
    assert!(
        metric_sum(
            tollgate.admin,
            "tollgate_rlqs_refused_total",
            &["idle_stream"]
        ) >= 2.0
    );
    assert_eq!(
        metric_sum(
            tollgate.admin,
            "tollgate_rlqs_refused_total",
            &["too_many_streams_from_peer"]
        ),
        1.0
    );
}

static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// 8 streams report `ids` bucket ids with `value`-byte values in all (as many to a report as
/// fit a message of 64 KiB): (ids held, DENY_ALL actions, RSS growth in bytes). Each run's
/// values differ from the last's.
fn flood_ids(tollgate: &common::TestServer, ids: usize, value: usize) -> (f64, u64, u64) {
    let per_report = (60_000 / (value + 40)).clamp(1, 500);
    let tag = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let before = common::rss_kb(tollgate.pid());
    let grpc = tollgate.grpc;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let denied = rt.block_on(async move {
        let tasks: Vec<_> = (0..8)
            .map(|stream| {
                tokio::spawn(async move {
                    let mut s = Stream::open(grpc).await;
                    let mut denied = 0u64;
                    let mine: Vec<usize> = (stream..ids).step_by(8).collect();
                    for (n, chunk) in mine.chunks(per_report).enumerate() {
                        let usages = chunk
                            .iter()
                            .map(|i| {
                                let v = format!("{tag}-{i:07}{}", "v".repeat(value));
                                usage(&[("tenant", &v[..value.max(10)])], 1)
                            })
                            .collect();
                        s.send(if n == 0 { "quota" } else { "" }, usages).await;
                        denied += actions(&s.next().await.unwrap())
                            .iter()
                            .filter(|(_, w)| *w == "deny_all")
                            .count() as u64;
                    }
                    // Held until the measurement is done.
                    (s, denied)
                })
            })
            .collect();
        let mut streams = Vec::new();
        let mut denied = 0;
        for t in tasks {
            let (s, d) = t.await.unwrap();
            streams.push(s);
            denied += d;
        }
        std::mem::forget(streams);
        denied
    });
    let held = metric_sum(tollgate.admin, "tollgate_rlqs_buckets", &[]);
    let after = common::rss_kb(tollgate.pid());
    (held, denied, after.saturating_sub(before) * 1024)
}

/// Issue 45, case 3: each tracked bucket id cost ~13 KB of RSS (4 KB values) and the caps let
/// 2,048,000 of them in (~26 GB). Now `rlqs_max_state_bytes` bounds them per replica: 20,000
/// ids of 4 KB over 8 streams against a budget of 16 MiB hold what fits, the rest are told
/// DENY_ALL, and the process grows by about the budget.
#[test]
fn rlqs_state_is_bounded_in_bytes() {
    let budget: u64 = 16 << 20;
    let tollgate = common::TestServer::builder(SMALL_RULES)
        .arg("rlqs-max-state-bytes", &budget.to_string())
        .arg("rlqs-max-buckets-per-stream", "100000")
        .start();
    let (held, denied, grew) = flood_ids(&tollgate, 20_000, 4_000);
    let per_id = tollgate::rlqs::tracked_bytes(&[("tenant".into(), "v".repeat(4_000))]);
    eprintln!(
        "20,000 ids of 4 KB, a budget of {budget} bytes: {held} held ({per_id} bytes each counted), {denied} denied, RSS +{grew} bytes ({:.0} per held id)",
        grew as f64 / held.max(1.0)
    );
    assert_eq!(held as u64, budget / per_id, "as many as fit the budget");
    // Past the budget each id is told DENY_ALL (and each assignment is sent after a DENY_ALL
    // for its bucket too: service/rlqs.rs).
    assert_eq!(denied, 20_000);
    // The budget counts live bytes; the allocator's pages around them (size classes, pages
    // of freed decode buffers) come to about as much again.
    assert!(
        grew <= 2 * budget + (16 << 20),
        "RSS grew {grew} bytes for a budget of {budget}"
    );
}

/// `make bench`: RSS per tracked id, for short and 4 KB values, each on a fresh server with a
/// budget the ids never reach, after a first flood of 2,000 ids (the memory store and the
/// other structures a first id touches are in place by then: only the ids' own state grows).
#[test]
#[ignore = "a benchmark: make bench runs it"]
fn bench_rlqs_state_memory() {
    for value in [16, 4_000] {
        let tollgate = common::TestServer::builder(SMALL_RULES)
            .arg("rlqs-max-state-bytes", &(4u64 << 30).to_string())
            .arg("rlqs-max-buckets-per-stream", "100000")
            .start();
        let ids: usize = std::env::var("RLQS_BENCH_IDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000);
        flood_ids(&tollgate, ids / 10, value);
        let (held, _, grew) = flood_ids(&tollgate, ids, value);
        let per_id = tollgate::rlqs::tracked_bytes(&[("tenant".into(), "v".repeat(value))]);
        println!(
            "RLQS state: {ids} more ids of {value}-byte values ({held} held), RSS +{:.1} MB, {:.0} bytes per id (counted as {per_id} against rlqs_max_state_bytes)",
            grew as f64 / 1e6,
            grew as f64 / ids as f64
        );
        let mut tollgate = tollgate;
        tollgate.terminate();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_stream_is_ended() {
    let tollgate = InProcess::start(
        "domain: quota\nrlqs: true\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 60}\n",
        |s| {
            s.rlqs_report_interval_ms = 1_000;
            s.rlqs_assignment_ttl_ms = 2_000;
        },
    );
    // A stream that never sends its domain (nor anything else): ended after three intervals,
    // at least 10 s.
    let mut s = Stream::open(tollgate.grpc).await;
    let started = Instant::now();
    let e = s.next().await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e:?}");
    assert!(started.elapsed() >= Duration::from_secs(9));
    assert_eq!(
        metric_sum(
            tollgate.admin,
            "tollgate_rlqs_refused_total",
            &["idle_stream"]
        ),
        1.0
    );
}

#[test]
fn the_example_serves_its_domain_over_rlqs() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let rules = tollgate::rules::load_path(
        &root.join("examples/envoy/rlqs/rules.yaml"),
        tollgate::rules::LoadOptions::default(),
    )
    .expect("examples/envoy/rlqs/rules.yaml loads");
    let envoy = std::fs::read_to_string(root.join(EXAMPLE)).unwrap();
    assert!(
        envoy.contains("domain: quota"),
        "the filter names the rules' domain"
    );
    assert!(
        rules.domains["quota"].rlqs,
        "the example's domain says rlqs: true"
    );
}

/// `make bench`: the same traffic (one tenant, `TOLLGATE_RLQS_BENCH_RATE` requests a second,
/// 400 by default, for 15 s) through an Envoy on RLS (`examples/envoy/envoy.yaml`) and one on
/// RLQS, each all admitted: RPC messages and tollgate CPU per admitted request. Run on the
/// binary `TOLLGATE_TEST_BINARY` names (the release one under `make bench`).
#[test]
#[ignore = "a benchmark: make bench runs it"]
fn bench_rlqs_against_rls() {
    let rate: u32 = std::env::var("TOLLGATE_RLQS_BENCH_RATE")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(400);
    let secs = 15;
    let rules = "domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000000}
";
    let quota = "domain: quota
rlqs: true
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000000, burst: 5000000}
";
    let server = common::TestServer::builder(rules)
        .file("quota.yaml", quota)
        .start();
    let rls = TestEnvoy::start_example("examples/envoy/envoy.yaml", server.grpc, &[]);
    let rlqs = TestEnvoy::start_example(EXAMPLE, server.grpc, &[]);
    let mut rows = Vec::new();
    for (name, front) in [("rls", rls.front), ("rlqs", rlqs.front)] {
        let (calls0, reports0, cpu0) = (
            metric_sum(server.admin, "tollgate_requests_total", &[]),
            metric_sum(server.admin, "tollgate_rlqs_reports_total", &[]),
            common::cpu_time(server.pid()).as_secs_f64(),
        );
        let (ok, refused) = drive(front, "bench", rate, secs);
        // The last report of the run, so its messages are counted.
        std::thread::sleep(Duration::from_secs(6));
        let calls = metric_sum(server.admin, "tollgate_requests_total", &[]) - calls0;
        let reports = metric_sum(server.admin, "tollgate_rlqs_reports_total", &[]) - reports0;
        let cpu = common::cpu_time(server.pid()).as_secs_f64() - cpu0;
        // RLS: a request and a response per call; RLQS: a report and its answer.
        let messages = 2.0 * (calls + reports);
        let per = |x: f64| x / ok.max(1) as f64;
        println!(
            "{{\"bench\":\"rlqs\",\"path\":\"{name}\",\"admitted\":{ok},\"refused\":{refused},\"messages_per_admitted\":{:.4},\"cpu_us_per_admitted\":{:.1}}}",
            per(messages),
            per(cpu) * 1e6
        );
        rows.push((per(messages), per(cpu)));
    }
    let (rls, rlqs) = (rows[0], rows[1]);
    println!(
        "RLQS against RLS on the same traffic: {:.4} vs {:.2} messages per admitted request, {:.1} vs {:.1} µs of tollgate CPU",
        rlqs.0,
        rls.0,
        rlqs.1 * 1e6,
        rls.1 * 1e6
    );
    assert!(rlqs.0 < 0.1 * rls.0, "RLQS should need far fewer messages");
}
