//! `pacpriv utility`: what the privacy costs in accuracy, and how far a
//! budget goes under each charging policy, on the demo ensemble.
//!
//! Trains the demo teachers in-process exactly as `pacpriv serve` does
//! (same m and seed from the configuration), then runs the real mechanism
//! over the held-out split, as in the paper's §6.2: for each per-query
//! budget b, fresh sessions (uniform posterior, secret teacher drawn
//! uniformly, random query order, noise from the service's CSPRNG) answer
//! every held-out example once (Table 3's accuracy), and answer repeated
//! random passes until their first refusal under `paper` and under
//! `contested` (answers a total budget B buys). The simulations are in
//! [`sim`]; this file is argument handling and the report.

pub mod sim;

use super::budget::{PerQuery, parse_nats, parse_per_query};
use crate::demo_model::DemoModel;
use anyhow::Context;
use pacpriv_demo::{Teacher, Trained};
use pacpriv_privacy::ledger::Policy;
use pacpriv_privacy::{Nats, PrivacyError, report};
use pacpriv_service::session::Scope;
use pacpriv_service::settings::Settings;
use sim::{Forecast, Refusal, Summary, Votes};
use std::io::Write;
use std::path::PathBuf;

/// Table 3's per-query budgets, 2⁻⁴ … 2⁻³².
const DEFAULT_PER_QUERY: &str = "2^-4,2^-8,2^-12,2^-16,2^-20,2^-24,2^-28,2^-32";

/// The principal whose budget is the default `--budget-mi`.
const DEMO_PRINCIPAL: &str = "demo";

/// Arguments of `pacpriv utility`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A TOML file layered over the built-in `config/default.toml`
    /// (`PACPRIV__SECTION__KEY` environment variables override both), as
    /// for `pacpriv serve`: demo.models and demo.seed choose the ensemble,
    /// principals.demo.budget_mi the default --budget-mi.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// The model to measure, `NAME` (its newest version) or `NAME@V`
    /// (default: the default model's newest version): its demo teachers
    /// are trained as the server trains them.
    #[arg(long, default_value = "", value_name = "MODEL")]
    pub model: String,

    /// Per-query MI budgets b to compare, comma-separated, each a decimal
    /// (0.0039) or a power of two (2^-32).
    #[arg(long, value_name = "NATS,…", value_parser = parse_per_query, value_delimiter = ',',
          allow_negative_numbers = true, default_value = DEFAULT_PER_QUERY)]
    pub per_query_mi: Vec<PerQuery>,

    /// Total MI budget B for the answers-until-refusal table. Default: the
    /// demo principal's budget_mi (privacy.global_budget_mi under
    /// scope = "global").
    #[arg(long, value_name = "NATS", value_parser = parse_budget, allow_negative_numbers = true)]
    pub budget_mi: Option<PerQuery>,

    /// Trials per b, each with a fresh session, secret teacher and query
    /// order.
    #[arg(long, value_name = "N", default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub trials: u32,

    /// Stop a run until refusal after this many answers (then reported as
    /// "≥ N").
    #[arg(long, value_name = "N", default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_queries: u64,

    /// Also write the numbers, one row per b, to this CSV file.
    #[arg(long, value_name = "PATH")]
    pub csv: Option<PathBuf>,
}

/// Parses `--budget-mi` like `--per-query-mi`, naming the right quantity.
fn parse_budget(s: &str) -> Result<PerQuery, PrivacyError> {
    parse_nats(s, "the total MI budget")
}

