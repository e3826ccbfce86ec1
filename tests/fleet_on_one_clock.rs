//! Three replicas (limiters on one shared store) on one manual clock, with no real waiting:
//! the store is a [`Backend`] of this test (the memory store's math, a membership set, and a
//! switch that takes it down), the clock moves only when the test says, and the replicas'
//! membership heartbeats, housekeeping and lease claims run as tasks on that clock.
//!
//! 1. Leasing: a burst through all three admits at most the limit, in leases.
//! 2. Expiry: after a burst that leaves tokens in the leases, the leases end at their TTL and
//!    the replicas' housekeeping gives the unspent tokens back; the bucket holds exactly what
//!    was not admitted, plus the refill of the time that passed.
//! 3. Outage: each replica admits exactly its share (quota ÷ the 3 live replicas its
//!    heartbeats counted) from its local fallback.
//! 4. Recovery: the store decides again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tollgate::clock::Clock;
use tollgate::fleet::Replicas;
use tollgate::fleet::{self, MembershipConfig};
use tollgate::limiter::{Code, HotKeyConfig, Limiter, LimiterConfig, Request, RequestDescriptor};
use tollgate::quota::{Op, Outcome};
use tollgate::rules::LoadOptions;
use tollgate::rules::RuleSet;
use tollgate::rules::load::load_sources;
use tollgate::store::{Backend, MemoryStore, Store, StoreError, StoreErrorKind};
use tollgate::telemetry::Metrics;

/// 60 a minute (one token a second), leased 10 at a time for 1 s.
const RULES: &str = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 60, lease: {max_batch: 10, ttl_ms: 1000}}\n";
const LIMIT: u64 = 60;
const REPLICAS: usize = 3;
const HEARTBEAT: Duration = Duration::from_millis(1_000);

/// The shared store: the memory store's bucket math, a membership set on the same clock, and
/// an outage switch (every call fails as a lost connection while it is down).
#[derive(Debug)]
struct SwitchedStore {
    buckets: MemoryStore,
    clock: Clock,
    /// Membership key → replica → expiry (monotonic ms).
    members: Mutex<HashMap<String, HashMap<String, u64>>>,
    down: AtomicBool,
}

impl SwitchedStore {
    fn fail(&self) -> Option<StoreError> {
        self.down
            .load(Ordering::SeqCst)
            .then(|| StoreError::new(StoreErrorKind::Connection, "switched off by the test"))
    }
}

impl Backend for SwitchedStore {
    fn apply_each<'a>(&'a self, ops: &'a [Op]) -> BoxFuture<'a, Vec<Result<Outcome, StoreError>>> {
        Box::pin(async move {
            ops.iter()
                .map(|op| match self.fail() {
                    Some(e) => Err(e),
                    None => Ok(self.buckets.apply(op)),
                })
                .collect()
        })
    }

    fn heartbeat<'a>(
        &'a self,
        key: &'a str,
        replica: &'a str,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            if let Some(e) = self.fail() {
                return Err(e);
            }
            let now = self.clock.mono_ms();
            let mut members = self.members.lock().unwrap();
            let set = members.entry(key.to_string()).or_default();
            set.retain(|_, expiry| *expiry > now);
            set.insert(replica.to_string(), now + ttl.as_millis() as u64);
            Ok(set.len() as u64)
        })
    }

    fn leave<'a>(
        &'a self,
        key: &'a str,
        replica: &'a str,
    ) -> BoxFuture<'a, Result<u64, StoreError>> {
        Box::pin(async move {
            let mut members = self.members.lock().unwrap();
            let set = members.entry(key.to_string()).or_default();
            set.remove(replica);
            Ok(set.len() as u64)
        })
    }

    fn name(&self) -> &'static str {
        "switched"
    }
}

fn rules() -> RuleSet {
    load_sources(
        &[("edge.yaml".into(), RULES.to_string())],
        LoadOptions::default(),
    )
    .expect("rules")
}

/// One request of one token for tenant `t`; `cost` 0 only looks at the bucket.
fn request(cost: u64) -> Request<'static> {
    Request {
        domain: "edge",
        descriptors: vec![RequestDescriptor {
            entries: vec![("tenant", "t")],
            hits_addend: Some(cost),
            limit_override: None,
            refund: false,
        }],
        hits_addend: 0,
    }
}

/// Lets the tasks on the runtime (claims sent ahead, heartbeats woken by the clock) run.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// `rounds` requests on each replica, taken in turn; how many each admitted.
async fn burst(replicas: &[Replica], rules: &RuleSet, rounds: usize) -> Vec<u64> {
    let mut admitted = vec![0; replicas.len()];
    for _ in 0..rounds {
        for (i, r) in replicas.iter().enumerate() {
            let d = r.limiter.decide(rules, &request(1)).await.expect("decided");
            if d.statuses[0].code == Code::Ok {
                admitted[i] += 1;
            }
            settle().await;
        }
    }
    admitted
}

struct Replica {
    limiter: Arc<Limiter>,
    replicas: Arc<Replicas>,
}

