//! The gRPC request path on arbitrary bytes: protobuf decoding and the proto → request
//! conversion with the default bounds. Anything is a request or a clear INVALID_ARGUMENT.
#![no_main]

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use tollgate::service::Bounds;
use tollgate::service::to_request;
use tollgate::settings::Settings;

fuzz_target!(|data: &[u8]| {
    let Ok(req) = RateLimitRequest::decode(data) else {
        return;
    };
    let bounds = Bounds::from_settings(&Settings::default());
    if let Err(status) = to_request(&req, &bounds) {
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    }
});
