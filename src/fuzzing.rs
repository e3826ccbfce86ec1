//! The bodies of the fuzz targets (`fuzz/fuzz_targets/`), as library functions: each takes the
//! fuzzer's bytes and asserts its input path's own invariant. The targets are one line around
//! them (built by `make fuzz` on the nightly toolchain, outside the workspace), and
//! `tests/fuzz_replay.rs` runs the committed seeds (`fuzz/seeds/<target>/`) through the same
//! bodies in `make test`: a refactor that breaks a body fails the day it lands, not the next
//! time someone fuzzes.
//!
//! [`TARGETS`] names each body; the replay test holds it to the files in `fuzz/fuzz_targets/`.

use std::path::PathBuf;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::Message;

use crate::configs;
use crate::keys::bucket_key;
use crate::rules::load::load_sources;
use crate::rules::{Algorithm, LoadOptions, Rate, Unit};
use crate::service::json::JsonRequest;
use crate::service::to_request;
use crate::settings::{KEYS, ServeArgs, Settings, from_reference_env};

/// A fuzz target's body: the fuzzer's bytes in, a panic if the path's invariant breaks.
pub type Body = fn(&[u8]);

/// Each fuzz target's name (its file in `fuzz/fuzz_targets/` and its seed folder) and body.
pub const TARGETS: &[(&str, Body)] = &[
    ("rules_yaml", rules_yaml),
    ("key_encoding", key_encoding),
    ("proto_request", proto_request),
    ("json_body", json_body),
    ("reference_env", reference_env),
    ("xds_config", xds_config),
    ("rlqs_reports", rlqs_reports),
];

/// The rules loader on any file: loaded or refused with an error, never a panic or a hang.
pub fn rules_yaml(data: &[u8]) {
    let text = String::from_utf8_lossy(data).into_owned();
    let _ = load_sources(
        &[(PathBuf::from("fuzz.yaml"), text)],
        LoadOptions::default(),
    );
}

/// The gRPC request path: protobuf decoding and the proto → request conversion with the
/// default bounds. Anything that decodes is a request or a clear INVALID_ARGUMENT.
pub fn proto_request(data: &[u8]) {
    let Ok(req) = RateLimitRequest::decode(data) else {
        return;
    };
    let bounds = configs::bounds(&Settings::default());
    if let Err(status) = to_request(&req, &bounds) {
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    }
}

/// The admin port's `POST /json` body: parsed or refused, then the same conversion as gRPC,
/// with the same answer: a request or INVALID_ARGUMENT.
pub fn json_body(data: &[u8]) {
    let Ok(body) = serde_json::from_slice::<JsonRequest>(data) else {
        return;
    };
    let req = body.into_proto();
    let bounds = configs::bounds(&Settings::default());
    if let Err(status) = to_request(&req, &bounds) {
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    }
}

/// A domain and its entries.
type Descriptor = (String, Vec<(String, String)>);

/// Two descriptors from the bytes: split at the first `0xFF` (the second is empty without
/// one), each a domain and then keys and values, split at `0x00` (a key without its value is
/// dropped); text as UTF-8, lossily.
pub fn two_descriptors(data: &[u8]) -> (Descriptor, Descriptor) {
    let (a, b) = match data.iter().position(|&x| x == 0xFF) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let one = |part: &[u8]| {
        let mut fields = part
            .split(|&x| x == 0)
            .map(|f| String::from_utf8_lossy(f).into_owned());
        let domain = fields.next().unwrap_or_default();
        let rest: Vec<String> = fields.collect();
        let entries = rest
            .chunks_exact(2)
            .map(|kv| (kv[0].clone(), kv[1].clone()))
            .collect();
        (domain, entries)
    };
    (one(a), one(b))
}

/// Key encoding: two different descriptors never share a store key, every key keeps its one
/// hash tag, and its size grows with the number of parts, not their length.
pub fn key_encoding(data: &[u8]) {
    let (a, b) = two_descriptors(data);
    let key = |(domain, entries): &Descriptor| {
        let rate = Rate {
            requests_per_unit: 10,
            unit: Unit::Minute,
            unit_multiplier: 1,
            burst: 10,
            algorithm: Algorithm::TokenBucket,
        };
        bucket_key(
            "tg:",
            domain,
            entries.iter().map(|(k, v)| (k.as_str(), v.as_str())),
            &rate,
            0,
            None,
        )
    };
    let (ka, kb) = (key(&a), key(&b));
    if a != b {
        assert_ne!(ka, kb, "two descriptors share a key: {a:?} / {b:?}");
    }
    for (k, d) in [(&ka, &a), (&kb, &b)] {
        // One tag: the first `{` and the last `}` enclose everything but the prefix.
        assert_eq!(k.matches('{').count(), 1, "{k}");
        assert_eq!(k.matches('}').count(), 1, "{k}");
        // A part longer than 64 bytes is hashed.
        let parts = 1 + 2 * d.1.len();
        assert!(
            k.len() <= 64 + parts * (3 * 64 + 2),
            "{} bytes for {parts} parts",
            k.len()
        );
    }
}