/// Trains the demo ensemble, runs the trials and prints both tables.
///
/// # Errors
/// Remote teachers or vector mode configured, an invalid b or B, a failed
/// fit, a mechanism error, or a failed write.
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let settings = Settings::load(args.config.as_deref())?;
    // Remote teachers would need their labels for a held-out split, which
    // is out of scope; vector mode is not the paper's Table 3.
    let model = DemoModel::of(&settings, &args.model, "pacpriv utility (the demo ensemble, label mode)")?;
    let (m, seed, classes) = (model.m, model.seed, model.classes);
    let budget = match args.budget_mi {
        Some(b) => b,
        None => default_budget(&settings)?,
    };
    for b in &args.per_query_mi {
        sim::check_per_query(b.nats).with_context(|| format!("--per-query-mi {}", b.given))?;
    }

    tracing::info!(m, seed, model = %model.name, version = %model.version, "training the demo teachers");
    let ensemble = model.train().context("training the demo teachers")?;
    let full = ensemble.full_data_model().map_err(anyhow::Error::msg).context("training the non-private model")?;
    let votes = votes(&ensemble, classes)?;
    let non_private = accuracy_of(&full, &ensemble);

    let runs = Runs { votes: &votes, budget: budget.nats, trials: args.trials, cap: args.max_queries };
    let mut rows = Vec::with_capacity(args.per_query_mi.len());
    for b in &args.per_query_mi {
        tracing::info!(b = %b.given, trials = args.trials, "running");
        rows.push(runs.row(b).with_context(|| format!("b = {}", b.given))?);
    }

    // b does not matter: nothing is ever charged under unanimous_only.
    let any_b = args.per_query_mi.first().map_or(budget.nats, |b| b.nats);
    let unanimous_only =
        sim::unanimous_only_run(&votes, any_b, budget.nats, &mut rand::rng()).context("the unanimous_only run")?;

    let report = Report {
        unanimous_only,
        m,
        seed,
        votes: &votes,
        non_private,
        budget: &budget,
        trials: args.trials,
        cap: args.max_queries,
        rows: &rows,
    };
    report.write(out)?;
    if let Some(path) = &args.csv {
        report.write_csv(path).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The demo principal's budget: the shared session's limit under global
/// scope, else `principals.demo.budget_mi`.
pub(crate) fn default_budget(settings: &Settings) -> anyhow::Result<PerQuery> {
    let nats = match settings.dataset.scope {
        Scope::Global => settings.dataset.global_budget,
        Scope::PerPrincipal => settings
            .principals
            .iter()
            .find(|p| p.name == DEMO_PRINCIPAL)
            .map(|p| p.budget)
            .context("no [principals.demo] in the configuration to take the budget from: pass --budget-mi")?,
    };
    Ok(PerQuery { given: power_of_two(nats), nats })
}

/// `2^e` when `x` is an exact power of two, else its shortest decimal.
pub(crate) fn power_of_two(x: Nats) -> String {
    let v = x.get();
    let e = v.log2().round();
    if v > 0.0 && (-1074.0..=1023.0).contains(&e) && 2f64.powi(e as i32) == v {
        format!("2^{e}")
    } else {
        x.to_string()
    }
}

/// Every teacher's label for every held-out example: exactly what the
/// served demo teacher returns as its `label` output for that image (one
/// image per call, as the service sends them), i.e. what the service
/// privatises in label mode.
fn votes(ensemble: &Trained, classes: usize) -> anyhow::Result<Votes> {
    let test = &ensemble.split.test;
    let labels = ensemble.labels(test);
    let truth = test.iter().map(|e| e.digit).collect();
    Votes::new(labels, truth, classes).context("the demo teachers' labels")
}

/// An example's pixels as the teacher server decodes them (FP32 → f64,
/// exact).
fn pixels(e: &pacpriv_demo::digits::Example) -> Vec<f64> {
    e.pixels.iter().map(|&p| f64::from(p)).collect()
}

/// Held-out accuracy of one model, as a fraction.
fn accuracy_of(model: &Teacher, ensemble: &Trained) -> f64 {
    let test = &ensemble.split.test;
    let correct = test.iter().filter(|e| model.predict(&pixels(e)) == e.digit).count();
    correct as f64 / test.len().max(1) as f64
}

/// What every b is run with.
struct Runs<'a> {
    votes: &'a Votes,
    budget: Nats,
    trials: u32,
    cap: u64,
}

/// One b's results.
struct Row {
    b: PerQuery,
    /// Held-out accuracy in percent over the trials.
    accuracy: Summary,
    /// ⌊B/b⌋ as planned by [`report::max_queries`].
    planned: u64,
    paper: Counts,
    contested: Counts,
    /// What `contested` must give over random orders.
    forecast: Option<Forecast>,
}

/// Answers until refusal over the trials.
struct Counts {
    answered: Summary,
    /// Trials that reached the cap without a refusal.
    capped: usize,
}

