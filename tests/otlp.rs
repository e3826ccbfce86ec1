//! With `otlp_endpoint` set, every ShouldRateLimit call becomes a span exported over OTLP/gRPC;
//! the spans still buffered are flushed on SIGTERM. A stand-in collector receives them.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{TestServer, request};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};

/// A received span: its name and its attributes as `key=value`.
type Span = (String, Vec<String>);

/// Remembers every span it receives.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut seen = self.0.lock().unwrap();
        for rs in &request.get_ref().resource_spans {
            for ss in &rs.scope_spans {
                for span in &ss.spans {
                    let attrs = span
                        .attributes
                        .iter()
                        .map(|kv| {
                            format!(
                                "{}={:?}",
                                kv.key,
                                kv.value.as_ref().and_then(|v| v.value.as_ref())
                            )
                        })
                        .collect();
                    seen.push((span.name.clone(), attrs));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// Starts tollgate exporting to `endpoint` (1/hour on one key) and sends it three requests:
/// one OK, then two over the limit.
async fn three_requests(endpoint: &str) -> TestServer {
    let tollgate = TestServer::builder(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .arg("otlp-endpoint", endpoint)
    .start();
    let mut client = tollgate.client().await;
    for _ in 0..3 {
        client
            .should_rate_limit(request("d", &[&[("k", "v")]]))
            .await
            .unwrap();
    }
    tollgate
}

// Multi-threaded: the collector must keep answering while this thread waits for the exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_spans_reach_the_collector_and_are_flushed_on_shutdown() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let collector = Collector::default();
    let server = TraceServiceServer::new(collector.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(server)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );

    let mut tollgate = three_requests(&format!("http://{addr}")).await;
    // SIGTERM flushes what the batch exporter still holds.
    let status = tollgate.terminate();
    assert!(status.success(), "{}", tollgate.log());
    let mut spans = Vec::new();
    for _ in 0..50 {
        spans = collector.0.lock().unwrap().clone();
        if spans.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let requests: Vec<_> = spans
        .iter()
        .filter(|(name, _)| name == "ShouldRateLimit")
        .collect();
    assert_eq!(requests.len(), 3, "{spans:?}\n{}", tollgate.log());
    let attrs = requests
        .iter()
        .flat_map(|(_, a)| a.iter())
        .cloned()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        attrs.contains("domain=") && attrs.contains("\"d\""),
        "{attrs}"
    );
    assert!(
        attrs.contains("over_limit"),
        "the third call is over: {attrs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_collector_costs_requests_nothing_and_does_not_hold_up_the_exit() {
    let port = common::free_port();
    let mut tollgate = three_requests(&format!("http://127.0.0.1:{port}")).await;
    let started = std::time::Instant::now();
    let status = tollgate.terminate();
    assert!(status.success(), "{}", tollgate.log());
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "exit took {:?}",
        started.elapsed()
    );
}
