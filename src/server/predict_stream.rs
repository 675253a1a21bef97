//! `PredictStream`: a labelling job's queries answered one after another,
//! in request order. The stream stops at the first failure, reported as its
//! status; every response sent before it was answered and charged.

use super::App;
use super::predict;
use crate::metrics::Rpc;
use crate::proto::pacpriv::{PredictRequest, PredictResponse};
use crate::session::Handle;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};
use tracing::Instrument;

/// Response stream handed to tonic.
pub type ResponseStream = ReceiverStream<Result<PredictResponse, Status>>;

/// Answers `requests` in order on a task of its own.
pub fn start(app: Arc<App>, handle: Handle, mut requests: Streaming<PredictRequest>) -> ResponseStream {
    // Capacity 1: the job cannot run ahead of a client that stopped reading,
    // so no answer is charged long before it can be delivered.
    let (tx, rx) = mpsc::channel(1);
    let span = tracing::info_span!("predict_stream", principal = %handle.principal());
    tokio::spawn(
        async move {
            while let Some(next) = requests.next().await {
                let result = match next {
                    Ok(req) => predict::handle(&app, &handle, req, Rpc::PredictStream).await.map_err(Status::from),
                    Err(status) => Err(status),
                };
                let failed = result.is_err();
                if tx.send(result).await.is_err() || failed {
                    break;
                }
            }
        }
        .instrument(span),
    );
    ReceiverStream::new(rx)
}
