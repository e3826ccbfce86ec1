//! The markers: each fault window a shaded band, each scaling event a dashed vertical line,
//! both labelled along the top of the plot.
//!
//! Drawn before the series, so a band never hides the data it explains; labels are
//! staggered over a few rows, and turn inward near the right edge ([`place_label`]).

use std::fmt::Write as _;

use super::text::{escape, text_width};
use super::{
    BOTTOM, CLIP_ID, DASH, Frame, LEFT, MARKER_LABEL_ROWS, Marker, PLOT_H, PLOT_W, SPAN_FILL, TOP,
};

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

pub(super) fn draw_markers(out: &mut String, markers: &[Marker], frame: Frame) {
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
