//! The axes: how far each runs, where the ticks go, and the grid, axis lines, tick labels
//! and axis titles drawn from them.
//!
//! Flow: [`x_extent`] and [`y_extent`] read the chart's data (and markers) into the
//! [`Frame`]'s maxima → [`nice_ticks`] picks round tick values from 0 to each maximum →
//! [`draw_axes`] draws the grid under everything, then the axis lines and labels.

use std::fmt::Write as _;

use super::text::{escape, fmt_compact};
use super::{BOTTOM, Chart, Frame, GRID, INK, LEFT, PLOT_H, PLOT_W, TOP, finite_points};

pub(super) fn x_extent(chart: &Chart) -> f64 {
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

pub(super) fn y_extent(chart: &Chart) -> f64 {
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

pub(super) fn draw_axes(out: &mut String, chart: &Chart, frame: Frame) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
