//! What a simulation counted, and the report made of it: the JSON object of `--json`, the
//! text summary, and the per-second series as CSV.
//!
//! Counting: every request is counted at its arrival second (offered, the ideal's answer) and
//! when its decision ends (admitted, latency, fallback). The ideal is one exact bucket per
//! limit on the arrival clock (`Limiter::ideal_ops` on a memory store): what the fleet should
//! admit. Over-admission and false rejections are counted per bucket over the whole run, in
//! hits: a bucket whose fleet admitted more than its ideal over-admitted the difference; one
//! that admitted less falsely rejected it. Per bucket, not per request: a lease that admits
//! request A where the ideal admitted request B is not an error, and a per-request count
//! would call it one.

use std::collections::HashMap;
use std::sync::Arc;

use hdrhistogram::Histogram;
use serde::Serialize;

pub(super) use super::windows::round;
use super::windows::{Figures, Track, WindowReport};
use crate::quota::OpKind;

/// One bucket's hits, and its windows of the limit's length.
#[derive(Clone, Debug, Default)]
pub(super) struct BucketCount {
    pub(super) class: usize,
    pub(super) offered: u64,
    pub(super) admitted: u64,
    pub(super) ideal: u64,
    pub(super) windows: Track,
}

/// How one request's decision ended, as Envoy applied it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Ended {
    /// Envoy let the request through (all its descriptors admitted, or the failure mode's).
    pub(super) admitted: bool,
    /// The fallback decided at least one of its ops.
    pub(super) fallback: bool,
    /// tollgate answered with an error (the fallback's `error` mode).
    pub(super) error: bool,
    /// Envoy's timeout passed before the decision ended.
    pub(super) envoy_gave_up: bool,
}

/// One virtual second.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Row {
    pub t_s: u64,
    pub offered: u64,
    pub admitted: u64,
    pub ideal: u64,
    pub store_calls: u64,
    pub fallback: u64,
    pub replicas: u64,
    pub replicas_believed: f64,
    /// Requests of this second whose decision Envoy stopped waiting for.
    pub envoy_timeouts: u64,
}

/// Per limit class: its buckets' hits, latency and fallback decisions.
#[derive(Debug)]
pub(super) struct ClassCount {
    pub(super) name: Arc<str>,
    pub(super) latency: Histogram<u64>,
    pub(super) fallback: u64,
    /// Its buckets' closed windows.
    pub(super) windows: Figures,
}

/// Everything counted while the simulation runs.
#[derive(Debug)]
pub(super) struct Counts {
    pub(super) rows: Vec<Row>,
    pub(super) buckets: Vec<BucketCount>,
    pub(super) bucket_ids: HashMap<String, usize>,
    pub(super) classes: Vec<ClassCount>,
    pub(super) latency: Histogram<u64>,
    pub(super) offered: u64,
    pub(super) admitted: u64,
    pub(super) ideal: u64,
    pub(super) fallback: u64,
    /// Requests the fallback's `error` mode failed (gRPC UNAVAILABLE: Envoy's failure mode
    /// decided them).
    pub(super) errors: u64,
    /// Requests whose decision Envoy stopped waiting for (its timeout; the failure mode
    /// decided them).
    pub(super) envoy_timeouts: u64,
    pub(super) decided: u64,
    /// Per region (one without regions): requests offered and admitted, per second.
    pub(super) regions: Vec<RegionCount>,
}

/// One region's requests, per virtual second.
#[derive(Debug, Default)]
pub(super) struct RegionCount {
    offered: Vec<u64>,
    admitted: Vec<u64>,
}

fn histogram() -> Histogram<u64> {
    crate::loadgen::latency_histogram()
}

impl Counts {
    pub(super) fn new(seconds: u64, regions: usize) -> Self {
        Counts {
            regions: (0..regions)
                .map(|_| RegionCount {
                    offered: vec![0; seconds as usize],
                    admitted: vec![0; seconds as usize],
                })
                .collect(),
            rows: (0..seconds)
                .map(|t| Row {
                    t_s: t,
                    ..Row::default()
                })
                .collect(),
            buckets: Vec::new(),
            bucket_ids: HashMap::new(),
            classes: Vec::new(),
            latency: histogram(),
            offered: 0,
            admitted: 0,
            ideal: 0,
            fallback: 0,
            errors: 0,
            envoy_timeouts: 0,
            decided: 0,
        }
    }

