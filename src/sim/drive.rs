//! The loop over virtual time ([`Sim::drive`]): the clock jumps to the next thing due and the
//! woken tasks run until nothing moves.
//!
//! Flow: the fleet starts → each turn, the next thing due (an arrival, a task's sleep, a
//! scaling event, a second's end) → the clock advances to it and [`settle`] lets the woken
//! tasks run → a second's end samples the fleet, a change resizes it, an arrival is issued →
//! at the end the fleet stops, the decisions still waiting on the store end (within a bound of
//! virtual time), and the counts become the report.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use rand_distr::Distribution;

use super::report::{self, Counts, Report, Speed};
use super::state::Sim;
use crate::clock::Clock;

impl Sim<'_> {
    /// Runs the scenario to its end.
    pub(super) async fn drive(mut self, progress: bool) -> Report {
        let started = Instant::now();
        let end_us = self.scenario.duration_s * 1_000_000;
        self.resize(self.scenario.replicas.start);
        // The replicas' first heartbeats and housekeeping sleeps start at 0.
        settle(&self.activity, &self.clock).await;
        let mut changes = self.scenario.replicas.changes.iter().peekable();
        let mut next_second = 1_000_000u64;
        let mut last_progress = Instant::now();
        let tasks = tokio::runtime::Handle::current().metrics();
        let mut alive = tasks.num_alive_tasks();
        loop {
            // A task spawned since the last settle (a decision waiting on the store, a claim
            // sent ahead, a new replica's heartbeat) must register its first sleep before the
            // next thing due is known.
            if tasks.num_alive_tasks() > alive {
                settle(&self.activity, &self.clock).await;
            }
            let now = self.clock.mono_us();
            let arrival = self
                .streams
                .iter()
                .enumerate()
                .min_by(|a, b| a.1.next_us.total_cmp(&b.1.next_us))
                .map(|(i, s)| (i, s.next_us.ceil() as u64));
            let change_us = changes.peek().map(|c| (c.0 * 1e6).round() as u64);
            let next = [
                arrival.map(|a| a.1),
                self.clock.next_deadline_us(),
                change_us,
                Some(next_second),
                Some(end_us),
            ]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(end_us)
            .max(now);
            if next > now && self.clock.advance_us(next - now) > 0 {
                settle(&self.activity, &self.clock).await;
            }
            alive = tasks.num_alive_tasks();
            if next >= end_us {
                break;
            }
            if next == next_second {
                self.sample_second(next_second / 1_000_000 - 1);
                next_second += 1_000_000;
                if progress && last_progress.elapsed() >= Duration::from_secs(1) {
                    last_progress = Instant::now();
                    let decided = self.counts.lock().map(|c| c.decided).unwrap_or(0);
                    eprint!(
                        "\rsimulate: {} / {} s virtual, {} decisions ({:.0}/s)   ",
                        next / 1_000_000,
                        self.scenario.duration_s,
                        decided,
                        decided as f64 / started.elapsed().as_secs_f64()
                    );
                    let _ = std::io::stderr().flush();
                }
            }
            if change_us == Some(next)
                && let Some(&(_, to)) = changes.next()
            {
                self.resize(to);
            }
            if let Some((stream, at)) = arrival
                && at == next
            {
                let gap = match &self.streams[stream].gap {
                    Some(g) => g.sample(&mut self.rng),
                    None => 1e6 / self.streams[stream].traffic.rate_per_s,
                };
                self.streams[stream].advance(gap);
                std::future::poll_fn(|cx| {
                    self.arrive(stream, cx);
                    Poll::Ready(())
                })
                .await;
            }
        }
        self.sample_second(self.scenario.duration_s - 1);
        // Stop the fleet's background tasks, then let the decisions still waiting on the
        // store end (a reply, or a timeout), within a bound of virtual time.
        for region in &mut self.regions {
            for r in std::mem::take(&mut region.fleet) {
                let _ = r.stop.send(true);
            }
        }
        settle(&self.activity, &self.clock).await;
        let s = &self.scenario.settings;
        let drain_until = end_us
            .saturating_add(
                s.store_connect_timeout_ms
                    .max(s.store_timeout_ms)
                    .saturating_mul(1_000),
            )
            .saturating_add(s.store_timeout_ms.saturating_mul(2_000))
            .saturating_add(2_000_000);
        while let Some(d) = self.clock.next_deadline_us() {
            if d > drain_until {
                break;
            }
            let now = self.clock.mono_us();
            self.clock.advance_us(d.saturating_sub(now));
            settle(&self.activity, &self.clock).await;
        }
        if progress {
            eprintln!();
        }
        let wall_s = started.elapsed().as_secs_f64();
        // Every region's nodes, in order.
        let calls: Vec<Vec<u64>> = self
            .regions
            .iter()
            .flat_map(|r| r.store.calls_per_second())
            .collect();
        let global_calls = self.global.as_ref().map(|g| g.calls_per_second());
        let class_calls = self.class_calls.per_second();
        let counts = std::mem::replace(
            &mut *self.counts.lock().unwrap_or_else(|p| p.into_inner()),
            Counts::new(0, 0),
        );
        let decisions = counts.decided;
        counts.report(
            self.scenario.file.display().to_string(),
            self.scenario.seed,
            self.scenario.duration_s,
            &calls,
            &class_calls,
            self.scenario
                .regions
                .as_ref()
                .map(|r| (r.names.as_slice(), global_calls.unwrap_or_default())),
            Speed {
                decisions,
                wall_s: report::round(wall_s, 2),
                decisions_per_s: report::round(decisions as f64 / wall_s.max(1e-9), 0),
            },
        )
    }

    /// The fleet's size and belief at the end of virtual second `t`.
    fn sample_second(&mut self, t: u64) {
        let live = self.replicas().count() as u64;
        let believed = if live == 0 {
            0.0
        } else {
            self.replicas()
                .map(|r| r.replicas.count() as f64)
                .sum::<f64>()
                / live as f64
        };
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(row) = counts.rows.get_mut(t as usize) {
            row.replicas = live;
            row.replicas_believed = report::round(believed, 2);
        }
    }
}

/// Lets the tasks the clock woke run, and the ones they wake or spawn, until nothing moves:
/// two turns of the scheduler in which no store script ran, no reply came, no decision ended,
/// no task started or ended and none went back to sleep (a turn runs at most 61 tasks).
async fn settle(activity: &AtomicU64, clock: &Clock) {
    let tasks = tokio::runtime::Handle::current().metrics();
    let progress = || {
        (
            activity.load(Ordering::Relaxed),
            tasks.num_alive_tasks(),
            clock.sleeps_registered(),
        )
    };
    loop {
        let before = progress();
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        if progress() == before {
            return;
        }
    }
}
