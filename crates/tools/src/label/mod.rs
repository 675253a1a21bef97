//! `pacpriv label`: label an unlabeled (public) dataset through a running
//! server — the distillation step of paper §5. Every row goes, in file
//! order, through `pacpriv.v1.Privatizer/PredictStream` with the confidence
//! test of Prop. 5.1 at level α; the answers that pass it are the labels
//! kept for training a student model.
//!
//! # Paying once
//! - The whole file is read and checked before anything is sent, so a bad
//!   row at the end cannot waste the budget spent on the rows before it.
//! - Every answer is appended to the journal `<out>.answers` (see
//!   [`journal`]) as it arrives. A rerun of the same command sends only the
//!   rows after the journal's last answer (answers come back in row order,
//!   so the answered rows are a prefix) and rebuilds `--out` from it.
//! - Answers the server charged but this process never received (it was
//!   killed mid-stream, or the connection broke) cannot be recovered: at
//!   most [`IN_FLIGHT`] requests are outstanding at any time. Ctrl-C is
//!   graceful: no new rows are sent and the answers already requested are
//!   waited for and journaled (a second Ctrl-C stops at once).

pub mod dataset;
pub mod journal;
mod progress;

use super::connect::{self, TlsArgs};
use anyhow::{Context, bail};
use dataset::{DatasetError, Format, Header as CsvHeader, Options, Row, Rows};
use journal::{Answer, Journal, Opened};
use pacpriv_service::proto::pacpriv::privatizer_client::PrivatizerClient;
use pacpriv_service::proto::pacpriv::{Budget, GetBudgetRequest, PredictRequest, PredictResponse, Tensor};
use progress::Progress;
use std::io::Write;
use std::num::NonZeroU64;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tonic::{Code, Status};

/// Requests sent but not yet answered, at most. The server answers a
/// stream one request at a time, so a few suffice to keep it busy; and
/// they bound what a killed client loses (answers charged, never received)
/// and how long a Ctrl-C waits.
pub const IN_FLIGHT: usize = 8;

/// Arguments of `pacpriv label`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The unlabeled dataset: CSV (.csv) or JSON lines (.jsonl, .ndjson),
    /// one example per row.
    #[arg(value_name = "INPUT")]
    pub input: PathBuf,

    /// The kept labels, as CSV `row,label` (row: 0-based index in INPUT).
    /// Every answer, kept or not, goes to FILE.answers, the journal a rerun
    /// continues from.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,

    /// Input format (default: from INPUT's extension).
    #[arg(long, value_enum)]
    pub format: Option<Format>,

    /// CSV only: whether the first record is a header [default: auto, a
    /// header if none of its fields is a number].
    #[arg(long, value_enum)]
    pub header: Option<CsvHeader>,

    /// JSON lines only: for lines that are objects, the field holding the
    /// example (an array of numbers).
    #[arg(long, default_value = "input", value_name = "NAME")]
    pub field: String,

    /// Confidence level of the test (paper Prop. 5.1): an answer is kept
    /// if the server finds it confident at this α.
    #[arg(long, default_value_t = 0.01, value_parser = parse_alpha, value_name = "ALPHA")]
    pub alpha: f64,

    /// The server's client API: an http:// or https:// URI, or HOST:PORT
    /// (https with --ca).
    #[arg(long, default_value = "http://127.0.0.1:50051", value_name = "URI")]
    pub addr: String,

    /// API key, sent as `x-api-key` (default: $PACPRIV_API_KEY, which
    /// keeps it out of shell history and `ps`).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,

    /// The private model to ask (empty: the server's default model). Its
    /// answers are charged to its dataset's account, which the progress
    /// and the summary report.
    #[arg(long, default_value = "", value_name = "NAME")]
    pub model: String,

    /// TLS (`--ca`) and mTLS (`--cert`, `--key`) to the server.
    #[command(flatten)]
    pub tls: TlsArgs,

    /// Shape of one example as the server expects it, e.g. `3,32,32`
    /// (default: one dimension, the row length).
    #[arg(long, value_delimiter = ',', value_name = "D1,D2,...")]
    pub shape: Option<Vec<u64>>,

    /// Tensor datatype sent.
    #[arg(long, value_enum, ignore_case = true, default_value_t = Datatype::Fp32)]
    pub datatype: Datatype,

    /// Ask only for labels all teachers agree on, exact and free: the
    /// server must run `privacy.policy = "unanimous_only"`, which refuses
    /// contested rows (`CONTESTED`, uncharged). Rows go as unary Predict
    /// calls ([`IN_FLIGHT`] at a time), so a refusal does not end the job;
    /// refused rows are journaled as contested and never kept.
    #[arg(long)]
    pub unanimous_only: bool,

    /// Without a terminal on standard error: a progress line every N rows
    /// (and at least every 10 s).
    #[arg(long, default_value = "1000", value_name = "N")]
    pub progress_every: NonZeroU64,
}