    /// The index of bucket `key` of class `class`, a limit of `kind`, counted from now on.
    pub(super) fn bucket(&mut self, key: &str, class: &Arc<str>, kind: &OpKind) -> usize {
        if let Some(&i) = self.bucket_ids.get(key) {
            return i;
        }
        let class = match self.classes.iter().position(|c| c.name == *class) {
            Some(c) => c,
            None => {
                self.classes.push(ClassCount {
                    name: class.clone(),
                    latency: histogram(),
                    fallback: 0,
                    windows: Figures::new(),
                });
                self.classes.len() - 1
            }
        };
        self.buckets.push(BucketCount {
            class,
            windows: Track::new(kind),
            ..BucketCount::default()
        });
        self.bucket_ids
            .insert(key.to_string(), self.buckets.len() - 1);
        self.buckets.len() - 1
    }

    fn row(&mut self, second: u64) -> Option<&mut Row> {
        self.rows.get_mut(second as usize)
    }

    /// A request arrived at `second` in `region`; `ideal`: whether the ideal admitted it.
    pub(super) fn arrived(&mut self, second: u64, region: usize, ideal: bool) {
        if let Some(n) = self
            .regions
            .get_mut(region)
            .and_then(|r| r.offered.get_mut(second as usize))
        {
            *n += 1;
        }
        self.offered += 1;
        self.ideal += u64::from(ideal);
        if let Some(r) = self.row(second) {
            r.offered += 1;
            r.ideal += u64::from(ideal);
        }
    }

    /// The decision of a request that arrived at `second` in `region` ended after
    /// `latency_us`. `buckets`: its buckets with each one's hits, whether its descriptor was
    /// admitted, and the bucket's window the request arrived in.
    pub(super) fn decided(
        &mut self,
        (second, region): (u64, usize),
        latency_us: u64,
        ended: &Ended,
        buckets: &[(usize, u64, bool, u64)],
    ) {
        if let Some(n) = self
            .regions
            .get_mut(region)
            .and_then(|r| r.admitted.get_mut(second as usize))
        {
            *n += u64::from(ended.admitted);
        }
        let fallback = ended.fallback;
        self.decided += 1;
        self.admitted += u64::from(ended.admitted);
        self.fallback += u64::from(fallback);
        self.errors += u64::from(ended.error);
        self.envoy_timeouts += u64::from(ended.envoy_gave_up);
        self.latency.saturating_record(latency_us.max(1));
        if let Some(r) = self.row(second) {
            r.admitted += u64::from(ended.admitted);
            r.fallback += u64::from(fallback);
            r.envoy_timeouts += u64::from(ended.envoy_gave_up);
        }
        // A request counts once per class for latency and fallback (whether the fallback
        // decided any of its ops: the decision says so per request, not per limit).
        let mut seen: Vec<usize> = Vec::with_capacity(buckets.len());
        for &(b, hits, ok, window) in buckets {
            let bucket = &mut self.buckets[b];
            let admitted = if ok { hits } else { 0 };
            bucket.admitted += admitted;
            let class = bucket.class;
            for closed in bucket.windows.decided(b, window, admitted) {
                self.classes[class].windows.add(closed);
            }
            if !seen.contains(&class) {
                seen.push(class);
                let c = &mut self.classes[class];
                c.latency.saturating_record(latency_us.max(1));
                c.fallback += u64::from(fallback);
            }
        }
    }
}

/// Hits over and under the ideal, summed over buckets: in hits and as % of the ideal's.
struct Errors {
    over_pct: f64,
    under_pct: f64,
    over: u64,
    under: u64,
    offered: u64,
    admitted: u64,
    ideal: u64,
}

/// Admitted beyond ideal and ideal not admitted, summed over buckets.
fn errors(buckets: &[&BucketCount]) -> Errors {
    let (mut offered, mut admitted, mut ideal, mut over, mut under) = (0, 0, 0, 0, 0);
    for b in buckets {
        offered += b.offered;
        admitted += b.admitted;
        ideal += b.ideal;
        over += b.admitted.saturating_sub(b.ideal);
        under += b.ideal.saturating_sub(b.admitted);
    }
    let pct = |x: u64| {
        if ideal == 0 {
            0.0
        } else {
            round(100.0 * x as f64 / ideal as f64, 3)
        }
    };
    Errors {
        over_pct: pct(over),
        under_pct: pct(under),
        over,
        under,
        offered,
        admitted,
        ideal,
    }
}

