//! Line charts of a simulation run, as standalone SVG files.
//!
//! `tollgate simulate --out DIR` writes its time series (admitted requests/s against the
//! quota, store calls per second, fallback share) as pictures a person opens in a browser.
//! Everything goes through one function, [`svg`], from a [`Chart`] to an SVG document: a
//! title, axes with "nice" ticks and a light grid, axis labels, a legend, one polyline per
//! [`Series`], and each [`Marker`] as a shaded band (a fault window) or a dashed vertical
//! line (a scaling event).
//!
//! Only std is used: the picture is simple enough that a plotting crate would cost more
//! (build time, dependencies) than it saves. Output is deterministic for a given chart, so
//! a run's files can be compared byte for byte.
//!
//! Flow of [`svg`]: the chart's extents set a `Frame` (data → pixels, `axes.rs`) → the
//! axes and grid (`axes.rs`) → the markers, under the lines (`markers.rs`) → each series as
//! a polyline, thinned to the plot's width (`lines.rs`) → the legend (`legend.rs`). Here:
//! the chart's types, the page geometry every layer shares, and the frame; `text.rs` holds
//! the text primitives (escaping, rough widths, compact tick labels).

use std::fmt::Write as _;

mod axes;
mod legend;
mod lines;
mod markers;
mod text;

use axes::{draw_axes, x_extent, y_extent};
use legend::{draw_legend, legend_layout};
use lines::draw_series;
use markers::draw_markers;
use text::escape;

/// One line on a chart.
#[derive(Clone, Debug)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// CSS colour, e.g. `"#1f77b4"`.
    pub color: &'static str,
    /// `(x = seconds, y)`, x ascending; may be empty. Non-finite points are skipped.
    pub points: Vec<(f64, f64)>,
    /// Drawn dashed (e.g. the quota line), in the legend too.
    pub dashed: bool,
}

/// Something that happened: a span (a fault from `at_s` to `until_s`) drawn as a shaded
/// band, or an instant (a scaling event, `until_s` None) drawn as a vertical dashed line;
/// both labelled at the top.
#[derive(Clone, Debug)]
pub struct Marker {
    pub at_s: f64,
    /// End of a span; `Some(f64::INFINITY)` runs to the end of the x axis.
    pub until_s: Option<f64>,
    pub label: String,
}

#[derive(Clone, Debug)]
pub struct Chart {
    pub title: String,
    /// E.g. "virtual time (s)".
    pub x_label: String,
    /// E.g. "requests / s".
    pub y_label: String,
    pub series: Vec<Series>,
    pub markers: Vec<Marker>,
    /// Upper end of the y axis when the data should not set it (e.g. Some(1.0) for a
    /// share); None: from the data (max over all series, with ~10% headroom, at least 1).
    pub y_max: Option<f64>,
}

const WIDTH: f64 = 900.0;
/// Height with a one-row legend; each further legend row adds `LEGEND_ROW_H`.
const HEIGHT: f64 = 360.0;
const LEFT: f64 = 72.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 36.0;
const PLOT_W: f64 = WIDTH - LEFT - RIGHT;
const PLOT_H: f64 = 230.0;
const BOTTOM: f64 = TOP + PLOT_H;
const LEGEND_Y: f64 = BOTTOM + 60.0;
const LEGEND_ROW_H: f64 = 18.0;
const LEGEND_SWATCH: f64 = 24.0;
/// One id for every chart: each file is standalone, and if several are inlined into one
/// page the definitions are identical, so a clash is harmless.
const CLIP_ID: &str = "tollgate-plot-area";
const GRID: &str = "#e5e5e5";
const INK: &str = "#333";
const SPAN_FILL: &str = "#d62728";
const DASH: &str = "6 4";
/// Marker labels are staggered over this many rows so neighbouring events stay legible.
const MARKER_LABEL_ROWS: usize = 3;

