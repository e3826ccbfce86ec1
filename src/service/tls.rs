//! TLS on the gRPC port (`grpc_tls_cert` + `grpc_tls_key`, and `grpc_tls_client_ca` for mutual
//! TLS), for Envoy fleets that reach tollgate outside a mesh. The files are read once, at
//! startup: a missing or malformed one stops startup naming the setting. rustls with the ring
//! provider, as for `rediss://`; the admin port stays plain HTTP.

use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use crate::settings::Settings;

/// A TLS file that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{setting} {path}: {source}")]
pub struct TlsFileError {
    pub setting: &'static str,
    pub path: String,
    #[source]
    pub source: std::io::Error,
}

/// The gRPC port's TLS, or `None` for plain HTTP/2 (no `grpc_tls_cert`).
pub fn server_config(settings: &Settings) -> Result<Option<ServerTlsConfig>, TlsFileError> {
    if settings.grpc_tls_cert.is_empty() {
        return Ok(None);
    }
    // rustls needs one process-wide provider; only ring is compiled in. Err: already installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let read = |setting: &'static str, path: &str| {
        std::fs::read(path).map_err(|source| TlsFileError {
            setting,
            path: path.to_string(),
            source,
        })
    };
    let identity = Identity::from_pem(
        read("grpc_tls_cert", &settings.grpc_tls_cert)?,
        read("grpc_tls_key", &settings.grpc_tls_key)?,
    );
    let mut config = ServerTlsConfig::new().identity(identity);
    if !settings.grpc_tls_client_ca.is_empty() {
        let ca = read("grpc_tls_client_ca", &settings.grpc_tls_client_ca)?;
        config = config.client_ca_root(Certificate::from_pem(ca));
    }
    Ok(Some(config))
}
