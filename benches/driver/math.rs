//! `pacpriv-bench math`: privacy math per query against the paper's numpy
//! path on the same inputs, in one run — label mode (issue 26 §1: ≥ 100×;
//! issue 44 §4: a label space of 32 768 classes at ≤ 100 µs and ≥ 1 000×)
//! and, with `--vector`, vector mode on jittered scores (issue 56 §1:
//! ahead at every d, ≥ 1.5× from d = 100, ≥ 2.5× from d = 1 000), with the
//! calibration alone timed on each basis (where the SVD and the Gram path
//! cross).
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
use pacpriv_privacy::Nats;
use pacpriv_privacy::keyed::NoiseKey;
use pacpriv_privacy::ledger::{Ledger, Policy};
use pacpriv_privacy::mechanism::{self, Calibration, SecretIndex, SessionState, TeacherOutputs};
use pacpriv_privacy::noise::Floor;
use pacpriv_privacy::posterior::Posterior;
use pacpriv_privacy::vector;
use rand::{RngExt, SeedableRng};
use std::io::Write;
use std::time::Instant;

/// The patterns of `crates/privacy/benches/privacy.rs` and `paper_path.py`: how many
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
    /// Also time vector mode (jittered score vectors), with this many
    /// Rust queries per case (0: label mode only).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub vector: usize,
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
    writeln!(out, "m = {M}, b = 2^-32; Rust: mechanism::answer; numpy: benches/numpy/paper_path.py")?;
    writeln!(out)?;
    writeln!(out, "| d | pattern | Rust µs/query | numpy µs/query | numpy / Rust | goal |")?;
    writeln!(out, "|---:|---|---:|---:|---:|---|")?;
    let mut paths = Vec::new();
    let mut draws = Vec::new();
    for &d in &args.d {
        if args.vector > 0 {
            paths.push((
                d,
                basis_ms(d, vector::Path::Svd, args.vector)?,
                basis_ms(d, vector::Path::Gram, args.vector)?,
            ));
        }
        let label_goal = if d >= HUGE { Goal(1000.0, Some(100.0)) } else { Goal(100.0, None) };
        let mut cases: Vec<(&str, TeacherOutputs, usize, Goal)> = PATTERNS
            .iter()
            .filter(|(_, dissent)| dissent.len() < d)
            .map(|&(name, dissent)| (name, labels(d, dissent), args.queries, label_goal))
            .collect();
        if args.vector > 0 {
            cases.push((VECTOR, TeacherOutputs::Vectors(jittered_scores(d)), args.vector, vector_goal(d)));
        }
        for (name, outputs, queries, Goal(goal, within_us)) in cases {
            let rust = rust_ns(&outputs, queries, Draw::Csprng)?;
            draws.push((d, name, rust, rust_ns(&outputs, queries, Draw::Keyed)?));
            let numpy = baseline
                .iter()
                .find(|c| c.d == d && c.pattern == name)
                .with_context(|| format!("the baseline reported no case d={d} {name}"))?
                .ns_per_query;
            let ratio = numpy / rust;
            let met = ratio >= goal && within_us.is_none_or(|us| rust / 1e3 <= us);
            let verdict = if met { "met" } else { "missed" };
            let within = within_us.map(|us| format!(", ≤ {us} µs")).unwrap_or_default();
            writeln!(
                out,
                "| {d} | {name} | {:.2} | {:.1} | {ratio:.1}× | ≥ {goal}×{within}: {verdict} |",
                rust / 1e3,
                numpy / 1e3
            )?;
        }
    }
    writeln!(out)?;
    writeln!(
        out,
        "The draw: the service's keyed generator (the session's HMAC keyed once, then per answer one HMAC and \
         ChaCha20; issue 66 §5: within 5 %) against a CSPRNG (ChaCha20), same answers:"
    )?;
    writeln!(out)?;
    writeln!(out, "| d | pattern | CSPRNG µs/query | keyed µs/query | keyed / CSPRNG |")?;
    writeln!(out, "|---:|---|---:|---:|---:|")?;
    for (d, name, csprng, keyed) in draws {
        writeln!(out, "| {d} | {name} | {:.2} | {:.2} | {:.3}× |", csprng / 1e3, keyed / 1e3, keyed / csprng)?;
    }
    if !paths.is_empty() {
        writeln!(out)?;
        writeln!(out, "Vector mode, the calibration alone on each basis (where the SVD and the Gram path cross):")?;
        writeln!(out)?;
        writeln!(out, "| d | SVD ms | Gram ms | SVD / Gram |")?;
        writeln!(out, "|---:|---:|---:|---:|")?;
        for (d, svd, gram) in paths {
            writeln!(out, "| {d} | {svd:.3} | {gram:.3} | {:.2}× |", svd / gram)?;
        }
    }
    Ok(())
}

