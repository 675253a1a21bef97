//! `pacpriv audit --canaries`: a membership audit with planted canaries
//! (`../shared/papers/auditing-private-prediction.txt`), scored against
//! what the session was charged.
//!
//! The server's demo teachers are trained with `demo.canaries` canaries
//! (random images with their own labels, [`digits::canaries`](pacpriv_demo::digits::canaries)), each in
//! exactly half of the m subsets, so whether a canary is in the secret
//! subset S* is a fair coin. Teachers that trained on a canary answer it
//! with its label; the others almost never do. The attack asks each
//! canary `--repeat` times as itself (repeats are answered from the
//! session's cache: the same release, checked, nothing new) and
//! `--natural` times perturbed (each pixel moved by at most one count:
//! fresh queries, charged), and guesses "member" when most of the labels
//! released for it are the canary's own.
//!
//! It reports, beside the MI the session was charged (B) and the Table-1
//! (Eq. 2) bound on any adversary's success at B:
//! - the guesses' accuracy against the true S* (from the operator's secret
//!   index file, never used by the guesses) and its one-sided 95 %
//!   Clopper–Pearson lower bound p̲, treating the K canaries' memberships
//!   as independent fair coins;
//! - the information that accuracy implies: any guess with success p
//!   needs I(S; transcript) ≥ KL(Bern(p) ‖ Bern(½)) (Eq. 2 read the other
//!   way), so KL(p̲) is a 95 % lower bound on the information leaked;
//! - a direct estimate ln m + ln w_T(s*) of I(S; transcript) from the
//!   adversary's posterior (Eq. 4 replayed on the published releases, as
//!   `pacpriv audit` does), one sample of ln m + E[ln P_T(s*)].
//!
//! A lower bound above what was charged means the mechanism released more
//! than its accounting says: the command then fails. `tests/it/canaries.rs`
//! runs it against the real server and against a deliberately under-noised
//! build (`pacpriv-undernoised`), which it catches.

use super::{check_fresh, get_budget, stream_error};
use crate::connect;
use crate::demo_model::DemoModel;
use anyhow::{Context, bail};
use chacha20::ChaCha20Rng;
use pacpriv_demo::digits::Example;
use pacpriv_privacy::attack;
use pacpriv_privacy::grid::PUBLISHED_GRID;
use pacpriv_privacy::posterior::Posterior;
use pacpriv_privacy::report;
use pacpriv_privacy::{Nats, PrivacyError};
use pacpriv_service::proto::pacpriv::PredictRequest;
use pacpriv_service::proto::pacpriv::privatizer_client::PrivatizerClient;
use pacpriv_service::settings::Settings;
use plotters::prelude::*;
use rand::RngExt;
use statrs::distribution::{Beta, ContinuousCDF};
use std::io::Write;
use std::path::Path;
use tonic::metadata::MetadataValue;

/// Confidence of the Clopper–Pearson bound.
pub const CONFIDENCE: f64 = 0.95;

/// The one-sided Clopper–Pearson lower bound on a success probability
/// after `successes` of `trials`, at [`CONFIDENCE`]: the p whose
/// Binomial(trials, p) gives ≥ `successes` with probability 1 − CONFIDENCE,
/// i.e. the (1 − CONFIDENCE) quantile of Beta(successes, trials − successes + 1).
///
/// # Errors
/// successes > trials.
pub fn clopper_pearson_lower(successes: u64, trials: u64) -> Result<f64, PrivacyError> {
    if successes > trials {
        return Err(PrivacyError::Domain(format!("{successes} successes in {trials} trials")));
    }
    if successes == 0 {
        return Ok(0.0);
    }
    let beta = Beta::new(successes as f64, (trials - successes + 1) as f64)
        .map_err(|e| PrivacyError::Domain(e.to_string()))?;
    Ok(beta.inverse_cdf(1.0 - CONFIDENCE))
}

