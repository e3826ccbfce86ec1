//! How connections are made: the store URL parsed into a [`Connector`] (standalone Redis or
//! Redis Cluster), and [`Conn`], one live connection of either kind.
//!
//! `redis://[user:pass@]host:port[/db]` is one Redis; `redis+cluster://[user:pass@]h1:p1,h2:p2`
//! seeds a cluster client (credentials apply to every node; Redis Cluster has only database
//! 0). Both kinds of connection are cheap handles onto a shared driver task: a standalone
//! [`MultiplexedConnection`] pipelines concurrent requests, a [`ClusterConnection`] keeps one
//! connection per node and follows the slot map.
//!
//! `redis+sentinel://[user:pass@]s1:p1,s2:p2/<master>[/db]` asks the Sentinels for the primary
//! at each new connection, so a reconnect after a failover reaches the new one (the pool drops
//! every connection when Redis answers READONLY: see `pool.rs`).
//!
//! `rediss://`, `rediss+cluster://` and `rediss+sentinel://` are the same over TLS (rustls
//! with the ring provider; no OpenSSL): the server's certificate is checked against
//! `store_tls_ca` (else the system roots) and the host name or IP of the URL (for Sentinel:
//! of each Sentinel, and of the primary as the Sentinels name it); `store_tls_cert` +
//! `store_tls_key` add a client certificate (mutual TLS). With Sentinel, one TLS setup serves
//! the Sentinels and the data nodes, as Redis's own `tls-*` settings do for both. The files
//! are read once, at startup: a missing or unreadable one is a startup error naming the
//! setting and the path.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, ConnectionInfo, IntoConnectionInfo, RedisError, Value};

