//! A request that does not decode is the caller's fault: gRPC `INVALID_ARGUMENT`, not
//! `INTERNAL`.
//!
//! tonic's protobuf codec answers a message that is not valid protobuf (or a string field
//! that is not UTF-8) with `INTERNAL` before the handler ever runs, so the handler cannot
//! choose the code. [`DecodeErrorsLayer`] sits in front of the services and rewrites exactly
//! that answer (status 13 whose message is prost's "failed to decode Protobuf message") to
//! `INVALID_ARGUMENT`, keeping the message. Any other `INTERNAL` is left alone: it would be
//! tollgate's own fault.

use std::task::{Context, Poll};

use futures_util::TryFutureExt;
use futures_util::future::MapOk;
use http::HeaderValue;
use tower_layer::Layer;
use tower_service::Service;

/// prost's `DecodeError` text, as tonic puts it in `grpc-message` (percent-encoded) or not.
const DECODE_ERROR: [&str; 2] = [
    "failed%20to%20decode%20Protobuf%20message",
    "failed to decode Protobuf message",
];

#[derive(Clone, Copy, Debug, Default)]
pub struct DecodeErrorsLayer;

impl<S> Layer<S> for DecodeErrorsLayer {
    type Service = DecodeErrors<S>;

    fn layer(&self, inner: S) -> DecodeErrors<S> {
        DecodeErrors { inner }
    }
}

#[derive(Clone, Debug)]
pub struct DecodeErrors<S> {
    inner: S,
}

impl<S, Req, B> Service<Req> for DecodeErrors<S>
where
    S: Service<Req, Response = http::Response<B>>,
{
    type Response = http::Response<B>;
    type Error = S::Error;
    type Future = MapOk<S::Future, fn(http::Response<B>) -> http::Response<B>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.inner.call(req).map_ok(rewrite)
    }
}

/// The headers a trailers-only gRPC answer carries its status in, named once: a name looked up
/// by `&str` is parsed and checked on every call, and every response passes here.
static GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
static GRPC_MESSAGE: http::HeaderName = http::HeaderName::from_static("grpc-message");

/// `INTERNAL` + a decode error → `INVALID_ARGUMENT` (a trailers-only answer: the status is
/// in the headers). A normal answer (its status in the trailers) costs one look-up.
fn rewrite<B>(mut response: http::Response<B>) -> http::Response<B> {
    let headers = response.headers_mut();
    if headers.get(&GRPC_STATUS).is_none_or(|s| s != "13") {
        return response;
    }
    let decode = headers
        .get(&GRPC_MESSAGE)
        .and_then(|m| m.to_str().ok())
        .is_some_and(|m| DECODE_ERROR.iter().any(|d| m.starts_with(d)));
    if decode {
        headers.insert(&GRPC_STATUS, HeaderValue::from_static("3"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: &'static str, message: &'static str) -> http::Response<()> {
        let mut r = http::Response::new(());
        r.headers_mut()
            .insert("grpc-status", HeaderValue::from_static(status));
        r.headers_mut()
            .insert("grpc-message", HeaderValue::from_static(message));
        r
    }

    #[test]
    fn only_a_decode_error_becomes_invalid_argument() {
        let status = |r: http::Response<()>| r.headers()["grpc-status"].clone();
        assert_eq!(
            status(rewrite(answer(
                "13",
                "failed%20to%20decode%20Protobuf%20message:%20invalid%20varint"
            ))),
            "3"
        );
        assert_eq!(status(rewrite(answer("13", "store exploded"))), "13");
        assert_eq!(
            status(rewrite(answer("8", "failed to decode Protobuf message"))),
            "8"
        );
        // An answer without a status (a normal response) is left alone.
        assert!(
            !rewrite(http::Response::new(()))
                .headers()
                .contains_key("grpc-status")
        );
    }
}
