//! Over-admission and false rejections per window of the limit's own length, per bucket: the
//! figures a whole-run total cannot hide an overshoot in.
//!
//! A whole-run sum lets a bucket that admitted +30 % for ten seconds and −30 % for the next ten
//! report 0 %. Here every bucket's time is cut into windows of its limit's length (a 1 s limit
//! into seconds, a minute limit into minutes), aligned to the start of the run, and each window
//! compares what the fleet admitted with what the ideal (one exact bucket) admitted of the same
//! arrivals. A window's over-admission is `admitted − ideal` when positive, its false rejections
//! `ideal − admitted` when positive, both in hits and as a share of the limit (the tokens one
//! window allows: the refill of a token bucket, the limit of a window).
//!
//! Flow: an arrival opens (or joins) its bucket's current window ([`Track::arrived`]: one more
//! pending decision, the ideal's answer counted); its decision, whenever it ends, adds to the
//! same window ([`Track::decided`]). A window closes once no decision of it is pending and a
//! later window of the bucket has begun (arrivals come in time order, so nothing more can join
//! it), or when the run ends; closing folds it into its class's [`Figures`]: the count of
//! windows, the share over, a histogram for the p99 and the worst window with its place in time.
//! So memory stays per bucket (a window or two), not per bucket and window.

use std::collections::VecDeque;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::quota::OpKind;

/// `x` to `digits` decimals (the report's figures).
pub(super) fn round(x: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (x * m).round() / m
}

/// One window of one bucket, still open.
#[derive(Clone, Copy, Debug)]
struct Open {
    index: u64,
    pending: u32,
    admitted: u64,
    ideal: u64,
}

/// A bucket's windows: their length, the limit per window, the ones still open.
#[derive(Clone, Debug, Default)]
pub(super) struct Track {
    window_us: u64,
    limit: u64,
    open: VecDeque<Open>,
}

/// A closed window, as it is folded.
#[derive(Clone, Copy, Debug)]
pub(super) struct Closed {
    pub(super) bucket: usize,
    pub(super) from_us: u64,
    pub(super) window_us: u64,
    pub(super) limit: u64,
    pub(super) admitted: u64,
    pub(super) ideal: u64,
}

impl Track {
    /// The windows of a bucket of `kind`.
    pub(super) fn new(kind: &OpKind) -> Self {
        let (limit, window_ms) = kind.per_window();
        Track {
            window_us: window_ms.max(1).saturating_mul(1_000),
            limit,
            open: VecDeque::new(),
        }
    }

    /// A request of `hits` arrived at `now_us`; `ideal`: whether the ideal admitted them.
    /// Returns its window, for [`Track::decided`].
    pub(super) fn arrived(&mut self, now_us: u64, hits: u64, ideal: bool) -> u64 {
        let index = now_us / self.window_us;
        if self.open.back().is_none_or(|w| w.index < index) {
            self.open.push_back(Open {
                index,
                pending: 0,
                admitted: 0,
                ideal: 0,
            });
        }
        if let Some(w) = self.open.back_mut() {
            w.pending += 1;
            w.ideal += if ideal { hits } else { 0 };
        }
        index
    }

    /// The decision of a request of window `index` ended: `admitted` hits. Returns the windows
    /// that closed.
    pub(super) fn decided(&mut self, bucket: usize, index: u64, admitted: u64) -> Vec<Closed> {
        if let Some(w) = self.open.iter_mut().find(|w| w.index == index) {
            w.pending = w.pending.saturating_sub(1);
            w.admitted += admitted;
        }
        let mut closed = Vec::new();
        while self.open.len() > 1 && self.open.front().is_some_and(|w| w.pending == 0) {
            if let Some(w) = self.open.pop_front() {
                closed.push(self.closed(bucket, w));
            }
        }
        closed
    }

    /// Every window still open (the run ended).
    pub(super) fn close_all(&mut self, bucket: usize) -> Vec<Closed> {
        let open: Vec<Open> = self.open.drain(..).collect();
        open.into_iter().map(|w| self.closed(bucket, w)).collect()
    }

