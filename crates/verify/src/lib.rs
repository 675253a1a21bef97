//! pacpriv-verify: checks an exported journal (`pacpriv admin export`)
//! from its records alone — no server, no store, no secret. Run as
//! `pacpriv verify FILE`, or as `pacpriv-verify FILE`, a binary of its own
//! that an auditor builds from this crate on a machine of their own: it
//! links the privacy crate and the records' format (`pacpriv-records`)
//! and no server — none of tonic, hyper, axum or tokio-postgres, which CI
//! checks with `cargo tree` (`crates/verify/tests/links_no_server.rs`).
//!
//! For every session, in order: the entries' versions run 1, 2, 3, … and
//! the events' numbers 1, 2, 3, … with none missing; each item's chain
//! hash is SHA-256 over the previous one and the item itself
//! ([`pacpriv_records::JournalEntry::chained`],
//! [`pacpriv_records::JournalEvent::chained`]), starting from the session's
//! genesis hash; each step re-derives — posterior, Σ, the ½·tr(Σ⁺C) ≤ b
//! certificate, the charge and the ledger — as [`pacpriv_privacy::replay`]
//! does; each event is justified by what came before it (a cache hit
//! releases again what the step that answered its query released; a
//! budget refusal did not fit the replayed ledger; a contested refusal's
//! teachers disagree under `unanimous_only`; an evicted or noisy-not-kept
//! repeat repeats an answered query); the session's stored record equals
//! the replayed end state bit for bit (posterior, spent, counts, chain
//! head, events); and the noise audit ([`pacpriv_privacy::noise_audit`])
//! finds the session's releases no less noisy than calibrated at
//! `--noise-alpha`. Every record that does not match is named by its line
//! (up to [`MAX_FINDINGS`]) and the command exits with 65 (`EX_DATAERR`).
//!
//! After a step that does not match, its recorded update is applied as
//! recorded so that the steps after it are checked against the server's
//! own state; after a gap (a missing or reordered record) the rest of that
//! session cannot be re-derived and is skipped, said once.
//!
//! What cannot be checked is not passed: a step whose release sits at the
//! clamp on a noisy coordinate, or whose update the grid cannot pin
//! ([`pacpriv_privacy::replay::Unchecked`]), fails like a mismatch unless
//! `--allow-unchecked` is given, which lists every such line instead.
//! Argument: `docs/assurance/accounting.md` §9.
//!
//! Here: reading the export line by line and routing each line to its
//! session ([`check`]). By what they check: `chain` (hashes, numbering,
//! each event justified), `replay` (each step re-derived), `keyed` (the
//! key audit), [`audit`] (the statistical audit over every session),
//! `session` (a session's state, and its record against the replay);
//! [`report`] prints the results, [`format`] reads the lines.

pub mod audit;
mod chain;
pub mod format;
mod keyed;
pub mod keys;
mod replay;
pub mod report;
mod session;

use format::Line;
use pacpriv_privacy::key_audit::Alignment;
use pacpriv_privacy::keyed::NoiseKey;
use pacpriv_privacy::mechanism::SessionState;
use pacpriv_privacy::noise_audit::{self, NoiseAudit};
use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::path::PathBuf;

pub use report::{Verified, run};

/// The plural ending for `n` of something ("" for one, "s" otherwise).
fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Arguments of `pacpriv verify`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The export to check (`pacpriv admin export --out FILE`); `-` reads
    /// standard input.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Accept steps whose posterior update cannot be checked (a release at
    /// the ±2^20 clamp, or a noise direction too narrow for the 2^-32 grid
    /// to pin the update) and list their lines, instead of failing on
    /// them. What those steps applied to the posterior is then taken on
    /// trust.
    #[arg(long)]
    pub allow_unchecked: bool,
    /// Significance of the noise audit: a session fails when p_less (too
    /// little noise) or p_more (releases farther out than the noise puts
    /// them) is below ALPHA/2, so an honest session fails with probability
    /// at most ALPHA, whatever queries its client chose. Smaller values need
    /// more noisy steps to catch a given shortfall.
    #[arg(long, value_name = "ALPHA", default_value_t = noise_audit::DEFAULT_ALPHA, value_parser = alpha)]
    pub noise_alpha: f64,
    /// The datasets' noise keys (`pacpriv admin export --noise-key FILE`):
    /// every step drawn from a key is then checked exactly — its release
    /// must be one teacher's output (the same teacher for every step of a
    /// dataset) plus the key's noise, in every direction of Σ. A key that
    /// does not match the commitment its steps recorded is refused.
    #[arg(long, value_name = "FILE")]
    pub noise_key: Option<PathBuf>,
    /// Accept noisy steps whose journal commits to no noise key, auditing
    /// them statistically only. Stores written before committed noise
    /// (export format 3) hold such steps; a server of this release never
    /// writes one, so without this flag each is a finding: an operator who
    /// strips the commitments would otherwise escape the key audit and the
    /// stricter rules committed steps are held to.
    #[arg(long)]
    pub allow_unkeyed: bool,
    /// Accept keyed vector-mode steps that record no calibration rules,
    /// holding their basis path to the looser rules of the release that
    /// wrote them. Stores written before issue 70's SVD rank hold such
    /// steps; a server of this release never writes one, so without this
    /// flag each session holding one is a finding: under those rules a
    /// server had two paths, and so two Σ, open for the same outputs.
    #[arg(long)]
    pub allow_unversioned: bool,
}

