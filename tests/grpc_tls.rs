//! TLS on the gRPC port, with certificates the test makes (`openssl` CLI): a TLS client that
//! trusts the CA is served, a plain one is not; under mutual TLS a client without a
//! certificate from the client CA is refused; a missing file stops startup.

mod common;

use std::time::Duration;

use common::tls::TestCerts;
use common::{TestServer, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

const RULES: &str = "domain: tls\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";

fn server(certs: &TestCerts, mutual: bool) -> TestServer {
    let mut b = TestServer::builder(RULES)
        .arg("grpc-tls-cert", &certs.file("server.crt"))
        .arg("grpc-tls-key", &certs.file("server.key"));
    if mutual {
        b = b.arg("grpc-tls-client-ca", &certs.file("ca.crt"));
    }
    b.start()
}

/// A client over TLS trusting `ca`, showing `identity` if given.
async fn tls_client(
    server: &TestServer,
    certs: &TestCerts,
    ca: &str,
    identity: Option<(&str, &str)>,
) -> Result<RateLimitServiceClient<Channel>, tonic::transport::Error> {
    let pem = |name: &str| std::fs::read(certs.path(name)).expect("certificate file");
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem(ca)));
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(pem(cert), pem(key)));
    }
    let channel = Channel::from_shared(format!("https://{}", server.grpc))
        .expect("uri")
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    Ok(RateLimitServiceClient::new(channel))
}

async fn decide(client: &mut RateLimitServiceClient<Channel>) -> Result<i32, tonic::Status> {
    client
        .should_rate_limit(request("tls", &[&[("tenant", "t")]]))
        .await
        .map(|r| r.into_inner().overall_code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_clients_are_served_and_plain_ones_are_not() {
    let certs = TestCerts::generate();
    let server = server(&certs, false);
    let mut client = tls_client(&server, &certs, "ca.crt", None)
        .await
        .expect("a TLS client trusting the CA connects");
    assert_eq!(decide(&mut client).await.unwrap(), Code::Ok as i32);
    assert_eq!(decide(&mut client).await.unwrap(), Code::Ok as i32);
    assert_eq!(decide(&mut client).await.unwrap(), Code::OverLimit as i32);

    // A client that trusts another CA does not get through the handshake.
    let wrong = match tls_client(&server, &certs, "wrong-ca.crt", None).await {
        Ok(mut c) => decide(&mut c).await.is_err(),
        Err(_) => true,
    };
    assert!(
        wrong,
        "a client that does not trust the server's CA was served"
    );
    // Neither does plain HTTP/2.
    let plain = match RateLimitServiceClient::connect(format!("http://{}", server.grpc)).await {
        Ok(mut c) => decide(&mut c).await.is_err(),
        Err(_) => true,
    };
    assert!(plain, "a plain-text client was served on the TLS port");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_clients_without_a_certificate() {
    let certs = TestCerts::generate();
    let server = server(&certs, true);
    let refused = match tls_client(&server, &certs, "ca.crt", None).await {
        Ok(mut c) => decide(&mut c).await.is_err(),
        Err(_) => true,
    };
    assert!(
        refused,
        "a client without a certificate was served under mutual TLS"
    );
    let mut client = tls_client(
        &server,
        &certs,
        "ca.crt",
        Some(("client.crt", "client.key")),
    )
    .await
    .expect("a client with a certificate from the client CA connects");
    assert_eq!(decide(&mut client).await.unwrap(), Code::Ok as i32);
}

#[test]
fn a_missing_certificate_file_stops_startup_naming_the_setting() {
    let (code, _, err) = common::run_tollgate(
        &[
            "serve",
            "--rules",
            "examples/rules",
            "--grpc-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
            "--grpc-tls-cert",
            "/nonexistent/server.crt",
            "--grpc-tls-key",
            "/nonexistent/server.key",
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("grpc_tls_cert /nonexistent/server.crt"),
        "{err}"
    );
    let (code, _, err) = common::run_tollgate(
        &[
            "serve",
            "--rules",
            "examples/rules",
            "--grpc-tls-client-ca",
            "/etc/ca.pem",
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains("grpc_tls_client_ca"), "{err}");
}
