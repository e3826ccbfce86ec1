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

use std::collections::BTreeMap;
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

/// The state behind [`Clock::manual`]: both readings in microseconds, so a simulated store
/// can answer in 0.4 ms (`tollgate simulate`); the readings the code uses are milliseconds.
#[derive(Debug)]
pub struct ManualTime {
    mono_us: AtomicU64,
    wall_us: AtomicU64,
    /// Sleeps waiting on the monotonic reading, by (deadline, registration order), woken by
    /// `advance_us`. Ordered, not a list: a simulated fleet has hundreds of thousands of
    /// sleeping tasks. A sleep dropped before its deadline (a timeout whose future won) takes
    /// its entry out at once: a waker left behind would keep its task's memory alive until the
    /// deadline, and a fleet's timeouts mostly end that way.
    sleepers: Mutex<BTreeMap<(u64, u64), Waker>>,
    /// Orders sleepers of one deadline by when they were registered.
    registered: AtomicU64,
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
            mono_us: AtomicU64::new(0),
            wall_us: AtomicU64::new(wall_ms.saturating_mul(1_000)),
            sleepers: Mutex::new(BTreeMap::new()),
            registered: AtomicU64::new(0),
        }))
    }

    /// Milliseconds on a clock that never goes backwards (the origin is arbitrary).
    pub fn mono_ms(&self) -> u64 {
        match self {
            Clock::System { start } => start.elapsed().as_millis() as u64,
            Clock::Manual(t) => t.mono_us.load(Ordering::SeqCst) / 1_000,
        }
    }

    /// Microseconds on the monotonic clock (the same origin as [`Clock::mono_ms`]).
    pub fn mono_us(&self) -> u64 {
        match self {
            Clock::System { start } => start.elapsed().as_micros() as u64,
            Clock::Manual(t) => t.mono_us.load(Ordering::SeqCst),
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
            Clock::Manual(t) => t.wall_us.load(Ordering::SeqCst) / 1_000,
        }
    }

    /// Moves a manual clock forward (both readings) and wakes the sleeps that are due; a
    /// no-op on the system clock.
    pub fn advance_ms(&self, ms: u64) {
        self.advance_us(ms.saturating_mul(1_000));
    }

    /// [`Clock::advance_ms`] in microseconds (a simulated store's round trips are shorter
    /// than a millisecond). Returns how many sleeper entries came due (a simulator lets the
    /// woken tasks run before it moves on; an entry of a sleep already over counts too).
    pub fn advance_us(&self, us: u64) -> usize {
        let mut woken = 0;
        if let Clock::Manual(t) = self {
            let now = t.mono_us.fetch_add(us, Ordering::SeqCst) + us;
            t.wall_us.fetch_add(us, Ordering::SeqCst);
            let mut due = Vec::new();
            {
                let mut sleepers = t.sleepers.lock().unwrap_or_else(|p| p.into_inner());
                while let Some(entry) = sleepers.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    due.push(entry.remove());
                }
            }
            // Woken outside the lock: a woken task may register its next sleep at once.
            woken = due.len();
            due.into_iter().for_each(Waker::wake);
        }
        woken
    }

    /// The earliest monotonic deadline (µs) a sleep on a manual clock waits for, if any: a
    /// simulator jumps there when nothing else happens sooner. `None` on the system clock.
    pub fn next_deadline_us(&self) -> Option<u64> {
        match self {
            Clock::System { .. } => None,
            Clock::Manual(t) => t
                .sleepers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .first_key_value()
                .map(|(&(deadline, _), _)| deadline),
        }
    }

    /// How many sleeps have registered on a manual clock so far (0 on the system clock): a
    /// simulator's sign that a woken task went back to sleep, so something still moves.
    pub fn sleeps_registered(&self) -> u64 {
        match self {
            Clock::System { .. } => 0,
            Clock::Manual(t) => t.registered.load(Ordering::Relaxed),
        }
    }

    /// Resolves after `duration` on this clock.
    pub fn sleep(&self, duration: Duration) -> Sleep {
        match self {
            Clock::System { .. } => Sleep::System(Box::pin(tokio::time::sleep(duration))),
            Clock::Manual(t) => Sleep::Manual {
                registered: None,
                time: t.clone(),
                deadline: t
                    .mono_us
                    .load(Ordering::SeqCst)
                    .saturating_add(u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)),
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
        /// Its entry among the sleepers (the registration number) and the task it wakes:
        /// polled again by the same task, it does not register again; by another, it moves.
        registered: Option<(u64, Waker)>,
    },
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.get_mut() {
            Sleep::System(sleep) => sleep.as_mut().poll(cx),
            Sleep::Manual {
                time,
                deadline,
                registered,
            } => {
                // Registered before the reading is checked: an advance in between wakes it.
                let mut sleepers = time.sleepers.lock().unwrap_or_else(|p| p.into_inner());
                if time.mono_us.load(Ordering::SeqCst) >= *deadline {
                    return Poll::Ready(());
                }
                // Its entry is still there (the deadline is ahead, so it has not been woken)
                // and wakes the same task: nothing to change.
                if let Some((seq, waker)) = registered.as_ref() {
                    if waker.will_wake(cx.waker()) && sleepers.contains_key(&(*deadline, *seq)) {
                        return Poll::Pending;
                    }
                    sleepers.remove(&(*deadline, *seq));
                }
                let seq = time.registered.fetch_add(1, Ordering::Relaxed);
                sleepers.insert((*deadline, seq), cx.waker().clone());
                *registered = Some((seq, cx.waker().clone()));
                Poll::Pending
            }
        }
    }
}

impl Drop for Sleep {
    /// A manual sleep dropped before its deadline takes its entry (and the waker that keeps
    /// its task alive) out of the sleepers.
    fn drop(&mut self) {
        if let Sleep::Manual {
            time,
            deadline,
            registered: Some((seq, _)),
        } = self
        {
            time.sleepers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&(*deadline, *seq));
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
        // Microsteps add up to milliseconds; the ms readings floor.
        c.advance_us(400);
        assert_eq!((c.mono_us(), c.mono_ms()), (1_500_400, 1500));
        c.advance_us(600);
        assert_eq!((c.mono_ms(), c.wall_ms()), (1501, 1_001_501));
    }

    #[tokio::test]
    async fn sleeps_end_at_their_microsecond_and_the_next_deadline_is_known() {
        let c = Clock::manual(0);
        assert_eq!(c.next_deadline_us(), None);
        let clock = c.clone();
        let task = tokio::spawn(async move { clock.sleep(Duration::from_micros(400)).await });
        while c.next_deadline_us().is_none() {
            tokio::task::yield_now().await;
        }
        assert_eq!(c.next_deadline_us(), Some(400));
        c.advance_us(399);
        tokio::task::yield_now().await;
        assert!(!task.is_finished(), "woke 1 µs early");
        c.advance_us(1);
        task.await.unwrap();
        assert_eq!(
            c.next_deadline_us(),
            None,
            "a woken sleeper leaves the heap"
        );
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
