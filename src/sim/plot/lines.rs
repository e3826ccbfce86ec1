//! The series: one polyline each (a single point as a dot), clipped to the plot.
//!
//! Flow: a series' finite points → thinned to two per pixel column when there are more
//! ([`downsample`], which keeps the spikes) → pixels through the [`Frame`] → one
//! `<polyline>`, repeated pixels dropped.

use std::fmt::Write as _;

use super::text::escape;
use super::{CLIP_ID, DASH, Frame, PLOT_W, Series, finite_points};

/// Draws every series that has a finite point; returns how many did.
pub(super) fn draw_series(out: &mut String, series: &[Series], frame: Frame) -> usize {
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
pub(super) fn downsample(points: &[(f64, f64)], x_max: f64, columns: usize) -> Vec<(f64, f64)> {
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
