//! A rolling upgrade from 0.1.0, or a rollback to it: for the length of the rollout, 0.1.0's
//! replicas and this release's share one Redis. 0.1.0 keeps a token bucket's state as a hash
//! (`t`, `ts`) and a fixed window's as another (`w`, `c`); this release writes one packed
//! string by default and reads both (`lua/token_bucket.lua`, `lua/fixed_window.lua`,
//! `store_state_format`). These tests run 0.1.0's own scripts, as
//! released (`tests/fixtures/release-0.1.0/`), beside a real tollgate on one redis-server:
//!
//! - with `store_state_format: hash` the two share every bucket: a burst split between them
//!   admits exactly the limit, and 0.1.0 never fails (leases included);
//! - at the default (`packed`) this release carries on 0.1.0's buckets exactly, and 0.1.0
//!   fails on a bucket this release wrote (`WRONGTYPE`: its requests go to its fallback), which
//!   is why docs/redis.md has operators set `hash` for the rollout;
//! - from the previous build of `main`, whose keys held the limit's numbers
//!   (`…|tb:3600000:100}`; `tests/fixtures/keys-with-numbers/`): the two name a bucket
//!   differently, so this release starts each bucket fresh once (the stated cost of the
//!   upgrade, docs/redis.md "Upgrading"), and the old replicas keep theirs and never fail.

mod common;

