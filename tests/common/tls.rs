//! Certificates for the TLS tests, made by the `openssl` CLI in a temp directory of their own:
//! a CA, a server certificate for 127.0.0.1 and localhost signed by it (also good as a client
//! certificate, for replication and Sentinels), a client certificate
//! signed by it (mutual TLS), a server certificate for a DNS name only (a managed Redis's), and a second, unrelated CA (a wrong trust anchor). EC P-256 keys:
//! quick to make, and both Redis (OpenSSL) and tollgate (rustls) accept them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use super::temp_dir;

/// The only name in `managed.crt` (no IP): reached at 127.0.0.1, it verifies only when
/// tollgate is told to expect this name (`store_tls_server_name`).
pub const MANAGED_NAME: &str = "redis.managed.test";

pub struct TestCerts {
    dir: tempfile::TempDir,
}

impl TestCerts {
    pub fn generate() -> TestCerts {
        let certs = TestCerts {
            dir: temp_dir("certs"),
        };
        certs.ca("ca", "tollgate test CA");
        certs.ca("wrong-ca", "some other CA");
        // Also a client certificate: a replica and a Sentinel connect to the other servers
        // with it (`tls-replication yes`).
        let local = "IP:127.0.0.1,DNS:localhost";
        certs.leaf("server", "127.0.0.1", "serverAuth,clientAuth", local);
        certs.leaf("client", "tollgate", "clientAuth", local);
        // A managed Redis's certificate: it names a host, not the address the test reaches.
        certs.leaf(
            "managed",
            MANAGED_NAME,
            "serverAuth",
            &format!("DNS:{MANAGED_NAME}"),
        );
        certs
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `path(name)` as a string, for settings and command lines.
    pub fn file(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    fn ca(&self, name: &str, cn: &str) {
        openssl(
            self.dir.path(),
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN={cn}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.crt"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
    }

    fn leaf(&self, name: &str, cn: &str, usage: &str, san: &str) {
        let ext = self.dir.path().join(format!("{name}.ext"));
        std::fs::write(
            &ext,
            format!(
                "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\nsubjectAltName={san}\n"
            ),
        )
        .expect("write extensions");
        openssl(
            self.dir.path(),
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-subj",
                &format!("/CN={cn}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ],
        );
        openssl(
            self.dir.path(),
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &format!("{name}.crt"),
                "-extfile",
                &ext.display().to_string(),
            ],
        );
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run openssl ({e}): the TLS tests need the openssl CLI"));
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
