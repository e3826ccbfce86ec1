//! The JSON shapes of the admin port: `POST /json` (a RateLimitRequest in proto3 JSON, as
//! envoyproxy/ratelimit's `/json` accepts it) and `GET /config` (the rules in force).
//!
//! envoy-types has no serde support, so these are our own types. Input accepts snake_case and
//! camelCase field names, enums by name or number, 64-bit integers as numbers or strings (the
//! proto3 JSON mapping); output is camelCase with enum names and default values omitted, as a
//! proto3 JSON encoder writes it. Requests are converted to the proto and take the same path
//! as gRPC, so validation and decisions are identical.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code as PbCode;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};

use crate::rules::model::{Level, RuleSet};
use crate::rules::{Limit, Unit};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hitsAddend", deserialize_with = "u32_lenient")]
    hits_addend: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(default, alias = "hitsAddend", deserialize_with = "opt_u64_lenient")]
    hits_addend: Option<u64>,
    #[serde(default, alias = "isNegativeHits")]
    is_negative_hits: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(default, alias = "requestsPerUnit", deserialize_with = "u32_lenient")]
    requests_per_unit: u32,
    #[serde(default, deserialize_with = "unit_lenient")]
    unit: i32,
}

/// A number or a decimal string (proto3 JSON writes 64-bit integers as strings).
#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrStr {
    Num(u64),
    Str(String),
}

fn parse_num<E: de::Error>(v: NumOrStr) -> Result<u64, E> {
    match v {
        NumOrStr::Num(n) => Ok(n),
        NumOrStr::Str(s) => s
            .parse()
            .map_err(|_| E::custom(format!("expected a non-negative integer, found \"{s}\""))),
    }
}

fn u32_lenient<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let n = parse_num(NumOrStr::deserialize(d)?)?;
    u32::try_from(n).map_err(|_| de::Error::custom(format!("{n} does not fit in 32 bits")))
}

fn opt_u64_lenient<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Option::<NumOrStr>::deserialize(d)?
        .map(parse_num)
        .transpose()
}

fn unit_lenient<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum U {
        Num(i32),
        Name(String),
    }
    match U::deserialize(d)? {
        U::Num(n) => Ok(n),
        U::Name(s) => Unit::parse(&s)
            .map(|u| crate::service::response::unit(u) as i32)
            .ok_or_else(|| de::Error::custom(format!("unknown unit \"{s}\""))),
    }
}