/// The chart as a standalone SVG document, 900 wide and 360 high (taller only when the
/// legend needs more than one row).
pub fn svg(chart: &Chart) -> String {
    let frame = Frame {
        x_max: x_extent(chart),
        y_max: y_extent(chart),
    };
    let legend = legend_layout(&chart.series);
    let rows = legend.iter().map(|&(_, row)| row + 1).max().unwrap_or(1);
    let height = HEIGHT + (rows - 1) as f64 * LEGEND_ROW_H;

    let mut out = String::with_capacity(16 * 1024);
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#,
        w = WIDTH,
        h = height,
    );
    let title = escape(&chart.title);
    let _ = writeln!(out, "<title>{title}</title>");
    // Transparent SVGs are unreadable in dark-mode viewers.
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<defs><clipPath id="{CLIP_ID}"><rect x="{LEFT}" y="{TOP}" width="{PLOT_W}" height="{PLOT_H}"/></clipPath></defs>"#
    );
    let _ = writeln!(
        out,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{title}</text>"#,
        WIDTH / 2.0
    );

    draw_axes(&mut out, chart, frame);
    // Bands go under the lines so a fault never hides the data it explains.
    draw_markers(&mut out, &chart.markers, frame);
    let drawn = draw_series(&mut out, &chart.series, frame);
    if drawn == 0 {
        let _ = writeln!(
            out,
            r##"<text x="{}" y="{}" text-anchor="middle" font-size="14" fill="#888">no data</text>"##,
            LEFT + PLOT_W / 2.0,
            TOP + PLOT_H / 2.0
        );
    }
    draw_legend(&mut out, &chart.series, &legend);
    out.push_str("</svg>\n");
    out
}

/// Maps data to pixels. Both maxima are finite and positive.
#[derive(Clone, Copy, Debug)]
struct Frame {
    x_max: f64,
    y_max: f64,
}

impl Frame {
    fn px(self, x: f64) -> f64 {
        clamp_px(LEFT + x / self.x_max * PLOT_W)
    }

    fn py(self, y: f64) -> f64 {
        clamp_px(BOTTOM - y / self.y_max * PLOT_H)
    }
}

/// Points far outside the plot are clipped anyway; bounding them keeps a stray 1e300
/// from printing as a 300-digit coordinate, at the cost of a slope nobody can see.
fn clamp_px(v: f64) -> f64 {
    v.clamp(-10_000.0, 10_000.0)
}

fn finite_points(series: &Series) -> impl Iterator<Item = (f64, f64)> + '_ {
    series
        .points
        .iter()
        .copied()
        .filter(|(x, y)| x.is_finite() && y.is_finite())
}

#[cfg(test)]
mod tests {
    use super::lines::downsample;
    use super::*;