fn alpha(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(a) if a > 0.0 && a < 1.0 => Ok(a),
        _ => Err(format!("{s:?} is not a probability strictly between 0 and 1")),
    }
}

/// Real runs, for `pacpriv verify --help` (the book's verify chapter shows
/// the same, with the commands that made the exports).
pub const EXAMPLES: &str = "\
Examples (real runs):

An honest export: the built-in demo labelling 359 digits, then 64 again
from the cache. The noise audit's statistic is χ² on its degrees of
freedom when the noise is as calibrated; the p-value bounds, one test over
the export, hold however the client chose its queries.

  $ pacpriv verify journal.jsonl
  session  steps  cache_hits  refusals  charged  spent_nats  …  update_slack_nats
  demo     359    64          1         359      2.1398e-5   …  2.7e-7
  noise audit (α = 1e-6 for the export; …):
  session  noisy_steps  dof  statistic   scale   uncovered_b  floor_only_b  left_out
  demo     79           120  1.090391e2  0.9532  0.0e0        0.0e0         280 unanimous steps, …
  test                     sessions  noisy_steps  dof  statistic   …  p_less   p_more   verdict
  m = 128: (no key given)  1         79           120  1.090391e2  …  1.000e0  1.000e0  pass
  verified: 359 steps and 65 events of 1 session; …, and the noise audited

An export whose operator drew the noise from Σ/4 (`halved`) or added none
(`silent`) and journaled every update consistently, committing to no
noise key as a store from before committed noise (exit status 65; a
release without noise is named at its line, the test of every session of
16 teachers at its last session's record line):

  $ pacpriv verify --allow-unkeyed dishonest.jsonl
  error: dishonest.jsonl:228: session \"silent\" version 1: its release equals a teacher's output
  exactly, although the teachers disagree and noise the 2^-32 grid resolves was due: it was
  released without noise
  …
  dishonest.jsonl:232: the sessions of m = 16: (no key given) (\"honest\", \"halved\", \"silent\"):
  its releases carry less noise than calibrated: the residual statistic is 1.962642e2 on 456
  degrees of freedom (apparent scale 0.6561 of the calibrated noise), p ≤ 1.429e-36 <
  --noise-alpha/2 = 5e-7
";

/// How many findings are listed before the rest are only counted.
pub const MAX_FINDINGS: usize = 20;

/// One record that does not match.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    /// Its line, from 1.
    pub line: usize,
    /// What did not match.
    pub what: String,
}

/// Every record that does not match (the first [`MAX_FINDINGS`] of them).
#[derive(Debug, thiserror::Error)]
#[error("{}", self.render())]
pub struct Failed {
    /// The export.
    pub file: String,
    /// What did not match, in the order found.
    pub findings: Vec<Finding>,
    /// Findings past [`MAX_FINDINGS`], counted only.
    pub more: usize,
}

impl Failed {
    fn render(&self) -> String {
        let mut lines: Vec<String> =
            self.findings.iter().map(|f| format!("{}:{}: {}", self.file, f.line, f.what)).collect();
        if self.more > 0 {
            lines.push(format!("… and {} more", self.more));
        }
        lines.join("\n")
    }

    /// The first finding (every `Failed` has one).
    pub fn first(&self) -> Option<&Finding> {
        self.findings.first()
    }
}

/// Collects findings for one run.
struct Findings {
    list: Vec<Finding>,
    more: usize,
}

impl Findings {
    fn add(&mut self, line: usize, what: String) {
        if self.list.len() < MAX_FINDINGS {
            self.list.push(Finding { line, what });
        } else {
            self.more += 1;
        }
    }
}

/// What `check` accepts and tests at.
#[derive(Clone, Copy, Debug)]
pub struct Options<'a> {
    /// List steps whose update cannot be checked instead of failing on them.
    pub allow_unchecked: bool,
    /// Audit noisy steps that commit to no noise key statistically instead
    /// of failing on them (stores written before committed noise).
    pub allow_unkeyed: bool,
    /// Hold keyed vector steps that record no calibration rules to the
    /// looser rules before them instead of failing on them (stores written
    /// before issue 70's SVD rank).
    pub allow_unversioned: bool,
    /// The noise audit's significance.
    pub noise_alpha: f64,
    /// The datasets' noise keys, by name (empty: the statistical audit only).
    pub keys: &'a BTreeMap<String, NoiseKey>,
}

