//! `google.protobuf.Struct` ↔ JSON: rule `metadata` arrives as a `Struct` over xDS and as YAML
//! in files (kept as JSON either way, `rules::model::Limit::metadata`), and leaves as the
//! `Struct` of a response's dynamic metadata (`service::response`).

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, NullValue, Struct, Value};
use serde_json::{Map, Number, Value as Json};

/// A JSON object as a `Struct`.
pub fn to_struct(map: &Map<String, Json>) -> Struct {
    Struct {
        fields: map.iter().map(|(k, v)| (k.clone(), to_value(v))).collect(),
    }
}

/// A JSON value as a protobuf `Value` (numbers become doubles, as the `Struct` holds them).
pub fn to_value(v: &Json) -> Value {
    let kind = match v {
        Json::Null => Kind::NullValue(NullValue::NullValue as i32),
        Json::Bool(b) => Kind::BoolValue(*b),
        Json::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or_default()),
        Json::String(s) => Kind::StringValue(s.clone()),
        Json::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(to_value).collect(),
        }),
        Json::Object(map) => Kind::StructValue(to_struct(map)),
    };
    Value { kind: Some(kind) }
}

/// A `Struct` as a JSON object. A whole number comes back as an integer (what YAML would
/// have made of it); a non-finite number, which JSON cannot hold, as null.
pub fn from_struct(s: &Struct) -> Json {
    let mut fields: Vec<(&String, &Value)> = s.fields.iter().collect();
    // The map's order is random: sorted, the same Struct gives the same JSON.
    fields.sort_by(|a, b| a.0.cmp(b.0));
    Json::Object(
        fields
            .into_iter()
            .map(|(k, v)| (k.clone(), from_value(v)))
            .collect(),
    )
}

fn from_value(v: &Value) -> Json {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::BoolValue(b)) => Json::Bool(*b),
        Some(Kind::NumberValue(n)) => {
            if n.fract() == 0.0 && n.abs() < 9_007_199_254_740_992.0 {
                Json::from(*n as i64)
            } else {
                Number::from_f64(*n).map_or(Json::Null, Json::Number)
            }
        }
        Some(Kind::StringValue(s)) => Json::String(s.clone()),
        Some(Kind::ListValue(l)) => Json::Array(l.values.iter().map(from_value).collect()),
        Some(Kind::StructValue(s)) => from_struct(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_survives_the_round_trip() {
        let json = serde_json::json!({
            "a": {"b": [1, 2.5, "x", null, true]},
            "n": -7,
            "s": "v",
        });
        let Json::Object(map) = &json else {
            unreachable!()
        };
        assert_eq!(from_struct(&to_struct(map)), json);
    }
}
