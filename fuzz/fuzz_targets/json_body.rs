//! The admin port's `POST /json` body on arbitrary bytes: parsed or refused, then the same
//! conversion as gRPC. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate::service::Bounds;
use tollgate::service::json::JsonRequest;
use tollgate::service::rls::to_request;
use tollgate::settings::Settings;

fuzz_target!(|data: &[u8]| {
    let Ok(body) = serde_json::from_slice::<JsonRequest>(data) else {
        return;
    };
    let req = body.into_proto();
    let s = Settings::default();
    let bounds = Bounds {
        max_descriptors: s.max_descriptors,
        max_entries: s.max_entries,
        max_key_bytes: s.max_key_bytes,
        max_value_bytes: s.max_value_bytes,
    };
    let _ = to_request(&req, &bounds);
});