/// No keys.
static NO_KEYS: BTreeMap<String, NoiseKey> = BTreeMap::new();

impl Default for Options<'_> {
    fn default() -> Self {
        Options {
            allow_unchecked: false,
            allow_unkeyed: false,
            allow_unversioned: false,
            noise_alpha: noise_audit::DEFAULT_ALPHA,
            keys: &NO_KEYS,
        }
    }
}

/// Checks an export read from `reader` (called `file` in messages).
///
/// # Errors
/// [`Failed`] naming every line that does not match (up to
/// [`MAX_FINDINGS`]).
pub fn check(reader: impl BufRead, file: &str, options: Options<'_>) -> Result<Vec<Verified>, Failed> {
    let mut findings = Findings { list: Vec::new(), more: 0 };
    let mut keyed = KeyedSoFar::default();
    let mut done: Vec<Verified> = Vec::new();
    let mut current: Option<Replaying> = None;
    let mut lines = 0;
    for (i, text) in reader.lines().enumerate() {
        let n = i + 1;
        lines = n;
        let text = match text {
            Ok(text) => text,
            Err(e) => {
                findings.add(n, format!("unreadable: {e}"));
                break;
            }
        };
        let line = match Line::parse(&text) {
            Ok(line) => line,
            Err(e) => {
                findings.add(n, format!("not a line of a journal export: {e}"));
                continue;
            }
        };
        match (n, line) {
            (1, Line::Header(h)) if format::READS.contains(&h.format.as_str()) => {}
            (1, _) => {
                findings.add(1, format!("the first line must be {{\"format\":\"{}\"}}", format::FORMAT));
                break;
            }
            (_, Line::Header(_)) => findings.add(n, "a second header".into()),
            (_, Line::Entry(e)) => {
                let c = match replaying(&mut current, &done, &e.session, &mut findings, n) {
                    Ok(c) => c,
                    Err(what) => {
                        findings.add(n, what);
                        continue;
                    }
                };
                if let Err(what) = c.step(&e, n, options, &mut keyed) {
                    findings.add(n, format!("session {:?} version {}: {what}", e.session, e.version));
                }
            }
            (_, Line::Event(e)) => match replaying(&mut current, &done, &e.session, &mut findings, n) {
                Ok(c) => {
                    if let Err(what) = c.event(&e) {
                        findings.add(n, format!("session {:?} event {}: {what}", e.session, e.event));
                    }
                }
                Err(what) => findings.add(n, what),
            },
            (_, Line::Session(s)) => {
                let c = match current.take() {
                    Some(c) if c.session == s.session => c,
                    Some(c) => {
                        findings.add(n, format!("record of {:?} while {:?}'s entries are open", s.session, c.session));
                        continue;
                    }
                    None => Replaying::new(&s.session),
                };
                if done.iter().any(|d| d.session == s.session) {
                    findings.add(n, format!("session {:?} appears twice", s.session));
                    continue;
                }
                let session = s.session.clone();
                match c.finish(&s.record, n) {
                    Ok(v) => done.push(v),
                    Err(whats) => {
                        whats.into_iter().for_each(|what| findings.add(n, format!("session {session:?}: {what}")))
                    }
                }
            }
        }
    }
    match (lines, current) {
        (0, _) => findings.add(1, "the export is empty".into()),
        (_, Some(c)) => {
            findings.add(lines, format!("the export ends inside session {:?}: its record line is missing", c.session))
        }
        (_, None) => {}
    }
    // The keyed draws' alignment: one test over the export, each
    // session's bets averaged (whatever datasets the key file names, an
    // honest a is N(0, 1)).
    let p = Alignment::p_averaged(keyed.sessions.values().map(|(a, _)| a));
    let leading = keyed.sessions.iter().max_by(|x, y| x.1.0.log_wealth().total_cmp(&y.1.0.log_wealth()));
    if let (true, Some((session, (alignment, line)))) = (p < options.noise_alpha, leading) {
        findings.add(
            *line,
            format!(
                "the keyed draws lean toward or away from the teacher each dataset's releases are centred on (the \
                 export's sessions' bets averaged; most in session {session:?}, whose {} keyed steps' alignment \
                 sums to {:.1}, N(0, {}) when honest), p ≤ {p:.3e} < --noise-alpha = {}: the draws were not the \
                 keys' at their positions, or each met the query it suits, which leaks s* beyond what was charged",
                alignment.steps, alignment.sum, alignment.steps, options.noise_alpha
            ),
        );
    }
    // The statistical audit, one test over every session.
    for f in audit::findings(&audit::datasets(&done, &dataset_names(options.keys)), options.noise_alpha) {
        findings.add(f.line, f.what);
    }
    if findings.list.is_empty() {
        Ok(done)
    } else {
        Err(Failed { file: file.to_owned(), findings: findings.list, more: findings.more })
    }
}

