//! What one decision costs Redis, as docs/redis.md reports it: one script call per request (all
//! of its ops in one batch call: one round trip, no EVAL on a healthy Redis), and one small
//! hash per bucket with a TTL that ends when it no longer matters.

mod common;

use common::proxy::Proxy;
use common::redis::TestRedis;
use common::store::{HOUR, contract_store, fw, key, one, settings, sw, tb};
use tollgate::clock::Clock;
use tollgate::keys;
use tollgate::quota::Op;
use tollgate::rules::{Algorithm, Rate, Unit};
use tollgate::store::Store;
use tollgate::telemetry::Metrics;

/// Script calls per request: all of a request's ops in one call (one batch script call for
/// several, `store_batch_max_ops` > 1, the default; unbatched, one `EVALSHA` per op in one
/// pipeline), which is one round trip: the calls go through a proxy that counts the chunks
/// carrying scripts that tollgate writes, and each request waits for its answer before the
/// next is sent, so one chunk per request is one write per request (ops sent one by one: two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_script_call_per_request_in_one_round_trip() {
    for batched in [true, false] {
        let redis = TestRedis::start();
        let proxy = Proxy::start(format!("127.0.0.1:{}", redis.port()).parse().unwrap()).await;
        let metrics = Metrics::new();
        let s = tollgate::settings::Settings {
            store_batch_max_ops: if batched { 64 } else { 1 },
            ..settings(&proxy.url(), 2_000)
        };
        let store = Store::connect(
            tollgate::configs::store_config(&s),
            Clock::system(),
            &metrics,
        )
        .await
        .expect("store");
        redis.cmd::<()>(&["CONFIG", "RESETSTAT"]);
        let chunks_before = proxy.script_chunks_sent();
        let (requests, ops_per_request) = (100u64, 2u64);
        for i in 0..requests {
            let ops: Vec<Op> = (0..ops_per_request)
                .map(|j| {
                    let k = key("stat:", &format!("k{}", (i + j) % 7));
                    // Both ops of a request on different scripts: every script was loaded at
                    // connect, so none needs an EVAL.
                    if j == 0 {
                        tb(&k, 1_000, 1_000, HOUR, 1)
                    } else {
                        sw(&format!("{k}sw"), 1_000, HOUR, 1)
                    }
                })
                .collect();
            store.apply(&ops).await.expect("apply");
        }
        let round_trips = proxy.script_chunks_sent() - chunks_before;
        let stats: String = redis.cmd(&["INFO", "commandstats"]);
        let calls = |name: &str| -> u64 {
            stats
                .lines()
                .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:calls=")))
                .and_then(|rest| rest.split(',').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        let evalsha = calls("evalsha");
        eprintln!(
            "batched {batched}: EVALSHA calls: {evalsha} for {requests} requests of {ops_per_request} ops = {:.2} per request; EVAL calls: {}; round trips: {round_trips}",
            evalsha as f64 / requests as f64,
            calls("eval"),
        );
        let per_request = if batched { 1 } else { ops_per_request };
        assert_eq!(evalsha, requests * per_request, "batched {batched}");
        assert_eq!(
            round_trips, requests,
            "one round trip (one write) per request"
        );
        assert_eq!(calls("eval"), 0, "no NOSCRIPT fallback on a healthy Redis");
        let text = metrics.render();
        assert!(
            text.contains(&format!(
                "tollgate_store_call_duration_seconds_count{{op=\"apply\"}} {requests}"
            )),
            "{text}"
        );
        assert!(
            text.contains("tollgate_store_connections{state=\"connected\"} 4"),
            "{text}"
        );
    }
}

/// The store key of tenant `acme`'s limit of 100 an hour under `algorithm` (42 bytes).
fn acme_key(algorithm: Algorithm) -> String {
    let rate = Rate {
        requests_per_unit: 100,
        unit: Unit::Hour,
        unit_multiplier: 1,
        burst: 100,
        algorithm,
        calendar: None,
    };
    keys::bucket_key("tollgate:", "edge", [("tenant", "acme")], &rate, 0, None)
}

/// The size of one token bucket in Redis, with a ~40-byte key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_bucket_is_one_small_string() {
    let redis = TestRedis::start();
    let store = contract_store(&redis.url()).await;
    let k = acme_key(Algorithm::TokenBucket);
    assert!(one(&store, tb(&k, 100, 100, HOUR, 1)).await.allowed);
    let kind: String = redis.cmd(&["TYPE", &k]);
    assert_eq!(
        kind, "string",
        "the packed state (store_state_format: packed)"
    );
    let (tokens, _) = redis
        .token_state(&k)
        .expect("a partly spent bucket is stored");
    assert_eq!(tokens, 99.0);
    let ttl: i64 = redis.cmd(&["PTTL", &k]);
    assert!(
        ttl > 0 && ttl <= 36_000,
        "expires when full again (one token per 36 s): {ttl}"
    );
    let bytes: i64 = redis.cmd(&["MEMORY", "USAGE", &k]);
    eprintln!(
        "MEMORY USAGE of a token bucket with a {}-byte key ({k}): {bytes} bytes",
        k.len()
    );
    assert!(bytes < 200, "{bytes} bytes");
    // A bucket that refills to full is deleted rather than kept (read a few ms later at a
    // refill of 100 a ms).
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert!(one(&store, tb(&k, 100, 100, 1, 0)).await.allowed);
    let exists: i64 = redis.cmd(&["EXISTS", &k]);
    assert_eq!(exists, 0, "a full bucket is no key");
}

