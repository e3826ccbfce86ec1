//! The traffic: each stream's next arrival, and what one arrival does.
//!
//! Flow of an arrival ([`Sim::arrive`]): its values from the stream's templates (`{zipf}`,
//! `{uniform}`) → its replica from the stream's routing → the ideal's answer at once (one
//! exact bucket per limit, counted per bucket) → the replica's `Limiter::decide_within`, with
//! the budget `serve` gives a request carrying Envoy's timeout (the scenario's `envoy:` less
//! `decision_margin_ms`), polled once: most end there (a lease or the over-limit cache
//! answered), the rest become tasks that end when their decision does (past the budget, by
//! the fallback), or when Envoy's timeout passes first →
//! [`record`] counts the decision as Envoy applies it.

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use rand::Rng;
use rand_distr::Distribution;

use super::report::{Counts, Ended};
use super::scenario::{Pick, Routing};
use super::state::Sim;
use crate::limiter::{Code, Decision, Request, RequestDescriptor};
use crate::store::StoreError;

/// A replica's decision in progress.
type Deciding = Pin<Box<dyn Future<Output = Result<Decision, StoreError>> + Send>>;

impl Sim<'_> {
    /// The replica for a request of `stream` whose values hash to `hash`.
    fn route(&mut self, stream: usize, hash: u64) -> usize {
        let n = self.regions[self.streams[stream].region].fleet.len();
        match self.streams[stream].traffic.routing {
            Routing::Even => {
                let s = &mut self.streams[stream];
                s.round_robin = (s.round_robin + 1) % n;
                s.round_robin
            }
            Routing::Sticky => (hash % n as u64) as usize,
            Routing::Random => self.rng.random_range(0..n),
        }
    }

    /// Issues the next arrival of `stream` (due now): its ideal answer at once, its fleet
    /// decision started (and finished, if it needs no store call).
    pub(super) fn arrive(&mut self, stream: usize, cx: &mut std::task::Context<'_>) {
        let now = self.clock.mono_us();
        let second = now / 1_000_000;
        let (domain, keys, cost) = {
            let s = &self.streams[stream];
            (s.domain.clone(), s.keys.clone(), s.traffic.cost)
        };
        let mut values = Vec::with_capacity(keys.len());
        let mut hasher = std::hash::DefaultHasher::new();
        for i in 0..keys.len() {
            let template = &self.streams[stream].traffic.entries[i].1;
            let index = match template.pick() {
                None => 0,
                Some(Pick::Uniform) => self
                    .rng
                    .random_range(0..self.streams[stream].traffic.tenants),
                Some(Pick::Zipf) => match &self.streams[stream].zipf {
                    Some(z) => (z.sample(&mut self.rng) as u64).saturating_sub(1),
                    None => 0,
                },
            };
            template.render(index, &mut self.value_buf);
            self.value_buf.hash(&mut hasher);
            values.push(self.value_buf.clone());
        }
        let replica = self.route(stream, hasher.finish());
        let request = one_descriptor(&domain, &keys, &values, cost);

        // The ideal: one exact bucket per limit, now. A descriptor is admitted when all its
        // limits are (every one is charged, as the fleet charges them), and each of its
        // buckets counts the descriptor's answer, as the fleet's side counts its status.
        // With regions, a global limit is one bucket across them and any other limit one per
        // region (each region enforces it alone), counted under the region's name.
        let region = self.streams[stream].region;
        let region_name = self.scenario.regions.as_ref().map(|r| &r.names[region]);
        let ideal = self.ideal.ideal_ops(&self.rules, &request);
        // Held by the decision until it ends (sized once: a first push would reserve four).
        let mut buckets = Vec::with_capacity(ideal.len());
        {
            let allowed: Vec<bool> = ideal
                .iter()
                .map(|i| match (i.global, region_name) {
                    (false, Some(_)) => self.regions[region].ideal_store.apply(&i.op).allowed,
                    _ => self.ideal_store.apply(&i.op).allowed,
                })
                .collect();
            let descriptor_ok =
                |d: usize| ideal.iter().zip(&allowed).all(|(i, ok)| i.desc != d || *ok);
            let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
            for i in &ideal {
                let op = &i.op;
                let known = counts.buckets.len();
                let b = match (i.global, region_name) {
                    (false, Some(name)) => {
                        counts.bucket(&format!("{name}/{}", op.key), &i.class, &op.kind)
                    }
                    _ => counts.bucket(&op.key, &i.class, &op.kind),
                };
                if b == known {
                    self.class_calls.name(&op.key, counts.buckets[b].class);
                }
                let bucket = &mut counts.buckets[b];
                let ok = descriptor_ok(i.desc);
                bucket.offered += op.cost;
                bucket.ideal += if ok { op.cost } else { 0 };
                let window = bucket.windows.arrived(now, op.cost, ok);
                buckets.push((b, op.cost, i.desc, window));
            }
            counts.arrived(second, region, allowed.iter().all(|&ok| ok));
        }

        let limiter = self.regions[region].fleet[replica].limiter.clone();
        let rules = self.rules.clone();
        let budget = self.decision_budget;
        let mut decide: Deciding = Box::pin(async move {
            let request = one_descriptor(&domain, &keys, &values, cost);
            limiter.decide_within(&rules, &request, budget).await
        });
        let envoy = self.scenario.envoy;
        // Most decisions end here (a lease or the over-limit cache answered): no task.
        if let Poll::Ready(decision) = decide.as_mut().poll(cx) {
            let deny = envoy.failure_mode_deny;
            let at = (second, region);
            record(&self.counts, at, 0, Some(&decision), deny, &buckets);
            self.activity.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // The rest wait on the store, and Envoy waits for them until its timeout: then it
        // resets the call, tonic drops the decision (its store call, already sent, still runs
        // on the node) and Envoy's failure mode decides the request.
        let envoy_gives_up = envoy
            .timeout_ms
            .map(|ms| self.clock.sleep(Duration::from_millis(ms)));
        let counts = self.counts.clone();
        let clock = self.clock.clone();
        let activity = self.activity.clone();
        tokio::spawn(async move {
            let decision = match envoy_gives_up {
                Some(sleep) => tokio::select! {
                    biased;
                    d = &mut decide => Some(d),
                    () = sleep => None,
                },
                None => Some(decide.await),
            };
            let latency = clock.mono_us() - now;
            let deny = envoy.failure_mode_deny;
            record(
                &counts,
                (second, region),
                latency,
                decision.as_ref(),
                deny,
                &buckets,
            );
            activity.fetch_add(1, Ordering::Relaxed);
        });
    }
}