/// Wire datatype of the examples.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Datatype {
    /// 32-bit floats (what the demo teachers take).
    Fp32,
    /// 64-bit floats.
    Fp64,
}

fn parse_alpha(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(a) if a > 0.0 && a < 1.0 => Ok(a),
        _ => Err(format!("{s:?} is not a level in (0, 1)")),
    }
}

/// Labels `args.input`, resuming from its journal; writes the report to
/// `out`.
///
/// # Errors
/// A bad input file (before anything is sent), a journal written for
/// another input, an unreachable server or a refused key, and every way a
/// job can stop early — an exhausted budget, an unavailable server, an
/// interrupt — as a [`super::Resumable`] error after the report.
pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let options = read_options(&args)?;
    let input = args.input.display().to_string();
    let file = std::fs::File::open(&args.input).with_context(|| format!("opening {input}"))?;
    let summary = dataset::scan(Rows::new(file, &options)).with_context(|| input.clone())?;
    let shape = tensor_shape(args.shape.as_deref(), summary.features)?;
    let key = match args.api_key.clone().or_else(|| std::env::var("PACPRIV_API_KEY").ok()) {
        Some(k) => k,
        None => bail!("no API key: set PACPRIV_API_KEY (or pass --api-key)"),
    };

    let journal_path = journal::path_for(&args.out);
    if args.out.exists() && !journal_path.exists() {
        bail!(
            "{} exists but its journal {} does not, so it was not written by pacpriv label; choose another --out",
            args.out.display(),
            journal_path.display()
        );
    }
    let header = journal::Header::new(&args.input, summary.rows, summary.features, summary.sha256.clone(), args.alpha)
        .unanimous_only(args.unanimous_only)
        .model(&args.model);
    let Opened { mut journal, mut answers, dropped_torn_line } =
        Journal::open(&journal_path, &header).with_context(|| format!("continuing {}", journal_path.display()))?;
    if dropped_torn_line {
        tracing::warn!(
            journal = %journal_path.display(),
            "dropped a torn last line: that answer was charged but is lost, and its row is asked again"
        );
    }
    let before = answers.len() as u64;
    if before > 0 {
        tracing::info!(answered = before, rows = summary.rows, "resuming: rows in the journal are not sent again");
    }

    let job = Job { args: &args, options, rows: summary.rows, shape, key };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let result = runtime.block_on(job.run(&mut journal, &mut answers));
    let synced = journal.sync();
    let kept = journal::write_kept(&args.out, &answers).with_context(|| format!("writing {}", args.out.display()))?;
    synced.with_context(|| format!("syncing {}", journal_path.display()))?;
    let outcome = result?;

    let paths = Paths { input, out: args.out.display().to_string(), journal: journal_path.display().to_string() };
    let contested = answers.iter().filter(|a| a.contested).count() as u64;
    let totals = Totals {
        rows: summary.rows,
        features: summary.features,
        answered: answers.len() as u64 - contested,
        contested,
        kept,
    };
    report(out, &paths, &totals, args.alpha, &outcome)?;
    ending(outcome, &paths, &totals)
}

/// Where things are, for messages.
struct Paths {
    input: String,
    out: String,
    journal: String,
}

/// Counts over the whole job (all runs).
struct Totals {
    rows: u64,
    features: usize,
    answered: u64,
    /// Rows refused as contested (`--unanimous-only`).
    contested: u64,
    kept: usize,
}

