//! How connections are made: the store URL parsed into a [`Connector`] (standalone Redis or
//! Redis Cluster), and [`Conn`], one live connection of either kind.
//!
//! `redis://[user:pass@]host:port[/db]` is one Redis; `redis+cluster://[user:pass@]h1:p1,h2:p2`
//! seeds a cluster client (credentials apply to every node; Redis Cluster has only database
//! 0). Both kinds of connection are cheap handles onto a shared driver task: a standalone
//! [`MultiplexedConnection`] pipelines concurrent requests, a [`ClusterConnection`] keeps one
//! connection per node and follows the slot map.
//!
//! `redis+unix:///path/to/redis.sock[?db=N]` is one Redis over a unix socket (a sidecar, or
//! the reference's default); it is a standalone connection like `redis://` in every other way.
//!
//! `redis+sentinel://[user:pass@]s1:p1,s2:p2/<master>[/db]` asks the Sentinels for the primary
//! at each new connection, so a reconnect after a failover reaches the new one (the pool drops
//! every connection when Redis answers READONLY: see `pool/`).
//!
//! `rediss://`, `rediss+cluster://` and `rediss+sentinel://` are the same over TLS (rustls
//! with the ring provider; no OpenSSL): the server's certificate is checked against
//! `store_tls_ca` (else the system roots) and the host name or IP of the URL (for Sentinel:
//! of each Sentinel, and of the primary as the Sentinels name it), or for one Redis against
//! `store_tls_server_name` when it is set (a managed Redis whose certificate names another
//! host than the one reached: [`pin_server_name`]); `store_tls_cert` +
//! `store_tls_key` add a client certificate (mutual TLS). With Sentinel, one TLS setup serves
//! the Sentinels and the data nodes, as Redis's own `tls-*` settings do for both. The files
//! are read once, at startup: a missing or unreadable one is a startup error naming the
//! setting and the path (`client.rs` builds each client; `sentinel.rs` parses a Sentinel URL
//! and asks the Sentinels).

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisError, Value,
};

use super::RedisConfig;
use super::client::{read_password, standalone_client, tcp_settings, tls_certificates};
use super::errors::config_error;
use super::sentinel::{self, NodeAuth, primary_of};
use crate::redact::redact_url;
use crate::store::StoreError;

/// How connections are made: a parsed URL, the TLS files and the credentials. A client is
/// built at each new connection, so a password file is read again each time.
pub(super) enum Connector {
    /// Boxed: a connection config is several times the size of the cluster's parts.
    Standalone {
        info: Box<ConnectionInfo>,
        certs: Option<redis::TlsCertificates>,
        config: Box<AsyncConnectionConfig>,
        password_file: Option<String>,
    },
    Cluster {
        spec: ClusterSpec,
        password_file: Option<String>,
    },
    /// Sentinels that name the primary of `master`. Each new connection asks them again, so
    /// a reconnect after a failover reaches the new primary.
    Sentinel {
        /// Each Sentinel's address and credentials (`store_sentinel_*`), `rediss://` for TLS.
        sentinels: Vec<ConnectionInfo>,
        master: String,
        node: Box<redis::RedisConnectionInfo>,
        /// Whether the Sentinels and the primary are reached over TLS, and with which files.
        tls: bool,
        certs: Option<redis::TlsCertificates>,
        config: Box<AsyncConnectionConfig>,
        password_file: Option<String>,
        /// The primary the last connection was made to, `host:port`: the keeper asks the
        /// Sentinels every round and drops the connections when they name another
        /// ([`Connector::primary_moved`]).
        primary: std::sync::Mutex<Option<String>>,
    },
}

/// `store_tls_server_name`: the connection is addressed to `name` (so rustls sends it as SNI
/// and checks the certificate against it) and a resolver sends `name` to the URL's host, so
/// the TCP connection still goes where the URL says. The certificate is verified in full;
/// only the name it must carry changes.
fn pin_server_name(
    info: ConnectionInfo,
    name: &str,
) -> Result<(ConnectionInfo, PinnedName), String> {
    rustls::pki_types::ServerName::try_from(name.to_string())
        .map_err(|e| format!("'{name}' is not a DNS name or IP address: {e}"))?;
    let ConnectionAddr::TcpTls {
        host,
        port,
        insecure,
        tls_params,
    } = info.addr().clone()
    else {
        return Err("applies to rediss:// only".into());
    };
    let addr = ConnectionAddr::TcpTls {
        host: name.to_string(),
        port,
        insecure,
        tls_params,
    };
    let resolver = PinnedName {
        name: name.to_string(),
        host,
    };
    Ok((info.set_addr(addr), resolver))
}

/// Resolves the certificate's name to the URL's host (see [`pin_server_name`]); any other
/// name as the system does.
struct PinnedName {
    name: String,
    host: String,
}

impl redis::io::AsyncDNSResolver for PinnedName {
    fn resolve<'a, 'b: 'a>(
        &'a self,
        host: &'b str,
        port: u16,
    ) -> redis::RedisFuture<'a, Box<dyn Iterator<Item = std::net::SocketAddr> + Send + 'a>> {
        let target = if host == self.name {
            self.host.as_str()
        } else {
            host
        };
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((target, port)).await?;
            Ok(Box::new(addrs) as Box<dyn Iterator<Item = _> + Send>)
        })
    }
}

