//! The hot-key state's housekeeping: ended cache entries and idle leases dropped, and the
//! unspent tokens of ended leases (or, at shutdown, of every lease) given back to their
//! buckets.

use std::sync::Arc;

use super::HotKeys;
use crate::quota::Op;
use crate::store::Store;

impl HotKeys {
    /// Housekeeping: ended cache entries and idle leases go; expired leased tokens are counted.
    pub(in crate::limiter) fn sweep(&self) {
        let now = self.clock.mono_ms();
        if let Some(cache) = &self.cache {
            cache.sweep(now);
        }
        if let Some(leases) = &self.leases {
            for (class, n) in leases.sweep(now) {
                self.count_token_event(&class, "expired", n);
            }
        }
    }

    /// Graceful shutdown: gives every lease's unspent tokens back to its bucket. Returns how
    /// many tokens were given back.
    pub(in crate::limiter) async fn return_leases(&self, store: &Store) -> u64 {
        let Some(leases) = &self.leases else {
            return 0;
        };
        let back = leases.drain(self.clock.mono_ms());
        self.give_back(store, back).await
    }

    /// Housekeeping: sends the give-backs of the leases that ended since the last pass.
    /// Returns how many tokens were given back.
    pub(in crate::limiter) async fn return_ended_leases(&self, store: &Store) -> u64 {
        let Some(leases) = &self.leases else {
            return 0;
        };
        let back = leases.give_backs();
        self.give_back(store, back).await
    }

    async fn give_back(&self, store: &Store, back: Vec<(Op, Arc<str>)>) -> u64 {
        if back.is_empty() {
            return 0;
        }
        let ops: Vec<Op> = back.iter().map(|(op, _)| op.clone()).collect();
        let (mut returned, mut lost) = (0, 0);
        let mut first_error = None;
        for (result, (op, class)) in store.apply_each(&ops).await.into_iter().zip(&back) {
            match result {
                Ok(_) => {
                    returned += op.cost;
                    self.count_token_event(class, "returned", op.cost);
                    // The bucket has tokens again: this replica's cached refusal of the key
                    // (from before the give-back) would refuse them until the refill time.
                    if let Some(cache) = &self.cache {
                        cache.forget(&op.key);
                    }
                }
                Err(e) => {
                    lost += op.cost;
                    self.count_token_event(class, "expired", op.cost);
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            // One line per pass, however many leases ended (a store outage fails them all).
            tracing::warn!(error = %e, tokens = lost, "could not give leased tokens back; they are lost to the bucket");
        }
        returned
    }
}
