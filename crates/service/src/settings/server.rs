//! `[server]` and `[tls]`: the listeners, request limits, rates and
//! logging, and the TLS every listener serves.

use super::parse::{SettingsError, addr, choice, err, optional_addr, optional_file};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Largest number of input features accepted (input_shape product).
pub const MAX_FEATURES: usize = 1 << 20;

/// Largest `teachers.max_batch`: a batch of this many 64-feature examples
/// is 256 KiB of FP32 per teacher request, well inside gRPC's default
/// 4 MiB message limit of most inference servers.
pub const MAX_BATCH: usize = 1024;

/// An upper bound on the encoded size of a response to `rows` rows of
/// `d`-class releases, with the noisy vectors when `noisy`, in either
/// protocol (`PredictResponse`, `ModelInferResponse` in contents or raw
/// form): per row, its fixed fields (≤ 64 bytes) and d doubles with their
/// framing; once more for a response's top-level copy of its first row;
/// and 2 KiB for the rest (ids ≤ 128 bytes, the model name, the budget,
/// the OIP parameters). `server::inference::test` checks it against
/// encoded worst cases.
pub fn largest_response(rows: usize, d: usize, noisy: bool) -> usize {
    let row = 64 + if noisy { 8 * d + 16 } else { 0 };
    2048 + (rows + 1) * row
}

/// A token bucket per principal: `per_second` queries a second on
/// average, up to `burst` at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateQuota {
    /// Sustained rate.
    pub per_second: std::num::NonZeroU32,
    /// Bucket size.
    pub burst: std::num::NonZeroU32,
}

/// TLS files (PEM) for the client and admin listeners.
#[derive(Clone, Debug, PartialEq)]
pub struct TlsSettings {
    /// Certificate chain.
    pub cert_file: PathBuf,
    /// Private key.
    pub key_file: PathBuf,
    /// CA whose certificates clients must present (mTLS); `None`: no
    /// client certificates asked for.
    pub client_ca_file: Option<PathBuf>,
    /// A verified client certificate's subject CN names the principal when
    /// the request carries no API key.
    pub principal_from_cert: bool,
}

