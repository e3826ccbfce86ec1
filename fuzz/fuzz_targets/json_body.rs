//! The admin port's `POST /json` body on arbitrary bytes: parsed or refused, then the same
//! conversion as gRPC. Never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate::service::Bounds;
use tollgate::service::json::JsonRequest;
use tollgate::service::to_request;
use tollgate::settings::Settings;

fuzz_target!(|data: &[u8]| {
    let Ok(body) = serde_json::from_slice::<JsonRequest>(data) else {
        return;
    };
    let req = body.into_proto();
    let bounds = Bounds::from_settings(&Settings::default());
    let _ = to_request(&req, &bounds);
});
