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
//!
//! With `response_dynamic_metadata` on, [`dynamic_metadata`] adds what envoyproxy/ratelimit
//! adds: the request (`domain`, `descriptors` as `entries: ["key=value"]` with their `limit`
//! and `hitsAddend`, the request's `hitsAddend`) and, under `metadata`, the `metadata` of
//! every descriptor that passed, merged (the first one's value wins for a key both have,
//! maps merge key by key). Envoy puts it in the filter's dynamic metadata namespace
//! (`envoy.filters.http.ratelimit`) for access logs, Lua or later filters.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as PbCode, DescriptorStatus, RateLimit,
};
use envoy_types::pb::google::protobuf::{Duration, Struct};
use serde_json::{Map, Value as Json, json};

use crate::limiter::{Code, Decision, Status};
use crate::rules::Unit;
use crate::structpb;

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

/// The response's dynamic metadata (see the module doc); `decision` is `req`'s.
pub fn dynamic_metadata(req: &RateLimitRequest, decision: &Decision) -> Struct {
    let descriptors: Vec<Json> = req
        .descriptors
        .iter()
        .map(|d| {
            let entries: Vec<String> = d
                .entries
                .iter()
                .map(|e| format!("{}={}", e.key, e.value))
                .collect();
            let mut out = json!({ "entries": entries });
            if let Some(l) = &d.limit {
                // The reference writes the proto's text form.
                let unit = PbUnit::try_from(l.unit).unwrap_or(PbUnit::Unknown);
                out["limit"] = json!(format!(
                    "requests_per_unit:{} unit:{}",
                    l.requests_per_unit,
                    unit.as_str_name()
                ));
            }
            if let Some(h) = &d.hits_addend {
                out["hitsAddend"] = json!(h.value);
            }
            out
        })
        .collect();
    let mut fields = Map::new();
    fields.insert("domain".into(), json!(req.domain));
    fields.insert("descriptors".into(), Json::Array(descriptors));
    if req.hits_addend != 0 {
        fields.insert("hitsAddend".into(), json!(req.hits_addend));
    }
    let mut passed = Map::new();
    for s in decision.statuses.iter().filter(|s| s.code == Code::Ok) {
        if let Some(Json::Object(m)) = s.metadata.as_deref() {
            merge(&mut passed, m);
        }
    }
    if !passed.is_empty() {
        fields.insert("metadata".into(), Json::Object(passed));
    }
    structpb::to_struct(&fields)
}

/// Adds `from`'s keys that `into` lacks; maps both have are merged the same way.
fn merge(into: &mut Map<String, Json>, from: &Map<String, Json>) {
    for (k, v) in from {
        match (into.get_mut(k), v) {
            (None, _) => {
                into.insert(k.clone(), v.clone());
            }
            (Some(Json::Object(a)), Json::Object(b)) => merge(a, b),
            (Some(_), _) => {}
        }
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
        // Over quota-mode limits only, with the request still OK: not what holds it back.
        .find(|s| {
            s.code == Code::OverLimit && (decision.overall == Code::OverLimit || !s.quota_mode)
        });
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
            quota_mode: false,
            metadata: None,
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
            from_fallback: false,
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
            from_fallback: false,
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
            from_fallback: false,
            overall: Code::OverLimit,
            statuses: vec![st(Code::OverLimit, 0, 100, Some(10))],
        };
        assert!(
            headers(&d).contains(&("Retry-After".into(), "1".into())),
            "at least 1"
        );
        let d = Decision {
            from_fallback: false,
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
            from_fallback: false,
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
            from_fallback: false,
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
            from_fallback: false,
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
            from_fallback: false,
            overall: Code::Ok,
            statuses: vec![st(Code::Ok, 3, 6_000, None)],
        };
        assert!(headers(&d).contains(&("RateLimit-Policy".into(), "10;w=60".into())));
    }

    #[test]
    fn a_spent_hourly_key_resets_when_the_next_request_fits() {
        // 10/hour, empty: full again in an hour, the next token in 6 minutes.
        let d = Decision {
            from_fallback: false,
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

    #[test]
    fn dynamic_metadata_is_the_request_and_the_passing_descriptors_metadata() {
        use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
        use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
            Entry, RateLimitOverride,
        };
        let desc = |k: &str, v: &str| RateLimitDescriptor {
            entries: vec![Entry {
                key: k.into(),
                value: v.into(),
            }],
            ..Default::default()
        };
        let mut second = desc("team", "t");
        second.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 3 });
        second.limit = Some(RateLimitOverride {
            requests_per_unit: 7,
            unit: PbUnit::Minute as i32,
        });
        let req = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![desc("user", "a"), second, desc("org", "o")],
            hits_addend: 2,
        };
        let with = |code, meta: serde_json::Value| Status {
            metadata: Some(std::sync::Arc::new(meta)),
            ..st(code, 1, 0, None)
        };
        let d = Decision {
            from_fallback: false,
            overall: Code::OverLimit,
            statuses: vec![
                with(Code::Ok, json!({"a": 1, "shared": {"x": "first", "y": 1}})),
                with(Code::Ok, json!({"a": 2, "shared": {"x": "second", "z": 2}})),
                // Over: its metadata stays out.
                with(Code::OverLimit, json!({"over": true})),
            ],
        };
        let got = structpb::from_struct(&dynamic_metadata(&req, &d));
        assert_eq!(
            got,
            json!({
                "domain": "edge",
                "descriptors": [
                    {"entries": ["user=a"]},
                    {"entries": ["team=t"], "hitsAddend": 3, "limit": "requests_per_unit:7 unit:MINUTE"},
                    {"entries": ["org=o"]},
                ],
                "hitsAddend": 2,
                "metadata": {"a": 1, "shared": {"x": "first", "y": 1, "z": 2}},
            })
        );
    }
}
