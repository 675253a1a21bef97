//! `[telemetry]`: the OpenTelemetry exporter.

use super::parse::{SettingsError, err};
use serde::Deserialize;

/// `[telemetry]`: OpenTelemetry traces over OTLP, off by default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TelemetrySettings {
    /// The collector's OTLP/gRPC endpoint (`http://…:4317`, plaintext: an
    /// agent or sidecar); `None`: off.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` resource attribute.
    pub service_name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    pub(super) otlp_endpoint: String,
    pub(super) service_name: String,
}

impl RawTelemetry {
    pub(super) fn validate(self) -> Result<TelemetrySettings, SettingsError> {
        let endpoint = self.otlp_endpoint.trim();
        if !endpoint.is_empty() && !endpoint.starts_with("http://") {
            return Err(err(
                "telemetry.otlp_endpoint",
                "an http:// URL of an OTLP/gRPC collector (a local agent or sidecar; TLS to the collector is not built in)",
            ));
        }
        if self.service_name.trim().is_empty() {
            return Err(err("telemetry.service_name", "must not be empty"));
        }
        Ok(TelemetrySettings {
            otlp_endpoint: (!endpoint.is_empty()).then(|| endpoint.to_owned()),
            service_name: self.service_name.trim().to_owned(),
        })
    }
}
