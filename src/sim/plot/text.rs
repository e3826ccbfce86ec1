//! Text in the SVG: escaping for element content and attributes, a rough width for laying
//! labels out without font metrics, and the compact numbers of tick labels.
//!
//! Every label a layer writes passes through [`escape`]; the axes format their ticks with
//! [`fmt_compact`]; the markers and the legend measure their labels with [`text_width`].

/// A tick label: three significant digits at most, with k/M/G/T suffixes
/// (20000 → "20k", 1500000 → "1.5M", 0.25 → "0.25").
pub(super) fn fmt_compact(v: f64) -> String {
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
    // Same reason as `axes::scale`: never multiply by an inexact 10^-k.
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
pub(super) fn escape(s: &str) -> String {
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
pub(super) fn text_width(s: &str, font_size: f64) -> f64 {
    s.chars().count() as f64 * font_size * 0.6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_control_characters() {
        assert_eq!(escape("a\u{0}b\nc\u{1b}"), "ab c");
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
}
