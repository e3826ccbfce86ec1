//! The pictures of a run (`--out DIR`): which charts, with which series and markers, from the
//! scenario and its report.
//!
//! Flow: the scenario's faults and fleet changes become markers (and, on the admitted picture,
//! the worst window and the worst second over the ideal) → each chart takes its
//! series from the report's per-second rows → [`write_out`](super::write_out) draws each with
//! [`plot::svg`] into its file.

use super::report::{self, Report};
use super::{Scenario, plot};

/// The descriptor part of a bucket key, for a label: `edge|tenant=t2` of
/// `tollgate:{edge|tenant=t2|tb:1000:1000}` (the key as it is when it has no such part).
fn descriptor(key: &str) -> &str {
    let inner = match (key.find('{'), key.rfind('}')) {
        (Some(a), Some(b)) if a < b => &key[a + 1..b],
        _ => return key,
    };
    match inner.rfind('|') {
        Some(i) if inner[i + 1..].contains(':') => &inner[..i],
        _ => inner,
    }
}

/// The four pictures: admitted against the ideal, store calls, the fallback's share (and the
/// share Envoy gave up on), the replica count.
pub(super) fn charts(scenario: &Scenario, report: &Report) -> Vec<(&'static str, plot::Chart)> {
    let mut markers: Vec<plot::Marker> = scenario
        .store
        .faults
        .iter()
        .map(|f| plot::Marker {
            at_s: f.at_s,
            until_s: Some(f.at_s + f.for_s),
            label: match f.node {
                Some(n) => format!("{} (node {n})", f.kind.name()),
                None => format!("store {}", f.kind.name()),
            },
        })
        .collect();
    let mut size = scenario.replicas.start;
    for &(at_s, to) in &scenario.replicas.changes {
        markers.push(plot::Marker {
            at_s,
            until_s: None,
            label: format!("{size} → {to} replicas"),
        });
        size = to;
    }
    // The admitted picture also marks where the fleet was furthest over the ideal: the worst
    // window of a limit's length (one bucket) and the worst second (the whole fleet).
    let mut worst = markers.clone();
    if let Some(w) = &report.total.windows.over.worst {
        worst.push(plot::Marker {
            at_s: w.from_s,
            until_s: Some(w.to_s),
            label: format!(
                "worst window: +{:.1} % of the limit ({})",
                w.pct,
                descriptor(&w.bucket)
            ),
        });
    }
    if let Some(s) = &report.total.worst_second.over {
        worst.push(plot::Marker {
            at_s: s.t_s as f64 + 0.5,
            until_s: None,
            label: format!("worst second: +{:.1} %", s.pct),
        });
    }
    let points = |f: &dyn Fn(&report::Row) -> f64| -> Vec<(f64, f64)> {
        report
            .series
            .iter()
            .map(|r| (r.t_s as f64 + 0.5, f(r)))
            .collect()
    };
    let series =
        |name: &str, color: &'static str, dashed: bool, f: &dyn Fn(&report::Row) -> f64| {
            plot::Series {
                name: name.to_string(),
                color,
                points: points(f),
                dashed,
            }
        };
    let capacity = scenario.store.ops_per_s * f64::from(scenario.store.nodes);
    vec![
        (
            "admitted.svg",
            plot::Chart {
                title: "Admitted per second against one exact bucket (ideal)".into(),
                x_label: "virtual time (s)".into(),
                y_label: "requests / s".into(),
                series: vec![
                    series("offered", "#9e9e9e", false, &|r| r.offered as f64),
                    series("ideal (one exact bucket)", "#2ca02c", true, &|r| {
                        r.ideal as f64
                    }),
                    series("admitted by the fleet", "#1f77b4", false, &|r| {
                        r.admitted as f64
                    }),
                ],
                markers: worst,
                y_max: None,
            },
        ),
        (
            "store_calls.svg",
            plot::Chart {
                title: "Store script calls per second (all nodes)".into(),
                x_label: "virtual time (s)".into(),
                y_label: "calls / s".into(),
                series: vec![
                    series("store calls", "#ff7f0e", false, &|r| r.store_calls as f64),
                    series("capacity (ops_per_s × nodes)", "#d62728", true, &|_| {
                        capacity
                    }),
                ],
                markers: markers.clone(),
                y_max: None,
            },
        ),
        (
            "fallback.svg",
            plot::Chart {
                title: "Share of decisions made by the fallback, and by Envoy's failure mode"
                    .into(),
                x_label: "virtual time (s)".into(),
                y_label: "share of requests".into(),
                series: vec![
                    series("fallback share", "#d62728", false, &|r| {
                        share(r.fallback, r.offered)
                    }),
                    series("Envoy timed out (failure mode)", "#8c564b", false, &|r| {
                        share(r.envoy_timeouts, r.offered)
                    }),
                ],
                markers: markers.clone(),
                y_max: Some(1.05),
            },
        ),
        (
            "replicas.svg",
            plot::Chart {
                title: "Replicas: live, and the count the fallback divides by (mean)".into(),
                x_label: "virtual time (s)".into(),
                y_label: "replicas".into(),
                series: vec![
                    series("live", "#1f77b4", true, &|r| r.replicas as f64),
                    series("believed (membership count)", "#9467bd", false, &|r| {
                        r.replicas_believed
                    }),
                ],
                markers,
                y_max: None,
            },
        ),
    ]
}

/// `part` of `whole`, 0 when there is no whole.
fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_label_names_the_descriptor_not_the_whole_key() {
        assert_eq!(
            super::descriptor("tollgate:{edge|tenant=t2|tb:1000:1000}"),
            "edge|tenant=t2"
        );
        assert_eq!(super::descriptor("plain"), "plain");
        assert_eq!(super::descriptor("p:{a|b=c}"), "a|b=c");
    }
}
