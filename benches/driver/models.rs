//! `pacpriv-bench models`: what one more model of a dataset costs the
//! server (issue 54 §8). For each count k, `pacpriv serve` (the binary
//! beside this one) runs the default model and k more models of the same
//! dataset, each with its own remote stacked teachers (m of them) — a
//! `pacpriv teachers` process of its own (another L2 penalty, so other
//! teachers), outside the measured process, as in production. Every model answers one query (its connection and
//! first call made), then the server's resident set is read from
//! /proc/PID/status. The per-model cost is the slope over k.

use super::report::machine;
use super::scratch::scratch;
use super::sessions::Rss;
use anyhow::{Context, bail, ensure};
use pacpriv_service::proto::pacpriv::privatizer_client::PrivatizerClient;
use pacpriv_service::proto::pacpriv::{PredictRequest, Tensor};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Arguments of `pacpriv-bench models`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The numbers of models besides the default one, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [0, 1, 2, 4, 8])]
    pub more: Vec<usize>,
    /// Teachers per model (m).
    #[arg(long, default_value_t = 128)]
    pub teachers: usize,
}

/// A child process, killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `pacpriv ARGS` and waits for its `READY ADDR` line (stdout).
fn start(args: &[&str], env: &[(&str, &str)], ready: &str) -> anyhow::Result<(Running, String)> {
    let mut cmd = Command::new(pacpriv()?);
    cmd.args(args).env("OPENBLAS_NUM_THREADS", "1").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null());
    cmd.envs(env.iter().copied());
    let mut child = cmd.spawn().with_context(|| format!("starting pacpriv {}", args.join(" ")))?;
    let stdout = child.stdout.take().context("piped stdout")?;
    let running = Running(child);
    let (tx, rx) = mpsc::channel();
    let prefix = format!("{ready} ");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(addr) = line.strip_prefix(&prefix) {
                let _ = tx.send(addr.trim().to_owned());
            }
        }
    });
    let addr = rx
        .recv_timeout(Duration::from_secs(300))
        .with_context(|| format!("pacpriv {} never printed {ready:?}", args.join(" ")))?;
    Ok((running, addr))
}

/// The `pacpriv` binary beside this one.
fn pacpriv() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating pacpriv-bench")?;
    let path = exe.with_file_name("pacpriv");
    ensure!(path.exists(), "no pacpriv binary beside {} (cargo build --release)", exe.display());
    Ok(path)
}

/// The configuration of the default model (the first teacher server of
/// `teachers`) and one more model per further one.
fn config(dir: &Path, teachers: &[String], m: usize) -> String {
    let stacked = |addr: &str| format!("{{ endpoint = \"http://{addr}\", model = \"digits-ensemble\", models = {m} }}");
    let mut toml = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nhttp_listen = \"\"\nhealth_listen = \"\"\n\n[metrics]\nlisten = \"\"\n\n\
         [store]\npath = \"{}\"\n\n[teachers]\nsource = \"remote\"\nlayout = \"stacked\"\nstacked = {}\n",
        dir.join("state.redb").display(),
        stacked(&teachers[0]),
    );
    for (i, addr) in teachers[1..].iter().enumerate() {
        toml.push_str(&format!("\n[models.m{i}]\nteachers = {{ stacked = {} }}\n", stacked(addr)));
    }
    toml
}

/// Starts the teacher servers, then measures the server at each count.
///
/// # Errors
/// A process that does not start, a model that does not answer.
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let most = args.more.iter().copied().max().unwrap_or(0);
    ensure!(args.more.contains(&0), "--more must include 0 (the baseline)");
    ensure!(most <= 15, "--more: at most 15 more models");
    let m = args.teachers.to_string();
    let mut servers = Vec::with_capacity(most + 1);
    for i in 0..=most {
        let penalty = format!("{}", 0.1 * (i + 2) as f64);
        let argv = ["teachers", "--models", &m, "--regularisation", &penalty, "--listen", "127.0.0.1:0"];
        servers.push(start(&argv, &[], "teachers listening on")?);
    }
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    writeln!(out, "pacpriv-bench models")?;
    writeln!(out, "machine: {}", machine())?;
    writeln!(out, "m = {}; every model: remote stacked teachers in a process of their own", args.teachers)?;
    writeln!(out)?;
    writeln!(out, "| more models | resident KiB | KiB per model over the baseline |")?;
    writeln!(out, "|---:|---:|---:|")?;
    let mut baseline = None;
    for &k in &args.more {
        let (dir, _) = scratch(None)?;
        let file = dir.path().join("models.toml");
        let addrs: Vec<String> = servers[..=k].iter().map(|(_, a)| a.clone()).collect();
        std::fs::write(&file, config(dir.path(), &addrs, args.teachers)).context("writing the configuration")?;
        let (server, addr) = start(&["serve", "--config", &file.display().to_string()], &[], "pacpriv listening on")?;
        let names: Vec<String> = std::iter::once(String::new()).chain((0..k).map(|i| format!("m{i}"))).collect();
        runtime.block_on(ask_each(&addr, &names))?;
        std::thread::sleep(Duration::from_millis(500));
        let rss = Rss::of(&server.0.id().to_string())?.total;
        let base = *baseline.get_or_insert(rss);
        let per = if k == 0 { "—".to_owned() } else { format!("{:.0}", (rss as f64 - base as f64) / k as f64) };
        writeln!(out, "| {k} | {rss} | {per} |")?;
        drop(server);
    }
    Ok(())
}

/// One query to each model in `names` ("" is the default one), with the
/// demo principal's key.
async fn ask_each(addr: &str, names: &[String]) -> anyhow::Result<()> {
    let mut client = PrivatizerClient::connect(format!("http://{addr}")).await.context("connecting")?;
    for (i, name) in names.iter().enumerate() {
        let pixels = (0..64).map(|p| ((p * 7 + i * 3) % 17) as f32).collect();
        let mut request = tonic::Request::new(PredictRequest {
            model: name.clone(),
            query_id: format!("models-{i}"),
            input: Some(Tensor {
                datatype: "FP32".into(),
                shape: vec![64],
                fp32_contents: pixels,
                ..Default::default()
            }),
            ..Default::default()
        });
        request.metadata_mut().insert("x-api-key", "demo-key".parse()?);
        if let Err(status) = client.predict(request).await {
            bail!("model {name:?} did not answer: {status}");
        }
    }
    Ok(())
}
