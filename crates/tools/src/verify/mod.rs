//! `pacpriv verify FILE`: checks an exported journal (`pacpriv admin
//! export`) from its records alone — no server, no store, no secret.
//!
//! For every session, in order: the entries' versions run 1, 2, 3, … and
//! the events' numbers 1, 2, 3, … with none missing; each item's chain
//! hash is SHA-256 over the previous one and the item itself
//! ([`pacpriv_service::store::JournalEntry::chained`],
//! [`pacpriv_service::store::JournalEvent::chained`]), starting from the session's
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

pub mod audit;
pub mod format;
pub mod keys;

use crate::plural;
use format::{EntryLine, EventLine, Line, RecordLine};
use ndarray::Array2;
use pacpriv_privacy::key_audit::Alignment;
use pacpriv_privacy::keyed::{NoiseKey, Position};
use pacpriv_privacy::ledger::{Ledger, Policy};
use pacpriv_privacy::mechanism::{SessionState, TeacherOutputs};
use pacpriv_privacy::noise::Floor;
use pacpriv_privacy::noise_audit::{self, NoiseAudit, Verdict};
use pacpriv_privacy::posterior::{Form, Posterior, UpdateRule};
use pacpriv_privacy::replay::{self, Recorded, Unchecked};
use pacpriv_privacy::vector;
use pacpriv_privacy::{Nats, PrivacyError, report};
use pacpriv_service::store::JournalEntry;
use pacpriv_service::store::record::EventKind;
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, Write};
use std::path::PathBuf;

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

/// What a verified session came to.
#[derive(Clone, Debug, PartialEq)]
pub struct Verified {
    /// The session's key.
    pub session: String,
    /// Its journaled steps.
    pub steps: u64,
    /// Queries it answered from the cache.
    pub cache_hits: u64,
    /// Requests it refused.
    pub refusals: u64,
    /// Answers charged.
    pub charged: u64,
    /// MI spent, re-derived.
    pub spent: f64,
    /// The limit of its last step.
    pub limit: f64,
    /// The largest ½·tr(Σ⁺C)/b of any step.
    pub worst_certificate: f64,
    /// The lines of its steps whose posterior update could not be checked
    /// (only with `--allow-unchecked`; otherwise each one fails).
    pub unchecked: Vec<usize>,
    /// Σ over its steps of the widest tolerance a recorded ℓ was checked
    /// to ([`replay::Replayed::slack`]): every step's true MI is within
    /// e^{2·slack} of its certificate (`privacy-core.md` §9).
    pub update_slack: f64,
    /// The noise audit's verdict on this session alone (its dataset's
    /// test is [`audit::datasets`]).
    pub noise: Verdict,
    /// Its audit, combined with its dataset's other sessions (`None`
    /// without a noisy step).
    pub audit: Option<NoiseAudit>,
    /// The noise-key commitment its steps recorded (hex; empty: none): its
    /// dataset's.
    pub commitment: String,
    /// Its record line.
    pub line: usize,
    /// Its steps that drew no noise (unanimous teachers).
    pub exact_steps: u64,
    /// Its noisy steps checked against the noise key.
    pub keyed_steps: u64,
    /// Its noisy steps audited statistically only (no key given, or drawn
    /// before the dataset had one).
    pub statistical_steps: u64,
    /// The largest noise shortfall 1 − c (releasing c·z for z) that a keyed
    /// step's check could not see.
    pub undetectable: f64,
    /// Directions of its keyed steps too narrow for the grid to resolve.
    pub unresolved: u64,
}