/// A request of one descriptor: `keys` with `values`, `cost` hits.
fn one_descriptor<'a>(
    domain: &'a str,
    keys: &'a [Arc<str>],
    values: &'a [String],
    cost: u64,
) -> Request<'a> {
    Request {
        domain,
        descriptors: vec![RequestDescriptor {
            entries: keys
                .iter()
                .map(|k| &**k)
                .zip(values.iter().map(String::as_str))
                .collect(),
            hits_addend: None,
            limit_override: None,
            refund: false,
        }],
        hits_addend: cost,
    }
}

/// Counts one ended decision of a request that arrived at `(second, region)`, as Envoy
/// applies it: `None` when Envoy gave up waiting for it; that and an error are the failure
/// mode's (`deny`: refused, else admitted), counted apart.
fn record(
    counts: &Mutex<Counts>,
    (second, region): (u64, usize),
    latency_us: u64,
    decision: Option<&Result<Decision, StoreError>>,
    deny: bool,
    buckets: &[(usize, u64, usize, u64)],
) {
    let mut counts = counts.lock().unwrap_or_else(|p| p.into_inner());
    let ended = match decision {
        Some(Ok(d)) => Ended {
            admitted: d.overall == Code::Ok,
            fallback: d.from_fallback,
            ..Ended::default()
        },
        // The fallback's `error` mode: tollgate answered UNAVAILABLE.
        Some(Err(_)) => Ended {
            admitted: !deny,
            error: true,
            ..Ended::default()
        },
        None => Ended {
            admitted: !deny,
            envoy_gave_up: true,
            ..Ended::default()
        },
    };
    let per_bucket: Vec<(usize, u64, bool, u64)> = buckets
        .iter()
        .map(|&(b, hits, desc, window)| {
            let ok = match decision {
                Some(Ok(d)) => d.statuses.get(desc).is_some_and(|s| s.code == Code::Ok),
                _ => !deny,
            };
            (b, hits, ok, window)
        })
        .collect();
    counts.decided((second, region), latency_us, &ended, &per_bucket);
}
