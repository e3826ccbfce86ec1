//! Usage-based costs: a rule with `overdraft: true` charges what a request used, known only
//! when its response ends, even when it does not fit what is left of the budget. Through a
//! real Envoy running `examples/envoy/llm/envoy.yaml` (a check on the request path, the
//! response's `x-tokens-used` charged when the stream is done) and a real Redis: the budget
//! goes below zero, the next request gets 429 with a `Retry-After` for the debt; and a charge
//! always reaches the store, even while the over-limit cache refuses the key's checks.

mod common;

use std::time::Duration;

use common::envoy::TestEnvoy;
use common::redis::{TestRedis, unique_prefix};
use common::{InProcess, get_with, metric_sum, poll, request};
use envoy_types::pb::google::protobuf::UInt64Value;

/// The example's rules with the issue's budget: 100 tokens an hour.
fn rules() -> String {
    let example = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/envoy/llm/rules.yaml"),
    )
    .expect("read examples/envoy/llm/rules.yaml");
    assert!(example.contains("requests_per_unit: 1000000"));
    example.replace("requests_per_unit: 1000000", "requests_per_unit: 100")
}

/// The tenant's stored balance (the token bucket's tokens), if it is stored.
fn balance(redis: &TestRedis, prefix: &str, tenant: &str) -> Option<f64> {
    let keys: Vec<String> = redis.cmd(&["KEYS", &format!("{prefix}*{tenant}*")]);
    let key = keys.first()?;
    redis.token_state(key).map(|(t, _)| t)
}

fn server(redis: &TestRedis, prefix: &str) -> InProcess {
    server_with(redis, prefix, 0)
}

fn server_with(redis: &TestRedis, prefix: &str, lease_max_batch: u64) -> InProcess {
    let (url, prefix) = (redis.url(), prefix.to_string());
    InProcess::start(&rules(), move |s| {
        s.store = url;
        s.key_prefix = prefix;
        s.response_headers = true;
        s.lease_max_batch = lease_max_batch;
    })
}

#[test]
fn envoy_charges_each_response_and_refuses_the_tenant_in_debt() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("llm");
    let tollgate = server(&redis, &prefix);
    // What this test holds is the charge per response, not Envoy's 20 ms: a call Envoy gives
    // up on (its first, opening the connection, on a busy machine) would pass uncharged.
    let envoy = TestEnvoy::start_example(
        "examples/envoy/llm/envoy.yaml",
        tollgate.grpc,
        &[("timeout: 0.02s", "timeout: 1s")],
    );
    let calls = || metric_sum(tollgate.admin, "tollgate_requests_total", &[]);
    let mut statuses = Vec::new();
    for i in 1..=4 {
        let r = get_with(envoy.front, "/v1/chat/completions", &[("x-tenant", "acme")])
            .expect("envoy answered");
        statuses.push(r.status);
        if r.status == 429 {
            // In debt: 100 - 3 × 40 = -20, so 21 tokens at 36 s each before a check fits.
            let retry: u64 = r
                .header("retry-after")
                .unwrap_or_else(|| panic!("no Retry-After: {:?}", r.headers))
                .parse()
                .unwrap();
            assert!(
                (740..=757).contains(&retry),
                "Retry-After {retry} s, want about 756"
            );
            break;
        }
        // The charge is sent when the stream is done, after the client has its answer:
        // wait for it (the check and the charge: two calls per request).
        let charged = poll(Duration::from_secs(5), || {
            (calls() >= 2.0 * i as f64).then_some(())
        });
        assert!(
            charged.is_some(),
            "no stream-done charge for request {i}: {} calls; envoy:\n{}",
            calls(),
            envoy.log()
        );
    }
    assert_eq!(statuses, vec![200, 200, 200, 429], "{}", tollgate.log());
    // 100 - 120 in Redis (refill since is a few thousandths of a token).
    let t = balance(&redis, &prefix, "acme").expect("the budget is stored");
    assert!((-20.0..-19.9).contains(&t), "balance {t}, want -20");
}