/// Checks `args.file`, prints one line per session, the noise audit and a
/// total.
///
/// # Errors
/// [`Failed`] naming every record that does not match; I/O.
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    // Every recalibration calls LAPACK with 32-bit integers.
    pacpriv_lapack::check_lp64()?;
    let name = args.file.display().to_string();
    let keys = match &args.noise_key {
        Some(path) => keys::read(path)?,
        None => BTreeMap::new(),
    };
    let options = Options {
        allow_unchecked: args.allow_unchecked,
        allow_unkeyed: args.allow_unkeyed,
        noise_alpha: args.noise_alpha,
        keys: &keys,
    };
    let sessions = if name == "-" {
        check(std::io::stdin().lock(), &name, options)?
    } else {
        let file =
            std::fs::File::open(&args.file).map_err(|e| anyhow::anyhow!("cannot read the export {name}: {e}"))?;
        check(std::io::BufReader::new(file), &name, options)?
    };
    writeln!(
        out,
        "session\tsteps\tcache_hits\trefusals\tcharged\tspent_nats\tlimit_nats\tmia_bound\tmax_certificate_over_b\t\
         update_slack_nats"
    )?;
    for s in &sessions {
        let mia = Nats::new(s.spent).map(report::mia_bound).unwrap_or(1.0);
        writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{:e}\t{:e}\t{:.6}\t{:.6}\t{:.1e}",
            s.session,
            s.steps,
            s.cache_hits,
            s.refusals,
            s.charged,
            s.spent,
            s.limit,
            mia,
            s.worst_certificate,
            s.update_slack
        )?;
    }
    let datasets = audit::datasets(&sessions, &dataset_names(&keys));
    audit::write(out, &sessions, &datasets, args.noise_alpha)?;
    if !keys.is_empty() {
        write_key_audit(out, &sessions)?;
    }
    let steps: u64 = sessions.iter().map(|s| s.steps).sum();
    let events: u64 = sessions.iter().map(|s| s.cache_hits + s.refusals).sum();
    let n = sessions.len();
    let (s, e) = (plural(n as u64), plural(events));
    let unchecked: Vec<String> =
        sessions.iter().flat_map(|s| &s.unchecked).map(|line| format!("{name}:{line}")).collect();
    if unchecked.is_empty() {
        writeln!(
            out,
            "verified: {steps} steps and {events} event{e} of {n} session{s}; every charge, certificate, \
             posterior, cache hit and refusal re-derived, and the noise audited"
        )?;
    } else {
        writeln!(
            out,
            "verified with {} unchecked: {steps} steps and {events} event{e} of {n} session{s}; every charge, \
             cache hit and refusal re-derived, but the posterior updates of these steps were taken on trust (their \
             release sits at the ±2^20 clamp, or a noise direction is too narrow for the 2^-32 grid to pin it), \
             and every certificate after them rests on those updates:\n{}",
            unchecked.len(),
            unchecked.join("\n")
        )?;
    }
    Ok(())
}

/// The key audit's table: per session, the steps checked exactly and the
/// largest scale-down of the noise a check could miss. It never names the
/// teacher the releases matched (that is s*).
fn write_key_audit(out: &mut dyn Write, sessions: &[Verified]) -> std::io::Result<()> {
    writeln!(
        out,
        "key audit (--noise-key; each keyed step's release is one teacher's output plus the key's noise in every \
         direction of Σ, the same teacher for every step of a dataset; undetectable_shortfall: the largest 1 − c such \
         that a step's noise scaled by c would still pass its check):"
    )?;
    writeln!(out, "session\tkeyed_steps\tstatistical_only\tundetectable_shortfall\tunresolved_directions")?;
    for s in sessions {
        writeln!(
            out,
            "{}\t{}\t{}\t{:.1e}\t{}",
            s.session, s.keyed_steps, s.statistical_steps, s.undetectable, s.unresolved
        )?;
    }
    Ok(())
}

/// What `check` accepts and tests at.
#[derive(Clone, Copy, Debug)]
pub struct Options<'a> {
    /// List steps whose update cannot be checked instead of failing on them.
    pub allow_unchecked: bool,
    /// Audit noisy steps that commit to no noise key statistically instead
    /// of failing on them (stores written before committed noise).
    pub allow_unkeyed: bool,
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
}