/// The datasets' names by their keys' commitments (hex).
fn dataset_names(keys: &BTreeMap<String, NoiseKey>) -> BTreeMap<String, String> {
    keys.iter().map(|(name, key)| (format::hex(&key.commitment()), name.clone())).collect()
}

/// The session being re-derived, for line `line` of `session`: the current
/// one, or a new one if the current one's lines ended. A current session
/// whose lines end without its record line is reported (at `line`) and
/// dropped, so that the next session is still checked.
fn replaying<'a>(
    current: &'a mut Option<Replaying>,
    done: &[Verified],
    session: &str,
    findings: &mut Findings,
    line: usize,
) -> Result<&'a mut Replaying, String> {
    if let Some(c) = current.as_ref().filter(|c| c.session != session) {
        findings.add(line, format!("session {:?}'s entries end without its record line", c.session));
        *current = None;
    }
    if current.is_none() && done.iter().any(|d| d.session == session) {
        return Err(format!("session {session:?} appears twice"));
    }
    Ok(current.get_or_insert_with(|| Replaying::new(session)))
}

/// What the export's keyed steps showed so far.
#[derive(Default)]
struct KeyedSoFar {
    /// For each dataset, the teachers that matched every keyed step of
    /// any of its sessions (s* is one per dataset).
    teachers: BTreeMap<String, Vec<usize>>,
    /// For each session, the bets on its draws' alignment with the
    /// matched centres, and the line of its last keyed step bet on (where
    /// a failed test is said).
    sessions: BTreeMap<String, (Alignment, usize)>,
}

/// One session being re-derived.
struct Replaying {
    session: String,
    /// The session's dataset: the one whose key its keyed steps committed
    /// to (empty before the first).
    dataset: String,
    /// The noise-key commitment its steps recorded (empty before the first).
    commitment: String,
    /// Noisy steps the key audit checked.
    keyed_steps: u64,
    /// Noisy steps it could not (no key given, or drawn before keys).
    statistical_steps: u64,
    /// The largest scale-down 1 − c a keyed step could not see.
    undetectable: f64,
    /// Directions of keyed steps the grid cannot resolve.
    unresolved: u64,
    /// `None` before the first entry (m is not known yet).
    state: Option<SessionState>,
    head: [u8; 32],
    version: u64,
    /// The last event's number.
    events: u64,
    cache_hits: u64,
    refusals: u64,
    /// What each answered query (by digest) released: label and vector.
    answered: HashMap<Vec<u8>, (u32, Vec<f64>)>,
    limit: f64,
    worst: f64,
    /// Lines of steps whose update was applied unchecked.
    unchecked: Vec<usize>,
    /// The noise audit (`None` before the first entry: m is not known).
    audit: Option<NoiseAudit>,
    exact_steps: u64,
    slack: f64,
    /// Set at a gap (a missing or reordered record): nothing after it in
    /// this session can be re-derived, and is skipped.
    broken: bool,
    /// A noisy step without a key commitment was reported (without
    /// `--allow-unkeyed`).
    unkeyed_said: bool,
    /// A keyed vector step that records no calibration rules was reported
    /// (without `--allow-unversioned`).
    unversioned_said: bool,
    /// Keyed vector steps that record no calibration rules, held to the
    /// older ones (with `--allow-unversioned`).
    unversioned_steps: u64,
    /// The newest calibration rules a step of this session recorded: a
    /// server's rules never go back (an upgrade raises them).
    rules: u32,
}
