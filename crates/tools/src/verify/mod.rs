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
//! repeat repeats an answered query); and the session's stored record
//! equals the replayed end state bit for bit (posterior, spent, counts,
//! chain head, events). The first record that does not match is named by
//! its line and the command exits with 65 (`EX_DATAERR`).
//!
//! What cannot be checked is not passed: a step whose release sits at the
//! clamp on a noisy coordinate leaves its posterior update unchecked
//! ([`pacpriv_privacy::replay::Replayed::unchecked`]), and such a step fails
//! like a mismatch unless `--allow-unchecked` is given, which lists every
//! such line instead. Argument: `docs/assurance/accounting.md` §9.

pub mod format;

use crate::plural;
use format::{EntryLine, EventLine, Line, RecordLine};
use ndarray::Array2;
use pacpriv_privacy::ledger::{Ledger, Policy};
use pacpriv_privacy::mechanism::{SessionState, TeacherOutputs};
use pacpriv_privacy::posterior::{Form, Posterior, UpdateRule};
use pacpriv_privacy::replay::{self, Recorded};
use pacpriv_privacy::{Nats, PrivacyError, report};
use pacpriv_service::store::JournalEntry;
use pacpriv_service::store::record::EventKind;
use std::collections::HashMap;
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
    /// the ±2^20 clamp) and list their lines, instead of failing at the
    /// first one. What those steps applied to the posterior is then taken
    /// on trust.
    #[arg(long)]
    pub allow_unchecked: bool,
}

/// The first record that does not match.
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: {what}")]
pub struct Failed {
    /// The export.
    pub file: String,
    /// Its line, from 1.
    pub line: usize,
    /// What did not match.
    pub what: String,
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
    /// (only with `--allow-unchecked`; otherwise the first one fails).
    pub unchecked: Vec<usize>,
}

/// Checks `args.file`, prints one line per session and a total.
///
/// # Errors
/// [`Failed`] for the first record that does not match; I/O.
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let name = args.file.display().to_string();
    let allow = args.allow_unchecked;
    let sessions = if name == "-" {
        check(std::io::stdin().lock(), &name, allow)?
    } else {
        let file =
            std::fs::File::open(&args.file).map_err(|e| anyhow::anyhow!("cannot read the export {name}: {e}"))?;
        check(std::io::BufReader::new(file), &name, allow)?
    };
    writeln!(
        out,
        "session\tsteps\tcache_hits\trefusals\tcharged\tspent_nats\tlimit_nats\tmia_bound\tmax_certificate_over_b"
    )?;
    for s in &sessions {
        let mia = Nats::new(s.spent).map(report::mia_bound).unwrap_or(1.0);
        writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}\t{:e}\t{:e}\t{:.6}\t{:.6}",
            s.session, s.steps, s.cache_hits, s.refusals, s.charged, s.spent, s.limit, mia, s.worst_certificate
        )?;
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
             posterior, cache hit and refusal re-derived"
        )?;
    } else {
        writeln!(
            out,
            "verified with {} unchecked: {steps} steps and {events} event{e} of {n} session{s}; every charge, \
             cache hit and refusal re-derived, but the posterior updates of these steps were taken on trust (their \
             release sits at the ±2^20 clamp), and every certificate after them rests on those updates:\n{}",
            unchecked.len(),
            unchecked.join("\n")
        )?;
    }
    Ok(())
}