/// What a cluster client is built from.
pub(super) struct ClusterSpec {
    nodes: Vec<String>,
    certs: Option<redis::TlsCertificates>,
    connect_timeout: std::time::Duration,
    response_timeout: std::time::Duration,
    username: Option<String>,
    password: Option<String>,
}

impl ClusterSpec {
    fn client(&self, password: Option<String>) -> Result<ClusterClient, RedisError> {
        let mut builder = ClusterClient::builder(self.nodes.clone())
            .connection_timeout(self.connect_timeout)
            // Bounds the cluster client's internal work (slot refreshes, reconnects); each
            // request is bounded by our own, shorter timeout.
            .response_timeout(self.response_timeout)
            .tcp_settings(tcp_settings());
        if let Some(certs) = &self.certs {
            builder = builder.certs(certs.clone());
        }
        if let Some(user) = &self.username {
            builder = builder.username(user);
        }
        if let Some(pw) = password.as_ref().or(self.password.as_ref()) {
            builder = builder.password(pw);
        }
        builder.build()
    }
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
        let tls = url.starts_with("rediss://")
            || url.starts_with("rediss+cluster://")
            || url.starts_with("rediss+sentinel://");
        let certs = if tls { tls_certificates(cfg)? } else { None };
        let username = (!cfg.username.is_empty()).then(|| cfg.username.clone());
        let password = (!cfg.password.is_empty()).then(|| cfg.password.clone());
        let password_file = (!cfg.password_file.is_empty()).then(|| cfg.password_file.clone());
        if let Some(file) = &password_file {
            // Read once now, so a wrong path stops startup; again at each new connection.
            read_password(file).map_err(|e| config_error(e.to_string()))?;
        }
        let sentinels = url
            .strip_prefix("redis+sentinel://")
            .or_else(|| url.strip_prefix("rediss+sentinel://"));
        if let Some(rest) = sentinels {
            let node = NodeAuth {
                username,
                password,
                password_file,
            };
            let spec = sentinel::parse(cfg, rest, &shown, node, certs, tls)?;
            return Ok(Connector::Sentinel {
                sentinels: spec.sentinels,
                master: spec.master,
                node: spec.node,
                tls: spec.tls,
                certs: spec.certs,
                config: spec.config,
                password_file: spec.password_file,
                primary: std::sync::Mutex::new(None),
            });
        }
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
            let spec = ClusterSpec {
                nodes,
                certs,
                connect_timeout: cfg.connect_timeout,
                response_timeout: cfg.connect_timeout.max(cfg.timeout),
                username,
                password,
            };
            // Built once now to check the URL.
            spec.client(None)
                .map_err(|e| config_error(format!("{shown}: {e}")))?;
            return Ok(Connector::Cluster {
                spec,
                password_file,
            });
        }
        if !["redis://", "rediss://", "redis+unix://", "unix://"]
            .iter()
            .any(|s| url.starts_with(s))
        {
            return Err(config_error(format!(
                "{shown}: expected redis://, rediss://, redis+cluster://, rediss+cluster:// or redis+unix://"
            )));
        }
        let mut info = url
            .into_connection_info()
            .map_err(|e| config_error(format!("{shown}: {e}")))?;
        if username.is_some() || password.is_some() {
            let mut settings = info.redis_settings().clone();
            if let Some(user) = &username {
                settings = settings.set_username(user);
            }
            if let Some(pw) = &password {
                settings = settings.set_password(pw);
            }
            info = info.set_redis_settings(settings);
        }
        // Built once now to check the URL and the TLS files.
        standalone_client(&info, certs.as_ref())
            .map_err(|e| config_error(format!("{shown}: {e}")))?;
        let mut config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(cfg.connect_timeout))
            // Every call is bounded by our own timeout (tokio::time::timeout) instead.
            .set_response_timeout(None);
        if !cfg.tls_server_name.is_empty() {
            let (pinned, resolver) = pin_server_name(info, &cfg.tls_server_name)
                .map_err(|e| config_error(format!("{shown}: store_tls_server_name: {e}")))?;
            info = pinned;
            config = config.set_dns_resolver(resolver);
        }
        Ok(Connector::Standalone {
            info: Box::new(info),
            certs,
            config: Box::new(config),
            password_file,
        })
    }

    pub(super) async fn connect(&self) -> Result<Conn, RedisError> {
        match self {
            Connector::Standalone {
                info,
                certs,
                config,
                password_file,
            } => {
                let mut info = (**info).clone();
                if let Some(file) = password_file {
                    let settings = info
                        .redis_settings()
                        .clone()
                        .set_password(read_password(file)?);
                    info = info.set_redis_settings(settings);
                }
                standalone_client(&info, certs.as_ref())?
                    .get_multiplexed_async_connection_with_config(config)
                    .await
                    .map(Conn::Standalone)
            }
            Connector::Cluster {
                spec,
                password_file,
            } => {
                let password = password_file.as_deref().map(read_password).transpose()?;
                spec.client(password)?
                    .get_async_connection()
                    .await
                    .map(Conn::Cluster)
            }
            Connector::Sentinel {
                sentinels,
                master,
                node,
                tls,
                certs,
                config,
                password_file,
                primary,
            } => {
                let mut node = (**node).clone();
                if let Some(file) = password_file {
                    node = node.set_password(read_password(file)?);
                }
                // Ask the Sentinels, then connect to the primary they name.
                let addr = primary_of(sentinels, certs.as_ref(), master, config).await?;
                let (host, port) = addr.rsplit_once(':').unwrap_or((addr.as_str(), "6379"));
                let port: u16 = port.parse().map_err(|_| {
                    RedisError::from((
                        redis::ErrorKind::Io,
                        "a Sentinel named a primary without a port",
                        addr.clone(),
                    ))
                })?;
                let scheme = if *tls { "rediss" } else { "redis" };
                let info = format!("{scheme}://{host}:{port}")
                    .into_connection_info()?
                    .set_redis_settings(node);
                let conn = standalone_client(&info, certs.as_ref())?
                    .get_multiplexed_async_connection_with_config(config)
                    .await?;
                *primary.lock().unwrap_or_else(|p| p.into_inner()) = Some(addr);
                Ok(Conn::Standalone(conn))
            }
        }
    }

    /// For Sentinel: whether the Sentinels now name another primary than the one the last
    /// connection was made to (a failover), so every connection must be replaced. Asked by the
    /// keeper each round; `false` when the Sentinels cannot be asked.
    pub(super) async fn primary_moved(&self) -> bool {
        let Connector::Sentinel {
            sentinels,
            master,
            certs,
            config,
            primary,
            ..
        } = self
        else {
            return false;
        };
        let Ok(now) = primary_of(sentinels, certs.as_ref(), master, config).await else {
            return false;
        };
        let known = primary.lock().unwrap_or_else(|p| p.into_inner()).clone();
        known.is_some_and(|known| known != now)
    }

    pub(super) fn name(&self) -> &'static str {
        match self {
            Connector::Standalone { .. } => "redis",
            Connector::Cluster { .. } => "redis-cluster",
            Connector::Sentinel { .. } => "redis-sentinel",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(url: &str) -> RedisConfig {
        RedisConfig::for_tests(url, 2, 200, 20)
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
            Ok(Connector::Cluster { .. })
        ));
        assert!(matches!(
            Connector::parse(&cfg("redis+cluster://127.0.0.1:7000/0")),
            Ok(Connector::Cluster { .. })
        ));
        assert!(matches!(
            Connector::parse(&cfg("rediss://u:p@127.0.0.1:6380")),
            Ok(Connector::Standalone { .. })
        ));
        assert!(matches!(
            Connector::parse(&cfg("rediss+cluster://127.0.0.1:7000,127.0.0.1:7001")),
            Ok(Connector::Cluster { .. })
        ));
    }

    #[test]
    fn sentinel_urls_name_sentinels_a_master_and_a_database() {
        let Ok(Connector::Sentinel {
            sentinels,
            master,
            node,
            ..
        }) = Connector::parse(&cfg(
            "redis+sentinel://u:pw@127.0.0.1:26379,127.0.0.1:26380/mymaster/2",
        ))
        else {
            panic!("not a sentinel connector")
        };
        let addrs: Vec<String> = sentinels.iter().map(|s| s.addr().to_string()).collect();
        assert_eq!(addrs, ["127.0.0.1:26379", "127.0.0.1:26380"]);
        assert_eq!((master.as_str(), node.db()), ("mymaster", 2));
        assert_eq!((node.username(), node.password()), (Some("u"), Some("pw")));
        for (url, says) in [
            (
                "redis+sentinel://u:hunter2@127.0.0.1:26379",
                "no master name",
            ),
            ("redis+sentinel://127.0.0.1:26379/", "no master name"),
            ("redis+sentinel://127.0.0.1:26379/m/x", "not a number"),
            ("redis+sentinel:///m", "no sentinels"),
            (
                "rediss+sentinel://u:hunter2@127.0.0.1:26379",
                "no master name",
            ),
        ] {
            let Err(e) = Connector::parse(&cfg(url)) else {
                panic!("{url} accepted")
            };
            assert!(e.message.contains(says), "{url}: {e}");
            assert!(!e.message.contains("hunter2"), "{e}");
        }
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
    fn a_ca_file_without_a_certificate_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [
            ("empty.pem", ""),
            (
                "key.pem",
                "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
            ),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            let mut c = cfg("rediss://127.0.0.1:6380");
            c.tls_ca = path.to_str().unwrap().into();
            let Err(e) = Connector::parse(&c) else {
                panic!("{name}: a CA file without a certificate was accepted")
            };
            assert!(!e.is_transient());
            assert!(
                e.message.contains(name) && e.message.contains("no PEM certificate"),
                "{e}"
            );
        }
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
