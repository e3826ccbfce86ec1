//! Rules over xDS: a test management server (the ADS service from envoy-types, state of the
//! world, over mutual TLS as Envoy Gateway serves it) pushes `RateLimitConfig` snapshots to the
//! real binary. A snapshot's limits apply at once and are ACKed with its version; a snapshot
//! with an error is NACKed (the server reads the NACK's error) and the rules in force keep
//! answering; the server stopped and started again: the rules keep serving meanwhile, and the
//! next snapshot applies after the reconnect.

mod common;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::tls::TestCerts;
use common::{TestServer, poll, readyz, request};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use futures_util::{Stream, StreamExt};
use tokio::sync::watch;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

const TYPE_URL: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

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

/// Serves `ads` over mutual TLS on `listener` until `ads.stop` fires (its streams end, then
/// the server).
async fn serve_ads(ads: Ads, certs: &TestCerts, listener: std::net::TcpListener) {
    let read = |name: &str| std::fs::read(certs.path(name)).unwrap();
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(read("server.crt"), read("server.key")))
        .client_ca_root(Certificate::from_pem(read("ca.crt")));
    listener.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let mut stopped = ads.stop.clone();
    tokio::spawn(async move {
        Server::builder()
            .tls_config(tls)
            .unwrap()
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

/// A config of domain `edge`: `tenant` at `per_hour` an hour (`None`: no unit, an error).
fn edge(per_hour: u32, unit: RateLimitUnit) -> Vec<RateLimitConfig> {
    vec![RateLimitConfig {
        name: "edge-config".into(),
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "tenant".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: unit as i32,
                requests_per_unit: per_hour,
                ..RateLimitPolicy::default()
            }),
            ..RateLimitDescriptor::default()
        }],
    }]
}

/// Codes for `n` requests of `tenant`.
async fn codes(server: &TestServer, tenant: &str, n: usize) -> Vec<i32> {
    let mut client = server.client().await;
    let mut out = Vec::new();
    for _ in 0..n {
        let r = client
            .should_rate_limit(request("edge", &[&[("tenant", tenant)]]))
            .await
            .expect("ShouldRateLimit")
            .into_inner();
        out.push(r.overall_code);
    }
    out
}

/// Waits until `/readyz` shows xDS version `version` in force.
fn wait_version(admin: SocketAddr, version: &str) -> serde_json::Value {
    poll(Duration::from_secs(20), || {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_from_xds_apply_live_nack_errors_and_survive_the_server_going_away() {
    let certs = TestCerts::generate();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (publish, snapshot) = watch::channel(("1".to_string(), edge(2, RateLimitUnit::Hour)));
    let (stop, stopped) = watch::channel(false);
    let ads = Ads {
        snapshot,
        seen: Arc::new(Mutex::new(Vec::new())),
        stop: stopped,
    };
    serve_ads(ads.clone(), &certs, listener).await;
    // No rules file: the rules are the xDS server's. Its certificate names 127.0.0.1.
    let server = TestServer::builder("")
        .arg("rules-xds-server", &format!("127.0.0.1:{}", addr.port()))
        .arg("rules-xds-node-id", "envoy-ratelimit")
        .arg("rules-xds-tls-ca", &certs.file("ca.crt"))
        .arg("rules-xds-tls-cert", &certs.file("client.crt"))
        .arg("rules-xds-tls-key", &certs.file("client.key"))
        .start();
    wait_version(server.admin, "1");
    assert_eq!(codes(&server, "a", 3).await, vec![1, 1, 2], "v1: 2 an hour");
    {
        let seen = ads.seen.lock().unwrap();
        let node = seen[0].node.as_ref().expect("a node in the first request");
        assert_eq!(node.id, "envoy-ratelimit");
        assert_eq!(seen[0].type_url, TYPE_URL);
        let ack = seen.last().unwrap();
        assert_eq!(
            (ack.version_info.as_str(), ack.error_detail.is_none()),
            ("1", true),
            "v1 ACKed"
        );
    }

    // A new snapshot changes the limit live.
    publish
        .send(("2".to_string(), edge(4, RateLimitUnit::Hour)))
        .unwrap();
    wait_version(server.admin, "2");
    assert_eq!(
        codes(&server, "b", 5).await,
        vec![1, 1, 1, 1, 2],
        "v2: 4 an hour"
    );

    // A snapshot with an error is NACKed with the error; version 2 keeps answering.
    publish
        .send(("3".to_string(), edge(4, RateLimitUnit::Unknown)))
        .unwrap();
    let nack = poll(Duration::from_secs(20), || {
        ads.seen
            .lock()
            .unwrap()
            .iter()
            .find(|r| r.error_detail.is_some())
            .cloned()
    })
    .expect("a NACK");
    assert_eq!(
        nack.version_info, "2",
        "the NACK names the version in force"
    );
    let message = nack.error_detail.unwrap().message;
    assert!(
        message.contains("xds:edge-config") && message.contains("unit"),
        "{message}"
    );
    let (_, body) = readyz(server.admin);
    assert_eq!(body["rules"]["xds_version"], "2");
    assert!(
        body["rules"]["reload_error"]
            .as_str()
            .unwrap()
            .contains("unit"),
        "{body}"
    );
    assert_eq!(
        codes(&server, "c", 5).await,
        vec![1, 1, 1, 1, 2],
        "v2 still"
    );

    // The server goes away: the rules keep serving. It comes back with version 4: applied.
    stop.send(true).unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        codes(&server, "d", 5).await,
        vec![1, 1, 1, 1, 2],
        "v2 while away"
    );
    let (publish, snapshot) = watch::channel(("4".to_string(), edge(1, RateLimitUnit::Hour)));
    let listener = std::net::TcpListener::bind(addr).expect("the same port again");
    let (_stop, stopped) = watch::channel(false);
    let ads = Ads {
        snapshot,
        seen: Arc::new(Mutex::new(Vec::new())),
        stop: stopped,
    };
    serve_ads(ads.clone(), &certs, listener).await;
    wait_version(server.admin, "4");
    assert_eq!(codes(&server, "e", 2).await, vec![1, 2], "v4: 1 an hour");
    drop(publish);
}
