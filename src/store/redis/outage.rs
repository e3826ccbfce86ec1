//! Logging store failures as a state, not per request.
//!
//! Under load a Redis outage fails thousands of calls a second; one log line each would bury
//! everything else. [`OutageLog`] logs the change (calls start failing, calls succeed again)
//! and, while the outage lasts, one line per [`REPEAT`] with the number of failed calls since
//! the last line. The per-kind count is in `tollgate_store_errors_total` either way.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::store::StoreError;

/// How often a lasting outage is logged again.
pub(super) const REPEAT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub(super) struct OutageLog {
    failing: AtomicBool,
    /// Failed calls since the last log line.
    failed: AtomicU64,
    /// When the last log line was written (ms since `started`).
    logged_ms: AtomicU64,
    started: Instant,
    /// What is failing, for the log lines ("store calls", …).
    what: &'static str,
}

/// What [`OutageLog::record`] decided to log (returned so tests can see it).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Logged {
    Nothing,
    Down,
    StillDown { failed: u64 },
    Up { failed: u64 },
}

impl OutageLog {
    pub(super) fn new(what: &'static str) -> Self {
        OutageLog {
            what,
            failing: AtomicBool::new(false),
            failed: AtomicU64::new(0),
            logged_ms: AtomicU64::new(0),
            started: Instant::now(),
        }
    }

    /// Notes one call's result; logs only when the state changes or [`REPEAT`] has passed.
    pub(super) fn record<T>(&self, result: &Result<T, StoreError>) -> Logged {
        self.record_at(result.as_ref().err(), self.started.elapsed())
    }

    fn record_at(&self, error: Option<&StoreError>, now: Duration) -> Logged {
        let now_ms = now.as_millis() as u64;
        let Some(e) = error else {
            // The common case costs one relaxed load.
            if !self.failing.load(Ordering::Relaxed) || !self.failing.swap(false, Ordering::AcqRel)
            {
                return Logged::Nothing;
            }
            let failed = self.failed.swap(0, Ordering::AcqRel);
            tracing::info!(failed_calls = failed, "{} succeed again", self.what);
            return Logged::Up { failed };
        };
        self.failed.fetch_add(1, Ordering::AcqRel);
        if !self.failing.swap(true, Ordering::AcqRel) {
            self.logged_ms.store(now_ms, Ordering::Release);
            tracing::warn!(
                error = %e,
                "{} failing; the fallback decides until they succeed (logged again every {} s while it lasts)",
                self.what,
                REPEAT.as_secs()
            );
            return Logged::Down;
        }
        let last = self.logged_ms.load(Ordering::Acquire);
        let due = now_ms.saturating_sub(last) >= REPEAT.as_millis() as u64;
        // One caller wins the slot; the others keep counting.
        if due
            && self
                .logged_ms
                .compare_exchange(last, now_ms, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            let failed = self.failed.swap(0, Ordering::AcqRel);
            tracing::warn!(error = %e, failed_calls = failed, "{} still failing", self.what);
            return Logged::StillDown { failed };
        }
        Logged::Nothing
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreErrorKind;

    #[test]
    fn logs_changes_and_a_count_per_period_not_every_failure() {
        let log = OutageLog::new("store calls");
        let e = StoreError::new(StoreErrorKind::Timeout, "no answer");
        let s = Duration::from_secs;
        assert_eq!(log.record_at(None, s(0)), Logged::Nothing);
        assert_eq!(log.record_at(Some(&e), s(1)), Logged::Down);
        for _ in 0..1000 {
            assert_eq!(log.record_at(Some(&e), s(2)), Logged::Nothing);
        }
        assert_eq!(
            log.record_at(Some(&e), s(11)),
            Logged::StillDown { failed: 1002 }
        );
        assert_eq!(log.record_at(Some(&e), s(12)), Logged::Nothing);
        assert_eq!(log.record_at(None, s(13)), Logged::Up { failed: 1 });
        assert_eq!(log.record_at(None, s(14)), Logged::Nothing);
        assert_eq!(log.record_at(Some(&e), s(15)), Logged::Down);
    }
}