impl Replaying {
    fn new(session: &str) -> Self {
        Replaying {
            session: session.to_owned(),
            dataset: String::new(),
            commitment: String::new(),
            keyed_steps: 0,
            statistical_steps: 0,
            undetectable: 0.0,
            unresolved: 0,
            state: None,
            head: JournalEntry::genesis(session),
            version: 0,
            events: 0,
            cache_hits: 0,
            refusals: 0,
            answered: HashMap::new(),
            limit: 0.0,
            worst: 0.0,
            unchecked: Vec::new(),
            audit: None,
            exact_steps: 0,
            slack: 0.0,
            broken: false,
            unkeyed_said: false,
        }
    }

    /// Checks event `e` (the next item of this session is an event). An
    /// altered hash is reported and the chain goes on from the recorded
    /// one, so that what follows is still checked.
    fn event(&mut self, e: &EventLine) -> Result<(), String> {
        if self.broken {
            return Ok(());
        }
        if e.event != self.events + 1 {
            self.broken = true;
            return Err(format!(
                "expected event {} next: an event is missing or out of order (the rest of this session is not \
                 checked)",
                self.events + 1
            ));
        }
        let event = e.event().ok_or("a hash or digest is not hex")?;
        let altered = self.follow(&event.chain, event.chained(&self.head));
        self.events = e.event;
        let kind = EventKind::parse(&e.kind).ok_or_else(|| format!("{:?} is not a kind of event", e.kind))?;
        if kind == EventKind::CacheHit {
            self.cache_hits += 1;
        } else {
            self.refusals += 1;
        }
        let justified = if e.after_version != self.version {
            Err(format!("it says it came after version {}, but follows version {}", e.after_version, self.version))
        } else {
            self.justify(e, kind)
        };
        with_altered(altered, justified)
    }

    /// Moves the chain on from an item whose recorded hash is `recorded`
    /// and whose hash over the chain so far is `computed`: from the
    /// recorded one when they differ, so that what follows is still
    /// checked. Whether they differ.
    fn follow(&mut self, recorded: &[u8], computed: [u8; 32]) -> bool {
        let altered = recorded != computed;
        self.head = if altered { recorded.try_into().unwrap_or(computed) } else { computed };
        altered
    }

    /// Checks that event `e` of `kind` follows from what came before it.
    fn justify(&self, e: &EventLine, kind: EventKind) -> Result<(), String> {
        let (spent, answered, charged) = self
            .state
            .as_ref()
            .map_or((Nats::ZERO, 0, 0), |s| (s.ledger.spent(), s.ledger.answered(), s.ledger.charged()));
        if spent.get().to_bits() != e.spent.to_bits() {
            return Err(format!("it records {:e} nats spent; the journal adds up to {:e}", e.spent, spent.get()));
        }
        let s = &e.step;
        let earlier = || {
            let digest = format::unhex(&s.digest).unwrap_or_default();
            self.answered
                .get(&digest)
                .filter(|_| !digest.is_empty())
                .ok_or("it names a query no earlier step of the session answered".to_owned())
        };
        match kind {
            EventKind::CacheHit => {
                let (label, published) = earlier()?;
                let same = s.published.is_empty()
                    || (s.published.len() == published.len()
                        && s.published.iter().zip(published).all(|(a, b)| a.to_bits() == b.to_bits()));
                if s.label != *label || !same {
                    return Err("a cache hit that released something other than what the step that answered its \
                                query released"
                        .into());
                }
            }
            EventKind::EvictedRepeat | EventKind::NoisyNotKept => {
                earlier()?;
            }
            EventKind::Exhausted => {
                let nats = |x: f64| Nats::new(x).map_err(|e| e.to_string());
                let policy: Policy = s.policy.parse().map_err(|e: PrivacyError| e.to_string())?;
                let ledger = Ledger::restore(nats(s.per_query)?, nats(s.limit)?, policy, spent, answered, charged)
                    .map_err(|e| e.to_string())?;
                // The service checks n charges of b as the rows' records
                // add them (`Ledger::check_charges`, n = need/b); journals
                // written before issue 53 checked need as one sum. Either
                // refusing is a refusal that held.
                // A request has at most 4096 rows (server.max_batch_rows);
                // a journal claiming more is judged by the single sum.
                let rows = (e.need / s.per_query).round();
                let refused_by_records = (1.0..=4096.0).contains(&rows) && ledger.check_charges(rows as u64).is_err();
                if e.need <= 0.0 || (ledger.check(nats(e.need)?).is_ok() && !refused_by_records) {
                    return Err(format!(
                        "a budget refusal, although {:e} nats more fit the limit {:e} after {:e} spent",
                        e.need, s.limit, e.spent
                    ));
                }
            }
            EventKind::Contested => {
                let policy: Policy = s.policy.parse().map_err(|e: PrivacyError| e.to_string())?;
                if policy != Policy::UnanimousOnly || outputs(s)?.unanimous() {
                    return Err("a contested refusal of a query that policy answers (unanimous teachers, or a \
                                policy other than unanimous_only)"
                        .into());
                }
            }
        }
        Ok(())
    }

