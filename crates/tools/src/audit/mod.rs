//! `pacpriv audit`: the optimal membership-inference adversary of paper
//! §6.3 (Prop. 6.1) played against a running server, scored against the
//! bound the server reports (Eq. 2 at the MI spent).
//!
//! The adversary knows everything but s*: the universe, the subsets and
//! every teacher's function (it rebuilds the demo ensemble from the same
//! configuration), and it sees each release r (the server must allow
//! `return_noisy`). It queries universe points in random order, replays
//! Eq. 4 on what it sees ([`attack::observe_label_release`]), and at
//! checkpoints guesses every point's membership by Prop. 6.1.
//!
//! Two accuracies are reported. The bound (Eq. 2) is on the *expected*
//! success over s* and the noise. The adversary's own posterior gives an
//! unbiased estimate of it for this run without knowing s*
//! ([`attack::expected_accuracy`]); it is what the checkpoints are judged by.
//! With the operator's secret index file the tool also scores the guesses
//! against the truth ([`attack::accuracy`]; the adversary never reads the
//! file) — one draw, whose guesses all hinge on the same posterior, so near
//! the prior it can swing far from 50 % in either direction.
//! A checkpoint is flagged when the expected accuracy exceeds bound + 4·½/√n
//! (n universe points): a sanity alarm, not a statistical test of the
//! theorem.

pub mod canaries;

use super::connect::{self, TlsArgs};
use crate::demo_model::DemoModel;
use anyhow::{Context, bail};
use chacha20::ChaCha20Rng;
use pacpriv_demo::digits::FEATURES;
use pacpriv_privacy::Nats;
use pacpriv_privacy::attack;
use pacpriv_privacy::grid::PUBLISHED_GRID;
use pacpriv_privacy::posterior::Posterior;
use pacpriv_service::proto::pacpriv::privatizer_client::PrivatizerClient;
use pacpriv_service::proto::pacpriv::{Budget, GetBudgetRequest, PredictRequest, Tensor};
use pacpriv_service::settings::Settings;
use plotters::prelude::*;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use std::io::Write;
use std::path::{Path, PathBuf};
use tonic::metadata::MetadataValue;

/// Arguments of `pacpriv audit`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The server's client address (HOST:PORT or a URL).
    #[arg(long, default_value = "127.0.0.1:50051", value_name = "ADDR")]
    pub addr: String,
    /// TLS towards the server.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// API key of a principal with a fresh session (default: the
    /// PACPRIV_API_KEY environment variable).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// The configuration the server runs with (layered over the built-in
    /// default, environment overrides apply): the adversary rebuilds the same
    /// teachers and subsets from it.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// The model to audit, `NAME` (its newest version) or `NAME@V`
    /// (default: the default model's newest version); its teachers must
    /// be demo ones, which the adversary rebuilds. Every model of a
    /// dataset steps the same session.
    #[arg(long, default_value = "", value_name = "MODEL")]
    pub model: String,
    /// The server's privacy.secret_index_file, to also score the guesses
    /// against the truth (never read by the adversary).
    #[arg(long, value_name = "PATH")]
    pub secret_index_file: Option<PathBuf>,
    /// Queries T to send (universe points in random order; repeated passes
    /// when T exceeds the universe).
    #[arg(long, default_value_t = 2000, value_name = "T")]
    pub queries: usize,
    /// Number of checkpoints (evenly spaced, plus T = 0).
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub checkpoints: usize,
    /// Where to write the table (CSV).
    #[arg(long, default_value = "audit.csv", value_name = "PATH")]
    pub csv: PathBuf,
    /// Where to write the plot of both curves (SVG).
    #[arg(long, default_value = "audit.svg", value_name = "PATH")]
    pub plot: PathBuf,
    /// Seed of the query order (default: random).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,

    /// Send every query this many times in a row — the averaging attack.
    /// A repeat the server answers from its cache (`cached`) is the same
    /// release and teaches the adversary nothing; one answered afresh (a
    /// server without the cache) is observed like any release.
    #[arg(long, default_value_t = 1, value_name = "K", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeat: u32,

    /// The canary audit ([`canaries`]) instead: attack the canaries the
    /// server's demo teachers were trained with (`demo.canaries`), each
    /// asked `--repeat` times as itself and `--natural` times perturbed;
    /// needs `--secret-index-file`.
    #[arg(long)]
    pub canaries: bool,

    /// Canary audit: perturbed copies asked of each canary.
    #[arg(long, default_value_t = 4, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=64))]
    pub natural: u32,
}

