//! A [`Decision`] as Envoy's `RateLimitResponse`.
//!
//! One `DescriptorStatus` per descriptor, in order, with `current_limit`, `limit_remaining`
//! and `duration_until_reset` (Envoy derives its `x-ratelimit-*` headers from these). With
//! `response_headers` on, `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` come
//! from the descriptor the reference would pick (the last non-shadow OVER_LIMIT one, else the
//! one with the least remaining), plus `Retry-After` on OVER_LIMIT: the longest wait of the
//! over-limit descriptors, left out when one of them can never fit.

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

fn status(s: &Status) -> DescriptorStatus {
    DescriptorStatus {
        code: code(s.code) as i32,
        current_limit: s.limit.as_ref().map(|l| RateLimit {
            name: l.name.clone(),
            requests_per_unit: l.requests_per_unit,
            unit: unit(l.unit) as i32,
        }),
        limit_remaining: s.remaining,
        duration_until_reset: s.limit.as_ref().map(|_| Duration {
            seconds: ceil_secs(s.reset_ms) as i64,
            nanos: 0,
        }),
        quota: None,
    }
}

fn header(key: &str, value: u64) -> HeaderValue {
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
    let mut out = vec![
        header("RateLimit-Limit", u64::from(limit.requests_per_unit)),
        header("RateLimit-Remaining", u64::from(s.remaining)),
        header("RateLimit-Reset", ceil_secs(s.reset_ms)),
    ];
    // The request is admitted again only when every over-limit descriptor has room: wait for
    // the longest, and promise nothing if one of them can never fit.
    if decision.overall == Code::OverLimit {
        let waits: Option<Vec<u64>> = decision
            .statuses
            .iter()
            .filter(|s| s.code == Code::OverLimit)
            .map(|s| s.retry_ms)
            .collect();
        if let Some(longest) = waits.and_then(|w| w.into_iter().max()) {
            out.push(header("Retry-After", ceil_secs(longest).max(1)));
        }
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
        assert!(h.contains(&("RateLimit-Reset".into(), "5".into())), "{h:?}");
        assert!(
            h.contains(&("Retry-After".into(), "9".into())),
            "the longest wait of all over-limit descriptors: {h:?}"
        );
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
}
