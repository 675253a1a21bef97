//! `pacpriv health`: one `grpc.health.v1.Health/Check` over plaintext gRPC,
//! exit status 0 only for SERVING — the container health check (Docker's
//! `HEALTHCHECK` has no gRPC probe of its own).

use anyhow::{Context, bail};
use std::io::Write;
use std::time::Duration;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// Arguments of `pacpriv health`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The server's plaintext health address (`server.health_listen`, or
    /// `server.listen` when TLS is off).
    #[arg(long, default_value = "127.0.0.1:50051", value_name = "HOST:PORT")]
    pub addr: String,
    /// The service to ask about; empty: the whole server.
    #[arg(long, default_value = "")]
    pub service: String,
    /// Give up after this many milliseconds.
    #[arg(long, default_value_t = 2000, value_name = "MS")]
    pub timeout_ms: u64,
}

/// Prints the status; fails unless it is SERVING.
///
/// # Errors
/// Unreachable server, timeout, or a status other than SERVING.
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let uri = if args.addr.contains("://") { args.addr.clone() } else { format!("http://{}", args.addr) };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let status = runtime.block_on(async {
        let check = async {
            let channel = tonic::transport::Endpoint::from_shared(uri.clone())?.connect().await?;
            let response =
                HealthClient::new(channel).check(HealthCheckRequest { service: args.service.clone() }).await?;
            anyhow::Ok(response.into_inner().status())
        };
        tokio::time::timeout(Duration::from_millis(args.timeout_ms), check)
            .await
            .with_context(|| format!("no answer from {uri} within {} ms", args.timeout_ms))?
            .with_context(|| format!("health check of {uri}"))
    })?;
    let name = status.as_str_name();
    writeln!(out, "{name}")?;
    if status != ServingStatus::Serving {
        bail!("{uri} reports {name}");
    }
    Ok(())
}
