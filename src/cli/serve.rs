//! `pacpriv serve`: load and validate the configuration, start the service
//! (and, by default, the demo teachers in-process), serve until Ctrl-C or
//! SIGTERM.

use anyhow::Context;
use pacpriv_service::settings::Settings;
use pacpriv_service::start;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `pacpriv serve`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A TOML file layered over the built-in `config/default.toml`;
    /// `PACPRIV__SECTION__KEY` environment variables override both.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Only load and validate the configuration (file and environment),
    /// print `config ok` and exit.
    #[arg(long)]
    pub check: bool,
}

/// Runs the service; once it accepts connections prints `pacpriv listening
/// on ADDR` to `out`, then `pacpriv http|admin|health|metrics listening on ADDR`
/// for each enabled extra listener.
///
/// # Errors
/// Invalid configuration (naming the key) or a failed start.
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let settings = Settings::load(args.config.as_deref())?;
    if args.check {
        writeln!(out, "config ok")?;
        return Ok(());
    }
    serve_settings(settings, args.config, out)
}

/// Serves `settings` as [`run`] does once they are loaded (`config`: the
/// file to reload them from on SIGHUP).
///
/// # Errors
/// A failed start.
pub fn serve_settings(settings: Settings, config: Option<PathBuf>, out: &mut dyn Write) -> anyhow::Result<()> {
    // Declared first, so dropped last: after the runtime, whose drop stops
    // the tasks that still hold the store, and with it the store's
    // threads, which log as they stop.
    let lines = pacpriv_service::trace::Lines::to_stderr();
    lines.flush_before_panics();
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        let t = &settings.telemetry;
        // Flushes the last spans when dropped, at the end of this block.
        let _exporting =
            pacpriv_service::trace::install(settings.log_json, &lines, t.otlp_endpoint.as_deref(), &t.service_name)?;
        let started = match start::serve(settings, shutdown_signal()).await {
            // SIGTERM while waiting for the database: an orderly stop.
            Err(start::StartError::Stopped) => {
                tracing::info!("stopped before serving");
                return Ok(());
            }
            started => started?,
        };
        writeln!(out, "pacpriv listening on {}", started.addr)?;
        let extra = [
            ("http", started.http),
            ("admin", started.admin),
            ("health", started.health),
            ("metrics", started.metrics),
        ];
        for (what, addr) in extra {
            if let Some(addr) = addr {
                writeln!(out, "pacpriv {what} listening on {addr}")?;
            }
        }
        out.flush()?;
        tokio::spawn(reload_on_sighup(started.reloader, config));
        tokio::spawn(survive_file_size_limit());
        started.server.await.context("serving")?;
        tracing::info!("shut down");
        Ok(())
    })
}

/// Reloads the configuration (`config` over the built-in one, and the
/// environment) on every SIGHUP.
async fn reload_on_sighup(reloader: start::reload::Reloader, config: Option<std::path::PathBuf>) {
    #[cfg(unix)]
    {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else { return };
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading the configuration");
            reloader.apply(Settings::load(config.as_deref())).await;
        }
    }
    #[cfg(not(unix))]
    let _ = (reloader, config);
}

/// Keeps SIGXFSZ from ending the process: a write past the file-size
/// limit (`ulimit -f`) then fails as a full disk does — the embedded
/// store's commit fails, answers are withheld and no new step is taken
/// until a commit succeeds — instead of killing the server mid-commit.
async fn survive_file_size_limit() {
    #[cfg(unix)]
    {
        let kind = tokio::signal::unix::SignalKind::from_raw(rustix::process::Signal::XFSZ.as_raw());
        let Ok(mut xfsz) = tokio::signal::unix::signal(kind) else { return };
        while xfsz.recv().await.is_some() {
            tracing::error!("SIGXFSZ: a write went past the process's file-size limit (ulimit -f); it failed");
        }
    }
}

/// Resolves on Ctrl-C or SIGTERM (what Kubernetes sends).
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { () = ctrl_c => {}, () = term => {} }
}