/// One checkpoint of the audit.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// Answers received so far.
    pub queries: usize,
    /// MI spent by the session, nats.
    pub spent: f64,
    /// The server's MIA bound at `spent`, in [½, 1].
    pub bound: f64,
    /// The posterior probability that the adversary's guesses are right,
    /// averaged over the universe, in [½, 1].
    pub expected: f64,
    /// Its accuracy against the true secret subset, when that is known.
    pub accuracy: Option<f64>,
}

/// Runs `pacpriv audit`: prints a Markdown table, writes the CSV and the
/// SVG, and fails if any checkpoint exceeds bound + margin.
///
/// # Errors
/// Configuration, connection, a server that does not release r, a session
/// that is not fresh, I/O — and a bound exceeded beyond sampling error.
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    if args.canaries {
        return canaries::run(&args, out);
    }
    let settings = Settings::load(args.config.as_deref())?;
    let model = DemoModel::of(&settings, &args.model, "pacpriv audit")?;
    let (models, classes) = (model.m, model.classes);
    let key = match args.api_key.clone() {
        Some(k) => k,
        None => std::env::var("PACPRIV_API_KEY").context("pass --api-key or set PACPRIV_API_KEY")?,
    };
    let secret =
        args.secret_index_file.as_deref().map(|f| pacpriv_service::session::secret::read(f, models)).transpose()?;

    eprintln!("training the {models} demo teachers of {}@{} (the adversary knows them) ...", model.name, model.version);
    let ensemble = model.train()?;
    let universe: Vec<Vec<f32>> = ensemble.split.train.iter().map(|e| e.pixels.to_vec()).collect();
    let labels = ensemble.labels(&ensemble.split.train);
    let n = universe.len();

    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let rows = runtime.block_on(async {
        let channel = connect::channel(&args.addr, &args.tls, "the pacpriv server").await?;
        let mut client = PrivatizerClient::new(channel);
        let key = MetadataValue::try_from(key.as_str()).context("the API key is not valid metadata")?;
        let start = get_budget(&mut client, &key).await?;
        check_fresh(&start)?;
        let b = Nats::new(start.per_query).context("the server reported an invalid per-query MI")?;

        let order = query_order(n, args.queries, args.seed);
        let marks = checkpoints(args.queries, args.checkpoints);
        let repeat = args.repeat as usize;
        let requests: Vec<PredictRequest> = order
            .iter()
            .enumerate()
            .flat_map(|(t, &u)| (0..repeat).map(move |k| (t, u, k)))
            .map(|(t, u, k)| {
                let id = if k == 0 { format!("audit-{t}") } else { format!("audit-{t}-again-{k}") };
                request(id, &universe[u], &model)
            })
            .collect();
        // The stream from request `from` on: opened again after a query the
        // server asked to retry.
        let open = |from: usize| {
            let mut request = tonic::Request::new(tokio_stream::iter(requests[from..].to_vec()));
            request.metadata_mut().insert("x-api-key", key.clone());
            request
        };
        let mut responses = client.predict_stream(open(0)).await.context("PredictStream")?.into_inner();

        let mut posterior = Posterior::uniform(models)?;
        let score = |posterior: &Posterior| {
            let truth = secret.map(|s| attack::accuracy(posterior, &ensemble.assignment, s));
            (attack::expected_accuracy(posterior, &ensemble.assignment), truth)
        };
        let (expected, accuracy) = score(&posterior);
        let mut rows = vec![Checkpoint { queries: 0, spent: start.spent, bound: start.mia_bound, expected, accuracy }];
        let mut next_mark = marks.iter().peekable();
        let mut cached = 0u64;
        // The last release received for each universe point: a cached answer
        // equal to it repeats what the adversary has already seen.
        let mut observed: std::collections::HashMap<usize, Vec<f64>> = std::collections::HashMap::new();
        'queries: for (t, &u) in order.iter().enumerate() {
            let mut first: Option<Vec<f64>> = None;
            let mut budget = Budget::default();
            for k in 0..repeat {
                let response = loop {
                    match responses.message().await {
                        // A repeat whose cached answer moved while it was in
                        // flight (the stream's own earlier queries evicted it):
                        // nothing was charged, and the status ended the stream,
                        // so ask again from this request on.
                        Err(status) if cache_moved(&status) => {
                            let from = t * repeat + k;
                            responses = client.predict_stream(open(from)).await.context("PredictStream")?.into_inner();
                        }
                        other => break other,
                    }
                };
                let response = match response {
                    Ok(Some(r)) => r,
                    Ok(None) => bail!("the server ended the stream after {t} answers"),
                    Err(status) if t > 0 && status.code() == tonic::Code::ResourceExhausted => {
                        eprintln!("budget spent after {t} answers: stopping ({})", status.message());
                        break 'queries;
                    }
                    Err(status) if t > 0 && status.code() == tonic::Code::FailedPrecondition => {
                        eprintln!(
                            "the server refuses repeats of queries evicted from its answer cache after {t} answers: \
                             stopping ({}); to audit more queries than the universe holds, serve with \
                             PACPRIV__PRIVACY__ANSWER_CACHE_EVICTED=charge",
                            status.message()
                        );
                        break 'queries;
                    }
                    Err(status) => return Err(stream_error(status)),
                };
                if response.noisy.len() != classes {
                    bail!("the server returned {} noisy values for {classes} classes", response.noisy.len());
                }
                budget = response.budget.unwrap_or_default();
                if response.cached {
                    // The same release again: nothing to learn (checked).
                    if let Some(f) = &first {
                        if *f != response.noisy {
                            bail!("query {t}: a cached answer differs from the release it repeats");
                        }
                        cached += 1;
                        continue;
                    }
                    if observed.get(&u) == Some(&response.noisy) {
                        cached += 1;
                        continue;
                    }
                    // A release this tool never received: the step ran while
                    // the stream was being reopened. New to the adversary.
                }
                attack::observe_label_release(
                    &mut posterior,
                    &labels[u],
                    classes,
                    b,
                    &response.noisy,
                    PUBLISHED_GRID / 2.0,
                )?;
                observed.insert(u, response.noisy.clone());
                first = Some(response.noisy);
            }
            if next_mark.peek() == Some(&&(t + 1)) {
                next_mark.next();
                let (expected, accuracy) = score(&posterior);
                rows.push(Checkpoint {
                    queries: t + 1,
                    spent: budget.spent,
                    bound: budget.mia_bound,
                    expected,
                    accuracy,
                });
                eprintln!("T = {}: expected accuracy {:.2} %", t + 1, 100.0 * expected);
            }
        }
        if repeat > 1 {
            eprintln!("{cached} repeats answered from the server's cache (free, nothing new to observe)");
        }
        let end = get_budget(&mut client, &key).await?;
        let answered = rows.last().map_or(0, |r| r.queries) as u64;
        if end.answered < answered || (end.answered > answered && end.answered - answered > 2) {
            eprintln!(
                "warning: the session answered {} queries, the audit {answered}: another client used this \
                 principal, so the adversary's posterior is not the session's",
                end.answered
            );
        }
        anyhow::Ok(rows)
    })?;

    let margin = margin(n);
    report(out, &rows, n, margin)?;
    write_csv(&args.csv, &rows, margin)?;
    plot(&args.plot, &rows, margin)?;
    writeln!(out, "\nwrote {} and {}", args.csv.display(), args.plot.display())?;
    if let Some(bad) = rows.iter().find(|r| r.expected > r.bound + margin) {
        bail!(
            "the adversary's expected accuracy {:.2} % at T = {} exceeds the bound {:.2} % by more than {:.2} %: \
             the mechanism or its accounting is broken — do not serve with this configuration",
            100.0 * bad.expected,
            bad.queries,
            100.0 * bad.bound,
            100.0 * margin
        );
    }
    Ok(())
}

