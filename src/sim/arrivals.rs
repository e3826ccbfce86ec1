//! The traffic: each stream's next arrival, and what one arrival does.
//!
//! Flow of an arrival ([`Sim::arrive`]): its values from the stream's templates (`{zipf}`,
//! `{uniform}`) → its replica from the stream's routing → the ideal's answer at once (one
//! exact bucket per limit, counted per bucket) → the replica's `Limiter::decide`, polled once:
//! most end there (a lease or the over-limit cache answered), the rest become tasks that end
//! when their store call does → [`record`] counts the decision.

use std::future::Future;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use rand::Rng;
use rand_distr::Distribution;

use super::report::Counts;
use super::scenario::{Pick, Routing};
use super::state::Sim;
use crate::limiter::{Code, Decision, Request, RequestDescriptor};
use crate::store::StoreError;

/// A decision in progress, and what to count when it ends.
type Pending = Pin<Box<dyn Future<Output = ()> + Send>>;

impl Sim<'_> {
    /// The replica for a request of `stream` whose values hash to `hash`.
    fn route(&mut self, stream: usize, hash: u64) -> usize {
        let n = self.fleet.len();
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
        let ideal = self.ideal.ideal_ops(&self.rules, &request);
        // Held by the decision until it ends (sized once: a first push would reserve four).
        let mut buckets = Vec::with_capacity(ideal.len());
        {
            let allowed: Vec<bool> = ideal
                .iter()
                .map(|(_, _, op)| self.ideal_store.apply(op).allowed)
                .collect();
            let descriptor_ok = |d: usize| {
                ideal
                    .iter()
                    .zip(&allowed)
                    .all(|((_, desc, _), ok)| *desc != d || *ok)
            };
            let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
            for (class, desc, op) in &ideal {
                let known = counts.buckets.len();
                let b = counts.bucket(&op.key, class, &op.kind);
                if b == known {
                    self.class_calls.name(&op.key, counts.buckets[b].class);
                }
                let bucket = &mut counts.buckets[b];
                let ok = descriptor_ok(*desc);
                bucket.offered += op.cost;
                bucket.ideal += if ok { op.cost } else { 0 };
                let window = bucket.windows.arrived(now, op.cost, ok);
                buckets.push((b, op.cost, *desc, window));
            }
            counts.arrived(second, allowed.iter().all(|&ok| ok));
        }

        let limiter = self.fleet[replica].limiter.clone();
        let rules = self.rules.clone();
        let counts = self.counts.clone();
        let clock = self.clock.clone();
        let activity = self.activity.clone();
        let mut pending: Pending = Box::pin(async move {
            let request = one_descriptor(&domain, &keys, &values, cost);
            let decision = limiter.decide(&rules, &request).await;
            let latency = clock.mono_us() - now;
            record(&counts, second, latency, &decision, &buckets);
            activity.fetch_add(1, Ordering::Relaxed);
        });
        // Most decisions end here (a lease or the over-limit cache answered): no task.
        if pending.as_mut().poll(cx).is_pending() {
            tokio::spawn(pending);
        }
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
        }],
        hits_addend: cost,
    }
}

/// Counts one ended decision.
fn record(
    counts: &Mutex<Counts>,
    second: u64,
    latency_us: u64,
    decision: &Result<Decision, StoreError>,
    buckets: &[(usize, u64, usize, u64)],
) {
    let mut counts = counts.lock().unwrap_or_else(|p| p.into_inner());
    let (admitted, fallback, error) = match decision {
        Ok(d) => (d.overall == Code::Ok, d.from_fallback, false),
        // The `error` mode: the request failed (Envoy's failure mode decides), counted apart.
        Err(_) => (false, false, true),
    };
    let per_bucket: Vec<(usize, u64, bool, u64)> = buckets
        .iter()
        .map(|&(b, hits, desc, window)| {
            let ok = match decision {
                Ok(d) => d.statuses.get(desc).is_some_and(|s| s.code == Code::Ok),
                Err(_) => false,
            };
            (b, hits, ok, window)
        })
        .collect();
    counts.decided(second, latency_us, admitted, fallback, error, &per_bucket);
}
