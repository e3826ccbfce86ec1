//! One traffic stream of a scenario ([`Stream`]): when its next request arrives (Poisson or
//! even gaps) and the pickers its values are drawn with (Zipf, uniform, round robin). The
//! run's state holds one per `traffic:` entry; `arrivals.rs` draws from it.

use std::sync::Arc;

use rand::rngs::SmallRng;
use rand_distr::{Distribution, Exp, Zipf};

use super::scenario::{Arrivals, Traffic};

/// One traffic stream's state: its next arrival and its pickers.
pub(super) struct Stream {
    pub(super) traffic: Traffic,
    pub(super) domain: Arc<str>,
    pub(super) keys: Vec<Arc<str>>,
    pub(super) next_us: f64,
    /// When it stops (µs; infinite: at the run's end).
    pub(super) to_us: f64,
    /// The region whose replicas it reaches (0 without regions).
    pub(super) region: usize,
    /// Exponential gaps (Poisson arrivals), or `None` for even ones.
    pub(super) gap: Option<Exp<f64>>,
    pub(super) zipf: Option<Zipf<f64>>,
    pub(super) round_robin: usize,
}

impl Stream {
    /// The stream of `t`, its first arrival drawn from `rng`; `region`: its region's index.
    pub(super) fn new(t: &Traffic, region: usize, rng: &mut SmallRng) -> Stream {
        // The scenario check keeps rate_per_s positive and finite, so `Exp::new` takes it.
        let gap = match t.arrivals {
            Arrivals::Poisson => Exp::new(t.rate_per_s / 1e6).ok(),
            Arrivals::Even => None,
        };
        let first = match &gap {
            Some(g) => g.sample(rng),
            None => 1e6 / t.rate_per_s / 2.0,
        };
        Stream {
            domain: t.domain.as_str().into(),
            keys: t.entries.iter().map(|(k, _)| k.as_str().into()).collect(),
            next_us: t.from_s * 1e6 + first,
            to_us: t.to_s.map_or(f64::INFINITY, |s| s * 1e6),
            region,
            gap,
            zipf: Zipf::new(t.tenants as f64, t.zipf_exponent).ok(),
            round_robin: 0,
            traffic: t.clone(),
        }
    }

    /// Moves to the next arrival, `gap_us` later: none once the stream has stopped.
    pub(super) fn advance(&mut self, gap_us: f64) {
        self.next_us += gap_us;
        if self.next_us >= self.to_us {
            self.next_us = f64::INFINITY;
        }
    }
}