/// The least information (nats) any membership guess with success
/// probability `p` needs: KL(Bern(p) ‖ Bern(½)) for p > ½, else 0.
pub fn implied_information(p: f64) -> f64 {
    if p > 0.5 { report::kl_from_half(p.min(1.0)) } else { 0.0 }
}

/// One row of the report: after the first `canaries` canaries.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Canaries attacked so far.
    pub canaries: u64,
    /// Answers released (fresh, charged or exact).
    pub answers: u64,
    /// MI charged, nats.
    pub spent: f64,
    /// Eq. 2 at `spent`.
    pub bound: f64,
    /// Guesses right so far.
    pub correct: u64,
    /// Their Clopper–Pearson lower bound.
    pub accuracy_lower: f64,
    /// KL of that bound: information leaked, lower bound.
    pub implied: f64,
    /// ln m + ln w_T(s*).
    pub direct: f64,
}

/// Runs the canary audit for `args`; prints the table, writes the CSV and
/// the SVG.
///
/// # Errors
/// Configuration (no canaries, no secret file), connection, a session that
/// is not fresh — and a lower bound above what was charged.
pub fn run(args: &super::Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let settings = Settings::load(args.config.as_deref())?;
    let model = DemoModel::of(&settings, &args.model, "the canary audit")?;
    let (models, k, classes) = (model.m, model.canaries, model.classes);
    if k == 0 {
        bail!(
            "the configuration plants no canaries: serve and audit with demo.canaries > 0 \
             (PACPRIV__DEMO__CANARIES=32) — an audit deployment, not a production one"
        );
    }
    let Some(secret_file) = args.secret_index_file.as_deref() else {
        bail!("the canary audit scores its guesses against the truth: pass --secret-index-file");
    };
    let secret = pacpriv_service::session::secret::read(secret_file, models)?;
    let key = match args.api_key.clone() {
        Some(k) => k,
        None => std::env::var("PACPRIV_API_KEY").context("pass --api-key or set PACPRIV_API_KEY")?,
    };

    eprintln!("training the {models} demo teachers with {k} canaries (the adversary knows them) ...");
    let ensemble = model.train()?;
    let n = ensemble.split.train.len();
    let first = n - k;
    let mut rng = super::rng(args.seed);
    // Per canary: itself (asked `repeat` times), then `natural` neighbours.
    let repeat = args.repeat.max(2) as usize;
    let natural = args.natural as usize;
    let asked: Vec<Vec<Example>> = ensemble.split.train[first..]
        .iter()
        .map(|c| std::iter::once(c.clone()).chain((0..natural).map(|_| neighbour(c, &mut rng))).collect())
        .collect();
    let labels: Vec<Vec<Vec<usize>>> = asked.iter().map(|qs| ensemble.labels(qs)).collect();

    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let rows = runtime.block_on(async {
        let channel = connect::channel(&args.addr, &args.tls, "the pacpriv server").await?;
        let mut client = PrivatizerClient::new(channel);
        let key = MetadataValue::try_from(key.as_str()).context("the API key is not valid metadata")?;
        let start = get_budget(&mut client, &key).await?;
        check_fresh(&start)?;
        let b = Nats::new(start.per_query).context("the server reported an invalid per-query MI")?;
        let requests: Vec<PredictRequest> = asked
            .iter()
            .enumerate()
            .flat_map(|(c, qs)| {
                let itself = (0..repeat).map(move |r| (format!("canary-{c}-self-{r}"), &qs[0]));
                let around = qs.iter().enumerate().skip(1).map(move |(j, q)| (format!("canary-{c}-near-{j}"), q));
                itself.chain(around)
            })
            .map(|(id, q)| super::request(id, &q.pixels, &model))
            .collect();
        let mut request = tonic::Request::new(tokio_stream::iter(requests));
        request.metadata_mut().insert("x-api-key", key.clone());
        let mut responses = client.predict_stream(request).await.map_err(stream_error)?.into_inner();

        let mut posterior = Posterior::uniform(models)?;
        let marks = super::checkpoints(k, args.checkpoints.min(k));
        let (mut rows, mut correct, mut answers, mut spent) = (Vec::new(), 0u64, 0u64, start.spent);
        for (c, canary) in ensemble.split.train[first..].iter().enumerate() {
            let mut released = Vec::new();
            let mut own: Option<Vec<f64>> = None;
            for q in (0..repeat).map(|_| 0).chain(1..=natural) {
                let response = match responses.message().await {
                    Ok(Some(r)) => r,
                    Ok(None) => bail!("the server ended the stream at canary {c}"),
                    Err(status) => return Err(stream_error(status)),
                };
                if response.noisy.len() != classes {
                    bail!("the server returned {} noisy values for {classes} classes", response.noisy.len());
                }
                spent = response.budget.as_ref().map_or(spent, |b| b.spent);
                if response.cached {
                    if own.as_ref() != Some(&response.noisy) {
                        bail!("canary {c}: a repeat was answered with another release than the first");
                    }
                    continue;
                }
                attack::observe_label_release(
                    &mut posterior,
                    &labels[c][q],
                    classes,
                    b,
                    &response.noisy,
                    PUBLISHED_GRID / 2.0,
                )?;
                answers += 1;
                released.push(response.label as usize);
                if q == 0 {
                    own = Some(response.noisy);
                }
            }
            let guess = 2 * released.iter().filter(|&&l| l == canary.digit).count() > released.len();
            correct += u64::from(guess == ensemble.assignment.contains(secret, first + c));
            if marks.contains(&(c + 1)) {
                let accuracy_lower = clopper_pearson_lower(correct, c as u64 + 1)?;
                rows.push(Row {
                    canaries: c as u64 + 1,
                    answers,
                    spent,
                    bound: report::mia_bound(Nats::new(spent)?),
                    correct,
                    accuracy_lower,
                    implied: implied_information(accuracy_lower),
                    direct: (models as f64).ln() + posterior.log_weights()[secret],
                });
            }
        }
        anyhow::Ok(rows)
    })?;

    write_report(out, &rows, models, k)?;
    write_csv(&args.csv, &rows)?;
    plot(&args.plot, &rows)?;
    writeln!(out, "\nwrote {} and {}", args.csv.display(), args.plot.display())?;
    // One test, at the end (the rows before it are shown, not tested: each
    // is a 95 % bound, and testing all would raise the false-alarm rate).
    if let Some(bad) = rows.last().filter(|r| r.implied > r.spent) {
        bail!(
            "over {} canaries the guesses' accuracy implies at least {:.4e} nats leaked (95 % confidence), more \
             than the {:.4e} nats charged: the mechanism released more than its accounting says — do not serve \
             this build or configuration",
            bad.canaries,
            bad.implied,
            bad.spent
        );
    }
    Ok(())
}