pub(crate) async fn get_budget(
    client: &mut PrivatizerClient<tonic::transport::Channel>,
    key: &MetadataValue<tonic::metadata::Ascii>,
) -> anyhow::Result<Budget> {
    let mut request = tonic::Request::new(GetBudgetRequest::default());
    request.metadata_mut().insert("x-api-key", key.clone());
    Ok(client.get_budget(request).await.map_err(stream_error)?.into_inner())
}

/// The adversary starts from the prior, so the session must too.
pub(crate) fn check_fresh(b: &Budget) -> anyhow::Result<()> {
    if b.scope != "per_principal" {
        bail!(
            "the server shares one session between all principals (privacy.scope = \"{}\"): the adversary cannot \
             see the other principals' answers, so its posterior would not be the session's",
            b.scope
        );
    }
    if b.answered > 0 {
        bail!(
            "principal {:?} has already been answered {} queries: the adversary must see the whole transcript from \
             the prior — audit with a fresh principal (pacpriv admin create NAME --budget-mi X)",
            b.principal,
            b.answered
        );
    }
    Ok(())
}

/// UNAVAILABLE with reason CACHE_MOVED: retry, nothing was charged.
fn cache_moved(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unavailable && connect::reason(status).as_deref() == Some("CACHE_MOVED")
}