use common::redis::{TestRedis, command, unique_prefix};
use common::{TestServer, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use tollgate::rules::{Algorithm, Rate, Unit};

/// 0.1.0's `lua/token_bucket.lua`, `lua/fixed_window.lua` and `lua/lease.lua`, as released.
const RELEASE_0_1_TOKEN_BUCKET: &str = include_str!("fixtures/release-0.1.0/token_bucket.lua");
const RELEASE_0_1_FIXED_WINDOW: &str = include_str!("fixtures/release-0.1.0/fixed_window.lua");
const RELEASE_0_1_LEASE: &str = include_str!("fixtures/release-0.1.0/lease.lua");

/// The previous build's `lua/token_bucket.lua` (`main` before issue 73), beside its keys.
const NUMBERED_KEYS_TOKEN_BUCKET: &str =
    include_str!("fixtures/keys-with-numbers/token_bucket.lua");

/// A token bucket on `tenant`, a fixed window (the reference's algorithm) on `user`.
const RULES: &str = "domain: upgrade\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 100}\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: fixed_window}\n";
const LIMIT: u64 = 100;
const HOUR_MS: u64 = 3_600_000;

/// The key tollgate keeps `tenant`'s bucket under (100 an hour, refilling 100 an hour).
fn bucket_key(prefix: &str, tenant: &str) -> String {
    let rate = Rate {
        requests_per_unit: LIMIT as u32,
        unit: Unit::Hour,
        unit_multiplier: 1,
        burst: LIMIT,
        algorithm: Algorithm::TokenBucket,
        calendar: None,
    };
    tollgate::keys::bucket_key(prefix, "upgrade", [("tenant", tenant)], &rate, 0, None)
}

/// The key tollgate keeps `user`'s fixed window under (100 an hour).
fn window_key(prefix: &str, user: &str) -> String {
    let rate = Rate {
        requests_per_unit: LIMIT as u32,
        unit: Unit::Hour,
        unit_multiplier: 1,
        burst: LIMIT,
        algorithm: Algorithm::FixedWindow,
        calendar: None,
    };
    tollgate::keys::bucket_key(prefix, "upgrade", [("user", user)], &rate, 0, None)
}

/// One hit of 1 on a fixed window by a 0.1.0 replica: `Ok(admitted)`, or the error.
fn release_0_1_hit(redis: &TestRedis, key: &str) -> Result<bool, String> {
    let limit = LIMIT.to_string();
    let window = HOUR_MS.to_string();
    let reply: ::redis::RedisResult<Vec<i64>> = command(
        redis.port(),
        &[
            "EVAL",
            RELEASE_0_1_FIXED_WINDOW,
            "1",
            key,
            &limit,
            &window,
            "1",
            "0",
        ],
    );
    reply.map(|r| r[0] == 1).map_err(|e| e.to_string())
}

/// One take of 1 by a 0.1.0 replica, as its store sends it: `Ok(admitted)`, or the error.
fn release_0_1_take(redis: &TestRedis, key: &str) -> Result<bool, String> {
    take_with(RELEASE_0_1_TOKEN_BUCKET, redis, key)
}

/// One take of 1 by `script` (a token bucket's of another build, whose arguments are
/// this release's: capacity, refill, window, cost, overdraft): `Ok(admitted)`, or the error.
fn take_with(script: &str, redis: &TestRedis, key: &str) -> Result<bool, String> {
    let limit = LIMIT.to_string();
    let window = HOUR_MS.to_string();
    let reply: ::redis::RedisResult<Vec<i64>> = command(
        redis.port(),
        &["EVAL", script, "1", key, &limit, &limit, &window, "1", "0"],
    );
    reply.map(|r| r[0] == 1).map_err(|e| e.to_string())
}

/// A lease claim by a 0.1.0 replica (need 1, want `want`, share 1): the tokens granted.
fn release_0_1_claim(redis: &TestRedis, key: &str, want: u64) -> Result<u64, String> {
    let limit = LIMIT.to_string();
    let window = HOUR_MS.to_string();
    let want = want.to_string();
    let reply: ::redis::RedisResult<Vec<i64>> = command(
        redis.port(),
        &[
            "EVAL",
            RELEASE_0_1_LEASE,
            "1",
            key,
            "1",
            "1",
            &limit,
            &limit,
            &window,
            "1",
            &want,
            "1",
        ],
    );
    reply.map(|r| r[0] as u64).map_err(|e| e.to_string())
}

fn tollgate(redis: &TestRedis, prefix: &str, format: Option<&str>) -> TestServer {
    let mut builder = TestServer::builder(RULES)
        .arg("store", &redis.url())
        .arg("key-prefix", prefix)
        .arg("store-timeout-ms", "500");
    if let Some(format) = format {
        builder = builder.arg("store-state-format", format);
    }
    builder.start()
}

async fn tollgate_take(server: &TestServer, tenant: &str) -> bool {
    tollgate_on(server, "tenant", tenant).await
}

/// One request on descriptor `key` = `value`: admitted or not.
async fn tollgate_on(server: &TestServer, key: &str, value: &str) -> bool {
    let mut client = server.client().await;
    let r = client
        .should_rate_limit(request("upgrade", &[&[(key, value)]]))
        .await
        .expect("answered");
    r.get_ref().overall_code == Code::Ok as i32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_hash_format_0_1_0_and_this_release_share_every_bucket_exactly() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("upgrade-hash");
    let server = tollgate(&redis, &prefix, Some("hash"));
    let key = bucket_key(&prefix, "shared");

    // A burst of 300 on one tenant's limit of 100, every other request from a 0.1.0 replica.
    let (mut new_admitted, mut old_admitted) = (0, 0);
    for i in 0..300 {
        if i % 2 == 0 {
            new_admitted += usize::from(tollgate_take(&server, "shared").await);
        } else {
            let admitted = release_0_1_take(&redis, &key)
                .unwrap_or_else(|e| panic!("0.1.0 failed on a bucket this release wrote: {e}"));
            old_admitted += usize::from(admitted);
        }
    }
    eprintln!("admitted: {new_admitted} by this release, {old_admitted} by 0.1.0");
    assert_eq!(
        new_admitted + old_admitted,
        LIMIT as usize,
        "one bucket, one limit"
    );
    assert!(new_admitted > 0 && old_admitted > 0);
    let kind: String = redis.cmd(&["TYPE", &key]);
    assert_eq!(kind, "hash", "written as 0.1.0 reads it");
    // This release reads the format it writes first: no WRONGTYPE on every call for an
    // operator's Redis error alerts to see (`INFO errorstats`).
    let errors: String = redis.cmd(&["INFO", "errorstats"]);
    assert!(!errors.contains("WRONGTYPE"), "{errors}");

    // A 0.1.0 lease claim on a bucket this release keeps: granted from the same tokens.
    let leased = bucket_key(&prefix, "leased");
    for _ in 0..30 {
        assert!(tollgate_take(&server, "leased").await);
    }
    let granted = release_0_1_claim(&redis, &leased, 50).expect("0.1.0's lease.lua reads it");
    assert_eq!(granted, 50, "70 left, 50 wanted");
    let mut after = 0;
    for _ in 0..40 {
        after += usize::from(tollgate_take(&server, "leased").await);
    }
    assert_eq!(after, 20, "100 - 30 taken - 50 leased by 0.1.0");
    let (tokens, _) = redis
        .token_state(&leased)
        .expect("a spent bucket is stored");
    assert!(tokens < 1.0, "{tokens} tokens left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_default_this_release_carries_on_0_1_0_buckets_and_0_1_0_cannot_read_its_own() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("upgrade-packed");
    let key = bucket_key(&prefix, "moved");

    // 0.1.0 spent 40 of the tenant's 100 before the upgrade.
    for _ in 0..40 {
        assert_eq!(release_0_1_take(&redis, &key), Ok(true));
    }
    let kind: String = redis.cmd(&["TYPE", &key]);
    assert_eq!(kind, "hash");

    // This release, at its defaults, reads that hash: exactly the 60 left.
    let server = tollgate(&redis, &prefix, None);
    let mut admitted = 0;
    for _ in 0..100 {
        admitted += usize::from(tollgate_take(&server, "moved").await);
    }
    assert_eq!(admitted, 60, "the bucket 0.1.0 left, not a new one");
    let kind: String = redis.cmd(&["TYPE", &key]);
    assert_eq!(kind, "string", "written packed from then on");

    // A 0.1.0 replica still running (or rolled back to) cannot read the packed state: its
    // script fails, so it decides that tenant from its fallback until the key expires (when
    // the bucket is full again). `store_state_format: hash` for the rollout avoids this.
    let err = release_0_1_take(&redis, &key).expect_err("0.1.0 reads only hashes");
    assert!(err.contains("WRONGTYPE"), "{err}");
    let err = release_0_1_claim(&redis, &key, 5).expect_err("0.1.0's lease.lua too");
    assert!(err.contains("WRONGTYPE"), "{err}");

    // And back: this release in hash mode turns the packed state into 0.1.0's hash, with the
    // same tokens (none left), so a rollback that sets `hash` first is exact too.
    drop(server);
    let server = tollgate(&redis, &prefix, Some("hash"));
    assert!(!tollgate_take(&server, "moved").await, "still spent");
    let kind: String = redis.cmd(&["TYPE", &key]);
    assert_eq!(kind, "hash");
    assert_eq!(
        release_0_1_take(&redis, &key),
        Ok(false),
        "spent, as 0.1.0 sees it"
    );
}

/// The fixed window, the reference's algorithm (and the default of a replica started as
/// `ratelimit`): with `hash` 0.1.0 and this release count one window; at the default this
/// release carries on 0.1.0's count and 0.1.0 fails on the packed one; back in `hash` mode the
/// count is 0.1.0's again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_windows_cross_over_as_token_buckets_do() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("upgrade-window");
    let key = window_key(&prefix, "shared");
    // Every count below is of one window: start well inside an hour (the test takes seconds).
    let time: Vec<u64> = redis.cmd(&["TIME"]);
    let to_edge = HOUR_MS - (time[0] * 1_000 + time[1] / 1_000) % HOUR_MS;
    if to_edge < 60_000 {
        tokio::time::sleep(std::time::Duration::from_millis(to_edge + 100)).await;
    }

    // Hash mode: a burst of 300 on one window of 100, every other hit from a 0.1.0 replica.
    let server = tollgate(&redis, &prefix, Some("hash"));
    let (mut new_admitted, mut old_admitted) = (0, 0);
    for i in 0..300 {
        if i % 2 == 0 {
            new_admitted += usize::from(tollgate_on(&server, "user", "shared").await);
        } else {
            let admitted = release_0_1_hit(&redis, &key)
                .unwrap_or_else(|e| panic!("0.1.0 failed on a window this release wrote: {e}"));
            old_admitted += usize::from(admitted);
        }
    }
    eprintln!("admitted: {new_admitted} by this release, {old_admitted} by 0.1.0");
    assert_eq!(
        new_admitted + old_admitted,
        LIMIT as usize,
        "one window, one limit"
    );
    assert!(new_admitted > 0 && old_admitted > 0);
    let kind: String = redis.cmd(&["TYPE", &key]);
    assert_eq!(kind, "hash", "written as 0.1.0 reads it");
    drop(server);

    // The default: 0.1.0 counted 40 in this window; this release admits the 60 left.
    let moved = window_key(&prefix, "moved");
    for _ in 0..40 {
        assert_eq!(release_0_1_hit(&redis, &moved), Ok(true));
    }
    let server = tollgate(&redis, &prefix, None);
    let mut admitted = 0;
    for _ in 0..100 {
        admitted += usize::from(tollgate_on(&server, "user", "moved").await);
    }
    assert_eq!(admitted, 60, "the window 0.1.0 counted, not a new one");
    let kind: String = redis.cmd(&["TYPE", &moved]);
    assert_eq!(kind, "string", "written packed from then on");
    let err = release_0_1_hit(&redis, &moved).expect_err("0.1.0 reads only hashes");
    assert!(err.contains("WRONGTYPE"), "{err}");

    // A rollback that sets `hash` first: the packed count becomes 0.1.0's hash again.
    drop(server);
    let server = tollgate(&redis, &prefix, Some("hash"));
    assert!(!tollgate_on(&server, "user", "moved").await, "still spent");
    let kind: String = redis.cmd(&["TYPE", &moved]);
    assert_eq!(kind, "hash");
    assert_eq!(
        release_0_1_hit(&redis, &moved),
        Ok(false),
        "spent, as 0.1.0 sees it"
    );
}

/// From the previous build of `main`, whose keys named a bucket by the limit's numbers
/// (`…|tb:3600000:100}`), to this release's (`…|tb:3600000:0}`): the two builds never share a
/// bucket, so during the rollout a tenant holds one bucket under each (up to twice its limit
/// while both run; docs/redis.md "Upgrading"), this release starts each bucket fresh once,
/// and the old replicas keep answering from theirs without an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_keys_with_numbers_each_bucket_starts_fresh_once_and_the_old_build_never_fails() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("numbered");
    let old_key = format!("{prefix}{{upgrade|tenant=acme|tb:3600000:100}}");
    // The previous build spent 40 of acme's 100 before the upgrade.
    for _ in 0..40 {
        assert_eq!(
            take_with(NUMBERED_KEYS_TOKEN_BUCKET, &redis, &old_key),
            Ok(true)
        );
    }
    let server = tollgate(&redis, &prefix, None);
    let mut admitted = 0;
    for _ in 0..150 {
        admitted += usize::from(tollgate_take(&server, "acme").await);
    }
    assert_eq!(admitted, 100, "one fresh bucket: the upgrade's stated cost");
    let new_key = bucket_key(&prefix, "acme");
    let state: Vec<u8> = redis.cmd(&["GET", &new_key]);
    assert_eq!(
        state.len(),
        24,
        "tokens, ts and the capacity they count against"
    );
    // A replica of the previous build still running keeps its own bucket: the 60 it had left,
    // then refusals, and never an error (it never meets this release's state).
    let mut old_admitted = 0;
    for _ in 0..70 {
        let took = take_with(NUMBERED_KEYS_TOKEN_BUCKET, &redis, &old_key)
            .unwrap_or_else(|e| panic!("the previous build failed: {e}"));
        old_admitted += usize::from(took);
    }
    assert_eq!(old_admitted, 60);
    let old_state: Vec<u8> = redis.cmd(&["GET", &old_key]);
    assert_eq!(old_state.len(), 16, "the previous build's own two numbers");
}