use super::RedisConfig;
use super::errors::config_error;
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
            return sentinel(cfg, rest, &shown, node, certs, tls);
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
        if !url.starts_with("redis://") && !url.starts_with("rediss://") {
            return Err(config_error(format!(
                "{shown}: expected redis://, rediss://, redis+cluster:// or rediss+cluster://"
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
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(cfg.connect_timeout))
            // Every call is bounded by our own timeout (tokio::time::timeout) instead.
            .set_response_timeout(None);
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

/// The data nodes' credentials from the settings (the URL may carry them instead).
struct NodeAuth {
    username: Option<String>,
    password: Option<String>,
    password_file: Option<String>,
}

/// `redis[s]+sentinel://[user:pass@]s1:p1,s2:p2/<master>[/db]`: the sentinels, the primary's
/// name, and how to talk to the data nodes (the URL's credentials, else the settings'; the
/// database; TLS for `rediss`). The sentinels' own credentials are
/// `store_sentinel_username` / `_password`.
fn sentinel(
    cfg: &RedisConfig,
    rest: &str,
    shown: &str,
    auth_settings: NodeAuth,
    certs: Option<redis::TlsCertificates>,
    tls: bool,
) -> Result<Connector, StoreError> {
    let usage = "expected redis[s]+sentinel://[user:pass@]host:port,host:port/<master name>[/db]";
    let NodeAuth {
        username,
        password,
        password_file,
    } = auth_settings;
    let (auth, rest) = match rest.rsplit_once('@') {
        Some((auth, rest)) => (Some(auth), rest),
        None => (None, rest),
    };
    let Some((hosts, path)) = rest.split_once('/') else {
        return Err(config_error(format!("{shown}: no master name ({usage})")));
    };
    let (master, db) = match path.split_once('/') {
        Some((master, db)) => (master, db),
        None => (path, ""),
    };
    let db: i64 = match db {
        "" => 0,
        db => db.parse().map_err(|_| {
            config_error(format!(
                "{shown}: database '{db}' is not a number ({usage})"
            ))
        })?,
    };
    if master.is_empty() {
        return Err(config_error(format!("{shown}: no master name ({usage})")));
    }
    let sentinel_auth = match (
        cfg.sentinel_username.as_str(),
        cfg.sentinel_password.as_str(),
    ) {
        ("", "") => String::new(),
        (user, pass) => format!("{user}:{pass}@"),
    };
    let scheme = if tls { "rediss" } else { "redis" };
    // Parsed once now, so a bad Sentinel address stops startup.
    let sentinels: Vec<ConnectionInfo> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| {
            format!("{scheme}://{sentinel_auth}{h}")
                .into_connection_info()
                .map_err(|e| config_error(format!("{shown}: {e}")))
        })
        .collect::<Result<_, _>>()?;
    if sentinels.is_empty() {
        return Err(config_error(format!("{shown}: no sentinels ({usage})")));
    }
    let (url_user, url_pass) = match auth.map(|a| a.split_once(':').unwrap_or((a, ""))) {
        Some((u, p)) => (
            (!u.is_empty()).then(|| u.to_string()),
            (!p.is_empty()).then(|| p.to_string()),
        ),
        None => (None, None),
    };
    let mut node = redis::RedisConnectionInfo::default().set_db(db);
    if let Some(user) = username.or(url_user) {
        node = node.set_username(user);
    }
    if let Some(pw) = password.or(url_pass) {
        node = node.set_password(pw);
    }
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(cfg.connect_timeout))
        .set_response_timeout(None);
    Ok(Connector::Sentinel {
        sentinels,
        master: master.to_string(),
        node: Box::new(node),
        tls,
        certs,
        config: Box::new(config),
        password_file,
        primary: std::sync::Mutex::new(None),
    })
}

/// The primary of `master` as the first Sentinel that answers names it (`host:port`).
async fn primary_of(
    sentinels: &[ConnectionInfo],
    certs: Option<&redis::TlsCertificates>,
    master: &str,
    config: &AsyncConnectionConfig,
) -> Result<String, RedisError> {
    let mut last = None;
    for sentinel in sentinels {
        let asked = async {
            let mut conn = standalone_client(sentinel, certs)?
                .get_multiplexed_async_connection_with_config(config)
                .await?;
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(master)
                .query_async::<Option<(String, u16)>>(&mut conn)
                .await
        };
        match asked.await {
            Ok(Some((host, port))) => return Ok(format!("{host}:{port}")),
            Ok(None) => {
                last = Some(RedisError::from((
                    redis::ErrorKind::Io,
                    "the Sentinels know no such master",
                    master.to_string(),
                )))
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| RedisError::from((redis::ErrorKind::Io, "no Sentinels"))))
}

/// A standalone client for `info`, over TLS with `certs` when given.
fn standalone_client(
    info: &ConnectionInfo,
    certs: Option<&redis::TlsCertificates>,
) -> Result<redis::Client, RedisError> {
    let info = info.clone().set_tcp_settings(tcp_settings());
    match certs {
        Some(certs) => redis::Client::build_with_tls(info, certs.clone()),
        None => redis::Client::open(info),
    }
}

/// `TCP_NODELAY` on every store connection. The `redis` crate leaves Nagle's algorithm on: a
/// small pipeline written while an earlier one is unacknowledged then waits for the delayed
/// ACK (up to 40 ms on Linux), twice Envoy's whole 20 ms budget, on an idle healthy Redis.
fn tcp_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// The password in `file` (a mounted Secret: one line; a trailing newline is not part of it).
/// An unreadable file is an authentication failure of the connection being made.
fn read_password(file: &str) -> Result<String, RedisError> {
    match std::fs::read_to_string(file) {
        Ok(text) => Ok(text.trim_end_matches(['\n', '\r']).to_string()),
        Err(e) => Err(RedisError::from((
            redis::ErrorKind::AuthenticationFailed,
            "cannot read store_password_file",
            format!("{file}: {e}"),
        ))),
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
    // A CA file without a certificate would be accepted here and fail every handshake later as
    // `UnknownIssuer`, which points at the server: refuse it now, naming the file.
    if let Some(pem) = &root_cert {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        if !CertificateDer::pem_slice_iter(pem).any(|c| c.is_ok()) {
            return Err(config_error(format!(
                "store_tls_ca {}: no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)",
                cfg.tls_ca
            )));
        }
    }
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
