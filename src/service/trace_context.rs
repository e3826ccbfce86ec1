//! The caller's trace context, so tollgate's `ShouldRateLimit` span sits inside the request's
//! trace instead of starting a trace of its own.
//!
//! Envoy's tracer injects its context into the rate-limit call's gRPC metadata: W3C
//! `traceparent` (+ `tracestate`) with the OpenTelemetry tracer, B3 (`x-b3-traceid`,
//! `x-b3-spanid`, `x-b3-sampled`, or the single `b3` header) with Zipkin. [`RemoteParent::from_headers`]
//! reads either from any header lookup (gRPC metadata, or the admin port's HTTP headers for
//! `/json`); the handler makes it the parent of its span when spans are exported. A malformed
//! header is ignored (the span is then a root, as before), never an error: tracing must not
//! change a rate-limit answer.
//!
//! Parsed by hand: the formats are short and fixed, and the parse is all the propagator crates
//! would add.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};

/// The span that called us, in another process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteParent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
    /// W3C `tracestate`, passed on unchanged (empty for B3 or when absent or malformed).
    pub trace_state: String,
}

impl RemoteParent {
    /// The parent named by `header` (a case-insensitive lookup of one header's value):
    /// `traceparent` first, then B3. `None` when neither is present and valid.
    pub fn from_headers<'a>(header: impl Fn(&str) -> Option<&'a str>) -> Option<RemoteParent> {
        if let Some(tp) = header("traceparent") {
            let mut parent = Self::parse_traceparent(tp)?;
            if let Some(ts) = header("tracestate") {
                parent.trace_state = ts.to_string();
            }
            return Some(parent);
        }
        if let Some(b3) = header("b3") {
            return Self::parse_b3_single(b3);
        }
        let trace_id = header("x-b3-traceid")?;
        let span_id = header("x-b3-spanid")?;
        let sampled = match (header("x-b3-flags"), header("x-b3-sampled")) {
            (Some("1"), _) => true,
            (_, Some(s)) => s == "1" || s.eq_ignore_ascii_case("true"),
            // No decision: we record (the sampler is parent-based, always on at the root).
            (_, None) => true,
        };
        Self::b3(trace_id, span_id, sampled)
    }

    /// `version-traceid-parentid-flags`, e.g. `00-4bf9…4736-00f0…02b7-01` (W3C Trace Context
    /// level 1). Version `ff` is invalid; a later version may append fields after a `-`.
    pub fn parse_traceparent(value: &str) -> Option<RemoteParent> {
        let v = value.trim().as_bytes();
        if v.len() < 55 || (v.len() > 55 && (v[..2] == *b"00" || v[55] != b'-')) {
            return None;
        }
        if v[2] != b'-' || v[35] != b'-' || v[52] != b'-' || &v[..2] == b"ff" {
            return None;
        }
        let _version: [u8; 1] = lower_hex(&v[0..2])?;
        let trace_id: [u8; 16] = lower_hex(&v[3..35])?;
        let span_id: [u8; 8] = lower_hex(&v[36..52])?;
        let [flags]: [u8; 1] = lower_hex(&v[53..55])?;
        Self::checked(trace_id, span_id, flags & 1 == 1, String::new())
    }

    /// `b3: traceid-spanid[-sampled[-parentspanid]]`; a lone `0` (do not sample) is not a parent.
    fn parse_b3_single(value: &str) -> Option<RemoteParent> {
        let mut parts = value.trim().split('-');
        let (trace_id, span_id) = (parts.next()?, parts.next()?);
        let sampled = !matches!(parts.next(), Some("0"));
        Self::b3(trace_id, span_id, sampled)
    }

    /// B3 ids: a 64- or 128-bit trace id (a 64-bit one is the low half), a 64-bit span id.
    fn b3(trace_id: &str, span_id: &str, sampled: bool) -> Option<RemoteParent> {
        let t = trace_id.trim().to_ascii_lowercase();
        let t = match t.len() {
            16 => format!("{:0>32}", t),
            32 => t,
            _ => return None,
        };
        let s = span_id.trim().to_ascii_lowercase();
        Self::checked(
            lower_hex(t.as_bytes())?,
            lower_hex(s.as_bytes())?,
            sampled,
            String::new(),
        )
    }

    /// All-zero ids are invalid in both formats.
    fn checked(
        trace_id: [u8; 16],
        span_id: [u8; 8],
        sampled: bool,
        trace_state: String,
    ) -> Option<RemoteParent> {
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(RemoteParent {
            trace_id,
            span_id,
            sampled,
            trace_state,
        })
    }

    /// An OpenTelemetry context whose span is this remote parent.
    pub fn context(&self) -> opentelemetry::Context {
        let flags = if self.sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        let state = self.trace_state.parse::<TraceState>().unwrap_or_default();
        opentelemetry::Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from_bytes(self.trace_id),
            SpanId::from_bytes(self.span_id),
            flags,
            true,
            state,
        ))
    }
}