    /// Checks entry `e` (the next one of this session, at `line`) and
    /// applies it. A step that does not match is applied as recorded and
    /// reported; one whose update cannot be checked is listed (with
    /// `allow_unchecked`) or reported. `keyed`: what the keyed steps so far
    /// showed.
    fn step(&mut self, e: &EntryLine, line: usize, options: Options<'_>, keyed: &mut KeyedSoFar) -> Result<(), String> {
        if self.broken {
            return Ok(());
        }
        if e.version != self.version + 1 {
            self.broken = true;
            return Err(if self.version == 0 {
                format!(
                    "the journal starts at version {}: the steps before it are missing (removed, or never \
                     journaled because store.journal was off then), so the account cannot be re-derived",
                    e.version
                )
            } else {
                format!(
                    "expected version {} next: a record is missing or out of order (the rest of this session is \
                     not checked)",
                    self.version + 1
                )
            });
        }
        let fail = |this: &mut Self, what: String| {
            this.broken = true;
            Err(format!("{what} (the rest of this session is not checked)"))
        };
        let entry = match e.entry() {
            Some(entry) => entry,
            None => return fail(self, "a hash or digest is not hex".into()),
        };
        let computed = entry.chained(&self.head);
        let s = &e.step;
        let parsed = outputs(s).and_then(|outputs| {
            let policy: Policy = s.policy.parse().map_err(|e: PrivacyError| e.to_string())?;
            let rule = UpdateRule::from_code(e.update_rule).ok_or_else(|| {
                format!(
                    "posterior update rule {} is not one this release knows; verify with a newer pacpriv",
                    e.update_rule
                )
            })?;
            Ok((outputs, policy, rule))
        });
        let (outputs, policy, rule) = match parsed {
            Ok(parsed) => parsed,
            Err(what) => return fail(self, what),
        };
        let nats = |x: f64| Nats::new(x).map_err(|e| e.to_string());
        let state = match self.state.take() {
            Some(state) => Ok(state),
            None => Posterior::uniform(outputs.len()).map_err(|e| e.to_string()).and_then(|posterior| {
                let ledger = Ledger::new(nats(s.per_query)?, nats(s.limit)?, policy).map_err(|e| e.to_string())?;
                Ok(SessionState { posterior, ledger })
            }),
        };
        let state = state.and_then(|state| {
            // b, the limit and the policy are the step's own (a restart may
            // change them); what was spent carries over.
            let l = &state.ledger;
            let ledger =
                Ledger::restore(nats(s.per_query)?, nats(s.limit)?, policy, l.spent(), l.answered(), l.charged())
                    .map_err(|e| e.to_string())?;
            Ok(SessionState { ledger, ..state })
        });
        let mut state = match state {
            Ok(state) => state,
            Err(what) => return fail(self, what),
        };
        let audit = self.audit.get_or_insert_with(|| NoiseAudit::new(outputs.len()));
        let recorded = Recorded {
            outputs: &outputs,
            published: &s.published,
            label: s.label as usize,
            charge: e.charge,
            log_likelihood: &e.log_likelihood,
            update_rule: rule,
            path: vector::Path::from_code(s.basis, s.rank),
            // Every step since committed noise commits to a key and floors
            // Σ's weak directions where the key audit resolves them.
            floor: if s.noise_key.is_empty() { Floor::RoundOff } else { Floor::Resolvable },
        };
        // The key a step's commitment names: its dataset's, found by the
        // commitment itself (a session key does not always name its
        // dataset: the default one's are bare principal names, which may
        // hold a '/').
        // One session is one dataset's: every step commits to one key.
        if !s.noise_key.is_empty() {
            let commitment = s.noise_key.to_ascii_lowercase();
            if self.commitment.is_empty() {
                self.commitment = commitment;
            } else if self.commitment != commitment {
                return fail(
                    self,
                    "its draw committed to another noise key than the session's earlier steps: a session is one \
                     dataset's, and a dataset has one key"
                        .into(),
                );
            }
        }
        let key = match (options.keys.is_empty(), s.noise_key.is_empty()) {
            (false, false) => {
                let commitment = s.noise_key.to_ascii_lowercase();
                match options.keys.iter().find(|(_, k)| format::hex(&k.commitment()) == commitment) {
                    Some((dataset, key)) => Some((dataset.clone(), *key)),
                    None => {
                        return fail(
                            self,
                            "its draw came from a noise key that --noise-key does not hold (no key there has its \
                             commitment): the keys given are refused for it; export them all with `pacpriv admin \
                             export --noise-key`"
                                .into(),
                        );
                    }
                }
            }
            _ => None,
        };
        let replayed = match &key {
            Some((dataset, key)) => {
                self.dataset.clone_from(dataset);
                let at = Position { dataset, session: &self.session, step: e.version };
                replay::replay_keyed(&mut state, &recorded, key, &at)
            }
            None => replay::replay(&mut state, &recorded),
        };
        let verdict = match replayed {
            Ok(replayed) => {
                self.worst = self.worst.max(replayed.mi_bound / s.per_query);
                self.slack += replayed.slack;
                let mut exact = None;
                match &replayed.evidence {
                    Some(evidence) => {
                        audit.add(evidence);
                        // Left to the bets where honest noise rounds to it now and then.
                        exact = (evidence.exact && evidence.exact_chance <= noise_audit::EXACT_FINDING).then(|| {
                            "its release equals a teacher's output exactly, although the teachers disagree and \
                             noise the 2^-32 grid resolves was due: it was released without noise"
                                .to_owned()
                        });
                    }
                    None => self.exact_steps += 1,
                }
                let keyed_finding = self.key_audit(&replayed, &s.noise_key, keyed, line);
                // Said once a session: its other steps are alike.
                let unkeyed = (s.noise_key.is_empty()
                    && replayed.evidence.is_some()
                    && !options.allow_unkeyed
                    && !std::mem::replace(&mut self.unkeyed_said, true))
                .then(|| {
                    "its draw commits to no noise key, although every noisy release of this pacpriv version \
                     commits to its dataset's: nothing ties it, or the session's later such steps, to a key the key \
                     audit could check; if the store holds steps from before committed noise (export format 3), \
                     verify with --allow-unkeyed to audit them statistically only"
                        .to_owned()
                });
                // Steps drawn from a key journal their basis path too (the
                // same format): without it the audit would fall back to the
                // looser rule for either basis.
                let pathless = (matches!(outputs, TeacherOutputs::Vectors(_))
                    && !s.noise_key.is_empty()
                    && recorded.path.is_none()
                    && replayed.evidence.is_some())
                .then(|| {
                    "its draw committed to a noise key but it journals no basis path, as every such step does"
                        .to_owned()
                });
                let checked = match replayed.unchecked {
                    Some(_) if options.allow_unchecked => {
                        self.unchecked.push(line);
                        None
                    }
                    Some(why) => Some(unchecked(why)),
                    None => None,
                };
                let found: Vec<String> =
                    checked.into_iter().chain(exact).chain(pathless).chain(unkeyed).chain(keyed_finding).collect();
                if found.is_empty() { Ok(()) } else { Err(found.join("; and ")) }
            }
            Err(mismatch) => match replay::apply_recorded(&mut state, &recorded) {
                Ok(()) => Err(mismatch.to_string()),
                Err(_) => return fail(self, mismatch.to_string()),
            },
        };
        if let Some(digest) = entry.step.map(|s| s.digest).filter(|d| !d.is_empty()) {
            self.answered.insert(digest, (s.label, s.published.clone()));
        }
        self.limit = s.limit;
        self.state = Some(state);
        let altered = self.follow(&entry.chain, computed);
        self.version = e.version;
        with_altered(altered, verdict)
    }

