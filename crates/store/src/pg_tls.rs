//! TLS to PostgreSQL (`store.postgres_sslmode`, `store.postgres_sslrootcert`),
//! with libpq's meanings, through rustls (`tokio-postgres-rustls`):
//!
//! - `disable`: plaintext;
//! - `require`: encrypted, the server's certificate not checked (protects
//!   against eavesdroppers, not against an impostor);
//! - `verify-ca`: encrypted, the certificate must chain to the root
//!   certificate file, whatever name it carries;
//! - `verify-full`: as verify-ca, and it must name the host of
//!   `store.postgres_url`.
//!
//! The mode is this setting's alone: an `sslmode` written into the URL is
//! checked against it ([`PgTls::url_for`]) and never silently overridden,
//! so a URL that asks for TLS cannot end up in plaintext because the
//! setting kept its default.

use super::error::StoreError;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use std::path::PathBuf;
use std::sync::Arc;

/// `store.postgres_sslmode`, from the weakest to the strictest (the order
/// [`PgTls::url_for`] compares by).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    /// Plaintext.
    Disable,
    /// Encrypted, not verified.
    Require,
    /// Encrypted, the chain verified.
    VerifyCa,
    /// Encrypted, the chain and the host name verified.
    VerifyFull,
}

impl SslMode {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// How pacpriv talks to PostgreSQL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgTls {
    /// The mode.
    pub mode: SslMode,
    /// The CA file (required by the verify modes).
    pub root_cert: Option<PathBuf>,
}

impl PgTls {
    /// Plaintext.
    pub const DISABLE: PgTls = PgTls { mode: SslMode::Disable, root_cert: None };

    /// `url` without the `sslmode` it may name (tokio-postgres knows only
    /// some of libpq's modes, and the mode here is this setting's), once
    /// that `sslmode` is found to ask for no more than `self.mode`.
    ///
    /// # Errors
    /// What to change, naming both keys, when the URL asks for a stricter
    /// mode than the setting, or for one that may fall back to plaintext
    /// (`allow`, `prefer`), which pacpriv never does.
    pub fn url_for(&self, url: &str) -> Result<String, String> {
        let (rest, asked) = split_sslmode(url);
        // What tokio-postgres itself reads from the rest: an sslmode this
        // scan did not see (percent-encoded, spaced) must not pass either.
        let parsed: Option<tokio_postgres::Config> = rest.parse().ok();
        if parsed.is_some_and(|c| c.get_ssl_mode() != tokio_postgres::config::SslMode::Prefer) {
            return Err("store.postgres_url names an sslmode in a form pacpriv does not read; remove it and set \
                        store.postgres_sslmode"
                .into());
        }
        let Some(asked) = asked else { return Ok(rest) };
        let wanted = match asked.as_str() {
            "disable" => SslMode::Disable,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(format!(
                    "store.postgres_url names sslmode={other}, which may fall back to plaintext; pacpriv never does: \
                     remove it from the URL and set store.postgres_sslmode (require, verify-ca or verify-full)"
                ));
            }
        };
        if wanted > self.mode {
            return Err(format!(
                "store.postgres_url names sslmode={asked} but store.postgres_sslmode = {}: the connection would be \
                 weaker than the URL asks; set store.postgres_sslmode = {asked} (and remove it from the URL)",
                self.mode.as_str()
            ));
        }
        Ok(rest)
    }

    /// The rustls client configuration, or `None` for `disable`.
    ///
    /// # Errors
    /// [`StoreError::Backend`] naming `store.postgres_sslrootcert` when it is
    /// missing or unreadable.
    pub fn client_config(&self) -> Result<Option<ClientConfig>, StoreError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        let config = match self.mode {
            SslMode::Disable => return Ok(None),
            SslMode::Require => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
                .with_no_client_auth(),
            SslMode::VerifyCa => {
                let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(self.roots()?), provider)
                    .build()
                    .map_err(|e| StoreError::Backend(format!("store.postgres_sslrootcert: {e}")))?;
                builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyName(inner))).with_no_client_auth()
            }
            SslMode::VerifyFull => builder.with_root_certificates(self.roots()?).with_no_client_auth(),
        };
        Ok(Some(config))
    }

    fn roots(&self) -> Result<RootCertStore, StoreError> {
        let mode = self.mode.as_str();
        let path = self.root_cert.as_ref().ok_or_else(|| {
            StoreError::Backend(format!(
                "store.postgres_sslmode = {mode} needs store.postgres_sslrootcert (the CA file the server's certificate \
                 chains to)"
            ))
        })?;
        let bad = |e: &dyn std::fmt::Display| {
            StoreError::Backend(format!("store.postgres_sslrootcert {}: {e}", path.display()))
        };
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(path).map_err(|e| bad(&e))? {
            roots.add(cert.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
        }
        if roots.is_empty() {
            return Err(bad(&"no certificate in it"));
        }
        Ok(roots)
    }
}

/// `url` without its `sslmode` parameter, and that parameter's value: in
/// the URL form (`postgres://…?a=1&sslmode=require`) or libpq's key/value
/// form (`host=db sslmode=require`).
fn split_sslmode(url: &str) -> (String, Option<String>) {
    let mut mode = None;
    let mut keep = |part: &str| match part.strip_prefix("sslmode=") {
        Some(value) => {
            mode = Some(value.to_owned());
            false
        }
        None => true,
    };
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            Some((base, query)) => {
                let query: Vec<&str> = query.split('&').filter(|p| keep(p)).collect();
                if query.is_empty() { base.to_owned() } else { format!("{base}?{}", query.join("&")) }
            }
            None => url.to_owned(),
        }
    } else {
        url.split_whitespace().filter(|p| keep(p)).collect::<Vec<_>>().join(" ")
    };
    (rest, mode)
}

/// `verify-ca`: the chain is verified, the name is not.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `require`: any certificate (the handshake's signatures are still
/// checked, so the session is encrypted to whoever holds that key).
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
