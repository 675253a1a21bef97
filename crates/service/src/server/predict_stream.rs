//! `PredictStream`: a labelling job's queries answered in request order,
//! pipelined. Each query runs the three phases of [`predict`] — teachers,
//! step, durability — and the phases of consecutive queries overlap:
//!
//! - a reader task starts every request's fan-out as soon as it arrives
//!   (at most [`DEPTH`] ahead), so the queries of one stream share batches
//!   — or, over the principal's rate limit, as soon as the limit allows
//!   ([`rate`](super::rate): a stream is paced, never refused for rate);
//!   its fan-outs are not counted on their way to the store
//!   ([`Traced::queued`]): they wait in this queue, and the store's
//!   writer must not wait for a step that waits for a slow reader;
//! - this stream's task takes the steps strictly in request order — the
//!   session's math sees the queries in the order the client sent them;
//! - a sender task waits for each step's durability, in order, and sends.
//!
//! The principal is authenticated when the stream opens and its credential
//! checked again before each step, against the budget in force then, so
//! revoking it or rotating its key stops the stream at its next query, and
//! a budget cut applies from that query on.
//! The stream stops at the first failure, reported as its status; every
//! response sent before it was answered and charged. A client that stops
//! reading stops the steps within [`DEPTH`] + 1 answers: those are charged
//! but never delivered (an error toward more charge, never less).

use super::App;
use super::in_flight::Place;
use super::predict::{self, Asked, Failed, Taken, Traced};
use super::rate::Over;
use crate::metrics::Rpc;
use crate::proto::pacpriv::{PredictRequest, PredictResponse};
use crate::session::Caller;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};
use tracing::Instrument;

/// Response stream handed to tonic.
pub type ResponseStream = ReceiverStream<Result<PredictResponse, Status>>;

/// Queries of one stream in flight per phase: enough to fill a batch
/// window and a group commit, small enough that a vanished client leaves
/// few charged answers undelivered.
pub const DEPTH: usize = 16;

/// A request's fan-out, running on a task of its own; `Err(status)` for a
/// transport error reading the request.
type Asking = Result<JoinHandle<Result<Traced<Asked>, Failed>>, Status>;

/// Answers `requests` in order, holding the stream's `place` among the
/// principal's calls in flight until it ends.
pub fn start(app: Arc<App>, caller: Caller, place: Place, requests: Streaming<PredictRequest>) -> ResponseStream {
    // Capacity 1: the sender cannot run ahead of a client that stopped
    // reading.
    let (tx, rx) = mpsc::channel(1);
    let span = tracing::info_span!("predict_stream", principal = %caller.principal());
    tokio::spawn(
        async move {
            let _place = place;
            let (asking_tx, asking) = mpsc::channel(DEPTH);
            let reader = tokio::spawn(read(Arc::clone(&app), caller.clone(), requests, asking_tx).in_current_span());
            let (taken_tx, taken) = mpsc::channel(DEPTH);
            let sender = tokio::spawn(send(Arc::clone(&app), taken, tx).in_current_span());
            take_steps(&app, &caller, asking, taken_tx).await;
            // Fan-outs of requests after a failure are not needed; nothing
            // was charged for them.
            reader.abort();
            let _ = sender.await;
        }
        .instrument(span),
    );
    ReceiverStream::new(rx)
}

/// Starts each request's teacher fan-out as it arrives, in order, once
/// the principal's rate limit allows it (a stream is paced, not refused).
async fn read(app: Arc<App>, caller: Caller, mut requests: Streaming<PredictRequest>, asking: mpsc::Sender<Asking>) {
    while let Some(next) = requests.next().await {
        let started = match next {
            Ok(req) => {
                let admitted = app.rate.pace(caller.principal()).await;
                let (app, caller) = (Arc::clone(&app), caller.clone());
                Ok(tokio::spawn(
                    async move { predict::ask(&app, &caller, req, Ok(admitted), Over::Wait).await.map(Traced::queued) }
                        .in_current_span(),
                ))
            }
            Err(status) => Err(status),
        };
        let failed = started.is_err();
        if asking.send(started).await.is_err() || failed {
            break;
        }
    }
}

/// Takes the session's steps in request order; the first failure is
/// passed on and ends the stream.
async fn take_steps(
    app: &App,
    caller: &Caller,
    mut asking: mpsc::Receiver<Asking>,
    taken: mpsc::Sender<Result<Traced<Taken>, Status>>,
) {
    while let Some(next) = asking.recv().await {
        let stepped = match next {
            Ok(fanout) => match fanout.await {
                Ok(Ok(asked)) => {
                    predict::step_rechecked(app, caller, asked).await.map_err(|f| Status::from(f.record(app, RPC)))
                }
                Ok(Err(failed)) => Err(Status::from(failed.record(app, RPC))),
                // The fan-out task panicked: nothing was charged.
                Err(e) => Err(Status::from(super::status::ServiceError::Internal(format!("query task failed: {e}")))),
            },
            Err(status) => Err(status),
        };
        let failed = stepped.is_err();
        if taken.send(stepped).await.is_err() || failed {
            break;
        }
    }
}

/// Sends each step's response once it is durable, in order.
async fn send(
    app: Arc<App>,
    mut taken: mpsc::Receiver<Result<Traced<Taken>, Status>>,
    tx: mpsc::Sender<Result<PredictResponse, Status>>,
) {
    while let Some(next) = taken.recv().await {
        let response = match next {
            Ok(step) => predict::respond(&app, step, RPC).await.map_err(|f| Status::from(f.record(&app, RPC))),
            Err(status) => Err(status),
        };
        let failed = response.is_err();
        if tx.send(response).await.is_err() || failed {
            break;
        }
    }
}

const RPC: Rpc = Rpc::PredictStream;