#[derive(Debug, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
}

fn latency(h: &Histogram<u64>) -> Latency {
    let ms = |q: f64| {
        if h.is_empty() {
            0.0
        } else {
            round(h.value_at_quantile(q) as f64 / 1_000.0, 3)
        }
    };
    Latency {
        p50: ms(0.5),
        p99: ms(0.99),
        p999: ms(0.999),
    }
}

#[derive(Debug, Serialize)]
pub struct Calls {
    pub mean: f64,
    pub max: u64,
}

#[derive(Debug, Serialize)]
pub struct StoreCalls {
    pub mean: f64,
    pub max: u64,
    pub per_node: Vec<Calls>,
}

/// One limit class (the rules' `class`, else `name`, else the key path), counted in hits.
#[derive(Debug, Serialize)]
pub struct ClassReport {
    pub class: String,
    pub buckets: usize,
    pub offered: u64,
    pub admitted: u64,
    pub ideal: u64,
    pub over_admitted_pct: f64,
    pub false_rejected_pct: f64,
    /// The same two in hits (the percentages are of the ideal's hits: 0 when it admitted none).
    pub over_admitted_hits: u64,
    pub false_rejected_hits: u64,
    /// Scripts the class's buckets ran (decisions, claims, give-backs), per second.
    pub store_calls_per_s: Calls,
    pub latency_ms: Latency,
    pub fallback_decisions: u64,
    /// Per window of the limit's length, per bucket: what a whole-run total can hide.
    pub windows: WindowReport,
}

/// One virtual second of the whole fleet against the ideal.
#[derive(Clone, Debug, Serialize)]
pub struct Second {
    pub t_s: u64,
    pub admitted: u64,
    pub ideal: u64,
    /// Requests off the ideal.
    pub requests: u64,
    /// The same, % of the ideal's.
    pub pct: f64,
}

/// The seconds furthest over and under the ideal (absent when none was).
#[derive(Debug, Serialize)]
pub struct WorstSeconds {
    pub over: Option<Second>,
    pub under: Option<Second>,
}

/// The whole run, counted in requests. `over_admitted_*` and `false_rejected_*` are whole-run
/// totals per bucket (over and under net out within a bucket: see `windows` for the figures
/// that do not).
#[derive(Debug, Serialize)]
pub struct Total {
    pub offered: u64,
    pub admitted: u64,
    pub ideal: u64,
    pub over_admitted_pct: f64,
    pub false_rejected_pct: f64,
    pub over_admitted_hits: u64,
    pub false_rejected_hits: u64,
    /// Per window of each limit's length, per bucket, over every class.
    pub windows: WindowReport,
    pub worst_second: WorstSeconds,
    pub store_calls_per_s: StoreCalls,
    pub latency_ms: Latency,
    pub fallback_decisions: u64,
    pub errors: u64,
    /// Requests whose decision outlasted Envoy's timeout (the failure mode decided them).
    pub envoy_timeouts: u64,
}

/// How fast the simulation itself ran (real time).
#[derive(Debug, Serialize)]
pub struct Speed {
    pub decisions: u64,
    pub wall_s: f64,
    pub decisions_per_s: f64,
}

/// With `regions:`: each region's requests, and the global store's calls.
#[derive(Debug, Serialize)]
pub struct RegionsReport {
    pub regions: Vec<RegionReport>,
    /// Calls the global store ran (heartbeats, demand, leaves), per second.
    pub global_store_calls_per_s: Calls,
}

/// One region's requests (every limit's: a request is admitted when all its limits are).
#[derive(Debug, Serialize)]
pub struct RegionReport {
    pub name: String,
    pub offered: u64,
    pub admitted: u64,
    /// Admitted per virtual second.
    pub admitted_per_s: Vec<u64>,
}

/// What `tollgate simulate --json` prints.
#[derive(Debug, Serialize)]
pub struct Report {
    pub scenario: String,
    pub seed: u64,
    pub duration_s: u64,
    pub total: Total,
    pub classes: Vec<ClassReport>,
    /// With `regions:` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub regions: Option<RegionsReport>,
    pub series: Vec<Row>,
    pub run: Speed,
}

