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
use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};

/// A received span: who sent it, its ids, its name and its attributes as `key=value`.
#[derive(Clone, Debug)]
struct Span {
    service: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    attrs: Vec<String>,
}

/// Remembers every span it receives.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Span>>>);

impl Collector {
    fn spans(&self) -> Vec<Span> {
        self.0.lock().unwrap().clone()
    }

    /// Serves OTLP/gRPC on a free loopback port; returns the port.
    async fn start(&self) -> std::net::SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(self.clone()))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        addr
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn value_text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        other => format!("{other:?}"),
    }
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut seen = self.0.lock().unwrap();
        for rs in &request.get_ref().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .map(|kv| value_text(&kv.value))
                .unwrap_or_default();
            for ss in &rs.scope_spans {
                for span in &ss.spans {
                    let attrs = span
                        .attributes
                        .iter()
                        .map(|kv| format!("{}={:?}", kv.key, value_text(&kv.value)))
                        .collect();
                    seen.push(Span {
                        service: service.clone(),
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        name: span.name.clone(),
                        attrs,
                    });
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
    let collector = Collector::default();
    let addr = collector.start().await;

    let mut tollgate = three_requests(&format!("http://{addr}")).await;
    // SIGTERM flushes what the batch exporter still holds.
    let status = tollgate.terminate();
    assert!(status.success(), "{}", tollgate.log());
    let mut spans = Vec::new();
    for _ in 0..50 {
        spans = collector.spans();
        if spans.len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let requests: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "ShouldRateLimit")
        .collect();
    assert_eq!(requests.len(), 3, "{spans:?}\n{}", tollgate.log());
    assert!(
        requests.iter().all(|s| s.parent_span_id.is_empty()),
        "no caller context: each request span is a root: {requests:?}"
    );
    let attrs = requests
        .iter()
        .flat_map(|s| s.attrs.iter())
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
    // A collector that never answers: the kernel accepts the connection into the backlog and
    // nobody reads it, so every export waits for its 3 s timeout. A request that waited for
    // its span's export would take that long; each must be answered at once.
    let blackhole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", blackhole.local_addr().unwrap());
    let mut tollgate = TestServer::builder(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .arg("otlp-endpoint", &endpoint)
    .start();
    let mut client = tollgate.client().await;
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        let started = std::time::Instant::now();
        client
            .should_rate_limit(request("d", &[&[("k", "v")]]))
            .await
            .unwrap();
        slowest = slowest.max(started.elapsed());
    }
    eprintln!("slowest of 20 requests with a silent collector: {slowest:?}");
    assert!(
        slowest < Duration::from_secs(1),
        "a request took {slowest:?}: it waited for the export (timeout 3 s)"
    );
    let started = std::time::Instant::now();
    let status = tollgate.terminate();
    assert!(status.success(), "{}", tollgate.log());
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "exit took {:?}",
        started.elapsed()
    );
}

/// The Envoy example with its OpenTelemetry tracer on (every request sampled), exporting to
/// `collector` as service `envoy-front` and flushing each span at once.
fn envoy_tracing_to(collector: std::net::SocketAddr) -> Vec<(&'static str, String)> {
    let tracing = "stat_prefix: front
                tracing:
                  random_sampling: { value: 100 }
                  provider:
                    name: envoy.tracers.opentelemetry
                    typed_config:
                      \"@type\": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig
                      grpc_service:
                        envoy_grpc: { cluster_name: otel }
                        timeout: 1s
                      service_name: envoy-front
";
    let cluster = format!(
        "  clusters:
    - name: otel
      type: STATIC
      connect_timeout: 0.25s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config:
            http2_protocol_options: {{}}
      load_assignment:
        cluster_name: otel
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: {{ address: 127.0.0.1, port_value: {} }}
",
        collector.port()
    );
    let runtime = "layered_runtime:
  layers:
    - name: static
      static_layer:
        tracing.opentelemetry.min_flush_spans: 1
        tracing.opentelemetry.flush_interval_ms: 100
static_resources:
";
    vec![
        ("stat_prefix: front\n", tracing.to_string()),
        ("  clusters:\n", cluster),
        ("static_resources:\n", runtime.to_string()),
    ]
}