/// The final report, on standard output.
fn report(out: &mut dyn Write, p: &Paths, t: &Totals, alpha: f64, outcome: &Outcome) -> std::io::Result<()> {
    let fraction =
        if t.answered == 0 { "—".to_owned() } else { format!("{:.2} %", 100.0 * t.kept as f64 / t.answered as f64) };
    let b = &outcome.budget;
    writeln!(out, "input        {}: {} rows of {} values", p.input, t.rows, t.features)?;
    writeln!(out, "answered     {} this run, {} of {} rows in total", outcome.answered, t.answered, t.rows)?;
    if outcome.unanimous_only {
        writeln!(
            out,
            "contested    {} this run, {} rows in total refused (the teachers disagree; nothing charged, never kept)",
            outcome.contested, t.contested
        )?;
    }
    writeln!(out, "kept         {} of {} answered rows ({fraction}), confident at α = {alpha}", t.kept, t.answered)?;
    writeln!(out, "labels       {} (row,label); every answer in {}", p.out, p.journal)?;
    writeln!(out, "MI charged   {:e} nats by this run", outcome.charged)?;
    writeln!(
        out,
        "session      {} ({}): spent {:e} of {:e} nats, {} answers",
        b.principal, b.scope, b.spent, b.limit, b.answered
    )?;
    writeln!(out, "MIA bound    {:.4} %", 100.0 * b.mia_bound)?;
    out.flush()
}

/// Success, or why the job stopped and how to continue it.
fn ending(outcome: Outcome, p: &Paths, t: &Totals) -> anyhow::Result<()> {
    let progress = format!(
        "{} of {} rows answered ({} this run), all in {}; kept labels in {}",
        t.answered + t.contested,
        t.rows,
        outcome.answered + outcome.contested,
        p.journal,
        p.out
    );
    let again = "rerun this same command (rows already answered are not sent again)";
    let resumable = |message: String| Err(super::Resumable(message).into());
    match outcome.end {
        End::Complete => Ok(()),
        End::Interrupted => resumable(format!("interrupted; {progress}. To continue, {again}")),
        End::EndedEarly => resumable(format!(
            "the server ended the stream without an error before every row was answered; {progress}. To continue, \
             {again}"
        )),
        End::Stopped(status) if status.code() == Code::ResourceExhausted => resumable(format!(
            "the budget ran out ({}); {progress}. To continue, {again} once principal {} has more budget (one \
             from the server's configuration: raise its budget_mi and restart the server), or with another \
             principal's key",
            status.message(),
            outcome.budget.principal
        )),
        End::Stopped(status) if transient(status.code()) => resumable(format!(
            "the server stopped answering at row {} ({:?}: {}); {progress}. If the connection broke, answers \
             charged but never received (at most {IN_FLIGHT}) are lost. To continue, {again}",
            t.answered + t.contested,
            status.code(),
            status.message()
        )),
        End::Stopped(status) => {
            // Most refusals already say so; say it once.
            let uncharged =
                if status.message().contains("nothing was charged") { "" } else { "; nothing was charged for it" };
            bail!(
                "the server refused row {} ({:?}: {}{uncharged}); {progress}",
                t.answered + t.contested,
                status.code(),
                status.message()
            )
        }
    }
}

/// The journal's record of `r`, the answer to `row`.
fn answer_of(row: u64, r: &PredictResponse) -> Answer {
    Answer {
        row,
        label: r.label,
        // The server sets `confident` whenever α is sent (as it always is here).
        confident: r.confident.unwrap_or(false),
        unanimous: r.unanimous,
        mi_charged: r.mi_charged,
        contested: false,
    }
}

/// Codes after which the same request may succeed later.
fn transient(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded | Code::Aborted | Code::Internal
    )
}

fn read_options(args: &Args) -> anyhow::Result<Options> {
    let format = match args.format {
        Some(f) => f,
        None => Format::from_path(&args.input).with_context(|| args.input.display().to_string())?,
    };
    if args.header.is_some() && format != Format::Csv {
        bail!("--header applies to CSV input only");
    }
    Ok(Options { format, header: args.header.unwrap_or_default(), field: args.field.clone() })
}