/// envoyproxy/ratelimit's environment (`NAME=VALUE` lines; `TOLLGATE_*` names are dropped, so
/// no settings file is read) through the whole start-up path of a replica started as
/// `ratelimit`: mapped or refused with its reason, never a panic. The mapping is a function of
/// the environment (the same twice), names only settings that exist, and reads or names as
/// ignored only variables that are set; the settings it gives load or are refused with an
/// error.
pub fn reference_env(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let vars: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| !k.starts_with("TOLLGATE_"))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let get = |name: &str| {
        vars.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let is_set = |name: &str| get(name).is_some_and(|v| !v.is_empty());
    let first = from_reference_env(get);
    let again = from_reference_env(get);
    match (&first, &again) {
        (Ok(a), Ok(b)) => {
            assert_eq!(
                (&a.env, &a.ignored, &a.read),
                (&b.env, &b.ignored, &b.read),
                "the same environment mapped twice differently"
            );
            for (key, _) in a.env.iter().chain(&a.defaults) {
                assert!(
                    KEYS.iter().any(|k| k.name == *key),
                    "mapped to an unknown setting {key}"
                );
            }
            for name in &a.read {
                assert!(is_set(name), "{name} read but not set");
            }
            for line in &a.ignored {
                let name = line.split(' ').next().unwrap_or_default();
                assert!(is_set(name), "{name} named as ignored but not set: {line}");
            }
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        _ => panic!("the same environment mapped once and refused once"),
    }
    let args = ServeArgs {
        reference_env: true,
        ..ServeArgs::default()
    };
    let _ = Settings::load(&args.sources(get));
}

/// One xDS `RateLimitConfig` resource (its protobuf bytes), as the rules' xDS source takes it:
/// a rule set or an error naming the resource, never a panic; a rule set never holds an empty
/// domain (every path that builds rules refuses it, as a rules file does).
pub fn xds_config(data: &[u8]) {
    use envoy_types::pb::google::protobuf::Any;
    let resource = Any {
        type_url: crate::rules::xds::TYPE_URL.to_string(),
        value: data.to_vec(),
    };
    if let Ok(set) = crate::rules::xds::rule_set(&[resource], LoadOptions::default()) {
        assert!(
            set.domains.keys().all(|d| !d.is_empty()),
            "an empty domain loaded from xDS"
        );
    }
}

/// A token bucket of this many tokens, in the domain [`rlqs_reports`] streams to.
const RLQS_CAPACITY: u64 = 600;
const RLQS_RULES: &str = "domain: quota\nrlqs: true\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 600}\n";

/// RLQS usage reports over one stream, as a peer may send them: reports split at `0xFE`, each
/// a domain byte (`quota`, none, or another) then 5 bytes per bucket usage (a tenant of four,
/// with an extra entry when the high bit is set; allowed as a u16; denied; elapsed in 100 ms),
/// on one memory store whose clock does not move. Each report is answered or ends the stream
/// with an error, never a panic, and the stream never holds more bucket ids than its cap.
/// The bound: whatever the peer reports, the tokens assigned to a tenant never exceed the
/// bucket's capacity plus the tokens its reports gave back (held − allowed at each settle).
pub fn rlqs_reports(data: &[u8]) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().build() else {
        return;
    };
    runtime.block_on(rlqs_stream(data));
}

