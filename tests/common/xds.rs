//! A test xDS management server: the Aggregated Discovery Service from envoy-types, state of
//! the world, over mutual TLS (the certificates of `tls.rs`), as Envoy Gateway serves the
//! rate-limit rules. A test publishes snapshots of `RateLimitConfig`s and reads every request
//! the client sent (the subscription, each ACK and NACK); stopping it ends its streams, then
//! the server.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitConfig;
use futures_util::{Stream, StreamExt};
use tokio::sync::watch;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

use super::tls::TestCerts;
use super::{poll, readyz};

pub const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// The snapshot to serve (version, configs), and every request tollgate sent.
#[derive(Clone)]
struct Ads {
    snapshot: watch::Receiver<(String, Vec<RateLimitConfig>)>,
    seen: Arc<Mutex<Vec<DiscoveryRequest>>>,
    /// Fired: the server goes away, ending its streams.
    stop: watch::Receiver<bool>,
}

type Responses = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaResponses = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = Responses;
    type DeltaAggregatedResourcesStream = DeltaResponses;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Responses>, Status> {
        let mut requests = request.into_inner();
        let (seen, mut snapshot) = (self.seen.clone(), self.snapshot.clone());
        let mut stop = self.stop.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            // The first request subscribes; then one response per snapshot, each answered by
            // an ACK or a NACK that is recorded.
            let Some(Ok(first)) = requests.next().await else {
                return;
            };
            seen.lock().unwrap().push(first);
            let mut nonce = 0u64;
            loop {
                let (version, configs) = snapshot.borrow_and_update().clone();
                nonce += 1;
                let response = DiscoveryResponse {
                    version_info: version,
                    type_url: TYPE_URL.to_string(),
                    nonce: nonce.to_string(),
                    resources: configs
                        .iter()
                        .map(|c| Any {
                            type_url: TYPE_URL.to_string(),
                            value: prost::Message::encode_to_vec(c),
                        })
                        .collect(),
                    ..DiscoveryResponse::default()
                };
                if tx.send(Ok(response)).await.is_err() {
                    return;
                }
                tokio::select! {
                    reply = requests.next() => match reply {
                        Some(Ok(reply)) => seen.lock().unwrap().push(reply),
                        _ => return,
                    },
                    _ = stop.changed() => return,
                }
                tokio::select! {
                    changed = snapshot.changed() => if changed.is_err() { return },
                    _ = stop.changed() => return,
                }
            }
        });
        let out =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
            );
        Ok(Response::new(Box::pin(out)))
    }

    async fn delta_aggregated_resources(
        &self,
        _: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaResponses>, Status> {
        Err(Status::unimplemented("state of the world only"))
    }
}

/// Serves `ads` over mutual TLS (plain text without `certs`, as Envoy AI Gateway's
/// controller serves its rate-limit xDS) on `listener` until `ads.stop` fires (its streams
/// end, then the server).
async fn serve_ads(ads: Ads, certs: Option<&TestCerts>, listener: std::net::TcpListener) {
    let tls = certs.map(|certs| {
        let read = |name: &str| std::fs::read(certs.path(name)).unwrap();
        ServerTlsConfig::new()
            .identity(Identity::from_pem(read("server.crt"), read("server.key")))
            .client_ca_root(Certificate::from_pem(read("ca.crt")))
    });
    listener.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let mut stopped = ads.stop.clone();
    tokio::spawn(async move {
        let mut server = Server::builder();
        if let Some(tls) = tls {
            server = server.tls_config(tls).unwrap();
        }
        server
            .add_service(AggregatedDiscoveryServiceServer::new(ads))
            .serve_with_incoming_shutdown(tokio_stream_of(listener), async move {
                let _ = stopped.changed().await;
            })
            .await
            .unwrap();
    });
}

/// The accepted connections of `listener`, as tonic's `serve_with_incoming` takes them.
fn tokio_stream_of(
    listener: tokio::net::TcpListener,
) -> impl Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures_util::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(tcp, _)| tcp);
        Some((accepted, listener))
    })
}

/// A running test ADS server.
pub struct TestAds {
    pub addr: SocketAddr,
    publish: watch::Sender<(String, Vec<RateLimitConfig>)>,
    seen: Arc<Mutex<Vec<DiscoveryRequest>>>,
    stop: watch::Sender<bool>,
}

impl TestAds {
    /// Serves `(version, configs)` on `listener` (a free port: `127.0.0.1:0`, or the port of a
    /// server that was stopped).
    pub async fn start(
        certs: &TestCerts,
        listener: std::net::TcpListener,
        version: &str,
        configs: Vec<RateLimitConfig>,
    ) -> TestAds {
        TestAds::serve(Some(certs), listener, version, configs).await
    }

    /// [`TestAds::start`] over plain text.
    pub async fn start_plaintext(
        listener: std::net::TcpListener,
        version: &str,
        configs: Vec<RateLimitConfig>,
    ) -> TestAds {
        TestAds::serve(None, listener, version, configs).await
    }

    async fn serve(
        certs: Option<&TestCerts>,
        listener: std::net::TcpListener,
        version: &str,
        configs: Vec<RateLimitConfig>,
    ) -> TestAds {
        let addr = listener.local_addr().unwrap();
        let (publish, snapshot) = watch::channel((version.to_string(), configs));
        let (stop, stopped) = watch::channel(false);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let ads = Ads {
            snapshot,
            seen: seen.clone(),
            stop: stopped,
        };
        serve_ads(ads, certs, listener).await;
        TestAds {
            addr,
            publish,
            seen,
            stop,
        }
    }

    /// Pushes a new snapshot to every stream.
    pub fn publish(&self, version: &str, configs: Vec<RateLimitConfig>) {
        self.publish.send((version.to_string(), configs)).unwrap();
    }

    /// Every request received so far.
    pub fn seen(&self) -> Vec<DiscoveryRequest> {
        self.seen.lock().unwrap().clone()
    }

    /// Ends the streams and the server.
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

/// Waits until the tollgate on `admin` shows xDS version `version` in force: its `/readyz`.
pub fn wait_version(admin: SocketAddr, version: &str) -> serde_json::Value {
    poll(std::time::Duration::from_secs(20), || {
        let (_, body) = readyz(admin);
        (body["rules"]["xds_version"] == version).then_some(body)
    })
    .unwrap_or_else(|| {
        panic!(
            "xDS version {version} never in force: {:?}",
            readyz(admin).1
        )
    })
}