/// `--shape`, checked against the row length, or `[features]`.
fn tensor_shape(shape: Option<&[u64]>, features: usize) -> anyhow::Result<Vec<i64>> {
    let Some(dims) = shape else {
        return Ok(vec![i64::try_from(features)?]);
    };
    let product = dims.iter().try_fold(1u64, |p, &d| p.checked_mul(d));
    if product != Some(features as u64) {
        bail!("--shape {dims:?} holds {} values, but the rows have {features}", product.unwrap_or(u64::MAX));
    }
    dims.iter().map(|&d| i64::try_from(d).context("--shape")).collect()
}

/// How a streaming run ended.
enum End {
    /// Every row is answered.
    Complete,
    /// The stream ended with this status.
    Stopped(Status),
    /// Ctrl-C.
    Interrupted,
    /// The stream ended without an error, rows still unanswered.
    EndedEarly,
}

/// What one run did.
struct Outcome {
    /// Answers received by this run.
    answered: u64,
    /// A `--unanimous-only` run, and the rows it saw refused as contested.
    unanimous_only: bool,
    contested: u64,
    /// Their charges, in nats.
    charged: f64,
    /// The session's budget after the last answer (or at the start).
    budget: Budget,
    end: End,
}

/// One run's settings.
struct Job<'a> {
    args: &'a Args,
    options: Options,
    rows: u64,
    shape: Vec<i64>,
    key: String,
}

