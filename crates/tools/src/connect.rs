//! The client end of a gRPC connection, shared by the subcommands that talk
//! to a running server (`admin`, `label`): plaintext, TLS trusting a given
//! CA, or mTLS with a client certificate. This build trusts no system
//! roots, so TLS always needs `--ca`.

use anyhow::{Context, bail};
use std::path::PathBuf;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// TLS flags, flattened into a subcommand's arguments.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct TlsArgs {
    /// Speak TLS, trusting this CA (PEM) for the server's certificate.
    #[arg(long, value_name = "PEM")]
    pub ca: Option<PathBuf>,
    /// Client certificate and key (PEM) when the server requires mTLS.
    #[arg(long, value_name = "PEM", requires = "key", requires = "ca")]
    pub cert: Option<PathBuf>,
    /// Private key of `--cert`.
    #[arg(long, value_name = "PEM", requires = "cert")]
    pub key: Option<PathBuf>,
    /// Server name to verify in its certificate (default: the host of the
    /// address).
    #[arg(long)]
    pub domain: Option<String>,
}

/// The URI to dial for `addr` — `HOST:PORT` or a full `http://` /
/// `https://` URI — given whether TLS is configured.
///
/// # Errors
/// A scheme that contradicts the TLS flags: `https://` without `--ca`, or
/// `http://` with it.
pub fn uri(addr: &str, tls: bool) -> anyhow::Result<String> {
    match addr.split_once("://") {
        None => Ok(format!("{}://{addr}", if tls { "https" } else { "http" })),
        Some(("https", _)) if !tls => bail!("{addr}: https needs --ca (the CA that signed the server's certificate)"),
        Some(("http", _)) if tls => bail!("{addr}: --ca asks for TLS but the address says http://; use https://"),
        Some(("http" | "https", _)) => Ok(addr.to_owned()),
        Some((scheme, _)) => bail!("{addr}: unsupported scheme {scheme:?} (use http:// or https://)"),
    }
}

/// Connects to `addr` (see [`uri`]), naming `what` in the error.
///
/// # Errors
/// A bad address, unreadable PEM files, or an unreachable server.
pub async fn channel(addr: &str, tls: &TlsArgs, what: &str) -> anyhow::Result<Channel> {
    let uri = uri(addr, tls.ca.is_some())?;
    let mut endpoint = Endpoint::from_shared(uri.clone()).with_context(|| format!("{addr} is not a valid address"))?;
    if let Some(ca) = &tls.ca {
        let read = |p: &PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
        if let Some(domain) = &tls.domain {
            config = config.domain_name(domain.clone());
        }
        if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        endpoint = endpoint.tls_config(config).context("TLS configuration")?;
    }
    endpoint.connect().await.with_context(|| format!("connecting to {what} at {uri}"))
}

/// The `google.rpc.ErrorInfo` reason of a status, if it carries one: what
/// the server says happened (`BUDGET_EXHAUSTED`, `CACHE_MOVED`, …).
pub(crate) fn reason(status: &tonic::Status) -> Option<String> {
    use tonic_types::StatusExt;
    status.get_error_details().error_info().map(|i| i.reason.clone())
}

#[cfg(test)]
mod test {
    use super::uri;

    #[test]
    fn scheme_follows_the_tls_flags() -> anyhow::Result<()> {
        assert_eq!(uri("127.0.0.1:50051", false)?, "http://127.0.0.1:50051");
        assert_eq!(uri("127.0.0.1:50051", true)?, "https://127.0.0.1:50051");
        assert_eq!(uri("http://h:1", false)?, "http://h:1");
        assert_eq!(uri("https://h:1", true)?, "https://h:1");
        assert!(uri("https://h:1", false).is_err_and(|e| e.to_string().contains("--ca")));
        assert!(uri("http://h:1", true).is_err_and(|e| e.to_string().contains("https://")));
        assert!(uri("ftp://h:1", false).is_err());
        Ok(())
    }
}