impl Runs<'_> {
    fn row(&self, b: &PerQuery) -> anyhow::Result<Row> {
        let n = self.votes.len();
        let correct = on_all_cores(self.trials, |rng| sim::accuracy_trial(self.votes, b.nats, rng))?;
        let accuracy: Vec<f64> = correct.iter().map(|&c| 100.0 * c as f64 / n as f64).collect();
        let paper = self.counts(b.nats, Policy::Paper)?;
        let contested = self.counts(b.nats, Policy::Contested)?;
        let planned = report::max_queries(b.nats, self.budget);
        Ok(Row {
            b: b.clone(),
            accuracy: summary(&accuracy)?,
            planned,
            paper,
            contested,
            forecast: sim::contested_forecast(n as u64, self.votes.unanimous() as u64, planned),
        })
    }

    fn counts(&self, b: Nats, policy: Policy) -> anyhow::Result<Counts> {
        let runs: Vec<Refusal> = on_all_cores(self.trials, |rng| {
            sim::answers_until_refusal(self.votes, b, self.budget, policy, self.cap, rng)
        })?;
        let answered: Vec<f64> = runs.iter().map(|r| r.answered as f64).collect();
        Ok(Counts { answered: summary(&answered)?, capped: runs.iter().filter(|r| !r.refused).count() })
    }
}

fn summary(xs: &[f64]) -> anyhow::Result<Summary> {
    sim::summarize(xs).context("no trials")
}

/// Runs `trial` `n` times, spread over the available cores, each call with
/// its thread's CSPRNG (`rand::rng()`, the generator the service draws its
/// noise from). Results come back in no particular order.
fn on_all_cores<T: Send>(
    n: u32,
    trial: impl Fn(&mut rand::rngs::ThreadRng) -> Result<T, PrivacyError> + Sync,
) -> Result<Vec<T>, PrivacyError> {
    let n = n as usize;
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).clamp(1, n.max(1));
    let trial = &trial;
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                // Thread t runs trials t, t + threads, …
                let mine = (t..n).step_by(threads).count();
                scope.spawn(move || {
                    let mut rng = rand::rng();
                    (0..mine).map(|_| trial(&mut rng)).collect::<Result<Vec<T>, _>>()
                })
            })
            .collect();
        let mut all = Vec::with_capacity(n);
        for h in handles {
            all.extend(h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))?);
        }
        Ok(all)
    })
}

/// Everything the report prints.
struct Report<'a> {
    m: usize,
    seed: u64,
    votes: &'a Votes,
    /// Fraction.
    non_private: f64,
    budget: &'a PerQuery,
    trials: u32,
    cap: u64,
    rows: &'a [Row],
    /// `unanimous_only`: (answered, answered correctly, MI spent).
    unanimous_only: (usize, usize, Nats),
}

