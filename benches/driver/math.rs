//! `pacpriv-bench math`: label-mode privacy math per query against the
//! paper's numpy path on the same inputs, in one run (issue 26 §1: ≥ 100×).
//!
//! The Rust side is one `mechanism::answer` (calibration with its
//! certificate, CSPRNG draw, release, Eq. 4, ledger) on m = 128 teachers
//! whose labels follow the criterion bench's patterns, the posterior's
//! log-weights spread over e⁻⁸…1, b = 2⁻³². The baseline is
//! `benches/numpy/paper_path.py`, run by this driver with one BLAS thread:
//! a full thin SVD of the weighted m × d outputs, Σ from Theorem 2.4, a
//! draw, argmax and Eq. 4 over every teacher. Both report the median of 5
//! batches.

use anyhow::{Context, ensure};
use pacpriv::privacy::Nats;
use pacpriv::privacy::ledger::{Ledger, Policy};
use pacpriv::privacy::mechanism::{self, SecretIndex, SessionState, TeacherOutputs};
use pacpriv::privacy::posterior::Posterior;
use rand::{RngExt, SeedableRng};
use std::io::Write;
use std::time::Instant;

/// The patterns of `benches/privacy.rs` and `paper_path.py`: how many
/// teachers dissent, per dissenting class; the rest vote class 0.
const PATTERNS: [(&str, &[usize]); 3] =
    [("k2_120v8", &[8]), ("k3_110v12v6", &[12, 6]), ("k8_spread", &[6, 5, 4, 4, 3, 3, 2])];

/// Arguments of `pacpriv-bench math`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Queries per case on the Rust side (5 batches).
    #[arg(long, default_value_t = 200_000, value_name = "N")]
    pub queries: usize,
    /// Queries per case on the numpy side (5 batches).
    #[arg(long, default_value_t = 2_000, value_name = "N")]
    pub numpy_queries: usize,
    /// Output dimensions d.
    #[arg(long, value_delimiter = ',', default_values_t = [10usize, 100, 1000], value_name = "D,…")]
    pub d: Vec<usize>,
    /// The Python interpreter that runs the baseline (needs numpy).
    #[arg(long, default_value = "python3", value_name = "PATH")]
    pub python: String,
}

const M: usize = 128;

/// Times both sides; prints a Markdown table with their ratio.
///
/// # Errors
/// A refused answer, or a baseline that does not run.
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    ensure!(args.queries >= 5 && args.numpy_queries >= 5, "--queries and --numpy-queries must be at least 5");
    let baseline = numpy(&args)?;
    writeln!(out, "pacpriv-bench math")?;
    writeln!(out, "machine: {}", super::report::machine())?;
    writeln!(out, "m = {M}, b = 2^-32, label mode; Rust: mechanism::answer; numpy: benches/numpy/paper_path.py")?;
    writeln!(out)?;
    writeln!(out, "| d | pattern | Rust µs/query | numpy µs/query | numpy / Rust | goal ≥ 100× |")?;
    writeln!(out, "|---:|---|---:|---:|---:|---|")?;
    for &d in &args.d {
        for (name, dissent) in PATTERNS {
            if dissent.len() + 1 > d {
                continue;
            }
            let rust = rust_ns(d, dissent, args.queries)?;
            let numpy = baseline
                .iter()
                .find(|c| c.d == d && c.pattern == name)
                .with_context(|| format!("the baseline reported no case d={d} {name}"))?
                .ns_per_query;
            let ratio = numpy / rust;
            let verdict = if ratio >= 100.0 { "met" } else { "missed" };
            writeln!(out, "| {d} | {name} | {:.2} | {:.1} | {ratio:.0}× | {verdict} |", rust / 1e3, numpy / 1e3)?;
        }
    }
    Ok(())
}

/// Median ns per answer over 5 batches, the posterior moving as it would.
fn rust_ns(d: usize, dissent: &[usize], queries: usize) -> anyhow::Result<f64> {
    let mut rng = chacha20::ChaCha20Rng::seed_from_u64(1);
    let mut labels = vec![0; M];
    let mut at = 0;
    for (j, &n) in dissent.iter().enumerate() {
        labels[at..at + n].fill(((j + 1) * 7919) % d);
        at += n;
    }
    let outputs = TeacherOutputs::Labels { labels, classes: d };
    let start = SessionState {
        posterior: Posterior::from_log_weights((0..M).map(|_| rng.random_range(-8.0..0.0)).collect())?,
        ledger: Ledger::new(Nats::new(2f64.powi(-32))?, Nats::new(1e9)?, Policy::Paper)?,
    };
    let secret = SecretIndex::new(M - 1, M)?;
    let batch = queries / 5;
    let mut times = Vec::with_capacity(5);
    for _ in 0..5 {
        let mut state = start.clone();
        let began = Instant::now();
        for _ in 0..batch {
            std::hint::black_box(mechanism::answer(&mut state, &outputs, secret, None, &mut rng)?);
        }
        times.push(began.elapsed().as_secs_f64() * 1e9 / batch as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[2])
}

/// One case of the baseline's output.
#[derive(Debug, serde::Deserialize)]
struct Case {
    d: usize,
    pattern: String,
    ns_per_query: f64,
}

fn numpy(args: &Args) -> anyhow::Result<Vec<Case>> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/numpy/paper_path.py");
    let d: Vec<String> = args.d.iter().map(usize::to_string).collect();
    let output = std::process::Command::new(&args.python)
        .arg(script)
        .args(["--m", &M.to_string(), "--queries", &args.numpy_queries.to_string(), "--d"])
        .args(&d)
        .env("OPENBLAS_NUM_THREADS", "1")
        .env("OMP_NUM_THREADS", "1")
        .output()
        .with_context(|| format!("running {} {script}", args.python))?;
    ensure!(
        output.status.success(),
        "the numpy baseline failed ({}): {} (it needs numpy: `pip install numpy`)",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("a baseline line: {l}")))
        .collect()
}
