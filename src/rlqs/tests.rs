//! Sessions against the memory store on a manual clock: the accounting of assignments
//! (claimed, settled, charged) in the one shared bucket RLS decides from too.

use std::path::PathBuf;
use std::sync::Arc;

use super::*;
use crate::limiter::{Code, FallbackMode, Limiter, LimiterConfig, Request, RequestDescriptor};
use crate::quota::Op;
use crate::rules::LoadOptions;
use crate::rules::RuleSet;
use crate::rules::load::load_sources;
use crate::store::{MemoryStore, Store};
use crate::telemetry::Metrics;

const RULES: &str = r#"
domain: q
rlqs: true
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: endpoint
        rate_limit: {unit: minute, requests_per_unit: 60, algorithm: fixed_window}
  - key: free
    rate_limit: {unlimited: true}
  - key: zero
    rate_limit: {unit: hour, requests_per_unit: 0}
"#;

const OTHER: &str = "domain: plain\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";

fn rules(text: &str) -> RuleSet {
    load_sources(
        &[
            (PathBuf::from("q.yaml"), text.to_string()),
            (PathBuf::from("plain.yaml"), OTHER.to_string()),
        ],
        LoadOptions::default(),
    )
    .unwrap()
}

struct World {
    clock: Clock,
    limiter: Limiter,
    rlqs: Arc<Rlqs>,
    metrics: Arc<Metrics>,
    rules: RuleSet,
}

fn world() -> World {
    world_with(|_| {})
}

fn world_with(configure: impl FnOnce(&mut RlqsConfig)) -> World {
    let clock = Clock::manual(1_700_000_000_000);
    world_on(
        Store::Memory(MemoryStore::new(clock.clone())),
        FallbackMode::Local,
        clock,
        configure,
    )
}

/// A store that never answers: every op fails as a refused connection would.
#[derive(Debug)]
struct Down;

impl crate::store::Backend for Down {
    fn apply_each<'a>(
        &'a self,
        ops: &'a [Op],
    ) -> futures_util::future::BoxFuture<
        'a,
        Vec<Result<crate::quota::Outcome, crate::store::StoreError>>,
    > {
        let err =
            || crate::store::StoreError::new(crate::store::StoreErrorKind::Connection, "down");
        Box::pin(async move { ops.iter().map(|_| Err(err())).collect() })
    }

    fn heartbeat<'a>(
        &'a self,
        _key: &'a str,
        _replica: &'a str,
        _ttl: std::time::Duration,
    ) -> futures_util::future::BoxFuture<'a, Result<u64, crate::store::StoreError>> {
        Box::pin(async { Ok(1) })
    }

    fn leave<'a>(
        &'a self,
        _key: &'a str,
        _replica: &'a str,
    ) -> futures_util::future::BoxFuture<'a, Result<u64, crate::store::StoreError>> {
        Box::pin(async { Ok(0) })
    }

    fn name(&self) -> &'static str {
        "down"
    }
}

fn world_on(
    store: Store,
    fallback: FallbackMode,
    clock: Clock,
    configure: impl FnOnce(&mut RlqsConfig),
) -> World {
    let metrics = Arc::new(Metrics::new());
    let config = LimiterConfig {
        key_prefix: "t:".into(),
        fallback,
        replicas: Arc::new(crate::fleet::Replicas::new(2, 1)),
        ..LimiterConfig::new(clock.clone())
    };
    let limiter = Limiter::new(store, config, metrics.clone());
    let mut rc = RlqsConfig {
        report_interval_ms: 5_000,
        assignment_ttl_ms: 15_000,
        max_streams: 4,
        max_streams_per_peer: 4,
        max_buckets_per_stream: 100,
        max_state_bytes: 64 << 20,
        idle_ms: 60_000,
        max_entries: 16,
        max_key_bytes: 256,
        max_value_bytes: 4_096,
        clock: clock.clone(),
    };
    configure(&mut rc);
    World {
        rlqs: Rlqs::new(rc, metrics.rlqs.clone()),
        clock,
        limiter,
        metrics,
        rules: rules(RULES),
    }
}