/// The body of [`rlqs_reports`]; the tokens assigned in all (for the seeds' test).
async fn rlqs_stream(data: &[u8]) -> u64 {
    use std::collections::HashMap;
    use std::sync::Arc;

    use crate::clock::Clock;
    use crate::fleet::Replicas;
    use crate::limiter::Limiter;
    use crate::rlqs::{Assignment, BucketKey, Rlqs, Session, Usage};
    use crate::store::{MemoryStore, Store};
    use crate::telemetry::Metrics;

    let source = (PathBuf::from("quota.yaml"), RLQS_RULES.to_string());
    let rules = load_sources(&[source], LoadOptions::default()).expect("the fixed rules load");
    let settings = Settings::default();
    let clock = Clock::manual(1_700_000_000_000);
    let metrics = Arc::new(Metrics::new());
    let config = configs::limiter_config(
        &settings,
        Arc::new(Replicas::new(0, 1)),
        clock.clone(),
        false,
    );
    let limiter = Limiter::new(
        Store::Memory(MemoryStore::new(clock.clone())),
        config,
        metrics.clone(),
    );
    let rlqs = Rlqs::new(configs::rlqs_config(&settings, clock), metrics.rlqs.clone());
    let Ok(mut session) = Session::open(&rlqs, None) else {
        return 0;
    };
    // Per tenant: the last assignment not settled yet, all assigned, all given back.
    let (mut held, mut granted, mut returned) = (
        HashMap::<String, u64>::new(),
        HashMap::<String, u64>::new(),
        HashMap::<String, u64>::new(),
    );
    let tenant_of = |id: &BucketKey| match id.as_slice() {
        [(k, v)] if k == "tenant" => Some(v.clone()),
        _ => None,
    };
    for report in data.split(|&b| b == 0xFE).take(64) {
        let Some((&d, rest)) = report.split_first() else {
            continue;
        };
        let domain = ["quota", "", "other"][usize::from(d % 3)];
        let usages: Vec<Usage> = rest
            .chunks_exact(5)
            .map(|u| {
                let tenant = ("tenant".to_string(), format!("t{}", u[0] % 4));
                let id = if u[0] & 0x80 != 0 {
                    vec![("extra".to_string(), "x".to_string()), tenant]
                } else {
                    vec![tenant]
                };
                Usage {
                    id,
                    allowed: u64::from(u16::from_le_bytes([u[1], u[2]])),
                    denied: u64::from(u[3]),
                    elapsed_ms: u64::from(u[4]) * 100,
                }
            })
            .collect();
        // What each tenant says it admitted in this report (a repeated id counts once each).
        let mut allowed: HashMap<String, u64> = HashMap::new();
        for u in &usages {
            if let Some(t) = tenant_of(&u.id) {
                let a = allowed.entry(t).or_default();
                *a = a.saturating_add(u.allowed);
            }
        }
        let Ok(actions) = session.report(&limiter, &rules, domain, usages).await else {
            break;
        };
        for (tenant, a) in allowed {
            let h = held.remove(&tenant).unwrap_or(0);
            *returned.entry(tenant).or_default() += h.saturating_sub(a);
        }
        for action in actions {
            let (Some(tenant), Assignment::Tokens { tokens, .. }) =
                (tenant_of(&action.id), action.assignment)
            else {
                continue;
            };
            held.insert(tenant.clone(), tokens);
            let g = granted.entry(tenant.clone()).or_default();
            *g += tokens;
            let back = returned.get(&tenant).copied().unwrap_or(0);
            assert!(
                *g <= RLQS_CAPACITY + back,
                "{tenant}: {g} tokens assigned from a bucket of {RLQS_CAPACITY} given back {back}"
            );
        }
        assert!(session.buckets() <= session.config().max_buckets_per_stream);
    }
    granted.values().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed(target: &str, name: &str) -> Vec<u8> {
        let path =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("fuzz/seeds/{target}/{name}"));
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The committed seeds reach the paths their targets are for (a seed refused at its first
    /// check would leave the fuzzer to find the rest by chance).
    #[test]
    fn the_new_targets_seeds_reach_their_paths() {
        use envoy_types::pb::google::protobuf::Any;
        for name in ["edge.bin", "unlimited.bin"] {
            let resource = Any {
                type_url: crate::rules::xds::TYPE_URL.to_string(),
                value: seed("xds_config", name),
            };
            let set = crate::rules::xds::rule_set(&[resource], LoadOptions::default())
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(set.domains.len(), 1, "{name}");
        }
        for name in ["cluster-statsd.env", "gateway-prometheus.env"] {
            let text = String::from_utf8(seed("reference_env", name)).unwrap();
            let get = |k: &str| {
                text.lines()
                    .filter_map(|l| l.split_once('='))
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            };
            let mapped = from_reference_env(get).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(mapped.env.len() >= 5, "{name}: {:?}", mapped.env);
            reference_env(text.as_bytes());
        }
        // The RLQS seeds are answered with tokens: the bound is checked on real assignments.
        for name in ["settle-and-claim.bin", "repeated-ids.bin"] {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let granted = runtime.block_on(rlqs_stream(&seed("rlqs_reports", name)));
            assert!(granted > 0, "{name}: no tokens assigned");
        }
    }
}