impl Job<'_> {
    /// The account the model's answers are charged to.
    fn account(&self) -> GetBudgetRequest {
        GetBudgetRequest { model: self.args.model.clone(), ..Default::default() }
    }

    /// Connects, then streams every row not yet in `answers`, journaling
    /// each answer.
    async fn run(&self, journal: &mut Journal, answers: &mut Vec<Answer>) -> anyhow::Result<Outcome> {
        let channel = connect::channel(&self.args.addr, &self.args.tls, "the pacpriv server").await?;
        let key: tonic::metadata::MetadataValue<_> = self.key.parse().context("the API key must be printable ASCII")?;
        let mut client = PrivatizerClient::with_interceptor(channel, move |mut req: tonic::Request<()>| {
            req.metadata_mut().insert("x-api-key", key.clone());
            Ok(req)
        });
        let budget = client.get_budget(self.account()).await.map_err(|s| {
            let hint = match s.code() {
                Code::Unauthenticated => "; the server does not accept this API key",
                Code::NotFound => "; --model names a model this server does not serve",
                Code::Unimplemented => "; is --addr the client port of a pacpriv server?",
                _ => "; is --addr the client port of a pacpriv server, and do --ca, --cert and --key match its TLS?",
            };
            anyhow::anyhow!("GetBudget failed ({:?}: {}){hint}", s.code(), s.message())
        })?;
        let budget = budget.into_inner();
        let first = answers.len() as u64;
        let unanimous_only = self.args.unanimous_only;
        if unanimous_only && budget.policy != "unanimous_only" {
            bail!(
                "--unanimous-only needs a server whose privacy.policy is \"unanimous_only\" (this one's is {:?}): under \
                 any other policy a contested row would be answered and charged",
                budget.policy
            );
        }
        let mut outcome =
            Outcome { answered: 0, unanimous_only, contested: 0, charged: 0.0, budget, end: End::Complete };
        if first == self.rows {
            return Ok(outcome);
        }
        if unanimous_only {
            self.run_unary(client, journal, answers, &mut outcome).await?;
            return Ok(outcome);
        }

        let (permits, permit_pool) = std::sync::mpsc::sync_channel(IN_FLIGHT);
        for _ in 0..IN_FLIGHT {
            let _ = permits.try_send(());
        }
        let (requests, reader_error, stop) = self.start_reader(first, permit_pool);
        let mut responses = match client.predict_stream(tokio_stream::wrappers::ReceiverStream::new(requests)).await {
            Ok(r) => r.into_inner(),
            Err(status) => {
                stop.store(true, Ordering::Relaxed);
                outcome.end = End::Stopped(status);
                return Ok(outcome);
            }
        };
        let mut interrupts = interrupts();
        let mut progress = Progress::new(self.rows, first, self.args.progress_every.get());
        let mut kept = answers.iter().filter(|a| a.confident).count() as u64;
        let mut next = first;
        let mut interrupted = false;
        loop {
            tokio::select! {
                message = responses.message() => match message {
                    Ok(Some(r)) => {
                        if r.query_id.parse::<u64>().ok() != Some(next) {
                            stop.store(true, Ordering::Relaxed);
                            bail!("the server answered query {:?} where row {next} was expected", r.query_id);
                        }
                        let answer = answer_of(next, &r);
                        journal.append(&answer).with_context(|| {
                            format!("journaling the answer to row {next} (it was charged, and is lost)")
                        })?;
                        answers.push(answer);
                        let _ = permits.try_send(());
                        next += 1;
                        kept += u64::from(answer.confident);
                        outcome.answered += 1;
                        outcome.charged += answer.mi_charged;
                        if let Some(b) = r.budget {
                            outcome.budget = b;
                        }
                        progress.update(next, kept, &outcome.budget);
                    }
                    Ok(None) => {
                        if next < self.rows {
                            if let Ok(e) = reader_error.try_recv() {
                                let input = self.args.input.display();
                                return Err(anyhow::Error::new(e).context(format!("reading {input} again")));
                            }
                            outcome.end = if interrupted { End::Interrupted } else { End::EndedEarly };
                        }
                        break;
                    }
                    Err(status) => {
                        outcome.end = End::Stopped(status);
                        break;
                    }
                },
                Some(()) = interrupts.recv() => {
                    if interrupted {
                        outcome.end = End::Interrupted;
                        break;
                    }
                    interrupted = true;
                    stop.store(true, Ordering::Relaxed);
                    progress.note("interrupted: waiting for the answers already requested (Ctrl-C again: stop now)");
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        progress.finish();
        Ok(outcome)
    }

    /// `--unanimous-only`: every row not yet in `answers` as a unary
    /// Predict call, [`IN_FLIGHT`] at a time, journaled in row order; a
    /// `CONTESTED` refusal is journaled as such and the job goes on. Any
    /// other failure stops it (answers after the failing row are dropped:
    /// under `unanimous_only` they were free, and their rows are asked
    /// again on the rerun).
    async fn run_unary<T>(
        &self,
        client: PrivatizerClient<T>,
        journal: &mut Journal,
        answers: &mut Vec<Answer>,
        outcome: &mut Outcome,
    ) -> anyhow::Result<()>
    where
        T: tonic::client::GrpcService<tonic::body::Body> + Clone + Send + 'static,
        T::Future: Send,
        T::Error: Into<tonic::codegen::StdError>,
        T::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
        <T::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
    {
        use futures_util::StreamExt as _;
        let first = answers.len() as u64;
        let reader = Reader::for_job(self, first);
        let mut rows = Rows::new(std::fs::File::open(&self.args.input)?, &self.options)
            .filter(|r| !matches!(r, Ok(row) if row.index < first || row.index >= self.rows));
        let mut calls = futures_util::stream::FuturesOrdered::new();
        let mut interrupts = interrupts();
        let mut progress = Progress::new(self.rows, first, self.args.progress_every.get());
        let mut kept = answers.iter().filter(|a| a.confident).count() as u64;
        let (mut next, mut interrupted) = (first, false);
        loop {
            while !interrupted && calls.len() < IN_FLIGHT {
                let Some(row) = rows.next() else { break };
                let request = reader.request(row.with_context(|| format!("reading {} again", reader.path.display()))?);
                let mut client = client.clone();
                calls.push_back(async move { client.predict(request).await });
            }
            let reply = tokio::select! {
                reply = calls.next() => reply,
                Some(()) = interrupts.recv() => {
                    if interrupted {
                        outcome.end = End::Interrupted;
                        break;
                    }
                    interrupted = true;
                    progress.note("interrupted: waiting for the answers already requested (Ctrl-C again: stop now)");
                    continue;
                }
            };
            let Some(reply) = reply else {
                if next < self.rows {
                    outcome.end = if interrupted { End::Interrupted } else { End::EndedEarly };
                }
                break;
            };
            let answer = match reply {
                Ok(r) => {
                    let r = r.into_inner();
                    let answer = answer_of(next, &r);
                    if let Some(b) = r.budget {
                        outcome.budget = b;
                    }
                    answer
                }
                Err(status) if connect::reason(&status).as_deref() == Some("CONTESTED") => {
                    Answer { row: next, label: 0, confident: false, unanimous: false, mi_charged: 0.0, contested: true }
                }
                Err(status) => {
                    outcome.end = End::Stopped(status);
                    break;
                }
            };
            journal
                .append(&answer)
                .with_context(|| format!("journaling the answer to row {next} (it was charged, and is lost)"))?;
            answers.push(answer);
            next += 1;
            kept += u64::from(answer.confident);
            outcome.answered += u64::from(!answer.contested);
            outcome.contested += u64::from(answer.contested);
            outcome.charged += answer.mi_charged;
            progress.update(next, kept, &outcome.budget);
        }
        progress.finish();
        // Replies overlap, so the last one's account may predate another's
        // step: ask for the account as it stands now.
        if let Ok(b) = client.clone().get_budget(self.account()).await {
            outcome.budget = b.into_inner();
        }
        Ok(())
    }

    /// Reads the input again on a thread of its own, from row `first` on,
    /// into a channel of requests, taking one of `permits` (returned for
    /// each answer) per request. The thread stops at the end of the file,
    /// when `stop` is set, or when either channel closes; a read error is
    /// sent on the second channel returned before the first one closes.
    fn start_reader(
        &self,
        first: u64,
        permits: std::sync::mpsc::Receiver<()>,
    ) -> (tokio::sync::mpsc::Receiver<PredictRequest>, std::sync::mpsc::Receiver<DatasetError>, Arc<AtomicBool>) {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let (error_tx, error_rx) = std::sync::mpsc::channel();
        let reader = Reader { permits, ..Reader::for_job(self, first) };
        let stop = Arc::clone(&reader.stop);
        std::thread::spawn(move || {
            if let Err(e) = reader.send_rows(&tx) {
                let _ = error_tx.send(e);
            }
            drop(tx);
        });
        (rx, error_rx, stop)
    }
}

/// Ctrl-C presses, as a channel (the handler stays installed for the run).
fn interrupts() -> tokio::sync::mpsc::Receiver<()> {
    let (tx, rx) = tokio::sync::mpsc::channel(2);
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            if tx.send(()).await.is_err() {
                break;
            }
        }
    });
    rx
}