impl Counts {
    /// The report, with the store's scripts per second per node and per class
    /// (`[node][second]`, `[class][second]`), and with regions their names and the global
    /// store's calls per second.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn report(
        mut self,
        scenario: String,
        seed: u64,
        duration_s: u64,
        calls: &[Vec<u64>],
        class_calls: &[Vec<u64>],
        regions: Option<(&[String], Vec<u64>)>,
        speed: Speed,
    ) -> Report {
        let seconds = duration_s as usize;
        for (t, row) in self.rows.iter_mut().enumerate() {
            row.store_calls = calls.iter().map(|n| n.get(t).copied().unwrap_or(0)).sum();
        }
        let per_second = |n: &[u64]| Calls {
            mean: round(
                n.iter().take(seconds).sum::<u64>() as f64 / duration_s.max(1) as f64,
                1,
            ),
            max: n.iter().take(seconds).copied().max().unwrap_or(0),
        };
        let per_node: Vec<Calls> = calls.iter().map(|n| per_second(n)).collect();
        // The run ended: the windows still open close as they are.
        for (b, bucket) in self.buckets.iter_mut().enumerate() {
            for closed in bucket.windows.close_all(b) {
                self.classes[bucket.class].windows.add(closed);
            }
        }
        let mut keys = vec![String::new(); self.buckets.len()];
        for (key, &b) in &self.bucket_ids {
            keys[b] = key.clone();
        }
        let key = |b: usize| keys.get(b).cloned().unwrap_or_default();
        let mut all_windows = Figures::new();
        for c in &self.classes {
            all_windows.merge(&c.windows);
        }
        let all: Vec<&BucketCount> = self.buckets.iter().collect();
        let whole = errors(&all);
        let classes = self
            .classes
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mine: Vec<&BucketCount> =
                    self.buckets.iter().filter(|b| b.class == i).collect();
                let e = errors(&mine);
                ClassReport {
                    class: c.name.to_string(),
                    buckets: mine.len(),
                    offered: e.offered,
                    admitted: e.admitted,
                    ideal: e.ideal,
                    over_admitted_pct: e.over_pct,
                    false_rejected_pct: e.under_pct,
                    over_admitted_hits: e.over,
                    false_rejected_hits: e.under,
                    store_calls_per_s: per_second(
                        class_calls.get(i).map(Vec::as_slice).unwrap_or_default(),
                    ),
                    latency_ms: latency(&c.latency),
                    fallback_decisions: c.fallback,
                    windows: c.windows.report(&key),
                }
            })
            .collect();
        let regions = regions.map(|(names, global_calls)| RegionsReport {
            regions: names
                .iter()
                .zip(&self.regions)
                .map(|(name, r)| RegionReport {
                    name: name.clone(),
                    offered: r.offered.iter().sum(),
                    admitted: r.admitted.iter().sum(),
                    admitted_per_s: r.admitted.clone(),
                })
                .collect(),
            global_store_calls_per_s: per_second(&global_calls),
        });
        Report {
            scenario,
            seed,
            duration_s,
            regions,
            total: Total {
                offered: self.offered,
                admitted: self.admitted,
                ideal: self.ideal,
                over_admitted_pct: whole.over_pct,
                false_rejected_pct: whole.under_pct,
                over_admitted_hits: whole.over,
                false_rejected_hits: whole.under,
                windows: all_windows.report(&key),
                worst_second: worst_seconds(&self.rows),
                store_calls_per_s: StoreCalls {
                    mean: round(
                        self.rows.iter().map(|r| r.store_calls).sum::<u64>() as f64
                            / duration_s.max(1) as f64,
                        1,
                    ),
                    max: self.rows.iter().map(|r| r.store_calls).max().unwrap_or(0),
                    per_node,
                },
                latency_ms: latency(&self.latency),
                fallback_decisions: self.fallback,
                errors: self.errors,
                envoy_timeouts: self.envoy_timeouts,
            },
            classes,
            series: self.rows,
            run: speed,
        }
    }
}

/// Two lines: the windows over the ideal and under it, with the worst of each and when.
fn windows_text(indent: &str, w: &WindowReport) -> String {
    let side = |name: &str, s: &super::windows::SideReport, sign: char| {
        format!(
            "{indent}windows {name}: {:.3} % of {} (p99 {:.1} % of the limit, {} hits in all){}\n",
            s.windows_pct,
            w.windows,
            s.p99_pct,
            s.hits,
            match &s.worst {
                Some(worst) => format!("; worst {}", worst.text(sign)),
                None => String::new(),
            }
        )
    };
    side("over", &w.over, '+') + &side("under", &w.under, '-')
}