    /// The keyed audit of a replayed step whose journal recorded the noise
    /// key commitment `commitment` (hex; empty: drawn before keys): counts
    /// it, narrows the dataset's teachers in `keyed` (those that matched
    /// every keyed step so far) to the step's matching ones, and bets on
    /// its draw's alignment (at `line`). What it finds wrong.
    fn key_audit(
        &mut self,
        replayed: &replay::Replayed,
        commitment: &str,
        keyed: &mut KeyedSoFar,
        line: usize,
    ) -> Option<String> {
        let Some(check) = &replayed.key else {
            // An exact step drew nothing: nothing to check.
            replayed.evidence.as_ref()?;
            self.statistical_steps += 1;
            // Named with or without the key given (M1 of the second review).
            return (commitment.is_empty() && !self.commitment.is_empty()).then(|| {
                "its draw was not taken from the noise key, although earlier steps of the session were: it can only \
                 be audited statistically"
                    .to_owned()
            });
        };
        self.keyed_steps += 1;
        self.undetectable = self.undetectable.max(check.undetectable);
        self.unresolved += check.unresolved as u64;
        if check.matching.is_empty() {
            return Some(format!(
                "its release is no teacher's output plus the noise key's draw at this step, in some direction of Σ: \
                 it carries other noise than the key gives (this step's check sees its noise scaled by any c below \
                 1 − {:.1e})",
                check.undetectable
            ));
        }
        if let Some(a) = check.alignment {
            let (bets, last) = keyed.sessions.entry(self.session.clone()).or_default();
            bets.add(a);
            *last = line;
        }
        let so_far = keyed.teachers.entry(self.dataset.clone()).or_insert_with(|| check.matching.clone());
        so_far.retain(|t| check.matching.contains(t));
        so_far.is_empty().then(|| {
            format!(
                "its release is one teacher's output plus the key's noise, but not the output of any teacher that \
                 every earlier keyed step of dataset {:?} matched: the releases are not all centred on one secret \
                 teacher",
                self.dataset
            )
        })
    }