impl Report<'_> {
    fn write(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let (m, n) = (self.m, self.votes.len());
        let (unanimous, unanimous_correct) = (self.votes.unanimous(), self.votes.unanimous_correct());
        let pct = |k: usize| 100.0 * k as f64 / n as f64;
        writeln!(
            out,
            "Demo ensemble: optical digits, m = {m} teachers (seed {}); held-out split: {n} examples, {unanimous} \
             unanimous (all {m} teachers agree), {unanimous_correct} unanimous and correct; {} per b.",
            self.seed,
            trials(self.trials)
        )?;
        writeln!(out)?;

        writeln!(out, "#### Test accuracy (%) vs per-query MI budget b")?;
        writeln!(out)?;
        let mut header = "| Dataset | Non-private | b = ∞ |".to_owned();
        let mut rule = "|---|---:|---:|".to_owned();
        let mut row = format!(
            "| Optical digits (m = {m}) | {:.2} | {:.2} |",
            100.0 * self.non_private,
            100.0 * self.votes.serving_accuracy()
        );
        for r in self.rows {
            header += &format!(" b = {} |", r.b.given);
            rule += "---:|";
            row += &format!(" {} |", mean_se(&r.accuracy));
        }
        writeln!(out, "{header} Unanimous |")?;
        writeln!(out, "{rule}---:|")?;
        writeln!(out, "{row} {:.2} |", pct(unanimous))?;
        writeln!(out)?;
        writeln!(
            out,
            "Mean ± standard error over {}, each a fresh session (uniform posterior, secret teacher drawn \
             uniformly) answering every held-out example once in random order. Non-private: one model trained on \
             the whole training split. b = ∞: the serving teacher alone, averaged exactly over the {m} possible \
             secrets. Unanimous: share of held-out queries on which all {m} teachers agree; those are answered \
             exactly, so accuracy cannot fall below the unanimous-and-correct share ({:.2} %) at any b. The \
             charging policy changes what an answer costs, not its noise, so this row holds for `paper` and \
             `contested` alike.",
            trials(self.trials),
            pct(unanimous_correct)
        )?;
        writeln!(out)?;

        let (answered, correct, spent) = self.unanimous_only;
        writeln!(out, "#### Unanimous-only labelling, total budget B = {} nats", self.budget.given)?;
        writeln!(out)?;
        writeln!(
            out,
            "| policy | answered | coverage (%) | accuracy of answers (%) | refused CONTESTED | MI spent (nats) |"
        )?;
        writeln!(out, "|---|---:|---:|---:|---:|---:|")?;
        writeln!(
            out,
            "| unanimous_only | {} | {:.2} | {:.2} | {} | {} |",
            thousands(answered as u64),
            pct(answered),
            100.0 * correct as f64 / answered.max(1) as f64,
            thousands((n - answered) as u64),
            spent.get()
        )?;
        writeln!(out)?;
        writeln!(
            out,
            "`privacy.policy = \"unanimous_only\"`: every held-out example asked once of a fresh session through \
             the real mechanism. The queries all {m} teachers agree on are answered exactly and free; the rest are \
             refused CONTESTED, uncharged. Nothing is spent, so any number of queries can be asked, at any b; \
             the price is coverage."
        )?;
        writeln!(out)?;

        let budget = &self.budget;
        writeln!(out, "#### Answers until refusal, total budget B = {} nats", budget.given)?;
        writeln!(out)?;
        writeln!(out, "| b | paper | contested | ⌊B/b⌋ | contested, expected | contested ÷ paper |")?;
        writeln!(out, "|---|---:|---:|---:|---:|---:|")?;
        for r in self.rows {
            let (expected, ratio) = match r.forecast {
                Some(f) if r.planned == 0 => (thousands_f(f.expected, 1), "∞".to_owned()),
                Some(f) => (thousands_f(f.expected, 1), format!("{:.2}", f.expected / r.planned as f64)),
                None => ("never refused".to_owned(), "∞".to_owned()),
            };
            writeln!(
                out,
                "| {} | {} | {} | {} | {expected} | {ratio} |",
                r.b.given,
                self.count_cell(&r.paper),
                self.count_cell(&r.contested),
                planned_cell(r.planned),
            )?;
        }
        writeln!(out)?;
        writeln!(
            out,
            "paper, contested: answers released before the first refusal (mean [min–max] over {}), a fresh \
             session answering the held-out examples in repeated random passes with the real mechanism. \
             \"≥ {}\" means the run reached --max-queries before any refusal: the budget was not yet spent, not \
             that it never would be. ⌊B/b⌋: what `paper` allows (every answer costs b; T·b rounded up must fit, as `pacpriv budget` plans). contested, expected: the \
             exact mean over random orders when the {} contested queries of each pass cost b and the {unanimous} \
             unanimous ones cost 0, i.e. ⌊B/b⌋ charged answers plus the free ones around them; the last column \
             divides it by ⌊B/b⌋.",
            trials(self.trials),
            thousands(self.cap),
            n - unanimous,
        )?;
        for r in self.rows {
            let paper_min = r.paper.answered.min as u64;
            if r.paper.capped == 0 && paper_min != r.planned {
                writeln!(out)?;
                writeln!(
                    out,
                    "Note: at b = {} the ledger refused after {} answers, not ⌊B/b⌋ = {}: it rounds every \
                     addition up, and b is not a power of two.",
                    r.b.given,
                    thousands(paper_min),
                    thousands(r.planned)
                )?;
            }
        }
        Ok(())
    }

    /// A count over the trials: exact when every trial agrees, mean
    /// [min–max] otherwise, "≥ cap" when the cap was reached.
    fn count_cell(&self, c: &Counts) -> String {
        let s = &c.answered;
        if c.capped as u32 == self.trials {
            format!("≥ {}", thousands(self.cap))
        } else if c.capped > 0 {
            // Capped runs count as the cap: the mean is a lower bound.
            format!("≥ {}", thousands_f(s.mean, 1))
        } else if s.min == s.max {
            thousands(s.min as u64)
        } else {
            format!("{} [{}–{}]", thousands_f(s.mean, 1), thousands(s.min as u64), thousands(s.max as u64))
        }
    }

    fn write_csv(&self, path: &std::path::Path) -> anyhow::Result<()> {
        let mut w = csv::Writer::from_path(path)?;
        let n = self.votes.len() as f64;
        let base = |b: &str, accuracy: f64| CsvRow {
            b: b.to_owned(),
            accuracy_pct: Some(accuracy),
            budget_nats: self.budget.nats.get(),
            unanimous_pct: 100.0 * self.votes.unanimous() as f64 / n,
            unanimous_correct_pct: 100.0 * self.votes.unanimous_correct() as f64 / n,
            trials: self.trials,
            max_queries: self.cap,
            ..CsvRow::default()
        };
        w.serialize(base("non-private", 100.0 * self.non_private))?;
        w.serialize(base("inf", 100.0 * self.votes.serving_accuracy()))?;
        for r in self.rows {
            w.serialize(CsvRow {
                b_nats: Some(r.b.nats.get()),
                accuracy_se_pct: r.accuracy.se,
                planned_answers: Some(r.planned),
                paper_answers_mean: Some(r.paper.answered.mean),
                paper_answers_min: Some(r.paper.answered.min as u64),
                paper_answers_max: Some(r.paper.answered.max as u64),
                paper_capped_trials: Some(r.paper.capped),
                contested_answers_mean: Some(r.contested.answered.mean),
                contested_answers_min: Some(r.contested.answered.min as u64),
                contested_answers_max: Some(r.contested.answered.max as u64),
                contested_capped_trials: Some(r.contested.capped),
                contested_expected: r.forecast.map(|f| f.expected),
                ..base(&r.b.given, r.accuracy.mean)
            })?;
        }
        w.flush()?;
        Ok(())
    }
}

