//! The counter API on the admin port (`counter_api_token_file`): reading a tenant's buckets and
//! resetting them, behind a bearer token. On the memory store and on a real Redis through two
//! replicas, where the reset reaches the other replica's over-limit cache through the fleet's
//! reset log; and on the real 3-primary cluster with buckets on different nodes.

mod common;

use std::time::{Duration, Instant};

use common::redis::{TestCluster, TestRedis, unique_prefix};
use common::{InProcess, metric_sum, request, request_with};
use serde_json::Value;

const RULES: &str = "domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: pool
    rate_limit: {unit: hour, requests_per_unit: 8, shards: 4}
";

const TOKEN: &str = "c0unter-t0ken";

/// A tollgate with the counter API on (the token in a file of its own) and `configure`.
fn server(
    configure: impl FnOnce(&mut tollgate::settings::Settings) + Send + 'static,
) -> (InProcess, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let path = file.to_string_lossy().to_string();
    let server = InProcess::start(RULES, move |s| {
        s.counter_api_token_file = path;
        configure(s);
    });
    (server, dir)
}

const ACME: &str =
    r#"{"domain": "api", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}]}"#;

/// POST `path` with `body`, authorized by `token` (none: no header); (status, JSON, headers).
fn call(
    admin: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, Value, common::HttpResponse) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![
        ("x-tollgate-operator", "alice"),
        ("x-tollgate-reason", "ticket 42"),
    ];
    if let Some(a) = &auth {
        headers.push(("authorization", a));
    }
    let r = request_with(admin, "POST", path, &headers, body).expect("the admin port answers");
    let json = serde_json::from_str(&r.body).unwrap_or(Value::Null);
    (r.status, json, r)
}

/// `n` decisions for `tenant` through gRPC; their codes (1 OK, 2 OVER_LIMIT).
async fn spend(server: &InProcess, entries: &[(&str, &str)], n: usize) -> Vec<i32> {
    let mut client = server.client().await;
    let mut codes = Vec::new();
    for _ in 0..n {
        let r = client
            .should_rate_limit(request("api", &[entries]))
            .await
            .unwrap()
            .into_inner();
        codes.push(r.overall_code);
    }
    codes
}