pub(crate) fn stream_error(status: tonic::Status) -> anyhow::Error {
    match status.code() {
        tonic::Code::FailedPrecondition => anyhow::anyhow!(
            "{}\nthe adversary needs the releases themselves: start the server with \
             PACPRIV__PRIVACY__RELEASE_NOISY_VECTOR=true (privacy.release_noisy_vector)",
            status.message()
        ),
        code => anyhow::anyhow!("the server refused ({code:?}): {}", status.message()),
    }
}

/// T universe indices: shuffled passes over 0..n.
pub fn query_order(n: usize, queries: usize, seed: Option<u64>) -> Vec<usize> {
    let mut rng = rng(seed);
    let mut order = Vec::with_capacity(queries);
    while order.len() < queries && n > 0 {
        let mut pass: Vec<usize> = (0..n).collect();
        pass.shuffle(&mut rng);
        order.extend(pass.into_iter().take(queries - order.len()));
    }
    order
}

/// The adversary's generator: seeded by `--seed`, else from the OS.
fn rng(seed: Option<u64>) -> ChaCha20Rng {
    match seed {
        Some(s) => ChaCha20Rng::seed_from_u64(s),
        None => rand::make_rng(),
    }
}

/// A query of `model` for the image `pixels` (FP32, 64 values) asking for
/// the release itself, which the adversary replays Eq. 4 on.
fn request(query_id: String, pixels: &[f32], model: &DemoModel) -> PredictRequest {
    PredictRequest {
        model: model.name.clone(),
        model_version: model.version.clone(),
        query_id,
        input: Some(Tensor {
            datatype: "FP32".into(),
            shape: vec![FEATURES as i64],
            fp32_contents: pixels.to_vec(),
            ..Default::default()
        }),
        return_noisy: true,
        ..Default::default()
    }
}

/// `count` checkpoints evenly spaced over 1..=queries (always including
/// `queries`), ascending and distinct.
pub fn checkpoints(queries: usize, count: usize) -> Vec<usize> {
    let count = count.clamp(1, queries.max(1));
    let mut marks: Vec<usize> = (1..=count).map(|k| (queries * k).div_ceil(count)).filter(|&t| t > 0).collect();
    marks.dedup();
    marks
}

/// Four standard deviations of one run's accuracy over `n` points around
/// its expectation: 4 · ½/√n.
pub fn margin(n: usize) -> f64 {
    2.0 / (n.max(1) as f64).sqrt()
}

