//! The Redis version, checked on each new connection: the scripts write from Lua with
//! effects replication, the default from Redis 5 on (Redis 3.2–4 replicate the script itself,
//! and `TIME` inside a replicated script is refused or diverges on replicas). An older server is
//! refused with a clear error instead of failing one script call at a time.
//!
//! The version comes from `INFO server` (`redis_version:`; Valkey reports a compatible one);
//! on a cluster each node answers. An ACL user that may not run `INFO` leaves it unknown:
//! then the connection is kept.

use redis::aio::ConnectionLike;
use redis::{ErrorKind, RedisError, Value};

/// The oldest major version the scripts work on.
pub(super) const MIN_MAJOR: u32 = 5;

/// Refuses `conn` when any node it reaches reports a `redis_version` older than
/// [`MIN_MAJOR`].
pub(super) async fn check<C: ConnectionLike>(conn: &mut C) -> Result<(), RedisError> {
    let Ok(reply) = redis::cmd("INFO")
        .arg("server")
        .query_async::<Value>(conn)
        .await
    else {
        return Ok(());
    };
    let mut texts = Vec::new();
    super::eviction::collect_text(&reply, &mut texts);
    match too_old(&texts) {
        Some(version) => Err(RedisError::from((
            ErrorKind::InvalidClientConfig,
            "Redis is too old for tollgate",
            format!(
                "redis_version {version}: tollgate's scripts need Redis {MIN_MAJOR} or newer (effects replication); upgrade the server"
            ),
        ))),
        None => Ok(()),
    }
}

/// The first `redis_version` in `texts` older than [`MIN_MAJOR`].
fn too_old(texts: &[String]) -> Option<String> {
    texts
        .iter()
        .flat_map(|t| t.lines())
        .filter_map(|l| l.trim().strip_prefix("redis_version:"))
        .find(|v| {
            v.split('.')
                .next()
                .and_then(|major| major.parse::<u32>().ok())
                .is_some_and(|major| major < MIN_MAJOR)
        })
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_before_5_are_refused() {
        let info = |v: &str| {
            vec![format!(
                "# Server\r\nredis_version:{v}\r\nredis_mode:standalone\r\n"
            )]
        };
        assert_eq!(too_old(&info("4.0.14")).as_deref(), Some("4.0.14"));
        assert_eq!(too_old(&info("3.2.12")).as_deref(), Some("3.2.12"));
        for ok in ["5.0.0", "6.2.14", "7.0.15", "7.2.4", "8.0.1"] {
            assert_eq!(too_old(&info(ok)), None, "{ok}");
        }
        assert_eq!(
            too_old(&["# Server\r\n".to_string()]),
            None,
            "unknown: kept"
        );
        let cluster = [info("7.0.15"), info("4.0.1")].concat();
        assert_eq!(too_old(&cluster).as_deref(), Some("4.0.1"), "any node");
    }
}
