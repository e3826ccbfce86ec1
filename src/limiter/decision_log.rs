//! The decision log: one `debug` line per decision, so an operator who turns `log_level` to
//! `debug` sees why each request was admitted or refused, without a metric label per tenant.
//!
//! A decision flows here after its statuses are folded (`Limiter::decide_within`): when
//! tollgate logs at `debug` (one level check per decision otherwise, nothing built) and the
//! rate allows (`decision_log_per_s` lines a second; the ones past it are counted and the
//! next line says how many), one line names the domain, the overall code and, per limit
//! counted, its descriptor's entries, the limit's class and rule (file:line), the outcome and
//! what answered it ([`Source`]: the store, this replica's lease or over-limit cache, or the
//! fallback and the store's failure: `fallback/deadline`, `fallback/circuit_open`, …).
//! Descriptor values are tenant identities: `decision_log_values: false` writes each as a
//! short hash instead (the same value, the same hash).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use super::plan::Plan;
use super::{Code, Decision, Request, Source};
use crate::quota::Outcome;

/// The log's settings and its rate: at most `per_s` lines in each second of the monotonic
/// clock.
#[derive(Debug)]
pub struct DecisionLog {
    per_s: u64,
    values: bool,
    /// The second (monotonic ms / 1000) the count is of, and the lines written in it.
    second: AtomicU64,
    written: AtomicU64,
    /// Decisions not logged since the last line (the rate was spent).
    skipped: AtomicU64,
}

impl DecisionLog {
    pub fn new(per_s: u64, values: bool) -> DecisionLog {
        DecisionLog {
            per_s,
            values,
            second: AtomicU64::new(0),
            written: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        }
    }

    /// Whether a decision may be logged at all: on, and tollgate logging at `debug`. The one
    /// check a decision pays when the log is off.
    #[inline]
    pub fn on(&self) -> bool {
        self.per_s > 0 && tracing::enabled!(tracing::Level::DEBUG)
    }

    /// Logs the decision of `req` (one line), if the second's rate allows; `now_ms` is the
    /// monotonic clock.
    pub(super) fn log(
        &self,
        now_ms: u64,
        req: &Request<'_>,
        plan: &Plan,
        outcomes: &[Outcome],
        sources: &[Source],
        decision: &Decision,
    ) {
        if !self.admit(now_ms / 1000) {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let skipped = self.skipped.swap(0, Ordering::Relaxed);
        let mut limits = String::new();
        for ((p, o), s) in plan.planned.iter().zip(outcomes).zip(sources) {
            if !limits.is_empty() {
                limits.push_str("; ");
            }
            let entries = &req.descriptors[p.desc].entries;
            let _ = write!(limits, "#{} ", p.desc);
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    limits.push(',');
                }
                let _ = write!(limits, "{k}={}", self.value(v));
            }
            let _ = write!(
                limits,
                " {} ({}) {} by {} remaining={}",
                p.limit.class,
                p.limit.origin,
                if o.allowed { "ok" } else { "over_limit" },
                source_name(*s),
                o.remaining,
            );
        }
        let code = match decision.overall {
            Code::Ok => "ok",
            _ => "over_limit",
        };
        tracing::debug!(
            domain = req.domain,
            code,
            limits = %limits,
            skipped,
            "decision"
        );
    }

    /// Whether one more line fits in `second`.
    fn admit(&self, second: u64) -> bool {
        let seen = self.second.load(Ordering::Relaxed);
        if seen != second
            && self
                .second
                .compare_exchange(seen, second, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.written.store(0, Ordering::Relaxed);
        }
        self.written.fetch_add(1, Ordering::Relaxed) < self.per_s
    }

    /// A descriptor value as the log shows it: itself, or its short hash.
    fn value(&self, v: &str) -> String {
        if self.values {
            return v.to_string();
        }
        let digest = sha1_smol::Sha1::from(v.as_bytes()).digest().to_string();
        format!("#{}", &digest[..8])
    }
}

/// A source's name in a log line: `store`, `lease`, `over_limit_cache`, `fallback/<failure>`.
pub fn source_name(s: Source) -> String {
    match s {
        Source::Fallback(kind) => format!("fallback/{}", kind.label()),
        _ => s.label().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_holds_per_second_and_values_hide_when_asked() {
        let log = DecisionLog::new(2, false);
        let admitted = (0..5).filter(|_| log.admit(7)).count();
        assert_eq!(admitted, 2, "two lines in second 7");
        assert!(log.admit(8), "a new second");
        let hidden = log.value("sk-secret-key");
        assert!(hidden.starts_with('#') && hidden.len() == 9, "{hidden}");
        assert_eq!(
            hidden,
            log.value("sk-secret-key"),
            "the same value, the same hash"
        );
        assert_ne!(hidden, log.value("other"));
        assert_eq!(DecisionLog::new(1, true).value("acme"), "acme");
        assert_eq!(
            source_name(Source::Fallback(crate::store::StoreErrorKind::Deadline)),
            "fallback/deadline"
        );
    }
}