    /// Compares the stored record (at `line`) with the replayed end state;
    /// every difference found.
    fn finish(self, record: &RecordLine, line: usize) -> Result<Verified, Vec<String>> {
        if self.broken {
            // Said at the gap.
            return Err(Vec::new());
        }
        let mut problems = Vec::new();
        if record.version != self.version {
            problems.push(if self.version == 0 {
                format!("its record is at version {} but none of its steps is journaled", record.version)
            } else {
                format!("its record is at version {}, its journal ends at {}", record.version, self.version)
            });
        }
        if record.journal_events != self.events {
            problems
                .push(format!("its record counts {} events, its journal has {}", record.journal_events, self.events));
        }
        // A record written before its session's first journaled item may
        // carry no head at all.
        let fresh = self.version == 0 && self.events == 0;
        if record.journal_head != format::hex(&self.head) && !(fresh && record.journal_head.is_empty()) {
            problems.push("its record's chain head is not its journal's last chain hash".into());
        }
        let noise = self.audit.as_ref().map_or_else(|| NoiseAudit::new(0).verdict(), NoiseAudit::verdict);
        // Committed steps can be checked exactly with the key; steps from
        // before keys only warn (`audit::write`).
        if noise.steps > 0 && noise.untested() && self.keyed_steps < noise.steps && !self.commitment.is_empty() {
            problems.push(format!(
                "{} of its noisy step{} were charged b and audited statistically, but no direction of their noise \
                 could be tested (each weak, below the 2^-32 grid's resolution, or clamped): nothing shows they \
                 carried noise; verify with the dataset's --noise-key to check them exactly",
                noise.steps - self.keyed_steps,
                plural(noise.steps - self.keyed_steps)
            ));
        }
        let Some(state) = self.state else {
            if !problems.is_empty() {
                return Err(problems);
            }
            return Ok(Verified {
                session: self.session,
                steps: 0,
                cache_hits: self.cache_hits,
                refusals: self.refusals,
                charged: 0,
                spent: record.spent,
                limit: record.limit,
                worst_certificate: 0.0,
                unchecked: self.unchecked,
                update_slack: 0.0,
                noise,
                audit: None,
                commitment: self.commitment,
                line,
                exact_steps: 0,
                keyed_steps: 0,
                statistical_steps: 0,
                undetectable: 0.0,
                unresolved: 0,
            });
        };
        let l = &state.ledger;
        let same = |a: f64, b: f64| a.to_bits() == b.to_bits();
        if !same(l.spent().get(), record.spent) || l.answered() != record.answered || l.charged() != record.charged {
            problems.push(format!(
                "its record says spent {:e} nats in {} answers ({} charged); the journal adds up to {:e} in {} ({})",
                record.spent,
                record.answered,
                record.charged,
                l.spent().get(),
                l.answered(),
                l.charged()
            ));
        }
        let stored = Form::from_fields(record.log_weights.clone(), record.weights.clone());
        if !stored.is_some_and(|f| f.same_bits(state.posterior.form())) {
            problems.push("its record's posterior is not the one its journal replays to".into());
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Verified {
            session: self.session,
            steps: self.version,
            cache_hits: self.cache_hits,
            refusals: self.refusals,
            charged: l.charged(),
            spent: l.spent().get(),
            limit: self.limit,
            worst_certificate: self.worst,
            unchecked: self.unchecked,
            update_slack: self.slack,
            noise,
            audit: self.audit,
            commitment: self.commitment,
            line,
            exact_steps: self.exact_steps,
            keyed_steps: self.keyed_steps,
            statistical_steps: self.statistical_steps,
            undetectable: self.undetectable,
            unresolved: self.unresolved,
        })
    }
}