    fn closed(&self, bucket: usize, w: Open) -> Closed {
        Closed {
            bucket,
            from_us: w.index.saturating_mul(self.window_us),
            window_us: self.window_us,
            limit: self.limit,
            admitted: w.admitted,
            ideal: w.ideal,
        }
    }
}

/// One direction (over the ideal, or under it) of a set of closed windows.
#[derive(Clone, Debug)]
struct Side {
    /// Windows off the ideal in this direction.
    off: u64,
    /// Hits off, summed over windows (never netted against the other direction).
    hits: u64,
    /// Each window's share of its limit, in hundredths of a percent (0 for windows on the ideal).
    pct: Histogram<u64>,
    worst: Option<(Closed, u64)>,
}

impl Side {
    fn new() -> Self {
        Side {
            off: 0,
            hits: 0,
            pct: Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant figures")),
            worst: None,
        }
    }

    fn add(&mut self, w: Closed, hits: u64) {
        // Of the limit per window; a limit of 0 counts each hit as a whole limit.
        let basis_points = hits.saturating_mul(10_000) / w.limit.max(1);
        // `record`, not `saturating_record`: the histogram grows to the value (a saturating
        // record would clamp it at the initial bound).
        let _ = self.pct.record(basis_points);
        if hits == 0 {
            return;
        }
        self.off += 1;
        self.hits += hits;
        // The worst: the largest share of its limit; of equal shares, the most hits.
        if self
            .worst
            .is_none_or(|(best, bp)| (basis_points, hits) > (bp, hits_of(best)))
        {
            self.worst = Some((w, basis_points));
        }
    }

    fn merge(&mut self, other: &Side) {
        self.off += other.off;
        self.hits += other.hits;
        let _ = self.pct.add(&other.pct);
        if let Some((w, bp)) = other.worst
            && self
                .worst
                .is_none_or(|(best, b)| (bp, hits_of(w)) > (b, hits_of(best)))
        {
            self.worst = Some((w, bp));
        }
    }
}

/// The hits a worst window is off by (over or under: whichever made it worst).
fn hits_of(w: Closed) -> u64 {
    w.admitted.abs_diff(w.ideal)
}

/// The closed windows of a class (or of the whole run).
#[derive(Clone, Debug)]
pub(super) struct Figures {
    windows: u64,
    over: Side,
    under: Side,
}

impl Figures {
    pub(super) fn new() -> Self {
        Figures {
            windows: 0,
            over: Side::new(),
            under: Side::new(),
        }
    }

    pub(super) fn add(&mut self, w: Closed) {
        self.windows += 1;
        self.over.add(w, w.admitted.saturating_sub(w.ideal));
        self.under.add(w, w.ideal.saturating_sub(w.admitted));
    }

    pub(super) fn merge(&mut self, other: &Figures) {
        self.windows += other.windows;
        self.over.merge(&other.over);
        self.under.merge(&other.under);
    }

    /// The report's form; `key`: a bucket's key by its index.
    pub(super) fn report(&self, key: &dyn Fn(usize) -> String) -> WindowReport {
        WindowReport {
            windows: self.windows,
            over: side_report(&self.over, self.windows, key),
            under: side_report(&self.under, self.windows, key),
        }
    }
}

fn side_report(side: &Side, windows: u64, key: &dyn Fn(usize) -> String) -> SideReport {
    SideReport {
        hits: side.hits,
        windows_pct: if windows == 0 {
            0.0
        } else {
            round(100.0 * side.off as f64 / windows as f64, 3)
        },
        p99_pct: if side.pct.is_empty() {
            0.0
        } else {
            // The lowest value the histogram's bucket holds: a share the windows reached.
            let bp = side.pct.lowest_equivalent(side.pct.value_at_quantile(0.99));
            round(bp as f64 / 100.0, 1)
        },
        worst: side.worst.map(|(w, bp)| Worst {
            bucket: key(w.bucket),
            from_s: round(w.from_us as f64 / 1e6, 3),
            to_s: round(w.from_us.saturating_add(w.window_us) as f64 / 1e6, 3),
            admitted: w.admitted,
            ideal: w.ideal,
            limit: w.limit,
            hits: w.admitted.abs_diff(w.ideal),
            pct: bp as f64 / 100.0,
        }),
    }
}