    fn series(name: &str, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.to_string(),
            color: "#1f77b4",
            points,
            dashed: false,
        }
    }

    fn chart(series: Vec<Series>, markers: Vec<Marker>) -> Chart {
        Chart {
            title: "admitted vs quota".to_string(),
            x_label: "virtual time (s)".to_string(),
            y_label: "requests / s".to_string(),
            series,
            markers,
            y_max: None,
        }
    }

    fn assert_document(doc: &str) {
        assert!(doc.starts_with("<svg"), "{doc}");
        assert!(doc.trim_end().ends_with("</svg>"), "{doc}");
        assert_eq!(doc.matches("<svg").count(), 1);
        assert_eq!(
            doc.matches("<g").count(),
            doc.matches("</g>").count(),
            "{doc}"
        );
        assert_eq!(doc.matches("<text").count(), doc.matches("</text>").count());
        assert!(!doc.contains("NaN") && !doc.contains("inf"), "{doc}");
    }

    /// The `points` attribute of every polyline, in order.
    fn polylines(doc: &str) -> Vec<&str> {
        doc.split("<polyline")
            .skip(1)
            .filter_map(|rest| {
                let start = rest.find("points=\"")? + "points=\"".len();
                let len = rest[start..].find('"')?;
                Some(&rest[start..start + len])
            })
            .collect()
    }

    #[test]
    fn draws_axes_lines_and_legend() {
        let admitted = series("admitted", (0..=60).map(|t| (t as f64, 900.0)).collect());
        let mut quota = series("quota", vec![(0.0, 1000.0), (60.0, 1000.0)]);
        quota.color = "#d62728";
        quota.dashed = true;
        let doc = svg(&chart(vec![admitted, quota], vec![]));
        assert_document(&doc);
        assert_eq!(doc.matches("<polyline").count(), 2);
        assert_eq!(polylines(&doc).len(), 2);
        assert!(doc.contains(">admitted</text>") && doc.contains(">quota</text>"));
        assert!(doc.contains(">virtual time (s)</text>") && doc.contains(">requests / s</text>"));
        // The quota line and its legend swatch are dashed, nothing else is.
        assert_eq!(
            doc.matches(r##"stroke="#d62728" stroke-dasharray"##)
                .count(),
            1
        );
        assert_eq!(
            doc.matches(r##"stroke="#d62728" stroke-width="2" stroke-dasharray"##)
                .count(),
            1
        );
        assert!(!doc.contains("no data"));
        // y axis from the data: 1000 with headroom, ticks 0..1k by 200.
        for label in [">200<", ">1k<", ">60<"] {
            assert!(doc.contains(label), "missing {label}");
        }
    }

    #[test]
    fn escapes_text() {
        let mut c = chart(
            vec![series("a<b & \"c\"", vec![(0.0, 1.0), (1.0, 2.0)])],
            vec![],
        );
        c.title = "x > y's".to_string();
        c.markers.push(Marker {
            at_s: 0.5,
            until_s: None,
            label: "<scale>".to_string(),
        });
        let doc = svg(&c);
        assert_document(&doc);
        assert!(doc.contains("a&lt;b &amp; &quot;c&quot;"), "{doc}");
        assert!(doc.contains("x &gt; y&apos;s"));
        assert!(doc.contains("&lt;scale&gt;"));
        assert!(!doc.contains("a<b") && !doc.contains("<scale>"));
    }

    #[test]
    fn skips_non_finite_values() {
        let s = series(
            "load",
            vec![
                (0.0, 1.0),
                (1.0, f64::NAN),
                (f64::INFINITY, 2.0),
                (2.0, f64::NEG_INFINITY),
                (f64::NAN, f64::NAN),
                (3.0, 4.0),
            ],
        );
        let markers = vec![
            Marker {
                at_s: f64::NAN,
                until_s: None,
                label: "lost".to_string(),
            },
            Marker {
                at_s: 1.0,
                until_s: Some(f64::NAN),
                label: "gone".to_string(),
            },
            Marker {
                at_s: 1.0,
                until_s: Some(f64::INFINITY),
                label: "outage".to_string(),
            },
        ];
        let mut c = chart(vec![s], markers);
        c.y_max = Some(f64::NAN);
        let doc = svg(&c);
        assert_document(&doc);
        let lines = polylines(&doc);
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].split(' ').count(), 2, "{}", lines[0]);
        assert!(!doc.contains("lost") && !doc.contains("gone"));
        // An open-ended fault runs to the end of the axis.
        assert!(doc.contains("outage"));
        assert!(
            doc.contains(&format!(r#"width="{:.1}""#, PLOT_W * 2.0 / 3.0)),
            "{doc}"
        );
    }

    #[test]
    fn no_data_still_draws_axes() {
        for series_list in [
            vec![],
            vec![
                series("empty", vec![]),
                series("nan", vec![(f64::NAN, 1.0)]),
            ],
        ] {
            let doc = svg(&chart(series_list, vec![]));
            assert_document(&doc);
            assert!(doc.contains("no data"));
            assert_eq!(doc.matches("<polyline").count(), 0);
            assert!(
                doc.contains(">0</text>") && doc.contains(">1</text>"),
                "{doc}"
            );
        }
    }

    #[test]
    fn single_point_is_visible() {
        let doc = svg(&chart(vec![series("one", vec![(5.0, 3.0)])], vec![]));
        assert_document(&doc);
        assert_eq!(doc.matches("<circle").count(), 1);
        assert!(!doc.contains("no data"));
    }

    #[test]
    fn downsampling_keeps_spikes() {
        let n = 100_000;
        let spike = 50_000;
        let points: Vec<(f64, f64)> = (0..n)
            .map(|i| {
                (
                    i as f64 * 0.01,
                    if i == spike {
                        50.0
                    } else if i == spike + 7 {
                        -3.0
                    } else {
                        1.0
                    },
                )
            })
            .collect();
        let c = chart(vec![series("store calls", points.clone())], vec![]);
        let doc = svg(&c);
        assert_document(&doc);
        let lines = polylines(&doc);
        assert_eq!(lines.len(), 1);
        let count = lines[0].split(' ').count();
        assert!(count <= 2 * PLOT_W as usize, "{count} points");
        assert!(doc.len() < 40_000, "{} bytes", doc.len());

        let frame = Frame {
            x_max: points[n - 1].0,
            y_max: 55.0,
        };
        let high = format!(",{:.1}", frame.py(50.0));
        assert!(lines[0].contains(&high), "spike {high} missing");

        // Directly: the lowest and highest point per column, in their original order.
        let thin = downsample(&points, frame.x_max, PLOT_W as usize);
        assert!(thin.len() <= 2 * PLOT_W as usize);
        let i = thin.iter().position(|p| p.1 == 50.0).expect("spike kept");
        assert_eq!(thin[i + 1].1, -3.0, "dip after spike kept, in order");
        assert!(
            thin.windows(2).all(|w| w[0].0 <= w[1].0),
            "x stays ascending"
        );
        assert_eq!(thin.first(), points.first());
    }

    #[test]
    fn short_series_are_not_thinned() {
        let points: Vec<(f64, f64)> = (0..300).map(|i| (i as f64, (i % 7) as f64)).collect();
        let doc = svg(&chart(vec![series("s", points)], vec![]));
        assert_eq!(polylines(&doc)[0].split(' ').count(), 300);
    }

    #[test]
    fn fixed_y_max_sets_the_axis() {
        let mut c = chart(
            vec![series("fallback share", vec![(0.0, 0.0), (10.0, 1.0)])],
            vec![],
        );
        c.y_max = Some(1.0);
        let doc = svg(&c);
        assert_document(&doc);
        let frame = Frame {
            x_max: 10.0,
            y_max: 1.0,
        };
        assert_eq!(
            polylines(&doc)[0],
            format!("{:.1},{:.1} {:.1},{:.1}", LEFT, BOTTOM, LEFT + PLOT_W, TOP)
        );
        assert_eq!(frame.py(1.0), TOP);
        assert!(doc.contains(">0.2</text>") && doc.contains(">1</text>"));
    }

    #[test]
    fn markers_are_drawn_and_labels_stay_inside() {
        let s = series("admitted", vec![(0.0, 1.0), (100.0, 1.0)]);
        let markers = vec![
            Marker {
                at_s: 20.0,
                until_s: Some(30.0),
                label: "redis down".to_string(),
            },
            Marker {
                at_s: 99.0,
                until_s: None,
                label: "scale to 4 replicas".to_string(),
            },
        ];
        let doc = svg(&chart(vec![s], markers));
        assert_document(&doc);
        assert_eq!(doc.matches(r#"fill-opacity="0.12""#).count(), 1);
        assert!(doc.contains("redis down") && doc.contains("scale to 4 replicas"));
        // The span's label starts inside the band.
        let frame = Frame {
            x_max: 100.0,
            y_max: 1.1,
        };
        assert!(doc.contains(&format!(
            r#"x="{:.1}" y="{:.1}" text-anchor="start""#,
            frame.px(20.0) + 4.0,
            TOP + 12.0
        )));
        // Near the right edge the instant's label turns inward.
        assert!(
            doc.contains(&format!(
                r#"x="{:.1}" y="{:.1}" text-anchor="end""#,
                frame.px(99.0) - 4.0,
                TOP + 25.0
            )),
            "{doc}"
        );
        // The x axis reaches the markers even when no data does.
        let doc = svg(&chart(
            vec![],
            vec![Marker {
                at_s: 500.0,
                until_s: None,
                label: "late".to_string(),
            }],
        ));
        assert!(doc.contains(">500</text>"), "{doc}");
    }

    #[test]
    fn legend_wraps_and_grows_the_picture() {
        let many: Vec<Series> = (0..12)
            .map(|i| series(&format!("replica number {i}"), vec![(0.0, 1.0), (1.0, 2.0)]))
            .collect();
        let doc = svg(&chart(many, vec![]));
        assert_document(&doc);
        assert!(!doc.contains(r#"height="360""#));
        let rows = legend_layout(&chart(vec![], vec![]).series);
        assert!(rows.is_empty());
        let one = svg(&chart(vec![series("a", vec![])], vec![]));
        assert!(one.contains(r#"height="360""#));
    }
}
