//! What a failed Redis call means: the client's [`RedisError`] (or a reply of the wrong shape)
//! becomes a [`StoreError`] of one [`StoreErrorKind`].
//!
//! `timeout` (no answer within `store_timeout_ms`; made by the caller, not here), `connection`
//! (not connected, or the connection broke) and `unavailable` (`CLUSTERDOWN`, `TRYAGAIN`,
//! `LOADING`, `BUSY`, a redirect that did not settle, …) are transient; `script` (a script or
//! data error), `auth`, `tls` (a failed handshake) and `protocol` (a reply of the wrong shape)
//! are not; `config` (a bad URL) only comes from parsing the URL at startup.

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::store::{StoreError, StoreErrorKind};

/// A failure of one store call, before it becomes a [`StoreError`].
#[derive(Debug, thiserror::Error)]
pub(super) enum CallError {
    #[error("{0}")]
    Redis(#[from] RedisError),
    #[error("unexpected reply from Redis: {0}")]
    Reply(String),
}

impl CallError {
    pub(super) fn into_store_error(self) -> StoreError {
        match self {
            CallError::Redis(e) => StoreError::new(kind_of(&e), e.to_string()).with_source(e),
            e @ CallError::Reply(_) => StoreError::new(StoreErrorKind::Protocol, e.to_string()),
        }
    }
}

/// The kind of a Redis error; transient where a retry may succeed.
pub(super) fn kind_of(e: &RedisError) -> StoreErrorKind {
    if e.is_timeout() {
        return StoreErrorKind::Timeout;
    }
    if is_tls(e) {
        return StoreErrorKind::Tls;
    }
    if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.kind() == ErrorKind::ClusterConnectionNotFound
    {
        return StoreErrorKind::Connection;
    }
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::ClusterDown
            | ServerErrorKind::TryAgain
            | ServerErrorKind::MasterDown
            | ServerErrorKind::BusyLoading
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::ReadOnly,
        ) => StoreErrorKind::Unavailable,
        ErrorKind::AuthenticationFailed | ErrorKind::Server(ServerErrorKind::NoPerm) => {
            StoreErrorKind::Auth
        }
        // A server that wants credentials (none given: NOAUTH) or refuses them: however the
        // `redis` crate classifies the reply, it is an authentication failure.
        _ if matches!(e.code(), Some("NOAUTH" | "WRONGPASS")) => StoreErrorKind::Auth,
        // BUSY (a script running long) and OOM pass; others are a script or data problem.
        _ if matches!(e.code(), Some("BUSY" | "OOM")) => StoreErrorKind::Unavailable,
        ErrorKind::Server(_) | ErrorKind::Extension => StoreErrorKind::Script,
        _ => StoreErrorKind::Protocol,
    }
}

/// Whether `e` is a failed TLS handshake: a `rustls::Error` somewhere in its source chain,
/// directly or inside an `io::Error` as tokio-rustls reports it. The `redis` crate keeps the
/// I/O error behind an `Arc<dyn Error>`, and `io::Error::source` skips the error it wraps, so
/// each link is also looked into through those two wrappers.
fn is_tls(e: &RedisError) -> bool {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    fn rustls_inside(err: &(dyn std::error::Error + 'static)) -> bool {
        if err.is::<rustls::Error>() {
            return true;
        }
        if let Some(shared) = err.downcast_ref::<Shared>() {
            return rustls_inside(shared.as_ref());
        }
        err.downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .is_some_and(|inner| rustls_inside(inner))
    }
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        if rustls_inside(err) {
            return true;
        }
        next = err.source();
    }
    false
}

/// The metrics `kind` of a failed connection attempt: `tls` (the handshake), `auth`
/// (credentials or ACL), else `connect`.
pub(super) fn connect_kind(e: &RedisError) -> &'static str {
    match kind_of(e) {
        StoreErrorKind::Tls => "tls",
        StoreErrorKind::Auth => "auth",
        _ => "connect",
    }
}

/// Whether `e` is Redis's `READONLY`: the connection reaches a replica, as a primary demoted
/// by a failover does. Reconnecting (through the Sentinels) reaches the new primary.
pub(super) fn is_readonly(e: &StoreError) -> bool {
    e.source
        .as_deref()
        .and_then(|s| s.downcast_ref::<RedisError>())
        .is_some_and(|r| r.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly))
}

/// A configuration error (a bad URL), with the password already removed from `message`.
pub(super) fn config_error(message: String) -> StoreError {
    StoreError::new(StoreErrorKind::Config, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_keep_their_metric_labels_and_transience() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(kind_of(&io), StoreErrorKind::Connection);
        let handshake = RedisError::from(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        ));
        assert_eq!(kind_of(&handshake), StoreErrorKind::Tls);
        assert_eq!(connect_kind(&handshake), "tls");
        assert_eq!(connect_kind(&io), "connect");
        let reply = CallError::Reply("x".into()).into_store_error();
        assert_eq!(
            (reply.kind.label(), reply.is_transient()),
            ("protocol", false)
        );
        for (kind, label, transient) in [
            (StoreErrorKind::Timeout, "timeout", true),
            (StoreErrorKind::Connection, "connection", true),
            (StoreErrorKind::Unavailable, "unavailable", true),
            (StoreErrorKind::Script, "script", false),
            (StoreErrorKind::Auth, "auth", false),
            (StoreErrorKind::Tls, "tls", false),
            (StoreErrorKind::Protocol, "protocol", false),
            (StoreErrorKind::Config, "config", false),
        ] {
            assert_eq!((kind.label(), kind.is_transient()), (label, transient));
        }
        let e = CallError::Redis(io).into_store_error();
        assert!(
            std::error::Error::source(&e).is_some(),
            "carries its source"
        );
    }
}
