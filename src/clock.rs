//! One clock handle for everything timed: readings, waits and background tasks.
//!
//! Buckets read two clocks: a monotonic one (token-bucket refill, idle eviction), which never
//! jumps when NTP steps the wall clock, and the wall clock (epoch-aligned fixed windows, which
//! must agree with every other replica and with the reference implementation). The parts that
//! wait or run in the background (lease claims sent ahead, a request waiting for another's
//! claim, the membership heartbeat) do so through the same handle: [`Clock::sleep`],
//! [`Clock::timeout`], [`Clock::spawn`].
//!
//! Tests (and a simulator) use [`Clock::manual`]: both readings, and every sleep and timeout
//! taken through it, move only when [`Clock::advance_ms`] says, so a fleet of limiters can be
//! driven through leases, expiries and outages with no real waiting (`tokio::time::pause`
//! alone does not move wall time). Tasks still run on the tokio runtime they are spawned on.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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
    /// Sleeps waiting on the monotonic reading: (deadline, its task), woken by `advance_ms`.
    sleepers: Mutex<Vec<(u64, Waker)>>,
}

/// A wait that ran out (from [`Clock::timeout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Elapsed;

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
            sleepers: Mutex::new(Vec::new()),
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

    /// Moves a manual clock forward (both readings) and wakes the sleeps that are due; a
    /// no-op on the system clock.
    pub fn advance_ms(&self, ms: u64) {
        if let Clock::Manual(t) = self {
            let now = t.mono_ms.fetch_add(ms, Ordering::SeqCst) + ms;
            t.wall_ms.fetch_add(ms, Ordering::SeqCst);
            let due: Vec<Waker> = {
                let mut sleepers = t.sleepers.lock().unwrap_or_else(|p| p.into_inner());
                let (due, waiting) = std::mem::take(&mut *sleepers)
                    .into_iter()
                    .partition(|(deadline, _)| *deadline <= now);
                *sleepers = waiting;
                due.into_iter().map(|(_, waker)| waker).collect()
            };
            due.into_iter().for_each(Waker::wake);
        }
    }

    /// Resolves after `duration` on this clock.
    pub fn sleep(&self, duration: Duration) -> Sleep {
        match self {
            Clock::System { .. } => Sleep::System(Box::pin(tokio::time::sleep(duration))),
            Clock::Manual(t) => Sleep::Manual {
                time: t.clone(),
                deadline: t
                    .mono_ms
                    .load(Ordering::SeqCst)
                    .saturating_add(duration.as_millis() as u64),
            },
        }
    }

    /// `future`'s output, or [`Elapsed`] if `duration` passes on this clock first.
    pub async fn timeout<F: Future>(
        &self,
        duration: Duration,
        future: F,
    ) -> Result<F::Output, Elapsed> {
        match self {
            Clock::System { .. } => tokio::time::timeout(duration, future)
                .await
                .map_err(|_| Elapsed),
            Clock::Manual(_) => {
                let sleep = self.sleep(duration);
                tokio::select! {
                    biased;
                    out = future => Ok(out),
                    () = sleep => Err(Elapsed),
                }
            }
        }
    }

    /// Runs `task` in the background on the current tokio runtime; its handle, for a caller
    /// that waits for it to end (most do not).
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        tokio::spawn(task)
    }
}

/// The future of [`Clock::sleep`].
pub enum Sleep {
    System(Pin<Box<tokio::time::Sleep>>),
    Manual {
        time: Arc<ManualTime>,
        deadline: u64,
    },
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.get_mut() {
            Sleep::System(sleep) => sleep.as_mut().poll(cx),
            Sleep::Manual { time, deadline } => {
                // Registered before the reading is checked: an advance in between wakes it.
                let mut sleepers = time.sleepers.lock().unwrap_or_else(|p| p.into_inner());
                if time.mono_ms.load(Ordering::SeqCst) >= *deadline {
                    return Poll::Ready(());
                }
                // One entry per task, at the earliest of its sleeps (a task may wait on two):
                // a wake that comes early makes each sleep look again and register anew.
                match sleepers.iter_mut().find(|(_, w)| w.will_wake(cx.waker())) {
                    Some(entry) => entry.0 = entry.0.min(*deadline),
                    None => sleepers.push((*deadline, cx.waker().clone())),
                }
                Poll::Pending
            }
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

    #[tokio::test]
    async fn manual_sleeps_and_timeouts_end_only_when_the_clock_is_advanced() {
        let c = Clock::manual(0);
        let slept = Arc::new(AtomicU64::new(0));
        let (clock, flag) = (c.clone(), slept.clone());
        let task = tokio::spawn(async move {
            clock.sleep(Duration::from_millis(100)).await;
            flag.store(1, Ordering::SeqCst);
            clock
                .timeout(Duration::from_millis(50), std::future::pending::<()>())
                .await
        });
        // Real time passes; the manual clock does not: the sleep is still waiting.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(slept.load(Ordering::SeqCst), 0);
        c.advance_ms(99);
        tokio::task::yield_now().await;
        assert_eq!(slept.load(Ordering::SeqCst), 0, "woke 1 ms early");
        c.advance_ms(1);
        // The sleep ends; the timeout that follows waits for its own 50 ms.
        while slept.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !task.is_finished(),
            "the timeout ran out without the clock moving"
        );
        c.advance_ms(50);
        assert_eq!(task.await.unwrap(), Err(Elapsed));
        // A future that is ready first wins.
        assert_eq!(c.timeout(Duration::ZERO, async { 7 }).await, Ok(7));
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