/// Checks an export read from `reader` (called `file` in messages);
/// `allow_unchecked` lists the steps whose update cannot be checked in
/// [`Verified::unchecked`] instead of failing at the first.
///
/// # Errors
/// [`Failed`] for the first line that does not match.
pub fn check(reader: impl BufRead, file: &str, allow_unchecked: bool) -> Result<Vec<Verified>, Failed> {
    let fail = |line: usize, what: String| Failed { file: file.to_owned(), line, what };
    let mut done: Vec<Verified> = Vec::new();
    let mut current: Option<Replaying> = None;
    let mut lines = 0;
    for (i, text) in reader.lines().enumerate() {
        let n = i + 1;
        lines = n;
        let text = text.map_err(|e| fail(n, format!("unreadable: {e}")))?;
        let line = Line::parse(&text).map_err(|e| fail(n, format!("not a line of a journal export: {e}")))?;
        match (n, line) {
            (1, Line::Header(h)) if h.format == format::FORMAT => {}
            (1, _) => return Err(fail(1, format!("the first line must be {{\"format\":\"{}\"}}", format::FORMAT))),
            (_, Line::Header(_)) => return Err(fail(n, "a second header".into())),
            (_, Line::Entry(e)) => {
                let at = |what| fail(n, format!("session {:?} version {}: {what}", e.session, e.version));
                let c = replaying(&mut current, &done, &e.session).map_err(|what| fail(n, what))?;
                if let Some(coordinate) = c.step(&e).map_err(at)? {
                    if !allow_unchecked {
                        return Err(at(format!(
                            "the release is published at the ±2^20 clamp on coordinate {coordinate}, where the \
                             noise lies, so its exact value and the posterior update recorded with it cannot be \
                             checked (--allow-unchecked lists such steps instead of failing)"
                        )));
                    }
                    c.unchecked.push(n);
                }
            }
            (_, Line::Event(e)) => replaying(&mut current, &done, &e.session)
                .map_err(|what| fail(n, what))?
                .event(&e)
                .map_err(|what| fail(n, format!("session {:?} event {}: {what}", e.session, e.event)))?,
            (_, Line::Session(s)) => {
                let c = match current.take() {
                    Some(c) if c.session == s.session => c,
                    Some(c) => {
                        return Err(fail(
                            n,
                            format!("record of {:?} while {:?}'s entries are open", s.session, c.session),
                        ));
                    }
                    None => Replaying::new(&s.session),
                };
                if done.iter().any(|d| d.session == s.session) {
                    return Err(fail(n, format!("session {:?} appears twice", s.session)));
                }
                done.push(c.finish(&s.record).map_err(|what| fail(n, format!("session {:?}: {what}", s.session)))?);
            }
        }
    }
    match (lines, current) {
        (0, _) => Err(fail(1, "the export is empty".into())),
        (_, Some(c)) => {
            Err(fail(lines, format!("the export ends inside session {:?}: its record line is missing", c.session)))
        }
        (_, None) => Ok(done),
    }
}

/// The session being re-derived, for a line of `session`: the current
/// one, or a new one if the current one's lines ended.
fn replaying<'a>(
    current: &'a mut Option<Replaying>,
    done: &[Verified],
    session: &str,
) -> Result<&'a mut Replaying, String> {
    if let Some(c) = current.as_ref().filter(|c| c.session != session) {
        return Err(format!("session {:?}'s entries end without its record line", c.session));
    }
    if current.is_none() && done.iter().any(|d| d.session == session) {
        return Err(format!("session {session:?} appears twice"));
    }
    Ok(current.get_or_insert_with(|| Replaying::new(session)))
}

/// One session being re-derived.
struct Replaying {
    session: String,
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
}

impl Replaying {
    fn new(session: &str) -> Self {
        Replaying {
            session: session.to_owned(),
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
        }
    }