fn id(pairs: &[(&str, &str)]) -> BucketKey {
    let mut v: BucketKey = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    v.sort();
    v
}

fn usage(pairs: &[(&str, &str)], allowed: u64, denied: u64, elapsed_ms: u64) -> Usage {
    Usage {
        id: id(pairs),
        allowed,
        denied,
        elapsed_ms,
    }
}

impl World {
    async fn report(&self, s: &mut Session, usages: Vec<Usage>) -> Vec<Action> {
        s.report(&self.limiter, &self.rules, "q", usages)
            .await
            .unwrap()
    }

    /// What an RLS request for `entries` in `q` sees: its code and the bucket's remaining.
    async fn rls(&self, entries: &[(&str, &str)]) -> (Code, u32) {
        let req = Request {
            domain: "q",
            descriptors: vec![RequestDescriptor {
                entries: entries.to_vec(),
                hits_addend: None,
                limit_override: None,
                refund: false,
            }],
            hits_addend: 1,
        };
        let d = self.limiter.decide(&self.rules, &req).await.unwrap();
        (d.statuses[0].code, d.statuses[0].remaining)
    }
}

fn tokens(actions: &[Action]) -> Vec<u64> {
    actions
        .iter()
        .map(|a| match a.assignment {
            Assignment::Tokens { tokens, .. } => tokens,
            _ => 0,
        })
        .collect()
}