impl TlsSettings {
    /// The listener's PEM files.
    pub fn files(&self) -> crate::net::tls::TlsFiles {
        crate::net::tls::TlsFiles {
            cert: self.cert_file.clone(),
            key: self.key_file.clone(),
            client_ca: self.client_ca_file.clone(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    pub(super) listen: String,
    pub(super) health_listen: String,
    pub(super) max_message_bytes: usize,
    pub(super) max_batch_rows: usize,
    pub(super) max_concurrent_streams: u32,
    pub(super) max_connections: usize,
    pub(super) max_connections_per_peer: usize,
    pub(super) header_read_timeout_ms: u64,
    pub(super) idle_timeout_ms: u64,
    pub(super) max_connection_age_ms: u64,
    pub(super) request_timeout_ms: u64,
    pub(super) keepalive_interval_ms: u64,
    pub(super) keepalive_timeout_ms: u64,
    pub(super) rate_limit_per_second: u32,
    pub(super) rate_limit_burst: u32,
    pub(super) max_calls_in_flight_per_principal: usize,
    #[serde(deserialize_with = "choice")]
    pub(super) log_format: LogFormat,
    pub(super) inference_model: String,
    pub(super) http_listen: String,
    pub(super) drain_grace_ms: u64,
    pub(super) drain_deadline_ms: u64,
}

/// `server.log_format`.
#[derive(Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum LogFormat {
    Text,
    Json,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    pub(super) cert_file: String,
    pub(super) key_file: String,
    pub(super) client_ca_file: String,
    pub(super) principal_from_cert: bool,
}

impl RawTls {
    pub(super) fn validate(self) -> Result<Option<TlsSettings>, SettingsError> {
        let cert = optional_file("tls.cert_file", &self.cert_file)?;
        let key = optional_file("tls.key_file", &self.key_file)?;
        let client_ca = optional_file("tls.client_ca_file", &self.client_ca_file)?;
        match (cert, key) {
            (Some(cert_file), Some(key_file)) => {
                if self.principal_from_cert && client_ca.is_none() {
                    return Err(err(
                        "tls.principal_from_cert",
                        "needs tls.client_ca_file: only a certificate the server verified can name a principal",
                    ));
                }
                Ok(Some(TlsSettings {
                    cert_file,
                    key_file,
                    client_ca_file: client_ca,
                    principal_from_cert: self.principal_from_cert,
                }))
            }
            (None, None) if client_ca.is_none() && !self.principal_from_cert => Ok(None),
            (None, None) => {
                Err(err("tls.cert_file", "client certificates need server TLS: set cert_file and key_file"))
            }
            (Some(_), None) => Err(err("tls.key_file", "tls.cert_file is set: set the matching private key too")),
            (None, Some(_)) => Err(err("tls.cert_file", "tls.key_file is set: set the matching certificate too")),
        }
    }
}

impl RawServer {
    pub(super) fn validate(self) -> Result<Server, SettingsError> {
        let inference_model = self.inference_model.trim().to_owned();
        if inference_model.len() > 128 || inference_model.contains(['/', ' ']) {
            return Err(err("server.inference_model", "at most 128 bytes, no '/' or spaces (it is a model name)"));
        }
        if self.max_message_bytes < 1024 {
            return Err(err("server.max_message_bytes", "must be at least 1024"));
        }
        if !(1..=4096).contains(&self.max_batch_rows) {
            return Err(err("server.max_batch_rows", "must be between 1 and 4096"));
        }
        if self.max_concurrent_streams == 0 {
            return Err(err("server.max_concurrent_streams", "must be at least 1"));
        }
        if self.max_connections == 0 {
            return Err(err("server.max_connections", "must be at least 1"));
        }
        if self.max_connections_per_peer == 0 {
            return Err(err("server.max_connections_per_peer", "must be at least 1"));
        }
        let ms = std::time::Duration::from_millis;
        let within = |key: &str, value: u64, min: u64, max: u64| {
            if (min..=max).contains(&value) {
                Ok(ms(value))
            } else {
                Err(err(key, format!("must be between {min} and {max} (milliseconds)")))
            }
        };
        let limits = crate::net::Limits {
            max_concurrent_streams: self.max_concurrent_streams,
            max_connections: self.max_connections,
            max_connections_per_peer: self.max_connections_per_peer,
            header_read: within("server.header_read_timeout_ms", self.header_read_timeout_ms, 100, 600_000)?,
            idle: within("server.idle_timeout_ms", self.idle_timeout_ms, 1000, 86_400_000)?,
            max_connection_age: within("server.max_connection_age_ms", self.max_connection_age_ms, 1000, 604_800_000)?,
            request: within("server.request_timeout_ms", self.request_timeout_ms, 1000, 3_600_000)?,
            keepalive_interval: within("server.keepalive_interval_ms", self.keepalive_interval_ms, 1000, 3_600_000)?,
            keepalive_timeout: within("server.keepalive_timeout_ms", self.keepalive_timeout_ms, 100, 600_000)?,
        };
        if self.drain_grace_ms > 600_000 {
            return Err(err("server.drain_grace_ms", "at most 600000 (ten minutes)"));
        }
        if !(1..=3_600_000).contains(&self.drain_deadline_ms) {
            return Err(err("server.drain_deadline_ms", "between 1 and 3600000 (an hour)"));
        }
        let rate_limit = match (std::num::NonZeroU32::new(self.rate_limit_per_second), self.rate_limit_burst) {
            (None, 0) => None,
            (None, _) => {
                return Err(err(
                    "server.rate_limit_burst",
                    "is set but server.rate_limit_per_second is 0 (off); set a rate too",
                ));
            }
            (Some(per_second), burst) => {
                Some(RateQuota { per_second, burst: std::num::NonZeroU32::new(burst).unwrap_or(per_second) })
            }
        };
        if self.max_calls_in_flight_per_principal == 0 {
            return Err(err("server.max_calls_in_flight_per_principal", "must be at least 1"));
        }
        Ok(Server {
            listen: addr("server.listen", &self.listen)?,
            health_listen: optional_addr("server.health_listen", &self.health_listen)?,
            max_message_bytes: self.max_message_bytes,
            max_batch_rows: self.max_batch_rows,
            limits,
            rate_limit,
            max_calls_in_flight: self.max_calls_in_flight_per_principal,
            http_listen: optional_addr("server.http_listen", &self.http_listen)?,
            drain_grace: std::time::Duration::from_millis(self.drain_grace_ms),
            drain_deadline: std::time::Duration::from_millis(self.drain_deadline_ms),
            inference_model: (!inference_model.is_empty()).then_some(inference_model),
            log_json: self.log_format == LogFormat::Json,
        })
    }
}

/// The `[server]` section, validated.
pub(super) struct Server {
    pub(super) listen: SocketAddr,
    pub(super) health_listen: Option<SocketAddr>,
    pub(super) max_message_bytes: usize,
    pub(super) max_batch_rows: usize,
    pub(super) limits: crate::net::Limits,
    pub(super) rate_limit: Option<RateQuota>,
    pub(super) max_calls_in_flight: usize,
    pub(super) inference_model: Option<String>,
    pub(super) http_listen: Option<SocketAddr>,
    pub(super) drain_grace: std::time::Duration,
    pub(super) drain_deadline: std::time::Duration,
    pub(super) log_json: bool,
}