/// The size of one fixed window in Redis, with a ~40-byte key: the same 16-byte string as a
/// token bucket's (its start and its count), written once per counted hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_window_is_one_small_string() {
    let redis = TestRedis::start();
    let store = contract_store(&redis.url()).await;
    let k = acme_key(Algorithm::FixedWindow);
    let o = one(&store, fw(&k, 100, HOUR, 1)).await;
    assert!(o.allowed);
    let kind: String = redis.cmd(&["TYPE", &k]);
    assert_eq!(
        kind, "string",
        "the packed state (store_state_format: packed)"
    );
    let (start, count) = redis.token_state(&k).expect("a counted window is stored");
    assert_eq!(count, 1, "one hit counted");
    assert_eq!(
        start as u64 % HOUR,
        0,
        "the window's start, on the hour: {start}"
    );
    let ttl: i64 = redis.cmd(&["PTTL", &k]);
    assert!(
        ttl > 0 && ttl.abs_diff(o.reset_ms as i64) < 1_000,
        "expires when the window ends: {ttl} vs {o:?}"
    );
    // One script call, and no command of 0.1.0's hash.
    redis.cmd::<()>(&["CONFIG", "RESETSTAT"]);
    assert!(one(&store, fw(&k, 100, HOUR, 1)).await.allowed);
    let stats: String = redis.cmd(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_evalsha:calls=1,"), "{stats}");
    assert!(!stats.contains("cmdstat_hset"), "{stats}");
    let bytes: i64 = redis.cmd(&["MEMORY", "USAGE", &k]);
    eprintln!(
        "MEMORY USAGE of a fixed window with a {}-byte key ({k}): {bytes} bytes",
        k.len()
    );
    assert!(bytes < 200, "{bytes} bytes");
}

/// The size of one sliding window in Redis, with a ~40-byte key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_window_is_one_small_hash() {
    let redis = TestRedis::start();
    let store = contract_store(&redis.url()).await;
    let k = acme_key(Algorithm::SlidingWindow);
    // A check on an unseen key leaves no key behind.
    assert!(one(&store, sw(&k, 100, HOUR, 0)).await.allowed);
    let exists: i64 = redis.cmd(&["EXISTS", &k]);
    assert_eq!(exists, 0, "an empty sliding window is no key");
    let o = one(&store, sw(&k, 100, HOUR, 1)).await;
    assert!(o.allowed);
    let fields: Vec<String> = redis.cmd(&["HKEYS", &k]);
    assert_eq!(fields, ["w", "p", "c"]);
    let ttl: i64 = redis.cmd(&["PTTL", &k]);
    assert!(
        ttl > 0 && ttl.abs_diff(o.reset_ms as i64) < 1_000 && o.reset_ms > HOUR,
        "expires when the count has decayed, at the end of the next hour: {ttl} vs {o:?}"
    );
    // A check or a refusal rewrites nothing (the state and its TTL are still right).
    redis.cmd::<()>(&["CONFIG", "RESETSTAT"]);
    assert!(one(&store, sw(&k, 100, HOUR, 0)).await.allowed);
    assert!(!one(&store, sw(&k, 100, HOUR, 101)).await.allowed);
    let stats: String = redis.cmd(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_evalsha:calls=2,"), "{stats}");
    assert!(!stats.contains("cmdstat_hset"), "{stats}");
    let bytes: i64 = redis.cmd(&["MEMORY", "USAGE", &k]);
    eprintln!(
        "MEMORY USAGE of a sliding window with a {}-byte key ({k}): {bytes} bytes",
        k.len()
    );
    assert!(bytes <= 120, "{bytes} bytes");
}

