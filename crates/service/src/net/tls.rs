//! The server side of TLS for every listener: a certificate and key, and
//! optionally a CA every client certificate must chain to (mTLS; clients
//! without one are refused in the handshake). rustls (ring) underneath;
//! one [`ServerTls`] serves every listener ([`super::tls_incoming`]), and
//! [`ServerTls::install`] swaps reloaded files in for connections accepted
//! after it (established ones keep the session they negotiated).

use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// The PEM files of a TLS listener.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// Certificate chain (`tls.cert_file`).
    pub cert: PathBuf,
    /// Private key (`tls.key_file`).
    pub key: PathBuf,
    /// CA of the client certificates to require (`tls.client_ca_file`).
    pub client_ca: Option<PathBuf>,
}

/// A TLS file that is unreadable or unusable; the message names the
/// setting and the file.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

/// Which application protocol a listener speaks (TLS ALPN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alpn {
    /// gRPC: HTTP/2.
    H2,
    /// The REST listener: HTTP/1.1.
    Http1,
}

/// The server side of TLS, shared by every listener; reloadable.
pub struct ServerTls {
    /// One configuration per protocol, replaced whole on reload.
    configs: RwLock<[Arc<ServerConfig>; 2]>,
}

impl ServerTls {
    /// Reads `files`.
    ///
    /// # Errors
    /// [`TlsError`] naming the file that is unreadable or unusable.
    pub fn load(files: &TlsFiles) -> Result<ServerTls, TlsError> {
        Ok(ServerTls { configs: RwLock::new(configs(files)?) })
    }

    /// Puts `fresh` (loaded from the reloaded files) in force: connections
    /// accepted from now on use it, established ones keep theirs.
    pub fn install(&self, fresh: ServerTls) {
        let fresh = fresh.configs.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        *self.configs.write().unwrap_or_else(std::sync::PoisonError::into_inner) = fresh;
    }

    /// The acceptor for one new connection speaking `alpn`.
    pub fn acceptor(&self, alpn: Alpn) -> tokio_rustls::TlsAcceptor {
        let configs = self.configs.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let config = match alpn {
            Alpn::H2 => &configs[0],
            Alpn::Http1 => &configs[1],
        };
        tokio_rustls::TlsAcceptor::from(Arc::clone(config))
    }
}

/// The configurations for HTTP/2 and HTTP/1.1 from `files`.
fn configs(files: &TlsFiles) -> Result<[Arc<ServerConfig>; 2], TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let pem_error =
        |key: &str, path: &Path, e: &dyn std::fmt::Display| TlsError(format!("{key} {}: {e}", path.display()));
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(Iterator::collect)
        .map_err(|e| pem_error("tls.cert_file", &files.cert, &e))?;
    if certs.is_empty() {
        return Err(pem_error("tls.cert_file", &files.cert, &"no PEM certificate in it"));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| pem_error("tls.key_file", &files.key, &e))?;
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(e.to_string()))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca).map_err(|e| pem_error("tls.client_ca_file", ca, &e))? {
                let cert = cert.map_err(|e| pem_error("tls.client_ca_file", ca, &e))?;
                roots.add(cert).map_err(|e| pem_error("tls.client_ca_file", ca, &e))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| pem_error("tls.client_ca_file", ca, &e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder.with_single_cert(certs, key).map_err(|e| {
        TlsError(format!("tls.cert_file {} / tls.key_file {}: {e}", files.cert.display(), files.key.display()))
    })?;
    let with_alpn = |protocol: &[u8]| {
        let mut c = config.clone();
        c.alpn_protocols = vec![protocol.to_vec()];
        Arc::new(c)
    };
    Ok([with_alpn(b"h2"), with_alpn(b"http/1.1")])
}
