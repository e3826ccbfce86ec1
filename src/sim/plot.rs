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

use std::fmt::Write as _;

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

fn x_extent(chart: &Chart) -> f64 {
    let data = chart.series.iter().flat_map(finite_points).map(|(x, _)| x);
    let marks = chart
        .markers
        .iter()
        .flat_map(|m| [Some(m.at_s), m.until_s])
        .flatten()
        .filter(|v| v.is_finite());
    let max = data.chain(marks).fold(1.0_f64, f64::max);
    // Beyond this, tick arithmetic would overflow; such a chart is meaningless anyway.
    max.min(1e300)
}

fn y_extent(chart: &Chart) -> f64 {
    if let Some(v) = chart.y_max
        && v.is_finite()
        && v > 1e-200
    {
        return v.min(1e300);
    }
    let max = chart
        .series
        .iter()
        .flat_map(finite_points)
        .map(|(_, y)| y)
        .fold(0.0_f64, f64::max);
    (max.min(1e300) * 1.1).max(1.0)
}

/// `v × 10^exp`, dividing for negative exponents because `10^-k` is inexact in binary
/// and `3 × 0.1` would print as 0.30000000000000004.
fn scale(v: f64, exp: i32) -> f64 {
    if exp >= 0 {
        v * 10f64.powi(exp)
    } else {
        v / 10f64.powi(-exp)
    }
}

/// Tick values for an axis from 0 to `top`: 4–6 multiples of a 1/2/5 × 10^k step, none
/// above `top`.
///
/// The axis ends at `top` exactly (the x axis at the last sample, a share at 1), and for
/// some ends no 1/2/5 step gives 4–6 ticks (0..14: step 2 gives 8, step 5 gives 3); then
/// 2.5 × 10^k is used, which always does.
fn nice_ticks(top: f64) -> Vec<f64> {
    if !(top.is_finite() && top > 0.0) {
        return vec![0.0];
    }
    let e0 = (top / 5.0).log10().floor() as i32;
    let last_index = |m: f64, e: i32| {
        let step = scale(m, e);
        // The epsilon keeps a tick that lands on `top` (1.0 / 0.2) despite rounding.
        (step.is_finite() && step > 0.0).then(|| (top / step * (1.0 + 1e-9)).floor())
    };
    for mantissas in [&[1.0, 2.0, 5.0][..], &[2.5][..]] {
        for e in e0 - 1..=e0 + 1 {
            for &m in mantissas {
                if let Some(n) = last_index(m, e)
                    && (3.0..=5.0).contains(&n)
                {
                    return (0..=n as u32).map(|k| scale(f64::from(k) * m, e)).collect();
                }
            }
        }
    }
    // Unreachable for normal numbers; still draw a usable axis.
    vec![0.0, top]
}

/// A tick label: three significant digits at most, with k/M/G/T suffixes
/// (20000 → "20k", 1500000 → "1.5M", 0.25 → "0.25").
fn fmt_compact(v: f64) -> String {
    if !v.is_finite() {
        return "?".to_string();
    }
    if v == 0.0 {
        return "0".to_string();
    }
    // Rounding first, so 999_900 becomes "1M" rather than "1000k".
    let r = round_sig(v, 3);
    let a = r.abs();
    if !(1e-4..1e15).contains(&a) {
        let s = format!("{r:.2e}");
        return match s.split_once('e') {
            Some((mantissa, exp)) => format!("{}e{exp}", trim_zeros(mantissa)),
            None => s,
        };
    }
    let (scaled, suffix) = if a >= 1e12 {
        (r / 1e12, "T")
    } else if a >= 1e9 {
        (r / 1e9, "G")
    } else if a >= 1e6 {
        (r / 1e6, "M")
    } else if a >= 1e3 {
        (r / 1e3, "k")
    } else {
        (r, "")
    };
    let magnitude = scaled.abs().log10().floor() as i32;
    let decimals = (2 - magnitude).clamp(0, 8) as usize;
    format!("{}{suffix}", trim_zeros(&format!("{scaled:.decimals$}")))
}