/// Global leasing passes overdraft limits by: each check and charge goes to the shared
/// bucket, which holds exactly what was used (a lease would have claimed tokens ahead).
#[tokio::test]
async fn global_leasing_leaves_overdraft_limits_to_the_store() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("llm-lease");
    let tollgate = server_with(&redis, &prefix, 20);
    let mut client = tollgate.client().await;
    for hits in [0, 40, 0, 40, 0, 40] {
        let mut r = request("llm", &[&[("tenant", "gamma")]]);
        r.descriptors[0].hits_addend = Some(UInt64Value { value: hits });
        client.should_rate_limit(r).await.unwrap();
    }
    let t = balance(&redis, &prefix, "gamma").expect("the budget is stored");
    assert!((-20.0..-19.9).contains(&t), "balance {t}, want -20");
    let claims = metric_sum(tollgate.admin, "tollgate_lease_claims_total", &[]);
    assert_eq!(claims, 0.0, "an overdraft limit was leased");
}

/// A charge reaches the store even after the key's refusals fill the over-limit cache (on by
/// default): refusing it from memory would drop usage that must be counted.
#[tokio::test]
async fn a_charge_is_counted_while_the_over_limit_cache_refuses_checks() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("llm-cache");
    let tollgate = server(&redis, &prefix);
    let mut client = tollgate.client().await;
    let call = |hits: u64| {
        let mut r = request("llm", &[&[("tenant", "beta")]]);
        r.descriptors[0].hits_addend = Some(UInt64Value { value: hits });
        r
    };
    let mut codes = Vec::new();
    // A charge of 120 on 100: over (-20); two checks refused (the cache now holds the key);
    // then a charge of 10 must still land (-30).
    for hits in [120, 0, 0, 10] {
        let r = client
            .should_rate_limit(call(hits))
            .await
            .unwrap()
            .into_inner();
        codes.push(r.overall_code);
    }
    assert_eq!(codes, vec![2, 2, 2, 2], "all over: the budget is in debt");
    let cached = metric_sum(
        tollgate.admin,
        "tollgate_local_decisions_total",
        &["reason=\"over_limit_cache\""],
    );
    assert!(
        cached >= 1.0,
        "the second check came from the cache ({cached})"
    );
    let t = balance(&redis, &prefix, "beta").expect("the budget is stored");
    assert!(
        (-30.0..-29.9).contains(&t),
        "balance {t}: the last charge was not counted"
    );
}

// ---- Reserve, then commit: examples/envoy/llm-reserve ----

const RESERVE_EXAMPLE: &str = "examples/envoy/llm-reserve/envoy.yaml";

/// The reserve example's rules with a budget of 1,000 tokens an hour.
fn reserve_rules() -> String {
    let example = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("examples/envoy/llm-reserve/rules.yaml"),
    )
    .expect("read examples/envoy/llm-reserve/rules.yaml");
    assert!(example.contains("requests_per_unit: 1000000"));
    example.replace("requests_per_unit: 1000000", "requests_per_unit: 1000")
}

fn reserve_server(redis: &TestRedis, prefix: &str) -> InProcess {
    let (url, prefix) = (redis.url(), prefix.to_string());
    InProcess::start(&reserve_rules(), move |s| {
        s.store = url;
        s.key_prefix = prefix;
        s.response_dynamic_metadata = true;
    })
}

/// The example with a 3 s model (the burst's reservations are all in flight together on a
/// loaded machine) and Envoy's wait for tollgate at 1 s (a call Envoy gives up on is let
/// through unreserved: the example fails open; the test must not count that).
fn reserve_envoy(tollgate: &InProcess, more: &[(&str, &str)]) -> TestEnvoy {
    let mut subs = vec![
        ("fixed_delay: 1s", "fixed_delay: 3s"),
        ("timeout: 0.02s", "timeout: 1s"),
    ];
    subs.extend_from_slice(more);
    TestEnvoy::start_example(RESERVE_EXAMPLE, tollgate.grpc, &subs)
}

