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
    ("limit_overrides", limit_overrides),
    ("simulate_scenario", simulate_scenario),
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
            calendar: None,
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

/// A limiter of `settings` on a memory store on `clock`, one replica: what the bodies that
/// decide ([`rlqs_reports`], [`limit_overrides`]) decide with.
fn memory_limiter(
    settings: &Settings,
    clock: &crate::clock::Clock,
    metrics: std::sync::Arc<crate::telemetry::Metrics>,
) -> crate::limiter::Limiter {
    use std::sync::Arc;

    use crate::fleet::Replicas;
    use crate::store::{MemoryStore, Store};

    let config = configs::limiter_config(
        settings,
        Arc::new(Replicas::new(0, 1)),
        clock.clone(),
        false,
    );
    crate::limiter::Limiter::new(
        Store::Memory(MemoryStore::new(clock.clone())),
        config,
        metrics,
    )
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
    use crate::rlqs::{Assignment, BucketKey, Rlqs, Session, Usage};
    use crate::telemetry::Metrics;

    let source = (PathBuf::from("quota.yaml"), RLQS_RULES.to_string());
    let rules = load_sources(&[source], LoadOptions::default()).expect("the fixed rules load");
    let settings = Settings::default();
    let clock = Clock::manual(1_700_000_000_000);
    let metrics = Arc::new(Metrics::new());
    let limiter = memory_limiter(&settings, &clock, metrics.clone());
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

/// The rules every fuzzed scenario names (`rules: rules/`, in a directory of this process).
const SCENARIO_RULES: &str = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 100}\n";

/// The directory [`simulate_scenario`] reads scenarios from: `rules/edge.yaml` and nothing else.
fn scenario_dir() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("tollgate-fuzz-scenario-{}", std::process::id()));
        let _ = std::fs::create_dir_all(dir.join("rules"));
        let _ = std::fs::write(dir.join("rules/edge.yaml"), SCENARIO_RULES);
        dir
    })
}

/// A `tollgate simulate` scenario file (YAML), checked as the command checks it (not run): a
/// scenario within its own bounds, or errors that each name a line, never a panic. Only
/// scenarios whose `rules:` is `rules/` are read (the same YAML parser decides it): any other
/// path would have the fuzzer load whatever directory it names, the whole file system included.
pub fn simulate_scenario(data: &[u8]) {
    use crate::rules::yaml::{self, Value};
    use crate::sim::Scenario;
    use crate::sim::scenario::{MAX_DURATION_S, MAX_NODES, MAX_RATE, MAX_REPLICAS};

    let text = String::from_utf8_lossy(data);
    if let Ok(Some(root)) = yaml::parse(&text)
        && let Value::Map(fields) = &root.value
    {
        let names_other_rules = fields.iter().any(|(k, v)| {
            matches!(&k.value, Value::Scalar { text, .. } if text == "rules")
                && !matches!(&v.value, Value::Scalar { text, .. } if text == "rules/")
        });
        if names_other_rules {
            return;
        }
    }
    match Scenario::parse(&scenario_dir().join("s.yaml"), &text) {
        Ok(s) => {
            assert!(
                (1..=MAX_DURATION_S).contains(&s.duration_s),
                "{}",
                s.duration_s
            );
            assert!((1..=MAX_NODES).contains(&u64::from(s.store.nodes)));
            let sizes =
                std::iter::once(s.replicas.start).chain(s.replicas.changes.iter().map(|c| c.1));
            for n in sizes {
                assert!(u64::from(n) <= MAX_REPLICAS, "{n} replicas");
            }
            assert!(!s.traffic.is_empty(), "a scenario without traffic");
            let regions = s.regions.as_ref();
            if let Some(r) = regions {
                assert!((2..=16).contains(&r.names.len()), "{:?}", r.names);
                assert_eq!(r.names.len(), r.weights.len());
                assert!(r.weights.iter().all(|w| (0.001..=1000.0).contains(w)));
                let most = std::iter::once(s.replicas.start)
                    .chain(s.replicas.changes.iter().map(|c| c.1))
                    .max()
                    .unwrap_or(0);
                assert!(u64::from(most) * r.names.len() as u64 <= MAX_REPLICAS);
            }
            for t in &s.traffic {
                assert!(s.rules.domains.contains_key(&t.domain), "{}", t.domain);
                // A stream reaches a region the scenario has, and only with regions.
                match (regions, &t.region) {
                    (Some(r), Some(name)) => assert!(r.names.contains(name), "{name}"),
                    (None, None) => {}
                    other => panic!("a stream's region without regions, or none with: {other:?}"),
                }
                assert!(t.to_s.is_none_or(|to| to > t.from_s), "{t:?}");
                assert!(
                    t.rate_per_s > 0.0 && t.rate_per_s <= MAX_RATE,
                    "{}",
                    t.rate_per_s
                );
            }
        }
        Err(e) => {
            assert!(!e.errors.is_empty(), "refused without a reason");
            for problem in &e.errors {
                assert!(
                    problem.line >= 1 && !problem.message.is_empty(),
                    "{problem}"
                );
            }
        }
    }
}