fn round_sig(v: f64, digits: i32) -> f64 {
    let magnitude = v.abs().log10().floor() as i32;
    let exp = digits - 1 - magnitude;
    // Same reason as `scale`: never multiply by an inexact 10^-k.
    let r = if exp >= 0 {
        let f = 10f64.powi(exp);
        (v * f).round() / f
    } else {
        let f = 10f64.powi(-exp);
        (v / f).round() * f
    };
    if r.is_finite() { r } else { v }
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// Text for element content and attribute values. Labels are single-line, and XML 1.0
/// forbids most control characters outright, so those are dropped rather than escaped.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(' '),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// A rough width for laying out text: no font metrics without a renderer, and
/// sans-serif averages a little over half the font size per character.
fn text_width(s: &str, font_size: f64) -> f64 {
    s.chars().count() as f64 * font_size * 0.6
}

fn draw_axes(out: &mut String, chart: &Chart, frame: Frame) {
    let right = LEFT + PLOT_W;
    let _ = writeln!(out, r#"<g stroke="{GRID}" stroke-width="1">"#);
    let y_ticks = nice_ticks(frame.y_max);
    let x_ticks = nice_ticks(frame.x_max);
    for &t in &y_ticks {
        let y = frame.py(t);
        let _ = writeln!(
            out,
            r#"<line x1="{LEFT}" y1="{y:.1}" x2="{right}" y2="{y:.1}"/>"#
        );
    }
    for &t in &x_ticks {
        let x = frame.px(t);
        let _ = writeln!(
            out,
            r#"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{BOTTOM}"/>"#
        );
    }
    out.push_str("</g>\n");

    let _ = writeln!(
        out,
        r#"<g stroke="{INK}" stroke-width="1"><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{BOTTOM}"/><line x1="{LEFT}" y1="{BOTTOM}" x2="{right}" y2="{BOTTOM}"/></g>"#
    );

    let _ = writeln!(out, r#"<g font-size="11" fill="{INK}">"#);
    for &t in &y_ticks {
        let y = frame.py(t);
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{y:.1}" dy="0.32em" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            escape(&fmt_compact(t))
        );
    }
    for &t in &x_ticks {
        let x = frame.px(t);
        let _ = writeln!(
            out,
            r#"<text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
            BOTTOM + 16.0,
            escape(&fmt_compact(t))
        );
    }
    out.push_str("</g>\n");

    let _ = writeln!(
        out,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        LEFT + PLOT_W / 2.0,
        BOTTOM + 36.0,
        escape(&chart.x_label)
    );
    let (cx, cy) = (18.0, TOP + PLOT_H / 2.0);
    let _ = writeln!(
        out,
        r#"<text x="{cx}" y="{cy}" transform="rotate(-90 {cx} {cy})" text-anchor="middle">{}</text>"#,
        escape(&chart.y_label)
    );
}

/// Where a marker label goes: right of `start_x` if it fits, else ending at `end_x`, so
/// labels near the right edge turn inward instead of being cut off. The clip path
/// catches whatever still does not fit (a label wider than the plot).
fn place_label(start_x: f64, end_x: f64, width: f64) -> (f64, &'static str) {
    if start_x + width <= LEFT + PLOT_W || end_x - width < LEFT {
        (start_x.max(LEFT + 2.0), "start")
    } else {
        (end_x, "end")
    }
}

fn draw_markers(out: &mut String, markers: &[Marker], frame: Frame) {
    if markers.is_empty() {
        return;
    }
    let right = LEFT + PLOT_W;
    let _ = writeln!(out, r#"<g clip-path="url(#{CLIP_ID})" font-size="11">"#);
    let mut shown = 0usize;
    for m in markers {
        if !m.at_s.is_finite() {
            continue;
        }
        let label = escape(&m.label);
        let width = text_width(&m.label, 11.0);
        let label_y = TOP + 12.0 + (shown % MARKER_LABEL_ROWS) as f64 * 13.0;
        match m.until_s {
            Some(until) => {
                let end = if until == f64::INFINITY {
                    frame.x_max
                } else if until.is_finite() {
                    until
                } else {
                    continue;
                };
                let x0 = frame.px(m.at_s.min(end)).max(LEFT);
                let x1 = frame.px(m.at_s.max(end)).min(right);
                if x1 < x0 {
                    continue;
                }
                // A zero-length fault still happened; keep it visible.
                let w = (x1 - x0).max(1.0);
                let _ = writeln!(
                    out,
                    r#"<rect x="{x0:.1}" y="{TOP}" width="{w:.1}" height="{PLOT_H}" fill="{SPAN_FILL}" fill-opacity="0.12"/>"#
                );
                let (lx, anchor) = place_label(x0 + 4.0, x1 - 4.0, width);
                let _ = writeln!(
                    out,
                    r##"<text x="{lx:.1}" y="{label_y:.1}" text-anchor="{anchor}" fill="#a01c1c">{label}</text>"##
                );
            }
            None => {
                let x = frame.px(m.at_s);
                let _ = writeln!(
                    out,
                    r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{BOTTOM}" stroke="#555" stroke-width="1" stroke-dasharray="{DASH}"/>"##
                );
                let (lx, anchor) = place_label(x + 4.0, x - 4.0, width);
                let _ = writeln!(
                    out,
                    r##"<text x="{lx:.1}" y="{label_y:.1}" text-anchor="{anchor}" fill="#555">{label}</text>"##
                );
            }
        }
        shown += 1;
    }
    out.push_str("</g>\n");
}

/// Draws every series that has a finite point; returns how many did.
fn draw_series(out: &mut String, series: &[Series], frame: Frame) -> usize {
    let columns = PLOT_W as usize;
    let mut drawn = 0;
    let _ = writeln!(
        out,
        r#"<g clip-path="url(#{CLIP_ID})" fill="none" stroke-width="1.5" stroke-linejoin="round">"#
    );
    for s in series {
        let mut points: Vec<(f64, f64)> = finite_points(s).collect();
        if points.len() > columns {
            points = downsample(&points, frame.x_max, columns);
        }
        let color = escape(s.color);
        match points.as_slice() {
            [] => continue,
            // A polyline of one point draws nothing.
            [(x, y)] => {
                let _ = writeln!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{color}"/>"#,
                    frame.px(*x),
                    frame.py(*y)
                );
            }
            _ => {
                let dash = if s.dashed {
                    format!(r#" stroke-dasharray="{DASH}""#)
                } else {
                    String::new()
                };
                let _ = write!(out, r#"<polyline stroke="{color}"{dash} points=""#);
                let mut prev = String::new();
                let mut first = true;
                for &(x, y) in &points {
                    let p = format!("{:.1},{:.1}", frame.px(x), frame.py(y));
                    // Flat stretches round to the same pixel; repeating it only adds bytes.
                    if p == prev {
                        continue;
                    }
                    if !first {
                        out.push(' ');
                    }
                    out.push_str(&p);
                    prev = p;
                    first = false;
                }
                out.push_str("\"/>\n");
            }
        }
        drawn += 1;
    }
    out.push_str("</g>\n");
    drawn
}

/// Thins a long series to at most two points per pixel column: the lowest and the
/// highest, in their original order. Averaging would flatten exactly the spikes a reader
/// is looking for; min/max keeps the envelope the full series would have drawn.
fn downsample(points: &[(f64, f64)], x_max: f64, columns: usize) -> Vec<(f64, f64)> {
    type Extreme = (usize, (f64, f64));
    fn flush(out: &mut Vec<(f64, f64)>, lo: Extreme, hi: Extreme) {
        match lo.0.cmp(&hi.0) {
            std::cmp::Ordering::Equal => out.push(lo.1),
            std::cmp::Ordering::Less => out.extend([lo.1, hi.1]),
            std::cmp::Ordering::Greater => out.extend([hi.1, lo.1]),
        }
    }
    let columns = columns.max(1);
    let column_of = |x: f64| {
        let c = (x / x_max * columns as f64).floor().max(0.0) as usize;
        c.min(columns - 1)
    };
    let mut out = Vec::with_capacity(2 * columns);
    let mut current: Option<(usize, Extreme, Extreme)> = None;
    for (i, &p) in points.iter().enumerate() {
        let col = column_of(p.0);
        match current.as_mut() {
            Some((c, lo, hi)) if *c == col => {
                if p.1 < lo.1.1 {
                    *lo = (i, p);
                }
                if p.1 > hi.1.1 {
                    *hi = (i, p);
                }
            }
            _ => {
                if let Some((_, lo, hi)) = current {
                    flush(&mut out, lo, hi);
                }
                current = Some((col, (i, p), (i, p)));
            }
        }
    }
    if let Some((_, lo, hi)) = current {
        flush(&mut out, lo, hi);
    }
    out
}

/// Left edge and row of each legend entry, wrapping when a row is full.
fn legend_layout(series: &[Series]) -> Vec<(f64, usize)> {
    let mut placed = Vec::with_capacity(series.len());
    let (mut x, mut row) = (LEFT, 0usize);
    for s in series {
        let width = LEGEND_SWATCH + 6.0 + text_width(&s.name, 12.0) + 20.0;
        if x > LEFT && x + width > WIDTH - RIGHT {
            x = LEFT;
            row += 1;
        }
        placed.push((x, row));
        x += width;
    }
    placed
}

fn draw_legend(out: &mut String, series: &[Series], layout: &[(f64, usize)]) {
    if series.is_empty() {
        return;
    }
    out.push_str("<g>\n");
    for (s, &(x, row)) in series.iter().zip(layout) {
        let y = LEGEND_Y + row as f64 * LEGEND_ROW_H;
        let dash = if s.dashed {
            format!(r#" stroke-dasharray="{DASH}""#)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            r#"<line x1="{x:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-width="2"{dash}/>"#,
            x + LEGEND_SWATCH,
            escape(s.color)
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{y:.1}" dy="0.32em" fill="{INK}">{}</text>"#,
            x + LEGEND_SWATCH + 6.0,
            escape(&s.name)
        );
    }
    out.push_str("</g>\n");
}

#[cfg(test)]
mod tests {
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
    fn drops_control_characters() {
        assert_eq!(escape("a\u{0}b\nc\u{1b}"), "ab c");
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
    fn nice_ticks_for_some_ranges() {
        assert_eq!(
            nice_ticks(23_000.0),
            vec![0.0, 5_000.0, 10_000.0, 15_000.0, 20_000.0]
        );
        assert_eq!(nice_ticks(1.0), vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0]);
        assert_eq!(nice_ticks(1.1), vec![0.0, 0.2, 0.4, 0.6, 0.8, 1.0]);
        assert_eq!(nice_ticks(60.0), vec![0.0, 20.0, 40.0, 60.0]);
        assert_eq!(nice_ticks(300.0), vec![0.0, 100.0, 200.0, 300.0]);
        assert_eq!(nice_ticks(14.0), vec![0.0, 2.5, 5.0, 7.5, 10.0, 12.5]);
        assert_eq!(nice_ticks(0.05), vec![0.0, 0.01, 0.02, 0.03, 0.04, 0.05]);
        assert_eq!(nice_ticks(f64::NAN), vec![0.0]);
    }

    #[test]
    fn nice_ticks_always_4_to_6_within_range() {
        let mut top = 1e-6;
        while top < 1e12 {
            let ticks = nice_ticks(top);
            assert!((4..=6).contains(&ticks.len()), "{top}: {ticks:?}");
            assert_eq!(ticks[0], 0.0);
            let step = ticks[1];
            assert!(
                ticks.iter().all(|&t| t <= top * (1.0 + 1e-9)),
                "{top}: {ticks:?}"
            );
            let mantissa = step / 10f64.powf(step.log10().floor());
            assert!(
                [1.0, 2.0, 2.5, 5.0]
                    .iter()
                    .any(|m| (m - mantissa).abs() < 1e-9),
                "{top}: step {step}"
            );
            top *= 1.137;
        }
    }

    #[test]
    fn compact_numbers() {
        let cases = [
            (0.0, "0"),
            (20_000.0, "20k"),
            (1_500_000.0, "1.5M"),
            (0.25, "0.25"),
            (0.6000000000000001, "0.6"),
            (1_000.0, "1k"),
            (1_250.0, "1.25k"),
            (999.9, "1k"),
            (999_900.0, "1M"),
            (12.5, "12.5"),
            (150.0, "150"),
            (-2_500.0, "-2.5k"),
            (3e9, "3G"),
            (0.0005, "0.0005"),
            (2e15, "2e15"),
            (f64::NAN, "?"),
        ];
        for (v, want) in cases {
            assert_eq!(fmt_compact(v), want, "{v}");
        }
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
