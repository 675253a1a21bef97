//! `pacpriv tune`: privacy-conscious choice of the per-query budget b and
//! the demo teachers' regularisation for a target total budget (the
//! privacy-conscious design paper, §3: choose hyperparameters for the
//! *privatized* utility, not the non-private one).
//!
//! For a total budget B and a workload of T answers, each candidate
//! (regularisation λ, b) is:
//! - *feasible* when the answers B buys at b under the configured policy —
//!   all T charged under `paper`, the contested share under `contested`
//!   (measured on the tuning half) — cover T;
//! - scored by the privatized accuracy of the real mechanism
//!   ([`super::utility::sim::accuracy_trial`]: fresh sessions, secret drawn
//!   uniformly, noise from the CSPRNG) on the *tuning half* of the held-out
//!   split.
//!
//! The choice is the best feasible candidate — or, within two of its
//! standard errors, the one with the smallest b (the same accuracy for
//! less spending). It and the configured default are then scored
//! again, on fresh trials, on the *other half*, which played no part in
//! the choice: the figure to believe.
//!
//! # Invariants
//! - Held-out data only (public in the threat model): the teachers are
//!   trained on their subsets as `serve` trains them; no private example is
//!   scored. Choosing λ does depend on the teachers, as any retraining of
//!   them does; the guarantee of each answer is unchanged (§1 of
//!   `docs/assurance/accounting.md` allows any mechanism per step).

use super::budget::{PerQuery, parse_nats, parse_per_query};
use super::utility::sim::{self, Votes};
use super::utility::{default_budget, power_of_two};
use anyhow::{Context, bail};
use pacpriv_demo::Trained;
use pacpriv_demo::digits::Example;
use pacpriv_privacy::Nats;
use pacpriv_privacy::ledger::Policy;
use pacpriv_service::settings::{Settings, TeacherSource};
use pacpriv_service::teachers::OutputMode;
use std::io::Write;
use std::path::PathBuf;

/// Candidate b: 2⁻⁸ … 2⁻³² in steps of 2⁻².
const DEFAULT_PER_QUERY: &str = "2^-8,2^-10,2^-12,2^-14,2^-16,2^-18,2^-20,2^-22,2^-24,2^-26,2^-28,2^-30,2^-32";

/// Candidate L2 penalties, around the default 0.01.
const DEFAULT_REGULARISATION: &str = "0.001,0.01,0.1,1,10";

/// Arguments of `pacpriv tune`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A TOML file layered over the built-in configuration, as for
    /// `pacpriv serve` (demo.models, demo.seed, the policy and the defaults
    /// compared against come from it).
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// The total MI budget B to plan for (default: the demo principal's
    /// budget_mi).
    #[arg(long, value_name = "NATS", value_parser = parse_budget, allow_negative_numbers = true)]
    pub budget_mi: Option<PerQuery>,

    /// Answers the budget must pay for, T.
    #[arg(long, value_name = "T", default_value_t = 65_536, value_parser = clap::value_parser!(u64).range(1..))]
    pub queries: u64,

    /// Candidate per-query budgets b.
    #[arg(long, value_name = "NATS,…", value_parser = parse_per_query, value_delimiter = ',',
          allow_negative_numbers = true, default_value = DEFAULT_PER_QUERY)]
    pub per_query_mi: Vec<PerQuery>,

    /// Candidate L2 penalties of the demo teachers' fits.
    #[arg(long, value_name = "ALPHA,…", value_delimiter = ',', value_parser = parse_regularisation,
          default_value = DEFAULT_REGULARISATION)]
    pub regularisation: Vec<f64>,

    /// Trials per candidate (each a fresh session and secret).
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub trials: u32,
}

fn parse_budget(s: &str) -> Result<PerQuery, pacpriv_privacy::PrivacyError> {
    parse_nats(s, "the total MI budget")
}

fn parse_regularisation(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(format!("{s:?} is not a positive L2 penalty")),
    }
}

/// One candidate's figures on the tuning half.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// λ.
    pub regularisation: f64,
    /// b as given.
    pub per_query: PerQuery,
    /// Share of tuning examples all teachers agree on.
    pub unanimous: f64,
    /// Answers B buys at b under the policy (expected), capped at 2⁶⁴.
    pub buys: f64,
    /// Whether that covers T.
    pub feasible: bool,
    /// Mean privatized accuracy and its standard error, as fractions.
    pub accuracy: (f64, f64),
}

