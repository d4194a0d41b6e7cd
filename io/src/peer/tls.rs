//! TLS on the cluster port (CLUSTER.md §12, `NARAD_CLUSTER_TLS_{CERT,KEY,CA}_FILE`): mutual
//! authentication, every node presents its certificate and accepts only peers whose chain
//! leads to the cluster's CA. The cluster-secret proof still runs inside the TLS session.
//!
//! Owns: loading the three PEM files into one [`PeerTls`] per node (checked once, at start),
//! and wrapping a shard's connected or accepted stream. The dialler checks the listener's
//! certificate against the address it dialled (a DNS name, or an IP address in the SANs).

use std::io;
use std::path::Path;
use std::sync::Arc;

use futures_rustls::{TlsAcceptor, TlsConnector};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use super::wire::PeerStream;
use crate::rt::TcpStream;

/// The TLS side of this node's cluster connections (both directions).
pub struct PeerTls {
    connector: TlsConnector,
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTls")
    }
}

impl PeerTls {
    /// Loads this node's certificate chain and key and the cluster CA: an error names the file
    /// and what is wrong with it.
    pub fn from_files(cert: &Path, key: &Path, ca: &Path) -> Result<PeerTls, String> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .map_err(|e| format!("{}: {e}", cert.display()))?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{}: {e}", cert.display()))?;
        if chain.is_empty() {
            return Err(format!("{}: no certificate in the file", cert.display()));
        }
        let key =
            PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
        let mut roots = RootCertStore::empty();
        let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
            .map_err(|e| format!("{}: {e}", ca.display()))?
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{}: {e}", ca.display()))?;
        for c in cas {
            roots
                .add(c)
                .map_err(|e| format!("{}: not a CA certificate: {e}", ca.display()))?;
        }
        if roots.is_empty() {
            return Err(format!("{}: no certificate in the file", ca.display()));
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| format!("{}: {e}", ca.display()))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| format!("{} and {}: {e}", cert.display(), key_name(key.clone_key())))?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("{}: {e}", cert.display()))?;
        Ok(PeerTls {
            connector: TlsConnector::from(Arc::new(client)),
            acceptor: TlsAcceptor::from(Arc::new(server)),
        })
    }

    /// TLS over a stream this node dialled to `addr` (`host:port`): the listener's certificate
    /// must name `host`.
    pub(crate) async fn connect(&self, addr: &str, s: TcpStream) -> io::Result<PeerStream> {
        let host = addr
            .rsplit_once(':')
            .map_or(addr, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{host}: {e}")))?;
        let tls = self.connector.connect(name, s).await?;
        Ok(Box::new(tls))
    }

    /// TLS over a stream this node accepted: the dialler must present a certificate of the CA.
    pub(crate) async fn accept(&self, s: TcpStream) -> io::Result<PeerStream> {
        let tls = self.acceptor.accept(s).await?;
        Ok(Box::new(tls))
    }
}

/// How the key is named in an error (its file is not at hand there).
fn key_name(_k: PrivateKeyDer<'static>) -> &'static str {
    "the key"
}