/// The size of a sliding log in Redis: one sorted-set member per hit kept (compact while the
/// set is small, a skip list past Redis's `zset-max-listpack-entries`, 128 by default). The
/// README's algorithm table quotes these numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_log_grows_with_the_hits_it_keeps() {
    let redis = TestRedis::start();
    let store = contract_store(&redis.url()).await;
    let mut sizes = Vec::new();
    for hits in [10u64, 100, 1_000, 10_000] {
        let rate = Rate {
            requests_per_unit: hits as u32,
            unit: Unit::Hour,
            unit_multiplier: 1,
            burst: hits,
            algorithm: Algorithm::SlidingLog,
            calendar: None,
        };
        // One tenant per size: a key names no limit's numbers, so the sizes' logs would be one.
        let tenant = format!("acme-{hits}");
        let k = keys::bucket_key(
            "tollgate:",
            "edge",
            [("tenant", tenant.as_str())],
            &rate,
            0,
            None,
        );
        let kind = tollgate::quota::OpKind::SlidingLog {
            limit: hits,
            window_ms: HOUR,
        };
        // A check on an unseen key leaves no key behind.
        assert!(one(&store, Op::take(k.clone(), kind, 0)).await.allowed);
        let exists: i64 = redis.cmd(&["EXISTS", &k]);
        assert_eq!(exists, 0, "an empty log is no key");
        // The hits arrive a few at a time, as requests do (each its own ms, mostly).
        let mut left = hits;
        while left > 0 {
            let n = left.min(7);
            assert!(one(&store, Op::take(k.clone(), kind, n)).await.allowed);
            left -= n;
        }
        assert!(!one(&store, Op::take(k.clone(), kind, 1)).await.allowed);
        let members: i64 = redis.cmd(&["ZCARD", &k]);
        assert_eq!(members as u64, hits);
        let ttl: i64 = redis.cmd(&["PTTL", &k]);
        assert!(
            ttl > 0 && ttl as u64 <= HOUR,
            "expires when the newest hit leaves: {ttl}"
        );
        let bytes: i64 = redis.cmd(&["MEMORY", "USAGE", &k]);
        sizes.push((hits, bytes));
    }
    eprintln!(
        "MEMORY USAGE of a sliding log (hits kept, bytes): {sizes:?}; per hit: {:?}",
        sizes
            .iter()
            .map(|(h, b)| format!("{:.0}", *b as f64 / *h as f64))
            .collect::<Vec<_>>()
    );
    // About 35 bytes a hit while compact, about 130 as a skip list (1.3 MB for 10,000).
    for (hits, bytes) in sizes {
        assert!(
            bytes as u64 <= 200 + 150 * hits,
            "{hits} hits: {bytes} bytes"
        );
    }
}

/// Issue 45: with `default_algorithm: sliding_log`, an Envoy `limit` override is held to
/// `sliding_log_max_limit` like the rules' own limits. One request overriding 50,000,000 an
/// hour with `hits_addend` 300,000 used to write 300,000 members in one script (660 ms of
/// Redis, blocked); past the cap the override is served as a sliding window: two numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_past_the_sliding_log_cap_is_a_sliding_window() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    let redis = TestRedis::start();
    let prefix = common::redis::unique_prefix("log-cap");
    let url = redis.url();
    let tollgate = common::InProcess::start(
        "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 100}\n",
        {
            let prefix = prefix.clone();
            move |s| {
                s.store = url;
                s.key_prefix = prefix;
                s.default_algorithm = Algorithm::SlidingLog;
            }
        },
    );
    let mut client = common::client_of(tollgate.grpc).await;
    let overridden = |per_hour: u32, hits: u64| {
        let mut r = common::request("edge", &[&[("tenant", "big")]]);
        r.descriptors[0].limit = Some(RateLimitOverride {
            requests_per_unit: per_hour,
            unit: 3, // HOUR
        });
        r.descriptors[0].hits_addend =
            Some(envoy_types::pb::google::protobuf::UInt64Value { value: hits });
        r
    };
    let started = std::time::Instant::now();
    let r = client
        .should_rate_limit(overridden(50_000_000, 300_000))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, 1, "{r:?}");
    // Within the cap it is a sliding log, as before.
    let r = client
        .should_rate_limit(overridden(1_000, 10))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.overall_code, 1, "{r:?}");
    eprintln!("both requests in {:?}", started.elapsed());
    // No key holds more than the cap's worth of members: the big override is a hash (a
    // sliding window's two counts), the small one a log of 10 hits.
    let keys: Vec<String> = redis.cmd(&["KEYS", &format!("{prefix}*big*")]);
    let mut logs = 0;
    for k in &keys {
        let kind: String = redis.cmd(&["TYPE", k]);
        if kind == "zset" {
            let members: i64 = redis.cmd(&["ZCARD", k]);
            assert_eq!(members, 10, "{k}");
            logs += 1;
        }
    }
    assert_eq!((keys.len(), logs), (2, 1), "{keys:?}");
}
