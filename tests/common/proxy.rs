//! A TCP proxy on a loopback port, between tollgate and Redis, that can make the network slow
//! (a delay before every chunk it forwards, each way) and cut every connection through it (as
//! a broken network path or a middlebox restart would), and counts what tollgate sends: the
//! `EVALSHA` commands and the chunks that carry them (one per round trip for a caller that
//! waits for each answer; the pool's PINGs are not counted) and the times a chosen string
//! (a descriptor value) went by, seen as they arrive, before any delay. Runs on the test's
//! tokio runtime; stops, with its connections, on drop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct Proxy {
    pub addr: SocketAddr,
    delay_us: Arc<AtomicU64>,
    sent: Arc<Sent>,
    /// Bumped to cut every connection open at that moment.
    cut: watch::Sender<u64>,
    accept: JoinHandle<()>,
}

/// What tollgate sent towards Redis through the proxy.
#[derive(Default)]
struct Sent {
    script_chunks: AtomicU64,
    evalsha: AtomicU64,
    /// The string [`Proxy::count_sent`] looks for, and how often it went by since.
    needle: std::sync::Mutex<Vec<u8>>,
    needle_seen: AtomicU64,
}

impl Proxy {
    /// A proxy to `upstream` on a free loopback port.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().unwrap();
        let delay_us = Arc::new(AtomicU64::new(0));
        let (cut, _) = watch::channel(0u64);
        let sent = Arc::new(Sent::default());
        let (delay, cuts, counts) = (delay_us.clone(), cut.clone(), sent.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (delay, mut cut) = (delay.clone(), cuts.subscribe());
                let counts = counts.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    // Dropping both directions closes both sockets: the connection is cut.
                    tokio::select! {
                        _ = pump(cr, sw, delay.clone(), Some(counts)) => {}
                        _ = pump(sr, cw, delay, None) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Proxy {
            addr,
            delay_us,
            sent,
            cut,
            accept,
        }
    }

    /// `redis://` URL through the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Every chunk is forwarded this long after it arrived (0: at once): the link's latency.
    pub fn set_delay(&self, d: Duration) {
        self.delay_us.store(d.as_micros() as u64, Ordering::SeqCst);
    }

    /// Chunks carrying script calls that tollgate has written towards Redis: one per round
    /// trip while each call waits for its answer before the next is sent.
    pub fn script_chunks_sent(&self) -> u64 {
        self.sent.script_chunks.load(Ordering::SeqCst)
    }

    /// `EVALSHA` commands tollgate has sent (counted on arrival, before any delay).
    pub fn evalsha_sent(&self) -> u64 {
        self.sent.evalsha.load(Ordering::SeqCst)
    }

    /// From now on, counts the times `needle` goes by towards Redis (see [`Proxy::seen`]).
    pub fn count_sent(&self, needle: &str) {
        *self.sent.needle.lock().unwrap() = needle.as_bytes().to_vec();
        self.sent.needle_seen.store(0, Ordering::SeqCst);
    }

    /// Times the string given to [`Proxy::count_sent`] went by since.
    pub fn seen(&self) -> u64 {
        self.sent.needle_seen.load(Ordering::SeqCst)
    }

    /// Closes every connection open now (new ones are accepted as usual).
    pub fn cut_all(&self) {
        self.cut.send_modify(|n| *n += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut_all();
    }
}

/// Forwards `from` to `to`, each chunk `delay_us` after it arrived: a link's latency, not a
/// cap on its throughput (chunks behind a delayed one are read and timed meanwhile). Ends
/// when the data read before `from` closed has been written, or `to` fails. Dropped (a cut),
/// it loses whatever it had not written yet, as a lost host's link does.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay_us: Arc<AtomicU64>,
    counts: Option<Arc<Sent>>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if let Some(counts) = &counts {
                count(counts, &buf[..n]);
            }
            let due = tokio::time::Instant::now()
                + Duration::from_micros(delay_us.load(Ordering::SeqCst));
            if tx.send((due, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    let writer = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = writer => {}
        // The reader's end drops the channel's sender: the writer then drains and ends.
        _ = async { reader.await; std::future::pending::<()>().await } => {}
    }
}

/// Counts what tollgate sent in one chunk.
fn count(counts: &Sent, chunk: &[u8]) {
    let evalsha = chunk.windows(7).filter(|w| w == b"EVALSHA").count() as u64;
    counts.evalsha.fetch_add(evalsha, Ordering::SeqCst);
    counts
        .script_chunks
        .fetch_add(u64::from(evalsha > 0), Ordering::SeqCst);
    let needle = counts.needle.lock().unwrap().clone();
    if !needle.is_empty() {
        let hits = chunk.windows(needle.len()).filter(|w| *w == needle).count();
        counts.needle_seen.fetch_add(hits as u64, Ordering::SeqCst);
    }
}