/// The seconds of the run furthest over and under the ideal, in requests.
fn worst_seconds(rows: &[Row]) -> WorstSeconds {
    let second = |r: &Row, requests: u64| Second {
        t_s: r.t_s,
        admitted: r.admitted,
        ideal: r.ideal,
        requests,
        pct: round(100.0 * requests as f64 / r.ideal.max(1) as f64, 3),
    };
    let worst = |off: &dyn Fn(&Row) -> u64| {
        rows.iter()
            .filter(|r| off(r) > 0)
            .max_by_key(|r| (off(r) * 1_000_000 / r.ideal.max(1), off(r)))
            .map(|r| second(r, off(r)))
    };
    WorstSeconds {
        over: worst(&|r| r.admitted.saturating_sub(r.ideal)),
        under: worst(&|r| r.ideal.saturating_sub(r.admitted)),
    }
}

impl Report {
    /// The series as CSV, one row per virtual second.
    pub fn csv(&self) -> String {
        let mut out = String::from(
            "t_s,offered,admitted,ideal,store_calls,fallback,replicas,replicas_believed,envoy_timeouts\n",
        );
        for r in &self.series {
            out.push_str(&format!(
                "{},{},{},{},{},{},{},{},{}\n",
                r.t_s,
                r.offered,
                r.admitted,
                r.ideal,
                r.store_calls,
                r.fallback,
                r.replicas,
                r.replicas_believed,
                r.envoy_timeouts
            ));
        }
        out
    }

    /// A few lines for a person at a terminal: the whole-run totals, then per window of each
    /// limit's length the worst window over and under the ideal and when, the worst seconds,
    /// and the same per class.
    pub fn text(&self) -> String {
        let t = &self.total;
        let mut out = format!(
            "{}: {} s virtual, seed {}\n  offered {}  admitted {}  ideal {}  whole-run totals: over-admitted {:.3} %  falsely rejected {:.3} %\n  store calls/s mean {} max {}  decision latency p50 {} ms p99 {} ms p99.9 {} ms  fallback decisions {}  errors {}  Envoy timeouts {}\n",
            self.scenario,
            self.duration_s,
            self.seed,
            t.offered,
            t.admitted,
            t.ideal,
            t.over_admitted_pct,
            t.false_rejected_pct,
            t.store_calls_per_s.mean,
            t.store_calls_per_s.max,
            t.latency_ms.p50,
            t.latency_ms.p99,
            t.latency_ms.p999,
            t.fallback_decisions,
            t.errors,
            t.envoy_timeouts,
        );
        out.push_str(&windows_text("  ", &t.windows));
        let seconds = |name: &str, s: &Option<Second>, sign: char| match s {
            Some(s) => format!(
                "{name} {} s (admitted {}, ideal {}: {sign}{} requests, {:.1} %)",
                s.t_s, s.admitted, s.ideal, s.requests, s.pct
            ),
            None => format!("{name} none"),
        };
        out.push_str(&format!(
            "  worst seconds: {}; {}\n",
            seconds("over", &t.worst_second.over, '+'),
            seconds("under", &t.worst_second.under, '-'),
        ));
        for c in &self.classes {
            out.push_str(&format!(
                "  class {}: {} buckets, offered {} admitted {} ideal {} hits, whole-run over {:.3} %, false rejections {:.3} %, p99 {} ms\n",
                c.class,
                c.buckets,
                c.offered,
                c.admitted,
                c.ideal,
                c.over_admitted_pct,
                c.false_rejected_pct,
                c.latency_ms.p99
            ));
            if self.classes.len() > 1 {
                out.push_str(&windows_text("    ", &c.windows));
            }
        }
        if let Some(r) = &self.regions {
            let each: Vec<String> = r
                .regions
                .iter()
                .map(|r| format!("{} offered {} admitted {}", r.name, r.offered, r.admitted))
                .collect();
            out.push_str(&format!(
                "  regions: {}; global store calls/s mean {} max {}\n",
                each.join(", "),
                r.global_store_calls_per_s.mean,
                r.global_store_calls_per_s.max
            ));
        }
        out.push_str(&format!(
            "  ran {} decisions in {:.1} s ({:.0} decisions/s)\n",
            self.run.decisions, self.run.wall_s, self.run.decisions_per_s
        ));
        out
    }
}
