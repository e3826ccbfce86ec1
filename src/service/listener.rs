//! The accept loop of both ports: a cap on open connections and, on the gRPC port, a deadline
//! on the handshake.
//!
//! Each connection accepted from the listener takes a permit of the port's cap
//! (`grpc_max_connections`, `admin_max_connections`); the permit goes back when the
//! connection closes. Past the cap a new connection is accepted and closed at once (counted in
//! `tollgate_refused_total{what="connections"}` or `{what="admin_connections"}`, warned about
//! at most every 10 s), so the listener's backlog never fills with peers that wait for
//! nothing. An `accept` error (out of file descriptors: `EMFILE`) is warned about the same way
//! and the loop pauses 100 ms instead of spinning on it.
//!
//! On the gRPC port a new connection must deliver its first [`HANDSHAKE_BYTES`] within
//! `grpc_handshake_timeout_ms` (the HTTP/2 preface and SETTINGS frame, or a TLS ClientHello,
//! are more than that): a peer that sends its preface a byte at a time, or nothing, is closed
//! then instead of holding a connection and its buffers for ever. Once it has, the HTTP/2
//! keepalive (`grpc_keepalive_*`) watches it. The admin port (HTTP/1) has hyper's header
//! read timeout instead (see `admin.rs`).
//!
//! Each connection is a file: [`raise_open_files_limit`] lifts the process's soft `nofile`
//! limit to the hard one at startup, so the caps above are reached before `EMFILE` is.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::Stream;
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Bytes a new connection must send within the handshake timeout.
pub const HANDSHAKE_BYTES: usize = 64;

/// How often a refused connection or an accept error is logged at most.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The accept loop's settings and counters.
#[derive(Clone, Debug)]
pub struct Limits {
    /// For the log lines: `gRPC` or `admin`.
    pub port: &'static str,
    pub max_connections: usize,
    /// `None`: no deadline on the first bytes.
    pub handshake_timeout: Option<Duration>,
    /// `tollgate_refused_total{what=…}`.
    pub refused: Counter,
}

/// The connections of `listener`, capped and deadlined as the module doc says, as the stream
/// tonic serves.
pub fn incoming(
    listener: TcpListener,
    limits: Limits,
) -> impl Stream<Item = Result<Conn, io::Error>> + Send + 'static {
    futures_util::stream::unfold(Accept::new(listener, limits), |state| async move {
        let conn = state.next().await;
        Some((Ok(conn), state))
    })
}

/// A listener with its cap: [`Accept::next`] is the next connection within it.
pub struct Accept {
    listener: TcpListener,
    permits: Arc<Semaphore>,
    limits: Limits,
    started: Instant,
    /// ms since `started` of the last warning (0: none yet).
    last_warning_ms: AtomicU64,
}

impl Accept {
    pub fn new(listener: TcpListener, limits: Limits) -> Self {
        Accept {
            listener,
            permits: Arc::new(Semaphore::new(limits.max_connections)),
            limits,
            started: Instant::now(),
            last_warning_ms: AtomicU64::new(0),
        }
    }

    /// The next connection within the cap.
    pub async fn next(&self) -> Conn {
        loop {
            let (tcp, peer) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    let port = self.limits.port;
                    self.warn(|| tracing::warn!(port, error = %e, "accept failed (out of file descriptors?); pausing 100 ms"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(permit) = self.permits.clone().try_acquire_owned() else {
                self.limits.refused.inc();
                let max = self.limits.max_connections;
                let port = self.limits.port;
                self.warn(|| tracing::warn!(port, %peer, max, "connection refused: the port's max connections are open"));
                drop(tcp);
                continue;
            };
            let _ = tcp.set_nodelay(true);
            return Conn {
                tcp,
                _permit: permit,
                handshake: self
                    .limits
                    .handshake_timeout
                    .map(|t| Box::pin(tokio::time::sleep(t))),
                seen: 0,
            };
        }
    }

    /// Runs `log` unless a warning was logged within [`WARN_EVERY`].
    fn warn(&self, log: impl FnOnce()) {
        let now = self.started.elapsed().as_millis() as u64 + 1;
        let last = self.last_warning_ms.load(Ordering::Relaxed);
        if (last == 0 || now.saturating_sub(last) >= WARN_EVERY.as_millis() as u64)
            && self
                .last_warning_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            log();
        }
    }
}

/// An accepted connection: its permit, and the handshake deadline until it has sent
/// [`HANDSHAKE_BYTES`].
pub struct Conn {
    tcp: TcpStream,
    _permit: OwnedSemaphorePermit,
    handshake: Option<Pin<Box<Sleep>>>,
    seen: usize,
}

impl Conn {
    /// The address of the other end, when the socket still knows it.
    pub fn peer(&self) -> Option<std::net::SocketAddr> {
        self.tcp.peer_addr().ok()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Some(deadline) = &mut this.handshake
            && deadline.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no handshake within grpc_handshake_timeout_ms",
            )));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.tcp).poll_read(cx, buf);
        if this.handshake.is_some() {
            this.seen += buf.filled().len() - before;
            if this.seen >= HANDSHAKE_BYTES {
                this.handshake = None;
            }
        }
        read
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.tcp.connect_info()
    }
}

/// Raises this process's soft limit on open files to its hard limit (as Go's runtime does at
/// start: containers often inherit a soft limit of 1,024 under a hard one of 1,048,576, and
/// each connection is a file); the soft limit now in force, if there is a finite one.
pub fn raise_open_files_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let (Some(soft), Some(hard)) = (limit.current, limit.maximum) else {
        return limit.current;
    };
    if soft >= hard {
        return Some(soft);
    }
    let raised = rustix::process::Rlimit {
        current: Some(hard),
        maximum: Some(hard),
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            tracing::info!(
                from = soft,
                to = hard,
                "raised the open-files limit (nofile)"
            );
            Some(hard)
        }
        Err(e) => {
            tracing::warn!(soft, hard, error = %e, "could not raise the open-files limit (nofile)");
            Some(soft)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_open_files_limit_is_raised_to_the_hard_limit() {
        use rustix::process::{Resource, getrlimit};
        let now = super::raise_open_files_limit();
        let limit = getrlimit(Resource::Nofile);
        assert_eq!(now, limit.current);
        // Raised all the way (an unprivileged process may always raise its soft limit to its
        // hard one), or there was no finite limit to raise.
        assert!(
            limit.maximum.is_none() || limit.current == limit.maximum,
            "{limit:?}"
        );
    }
}