/// Why a step's update could not be checked, as a finding.
fn unchecked(why: Unchecked) -> String {
    format!("{why} (--allow-unchecked lists such steps instead of failing)")
}

/// An item's finding: `checked`'s, after [`ALTERED`] when its hash did
/// not match.
fn with_altered(altered: bool, checked: Result<(), String>) -> Result<(), String> {
    match (altered, checked) {
        (true, Ok(())) => Err(ALTERED.into()),
        (true, Err(what)) => Err(format!("{ALTERED}; and {what}")),
        (false, checked) => checked,
    }
}

/// What a chain hash that does not match means.
const ALTERED: &str = "its chain hash does not match: this record, or one before it, was altered, inserted or removed";

/// The teachers' outputs a step records.
fn outputs(s: &format::StepLine) -> Result<TeacherOutputs, String> {
    match (s.classes, s.dim) {
        (classes, 0) if classes > 0 => Ok(TeacherOutputs::Labels {
            labels: s.labels.iter().map(|&l| l as usize).collect(),
            classes: classes as usize,
        }),
        (0, dim) if dim > 0 && s.vectors.len().is_multiple_of(dim as usize) => {
            let m = s.vectors.len() / dim as usize;
            Array2::from_shape_vec((m, dim as usize), s.vectors.clone())
                .map(TeacherOutputs::Vectors)
                .map_err(|e| e.to_string())
        }
        _ => Err("the step records neither labels (classes, labels) nor vectors (dim, m × dim values)".into()),
    }
}
