//! TLS fixtures: a certificate authority made in the test, and a cluster
//! whose TCP connections must use TLS with a certificate that CA signed.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};

use ticklease_sandbox::{on_lasting_thread, ClusterOptions, PgCluster, SandboxError, ServerCert};

/// A throwaway certificate authority.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestCa {
    /// A fresh CA; two are never the same, so one is the wrong CA for the other's servers.
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::new()).expect("no names");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("generate a CA key");
        TestCa {
            issuer: CertifiedIssuer::self_signed(params, key).expect("self-sign the CA"),
        }
    }

    /// The CA certificate, PEM: what a client's `sslrootcert` names.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for `names` (host names or IP addresses).
    pub fn server_cert(&self, names: &[&str]) -> ServerCert {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("valid names");
        params
            .distinguished_name
            .push(DnType::CommonName, "ticklease test server");
        let key = KeyPair::generate().expect("generate a server key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("sign the server certificate");
        ServerCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

/// A cluster with `ssl=on` and `hostssl`-only TCP access, its certificate
/// (for `localhost` and 127.0.0.1) signed by a CA of its own.
pub struct TlsCluster {
    cluster: PgCluster,
    root_cert: PathBuf,
}

impl TlsCluster {
    /// One TLS cluster shared by the tests of this process, started on first use.
    pub fn shared() -> &'static TlsCluster {
        static SHARED: OnceLock<TlsCluster> = OnceLock::new();
        SHARED.get_or_init(|| match on_lasting_thread(TlsCluster::start_inner) {
            Ok(c) => c,
            Err(e) => panic!("test kit could not start a TLS Postgres: {e}"),
        })
    }

    fn start_inner() -> Result<TlsCluster, SandboxError> {
        let ca = TestCa::new("ticklease test CA");
        let cert = ca.server_cert(&["localhost", "127.0.0.1"]);
        let mut options = ClusterOptions::default();
        options.die_with_parent = true;
        options.tls = Some(cert);
        let cluster = PgCluster::start_with(&options)?;
        let root_cert = cluster.root_dir().join("root.crt");
        std::fs::write(&root_cert, ca.pem()).map_err(|source| SandboxError::Io {
            what: "write the CA certificate".into(),
            source,
        })?;
        Ok(TlsCluster { cluster, root_cert })
    }

    pub fn cluster(&self) -> &PgCluster {
        &self.cluster
    }

    /// The PEM file of the CA that signed the server's certificate.
    pub fn root_cert(&self) -> &Path {
        &self.root_cert
    }
}