/// Trains each λ's ensemble, scores every candidate, prints the table, the
/// choice, its check on the evaluation half and the configuration lines.
///
/// # Errors
/// Remote teachers, vector mode, `unanimous_only` (b is never charged), a
/// failed fit, a mechanism error, or no feasible candidate.
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let settings = Settings::load(args.config.as_deref())?;
    let TeacherSource::Demo { models, seed, regularisation: default_lambda, canaries, .. } = settings.model.teachers
    else {
        bail!("pacpriv tune trains the demo teachers; the configuration has teachers.source = \"remote\"");
    };
    let OutputMode::Label { classes } = settings.model.mode else {
        bail!("pacpriv tune plans label mode; the configuration has model.mode = \"vector\"");
    };
    if settings.dataset.policy == Policy::UnanimousOnly {
        bail!(
            "privacy.policy is \"unanimous_only\": nothing is ever charged, so b does not matter; `pacpriv utility` \
             reports its coverage and accuracy"
        );
    }
    let budget = match args.budget_mi.clone() {
        Some(b) => b,
        None => default_budget(&settings)?,
    };
    let default_b = PerQuery { given: power_of_two(settings.dataset.per_query), nats: settings.dataset.per_query };
    let mut lambdas = args.regularisation.clone();
    if !lambdas.contains(&default_lambda) {
        lambdas.push(default_lambda);
    }
    let mut bs = args.per_query_mi.clone();
    if !bs.iter().any(|b| b.nats == default_b.nats) {
        bs.push(default_b.clone());
    }
    for b in &bs {
        sim::check_per_query(b.nats).with_context(|| format!("--per-query-mi {}", b.given))?;
    }

    let mut rng = rand::rng();
    let mut candidates = Vec::new();
    let mut halves = Vec::new();
    for &lambda in &lambdas {
        tracing::info!(models, lambda, "training the demo teachers");
        let ensemble = Trained::train_with_canaries(models, seed, lambda, canaries)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("training with regularisation {lambda}"))?;
        let (tuning, evaluation) = halves_of(&ensemble, classes)?;
        let unanimous = tuning.unanimous() as f64 / tuning.len() as f64;
        for b in &bs {
            let charged_share = if settings.dataset.policy == Policy::Paper { 1.0 } else { 1.0 - unanimous };
            let buys =
                if charged_share == 0.0 { f64::INFINITY } else { budget.nats.get() / (b.nats.get() * charged_share) };
            let accuracy = score(&tuning, b.nats, args.trials, &mut rng)?;
            candidates.push(Candidate {
                regularisation: lambda,
                per_query: b.clone(),
                unanimous,
                buys,
                feasible: buys >= args.queries as f64,
                accuracy,
            });
        }
        halves.push((lambda, evaluation));
    }

    // The best feasible candidate, then the smallest b within two of its
    // standard errors: the same accuracy for less spending.
    let best = candidates
        .iter()
        .filter(|c| c.feasible)
        .max_by(|a, b| a.accuracy.0.total_cmp(&b.accuracy.0))
        .with_context(|| {
            format!(
                "no candidate pays for {} answers within {} nats: raise --budget-mi, lower --queries, or add smaller \
                 --per-query-mi values",
                args.queries, budget.given
            )
        })?;
    let floor = best.accuracy.0 - 2.0 * best.accuracy.1;
    let best = candidates
        .iter()
        .filter(|c| c.feasible && c.accuracy.0 >= floor)
        .min_by(|a, b| {
            a.per_query.nats.get().total_cmp(&b.per_query.nats.get()).then(b.accuracy.0.total_cmp(&a.accuracy.0))
        })
        .unwrap_or(best)
        .clone();
    let default = candidates
        .iter()
        .find(|c| c.regularisation == default_lambda && c.per_query.nats == default_b.nats)
        .cloned()
        .context("the default candidate was scored")?;
    let evaluation_of = |lambda: f64| halves.iter().find(|(l, _)| *l == lambda).map(|(_, v)| v);
    let trials = 4 * args.trials;
    let checked = |c: &Candidate, rng: &mut rand::rngs::ThreadRng| -> anyhow::Result<(f64, f64)> {
        let votes = evaluation_of(c.regularisation).context("the evaluation half")?;
        score(votes, c.per_query.nats, trials, rng)
    };
    let best_eval = checked(&best, &mut rng)?;
    let default_eval = checked(&default, &mut rng)?;

    let report =
        Report { args: &args, models, budget: &budget, policy: settings.dataset.policy, candidates: &candidates };
    report.table(out)?;
    let line = |name: &str, c: &Candidate, eval: (f64, f64)| {
        format!(
            "{name:<8} regularisation {}, b = {}: {:.2} % ± {:.2} on the evaluation half ({trials} fresh trials){}",
            c.regularisation,
            c.per_query.given,
            100.0 * eval.0,
            100.0 * eval.1,
            if c.feasible { String::new() } else { format!("; pays for only {:.0} answers", c.buys) }
        )
    };
    writeln!(out)?;
    writeln!(out, "{}", line("chosen", &best, best_eval))?;
    writeln!(out, "{}", line("default", &default, default_eval))?;
    writeln!(out)?;
    writeln!(
        out,
        "Configuration lines (config file, or PACPRIV__PRIVACY__PER_QUERY_MI / PACPRIV__DEMO__REGULARISATION):"
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "[privacy]\nper_query_mi = \"{}\"\n\n[demo]\nregularisation = {}",
        best.per_query.given, best.regularisation
    )?;
    Ok(())
}