/// Median ms of `vector::calibrate_on` on `path` for the jittered scores
/// of width d (5 batches of `queries`), the posterior of [`rust_ns`].
fn basis_ms(d: usize, path: vector::Path, queries: usize) -> anyhow::Result<f64> {
    let mut rng = chacha20::ChaCha20Rng::seed_from_u64(1);
    let posterior = Posterior::from_log_weights((0..M).map(|_| rng.random_range(-8.0..0.0)).collect())?;
    let scores = jittered_scores(d);
    let b = Nats::new(2f64.powi(-32))?;
    let ns = median_ns(
        queries,
        || (),
        |_| {
            std::hint::black_box(vector::calibrate_on(&posterior, scores.view(), b, path, Floor::default())?);
            Ok(())
        },
    )?;
    Ok(ns / 1e6)
}

/// Median ns per call of `call` over 5 batches of `queries / 5`, each
/// batch on a fresh `start()`.
fn median_ns<S>(
    queries: usize,
    mut start: impl FnMut() -> S,
    mut call: impl FnMut(&mut S) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let batch = (queries / 5).max(1);
    let mut times = Vec::with_capacity(5);
    for _ in 0..5 {
        let mut state = start();
        let began = Instant::now();
        for _ in 0..batch {
            call(&mut state)?;
        }
        times.push(began.elapsed().as_secs_f64() * 1e9 / batch as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[2])
}

/// What a case is held to: at least this ratio over numpy, and at most
/// this many µs per query where one is given.
#[derive(Clone, Copy)]
struct Goal(f64, Option<f64>);

/// Issue 56 §1: vector mode ahead of numpy at every d, by ≥ 1.5× from
/// d = 100 and ≥ 2.5× from d = 1 000.
fn vector_goal(d: usize) -> Goal {
    let ratio = match d {
        ..100 => 1.0,
        100..1000 => 1.5,
        _ => 2.5,
    };
    Goal(ratio, None)
}

/// From this many classes on, a label space is "huge" (the paper's term):
/// issue 44 §4's goal, ≤ 100 µs and ≥ 1 000× numpy, applies.
const HUGE: usize = 32_768;

/// The vector-mode case's name, as `paper_path.py --vector` reports it.
const VECTOR: &str = "vector_jittered";

/// Label mode: `dissent[j]` teachers vote class ((j+1)·7919) mod d, the rest 0.
fn labels(d: usize, dissent: &[usize]) -> TeacherOutputs {
    let mut labels = vec![0; M];
    let mut at = 0;
    for (j, &n) in dissent.iter().enumerate() {
        labels[at..at + n].fill(((j + 1) * 7919) % d);
        at += n;
    }
    TeacherOutputs::Labels { labels, classes: d }
}

/// Vector mode: softmax-like scores, mostly agreeing, with a deterministic
/// per-teacher jitter in [0, 0.01) — the same formula as `paper_path.py`.
fn jittered_scores(d: usize) -> ndarray::Array2<f64> {
    ndarray::Array2::from_shape_fn((M, d), |(i, j)| {
        let base = if j == 0 { 0.8 } else { 0.2 / d as f64 };
        base + ((i * 7919 + j * 104_729) % 1000) as f64 / 1e5
    })
}

/// Where an answer's standard normals come from.
#[derive(Clone, Copy)]
enum Draw {
    /// A CSPRNG (ChaCha20), as `mechanism::answer` takes.
    Csprng,
    /// The service's keyed generator: per answer the inputs' digest, the
    /// step's HMAC and its ChaCha20 stream (the session's HMAC keyed once).
    Keyed,
}

/// Median ns per answer over 5 batches, the posterior moving as it would.
fn rust_ns(outputs: &TeacherOutputs, queries: usize, draw: Draw) -> anyhow::Result<f64> {
    let mut rng = chacha20::ChaCha20Rng::seed_from_u64(1);
    let start = SessionState {
        posterior: Posterior::from_log_weights((0..M).map(|_| rng.random_range(-8.0..0.0)).collect())?,
        ledger: Ledger::new(Nats::new(2f64.powi(-32))?, Nats::new(1e9)?, Policy::Paper)?,
    };
    let secret = SecretIndex::new(M - 1, M)?;
    let session = NoiseKey::from_bytes([1; 32]).session("default", "bench");
    let mut step = 0;
    median_ns(
        queries,
        || start.clone(),
        |state| {
            let answer = match draw {
                Draw::Csprng => mechanism::answer(state, outputs, secret, None, &mut rng)?,
                Draw::Keyed => {
                    step += 1;
                    let normals = &mut session.normals(step);
                    mechanism::answer_keyed(state, outputs, secret, None, normals, Calibration::Certified)?
                }
            };
            std::hint::black_box(answer);
            Ok(())
        },
    )
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
        .args((args.vector > 0).then_some("--vector"))
        .env("OPENBLAS_NUM_THREADS", "1")
        .env("OMP_NUM_THREADS", "1")
        // numpy as its users run it: glibc's default thresholds, not the
        // ones this binary started itself with (`pacpriv::cli::malloc`).
        .env_remove(pacpriv::cli::malloc::TUNABLES)
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
