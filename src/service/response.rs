//! A [`Decision`] as Envoy's `RateLimitResponse`.
//!
//! One `DescriptorStatus` per descriptor, in order, with `current_limit`, `limit_remaining`
//! and `duration_until_reset` (Envoy derives its `x-ratelimit-*` headers from these). With
//! `response_headers` on, the `RateLimit-*` headers of the IETF draft (draft-ietf-httpapi-
//! ratelimit-headers, the `RateLimit-Limit/-Remaining/-Reset` + `RateLimit-Policy` form) come
//! from the descriptor the reference would pick (the last non-shadow OVER_LIMIT one, else the
//! one with the least remaining), plus `Retry-After` on OVER_LIMIT. With `request_headers` on,
//! the same `RateLimit-*` headers (never `Retry-After`) go in `request_headers_to_add`: Envoy
//! adds them to the request it forwards, so the service behind it sees its caller's quota
//! (envoyproxy/ratelimit's `LIMIT_REQUEST_HEADERS_ENABLED`).
//!
//! With `headers_for_every_limit` on, the headers also describe every descriptor that has a
//! limit, not only the tightest: `RateLimit-Policy` and `RateLimit` take the list form of the
//! IETF draft's later revisions (`"name";q=10;w=60, "daily";q=1000;w=86400` and
//! `"name";r=3;t=12, "daily";r=900;t=40000`), one item per limit in request order, named by the
//! limit's `name` (else `descriptor-<i>`). `RateLimit-Limit/-Remaining/-Reset` still tell the
//! tightest, so clients that read only those see no change.
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
//! maps merge key by key), except one that passed only because a shadow-mode limit over it
//! reports OK (it took nothing there, and its metadata may gate a refund); beside them, a
//! reservation's receipt under its settling child's key (`limiter/receipt.rs`). Envoy puts it in the filter's dynamic metadata namespace
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

/// Where the `RateLimit-*` headers go and how many limits they describe: the settings
/// `response_headers`, `request_headers` and `headers_for_every_limit`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeaderOptions {
    /// In the response to the client (`response_headers_to_add`).
    pub response: bool,
    /// In the request Envoy forwards upstream (`request_headers_to_add`).
    pub request: bool,
    /// Every limit as the IETF list form, beside the tightest.
    pub every_limit: bool,
}