fn report(out: &mut dyn Write, rows: &[Checkpoint], n: usize, margin: f64) -> std::io::Result<()> {
    writeln!(
        out,
        "Optimal MIA (Prop. 6.1) over all {n} universe points; alarm margin 4·½/√n = {:.2} %\n",
        100.0 * margin
    )?;
    writeln!(out, "| answers T | MI spent (nats) | MIA bound | expected accuracy | accuracy vs true s* |")?;
    writeln!(out, "|---:|---:|---:|---:|---:|")?;
    for r in rows {
        let truth = r.accuracy.map_or_else(|| "—".to_owned(), |a| format!("{:.2} %", 100.0 * a));
        let flag = if r.expected > r.bound + margin { " **above bound**" } else { "" };
        writeln!(
            out,
            "| {} | {:.4e} | {:.2} % | {:.2} %{flag} | {truth} |",
            r.queries,
            r.spent,
            100.0 * r.bound,
            100.0 * r.expected
        )?;
    }
    Ok(())
}

fn write_csv(path: &Path, rows: &[Checkpoint], margin: f64) -> anyhow::Result<()> {
    let mut w = csv::Writer::from_path(path).with_context(|| format!("writing {}", path.display()))?;
    w.write_record(["queries", "mi_spent_nats", "mia_bound", "expected_accuracy", "true_accuracy", "margin"])?;
    for r in rows {
        w.write_record([
            r.queries.to_string(),
            r.spent.to_string(),
            r.bound.to_string(),
            r.expected.to_string(),
            r.accuracy.map(|a| a.to_string()).unwrap_or_default(),
            margin.to_string(),
        ])?;
    }
    w.flush().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn plot(path: &Path, rows: &[Checkpoint], margin: f64) -> anyhow::Result<()> {
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
        root.fill(&WHITE)?;
        let t_max = rows.iter().map(|r| r.queries).max().unwrap_or(1).max(1) as f64;
        let lowest = rows.iter().filter_map(|r| r.accuracy).fold(0.5, f64::min);
        let y_min = (100.0 * lowest - 100.0 * margin).floor().min(48.0);
        let mut chart = ChartBuilder::on(&root)
            .caption("Membership inference: empirical accuracy vs PAC bound", ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(52)
            .build_cartesian_2d(0.0..t_max, y_min..100.5)?;
        chart.configure_mesh().x_desc("answers T").y_desc("accuracy (%)").draw()?;
        let line = |f: fn(&Checkpoint) -> Option<f64>| {
            rows.iter().filter_map(move |r| f(r).map(|v| (r.queries as f64, 100.0 * v)))
        };
        chart
            .draw_series(LineSeries::new(line(|r| Some(r.bound)), RED.stroke_width(2)))?
            .label("bound (Eq. 2 at MI spent)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        chart
            .draw_series(LineSeries::new(line(|r| Some(r.expected)), BLUE.stroke_width(2)))?
            .label("optimal adversary (Prop. 6.1), expected accuracy")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        if rows.iter().any(|r| r.accuracy.is_some()) {
            chart
                .draw_series(LineSeries::new(line(|r| r.accuracy), BLUE.mix(0.4)))?
                .label("accuracy against the true s* (one draw)")
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.mix(0.4)));
        }
        chart.draw_series(LineSeries::new([(0.0, 50.0), (t_max, 50.0)], BLACK.mix(0.3)))?;
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
    fn checkpoints_are_even_distinct_and_end_at_t() {
        assert_eq!(checkpoints(100, 4), vec![25, 50, 75, 100]);
        assert_eq!(checkpoints(10, 3), vec![4, 7, 10]);
        assert_eq!(checkpoints(3, 10), vec![1, 2, 3]);
        assert_eq!(checkpoints(5, 0), vec![5]);
    }

    #[test]
    fn query_order_makes_whole_shuffled_passes() {
        let order = query_order(10, 25, Some(1));
        assert_eq!(order.len(), 25);
        for pass in order.chunks(10).take(2) {
            let mut sorted = pass.to_vec();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..10).collect::<Vec<_>>(), "every point once per pass");
        }
        assert_ne!(order[..10], (0..10).collect::<Vec<_>>()[..], "shuffled");
        assert_eq!(query_order(10, 25, Some(1)), order, "a seed reproduces the order");
    }

    #[test]
    fn margin_is_four_standard_deviations_of_a_fair_coin_share() {
        assert!((margin(1600) - 0.05).abs() < 1e-15);
    }
}
