//! TLS to Redis with certificates the test generates (`openssl` CLI): mutual TLS, and what a
//! wrong trust anchor or a missing client certificate looks like (the store contract itself
//! also runs over `rediss://`, in `store_contract.rs`).

mod common;

use common::redis::TestRedis;
use common::store::{HOUR, key, one, settings, tb};
use common::tls::TestCerts;
use common::{TestServer, get, readyz};
use tollgate::clock::Clock;
use tollgate::settings::Settings;
use tollgate::store::Store;
use tollgate::telemetry::Metrics;

async fn store(settings: Settings) -> Store {
    Store::connect(
        tollgate::configs::store_config(&settings),
        Clock::system(),
        &Metrics::new(),
    )
    .await
    .expect("a TLS store with readable files starts, whether or not Redis accepts it")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_certificate() {
    let certs = TestCerts::generate();
    let redis = TestRedis::start_tls(&certs, true);
    let with_cert = store(Settings {
        store_tls_ca: certs.file("ca.crt"),
        store_tls_cert: certs.file("client.crt"),
        store_tls_key: certs.file("client.key"),
        ..settings(&redis.tls_url(), 2_000)
    })
    .await;
    let k = key("mtls:", "a");
    assert_eq!(one(&with_cert, tb(&k, 3, 3, HOUR, 1)).await.remaining, 2);
    assert_eq!(one(&with_cert, tb(&k, 3, 3, HOUR, 1)).await.remaining, 1);

    // Without a client certificate the server refuses the handshake: no call succeeds.
    let without = store(Settings {
        store_tls_ca: certs.file("ca.crt"),
        ..settings(&redis.tls_url(), 500)
    })
    .await;
    assert_eq!(without.state(), "disconnected");
    assert!(without.apply(&[tb(&k, 3, 3, HOUR, 1)]).await.is_err());
}

#[test]
fn an_untrusted_server_certificate_is_a_clear_error_not_a_crash() {
    let certs = TestCerts::generate();
    let redis = TestRedis::start_tls(&certs, false);
    // tollgate trusts another CA: it starts (a Redis it cannot use is no crash), unready
    // until Redis answers, says why in one ERROR line and /readyz, and answers from the
    // fallback.
    let server = TestServer::builder(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
    )
    .arg("store", &redis.tls_url())
    .arg("store-tls-ca", &certs.file("wrong-ca.crt"))
    .arg("store-timeout-ms", "200")
    .ready_status(503)
    .start();
    let (status, body) = readyz(server.admin);
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        server
            .log()
            .lines()
            .filter(|l| l.contains("ERROR") && l.contains("TLS handshake with Redis failed"))
            .count(),
        1,
        "{}",
        server.log()
    );
    assert_eq!(body["store"]["state"], "disconnected", "{body}");
    assert!(
        body["store"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("certificate")),
        "/readyz says why: {body}"
    );
    let log = server.log();
    assert!(
        log.contains("certificate") || log.contains("UnknownIssuer"),
        "the log should say the certificate is not trusted:\n{log}"
    );
    let (_, metrics) = get(server.admin, "/metrics");
    assert!(
        metrics.contains("tollgate_store_errors_total{kind=\"tls\"}"),
        "{metrics}"
    );
}

#[test]
fn tls_settings_without_a_tls_url_stop_startup() {
    let (code, _, err) = common::run_tollgate(
        &[
            "serve",
            "--rules",
            "examples/rules",
            "--store",
            "redis://127.0.0.1:6379",
            "--store-tls-ca",
            "/etc/ssl/ca.pem",
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("store_tls_ca") && err.contains("rediss://"),
        "{err}"
    );
    let (code, _, err) = common::run_tollgate(
        &[
            "serve",
            "--rules",
            "examples/rules",
            "--store",
            "rediss://127.0.0.1:6379",
            "--store-tls-cert",
            "/etc/ssl/client.pem",
        ],
        &[],
    );
    assert_ne!(code, 0);
    assert!(err.contains("store_tls_key"), "{err}");
}

/// `rediss://` to a port that speaks plain-text Redis: the handshake is never answered, and the
/// error says the likely cause instead of a bare timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_a_plain_text_port_names_the_likely_cause() {
    let redis = TestRedis::start();
    let mut s = settings(&format!("rediss://127.0.0.1:{}", redis.port()), 100);
    s.store_connect_timeout_ms = 300;
    let store = store(s).await;
    assert_eq!(store.state(), "disconnected");
    let error = store.connect_error().expect("the connection error");
    assert!(
        error.contains("plain-text Redis never answers the TLS handshake"),
        "{error}"
    );
}

/// A managed Redis whose certificate names a host (`redis.managed.test`) other than the one
/// reached (127.0.0.1, as through a tunnel or a private endpoint): refused as it should be,
/// and served with `store_tls_server_name` naming the host the certificate carries. The
/// certificate is still verified: a wrong expected name is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_host_needs_its_name_and_nothing_less() {
    let certs = TestCerts::generate();
    let redis = TestRedis::start_tls_with(
        &certs,
        false,
        &[
            "--tls-cert-file",
            &certs.file("managed.crt"),
            "--tls-key-file",
            &certs.file("managed.key"),
        ],
    );
    let with_name = |name: &str| Settings {
        store_tls_ca: certs.file("ca.crt"),
        store_tls_server_name: name.to_string(),
        ..settings(&redis.tls_url(), 500)
    };
    let k = key("managed:", "a");
    for refused in ["", "localhost"] {
        let s = store(with_name(refused)).await;
        assert_eq!(s.state(), "disconnected", "expected name {refused:?}");
        assert!(
            s.apply(&[tb(&k, 3, 3, HOUR, 1)]).await.is_err(),
            "expected name {refused:?}: the certificate does not carry it"
        );
    }
    let named = store(with_name(common::tls::MANAGED_NAME)).await;
    assert_eq!(one(&named, tb(&k, 3, 3, HOUR, 1)).await.remaining, 2);
    assert_eq!(one(&named, tb(&k, 3, 3, HOUR, 1)).await.remaining, 1);
}
