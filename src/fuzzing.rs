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
use crate::settings::Settings;

/// A fuzz target's body: the fuzzer's bytes in, a panic if the path's invariant breaks.
pub type Body = fn(&[u8]);

/// Each fuzz target's name (its file in `fuzz/fuzz_targets/` and its seed folder) and body.
pub const TARGETS: &[(&str, Body)] = &[
    ("rules_yaml", rules_yaml),
    ("key_encoding", key_encoding),
    ("proto_request", proto_request),
    ("json_body", json_body),
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
