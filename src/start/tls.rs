//! TLS for the client and admin listeners: the server's certificate and
//! key, and with `tls.client_ca_file` a CA every client certificate must
//! chain to (mTLS; clients without one are refused in the handshake).
//! rustls (ring) underneath, through tonic. Also where per-connection
//! limits are set, so both listeners get them.

use super::StartError;
use crate::settings::TlsSettings;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

fn read(path: &std::path::Path) -> Result<Vec<u8>, StartError> {
    std::fs::read(path).map_err(|e| StartError::Tls(format!("reading {}: {e}", path.display())))
}

/// A server builder, speaking TLS when `tls` is configured, allowing each
/// connection `max_streams` calls in flight.
///
/// # Errors
/// [`StartError::Tls`]: a file is unreadable or not usable PEM.
pub fn builder(tls: Option<&TlsSettings>, max_streams: u32) -> Result<Server, StartError> {
    let server = Server::builder().max_concurrent_streams(max_streams);
    let Some(t) = tls else { return Ok(server) };
    let mut config = ServerTlsConfig::new().identity(Identity::from_pem(read(&t.cert_file)?, read(&t.key_file)?));
    if let Some(ca) = &t.client_ca_file {
        config = config.client_ca_root(Certificate::from_pem(read(ca)?));
    }
    server.tls_config(config).map_err(|e| {
        StartError::Tls(format!("tls.cert_file {} / tls.key_file {}: {e}", t.cert_file.display(), t.key_file.display()))
    })
}