/// One CSV line: a b (or the `non-private` / `inf` baselines, which only
/// have an accuracy). Empty cells: not applicable.
#[derive(Default, serde::Serialize)]
struct CsvRow {
    b: String,
    b_nats: Option<f64>,
    accuracy_pct: Option<f64>,
    accuracy_se_pct: Option<f64>,
    budget_nats: f64,
    planned_answers: Option<u64>,
    paper_answers_mean: Option<f64>,
    paper_answers_min: Option<u64>,
    paper_answers_max: Option<u64>,
    paper_capped_trials: Option<usize>,
    contested_answers_mean: Option<f64>,
    contested_answers_min: Option<u64>,
    contested_answers_max: Option<u64>,
    contested_capped_trials: Option<usize>,
    contested_expected: Option<f64>,
    unanimous_pct: f64,
    unanimous_correct_pct: f64,
    trials: u32,
    max_queries: u64,
}

/// ⌊B/b⌋, marked as a lower bound when it saturated `u64`.
fn planned_cell(planned: u64) -> String {
    if planned == u64::MAX { format!("≥ {}", thousands(planned)) } else { thousands(planned) }
}

/// `N trials`, or `1 trial`.
fn trials(n: u32) -> String {
    if n == 1 { "1 trial".to_owned() } else { format!("{n} trials") }
}

/// `91.23 ± 0.05` (percent, two decimals); the mean alone for one trial.
fn mean_se(s: &Summary) -> String {
    match s.se {
        Some(se) => format!("{:.2} ± {se:.2}", s.mean),
        None => format!("{:.2}", s.mean),
    }
}

/// `1234567` → `1,234,567`.
fn thousands(n: impl Into<u128>) -> String {
    let n: u128 = n.into();
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A non-negative `x` with `decimals` decimals and grouped thousands.
fn thousands_f(x: f64, decimals: usize) -> String {
    let s = format!("{x:.decimals$}");
    match s.split_once('.') {
        Some((int, frac)) => match int.parse::<u128>() {
            Ok(i) => format!("{}.{frac}", thousands(i)),
            Err(_) => s,
        },
        None => s.parse::<u128>().map_or(s, thousands),
    }
}

#[cfg(test)]
mod test;
