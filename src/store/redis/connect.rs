//! How connections are made: the store URL parsed into a [`Connector`] (standalone Redis or
//! Redis Cluster), and [`Conn`], one live connection of either kind.
//!
//! `redis://[user:pass@]host:port[/db]` is one Redis; `redis+cluster://[user:pass@]h1:p1,h2:p2`
//! seeds a cluster client (credentials apply to every node; Redis Cluster has only database
//! 0). Both kinds of connection are cheap handles onto a shared driver task: a standalone
//! [`MultiplexedConnection`] pipelines concurrent requests, a [`ClusterConnection`] keeps one
//! connection per node and follows the slot map.
//!
//! `rediss://` and `rediss+cluster://` are the same over TLS (rustls with the ring provider;
//! no OpenSSL): the server's certificate is checked against `store_tls_ca` (else the system
//! roots) and the host name or IP of the URL; `store_tls_cert` + `store_tls_key` add a client
//! certificate (mutual TLS). The files are read once, at startup: a missing or unreadable one
//! is a startup error naming the setting and the path.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, RedisError, Value};

use super::RedisConfig;
use super::errors::config_error;
use crate::settings::redact_url;
use crate::store::StoreError;

/// How connections are made: a parsed URL.
pub(super) enum Connector {
    Standalone {
        client: redis::Client,
        config: AsyncConnectionConfig,
    },
    Cluster(ClusterClient),
}

