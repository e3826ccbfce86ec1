//! Redis Sentinel (`redis[s]+sentinel://…`): the URL parsed into the Sentinels, the primary's
//! name and how to reach the data nodes ([`parse`]), and the question each new connection
//! asks the Sentinels ([`primary_of`]). `connect.rs` keeps the connections.

use redis::{AsyncConnectionConfig, ConnectionInfo, IntoConnectionInfo, RedisError};

use super::RedisConfig;
use super::client::standalone_client;
use super::errors::config_error;
use crate::store::StoreError;

/// A parsed Sentinel URL (the fields of `Connector::Sentinel` but its last primary).
pub(super) struct SentinelSpec {
    pub(super) sentinels: Vec<ConnectionInfo>,
    pub(super) master: String,
    pub(super) node: Box<redis::RedisConnectionInfo>,
    pub(super) tls: bool,
    pub(super) certs: Option<redis::TlsCertificates>,
    pub(super) config: Box<AsyncConnectionConfig>,
    pub(super) password_file: Option<String>,
}

/// The data nodes' credentials from the settings (the URL may carry them instead).
pub(super) struct NodeAuth {
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
    pub(super) password_file: Option<String>,
}

/// `redis[s]+sentinel://[user:pass@]s1:p1,s2:p2/<master>[/db]`: the sentinels, the primary's
/// name, and how to talk to the data nodes (the URL's credentials, else the settings'; the
/// database; TLS for `rediss`). The sentinels' own credentials are
/// `store_sentinel_username` / `_password`.
pub(super) fn parse(
    cfg: &RedisConfig,
    rest: &str,
    shown: &str,
    auth_settings: NodeAuth,
    certs: Option<redis::TlsCertificates>,
    tls: bool,
) -> Result<SentinelSpec, StoreError> {
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
    Ok(SentinelSpec {
        sentinels,
        master: master.to_string(),
        node: Box::new(node),
        tls,
        certs,
        config: Box::new(config),
        password_file,
    })
}

/// The primary of `master` as the first Sentinel that answers names it (`host:port`).
pub(super) async fn primary_of(
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