/// `N` bytes from exactly `2N` lowercase hex digits (W3C allows no uppercase).
fn lower_hex<const N: usize>(s: &[u8]) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in s.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a str> {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
    }

    #[test]
    fn reads_a_w3c_traceparent_and_its_tracestate() {
        let p = RemoteParent::from_headers(headers(&[
            ("traceparent", TP),
            ("tracestate", "congo=t61rcWkgMzE"),
        ]))
        .unwrap();
        assert_eq!(p.trace_id[..4], [0x4b, 0xf9, 0x2f, 0x35]);
        assert_eq!(p.span_id, [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]);
        assert!(p.sampled);
        assert_eq!(p.trace_state, "congo=t61rcWkgMzE");
        let cx = p.context();
        let sc = cx.span().span_context().clone();
        assert!(sc.is_remote() && sc.is_sampled() && sc.is_valid());
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(sc.span_id().to_string(), "00f067aa0ba902b7");
        assert!(
            !RemoteParent::parse_traceparent(&TP.replace("-01", "-00"))
                .unwrap()
                .sampled
        );
    }

    #[test]
    fn refuses_malformed_traceparents() {
        let bad = [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", // uppercase
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero span id
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // version ff
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", // v00 is exactly 55
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01",
            "0é-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ];
        for b in bad {
            assert_eq!(RemoteParent::parse_traceparent(b), None, "{b:?}");
        }
        // A later version may carry more fields.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
        assert!(RemoteParent::parse_traceparent(later).is_some());
        // A bad traceparent is not rescued by B3 headers next to it: the caller's tracer
        // is W3C, and its header is broken.
        assert_eq!(
            RemoteParent::from_headers(headers(&[
                ("traceparent", "garbage"),
                ("x-b3-traceid", "4bf92f3577b34da6"),
                ("x-b3-spanid", "00f067aa0ba902b7"),
            ])),
            None
        );
        assert_eq!(RemoteParent::from_headers(headers(&[])), None);
    }

    #[test]
    fn reads_b3_multi_and_single_headers() {
        let p = RemoteParent::from_headers(headers(&[
            ("x-b3-traceid", "a3ce929d0e0e4736"),
            ("x-b3-spanid", "00F067AA0BA902B7"),
            ("x-b3-sampled", "0"),
        ]))
        .unwrap();
        assert_eq!(p.trace_id[..8], [0; 8], "a 64-bit id is the low half");
        assert_eq!(p.trace_id[8], 0xa3);
        assert_eq!(p.span_id[1], 0xf0);
        assert!(!p.sampled);
        let debug = RemoteParent::from_headers(headers(&[
            ("x-b3-traceid", "a3ce929d0e0e4736"),
            ("x-b3-spanid", "00f067aa0ba902b7"),
            ("x-b3-flags", "1"),
        ]))
        .unwrap();
        assert!(debug.sampled);
        let single = RemoteParent::from_headers(headers(&[(
            "b3",
            "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1-05e3ac9a4f6e3b90",
        )]))
        .unwrap();
        assert_eq!(single.trace_id[0], 0x4b);
        assert!(single.sampled);
        assert_eq!(RemoteParent::from_headers(headers(&[("b3", "0")])), None);
        assert_eq!(
            RemoteParent::from_headers(headers(&[("x-b3-traceid", "abc"), ("x-b3-spanid", "1")])),
            None
        );
    }
}