/// The held-out split's teacher votes, cut into a tuning half (even
/// positions) and an evaluation half (odd ones).
fn halves_of(ensemble: &Trained, classes: usize) -> anyhow::Result<(Votes, Votes)> {
    let test = &ensemble.split.test;
    let half = |parity: usize| -> anyhow::Result<Votes> {
        let examples: Vec<Example> = test.iter().skip(parity).step_by(2).cloned().collect();
        let truth = examples.iter().map(|e| e.digit).collect();
        Votes::new(ensemble.labels(&examples), truth, classes).context("the demo teachers' labels")
    };
    Ok((half(0)?, half(1)?))
}

/// Mean privatized accuracy over `trials` fresh sessions, and its standard
/// error.
fn score(votes: &Votes, b: Nats, trials: u32, rng: &mut rand::rngs::ThreadRng) -> anyhow::Result<(f64, f64)> {
    let xs: Vec<f64> = (0..trials)
        .map(|_| sim::accuracy_trial(votes, b, rng).map(|c| c as f64 / votes.len() as f64))
        .collect::<Result<_, _>>()?;
    let s = sim::summarize(&xs).context("no trials")?;
    Ok((s.mean, s.se.unwrap_or(0.0)))
}

struct Report<'a> {
    args: &'a Args,
    models: usize,
    budget: &'a PerQuery,
    policy: Policy,
    candidates: &'a [Candidate],
}

impl Report<'_> {
    fn table(&self, out: &mut dyn Write) -> std::io::Result<()> {
        writeln!(
            out,
            "Tuning for B = {} nats over T = {} answers, policy {}: demo ensemble of m = {} teachers, held-out split \
             halved (tuning / evaluation), {} trials per candidate.",
            self.budget.given, self.args.queries, self.policy, self.models, self.args.trials
        )?;
        writeln!(out)?;
        writeln!(
            out,
            "| regularisation | unanimous (%) | b | answers B buys | pays for T | privatized accuracy (%) |"
        )?;
        writeln!(out, "|---:|---:|---|---:|:---:|---:|")?;
        for c in self.candidates {
            let buys = if c.buys.is_finite() { format!("{:.0}", c.buys.floor()) } else { "∞".to_owned() };
            writeln!(
                out,
                "| {} | {:.2} | {} | {buys} | {} | {:.2} ± {:.2} |",
                c.regularisation,
                100.0 * c.unanimous,
                c.per_query.given,
                if c.feasible { "yes" } else { "no" },
                100.0 * c.accuracy.0,
                100.0 * c.accuracy.1
            )?;
        }
        Ok(())
    }
}