/// `c` with each pixel moved by −1, 0 or +1 (kept in 0–16): a natural
/// query near the canary, new to the server.
fn neighbour(c: &Example, rng: &mut ChaCha20Rng) -> Example {
    let mut e = c.clone();
    for p in &mut e.pixels {
        *p = (*p + f32::from(rng.random_range(-1i8..=1))).clamp(0.0, 16.0);
    }
    e
}

fn write_report(out: &mut dyn Write, rows: &[Row], m: usize, k: usize) -> std::io::Result<()> {
    writeln!(
        out,
        "Canary audit: {k} canaries, each in exactly half of the m = {m} subsets; one-sided {:.0} % \
         Clopper–Pearson bounds\n",
        100.0 * CONFIDENCE
    )?;
    writeln!(
        out,
        "| canaries | answers | MI charged B (nats) | Table-1 bound at B | guesses right | accuracy ≥ (CP) | \
         leaked ≥ (nats) | ln m + ln w(s*) (nats) |"
    )?;
    writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for r in rows {
        let flag = if r.implied > r.spent { " **above B**" } else { "" };
        writeln!(
            out,
            "| {} | {} | {:.4e} | {:.2} % | {} / {} | {:.2} % | {:.4e}{flag} | {:.4e} |",
            r.canaries,
            r.answers,
            r.spent,
            100.0 * r.bound,
            r.correct,
            r.canaries,
            100.0 * r.accuracy_lower,
            r.implied,
            r.direct
        )?;
    }
    Ok(())
}

