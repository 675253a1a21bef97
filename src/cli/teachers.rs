//! `pacpriv teachers`: train the demo ensemble and serve it over the Open
//! Inference Protocol on its own, e.g. to run the privatizer against
//! "remote" teachers, or to evaluate the models.

use anyhow::Context;
use pacpriv_demo::Trained;
use pacpriv_service::net::tls::{ServerTls, TlsFiles};
use pacpriv_service::teachers::demo::{self, DemoServer, Guard};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Arguments of `pacpriv teachers`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Number of teachers m (even).
    #[arg(long, value_name = "M", default_value_t = 128)]
    pub models: usize,

    /// Seed of the train/test split and of the subset assignment.
    #[arg(long, value_name = "S", default_value_t = 20261123)]
    pub seed: u64,

    /// L2 penalty of each teacher's fit (`demo.regularisation`).
    #[arg(long, value_name = "ALPHA", default_value_t = pacpriv_demo::DEFAULT_REGULARISATION)]
    pub regularisation: f64,

    /// Listen address (port 0: any free port; the bound one is printed).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8001")]
    pub listen: SocketAddr,

    /// Write a `pacpriv serve --config` file pointing at these teachers.
    #[arg(long, value_name = "PATH")]
    pub write_config: Option<PathBuf>,

    /// Print each teacher's accuracy on the held-out split and exit.
    #[arg(long)]
    pub evaluate: bool,

    /// Serve TLS with this certificate chain (PEM; with --tls-key).
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The certificate's private key (PEM).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// Require client certificates signed by this CA (PEM; mTLS).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// Require `authorization: Bearer <token>` on every call, the token
    /// read from this file.
    #[arg(long, value_name = "PATH")]
    pub bearer_file: Option<PathBuf>,

    /// Write the held-out split's images (no digits) to this CSV, one per
    /// row, and exit without training: data never trained on, for trying
    /// `pacpriv label`.
    #[arg(long, value_name = "CSV", conflicts_with_all = ["evaluate", "write_config"])]
    pub export_test: Option<PathBuf>,
}

/// Trains, then serves until interrupted (or evaluates and exits).
///
/// # Errors
/// Invalid m, a failed fit, an unbindable address, an unwritable file.
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    super::init_tracing(false);
    if let Some(path) = &args.export_test {
        let n = export_test(args.seed, path).with_context(|| format!("writing {}", path.display()))?;
        writeln!(out, "wrote {n} held-out images (seed {}) to {}", args.seed, path.display())?;
        return Ok(());
    }
    let ensemble = Trained::train_regularised(args.models, args.seed, args.regularisation)
        .map_err(anyhow::Error::msg)
        .context("training the demo teachers")?;
    if args.evaluate {
        return evaluate(&ensemble, out);
    }
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        let listener =
            tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
        let addr = listener.local_addr()?;
        if let Some(path) = &args.write_config {
            let scheme = if args.tls_cert.is_some() { "https" } else { "http" };
            std::fs::write(path, remote_config(addr, args.models, scheme))
                .with_context(|| format!("writing {}", path.display()))?;
        }
        let tls = match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => {
                let files = TlsFiles { cert: cert.clone(), key: key.clone(), client_ca: args.tls_client_ca.clone() };
                Some(std::sync::Arc::new(ServerTls::load(&files)?))
            }
            _ => None,
        };
        let bearer = match &args.bearer_file {
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?
                    .trim_end_matches(['\n', '\r'])
                    .to_owned(),
            ),
            None => None,
        };
        writeln!(out, "teachers listening on {addr}")?;
        out.flush()?;
        DemoServer::new(ensemble.teachers)
            .serve_with(listener, Guard { tls, bearer }, async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .context("serving")
    })
}

/// A `[teachers]` section listing the m models at `addr` (reached over
/// `scheme`), and their stacked model (used with `teachers.layout =
/// "stacked"`). TLS settings (the CA, a client certificate, headers) are
/// the caller's to add.
fn remote_config(addr: SocketAddr, m: usize, scheme: &str) -> String {
    let mut s = String::from("[teachers]\nsource = \"remote\"\nremote = [\n");
    let endpoint = |e: &str| e.replacen("http://", &format!("{scheme}://"), 1);
    for spec in demo::specs(addr, m) {
        s.push_str(&format!("  {{ endpoint = {:?}, model = {:?} }},\n", endpoint(&spec.endpoint), spec.model));
    }
    s.push_str("]\n");
    let stacked = demo::stacked_spec(addr);
    s.push_str(&format!(
        "stacked = {{ endpoint = {:?}, model = {:?}, version = \"\", models = {m} }}\n",
        endpoint(&stacked.endpoint),
        stacked.model
    ));
    s
}

/// Writes the held-out images of `seed`'s split as CSV (`p0`…`p63`, then
/// one image per row); returns how many.
fn export_test(seed: u64, path: &std::path::Path) -> anyhow::Result<usize> {
    let split = pacpriv_demo::digits::split(seed).map_err(anyhow::Error::msg)?;
    let mut w = std::io::BufWriter::new(std::fs::File::create(path)?);
    let header: Vec<String> = (0..pacpriv_demo::digits::FEATURES).map(|j| format!("p{j}")).collect();
    writeln!(w, "{}", header.join(","))?;
    for e in &split.test {
        let row: Vec<String> = e.pixels.iter().map(|p| p.to_string()).collect();
        writeln!(w, "{}", row.join(","))?;
    }
    w.flush()?;
    Ok(split.test.len())
}

fn evaluate(ensemble: &Trained, out: &mut dyn Write) -> anyhow::Result<()> {
    let test = &ensemble.split.test;
    let accuracy = |t: &pacpriv_demo::Teacher| {
        let correct = test.iter().filter(|e| t.predict(&e.pixels.map(f64::from)) == e.digit).count();
        correct as f64 / test.len() as f64
    };
    let accs: Vec<f64> = ensemble.teachers.iter().map(accuracy).collect();
    let full = ensemble.full_data_model().map_err(anyhow::Error::msg)?;
    let mean = accs.iter().sum::<f64>() / accs.len() as f64;
    let (min, max) = accs.iter().fold((1.0f64, 0.0f64), |(lo, hi), &a| (lo.min(a), hi.max(a)));
    writeln!(out, "test examples            {}", test.len())?;
    writeln!(
        out,
        "teacher accuracy         mean {:.2} %, min {:.2} %, max {:.2} %",
        100.0 * mean,
        100.0 * min,
        100.0 * max
    )?;
    writeln!(out, "full-data model          {:.2} %", 100.0 * accuracy(&full))?;
    Ok(())
}
