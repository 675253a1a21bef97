//! Dynamic batching of the fan-out: queries that arrive within a short
//! window of the first one (up to a maximum) go to every teacher as one
//! request with a leading batch dimension, and each caller gets back its
//! own row of the answers.
//!
//! One task collects batches; each batch is then asked on a task of its
//! own, so collecting the next batch never waits for teachers.
//!
//! # Invariants
//! - A caller's answer is exactly the row it sent (rows keep their
//!   position in the request and the reply is split by that position).
//! - A batch fails or succeeds as a whole: a teacher that does not answer
//!   fails every query in it, and none of them is charged.
//! - What ends up in a batch depends only on arrival times, never on any
//!   session's state: the batcher does not know whose queries it carries.

use super::FanoutError;
use pacpriv_privacy::mechanism::TeacherOutputs;
use pacpriv_store::{Arrival, Arrivals};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// What the batcher sends a batch to: the ensemble's fan-out.
pub(super) trait AskBatch: Send + Sync + 'static {
    /// Every teacher's outputs for each of `rows`, one per row, in order.
    fn ask(&self, rows: &[Arc<[f64]>]) -> impl Future<Output = Result<Vec<TeacherOutputs>, FanoutError>> + Send;
}

/// When to close a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batching {
    /// How long the first query of a batch waits for company. Zero: every
    /// query is sent on its own, at once.
    pub window: Duration,
    /// Most queries in one batch.
    pub max_batch: usize,
}

impl Batching {
    /// Every query on its own.
    pub const OFF: Batching = Batching { window: Duration::ZERO, max_batch: 1 };

    /// Whether queries are batched at all.
    pub fn enabled(&self) -> bool {
        !self.window.is_zero() && self.max_batch > 1
    }
}

struct Pending {
    features: Arc<[f64]>,
    /// The asking query's span: the batch's calls are traced under the
    /// first query's, and follow from the others'.
    span: tracing::Span,
    reply: oneshot::Sender<Result<(TeacherOutputs, Arrival), FanoutError>>,
}

/// The queue in front of the fan-out.
pub(super) struct Batcher {
    queue: mpsc::Sender<Pending>,
}

impl Batcher {
    /// Starts the collecting task on the current runtime.
    pub(super) fn start(core: Arc<impl AskBatch>, batching: Batching, arrivals: Arc<Arrivals>) -> Self {
        // Room for a few batches: callers beyond it wait to enqueue, which
        // is the backpressure a closed-loop client would see anyway.
        let (queue, rx) = mpsc::channel(batching.max_batch.saturating_mul(4));
        tokio::spawn(collect(core, rx, batching, arrivals));
        Batcher { queue }
    }

    /// All teachers' outputs for `features`, asked together with whatever
    /// else arrives in the same window, counted on their way to the store
    /// with the rest of the batch's.
    pub(super) async fn query(&self, features: Arc<[f64]>) -> Result<(TeacherOutputs, Arrival), FanoutError> {
        let (reply, answer) = oneshot::channel();
        let span = tracing::Span::current();
        self.queue.send(Pending { features, span, reply }).await.map_err(|_| FanoutError::Stopped)?;
        // A dropped reply means the batch's task died: nothing was charged.
        answer.await.map_err(|_| FanoutError::Stopped)?
    }
}

/// Takes the first waiting query, then everything that arrives within the
/// window (or until the batch is full), and hands the batch to a task.
async fn collect(
    core: Arc<impl AskBatch>,
    mut queue: mpsc::Receiver<Pending>,
    batching: Batching,
    arrivals: Arc<Arrivals>,
) {
    while let Some(first) = queue.recv().await {
        let mut batch = vec![first];
        let close = tokio::time::sleep_until(Instant::now() + batching.window);
        tokio::pin!(close);
        while batch.len() < batching.max_batch {
            tokio::select! {
                // Queued queries first: a full queue closes the batch
                // without waiting for the timer.
                biased;
                next = queue.recv() => match next {
                    Some(p) => batch.push(p),
                    None => break,
                },
                () = &mut close => break,
            }
        }
        tokio::spawn(ask(Arc::clone(&core), batch, Arc::clone(&arrivals)));
    }
}

async fn ask(core: Arc<impl AskBatch>, batch: Vec<Pending>, arrivals: Arc<Arrivals>) {
    let rows: Vec<Arc<[f64]>> = batch.iter().map(|p| Arc::clone(&p.features)).collect();
    // A batch serves several queries, perhaps of several principals: its
    // span is a root of its own, linked to every query's span, so no
    // principal's trace holds (or, through the teachers' traceparent,
    // hands on) a call made for others.
    let span = tracing::info_span!(parent: None, "teacher_batch", rows = rows.len());
    for pending in &batch {
        span.follows_from(&pending.span);
    }
    match tracing::Instrument::instrument(core.ask(&rows), span).await {
        Ok(outputs) => {
            // Every row counted before any caller runs: the store's writer
            // then gathers the whole batch's records into one sync.
            let arriving: Vec<Arrival> = batch.iter().map(|_| arrivals.arrive()).collect();
            for ((pending, outputs), arrival) in batch.into_iter().zip(outputs).zip(arriving) {
                // The caller may have gone (client cancelled): its row is
                // simply dropped, uncharged (and no longer counted).
                let _ = pending.reply.send(Ok((outputs, arrival)));
            }
        }
        Err(e) => {
            for pending in batch {
                let _ = pending.reply.send(Err(e.clone()));
            }
        }
    }
}
