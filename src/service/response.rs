//! A [`Decision`] as Envoy's `RateLimitResponse`.
//!
//! One `DescriptorStatus` per descriptor, in order, with `current_limit`, `limit_remaining`
//! and `duration_until_reset` (Envoy derives its `x-ratelimit-*` headers from these). With
//! `response_headers` on, the `RateLimit-*` headers of the IETF draft (draft-ietf-httpapi-
//! ratelimit-headers, the `RateLimit-Limit/-Remaining/-Reset` + `RateLimit-Policy` form) come
//! from the descriptor the reference would pick (the last non-shadow OVER_LIMIT one, else the
//! one with the least remaining), plus `Retry-After` on OVER_LIMIT.
//!
//! The numbers tell one story:
//! - **Limit** is the most a client can spend at once: a token bucket's `burst` when it has
//!   one (`RateLimit-Policy` then says the refill: `5;w=1;burst=10`), so Remaining is never
//!   above Limit. Envoy's `x-ratelimit-limit` shows `requests_per_unit` (the proto carries
//!   nothing else), so `limit_remaining` is capped at `requests_per_unit` for the same reason.
//! - **Reset** is when the client can act on it: over the limit, the wait until the request
//!   fits (the same number as `Retry-After`: the longest wait of the over-limit descriptors);
//!   otherwise the time until the quota is whole again (a token bucket full, a window over).
//!   Left at "until whole" when one over-limit descriptor can never fit (no `Retry-After`).

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as PbCode, DescriptorStatus, RateLimit,
};
use envoy_types::pb::google::protobuf::Duration;

use crate::limiter::{Code, Decision, Status};
use crate::rules::Unit;

pub fn to_proto(decision: &Decision, headers: bool) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: code(decision.overall) as i32,
        statuses: decision.statuses.iter().map(status).collect(),
        response_headers_to_add: if headers {
            rate_limit_headers(decision)
        } else {
            Vec::new()
        },
        ..Default::default()
    }
}

fn code(c: Code) -> PbCode {
    match c {
        Code::Ok => PbCode::Ok,
        Code::OverLimit => PbCode::OverLimit,
    }
}

pub fn unit(u: Unit) -> PbUnit {
    match u {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
    }
}

fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

/// Seconds until the descriptor's quota is usable again: over the limit, until the request
/// fits (if it ever can); otherwise until the quota is whole.
fn reset_secs(s: &Status) -> u64 {
    match (s.code, s.retry_ms) {
        (Code::OverLimit, Some(retry)) => ceil_secs(retry).max(1),
        _ => ceil_secs(s.reset_ms),
    }
}

fn status(s: &Status) -> DescriptorStatus {
    DescriptorStatus {
        code: code(s.code) as i32,
        current_limit: s.limit.as_ref().map(|l| RateLimit {
            name: l.name.clone(),
            requests_per_unit: l.requests_per_unit,
            unit: unit(l.unit) as i32,
        }),
        // Envoy shows `requests_per_unit` as x-ratelimit-limit: never more remaining than that.
        limit_remaining: match &s.limit {
            Some(l) => s.remaining.min(l.requests_per_unit),
            None => s.remaining,
        },
        duration_until_reset: s.limit.as_ref().map(|_| Duration {
            seconds: reset_secs(s) as i64,
            nanos: 0,
        }),
        quota: None,
    }
}

fn header(key: &str, value: impl ToString) -> HeaderValue {
    HeaderValue {
        key: key.to_string(),
        value: value.to_string(),
        ..Default::default()
    }
}