fn write_csv(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
    let mut w = csv::Writer::from_path(path).with_context(|| format!("writing {}", path.display()))?;
    w.write_record([
        "canaries",
        "answers",
        "mi_spent_nats",
        "mia_bound",
        "correct",
        "accuracy_lower_cp95",
        "leaked_lower_nats",
        "direct_estimate_nats",
    ])?;
    for r in rows {
        w.write_record([
            r.canaries.to_string(),
            r.answers.to_string(),
            r.spent.to_string(),
            r.bound.to_string(),
            r.correct.to_string(),
            r.accuracy_lower.to_string(),
            r.implied.to_string(),
            r.direct.to_string(),
        ])?;
    }
    w.flush().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Information (nats) against canaries attacked: what was charged, the
/// lower bound the guesses imply, and the direct estimate.
fn plot(path: &Path, rows: &[Row]) -> anyhow::Result<()> {
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
        root.fill(&WHITE)?;
        let x_max = rows.iter().map(|r| r.canaries).max().unwrap_or(1).max(1) as f64;
        let y_max = rows.iter().flat_map(|r| [r.spent, r.implied, r.direct]).fold(1e-3, f64::max) * 1.1;
        let y_min = rows.iter().map(|r| r.direct).fold(0.0, f64::min) * 1.1;
        let mut chart = ChartBuilder::on(&root)
            .caption("Canary audit: information leaked vs charged", ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..x_max, y_min..y_max)?;
        chart.configure_mesh().x_desc("canaries attacked").y_desc("nats").draw()?;
        let series = |f: fn(&Row) -> f64| rows.iter().map(move |r| (r.canaries as f64, f(r)));
        chart
            .draw_series(LineSeries::new(series(|r| r.spent), RED.stroke_width(2)))?
            .label("MI charged B")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        chart
            .draw_series(LineSeries::new(series(|r| r.implied), BLUE.stroke_width(2)))?
            .label("leaked ≥ KL(CP 95 % accuracy bound)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        chart
            .draw_series(LineSeries::new(series(|r| r.direct), GREEN.stroke_width(2)))?
            .label("ln m + ln w(s*) (one sample)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], GREEN));
        chart.configure_series_labels().background_style(WHITE.mix(0.9)).border_style(BLACK).draw()?;
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn clopper_pearson_matches_its_closed_forms() -> Result<(), PrivacyError> {
        // All right: the bound solves p^n = 0.05.
        for n in [1u64, 8, 32] {
            let expected = 0.05f64.powf(1.0 / n as f64);
            assert!((clopper_pearson_lower(n, n)? - expected).abs() < 1e-9, "n = {n}");
        }
        assert_eq!(clopper_pearson_lower(0, 10)?, 0.0);
        // 16 of 32 is no evidence of skill.
        assert!(clopper_pearson_lower(16, 32)? < 0.5);
        assert!(clopper_pearson_lower(33, 32).is_err());
        Ok(())
    }

    #[test]
    fn implied_information_inverts_the_mia_bound() -> Result<(), PrivacyError> {
        assert_eq!(implied_information(0.4), 0.0);
        for b in [1e-6, 1e-3, 0.1, 0.5] {
            let p = report::mia_bound(Nats::new(b)?);
            assert!((implied_information(p) - b).abs() <= 1e-9 * (1.0 + b), "b = {b}");
        }
        Ok(())
    }
}
