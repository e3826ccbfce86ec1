//! One clock handle for every time-dependent decision.
//!
//! Buckets read two clocks: a monotonic one (token-bucket refill, idle eviction), which never
//! jumps when NTP steps the wall clock, and the wall clock (epoch-aligned fixed windows, which
//! must agree with every other replica and with the reference implementation). Tests use
//! [`Clock::manual`] to move both by hand: `tokio::time::pause` alone does not move wall time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A cheap, cloneable clock. Both readings are in milliseconds.
#[derive(Clone, Debug)]
pub enum Clock {
    /// The real clocks of this machine.
    System { start: Instant },
    /// Hand-driven time for tests and benchmarks.
    Manual(Arc<ManualTime>),
}

/// The state behind [`Clock::manual`].
#[derive(Debug)]
pub struct ManualTime {
    mono_ms: AtomicU64,
    wall_ms: AtomicU64,
}

impl Clock {
    pub fn system() -> Self {
        Clock::System {
            start: Instant::now(),
        }
    }

    /// A clock that starts at monotonic 0 and at the given wall time, and moves only when told.
    pub fn manual(wall_ms: u64) -> Self {
        Clock::Manual(Arc::new(ManualTime {
            mono_ms: AtomicU64::new(0),
            wall_ms: AtomicU64::new(wall_ms),
        }))
    }

    /// Milliseconds on a clock that never goes backwards (the origin is arbitrary).
    pub fn mono_ms(&self) -> u64 {
        match self {
            Clock::System { start } => start.elapsed().as_millis() as u64,
            Clock::Manual(t) => t.mono_ms.load(Ordering::SeqCst),
        }
    }

    /// Milliseconds since the Unix epoch.
    pub fn wall_ms(&self) -> u64 {
        match self {
            // A wall clock before 1970 is a broken host; 0 keeps the arithmetic defined.
            Clock::System { .. } => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            Clock::Manual(t) => t.wall_ms.load(Ordering::SeqCst),
        }
    }

    /// Moves a manual clock forward (both readings); a no-op on the system clock.
    pub fn advance_ms(&self, ms: u64) {
        if let Clock::Manual(t) = self {
            t.mono_ms.fetch_add(ms, Ordering::SeqCst);
            t.wall_ms.fetch_add(ms, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_both_readings_only_when_told() {
        let c = Clock::manual(1_000_000);
        assert_eq!((c.mono_ms(), c.wall_ms()), (0, 1_000_000));
        c.advance_ms(1500);
        assert_eq!((c.mono_ms(), c.wall_ms()), (1500, 1_001_500));
    }

    #[test]
    fn system_clock_follows_real_time_and_reads_now() {
        let c = Clock::system();
        let (mono, wall) = (c.mono_ms(), c.wall_ms());
        std::thread::sleep(std::time::Duration::from_millis(30));
        // Both readings move with real time (a clock stuck at its start, or one that counts
        // in another unit, fails), and the wall reading is the Unix time in milliseconds.
        let (moved, wall_moved) = (c.mono_ms() - mono, c.wall_ms().saturating_sub(wall));
        assert!(
            (30..5_000).contains(&moved),
            "monotonic moved {moved} ms in 30 ms"
        );
        assert!(
            (30..5_000).contains(&wall_moved),
            "wall moved {wall_moved} ms in 30 ms"
        );
        let unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(
            unix_ms.abs_diff(c.wall_ms()) < 1_000,
            "{} vs {unix_ms}",
            c.wall_ms()
        );
    }
}