pub fn to_proto(decision: &Decision, headers: HeaderOptions) -> RateLimitResponse {
    let mut response = RateLimitResponse {
        overall_code: code(decision.overall) as i32,
        statuses: decision.statuses.iter().map(status).collect(),
        ..Default::default()
    };
    if headers.response || headers.request {
        let built = rate_limit_headers(decision, headers.every_limit);
        if headers.request {
            // The service upstream is told the quota; a wait is the client's business (and
            // Envoy forwards a request only when it is admitted, or not enforced).
            response.request_headers_to_add = built
                .iter()
                .filter(|h| h.key != "Retry-After")
                .cloned()
                .collect();
        }
        if headers.response {
            response.response_headers_to_add = built;
        }
    }
    response
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
        // A reservation's receipt says what it took (limiter/receipt.rs); it wins over a
        // `metadata` value of the same key.
        if let Some((key, receipt)) = &s.receipt {
            passed.insert(key.clone(), json!(receipt));
        }
        // A descriptor passed only because a shadow limit over it reports OK took nothing
        // there: its metadata, which may gate a refund, stays out.
        if s.shadow {
            continue;
        }
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

fn rate_limit_headers(decision: &Decision, every_limit: bool) -> Vec<HeaderValue> {
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
    // Room for all of them at once: no reallocation on the way (one allocation per response).
    let mut out = Vec::with_capacity(6);
    out.push(header("RateLimit-Limit", capacity));
    out.push(header(
        "RateLimit-Remaining",
        u64::from(s.remaining).min(capacity),
    ));
    out.push(header(
        "RateLimit-Reset",
        retry_after.unwrap_or_else(|| reset_secs(s)),
    ));
    if every_limit {
        let (policies, states) = every_limit_lists(decision);
        out.push(header("RateLimit-Policy", policies));
        out.push(header("RateLimit", states));
    } else {
        out.push(header("RateLimit-Policy", policy));
    }
    if let Some(wait) = retry_after {
        out.push(header("Retry-After", wait));
    }
    out
}

/// `RateLimit-Policy` and `RateLimit` as lists of structured-field items, one per descriptor
/// that has a limit: `"name";q=<per unit>;w=<window s>[;burst=<capacity>]` and
/// `"name";r=<remaining>;t=<reset s>`. Each item's `t` is its own descriptor's reset (over the
/// limit: until the request fits), as Envoy's `x-ratelimit-reset` reads it.
fn every_limit_lists(decision: &Decision) -> (String, String) {
    let mut named: Vec<&str> = Vec::new();
    let mut policies = Vec::new();
    let mut states = Vec::new();
    for (i, s) in decision.statuses.iter().enumerate() {
        let Some(limit) = &s.limit else { continue };
        // Unnamed, or a name two descriptors share: the position tells them apart.
        let name = if limit.name.is_empty() {
            sf_string(&format!("descriptor-{i}"))
        } else if named.contains(&limit.name.as_str()) {
            sf_string(&format!("{}-{i}", limit.name))
        } else {
            sf_string(&limit.name)
        };
        named.push(&limit.name);
        let capacity = limit.capacity.max(u64::from(limit.requests_per_unit));
        let mut policy = format!(
            "{name};q={};w={}",
            limit.requests_per_unit,
            ceil_secs(limit.window_ms)
        );
        if capacity != u64::from(limit.requests_per_unit) {
            policy.push_str(&format!(";burst={capacity}"));
        }
        policies.push(policy);
        states.push(format!(
            "{name};r={};t={}",
            u64::from(s.remaining).min(capacity),
            reset_secs(s)
        ));
    }
    (policies.join(", "), states.join(", "))
}

/// A structured-field string (RFC 8941 §3.3.3): printable ASCII, `"` and `\` escaped; any
/// other character (a rule's name may be UTF-8) becomes `_`, as a header cannot carry it.
fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
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
            receipt: None,
        }
    }

    fn headers(d: &Decision) -> Vec<(String, String)> {
        to_proto(
            d,
            HeaderOptions {
                response: true,
                ..HeaderOptions::default()
            },
        )
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
        let r = to_proto(&d, HeaderOptions::default());
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
        let r = to_proto(&d, HeaderOptions::default());
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
        assert_eq!(
            to_proto(&d, HeaderOptions::default()).statuses[0].limit_remaining,
            5
        );
        // Without a burst the policy is the plain quota.
        let d = Decision {
            from_fallback: false,
            overall: Code::Ok,
            statuses: vec![st(Code::Ok, 3, 6_000, None)],
        };
        assert!(headers(&d).contains(&("RateLimit-Policy".into(), "10;w=60".into())));
    }

    fn header_map(headers: &[HeaderValue]) -> Vec<(String, String)> {
        headers
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect()
    }

    #[test]
    fn request_headers_tell_upstream_the_quota_and_never_a_wait() {
        let d = Decision {
            from_fallback: false,
            overall: Code::OverLimit,
            statuses: vec![st(Code::OverLimit, 0, 9_000, Some(8_100))],
        };
        let only_request = to_proto(
            &d,
            HeaderOptions {
                request: true,
                ..HeaderOptions::default()
            },
        );
        assert!(only_request.response_headers_to_add.is_empty());
        let upstream = header_map(&only_request.request_headers_to_add);
        assert_eq!(
            upstream,
            [
                ("RateLimit-Limit".into(), "10".into()),
                ("RateLimit-Remaining".into(), "0".into()),
                ("RateLimit-Reset".into(), "9".into()),
                ("RateLimit-Policy".into(), "10;w=60".into()),
            ]
        );
        let both = to_proto(
            &d,
            HeaderOptions {
                request: true,
                response: true,
                every_limit: false,
            },
        );
        assert_eq!(header_map(&both.request_headers_to_add), upstream);
        let client = header_map(&both.response_headers_to_add);
        assert!(
            client.contains(&("Retry-After".into(), "9".into())),
            "{client:?}"
        );
        assert_eq!(client.len(), upstream.len() + 1);
        // Neither on: no headers anywhere.
        let none = to_proto(&d, HeaderOptions::default());
        assert!(none.request_headers_to_add.is_empty() && none.response_headers_to_add.is_empty());
    }

    #[test]
    fn every_limit_lists_each_descriptor_in_the_ietf_list_form() {
        let mut per_second = st(Code::Ok, 4, 800, None);
        per_second.limit = Some(ReportedLimit {
            requests_per_unit: 5,
            unit: Unit::Second,
            name: "per-second".into(),
            capacity: 10,
            window_ms: 1_000,
        });
        let mut unnamed = st(Code::OverLimit, 0, 3_600_000, Some(360_000));
        unnamed.limit.as_mut().unwrap().name = String::new();
        let mut same_name = st(Code::Ok, 7, 30_000, None);
        same_name.limit.as_mut().unwrap().name = "per-second".into();
        let mut odd = st(Code::Ok, 9, 1_000, None);
        odd.limit.as_mut().unwrap().name = "a \"q\" \\ é".into();
        let d = Decision {
            from_fallback: false,
            overall: Code::OverLimit,
            statuses: vec![
                per_second,
                // No rule: no item.
                Status {
                    limit: None,
                    ..st(Code::Ok, 0, 0, None)
                },
                unnamed,
                same_name,
                odd,
            ],
        };
        let h = header_map(
            &to_proto(
                &d,
                HeaderOptions {
                    response: true,
                    every_limit: true,
                    ..HeaderOptions::default()
                },
            )
            .response_headers_to_add,
        );
        let get = |k: &str| -> Vec<String> {
            h.iter()
                .filter(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
                .collect()
        };
        assert_eq!(
            get("RateLimit-Policy"),
            [concat!(
                r#""per-second";q=5;w=1;burst=10, "descriptor-2";q=10;w=60, "#,
                r#""per-second-3";q=10;w=60, "a \"q\" \\ _";q=10;w=60"#
            )],
            "one policy header, in the list form"
        );
        assert_eq!(
            get("RateLimit"),
            [concat!(
                r#""per-second";r=4;t=1, "descriptor-2";r=0;t=360, "#,
                r#""per-second-3";r=7;t=30, "a \"q\" \\ _";r=9;t=1"#
            )]
        );
        // The tightest (the over-limit one) is still told the old way, with its wait.
        assert_eq!(get("RateLimit-Remaining"), ["0"]);
        assert_eq!(get("RateLimit-Reset"), ["360"]);
        assert_eq!(get("Retry-After"), ["360"]);
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
        let r = to_proto(&d, HeaderOptions::default());
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
            receipt: None,
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
