//! TLS on the gRPC port (`grpc_tls_cert` + `grpc_tls_key`, and `grpc_tls_client_ca` for mutual
//! TLS), for Envoy fleets that reach tollgate outside a mesh. The files are read once, at
//! startup: a missing or malformed one stops startup naming the setting. rustls with the ring
//! provider, as for `rediss://`; the admin port stays plain HTTP.

use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// The gRPC port's TLS files (paths; empty: not set).
#[derive(Clone, Debug, Default)]
pub struct GrpcTlsFiles {
    pub cert: String,
    pub key: String,
    /// Mutual TLS: the CA client certificates must chain to.
    pub client_ca: String,
}

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
pub fn server_config(files: &GrpcTlsFiles) -> Result<Option<ServerTlsConfig>, TlsFileError> {
    if files.cert.is_empty() {
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
        read("grpc_tls_cert", &files.cert)?,
        read("grpc_tls_key", &files.key)?,
    );
    let mut config = ServerTlsConfig::new().identity(identity);
    if !files.client_ca.is_empty() {
        let ca = read("grpc_tls_client_ca", &files.client_ca)?;
        config = config.client_ca_root(Certificate::from_pem(ca));
    }
    Ok(Some(config))
}