fn remaining(json: &Value, field: &str) -> Vec<u64> {
    json[field]
        .as_array()
        .unwrap_or_else(|| panic!("no {field}: {json}"))
        .iter()
        .map(|b| b["remaining"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn a_token_guards_reads_and_resets_on_the_memory_store() {
    let (server, _dir) = server(|_| {});
    let admin = server.admin;
    assert_eq!(spend(&server, &[("tenant", "acme")], 4).await, [1, 1, 1, 2]);

    // No token, a wrong one, a token without "Bearer ": 401, and nothing changed.
    for token in [None, Some("guess"), Some("c0unter-t0ke")] {
        for path in ["/counters/read", "/counters/reset"] {
            let (status, json, r) = call(admin, path, token, ACME);
            assert_eq!(status, 401, "{path} {token:?}: {json}");
            assert!(
                r.header("www-authenticate")
                    .is_some_and(|h| h.starts_with("Bearer"))
            );
            assert!(!r.body.contains(TOKEN));
        }
    }
    let raw = request_with(
        admin,
        "POST",
        "/counters/reset",
        &[("authorization", TOKEN)],
        ACME,
    )
    .unwrap();
    assert_eq!(raw.status, 401, "the token without its scheme");
    assert_eq!(
        spend(&server, &[("tenant", "acme")], 1).await,
        [2],
        "still spent"
    );

    // Read: the bucket as it is, nothing spent.
    let (status, json, _) = call(admin, "/counters/read", Some(TOKEN), ACME);
    assert_eq!(status, 200, "{json}");
    assert_eq!(remaining(&json, "buckets"), [0]);
    let bucket = &json["buckets"][0];
    assert_eq!(bucket["class"], "tenant");
    assert_eq!(
        (
            bucket["requests_per_unit"].as_u64(),
            bucket["unit"].as_str()
        ),
        (Some(3), Some("hour"))
    );
    assert!(
        bucket["key"].as_str().unwrap().contains("tenant=acme"),
        "{bucket}"
    );
    assert!(bucket["reset_ms"].as_u64().unwrap() > 3_000_000, "{bucket}");

    // Reset: the answer is the bucket as it was; then it is whole.
    let (status, json, _) = call(admin, "/counters/reset", Some(TOKEN), ACME);
    assert_eq!(status, 200, "{json}");
    assert_eq!(remaining(&json, "reset"), [0], "what was reset");
    assert_eq!(spend(&server, &[("tenant", "acme")], 4).await, [1, 1, 1, 2]);

    // Bad input: 400, as /json says it.
    let (status, json, _) = call(admin, "/counters/read", Some(TOKEN), r#"{"domain": ""}"#);
    assert_eq!(status, 400, "{json}");
    assert!(json["error"].as_str().unwrap().contains("domain"), "{json}");
    // A domain the rules do not declare: 404 with the domains in force and the nearest one,
    // not an empty list of buckets that reads as "nothing counted yet".
    let (status, json, _) = call(
        admin,
        "/counters/read",
        Some(TOKEN),
        &ACME.replace("\"api\"", "\"Api\""),
    );
    assert_eq!(status, 404, "{json}");
    assert_eq!(
        json["error"],
        "no rules declare the domain `Api` (did you mean `api`?); the domains in force: api"
    );

    let calls = |action: &str, result: &str| {
        metric_sum(
            admin,
            "tollgate_counter_api_calls_total",
            &[
                &format!("action=\"{action}\""),
                &format!("result=\"{result}\""),
            ],
        )
    };
    assert_eq!(calls("reset", "unauthorized"), 4.0);
    assert_eq!(calls("read", "unauthorized"), 3.0);
    assert_eq!((calls("read", "ok"), calls("reset", "ok")), (1.0, 1.0));
    assert_eq!(calls("read", "invalid"), 2.0);
    let log = server.log();
    assert!(
        log.contains("counter API: reset") && log.contains("alice") && log.contains("ticket 42"),
        "{log}"
    );
    assert!(!log.contains(TOKEN), "the token was logged");

    // The token file is read at each call: a rotated token applies at once.
    std::fs::write(_dir.path().join("token"), "n3w-t0ken").unwrap();
    assert_eq!(call(admin, "/counters/read", Some(TOKEN), ACME).0, 401);
    assert_eq!(
        call(admin, "/counters/read", Some("n3w-t0ken"), ACME).0,
        200
    );
}

#[tokio::test]
async fn the_api_is_off_by_default() {
    let server = InProcess::start(RULES, |_| {});
    let (status, _, _) = call(server.admin, "/counters/read", Some(TOKEN), ACME);
    assert_eq!(status, 404);
}

/// Two replicas on one Redis: replica B refuses the spent tenant from its over-limit cache
/// (an hour's wait); a reset through replica A reaches B through the reset log within its
/// membership interval, and B admits again. A sharded limit's every shard is reset.
#[tokio::test]
async fn a_reset_on_one_replica_reaches_the_others_over_limit_cache() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("counters");
    let replica = |prefix: String, url: String| {
        server(move |s| {
            s.store = url;
            s.key_prefix = prefix;
            s.membership_interval_ms = 100;
        })
    };
    let (a, _da) = replica(prefix.clone(), redis.url());
    let (b, _db) = replica(prefix.clone(), redis.url());
    assert_eq!(spend(&b, &[("tenant", "acme")], 5).await, [1, 1, 1, 2, 2]);
    let cached = || {
        metric_sum(
            b.admin,
            "tollgate_local_decisions_total",
            &["reason=\"over_limit_cache\""],
        )
    };
    assert!(cached() >= 1.0, "B refuses from its cache");
    // A sharded pool: a request tries a random shard and one other, so 30 may leave a token.
    let admitted = spend(&b, &[("pool", "p")], 30)
        .await
        .iter()
        .filter(|&&c| c == 1)
        .count() as u64;

    let both = r#"{"domain": "api", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}]}, {"entries": [{"key": "pool", "value": "p"}]}]}"#;
    let (status, json, _) = call(a.admin, "/counters/read", Some(TOKEN), both);
    assert_eq!(status, 200, "{json}");
    assert_eq!(remaining(&json, "buckets"), [0, 8 - admitted]);
    assert_eq!(
        json["buckets"][1]["shards"].as_array().map(Vec::len),
        Some(4)
    );
    let (status, json, _) = call(a.admin, "/counters/reset", Some(TOKEN), both);
    assert_eq!(status, 200, "{json}");
    let keys: Vec<String> = redis.cmd(&["KEYS", &format!("{prefix}*")]);
    assert!(
        keys.iter()
            .all(|k| !k.contains("tenant=acme") && !k.contains("pool=p")),
        "deleted: {keys:?}"
    );

    // B learns of it from the log (every 100 ms here), and asks the store again.
    let since = Instant::now();
    let mut codes = Vec::new();
    while since.elapsed() < Duration::from_secs(10) {
        codes = spend(&b, &[("tenant", "acme")], 1).await;
        if codes == [1] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(codes, [1], "B still refuses after the reset: {}", b.log());
    eprintln!(
        "B admitted again {:?} after the reset through A",
        since.elapsed()
    );
    assert!(
        b.log().contains("forgot buckets reset in the fleet"),
        "{}",
        b.log()
    );
    let (_, json, _) = call(b.admin, "/counters/read", Some(TOKEN), both);
    assert_eq!(remaining(&json, "buckets"), [2, 8]);
}

/// On the cluster, one request's buckets on different primaries are read and reset.
#[tokio::test]
async fn reads_and_resets_reach_every_node_of_a_cluster() {
    let cluster = TestCluster::start();
    let prefix = unique_prefix("counters-cluster");
    let url = cluster.url();
    let (server, _dir) = server(move |s| {
        s.store = url;
        s.key_prefix = prefix;
    });
    let tenants: Vec<String> = (0..6).map(|i| format!("t{i}")).collect();
    for t in &tenants {
        assert_eq!(spend(&server, &[("tenant", t)], 3).await, [1, 1, 1]);
    }
    let descriptors: Vec<String> = tenants
        .iter()
        .map(|t| format!(r#"{{"entries": [{{"key": "tenant", "value": "{t}"}}]}}"#))
        .collect();
    let body = format!(
        r#"{{"domain": "api", "descriptors": [{}]}}"#,
        descriptors.join(",")
    );
    let (status, json, _) = call(server.admin, "/counters/read", Some(TOKEN), &body);
    assert_eq!(status, 200, "{json}");
    assert_eq!(remaining(&json, "buckets"), [0; 6]);
    let (status, json, _) = call(server.admin, "/counters/reset", Some(TOKEN), &body);
    assert_eq!(status, 200, "{json}");
    let (_, json, _) = call(server.admin, "/counters/read", Some(TOKEN), &body);
    assert_eq!(remaining(&json, "buckets"), [3; 6]);
    for t in &tenants {
        assert_eq!(spend(&server, &[("tenant", t)], 1).await, [1]);
    }
}

/// The fleet's reset log (`lua/resets.lua`) says when a reader may have missed resets: more
/// than the 1,000 keys it keeps reset since its last look, or the log lost (a flushed Redis).
/// The follower then empties its whole over-limit cache.
#[tokio::test]
async fn the_reset_log_says_when_resets_may_be_missing() {
    let redis = TestRedis::start();
    let store = common::store::contract_store(&redis.url()).await;
    let members = format!("{}{{members}}", unique_prefix("resetlog"));
    let first = store.resets_since(&members, None).await.unwrap();
    assert_eq!((first.seq, first.keys.len()), (0, 0));

    let two = vec!["k1".to_string(), "k2".to_string()];
    store.reset(&two, &members).await.unwrap();
    let log = store.resets_since(&members, Some(first.seq)).await.unwrap();
    assert_eq!(
        (log.seq, log.keys.clone(), log.complete),
        (1, two.clone(), true)
    );
    let nothing_new = store.resets_since(&members, Some(log.seq)).await.unwrap();
    assert_eq!((nothing_new.keys.len(), nothing_new.complete), (0, true));

    // 1,200 keys in one reset: the log keeps the last 1,000.
    let many: Vec<String> = (0..1_200).map(|i| format!("m{i}")).collect();
    store.reset(&many, &members).await.unwrap();
    let trimmed = store.resets_since(&members, Some(log.seq)).await.unwrap();
    assert_eq!(trimmed.seq, 2);
    assert_eq!(trimmed.keys.len(), 1_000);
    assert!(!trimmed.complete, "200 keys and the first reset are gone");
    // A reader that saw up to 2 has nothing missing.
    let caught_up = store.resets_since(&members, Some(2)).await.unwrap();
    assert!(caught_up.complete && caught_up.keys.is_empty());

    // A flushed Redis: the number starts over below what the reader saw.
    redis.cmd::<()>(&["FLUSHALL"]);
    store.reset(&two, &members).await.unwrap();
    let lost = store.resets_since(&members, Some(2)).await.unwrap();
    assert_eq!(
        (lost.seq, lost.keys.clone(), lost.complete),
        (1, two, false)
    );
}