/// The request side of a run.
struct Reader {
    path: PathBuf,
    options: Options,
    rows: u64,
    first: u64,
    shape: Vec<i64>,
    datatype: Datatype,
    alpha: f64,
    model: String,
    stop: Arc<AtomicBool>,
    /// One per request allowed in flight.
    permits: std::sync::mpsc::Receiver<()>,
}

impl Reader {
    /// A reader of `job`'s rows from `first` on (with no permits: it sends
    /// nothing until given some).
    fn for_job(job: &Job<'_>, first: u64) -> Reader {
        Reader {
            path: job.args.input.clone(),
            options: job.options.clone(),
            rows: job.rows,
            first,
            shape: job.shape.clone(),
            datatype: job.args.datatype,
            alpha: job.args.alpha,
            model: job.args.model.clone(),
            stop: Arc::new(AtomicBool::new(false)),
            permits: std::sync::mpsc::sync_channel(0).1,
        }
    }

    fn send_rows(&self, tx: &tokio::sync::mpsc::Sender<PredictRequest>) -> Result<(), DatasetError> {
        let mut seen = 0;
        for row in Rows::new(std::fs::File::open(&self.path)?, &self.options) {
            let row = row?;
            seen += 1;
            if row.index >= self.rows {
                break;
            }
            if row.index < self.first {
                continue;
            }
            let stopped = self.permits.recv().is_err() || self.stop.load(Ordering::Relaxed);
            if stopped || tx.blocking_send(self.request(row)).is_err() {
                return Ok(());
            }
        }
        if seen != self.rows {
            return Err(DatasetError::Changed { rows: self.rows });
        }
        Ok(())
    }

    fn request(&self, row: Row) -> PredictRequest {
        let mut tensor = Tensor { shape: self.shape.clone(), ..Default::default() };
        match self.datatype {
            Datatype::Fp32 => {
                tensor.datatype = "FP32".into();
                tensor.fp32_contents = row.values.iter().map(|&v| v as f32).collect();
            }
            Datatype::Fp64 => {
                tensor.datatype = "FP64".into();
                tensor.fp64_contents = row.values;
            }
        }
        PredictRequest {
            query_id: row.index.to_string(),
            input: Some(tensor),
            confidence_alpha: Some(self.alpha),
            model: self.model.clone(),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod test;