/// One live connection; both kinds are cheap handles onto a shared driver task.
#[derive(Clone)]
pub(super) enum Conn {
    Standalone(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// Lets commands that need no per-topology handling (SCRIPT LOAD) use either kind.
impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::Standalone(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Standalone(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Connector {
    pub(super) fn parse(cfg: &RedisConfig) -> Result<Connector, StoreError> {
        let url = cfg.url.as_str();
        let shown = redact_url(url);
        let tls = url.starts_with("rediss://") || url.starts_with("rediss+cluster://");
        let certs = if tls { tls_certificates(cfg)? } else { None };
        let cluster = url
            .strip_prefix("redis+cluster://")
            .or_else(|| url.strip_prefix("rediss+cluster://"));
        if let Some(rest) = cluster {
            let scheme = if tls { "rediss" } else { "redis" };
            let (auth, rest) = match rest.rsplit_once('@') {
                Some((auth, hosts)) => (Some(auth), hosts),
                None => (None, rest),
            };
            let (hosts, tail) = match rest.find(['/', '?']) {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            if !matches!(tail, "" | "/" | "/0") {
                return Err(config_error(format!(
                    "{shown}: a cluster URL takes no database or options (Redis Cluster has only database 0)"
                )));
            }
            let nodes: Vec<String> = hosts
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(|h| match auth {
                    // Credentials apply to every node.
                    Some(auth) => format!("{scheme}://{auth}@{h}"),
                    None => format!("{scheme}://{h}"),
                })
                .collect();
            if nodes.is_empty() {
                return Err(config_error(format!(
                    "{shown}: no cluster nodes (expected host:port,host:port,…)"
                )));
            }
            let mut builder = ClusterClient::builder(nodes)
                .connection_timeout(cfg.connect_timeout)
                // Bounds the cluster client's internal work (slot refreshes, reconnects); each
                // request is bounded by our own, shorter timeout.
                .response_timeout(cfg.connect_timeout.max(cfg.timeout));
            if let Some(certs) = certs {
                builder = builder.certs(certs);
            }
            let client = builder
                .build()
                .map_err(|e| config_error(format!("{shown}: {e}")))?;
            return Ok(Connector::Cluster(client));
        }
        if !url.starts_with("redis://") && !url.starts_with("rediss://") {
            return Err(config_error(format!(
                "{shown}: expected redis://, rediss://, redis+cluster:// or rediss+cluster://"
            )));
        }
        let client = match certs {
            Some(certs) => redis::Client::build_with_tls(url, certs),
            None => redis::Client::open(url),
        }
        .map_err(|e| config_error(format!("{shown}: {e}")))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(cfg.connect_timeout))
            // Every call is bounded by our own timeout (tokio::time::timeout) instead.
            .set_response_timeout(None);
        Ok(Connector::Standalone { client, config })
    }

    pub(super) async fn connect(&self) -> Result<Conn, RedisError> {
        match self {
            Connector::Standalone { client, config } => client
                .get_multiplexed_async_connection_with_config(config)
                .await
                .map(Conn::Standalone),
            Connector::Cluster(client) => client.get_async_connection().await.map(Conn::Cluster),
        }
    }

    pub(super) fn name(&self) -> &'static str {
        match self {
            Connector::Standalone { .. } => "redis",
            Connector::Cluster(_) => "redis-cluster",
        }
    }
}

/// The TLS files of the settings, read now; `None` when none is set (the system roots, no
/// client certificate). Installs rustls's ring provider for the process first: rustls needs
/// exactly one, and only ring is compiled in.
fn tls_certificates(cfg: &RedisConfig) -> Result<Option<redis::TlsCertificates>, StoreError> {
    // Err only when a provider is installed already (by an earlier store): fine either way.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let read = |setting: &str, path: &str| -> Result<Option<Vec<u8>>, StoreError> {
        if path.is_empty() {
            return Ok(None);
        }
        std::fs::read(path)
            .map(Some)
            .map_err(|e| config_error(format!("{setting} {path}: {e}")))
    };
    let root_cert = read("store_tls_ca", &cfg.tls_ca)?;
    let client_tls = match (
        read("store_tls_cert", &cfg.tls_cert)?,
        read("store_tls_key", &cfg.tls_key)?,
    ) {
        (Some(client_cert), Some(client_key)) => Some(redis::ClientTlsConfig {
            client_cert,
            client_key,
        }),
        (None, None) => None,
        _ => {
            return Err(config_error(
                "store_tls_cert and store_tls_key go together (mutual TLS needs both)".into(),
            ));
        }
    };
    if root_cert.is_none() && client_tls.is_none() {
        return Ok(None);
    }
    Ok(Some(redis::TlsCertificates {
        client_tls,
        root_cert,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(url: &str) -> RedisConfig {
        RedisConfig {
            url: url.to_string(),
            pool_size: 2,
            connect_timeout: std::time::Duration::from_millis(200),
            timeout: std::time::Duration::from_millis(20),
            breaker_failures: 3,
            breaker_probe: std::time::Duration::from_millis(500),
            tls_ca: String::new(),
            tls_cert: String::new(),
            tls_key: String::new(),
        }
    }

    #[test]
    fn urls_parse_into_the_right_topology() {
        assert!(matches!(
            Connector::parse(&cfg("redis://127.0.0.1:6379")),
            Ok(Connector::Standalone { .. })
        ));
        assert!(matches!(
            Connector::parse(&cfg("redis://:pw@127.0.0.1:6379/3")),
            Ok(Connector::Standalone { .. })
        ));
        assert!(matches!(
            Connector::parse(&cfg("redis+cluster://u:p@127.0.0.1:7000,127.0.0.1:7001")),
            Ok(Connector::Cluster(_))
        ));
        assert!(matches!(
            Connector::parse(&cfg("redis+cluster://127.0.0.1:7000/0")),
            Ok(Connector::Cluster(_))
        ));
        assert!(matches!(
            Connector::parse(&cfg("rediss://u:p@127.0.0.1:6380")),
            Ok(Connector::Standalone { .. })
        ));
        assert!(matches!(
            Connector::parse(&cfg("rediss+cluster://127.0.0.1:7000,127.0.0.1:7001")),
            Ok(Connector::Cluster(_))
        ));
    }

    #[test]
    fn unreadable_tls_files_are_config_errors_naming_the_setting() {
        let mut c = cfg("rediss://u:hunter2@127.0.0.1:6380");
        c.tls_ca = "/nonexistent/ca.pem".into();
        let Err(e) = Connector::parse(&c) else {
            panic!("a missing CA file was accepted")
        };
        assert!(!e.is_transient());
        assert!(
            e.message.contains("store_tls_ca /nonexistent/ca.pem"),
            "{e}"
        );
        assert!(!e.message.contains("hunter2"), "{e}");
    }

    #[test]
    fn bad_urls_are_config_errors_without_secrets() {
        let Err(e) = Connector::parse(&cfg("redis+cluster://u:hunter2@a:1,b:2/3")) else {
            panic!()
        };
        assert!(
            e.message.contains("database 0") && !e.message.contains("hunter2"),
            "{e}"
        );
        assert!(Connector::parse(&cfg("redis+cluster://")).is_err());
        assert!(Connector::parse(&cfg("memcached://h:1")).is_err());
    }
}
