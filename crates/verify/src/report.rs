//! What `pacpriv verify` prints: a line per verified session, the
//! statistical and key audits' tables, and the total ([`run`]).

use super::{Args, Options, audit, check, dataset_names, keys};
use crate::plural;
use pacpriv_privacy::noise_audit::{NoiseAudit, Verdict};
use pacpriv_privacy::{Nats, report};
use std::collections::BTreeMap;
use std::io::Write;

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
    /// Its keyed vector steps that record no calibration rules, held to
    /// the older ones (`--allow-unversioned`).
    pub unversioned_steps: u64,
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
        allow_unversioned: args.allow_unversioned,
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
    for s in sessions.iter().filter(|s| s.unversioned_steps > 0) {
        writeln!(
            out,
            "warning: session {:?}: {} keyed vector step{} recording no calibration rules, held to the older ones \
             (--allow-unversioned): for each, a server had two basis paths, and so two Σ, open for the same outputs",
            s.session,
            s.unversioned_steps,
            plural(s.unversioned_steps)
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
