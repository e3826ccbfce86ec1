//! How one Redis client is built: `TCP_NODELAY` on every connection, TLS from the files the
//! settings name (read and checked once at startup), and the password file (read again at
//! each new connection). Used by `connect.rs` and `sentinel.rs`.

use redis::{ConnectionInfo, RedisError};

use super::RedisConfig;
use super::errors::config_error;
use crate::store::StoreError;

/// A standalone client for `info`, over TLS with `certs` when given.
pub(super) fn standalone_client(
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
pub(super) fn tcp_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// The password in `file` (a mounted Secret: one line; a trailing newline is not part of it).
/// An unreadable file is an authentication failure of the connection being made.
pub(super) fn read_password(file: &str) -> Result<String, RedisError> {
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
pub(super) fn tls_certificates(
    cfg: &RedisConfig,
) -> Result<Option<redis::TlsCertificates>, StoreError> {
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