/// Sends `n` requests at once with `headers`; their statuses, in order.
fn burst(front: std::net::SocketAddr, n: usize, headers: &[(&str, &str)]) -> Vec<u16> {
    let start = std::sync::Arc::new(std::sync::Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|_| {
            let start = start.clone();
            let headers: Vec<(String, String)> = headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            std::thread::spawn(move || {
                let headers: Vec<(&str, &str)> =
                    headers.iter().map(|(k, v)| (&k[..], &v[..])).collect();
                start.wait();
                common::get_with_timeout(
                    front,
                    "/v1/chat/completions",
                    &headers,
                    Duration::from_secs(30),
                )
                .map_or(0, |r| r.status)
            })
        })
        .collect();
    let mut statuses: Vec<u16> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    statuses.sort_unstable();
    statuses
}

/// Waits until tollgate has seen `n` refunds (each settlement gives its estimate back).
fn wait_settled(tollgate: &InProcess, envoy: &TestEnvoy, n: f64) {
    let refunds = || {
        metric_sum(
            tollgate.admin,
            "tollgate_decisions_total",
            &[r#"outcome="refund""#],
        )
    };
    let settled = poll(Duration::from_secs(10), || (refunds() >= n).then_some(()));
    assert!(
        settled.is_some() && refunds() == n,
        "{} refunds, want {n}; envoy:\n{}",
        refunds(),
        envoy.log()
    );
}

/// Reservations in flight hold the budget: a burst of 5 reserving 300 of 1,000 admits 3, and
/// the 2 refused give nothing back. When the streams end, each settles: its 300 back, its 40
/// used charged (1,000 − 3 × 40 = 880). An estimate that was too small is charged what was
/// used; a request without one reserves the example's default 4,096, which does not fit.
#[test]
fn reservations_hold_the_budget_and_settle_on_what_was_used() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("llm-reserve");
    let tollgate = reserve_server(&redis, &prefix);
    let envoy = reserve_envoy(&tollgate, &[]);
    let acme = [("x-tenant", "acme"), ("x-max-tokens", "300")];

    let statuses = burst(envoy.front, 5, &acme);
    assert_eq!(statuses, [200, 200, 200, 429, 429], "{}", tollgate.log());
    wait_settled(&tollgate, &envoy, 3.0);
    // The refill (1,000 an hour: 0.28 a second) adds a little over the test's seconds, and
    // each give-back is its estimate less the refill while the reservation was held (about
    // 3 s: 0.8 each; docs/usage-costs.md, "Receipts").
    let t = balance(&redis, &prefix, "acme").expect("the budget is stored");
    assert!(
        (876.0..886.0).contains(&t),
        "balance {t}, want 880 + refill - 3 x the refill while held"
    );

    // An estimate of 10 for a response that used 40: the 40 is charged.
    let r = get_with(
        envoy.front,
        "/v1/chat/completions",
        &[("x-tenant", "acme"), ("x-max-tokens", "10")],
    )
    .expect("envoy answered");
    assert_eq!(r.status, 200);
    wait_settled(&tollgate, &envoy, 4.0);
    let after = balance(&redis, &prefix, "acme").expect("the budget is stored");
    assert!(
        (t - 40.0..t - 38.0).contains(&after),
        "balance {after} after {t}: the usage above the estimate was not charged"
    );

    // No estimate: the example reserves 4,096, more than the budget holds.
    let r = get_with(envoy.front, "/v1/chat/completions", &[("x-tenant", "acme")])
        .expect("envoy answered");
    assert_eq!(
        r.status, 429,
        "a request without x-max-tokens must not pass unreserved"
    );
}

/// A response that does not say what it used is charged its whole estimate: nothing is
/// given back (the example's `header_mutation` fills `x-tokens-used` in).
#[test]
fn a_response_without_its_usage_is_charged_the_estimate() {
    let redis = TestRedis::start();
    let prefix = unique_prefix("llm-reserve-silent");
    let tollgate = reserve_server(&redis, &prefix);
    // The stand-in model stops saying what it used.
    let envoy = reserve_envoy(
        &tollgate,
        &[(
            "key: x-tokens-used, value: \"40\"",
            "key: x-model, value: \"stand-in\"",
        )],
    );
    let r = get_with(
        envoy.front,
        "/v1/chat/completions",
        &[("x-tenant", "initech"), ("x-max-tokens", "250")],
    )
    .expect("envoy answered");
    assert_eq!(r.status, 200);
    wait_settled(&tollgate, &envoy, 1.0);
    let t = balance(&redis, &prefix, "initech").expect("the budget is stored");
    // Less the refill while held (3 s at 0.28 a second), which the give-back leaves out and the
    // refill puts back.
    assert!((748.0..752.0).contains(&t), "balance {t}, want 1000 - 250");
}

