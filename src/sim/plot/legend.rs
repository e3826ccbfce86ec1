//! The legend under the plot: a swatch (dashed as its line is) and the name of each series,
//! in rows that wrap when full.
//!
//! Flow: [`legend_layout`] places the entries first, because the rows it needs set the
//! picture's height; [`draw_legend`] then draws them where it placed them.

use std::fmt::Write as _;

use super::text::{escape, text_width};
use super::{DASH, INK, LEFT, LEGEND_ROW_H, LEGEND_SWATCH, LEGEND_Y, RIGHT, Series, WIDTH};

/// Left edge and row of each legend entry, wrapping when a row is full.
pub(super) fn legend_layout(series: &[Series]) -> Vec<(f64, usize)> {
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

pub(super) fn draw_legend(out: &mut String, series: &[Series], layout: &[(f64, usize)]) {
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
