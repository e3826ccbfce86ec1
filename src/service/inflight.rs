//! Request bytes in flight on the gRPC port: one budget for the whole process
//! (`max_request_bytes_in_flight`).
//!
//! tonic buffers a request's message until it is whole before decoding it, and it reserves the
//! whole message as soon as the 5-byte gRPC frame header announces its length. A peer that
//! opens streams and never finishes their messages would hold up to `max_message_bytes` per
//! stream, `grpc_max_concurrent_streams` streams per connection, on as many connections as it
//! opens: gigabytes, from one host. [`InFlightLayer`] wraps every request body and reads the
//! gRPC framing as the data passes: when a frame header announces a message of `len` bytes
//! that does not arrive whole in the same HTTP/2 DATA frame (so tonic will hold it while it
//! waits for the rest), `len` is taken from the budget before tonic sees that header (so
//! before it reserves), and it is given back when the message's last byte has passed (tonic
//! decodes it then; a streaming request such as an RLQS stream goes on after it) or when the
//! body is dropped (the stream ended or was reset). A
//! message that does not fit fails its stream with RESOURCE_EXHAUSTED, counted in
//! `tollgate_refused_total{what="request_bytes"}`; tonic never sees its header, so nothing is
//! reserved for it. A length above `max_message_bytes` is left to tonic, which refuses it
//! (OUT_OF_RANGE) without reserving.
//!
//! A message that arrives whole in one DATA frame is not charged: tonic decodes it at once, so
//! it waits for nothing and cannot be hoarded. That is every real RLS request (a few hundred
//! bytes, which Envoy sends as prefix and message in one frame), so a peer that fills the
//! budget with unfinished messages does not refuse legitimate traffic: it only refuses its
//! own next unfinished ones.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;
use tonic::Status;
use tonic::body::Body;
use tower_layer::Layer;
use tower_service::Service;

/// The process-wide budget of request bytes being received.
#[derive(Debug)]
pub struct Budget {
    max: usize,
    /// `max_message_bytes`: longer messages are tonic's to refuse.
    max_message: usize,
    used: AtomicUsize,
    /// Streams failed because the budget was spent.
    refused: Counter,
}

impl Budget {
    pub fn new(max: usize, max_message: usize, refused: Counter) -> Arc<Self> {
        Arc::new(Budget {
            max,
            max_message,
            used: AtomicUsize::new(0),
            refused,
        })
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Takes `n` bytes if they fit.
    fn try_take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&total| total <= self.max)
            })
            .is_ok()
    }

    fn give_back(&self, n: usize) {
        if n > 0 {
            self.used.fetch_sub(n, Ordering::AcqRel);
        }
    }
}

/// Wraps each gRPC request's body in a [`Counted`] body.
#[derive(Clone, Debug)]
pub struct InFlightLayer {
    budget: Arc<Budget>,
}

impl InFlightLayer {
    pub fn new(budget: Arc<Budget>) -> Self {
        InFlightLayer { budget }
    }
}

impl<S> Layer<S> for InFlightLayer {
    type Service = InFlight<S>;

