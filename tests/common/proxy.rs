//! A TCP proxy on a loopback port, between tollgate and Redis, that can make the network slow
//! (a delay before every chunk it forwards, each way) and cut every connection through it (as
//! a broken network path or a middlebox restart would). Runs on the test's tokio runtime;
//! stops, with its connections, on drop.

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
    /// Bumped to cut every connection open at that moment.
    cut: watch::Sender<u64>,
    accept: JoinHandle<()>,
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
        let (delay, cuts) = (delay_us.clone(), cut.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (delay, mut cut) = (delay.clone(), cuts.subscribe());
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
                        _ = pump(cr, sw, delay.clone()) => {}
                        _ = pump(sr, cw, delay) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Proxy {
            addr,
            delay_us,
            cut,
            accept,
        }
    }

    /// `redis://` URL through the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Every chunk waits this long before it is forwarded (0: no delay).
    pub fn set_delay(&self, d: Duration) {
        self.delay_us.store(d.as_micros() as u64, Ordering::SeqCst);
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

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay_us: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let delay = delay_us.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_micros(delay)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
