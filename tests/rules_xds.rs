//! Rules over xDS: a test management server (the ADS service from envoy-types, state of the
//! world, over mutual TLS as Envoy Gateway serves it) pushes `RateLimitConfig` snapshots to the
//! real binary. A snapshot's limits apply at once and are ACKed with its version; a snapshot
//! with an error is NACKed (the server reads the NACK's error) and the rules in force keep
//! answering; the server stopped and started again: the rules keep serving meanwhile, and the
//! next snapshot applies after the reconnect.

mod common;

use std::time::Duration;

use common::tls::TestCerts;
use common::xds::{TYPE_URL, TestAds, wait_version};
use common::{TestServer, poll, readyz, request};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

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

/// The real binary with no rules file: its rules are the xDS server's at `addr`, over mutual
/// TLS (the server's certificate names 127.0.0.1).
fn served_by(certs: &TestCerts, addr: std::net::SocketAddr) -> TestServer {
    TestServer::builder("")
        .arg("rules-xds-server", &format!("127.0.0.1:{}", addr.port()))
        .arg("rules-xds-node-id", "envoy-ratelimit")
        .arg("rules-xds-tls-ca", &certs.file("ca.crt"))
        .arg("rules-xds-tls-cert", &certs.file("client.crt"))
        .arg("rules-xds-tls-key", &certs.file("client.key"))
        .start()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_from_xds_apply_live_nack_errors_and_survive_the_server_going_away() {
    let certs = TestCerts::generate();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ads = TestAds::start(&certs, listener, "1", edge(2, RateLimitUnit::Hour)).await;
    let addr = ads.addr;
    let server = served_by(&certs, addr);
    wait_version(server.admin, "1");
    assert_eq!(codes(&server, "a", 3).await, vec![1, 1, 2], "v1: 2 an hour");
    {
        let seen = ads.seen();
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
    ads.publish("2", edge(4, RateLimitUnit::Hour));
    wait_version(server.admin, "2");
    assert_eq!(
        codes(&server, "b", 5).await,
        vec![1, 1, 1, 1, 2],
        "v2: 4 an hour"
    );

    // A snapshot with an error is NACKed with the error; version 2 keeps answering.
    ads.publish("3", edge(4, RateLimitUnit::Unknown));
    let nack = poll(Duration::from_secs(20), || {
        ads.seen().into_iter().find(|r| r.error_detail.is_some())
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
    ads.stop();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        codes(&server, "d", 5).await,
        vec![1, 1, 1, 1, 2],
        "v2 while away"
    );
    let listener = std::net::TcpListener::bind(addr).expect("the same port again");
    let _ads = TestAds::start(&certs, listener, "4", edge(1, RateLimitUnit::Hour)).await;
    wait_version(server.admin, "4");
    assert_eq!(codes(&server, "e", 2).await, vec![1, 2], "v4: 1 an hour");
}

/// A limit edited over xDS keeps what was spent (docs/rules.md, "What a rules edit keeps"):
/// 5 an hour with 5 spent, raised to 8, admits 3 more, not 8; lowered to 2, it refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_edited_over_xds_keeps_what_was_spent() {
    let certs = TestCerts::generate();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ads = TestAds::start(&certs, listener, "1", edge(5, RateLimitUnit::Hour)).await;
    let server = served_by(&certs, ads.addr);
    wait_version(server.admin, "1");
    assert_eq!(
        codes(&server, "a", 6).await,
        vec![1, 1, 1, 1, 1, 2],
        "5 of 5"
    );
    ads.publish("2", edge(8, RateLimitUnit::Hour));
    wait_version(server.admin, "2");
    assert_eq!(
        codes(&server, "a", 4).await,
        vec![1, 1, 1, 2],
        "raised to 8 with 5 spent: 3 more"
    );
    ads.publish("3", edge(2, RateLimitUnit::Hour));
    wait_version(server.admin, "3");
    assert_eq!(
        codes(&server, "a", 2).await,
        vec![2, 2],
        "lowered to 2: refused"
    );
    // Another tenant is unaffected: 2 of 2.
    assert_eq!(codes(&server, "b", 3).await, vec![1, 1, 2]);
}