fn rate_limit_headers(decision: &Decision) -> Vec<HeaderValue> {
    let over = decision
        .statuses
        .iter()
        .rev()
        .find(|s| s.code == Code::OverLimit);
    let picked = over.or_else(|| {
        decision
            .statuses
            .iter()
            .filter(|s| s.limit.is_some())
            .min_by_key(|s| s.remaining)
    });
    let Some(s) = picked else { return Vec::new() };
    let Some(limit) = &s.limit else {
        return Vec::new();
    };
    // The request is admitted again only when every over-limit descriptor has room: wait for
    // the longest, and promise nothing if one of them can never fit.
    let retry_after = if decision.overall == Code::OverLimit {
        decision
            .statuses
            .iter()
            .filter(|s| s.code == Code::OverLimit)
            .map(|s| s.retry_ms)
            .collect::<Option<Vec<u64>>>()
            .and_then(|waits| waits.into_iter().max())
            .map(|longest| ceil_secs(longest).max(1))
    } else {
        None
    };
    let capacity = limit.capacity.max(u64::from(limit.requests_per_unit));
    let mut policy = format!(
        "{};w={}",
        limit.requests_per_unit,
        ceil_secs(limit.window_ms)
    );
    if capacity != u64::from(limit.requests_per_unit) {
        policy.push_str(&format!(";burst={capacity}"));
    }
    let mut out = vec![
        header("RateLimit-Limit", capacity),
        header("RateLimit-Remaining", u64::from(s.remaining).min(capacity)),
        header(
            "RateLimit-Reset",
            retry_after.unwrap_or_else(|| reset_secs(s)),
        ),
        header("RateLimit-Policy", policy),
    ];
    if let Some(wait) = retry_after {
        out.push(header("Retry-After", wait));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::ReportedLimit;

    fn st(code: Code, remaining: u32, reset_ms: u64, retry_ms: Option<u64>) -> Status {
        Status {
            code,
            limit: Some(ReportedLimit {
                requests_per_unit: 10,
                unit: Unit::Minute,
                name: "n".into(),
                capacity: 10,
                window_ms: 60_000,
            }),
            remaining,
            reset_ms,
            retry_ms,
            shadow: false,
        }
    }

    fn headers(d: &Decision) -> Vec<(String, String)> {
        to_proto(d, true)
            .response_headers_to_add
            .into_iter()
            .map(|h| (h.key, h.value))
            .collect()
    }

    #[test]
    fn statuses_carry_limit_remaining_and_reset() {
        let d = Decision {
            overall: Code::Ok,
            statuses: vec![st(Code::Ok, 3, 1_001, None)],
        };
        let r = to_proto(&d, false);
        assert_eq!(r.overall_code, PbCode::Ok as i32);
        let s = &r.statuses[0];
        assert_eq!(s.limit_remaining, 3);
        assert_eq!(s.duration_until_reset.unwrap().seconds, 2, "rounded up");
        assert_eq!(
            s.current_limit.as_ref().unwrap().unit,
            PbUnit::Minute as i32
        );
        assert!(r.response_headers_to_add.is_empty());
    }

    #[test]
    fn headers_pick_the_last_over_limit_and_add_retry_after() {
        let d = Decision {
            overall: Code::OverLimit,
            statuses: vec![
                st(Code::OverLimit, 0, 9_000, Some(8_100)),
                st(Code::Ok, 1, 100, None),
                st(Code::OverLimit, 0, 5_000, Some(10)),
            ],
        };
        let h = headers(&d);
        assert!(
            h.contains(&("Retry-After".into(), "9".into())),
            "the longest wait of all over-limit descriptors: {h:?}"
        );
        assert!(
            h.contains(&("RateLimit-Reset".into(), "9".into())),
            "Reset tells the same story as Retry-After: {h:?}"
        );
        // Each status's own reset, for Envoy's x-ratelimit-reset, is its own wait.
        let r = to_proto(&d, false);
        let resets: Vec<i64> = r
            .statuses
            .iter()
            .map(|s| s.duration_until_reset.unwrap().seconds)
            .collect();
        assert_eq!(resets, [9, 1, 1], "over: until it fits; ok: until whole");
        let d = Decision {
            overall: Code::OverLimit,
            statuses: vec![st(Code::OverLimit, 0, 100, Some(10))],
        };
        assert!(
            headers(&d).contains(&("Retry-After".into(), "1".into())),
            "at least 1"
        );
        let d = Decision {
            overall: Code::OverLimit,
            statuses: vec![
                st(Code::OverLimit, 0, 100, None),
                st(Code::OverLimit, 0, 100, Some(10)),
            ],
        };
        assert!(
            !headers(&d).iter().any(|(k, _)| k == "Retry-After"),
            "one never fits"
        );
    }

    #[test]
    fn no_retry_after_on_ok_or_when_it_never_fits() {
        let d = Decision {
            overall: Code::Ok,
            statuses: vec![st(Code::Ok, 4, 100, None), st(Code::Ok, 2, 100, None)],
        };
        let h = headers(&d);
        assert!(
            h.contains(&("RateLimit-Remaining".into(), "2".into())),
            "lowest remaining: {h:?}"
        );
        assert!(!h.iter().any(|(k, _)| k == "Retry-After"));
        let d = Decision {
            overall: Code::OverLimit,
            statuses: vec![st(Code::OverLimit, 0, 100, None)],
        };
        assert!(!headers(&d).iter().any(|(k, _)| k == "Retry-After"));
    }

    #[test]
    fn a_burst_is_the_limit_and_remaining_never_exceeds_it() {
        // 5/s with burst 10: one request spent of a full bucket.
        let mut s = st(Code::Ok, 9, 200, None);
        s.limit = Some(ReportedLimit {
            requests_per_unit: 5,
            unit: Unit::Second,
            name: String::new(),
            capacity: 10,
            window_ms: 1_000,
        });
        let d = Decision {
            overall: Code::Ok,
            statuses: vec![s],
        };
        let h = headers(&d);
        for expected in [
            ("RateLimit-Limit", "10"),
            ("RateLimit-Remaining", "9"),
            ("RateLimit-Reset", "1"),
            ("RateLimit-Policy", "5;w=1;burst=10"),
        ] {
            assert!(
                h.contains(&(expected.0.into(), expected.1.into())),
                "{expected:?} in {h:?}"
            );
        }
        // Envoy's x-ratelimit-limit is requests_per_unit (5): remaining is capped to it.
        assert_eq!(to_proto(&d, false).statuses[0].limit_remaining, 5);
        // Without a burst the policy is the plain quota.
        let d = Decision {
            overall: Code::Ok,
            statuses: vec![st(Code::Ok, 3, 6_000, None)],
        };
        assert!(headers(&d).contains(&("RateLimit-Policy".into(), "10;w=60".into())));
    }

    #[test]
    fn a_spent_hourly_key_resets_when_the_next_request_fits() {
        // 10/hour, empty: full again in an hour, the next token in 6 minutes.
        let d = Decision {
            overall: Code::OverLimit,
            statuses: vec![st(Code::OverLimit, 0, 3_600_000, Some(360_000))],
        };
        let h = headers(&d);
        assert!(
            h.contains(&("RateLimit-Reset".into(), "360".into())),
            "{h:?}"
        );
        assert!(h.contains(&("Retry-After".into(), "360".into())), "{h:?}");
        let r = to_proto(&d, false);
        assert_eq!(r.statuses[0].duration_until_reset.unwrap().seconds, 360);
    }
}