/// One bucket of [`limit_overrides`]: a tenant, and its override's size and unit (none: the rule).
type OverrideBucket = (u8, Option<(u32, i32)>);

/// The rule [`limit_overrides`] overrides: 5 a minute per tenant.
const OVERRIDE_RULES: &str = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
const OVERRIDE_RULE_LIMIT: u64 = 5;

/// Envoy's per-descriptor `limit` overrides and `hits_addend`s, through the gRPC path
/// (`to_request` with the default bounds, then `Limiter::decide`) on one memory store whose
/// clock does not move. The first byte picks the default algorithm (an override's); then
/// requests split at `0xFE`, each a request-level `hits_addend` byte and 6 bytes per descriptor
/// (flags: an override, a descriptor `hits_addend`, a huge one, a refund (`is_negative_hits`);
/// a tenant of three; the override's requests per unit as a u16; its unit as the proto sends
/// it, unknown ones included; the hits). The bound: whatever Envoy sends, the hits admitted
/// into one bucket (a tenant's rule, or a tenant's override of one size and unit) never exceed
/// what it holds, the override's `requests_per_unit` or the rule's 5, plus the hits refunded
/// to it; a refund is never refused; a request is decided or refused with INVALID_ARGUMENT,
/// never a panic.
pub fn limit_overrides(data: &[u8]) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().build() else {
        return;
    };
    runtime.block_on(override_stream(data));
}