    fn layer(&self, inner: S) -> InFlight<S> {
        InFlight {
            inner,
            budget: self.budget.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct InFlight<S> {
    inner: S,
    budget: Arc<Budget>,
}

impl<S> Service<http::Request<Body>> for InFlight<S>
where
    S: Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let budget = self.budget.clone();
        self.inner.call(req.map(|inner| {
            Body::new(Counted {
                inner,
                budget,
                held: 0,
                current: 0,
                framing: Framing::default(),
            })
        }))
    }
}

/// A request body whose announced messages count against the [`Budget`] until they have
/// arrived whole (a stream of many messages, as an RLQS stream is, holds at most its one
/// unfinished message) or the body is dropped.
struct Counted {
    inner: Body,
    budget: Arc<Budget>,
    held: usize,
    /// What the message still arriving holds of `held` (0 if it was not charged).
    current: usize,
    framing: Framing,
}

/// Where the body stands in the gRPC framing: `[flag: u8][len: u32 BE][len bytes]`, repeated.
#[derive(Debug, Default)]
struct Framing {
    header: [u8; 5],
    /// Header bytes seen of the message to come.
    have: usize,
    /// Bytes of the current message still to come.
    left: usize,
    /// Set by [`Framing::announced`]: the message whose payload was still arriving when the
    /// frame began ended in it.
    ended: bool,
}

impl Framing {
    /// Moves over `data` (one DATA frame); returns the lengths announced by the headers
    /// completed in it, each with whether its message also ended in it.
    fn announced(&mut self, mut data: &[u8]) -> Vec<(usize, bool)> {
        let mut lengths = Vec::new();
        self.ended = false;
        let mut pending = self.left > 0;
        while !data.is_empty() {
            if self.left > 0 {
                let n = self.left.min(data.len());
                self.left -= n;
                data = &data[n..];
                if std::mem::take(&mut pending) && self.left == 0 {
                    self.ended = true;
                }
                continue;
            }
            let n = (5 - self.have).min(data.len());
            self.header[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data = &data[n..];
            if self.have == 5 {
                self.have = 0;
                let len = u32::from_be_bytes([
                    self.header[1],
                    self.header[2],
                    self.header[3],
                    self.header[4],
                ]) as usize;
                self.left = len;
                lengths.push((len, len <= data.len()));
            }
        }
        lengths
    }
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        if let Some(data) = frame.data_ref() {
            let announced = this.framing.announced(data);
            if this.framing.ended {
                // Whole now: tonic decodes it at once and holds it no longer.
                this.budget.give_back(this.current);
                this.held -= this.current;
                this.current = 0;
            }
            for (len, whole) in announced {
                // Whole in this frame: decoded at once, held by nobody. Past
                // max_message_bytes: tonic refuses it itself, reserving nothing.
                if whole || len > this.budget.max_message {
                    continue;
                }
                if !this.budget.try_take(len) {
                    this.budget.refused.inc();
                    return Poll::Ready(Some(Err(Status::resource_exhausted(
                        "tollgate is receiving max_request_bytes_in_flight of requests already; retry",
                    ))));
                }
                this.held += len;
                this.current = len;
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.budget.give_back(self.held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_takes_what_fits_and_gets_it_back() {
        let budget = Budget::new(10, 100, Counter::default());
        assert!(budget.try_take(6));
        assert!(!budget.try_take(5), "6 + 5 > 10");
        assert!(budget.try_take(4));
        assert_eq!(budget.used(), 10);
        budget.give_back(6);
        assert!(budget.try_take(5));
        assert_eq!(budget.used(), 9);
    }

    #[test]
    fn the_framing_is_read_across_chunks() {
        let mut f = Framing::default();
        // A header split over two chunks, its message, then two whole messages in one chunk.
        assert!(f.announced(&[0, 0, 0]).is_empty());
        assert_eq!(f.announced(&[0, 3, b'a']), [(3, false)]);
        assert!(f.announced(b"bc").is_empty());
        assert_eq!(
            f.announced(&[0, 0, 0, 0, 1, b'x', 0, 0, 0, 0, 0]),
            [(1, true), (0, true)]
        );
        assert_eq!(f.announced(&[0, 0, 1, 0, 0]), [(65_536, false)]);
    }

    /// gRPC frames of `len`-byte messages, `sent` bytes of each payload.
    fn frame(len: u32, sent: usize) -> Bytes {
        let mut b = vec![0u8];
        b.extend_from_slice(&len.to_be_bytes());
        b.extend(std::iter::repeat_n(b'x', sent));
        Bytes::from(b)
    }

    fn counted(budget: &Arc<Budget>, chunks: Vec<Bytes>) -> Counted {
        let chunks =
            futures_util::stream::iter(chunks.into_iter().map(|c| Ok::<_, Status>(Frame::data(c))));
        Counted {
            inner: Body::new(http_body_util::StreamBody::new(chunks)),
            budget: budget.clone(),
            held: 0,
            current: 0,
            framing: Framing::default(),
        }
    }

    #[tokio::test]
    async fn a_stream_of_messages_holds_only_the_one_still_arriving() {
        use http_body_util::BodyExt;
        let budget = Budget::new(100, 1_000, Counter::default());
        // Three 60-byte messages, each split over two frames, on one long-lived stream.
        let mut chunks = Vec::new();
        for _ in 0..3 {
            chunks.push(frame(60, 10));
            chunks.push(Bytes::from(vec![b'x'; 50]));
        }
        let mut stream = counted(&budget, chunks);
        for _ in 0..3 {
            assert!(stream.frame().await.unwrap().is_ok());
            assert_eq!(budget.used(), 60, "the message still arriving");
            assert!(stream.frame().await.unwrap().is_ok());
            assert_eq!(
                budget.used(),
                0,
                "whole: given back while the stream goes on"
            );
        }
    }

    #[tokio::test]
    async fn an_announced_message_past_the_budget_fails_its_stream_and_all_is_given_back() {
        use http_body_util::BodyExt;
        let refused = Counter::default();
        let budget = Budget::new(100, 1_000, refused.clone());
        // The first stream's header announces 60 bytes: taken at once, before its payload.
        let mut first = counted(&budget, vec![frame(60, 10), Bytes::from(vec![b'x'; 50])]);
        assert!(first.frame().await.unwrap().is_ok());
        assert_eq!(budget.used(), 60);
        // A second stream announcing 50 does not fit: refused before tonic sees its header.
        let mut second = counted(&budget, vec![frame(50, 0)]);
        let err = second.frame().await.unwrap().unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert_eq!(refused.get(), 1);
        // A length past max_message_bytes is tonic's to refuse: not charged here.
        let mut third = counted(&budget, vec![frame(5_000, 0)]);
        assert!(third.frame().await.unwrap().is_ok());
        // A message whole in its frame is decoded at once: not charged, not refused.
        let mut fourth = counted(&budget, vec![frame(50, 50)]);
        assert!(fourth.frame().await.unwrap().is_ok());
        assert_eq!(budget.used(), 60);
        drop((first, second, third, fourth));
        assert_eq!(budget.used(), 0, "everything given back");
    }
}