#[tokio::test]
async fn three_replicas_on_one_manual_clock_through_leases_expiry_and_an_outage() {
    let clock = Clock::manual(1_700_000_000_000);
    let backend = Arc::new(SwitchedStore {
        buckets: MemoryStore::new(clock.clone()),
        clock: clock.clone(),
        members: Mutex::new(HashMap::new()),
        down: AtomicBool::new(false),
    });
    let store = Arc::new(Store::Custom(backend.clone()));
    let rules = rules();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut fleet = Vec::new();
    for i in 0..REPLICAS {
        let replicas = Arc::new(Replicas::new(0, 1));
        let limiter = Arc::new(Limiter::on_shared_store(
            store.clone(),
            LimiterConfig {
                key_prefix: "fleet:".into(),
                replicas: replicas.clone(),
                hot: HotKeyConfig {
                    shared_store: true,
                    over_limit_cache_max_keys: 1_000,
                    claim_wait_ms: 20,
                    ..HotKeyConfig::default()
                },
                ..LimiterConfig::new(clock.clone())
            },
            Arc::new(Metrics::new()),
        ));
        let (l, r, c) = (limiter.clone(), replicas.clone(), clock.clone());
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            fleet::membership(
                l.store(),
                &r,
                &Metrics::new(),
                MembershipConfig {
                    key: "fleet:{members}".into(),
                    replica: format!("replica-{i}"),
                    interval: HEARTBEAT,
                },
                &c,
                async move {
                    let _ = stopped.wait_for(|s| *s).await;
                },
            )
            .await
        });
        // Housekeeping (sweeps, and giving ended leases' tokens back) on the same clock.
        let (l, mut told) = (limiter.clone(), stop.subscribe());
        clock.spawn(async move {
            l.housekeeping(async move {
                let _ = told.wait_for(|s| *s).await;
            })
            .await
        });
        fleet.push(Replica { limiter, replicas });
    }
    // The first heartbeats go out at once (each sees the replicas before it); by the second,
    // one interval later, every replica counts all three.
    settle().await;
    assert_eq!(fleet[0].replicas.count(), 1);
    clock.advance_ms(HEARTBEAT.as_millis() as u64);
    settle().await;
    assert!(
        fleet.iter().all(|r| r.replicas.count() == REPLICAS as u64),
        "the second heartbeats did not count 3 replicas"
    );
    // A limiter with no lease and no cache reads the shared bucket (a check takes nothing).
    let probe = Limiter::on_shared_store(
        store.clone(),
        LimiterConfig {
            key_prefix: "fleet:".into(),
            ..LimiterConfig::new(clock.clone())
        },
        Arc::new(Metrics::new()),
    );
    let balance = || async {
        u64::from(probe.decide(&rules, &request(0)).await.unwrap().statuses[0].remaining)
    };

    // 1. A burst at one instant: 40 requests on each replica, all for one tenant.
    let first: u64 = burst(&fleet, &rules, 40).await.iter().sum();
    println!("burst at one instant: {first} of {LIMIT} admitted");
    assert!(
        (LIMIT - 3 * 10..=LIMIT).contains(&first),
        "admitted {first} of a limit of {LIMIT} (at most 3 leases of 10 may be left unspent)"
    );

    // 2. A minute later (the bucket full again, the burst's leases and cache entries ended), a
    //    small burst leaves tokens in the leases: the shared bucket has paid for more than was
    //    admitted. At the leases' TTL each replica's housekeeping, woken by the clock, gives
    //    the unspent tokens back: the bucket then holds exactly what was not admitted, plus one
    //    second's refill (1 token).
    for _ in 0..60 {
        clock.advance_ms(1_000);
        settle().await;
    }
    let small: u64 = burst(&fleet, &rules, 5).await.iter().sum();
    assert_eq!(small, 15, "a burst well under the limit is admitted whole");
    let held = LIMIT - small - balance().await;
    println!("small burst: {small} admitted, {held} tokens left in leases");
    assert!(
        held > 0,
        "the leases hold no unspent tokens: the give-back below would prove nothing"
    );
    clock.advance_ms(1_001);
    settle().await;
    assert_eq!(
        balance().await,
        (LIMIT - small + 1).min(LIMIT),
        "the unspent leased tokens went back to the bucket"
    );

    // 3. A minute later (the bucket full, every cache entry ended) the store goes down: each
    //    replica admits its share, 60 ÷ 3 live replicas, from its local fallback.
    for _ in 0..60 {
        clock.advance_ms(1_000);
        settle().await;
    }
    assert!(fleet.iter().all(|r| r.replicas.count() == REPLICAS as u64));
    backend.down.store(true, Ordering::SeqCst);
    let during = burst(&fleet, &rules, 30).await;
    assert_eq!(
        during,
        vec![LIMIT / REPLICAS as u64; REPLICAS],
        "local shares"
    );
    // The heartbeats fail meanwhile; the last count stays.
    clock.advance_ms(2_000);
    settle().await;
    assert!(fleet.iter().all(|r| r.replicas.count() == REPLICAS as u64));

    // 4. The store is back: the bucket (full again after a minute) decides.
    backend.down.store(false, Ordering::SeqCst);
    for _ in 0..60 {
        clock.advance_ms(1_000);
        settle().await;
    }
    let after: u64 = burst(&fleet, &rules, 40).await.iter().sum();
    assert!(
        (LIMIT - 3 * 10..=LIMIT).contains(&after),
        "admitted {after} after the outage"
    );
    stop.send(true).unwrap();
    settle().await;
}