#[tokio::test]
async fn the_first_report_must_name_a_domain_served_over_rlqs() {
    let w = world();
    let mut s = Session::open(&w.rlqs, None).unwrap();
    async fn r(w: &World, s: &mut Session, d: &str) -> Result<(), RlqsError> {
        s.report(&w.limiter, &w.rules, d, vec![]).await.map(|_| ())
    }
    assert_eq!(r(&w, &mut s, "").await, Err(RlqsError::NoDomain));
    assert_eq!(
        r(&w, &mut s, "nowhere").await,
        Err(RlqsError::UnknownDomain("nowhere".into()))
    );
    assert_eq!(
        r(&w, &mut s, "plain").await,
        Err(RlqsError::NotRlqs("plain".into()))
    );
    assert_eq!(r(&w, &mut s, "q").await, Ok(()));
    // Later reports may leave the domain out, but not change it.
    assert_eq!(r(&w, &mut s, "").await, Ok(()));
    assert!(matches!(
        r(&w, &mut s, "plain").await,
        Err(RlqsError::DomainChanged { .. })
    ));
    let m = w.metrics.render();
    assert!(
        m.contains(r#"tollgate_rlqs_refused_total{reason="unknown_domain"} 1"#),
        "{m}"
    );
}

#[tokio::test]
async fn an_assignment_is_claimed_from_the_bucket_rls_decides_from() {
    let w = world();
    let mut s = Session::open(&w.rlqs, None).unwrap();
    // The bucket's first request, admitted by Envoy's no_assignment_behavior: charged. The
    // Envoy's demand is not known yet: it gets what the limit refills in an interval (8.3,
    // rounded up), not the floor (half of what the bucket can give: 54).
    let a = w
        .report(&mut s, vec![usage(&[("tenant", "a")], 1, 0, 0)])
        .await;
    assert_eq!(tokens(&a), [9]);
    assert!(matches!(
        a[0].assignment,
        Assignment::Tokens { ttl_s: 15, .. }
    ));
    // RLS sees the same bucket: 100 - 1 charged - 9 assigned, then its own take.
    assert_eq!(w.rls(&[("tenant", "a")]).await, (Code::Ok, 89));

    // 5 s later the Envoy used 6 of its 9 and was asked for 14 more than it had: 3 come
    // back, and its demand (20 in 5 s) sizes the next assignment: 20 × 1.25 = 25.
    w.clock.advance_ms(5_000);
    let a = w
        .report(&mut s, vec![usage(&[("tenant", "a")], 6, 14, 5_000)])
        .await;
    assert_eq!(tokens(&a), [25]);
    // 89 + 8.3 refilled + 3 returned (capped at 100) - 25 assigned - 1 RLS = 74.
    assert_eq!(w.rls(&[("tenant", "a")]).await, (Code::Ok, 74));
    let m = w.metrics.render();
    for line in [
        r#"tollgate_rlqs_tokens_total{event="assigned"} 34"#,
        r#"tollgate_rlqs_tokens_total{event="returned"} 3"#,
        r#"tollgate_rlqs_tokens_total{event="charged"} 1"#,
        r#"tollgate_rlqs_assignments_total{strategy="token_bucket"} 2"#,
        "tollgate_rlqs_streams 1",
        "tollgate_rlqs_buckets 1",
    ] {
        assert!(m.contains(line), "{line}\n{m}");
    }
}

#[tokio::test]
async fn a_fixed_window_keeps_what_its_ended_window_held() {
    let w = world();
    let mut s = Session::open(&w.rlqs, None).unwrap();
    let id = [("endpoint", "/a"), ("tenant", "fw")];
    // 20 s into a minute: the 60-a-minute window's refill over an interval; it ends in 40 s.
    assert_eq!(
        tokens(&w.report(&mut s, vec![usage(&id, 0, 0, 0)]).await),
        [5]
    );
    w.clock.advance_ms(45_000);
    w.report(&mut s, vec![usage(&id, 2, 0, 45_000)]).await;
    // The 3 unused were of the ended window: given back, they would count against this one.
    let m = w.metrics.render();
    assert!(!m.contains(r#"event="returned""#), "{m}");
    // Within a window they do come back.
    w.clock.advance_ms(5_000);
    let a = w.report(&mut s, vec![usage(&id, 0, 0, 5_000)]).await;
    assert_eq!(a.len(), 1);
    assert!(w.metrics.render().contains(r#"event="returned""#));
}

/// The fixed window under RLQS: a give-back never erases the debt others charged, the debt
/// is paid by the next window, and the window is never outlived. (The manual clock starts 20 s
/// into a minute: the 60-a-minute window ends in 40 s.)
#[tokio::test]
async fn a_fixed_window_keeps_its_debt_across_give_backs_and_windows() {
    let w = world();
    let id = [("endpoint", "/d"), ("tenant", "fw")];
    let (mut a, mut b) = (
        Session::open(&w.rlqs, None).unwrap(),
        Session::open(&w.rlqs, None).unwrap(),
    );
    // A holds 5 (a first claim: the window's refill over an interval); B's Envoy admitted 90
    // on its fallback before its first assignment: charged, the count 95 of 60.
    assert_eq!(
        tokens(&w.report(&mut a, vec![usage(&id, 0, 0, 0)]).await),
        [5]
    );
    let told = w.report(&mut b, vec![usage(&id, 90, 0, 0)]).await;
    assert_eq!(tokens(&told), [0], "{told:?}");
    // A used 1 of its 5: the 4 come off the count (95 → 91), which stays past the limit.
    // (Capped at the limit first, the count fell to 56 and A was granted 4 more: 99 admitted
    // in a window of 60.)
    w.clock.advance_ms(5_000);
    let told = w.report(&mut a, vec![usage(&id, 1, 0, 5_000)]).await;
    assert!(
        matches!(told[0].assignment, Assignment::DenyAll { .. }),
        "{told:?}"
    );
    let rls = [("tenant", "fw"), ("endpoint", "/d")];
    assert_eq!(
        w.rls(&rls).await.0,
        Code::OverLimit,
        "RLS sees the debt too"
    );
    // The next window starts 91 − 60 = 31 in: 29 can be had, not 60.
    w.clock.advance_ms(36_000);
    let told = w.report(&mut a, vec![usage(&id, 0, 0, 36_000)]).await;
    let got = tokens(&told)[0];
    assert!((1..=29).contains(&got), "{told:?}");
    let told = w.report(&mut b, vec![usage(&id, 0, 0, 41_000)]).await;
    assert!(tokens(&told)[0] <= 29 - got, "{told:?}");
}

#[tokio::test]
async fn a_fixed_window_assignment_never_outlives_its_window() {
    let w = world();
    let mut s = Session::open(&w.rlqs, None).unwrap();
    let id = [("endpoint", "/t"), ("tenant", "ttl")];
    let ttl = |a: &[Action]| match a[0].assignment {
        Assignment::Tokens { ttl_s, .. } | Assignment::DenyAll { ttl_s } => ttl_s,
        other => panic!("{other:?}"),
    };
    // 40 s left: the configured 15 s.
    assert_eq!(ttl(&w.report(&mut s, vec![usage(&id, 0, 0, 0)]).await), 15);
    // 9.5 s left: 9 s (Envoy reads whole seconds; rounded up it would outlive the window).
    w.clock.advance_ms(30_500);
    let told = w.report(&mut s, vec![usage(&id, 1, 0, 30_500)]).await;
    assert_eq!((tokens(&told)[0] > 0, ttl(&told)), (true, 9), "{told:?}");
    // 0.5 s left: no assignment of whole seconds can end with it. Denied for a second, and
    // the next window's assignment is pushed when it starts.
    w.clock.advance_ms(9_000);
    let told = w.report(&mut s, vec![usage(&id, 1, 0, 9_000)]).await;
    assert!(
        matches!(told[0].assignment, Assignment::DenyAll { ttl_s: 1 }),
        "{told:?}"
    );
    assert_eq!(s.next_wake_ms(), Some(w.clock.mono_ms() + 500));
    w.clock.advance_ms(500);
    let told = s.wake(&w.limiter).await;
    assert!(tokens(&told)[0] > 0, "{told:?}");
    assert_eq!(ttl(&told), 15);
}

#[tokio::test]
async fn a_store_error_with_fallback_error_waits_before_trying_again() {
    let clock = Clock::manual(1_700_000_000_000);
    let w = world_on(
        Store::Custom(Arc::new(Down)),
        FallbackMode::Error,
        clock.clone(),
        |_| {},
    );
    let mut s = Session::open(&w.rlqs, None).unwrap();
    assert!(
        w.report(&mut s, vec![usage(&[("tenant", "e")], 1, 0, 0)])
            .await
            .is_empty()
    );
    // Not at once (a failing store answers fast: that would spin), a quarter interval on.
    assert_eq!(s.next_wake_ms(), Some(clock.mono_ms() + 1_250));
    assert!(s.wake(&w.limiter).await.is_empty());
    assert_eq!(
        s.next_wake_ms(),
        Some(clock.mono_ms() + 1_250),
        "not due yet"
    );
}

#[tokio::test]
async fn a_reload_that_drops_rlqs_true_ends_the_stream() {
    let mut w = world();
    let mut s = Session::open(&w.rlqs, None).unwrap();
    w.report(&mut s, vec![usage(&[("tenant", "r")], 1, 0, 0)])
        .await;
    w.rules = rules(&RULES.replace("rlqs: true\n", ""));
    let e = s
        .report(
            &w.limiter,
            &w.rules,
            "",
            vec![usage(&[("tenant", "r")], 1, 0, 5_000)],
        )
        .await;
    assert_eq!(e, Err(RlqsError::NotRlqs("q".into())));
}

#[tokio::test]
async fn a_bucket_named_twice_in_one_report_is_settled_and_claimed_once() {
    let w = world();
    let mut s = Session::open(&w.rlqs, None).unwrap();
    let t = [("tenant", "twice")];
    let a = w
        .report(&mut s, vec![usage(&t, 1, 0, 0), usage(&t, 2, 0, 0)])
        .await;
    assert_eq!(tokens(&a), [9], "one assignment");
    // 3 charged once, 9 assigned once: 100 - 12, then RLS's own take.
    assert_eq!(w.rls(&t).await, (Code::Ok, 87));
}

#[tokio::test]
async fn admitted_beyond_the_assignment_is_charged_into_debt() {
    let w = world();
    let mut s = Session::open(&w.rlqs, None).unwrap();
    w.report(&mut s, vec![usage(&[("tenant", "d")], 0, 0, 0)])
        .await;
    // The Envoy ran on its fallback and admitted 150: the 50 it held and 100 more.
    w.clock.advance_ms(5_000);
    let a = w
        .report(&mut s, vec![usage(&[("tenant", "d")], 150, 0, 5_000)])
        .await;
    assert!(
        matches!(a[0].assignment, Assignment::DenyAll { ttl_s: 15 }),
        "{a:?}"
    );
    // The bucket is in debt: RLS is refused too.
    assert_eq!(w.rls(&[("tenant", "d")]).await.0, Code::OverLimit);
    // Refused, it is claimed again once tokens exist (not sooner than a quarter interval).
    let wake = s.next_wake_ms().unwrap();
    // 9 held, 150 admitted: 141 charged to the 99.3 there (91 + 8.3 refilled), the bucket
    // 41.7 deep in debt, so the wake is when 1 token exists again (42.7 tokens at 100 a
    // minute: 25.6 s, rounded up to the ms).
    assert_eq!(wake - w.clock.mono_ms(), 25_601);
    w.clock.advance_ms(wake - w.clock.mono_ms());
    assert_eq!(s.next_wake_ms(), Some(wake));
    let a = s.wake(&w.limiter).await;
    assert_eq!(a.len(), 1, "{a:?}");
    assert!(tokens(&a)[0] >= 1, "{a:?}");
    assert_eq!(s.next_wake_ms(), None);
}

#[tokio::test]
async fn two_envoys_share_by_demand_and_never_more_than_the_bucket() {
    let w = world();
    let mut a = Session::open(&w.rlqs, None).unwrap();
    let mut b = Session::open(&w.rlqs, None).unwrap();
    let t = [("tenant", "shared")];
    let mut given = 0;
    let mut used = 0;
    let (mut got_a, mut got_b) = (0, 0);
    let (mut held_a, mut held_b) = (0u64, 0u64);
    let mut first = true;
    // 12 intervals (1 minute): A offers 160 a minute, B 40 (twice the limit together); each
    // uses all it holds up to its offer.
    for round in 0..12 {
        let (ua, ub) = (held_a.min(67), held_b.min(17));
        let elapsed = if first { 0 } else { 5_000 };
        let ra = w
            .report(&mut a, vec![usage(&t, ua, 67 - ua, elapsed)])
            .await;
        let rb = w
            .report(&mut b, vec![usage(&t, ub, 17 - ub, elapsed)])
            .await;
        first = false;
        used += ua + ub;
        if round >= 2 {
            got_a += ua;
            got_b += ub;
        }
        held_a = tokens(&ra)[0];
        held_b = tokens(&rb)[0];
        given += held_a + held_b;
        w.clock.advance_ms(5_000);
    }
    // What the Envoys admitted is never more than the bucket gave: 100 at the start plus 100
    // a minute.
    assert!(used <= 200, "admitted {used}");
    assert!(
        used >= 120,
        "admitted {used} of the 100 + 100 the bucket held"
    );
    assert!(given >= used);
    // A's share follows its demand: it got well over B's.
    assert!(got_a >= 2 * got_b, "A {got_a}, B {got_b}");
}

#[tokio::test]
async fn no_rule_and_unlimited_allow_all_and_a_removed_rule_is_abandoned() {
    let mut w = world();
    let mut s = Session::open(&w.rlqs, None).unwrap();
    let a = w
        .report(
            &mut s,
            vec![
                usage(&[("nobody", "x")], 1, 0, 0),
                usage(&[("free", "x")], 1, 0, 0),
                usage(&[("endpoint", "/a"), ("tenant", "t")], 1, 0, 0),
                usage(&[("zero", "z")], 1, 0, 0),
            ],
        )
        .await;
    let got: Vec<&'static str> = a.iter().map(|a| a.assignment.strategy()).collect();
    assert_eq!(got, ["allow_all", "allow_all", "token_bucket", "deny_all"]);
    // The fixed window under tenant was found through the tree, whatever the map's order.
    assert_eq!(
        tokens(&a[2..3]),
        [5],
        "the 60-a-minute window's refill over an interval"
    );

    // A reload drops the endpoint rule: the bucket is abandoned once, then, as a new bucket,
    // it matches no rule.
    w.rules = rules(
        "domain: q\nrlqs: true\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 100}\n",
    );
    let id = [("endpoint", "/a"), ("tenant", "t")];
    let a = w.report(&mut s, vec![usage(&id, 3, 0, 5_000)]).await;
    assert_eq!(a[0].assignment, Assignment::Abandon);
    assert_eq!(s.buckets(), 3);
    let a = w.report(&mut s, vec![usage(&id, 1, 0, 0)]).await;
    assert!(matches!(a[0].assignment, Assignment::AllowAll { .. }));
}

#[tokio::test]
async fn an_idle_bucket_is_abandoned_and_its_tokens_come_back() {
    let w = world_with(|c| c.idle_ms = 10_000);
    let mut s = Session::open(&w.rlqs, None).unwrap();
    let t = [("tenant", "idle")];
    assert_eq!(
        tokens(&w.report(&mut s, vec![usage(&t, 0, 0, 0)]).await),
        [9]
    );
    w.clock.advance_ms(5_000);
    w.report(&mut s, vec![usage(&t, 0, 0, 5_000)]).await;
    w.clock.advance_ms(5_000);
    let a = w.report(&mut s, vec![usage(&t, 0, 0, 5_000)]).await;
    assert_eq!(a[0].assignment, Assignment::Abandon);
    assert_eq!(s.buckets(), 0);
    // Everything came back: the bucket is full again (less RLS's own take).
    assert_eq!(w.rls(&t).await, (Code::Ok, 99));
}

#[tokio::test]
async fn bucket_ids_past_the_cap_and_bad_ids_are_refused_and_counted() {
    let w = world_with(|c| c.max_buckets_per_stream = 50);
    let mut s = Session::open(&w.rlqs, None).unwrap();
    let many: Vec<Usage> = (0..10_000)
        .map(|i| usage(&[("tenant", &format!("t{i}"))], 1, 0, 0))
        .collect();
    let a = w.report(&mut s, many).await;
    // 50 held and assigned; the other 9,950 told DENY_ALL (never left to Envoy's
    // no_assignment_behavior, which may be ALLOW_ALL), and not held.
    assert_eq!(a.len(), 10_000);
    assert_eq!(tokens(&a).iter().filter(|&&t| t > 0).count(), 50);
    assert_eq!(
        a.iter()
            .filter(|a| matches!(a.assignment, Assignment::DenyAll { .. }))
            .count(),
        9_950
    );
    assert_eq!(s.buckets(), 50);
    let long = "x".repeat(5_000);
    let a = w
        .report(
            &mut s,
            vec![
                usage(&[], 1, 0, 0),
                usage(&[("tenant", long.as_str())], 1, 0, 0),
            ],
        )
        .await;
    // The empty id cannot be answered; the one past max_value_bytes is denied.
    assert_eq!(a.len(), 1, "{a:?}");
    assert!(matches!(a[0].assignment, Assignment::DenyAll { .. }));
    let m = w.metrics.render();
    for line in [
        r#"tollgate_rlqs_refused_total{reason="too_many_buckets"} 9950"#,
        r#"tollgate_rlqs_refused_total{reason="empty_bucket_id"} 1"#,
        r#"tollgate_rlqs_refused_total{reason="bucket_id_too_large"} 1"#,
    ] {
        assert!(m.contains(line), "{line}\n{m}");
    }
    // Streams are capped too, and a closed one frees its place and its buckets.
    let more: Vec<Session> = (0..3)
        .map(|_| Session::open(&w.rlqs, None).unwrap())
        .collect();
    assert!(matches!(
        Session::open(&w.rlqs, None),
        Err(RlqsError::TooManyStreams(4))
    ));
    drop(more);
    drop(s);
    let m = w.metrics.render();
    assert!(m.contains("tollgate_rlqs_buckets 0"), "{m}");
    assert!(m.contains("tollgate_rlqs_streams 0"), "{m}");
    assert!(Session::open(&w.rlqs, None).is_ok());
}

#[tokio::test]
async fn one_peer_cannot_take_every_stream() {
    let w = world_with(|c| c.max_streams_per_peer = 2);
    let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
    let held: Vec<Session> = (0..2)
        .map(|_| Session::open(&w.rlqs, Some(a)).unwrap())
        .collect();
    assert_eq!(
        Session::open(&w.rlqs, Some(a)).unwrap_err(),
        RlqsError::TooManyStreamsFromPeer { peer: a, max: 2 }
    );
    // Another peer still gets one; the total cap (4) still holds.
    let other: Vec<Session> = (0..2)
        .map(|_| Session::open(&w.rlqs, Some(b)).unwrap())
        .collect();
    assert!(matches!(
        Session::open(&w.rlqs, None),
        Err(RlqsError::TooManyStreams(4))
    ));
    drop(held);
    assert!(
        Session::open(&w.rlqs, Some(a)).is_ok(),
        "closed streams free the peer's places"
    );
    drop(other);
    assert!(w.rlqs.caps.peers_holding() <= 1);
}

#[tokio::test]
async fn bucket_ids_past_the_state_bytes_are_denied_and_freed_with_their_stream() {
    let one = tracked_bytes(&id(&[("tenant", "t0000")]));
    let w = world_with(|c| c.max_state_bytes = 10 * one);
    let mut s = Session::open(&w.rlqs, None).unwrap();
    let ids: Vec<Usage> = (0..30)
        .map(|i| usage(&[("tenant", &format!("t{i:04}"))], 1, 0, 0))
        .collect();
    let a = w.report(&mut s, ids).await;
    assert_eq!(s.buckets(), 10);
    assert_eq!(
        a.iter()
            .filter(|a| matches!(a.assignment, Assignment::DenyAll { .. }))
            .count(),
        20
    );
    assert!(
        w.metrics
            .render()
            .contains(r#"tollgate_rlqs_refused_total{reason="state_full"} 20"#)
    );
    // Another stream cannot hold any either, until the first goes.
    let mut t = Session::open(&w.rlqs, None).unwrap();
    w.report(&mut t, vec![usage(&[("tenant", "t9999")], 1, 0, 0)])
        .await;
    assert_eq!(t.buckets(), 0);
    drop(s);
    assert_eq!(w.rlqs.caps.state_bytes(), 0);
    w.report(&mut t, vec![usage(&[("tenant", "t9999")], 1, 0, 0)])
        .await;
    assert_eq!(t.buckets(), 1);
}

#[tokio::test]
async fn closing_expires_every_assignment_now() {
    let w = world();
    let mut s = Session::open(&w.rlqs, None).unwrap();
    let sent = w
        .report(
            &mut s,
            vec![
                usage(&[("tenant", "c")], 1, 0, 0),
                usage(&[("free", "c")], 1, 0, 0),
            ],
        )
        .await;
    let mut closing = s.closing();
    closing.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(closing.len(), 2);
    assert!(closing.iter().all(|a| a.assignment.strategy() == "expire"));
    // The same token bucket (so Envoy carries it into its fallback), expiring now.
    let Some(&Assignment::Tokens { tokens, .. }) = sent
        .iter()
        .map(|a| &a.assignment)
        .find(|a| a.strategy() == "token_bucket")
    else {
        panic!("{sent:?}");
    };
    assert!(
        closing
            .iter()
            .any(|a| a.assignment == Assignment::Tokens { tokens, ttl_s: 0 })
    );
}

#[tokio::test]
async fn with_the_store_down_assignments_come_from_the_fallback() {
    let down = || Store::Custom(Arc::new(Down));
    let clock = Clock::manual(1_700_000_000_000);
    // `local`: claimed from this replica's share of the quota (100 ÷ 2 replicas), as from
    // the store: a first claim of 9 (the refill over an interval), then, at a demand of 40 a
    // second, all the share has left.
    let w = world_on(down(), FallbackMode::Local, clock.clone(), |_| {});
    let mut s = Session::open(&w.rlqs, None).unwrap();
    let t = [("tenant", "f")];
    assert_eq!(
        tokens(&w.report(&mut s, vec![usage(&t, 0, 0, 0)]).await),
        [9]
    );
    clock.advance_ms(5_000);
    let rest = tokens(&w.report(&mut s, vec![usage(&t, 9, 191, 5_000)]).await)[0];
    assert!((41..=46).contains(&rest), "{rest}");
    // The share is spent by what it assigned: a second Envoy is refused, not given a new share.
    let mut s2 = Session::open(&w.rlqs, None).unwrap();
    let a = w.report(&mut s2, vec![usage(&t, 0, 0, 0)]).await;
    assert_eq!(a[0].assignment.strategy(), "deny_all");
    // `closed`: nothing; `open`: all it asks; `error`: no assignment (Envoy's own behaviour).
    for (mode, want) in [
        (FallbackMode::Closed, Some("deny_all")),
        (FallbackMode::Open, Some("token_bucket")),
        (FallbackMode::Error, None),
    ] {
        let w = world_on(down(), mode, clock.clone(), |_| {});
        let mut s = Session::open(&w.rlqs, None).unwrap();
        let a = w.report(&mut s, vec![usage(&t, 0, 0, 0)]).await;
        assert_eq!(a.first().map(|a| a.assignment.strategy()), want, "{mode:?}");
    }
    // A fixed window on the fallback: the fallback's `reset_ms` is not the store's window
    // (`open` answers with the breaker's probe interval, 500 ms), so the assignment is not
    // cut to a window end it does not know (it was DENY_ALL, "in the window's last second").
    for mode in [FallbackMode::Open, FallbackMode::Local] {
        let w = world_on(down(), mode, clock.clone(), |_| {});
        let mut s = Session::open(&w.rlqs, None).unwrap();
        let fw = [("endpoint", "/f"), ("tenant", "f")];
        let a = w.report(&mut s, vec![usage(&fw, 0, 0, 0)]).await;
        assert!(
            matches!(a[0].assignment, Assignment::Tokens { ttl_s: 15, .. }),
            "{mode:?}: {a:?}"
        );
    }
}

#[test]
fn an_rlqs_domain_refuses_at_load_what_rlqs_cannot_serve() {
    let refused = |limit: &str| {
        let text = format!("domain: r\nrlqs: true\ndescriptors:\n  - key: k\n    {limit}\n");
        match load_sources(&[(PathBuf::from("r.yaml"), text)], LoadOptions::default()) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    };
    for (limit, why) in [
        (
            "rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window}",
            "algorithm sliding_window cannot be claimed in advance",
        ),
        (
            "rate_limit: {unit: minute, requests_per_unit: 8, shards: 2}",
            "shards split the bucket",
        ),
        (
            "rate_limit: {unit: minute, requests_per_unit: 5, overdraft: true}",
            "overdraft",
        ),
        (
            "rate_limits: [{unit: second, requests_per_unit: 50, burst: 500}, {unit: hour, requests_per_unit: 9}]",
            "has 2 counted limits",
        ),
        (
            "rate_limit: {unit: second, requests_per_unit: 100}",
            "refills 500 tokens per report interval (rlqs_report_interval_ms 5000) but holds only burst 100",
        ),
        (
            "rate_limit: {unit: second, requests_per_unit: 10, algorithm: fixed_window}",
            "its window (1000 ms) is shorter than the report interval (rlqs_report_interval_ms 5000)",
        ),
    ] {
        let e = refused(limit);
        assert!(e.contains(why), "{limit}: {e}");
        assert!(
            e.contains("r.yaml:4:") || e.contains("r.yaml:5:"),
            "{limit}: {e}"
        );
    }
    assert_eq!(
        refused("rate_limit: {unit: second, requests_per_unit: 100, burst: 500}"),
        ""
    );
    assert!(
        refused("rate_limit: {unit: minute, requests_per_unit: 1}\nrlqs_typo: 1")
            .contains("rlqs_typo")
    );
}