/// Envoy (OpenTelemetry tracer) → tollgate (OTLP exporter) → Redis, both exporting to one
/// collector: tollgate's ShouldRateLimit span is in Envoy's trace, its parent the span of
/// Envoy's rate-limit call (the `traceparent` Envoy put in the gRPC metadata), and each store
/// call is a child of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_span_joins_envoys_trace_with_a_child_per_store_call() {
    let collector = Collector::default();
    let addr = collector.start().await;
    let redis = common::redis::TestRedis::start();
    let rules = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/rules/edge.yaml"
    ))
    .unwrap();
    let mut tollgate = TestServer::builder(&rules)
        .arg("otlp-endpoint", &format!("http://{addr}"))
        .arg("store", &redis.url())
        .arg("key-prefix", &common::redis::unique_prefix("otlp"))
        .start();
    let rls = tollgate.grpc;
    let envoy = tokio::task::spawn_blocking(move || {
        let subs = envoy_tracing_to(addr);
        let mut subs: Vec<(&str, &str)> = subs.iter().map(|(a, b)| (*a, b.as_str())).collect();
        // What this test holds is the trace across both processes, not Envoy's 20 ms: a call
        // Envoy gives up on (its first, opening the connection, on a busy machine) would pass
        // with no tollgate span.
        subs.push(("timeout: 0.02s", "timeout: 1s"));
        let envoy = common::envoy::TestEnvoy::start(rls, &subs);
        for _ in 0..2 {
            let r = common::get_with(envoy.front, "/", &[("x-tenant", "traced")]).unwrap();
            assert_eq!(r.status, 200, "{r:?}\n{}", envoy.log());
        }
        envoy
    })
    .await
    .unwrap();
    let status = tollgate.terminate(); // flushes tollgate's batch
    assert!(status.success(), "{}", tollgate.log());

    // Both requests' spans from both processes: Envoy flushes each span at once.
    let mut spans = Vec::new();
    for _ in 0..100 {
        spans = collector.spans();
        let from = |svc: &str| spans.iter().filter(|s| s.service == svc).count();
        if from("tollgate") >= 4 && from("envoy-front") >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ours: Vec<&Span> = spans
        .iter()
        .filter(|s| s.service == "tollgate" && s.name == "ShouldRateLimit")
        .collect();
    assert_eq!(
        ours.len(),
        2,
        "{spans:#?}\n{}\n{}",
        tollgate.log(),
        envoy.log()
    );
    for span in ours {
        let parent = spans
            .iter()
            .find(|p| p.span_id == span.parent_span_id)
            .unwrap_or_else(|| panic!("no parent of {span:?} among {spans:#?}"));
        assert_eq!(parent.service, "envoy-front", "{parent:?}");
        assert_eq!(
            parent.trace_id, span.trace_id,
            "one trace: {parent:?} {span:?}"
        );
        assert!(
            parent.name.contains("RateLimitService"),
            "the parent is Envoy's rate-limit call: {parent:?}"
        );
        let store_calls: Vec<&Span> = spans
            .iter()
            .filter(|s| s.name == "store.apply" && s.parent_span_id == span.span_id)
            .collect();
        assert!(
            !store_calls.is_empty(),
            "no store.apply span under {span:?}: {spans:#?}"
        );
        for call in store_calls {
            assert_eq!(call.trace_id, span.trace_id, "{call:?}");
            assert!(
                call.attrs.iter().any(|a| a == "failed=\"0\""),
                "the store answered: {call:?}"
            );
        }
    }
    eprintln!(
        "spans: {} from envoy-front, {} from tollgate; each ShouldRateLimit under Envoy's rate-limit call, with its store calls under it",
        spans.iter().filter(|s| s.service == "envoy-front").count(),
        spans.iter().filter(|s| s.service == "tollgate").count()
    );
}