impl JsonRequest {
    pub fn into_proto(self) -> RateLimitRequest {
        RateLimitRequest {
            domain: self.domain,
            hits_addend: self.hits_addend,
            descriptors: self
                .descriptors
                .into_iter()
                .map(|d| RateLimitDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|e| Entry {
                            key: e.key,
                            value: e.value,
                        })
                        .collect(),
                    limit: d.limit.map(|l| RateLimitOverride {
                        requests_per_unit: l.requests_per_unit,
                        unit: l.unit,
                    }),
                    hits_addend: d.hits_addend.map(|value| UInt64Value { value }),
                    is_negative_hits: d.is_negative_hits,
                })
                .collect(),
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JsonResponse {
    overall_code: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    statuses: Vec<JsonStatus>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    response_headers_to_add: Vec<JsonHeader>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    request_headers_to_add: Vec<JsonHeader>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonStatus {
    code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_limit: Option<JsonLimit>,
    #[serde(skip_serializing_if = "is_zero")]
    limit_remaining: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_until_reset: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonLimit {
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    #[serde(skip_serializing_if = "is_zero")]
    requests_per_unit: u32,
    unit: &'static str,
}

#[derive(Debug, Serialize)]
struct JsonHeader {
    key: String,
    value: String,
}

fn json_headers(headers: &[HeaderValue]) -> Vec<JsonHeader> {
    headers
        .iter()
        .map(|h| JsonHeader {
            key: h.key.clone(),
            value: h.value.clone(),
        })
        .collect()
}

fn code_name(code: i32) -> &'static str {
    PbCode::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

impl JsonResponse {
    pub fn from_proto(r: &RateLimitResponse) -> Self {
        use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as PbUnit;
        JsonResponse {
            overall_code: code_name(r.overall_code),
            statuses: r
                .statuses
                .iter()
                .map(|s| JsonStatus {
                    code: code_name(s.code),
                    current_limit: s.current_limit.as_ref().map(|l| JsonLimit {
                        name: l.name.clone(),
                        requests_per_unit: l.requests_per_unit,
                        unit: PbUnit::try_from(l.unit).map_or("UNKNOWN", |u| u.as_str_name()),
                    }),
                    limit_remaining: s.limit_remaining,
                    duration_until_reset: s
                        .duration_until_reset
                        .as_ref()
                        .map(|d| format!("{}s", d.seconds)),
                })
                .collect(),
            response_headers_to_add: json_headers(&r.response_headers_to_add),
            request_headers_to_add: json_headers(&r.request_headers_to_add),
        }
    }

    pub fn is_over_limit(&self) -> bool {
        self.overall_code == PbCode::OverLimit.as_str_name()
    }
}

/// The rules in force, flattened for `GET /config`: one row per declared limit, and one per
/// limit a `charge_parent` node is charged to (marked so).
#[derive(Debug, Serialize)]
pub struct RulesView {
    files: Vec<String>,
    warnings: Vec<String>,
    domains: Vec<DomainView>,
}

#[derive(Debug, Serialize)]
struct DomainView {
    domain: String,
    origin: String,
    limits: Vec<LimitView>,
}

#[derive(Debug, Serialize)]
struct LimitView {
    /// e.g. `tenant=acme.endpoint`: the descriptor path, with declared values.
    path: String,
    #[serde(flatten)]
    limit: Limit,
    share_threshold: bool,
    /// A `charge_parent` node's row: the limit is its parent's (same bucket), charged here.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    charge_parent: bool,
}

impl RulesView {
    pub fn new(rules: &RuleSet) -> Self {
        fn walk(level: &Level, prefix: &str, out: &mut Vec<LimitView>) {
            for d in level.in_file_order() {
                let step = match &d.value {
                    Some(v) => format!("{}={v}", d.key),
                    None => d.key.clone(),
                };
                let path = if prefix.is_empty() {
                    step
                } else {
                    format!("{prefix}.{step}")
                };
                for l in d.counted_limits() {
                    out.push(LimitView {
                        path: path.clone(),
                        limit: (**l).clone(),
                        share_threshold: d.share_threshold,
                        charge_parent: d.charge_parent.is_some(),
                    });
                }
                walk(&d.children, &path, out);
            }
        }
        let mut domains: Vec<DomainView> = rules
            .domains
            .values()
            .map(|d| {
                let mut limits = Vec::new();
                walk(&d.root, "", &mut limits);
                DomainView {
                    domain: d.name.to_string(),
                    origin: d.origin.to_string(),
                    limits,
                }
            })
            .collect();
        domains.sort_by(|a, b| a.domain.cmp(&b.domain));
        RulesView {
            files: rules
                .files
                .iter()
                .map(|f| f.display().to_string())
                .collect(),
            warnings: rules.warnings.clone(),
            domains,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_shows_a_charge_parent_node_on_its_parents_limit_and_a_calendar() {
        let rules = crate::rules::load::load_sources(
            &[(
                "r.yaml".into(),
                "domain: d\ndescriptors:\n  - key: t\n    rate_limit: {unit: hour, requests_per_unit: 9}\n    descriptors:\n      - key: settle\n        charge_parent: true\n  - key: m\n    rate_limit: {unit: month, requests_per_unit: 5, calendar: utc}\n".into(),
            )],
            crate::rules::LoadOptions::default(),
        )
        .unwrap();
        let v = serde_json::to_value(RulesView::new(&rules)).unwrap();
        let rows = v["domains"][0]["limits"].as_array().unwrap();
        let paths: Vec<&str> = rows.iter().map(|r| r["path"].as_str().unwrap()).collect();
        assert_eq!(paths, ["t", "t.settle", "m"]);
        assert_eq!(rows[1]["charge_parent"], true);
        assert_eq!(rows[1]["rate"], rows[0]["rate"], "the parent's limit");
        assert!(rows[0].get("charge_parent").is_none());
        assert_eq!(rows[2]["rate"]["calendar"]["unit"], "month");
    }

    #[test]
    fn answers_carry_both_header_lists_in_camel_case() {
        let h = |k: &str, v: &str| HeaderValue {
            key: k.into(),
            value: v.into(),
            ..Default::default()
        };
        let r = RateLimitResponse {
            overall_code: PbCode::Ok as i32,
            response_headers_to_add: vec![h("RateLimit-Remaining", "3")],
            request_headers_to_add: vec![h("RateLimit-Remaining", "3"), h("RateLimit-Reset", "1")],
            ..Default::default()
        };
        let v = serde_json::to_value(JsonResponse::from_proto(&r)).unwrap();
        assert_eq!(
            v["responseHeadersToAdd"].as_array().unwrap().len(),
            1,
            "{v}"
        );
        assert_eq!(v["requestHeadersToAdd"][1]["key"], "RateLimit-Reset", "{v}");
        // Empty lists stay out of the answer, as before.
        let v =
            serde_json::to_value(JsonResponse::from_proto(&RateLimitResponse::default())).unwrap();
        assert!(v.get("requestHeadersToAdd").is_none(), "{v}");
    }

    #[test]
    fn accepts_snake_and_camel_case_and_string_integers() {
        let camel: JsonRequest = serde_json::from_str(
            r#"{"domain":"d","hitsAddend":2,"descriptors":[{"entries":[{"key":"k","value":"v"}],"hitsAddend":"18446744073709551615","limit":{"requestsPerUnit":5,"unit":"MINUTE"}}]}"#,
        )
        .unwrap();
        let p = camel.into_proto();
        assert_eq!(p.hits_addend, 2);
        assert_eq!(p.descriptors[0].hits_addend.unwrap().value, u64::MAX);
        assert_eq!(p.descriptors[0].limit.unwrap().unit, 2);
        let snake: JsonRequest = serde_json::from_str(
            r#"{"domain":"d","hits_addend":1,"descriptors":[{"entries":[{"key":"k"}],"hits_addend":0}]}"#,
        )
        .unwrap();
        let p = snake.into_proto();
        assert_eq!(p.descriptors[0].hits_addend.unwrap().value, 0);
        assert_eq!(p.descriptors[0].entries[0].value, "");
    }

    #[test]
    fn refuses_unknown_fields_and_bad_numbers() {
        assert!(serde_json::from_str::<JsonRequest>(r#"{"domain":"d","extra":1}"#).is_err());
        assert!(serde_json::from_str::<JsonRequest>(r#"{"hitsAddend":"-1"}"#).is_err());
        assert!(serde_json::from_str::<JsonRequest>(r#"{"hitsAddend":4294967296}"#).is_err());
    }
}
