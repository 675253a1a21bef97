//! How pacpriv reaches a teacher endpoint besides its URI: TLS (a CA, a
//! client certificate and key, a server name) and request headers (e.g. a
//! bearer token) — the settings a remote inference server behind TLS and
//! authentication asks for.
//!
//! # Invariants
//! - A header's value is a secret: it comes from a file or an environment
//!   variable (read at start-up, [`crate::settings`]), never from the
//!   configuration file, and is never printed: `Debug` shows where it came
//!   from, and the value is marked sensitive on the wire (HTTP/2 HPACK
//!   never indexes it).
//! - An endpoint whose certificate does not verify against its CA is a
//!   start-up error ([`check`]), not a stream of failed queries; one that
//!   is merely down is not (readiness says so).

use super::error::FanoutError;
use std::path::PathBuf;
use std::time::Duration;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataMap};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// TLS and headers for one teacher endpoint; the default is plaintext
/// without headers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Connection {
    /// TLS settings; `None`: plaintext (`http://`).
    pub tls: Option<ClientTls>,
    /// Sent with every call to the endpoint's models.
    pub headers: Vec<Header>,
}

/// TLS towards a teacher endpoint. `Debug` shows where the CA came from
/// and whether a client identity is set, never the key.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// Where the CA came from (for messages).
    pub ca_file: PathBuf,
    /// The CA certificate(s) the server's chain must verify against (PEM).
    pub ca_pem: Vec<u8>,
    /// Client certificate and key (PEM), for servers that ask for one.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The name the server's certificate must carry, when not the
    /// endpoint's host.
    pub server_name: Option<String>,
}

/// One request header.
#[derive(Clone, PartialEq, Eq)]
pub struct Header {
    /// Lowercase name, e.g. `authorization`.
    pub name: String,
    /// The value (secret).
    pub value: String,
    /// Where the value came from, e.g. `env TEACHER_TOKEN` (for messages).
    pub source: String,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("ca_file", &self.ca_file)
            .field("identity", &self.identity.as_ref().map(|_| "<client certificate and key>"))
            .field("server_name", &self.server_name)
            .finish()
    }
}

impl std::fmt::Debug for Header {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Header {{ name: {:?}, value: <from {}> }}", self.name, self.source)
    }
}

/// Headers ready to be copied into each request.
#[derive(Clone, Debug, Default)]
pub struct Headers(Vec<(AsciiMetadataKey, AsciiMetadataValue)>);

impl Headers {
    /// `headers` as metadata, for `endpoint`'s calls.
    ///
    /// # Errors
    /// [`FanoutError::Connection`] for a name or value HTTP/2 cannot carry.
    pub fn new(endpoint: &str, headers: &[Header]) -> Result<Headers, FanoutError> {
        let bad = |h: &Header, what: &str| FanoutError::Connection {
            endpoint: endpoint.to_owned(),
            reason: format!("header {:?} (value from {}): {what}", h.name, h.source),
        };
        let mut out = Vec::with_capacity(headers.len());
        for h in headers {
            let key = AsciiMetadataKey::from_bytes(h.name.as_bytes()).map_err(|_| bad(h, "not a valid header name"))?;
            let mut value =
                AsciiMetadataValue::try_from(h.value.as_str()).map_err(|_| bad(h, "the value is not visible ASCII"))?;
            value.set_sensitive(true);
            out.push((key, value));
        }
        Ok(Headers(out))
    }

    /// Adds the headers to a request's `metadata`.
    pub fn apply(&self, metadata: &mut MetadataMap) {
        for (k, v) in &self.0 {
            metadata.insert(k.clone(), v.clone());
        }
    }
}

/// The tonic endpoint for `uri` with `connection`'s TLS, dialled within
/// `deadline`.
///
/// # Errors
/// [`FanoutError::Endpoint`] for a bad URI, [`FanoutError::Connection`] for
/// unusable TLS settings.
pub fn endpoint(uri: &str, connection: &Connection, deadline: Duration) -> Result<Endpoint, FanoutError> {
    let mut e = Endpoint::from_shared(uri.to_owned())
        .map_err(|e| FanoutError::Endpoint { endpoint: uri.to_owned(), reason: e.to_string() })?
        .connect_timeout(deadline)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true);
    if let Some(tls) = &connection.tls {
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
        if let Some((cert, key)) = &tls.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &tls.server_name {
            config = config.domain_name(name.clone());
        }
        e = e.tls_config(config).map_err(|err| FanoutError::Connection {
            endpoint: uri.to_owned(),
            reason: format!("TLS settings (ca_file {}): {err}", tls.ca_file.display()),
        })?;
    }
    Ok(e)
}

/// Dials `uri` once (within `deadline`) when it speaks TLS, so that a
/// certificate that does not verify stops the start-up with a message
/// naming the settings; a server that does not answer at all only logs a
/// warning (readiness reports it).
///
/// # Errors
/// [`FanoutError::Connection`]: the TLS handshake failed.
pub async fn check(uri: &str, connection: &Connection, deadline: Duration) -> Result<(), FanoutError> {
    let Some(tls) = &connection.tls else { return Ok(()) };
    let dialled = endpoint(uri, connection, deadline)?.connect().await;
    let Err(e) = dialled else { return Ok(()) };
    let mut chain = Vec::new();
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    let mut handshake = false;
    while let Some(s) = source {
        let text = s.to_string();
        handshake |= s.downcast_ref::<rustls::Error>().is_some()
            || s.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()).is_some_and(|i| i.is::<rustls::Error>())
            || text.contains("certificate");
        chain.push(text);
        source = s.source();
    }
    if handshake {
        return Err(FanoutError::Connection {
            endpoint: uri.to_owned(),
            reason: format!(
                "the TLS handshake failed ({}): check the endpoint's ca_file ({}), server_name{} and cert_file/key_file",
                chain.join(": "),
                tls.ca_file.display(),
                tls.server_name.as_ref().map(|n| format!(" ({n})")).unwrap_or_default()
            ),
        });
    }
    tracing::warn!(endpoint = uri, error = %chain.join(": "), "teacher endpoint not reachable yet");
    Ok(())
}
