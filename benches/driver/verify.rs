//! `pacpriv-bench verify`: how long `pacpriv verify` takes on a journal of
//! N steps (issue 25: 100 000 steps in seconds).
//!
//! The journal is a real one: N label-mode steps of the mechanism on one
//! session of m teachers (most agreeing, some dissent, as the demo
//! teachers do), each journaled and chained exactly as the session writes
//! it, exported as JSON Lines to a scratch file, each step's noise drawn
//! from a noise key as the service draws it. The baseline in the same run
//! is the mechanism's own time for those steps (the keyed draw included),
//! so the result reads as "verifying costs X× answering" — without the key
//! (the statistical audit) and with it (each draw recomputed and checked
//! exactly as well).

use super::scratch::scratch;
use anyhow::{Context, ensure};
use pacpriv_privacy::Nats;
use pacpriv_privacy::keyed::NoiseKey;
use pacpriv_privacy::ledger::{Ledger, Policy};
use pacpriv_privacy::mechanism::{self, Calibration, SecretIndex, SessionState, TeacherOutputs};
use pacpriv_privacy::posterior::Posterior;
use pacpriv_store::record::JournalStepRecord;
use pacpriv_store::{JournalEntry, SessionRecord};
use pacpriv_tools::verify::{self, format};
use rand::RngExt;
use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

/// Arguments of `pacpriv-bench verify`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Journaled steps N.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    pub steps: u64,
    /// Teachers m.
    #[arg(long, default_value_t = 128, value_name = "M")]
    pub teachers: usize,
    /// Classes d.
    #[arg(long, default_value_t = 10, value_name = "D")]
    pub classes: usize,
}

/// Runs the mechanism, writes the export, verifies it; prints Markdown.
///
/// # Errors
/// A refused step, I/O, or an export that does not verify.
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let (dir, fs) = scratch(None)?;
    let path = dir.path().join("journal.jsonl");
    let (m, d) = (args.teachers, args.classes);
    let b = Nats::new(super::store::PER_QUERY)?;
    let mut state = SessionState {
        posterior: Posterior::uniform(m)?,
        ledger: Ledger::new(b, Nats::new(super::store::BUDGET)?, Policy::Paper)?,
    };
    let secret = SecretIndex::new(m / 3, m)?;
    let mut rng = rand::rng();
    let key = NoiseKey::from_bytes(rand::random());
    let draws = key.session("default", "bench");
    let commitment = key.commitment().to_vec();
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).context("the scratch file")?);
    serde_json::to_writer(&mut file, &format::Header { format: format::FORMAT.into() })?;
    writeln!(file)?;
    let (mut answering, mut head) = (Duration::ZERO, JournalEntry::genesis("bench"));
    for version in 1..=args.steps {
        let common = rng.random_range(0..d);
        let labels: Vec<usize> =
            (0..m).map(|_| if rng.random_range(0..20) == 0 { rng.random_range(0..d) } else { common }).collect();
        let outputs = TeacherOutputs::Labels { labels: labels.clone(), classes: d };
        let started = Instant::now();
        let mut normals = draws.normals(version);
        let a = mechanism::answer_keyed(&mut state, &outputs, secret, None, &mut normals, Calibration::Certified)?;
        answering += started.elapsed();
        let mut entry = JournalEntry {
            version,
            query_id: format!("q{version}"),
            charge: a.charge.get(),
            log_likelihood: a.log_likelihood.map(|l| l.to_vec()).unwrap_or_default(),
            update_rule: a.update_rule.code(),
            step: Some(JournalStepRecord {
                digest: vec![0; 32],
                per_query: b.get(),
                limit: state.ledger.limit().get(),
                policy: state.ledger.policy().to_string(),
                classes: d as u32,
                labels: labels.iter().map(|&l| l as u32).collect(),
                published: a.published,
                label: a.label as u32,
                noise_key: if a.unanimous { Vec::new() } else { commitment.clone() },
                ..Default::default()
            }),
            chain: Vec::new(),
        };
        head = entry.chained(&head);
        entry.chain = head.to_vec();
        serde_json::to_writer(&mut file, &format::EntryLine::of("bench", &entry))?;
        writeln!(file)?;
    }
    let record = SessionRecord { journal_head: Some(head), ..SessionRecord::of(&state, Vec::new(), args.steps) };
    serde_json::to_writer(
        &mut file,
        &format::SessionLine { session: "bench".into(), record: format::RecordLine::of(&record) },
    )?;
    writeln!(file)?;
    file.flush()?;
    drop(file);
    let bytes = std::fs::metadata(&path)?.len();

    let keys = BTreeMap::from([("default".to_owned(), key)]);
    let none = BTreeMap::new();
    let verify = |keys: &BTreeMap<String, NoiseKey>| -> anyhow::Result<Duration> {
        let started = Instant::now();
        let reader = std::io::BufReader::new(std::fs::File::open(&path)?);
        let options = verify::Options { keys, ..verify::Options::default() };
        let verified = verify::check(reader, &path.display().to_string(), options)?;
        let took = started.elapsed();
        ensure!(verified.len() == 1 && verified[0].steps == args.steps, "verified {verified:?}");
        Ok(took)
    };
    let verifying = verify(&none)?;
    let keyed = verify(&keys)?;

    let per_step = |t: Duration| t.as_secs_f64() * 1e6 / args.steps as f64;
    writeln!(out, "### `pacpriv verify` on {} journaled steps (m = {m}, d = {d}, label mode)\n", args.steps)?;
    writeln!(out, "{}; export on {fs}, {:.1} MiB.\n", super::report::machine(), bytes as f64 / 1048576.0)?;
    writeln!(out, "| | total | per step | ratio |")?;
    writeln!(out, "|---|---:|---:|---:|")?;
    writeln!(
        out,
        "| answering (the mechanism, baseline) | {:.2} s | {:.1} µs | 1.00× |",
        answering.as_secs_f64(),
        per_step(answering)
    )?;
    for (what, took) in [("statistical noise audit", verifying), ("and the key audit (`--noise-key`)", keyed)] {
        writeln!(
            out,
            "| verifying (read, parse, chain, replay, {what}) | {:.2} s | {:.1} µs | {:.2}× |",
            took.as_secs_f64(),
            per_step(took),
            took.as_secs_f64() / answering.as_secs_f64()
        )?;
    }
    Ok(())
}