    /// Checks event `e` (the next item of this session is an event).
    fn event(&mut self, e: &EventLine) -> Result<(), String> {
        if e.event != self.events + 1 {
            return Err(format!("expected event {} next: an event is missing or out of order", self.events + 1));
        }
        if e.after_version != self.version {
            return Err(format!(
                "it says it came after version {}, but follows version {}",
                e.after_version, self.version
            ));
        }
        let event = e.event().ok_or("a hash or digest is not hex")?;
        let chain = event.chained(&self.head);
        if event.chain != chain {
            return Err(ALTERED.into());
        }
        let kind = EventKind::parse(&e.kind).ok_or_else(|| format!("{:?} is not a kind of event", e.kind))?;
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
                if e.need <= 0.0 || ledger.check(nats(e.need)?).is_ok() {
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
        if kind == EventKind::CacheHit {
            self.cache_hits += 1;
        } else {
            self.refusals += 1;
        }
        self.head = chain;
        self.events = e.event;
        Ok(())
    }

    /// Checks entry `e` (the next one of this session) and applies it;
    /// `Some(coordinate)` if its posterior update could not be checked
    /// ([`replay::Replayed::unchecked`]).
    fn step(&mut self, e: &EntryLine) -> Result<Option<usize>, String> {
        if e.version != self.version + 1 {
            return Err(if self.version == 0 {
                format!(
                    "the journal starts at version {}: the steps before it are missing (removed, or never \
                     journaled because store.journal was off then), so the account cannot be re-derived",
                    e.version
                )
            } else {
                format!("expected version {} next: a record is missing or out of order", self.version + 1)
            });
        }
        let entry = e.entry().ok_or("a hash or digest is not hex")?;
        let chain = entry.chained(&self.head);
        if entry.chain != chain {
            return Err(ALTERED.into());
        }
        let s = &e.step;
        let outputs = outputs(s)?;
        let policy: Policy = s.policy.parse().map_err(|e: PrivacyError| e.to_string())?;
        let nats = |x: f64| Nats::new(x).map_err(|e| e.to_string());
        let state = match self.state.take() {
            Some(state) => state,
            None => SessionState {
                posterior: Posterior::uniform(outputs.len()).map_err(|e| e.to_string())?,
                ledger: Ledger::new(nats(s.per_query)?, nats(s.limit)?, policy).map_err(|e| e.to_string())?,
            },
        };
        let l = &state.ledger;
        // b, the limit and the policy are the step's own (a restart may
        // change them); what was spent carries over.
        let ledger = Ledger::restore(nats(s.per_query)?, nats(s.limit)?, policy, l.spent(), l.answered(), l.charged())
            .map_err(|e| e.to_string())?;
        let mut state = SessionState { ledger, ..state };
        let recorded = Recorded {
            outputs: &outputs,
            published: &s.published,
            label: s.label as usize,
            charge: e.charge,
            log_likelihood: &e.log_likelihood,
            update_rule: UpdateRule::from_code(e.update_rule).ok_or_else(|| {
                format!(
                    "posterior update rule {} is not one this release knows; verify with a newer pacpriv",
                    e.update_rule
                )
            })?,
        };
        let replayed = replay::replay(&mut state, &recorded).map_err(|m| m.to_string())?;
        self.worst = self.worst.max(replayed.mi_bound / s.per_query);
        if let Some(digest) = entry.step.map(|s| s.digest).filter(|d| !d.is_empty()) {
            self.answered.insert(digest, (s.label, s.published.clone()));
        }
        self.limit = s.limit;
        self.state = Some(state);
        self.head = chain;
        self.version = e.version;
        Ok(replayed.unchecked)
    }

    /// Compares the stored record with the replayed end state.
    fn finish(self, record: &RecordLine) -> Result<Verified, String> {
        if record.version != self.version {
            return Err(if self.version == 0 {
                format!("its record is at version {} but none of its steps is journaled", record.version)
            } else {
                format!("its record is at version {}, its journal ends at {}", record.version, self.version)
            });
        }
        if record.journal_events != self.events {
            return Err(format!("its record counts {} events, its journal has {}", record.journal_events, self.events));
        }
        // A record written before its session's first journaled item may
        // carry no head at all.
        let fresh = self.version == 0 && self.events == 0;
        if record.journal_head != format::hex(&self.head) && !(fresh && record.journal_head.is_empty()) {
            return Err("its record's chain head is not its journal's last chain hash".into());
        }
        let Some(state) = self.state else {
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
            });
        };
        let l = &state.ledger;
        let same = |a: f64, b: f64| a.to_bits() == b.to_bits();
        if !same(l.spent().get(), record.spent) || l.answered() != record.answered || l.charged() != record.charged {
            return Err(format!(
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
            return Err("its record's posterior is not the one its journal replays to".into());
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
        })
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
