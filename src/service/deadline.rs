//! The caller's deadline, stamped when its request's headers arrive: gRPC's `grpc-timeout`
//! (Envoy sends its ratelimit filter's `timeout`, 20 ms by default) read against the instant
//! [`DeadlineLayer`] first sees the request, in front of every other layer, so the time the
//! body takes to arrive and decode counts against it. Time the request spent in the kernel's
//! accept and receive queues before that is invisible here: a replica whose sockets queue
//! answers that much later than it thinks.
//!
//! The handler reads the [`Deadline`] from the request's extensions and gives the decision the
//! rest of it less `decision_margin_ms` ([`Deadline::budget`]); the limiter decides what the
//! store has not answered by then from the fallback (`limiter/mod.rs`), so an answer is on its
//! way before Envoy gives up and applies its own failure mode.

use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tower_layer::Layer;
use tower_service::Service;

/// When the caller gives up on a request (its arrival + its `grpc-timeout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline(pub Instant);

impl Deadline {
    /// What is left for the decision at `now`, `margin` kept back for the answer's way to the
    /// caller: zero when the deadline (less the margin) has passed.
    pub fn budget(self, now: Instant, margin: Duration) -> Duration {
        self.0.saturating_duration_since(now).saturating_sub(margin)
    }
}

/// gRPC's `grpc-timeout` value: at most 8 digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`).
/// `None` for anything else (the header is then ignored, as a missing one is).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3_600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

static GRPC_TIMEOUT: http::HeaderName = http::HeaderName::from_static("grpc-timeout");

/// Stamps each request that carries a `grpc-timeout` with its [`Deadline`].
#[derive(Clone, Copy, Debug, Default)]
pub struct DeadlineLayer;

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadlines<S>;

    fn layer(&self, inner: S) -> Deadlines<S> {
        Deadlines { inner }
    }
}

#[derive(Clone, Debug)]
pub struct Deadlines<S> {
    inner: S,
}

impl<S, B> Service<http::Request<B>> for Deadlines<S>
where
    S: Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let timeout = req
            .headers()
            .get(&GRPC_TIMEOUT)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout);
        if let Some(t) = timeout
            && let Some(at) = Instant::now().checked_add(t)
        {
            req.extensions_mut().insert(Deadline(at));
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_as_the_spec_writes_them() {
        assert_eq!(parse_grpc_timeout("20m"), Some(Duration::from_millis(20)));
        assert_eq!(
            parse_grpc_timeout("19999u"),
            Some(Duration::from_micros(19_999))
        );
        assert_eq!(parse_grpc_timeout("1S"), Some(Duration::from_secs(1)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3_600)));
        assert_eq!(parse_grpc_timeout("500n"), Some(Duration::from_nanos(500)));
        for bad in ["", "m", "20", "20x", "-1m", "123456789m", "2 m", "1.5S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_budget_keeps_the_margin_back_and_never_goes_below_zero() {
        let now = Instant::now();
        let d = Deadline(now + Duration::from_millis(20));
        let margin = Duration::from_millis(4);
        assert_eq!(d.budget(now, margin), Duration::from_millis(16));
        assert_eq!(
            d.budget(now + Duration::from_millis(17), margin),
            Duration::ZERO
        );
        assert_eq!(
            d.budget(now + Duration::from_secs(1), margin),
            Duration::ZERO
        );
    }
}