/// Windows of the limit's length, per bucket: `windows` with traffic, and the two directions.
#[derive(Clone, Debug, Serialize)]
pub struct WindowReport {
    pub windows: u64,
    /// Admitted beyond the ideal.
    pub over: SideReport,
    /// The ideal's admissions the fleet refused.
    pub under: SideReport,
}

#[derive(Clone, Debug, Serialize)]
pub struct SideReport {
    /// Hits off the ideal in this direction, summed over windows (not netted).
    pub hits: u64,
    /// The share of windows off in this direction, %.
    pub windows_pct: f64,
    /// The 99th percentile over buckets and windows, % of the limit per window.
    pub p99_pct: f64,
    /// The worst window (largest share of its limit); absent when none was off.
    pub worst: Option<Worst>,
}

/// One window of one bucket, and how far off the ideal it was.
#[derive(Clone, Debug, Serialize)]
pub struct Worst {
    pub bucket: String,
    /// Virtual seconds since the start.
    pub from_s: f64,
    pub to_s: f64,
    pub admitted: u64,
    pub ideal: u64,
    /// Tokens one window allows.
    pub limit: u64,
    /// Hits off the ideal.
    pub hits: u64,
    /// The same, % of the limit.
    pub pct: f64,
}

impl Worst {
    /// "t5, 40–41 s: admitted 300, ideal 100 of 100 (+200 hits, 200.0 % of the limit)".
    pub fn text(&self, sign: char) -> String {
        format!(
            "{}, {}–{} s: admitted {}, ideal {} (limit {}): {sign}{} hits, {:.1} % of the limit",
            self.bucket,
            self.from_s,
            self.to_s,
            self.admitted,
            self.ideal,
            self.limit,
            self.hits,
            self.pct
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn track() -> Track {
        Track::new(&OpKind::FixedWindow {
            limit: 10,
            window_ms: 1_000,
        })
    }

    #[test]
    fn a_window_closes_once_its_decisions_ended_and_a_later_one_began() {
        let mut t = track();
        let a = t.arrived(100_000, 1, true);
        let b = t.arrived(900_000, 1, true);
        assert_eq!((a, b), (0, 0));
        assert!(t.decided(7, a, 1).is_empty(), "window 0 is still current");
        let c = t.arrived(1_200_000, 1, false);
        assert_eq!(c, 1);
        assert!(t.decided(7, c, 1).is_empty(), "window 0 still waits on b");
        let closed = t.decided(7, b, 0);
        assert_eq!(closed.len(), 1);
        let w = closed[0];
        assert_eq!((w.bucket, w.from_us, w.admitted, w.ideal), (7, 0, 1, 2));
        let rest = t.close_all(7);
        assert_eq!(rest.len(), 1);
        assert_eq!(
            (rest[0].from_us, rest[0].admitted, rest[0].ideal),
            (1_000_000, 1, 0)
        );
    }

    #[test]
    fn over_and_under_are_not_netted() {
        let mut f = Figures::new();
        let w = |from_s: u64, admitted, ideal| Closed {
            bucket: 0,
            from_us: from_s * 1_000_000,
            window_us: 1_000_000,
            limit: 100,
            admitted,
            ideal,
        };
        f.add(w(0, 100, 100));
        f.add(w(1, 150, 100));
        f.add(w(2, 50, 100));
        f.add(w(3, 130, 100));
        let r = f.report(&|b| format!("b{b}"));
        assert_eq!(r.windows, 4);
        assert_eq!((r.over.hits, r.under.hits), (80, 50));
        assert_eq!(r.over.windows_pct, 50.0);
        let worst = r.over.worst.expect("over");
        assert_eq!((worst.from_s, worst.hits, worst.pct), (1.0, 50, 50.0));
        assert_eq!(r.under.worst.expect("under").from_s, 2.0);
        assert_eq!(r.over.p99_pct, 50.0);
    }
}