/// The body of [`limit_overrides`]; the hits admitted in all (for the seeds' test).
async fn override_stream(data: &[u8]) -> u64 {
    use std::collections::HashMap;
    use std::sync::Arc;

    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use envoy_types::pb::google::protobuf::UInt64Value;

    use crate::clock::Clock;
    use crate::limiter::Code;
    use crate::telemetry::Metrics;

    let Some((&algorithm, rest)) = data.split_first() else {
        return 0;
    };
    let source = (PathBuf::from("edge.yaml"), OVERRIDE_RULES.to_string());
    let rules = load_sources(&[source], LoadOptions::default()).expect("the fixed rules load");
    let settings = Settings {
        default_algorithm: [
            Algorithm::TokenBucket,
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::SlidingLog,
        ][usize::from(algorithm % 4)],
        ..Settings::default()
    };
    let bounds = configs::bounds(&settings);
    let clock = Clock::manual(1_700_000_000_000);
    let limiter = memory_limiter(&settings, &clock, Arc::new(Metrics::new()));
    // Per bucket (tenant, override): the hits admitted, and what the bucket holds (its size
    // plus the hits refunded to it).
    let mut admitted: HashMap<OverrideBucket, (u64, u64)> = HashMap::new();
    let mut total = 0;
    for request in rest.split(|&b| b == 0xFE).take(64) {
        let Some((&request_hits, descriptors)) = request.split_first() else {
            continue;
        };
        let mut buckets = Vec::new();
        let proto = RateLimitRequest {
            domain: "edge".into(),
            descriptors: descriptors
                .chunks_exact(6)
                .map(|d| {
                    let (flags, tenant) = (d[0], d[1] % 3);
                    let rpu = u32::from(u16::from_le_bytes([d[2], d[3]]));
                    let unit = i32::from(d[4]);
                    let limit = (flags & 1 != 0).then_some(RateLimitOverride {
                        requests_per_unit: rpu,
                        unit,
                    });
                    let hits = if flags & 4 != 0 {
                        u64::from(d[5]) << 40
                    } else {
                        u64::from(d[5])
                    };
                    let cap = match limit {
                        Some(_) => u64::from(rpu),
                        None => OVERRIDE_RULE_LIMIT,
                    };
                    buckets.push(((tenant, limit.map(|l| (rpu, l.unit))), cap));
                    RateLimitDescriptor {
                        entries: vec![Entry {
                            key: "tenant".into(),
                            value: format!("t{tenant}"),
                        }],
                        limit,
                        hits_addend: (flags & 2 != 0).then_some(UInt64Value { value: hits }),
                        is_negative_hits: flags & 8 != 0,
                    }
                })
                .collect(),
            hits_addend: u32::from(request_hits),
        };
        let req = match to_request(&proto, &bounds) {
            Ok(req) => req,
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
                continue;
            }
        };
        let decision = match limiter.decide(&rules, &req).await {
            Ok(d) => d,
            Err(e) => panic!("a memory store failed: {e}"),
        };
        // A request's refunds are applied before its takes (limiter/plan.rs), wherever they
        // stand in it: credit them first.
        let cost_of = |i: usize| {
            let d = &req.descriptors[i];
            d.hits_addend.unwrap_or(req.hits_addend.max(1))
        };
        for (i, (bucket, cap)) in buckets.iter().enumerate() {
            if req.descriptors[i].refund {
                assert_eq!(
                    decision.statuses[i].code,
                    Code::Ok,
                    "a refund is never refused"
                );
                let (_, held) = admitted.entry(*bucket).or_insert((0, *cap));
                *held = held.saturating_add(cost_of(i));
            }
        }
        for (i, (bucket, cap)) in buckets.into_iter().enumerate() {
            let cost = cost_of(i);
            if req.descriptors[i].refund || decision.statuses[i].code != Code::Ok {
                continue;
            }
            let (sum, held) = admitted.entry(bucket).or_insert((0, cap));
            *sum = sum.saturating_add(cost);
            total += cost;
            assert!(
                *sum <= *held,
                "{bucket:?}: {sum} hits admitted into a bucket of {held}"
            );
        }
    }
    total
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
        // The override seeds, decided as the rules say. overrides.bin (token bucket): 1 + 2 of
        // tenant 0's override of 3 (the next 2 refused), 1 + 2 of tenant 1's rule of 5 (then 3
        // + 3 refused), a check (0) and 1 of tenant 2's; an unknown unit and a hits_addend of
        // 2^40 refused: 7. every-algorithm.bin (sliding log; 60,000 an hour is past its cap, a
        // sliding window): 200 + 200 of it, 3 of 4 a week (3 more refused), 2 of 2 a day: 405.
        // refunds.bin (token bucket): 5 of tenant 0's 5 (a sixth refused), a refund of 2, then
        // 2 of 3: 7, the 5 it holds and the 2 given back.
        for (name, want) in [
            ("overrides.bin", 7),
            ("every-algorithm.bin", 405),
            ("refunds.bin", 7),
        ] {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let admitted = runtime.block_on(override_stream(&seed("limit_overrides", name)));
            assert_eq!(admitted, want, "{name}");
        }
        // The scenario seeds: one loads (and its rules are the fuzz directory's), one is
        // refused with its lines.
        let text = String::from_utf8(seed("simulate_scenario", "small.yaml")).unwrap();
        let s = crate::sim::Scenario::parse(&scenario_dir().join("s.yaml"), &text)
            .unwrap_or_else(|e| panic!("small.yaml: {e}"));
        assert_eq!((s.duration_s, s.store.nodes, s.traffic.len()), (5, 3, 2));
        simulate_scenario(text.as_bytes());
        let bad = String::from_utf8(seed("simulate_scenario", "bad.yaml")).unwrap();
        let e = crate::sim::Scenario::parse(&scenario_dir().join("s.yaml"), &bad)
            .expect_err("bad.yaml is refused");
        assert!(e.errors.len() >= 3, "{e}");
        // A scenario naming any other rules is not read (it could name `/`).
        simulate_scenario(b"rules: /\nduration_s: 1\n");
        let regions = String::from_utf8(seed("simulate_scenario", "regions.yaml")).unwrap();
        let s = crate::sim::Scenario::parse(&scenario_dir().join("s.yaml"), &regions)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.regions.map(|r| r.weights), Some(vec![2.0, 1.0, 0.5]));
        simulate_scenario(regions.as_bytes());
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