/// The client controls its estimate, not whether it is counted: `x-max-tokens` that is not a
/// positive integer of at most 9 digits (from which Envoy would build no descriptor, or a
/// reservation of nothing) is replaced by the example's default 4,096 before the ratelimit
/// filter reads it. Each such request reaches tollgate (one call each), does not fit the
/// 1,000 budget and is refused, and leaves the budget as it was; a valid estimate still passes.
#[test]
fn an_estimate_that_is_not_a_positive_integer_reserves_the_default() {
    const BAD: [&str; 8] = [
        "abc",
        "-1",
        "",
        "18446744073709551616",
        "lots",
        "0",
        "1.5",
        "0x10",
    ];
    let redis = TestRedis::start();
    let prefix = unique_prefix("llm-reserve-bad");
    let tollgate = reserve_server(&redis, &prefix);
    let envoy = reserve_envoy(&tollgate, &[]);
    // Every ShouldRateLimit call tollgate answered, and those it refused.
    let calls = || metric_sum(tollgate.admin, "tollgate_requests_total", &[]);
    let refused = || {
        metric_sum(
            tollgate.admin,
            "tollgate_decisions_total",
            &[r#"outcome="over_limit""#],
        )
    };

    let statuses: Vec<(&str, u16)> = BAD
        .iter()
        .map(|&estimate| {
            let r = common::get_with_timeout(
                envoy.front,
                "/v1/chat/completions",
                &[("x-tenant", "hooli"), ("x-max-tokens", estimate)],
                Duration::from_secs(30),
            );
            (estimate, r.map_or(0, |r| r.status))
        })
        .collect();
    let n = BAD.len() as f64;
    // A refusal comes from tollgate, so its call is counted by the time Envoy answers; the poll
    // only covers the metric being recorded after the answer is sent.
    poll(Duration::from_secs(5), || {
        (calls() >= n && refused() >= n).then_some(())
    });
    let admitted = statuses.iter().filter(|(_, s)| *s != 429).count();
    eprintln!(
        "bad estimates: {admitted} of {} admitted; tollgate saw {} calls, {} over_limit; {statuses:?}",
        BAD.len(),
        calls(),
        refused()
    );
    assert!(
        statuses.iter().all(|(_, s)| *s == 429),
        "every bad estimate must reserve 4,096 and be refused: {statuses:?}"
    );
    assert_eq!(
        (calls(), refused()),
        (n, n),
        "one RLS call, refused, per request; envoy:\n{}",
        envoy.log()
    );
    // A refused reservation takes nothing: the budget is as full as it was (or not stored).
    let untouched = balance(&redis, &prefix, "hooli");
    assert!(
        untouched.is_none_or(|t| t >= 1000.0),
        "balance {untouched:?} after refused reservations, want 1,000"
    );

    // A valid estimate is reserved as sent, and settles on the 40 used.
    let r = get_with(
        envoy.front,
        "/v1/chat/completions",
        &[("x-tenant", "hooli"), ("x-max-tokens", "300")],
    )
    .expect("envoy answered");
    assert_eq!(r.status, 200, "{}", tollgate.log());
    wait_settled(&tollgate, &envoy, 1.0);
    let t = balance(&redis, &prefix, "hooli").expect("the budget is stored");
    // The receipt stamps the take when it was sent, so the refund gives back the refill of the
    // time the take was in flight less (at 1,000 an hour, 0.28 a second; 0.0006 measured once
    // on a busy machine): 0.05 is 180 ms of it.
    assert!((959.95..962.0).contains(&t), "balance {t}, want 1000 - 40");
}
