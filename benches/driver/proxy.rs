//! The baseline: a plain fan-out proxy. It serves `pacpriv.v1.Privatizer`
//! `Predict` (the other RPCs are `UNIMPLEMENTED`) by asking all m teachers
//! through the same [`teachers::Ensemble`](pacpriv_service::teachers::Ensemble) the
//! privatizer builds from the same settings — same endpoints, call policy,
//! output mode — and answering their majority vote. No authentication, no
//! privacy step, no store: what is left is the cost of the fan-out itself,
//! the yardstick the privatizer's throughput is compared with.

use anyhow::{Context, bail};
use pacpriv_privacy::mechanism::{TeacherOutputs, argmax};
use pacpriv_service::metrics::Metrics;
use pacpriv_service::proto::pacpriv::privatizer_server::{Privatizer, PrivatizerServer};
use pacpriv_service::proto::pacpriv::{Budget, GetBudgetRequest, PredictRequest, PredictResponse};
use pacpriv_service::server::input::InputSpec;
use pacpriv_service::server::status::ServiceError;
use pacpriv_service::settings::{Settings, TeacherSource};
use pacpriv_service::teachers::Ensemble;
use std::future::Future;
use std::net::SocketAddr;
use tokio::net::TcpListener;
use tonic::{Request, Response, Status, Streaming};

/// The majority label of `labels` (one per teacher) over `classes`
/// classes; the smallest label among equally frequent ones, the tie rule
/// of [`argmax`].
pub fn majority(labels: &[usize], classes: usize) -> usize {
    let mut votes = vec![0u32; classes];
    for &l in labels {
        if let Some(v) = votes.get_mut(l) {
            *v += 1;
        }
    }
    argmax(votes.iter().map(|&v| f64::from(v)))
}

/// The proxy's `Privatizer` implementation.
struct Proxy {
    ensemble: Ensemble,
    input: InputSpec,
}

impl Proxy {
    async fn answer(&self, request: PredictRequest) -> Result<PredictResponse, ServiceError> {
        let query = self.input.parse(request)?;
        let [row] = query.rows.as_slice() else {
            return Err(ServiceError::InvalidInput("the proxy answers one example per request".into()));
        };
        let (labels, classes) = match self.ensemble.query(&row.features).await?.0 {
            TeacherOutputs::Labels { labels, classes } => (labels, classes),
            // Score vectors vote with their argmax.
            TeacherOutputs::Vectors(v) => {
                (v.rows().into_iter().map(|r| argmax(r.iter().copied())).collect(), v.ncols())
            }
        };
        let label = majority(&labels, classes);
        Ok(PredictResponse {
            query_id: query.query_id,
            label: u32::try_from(label).map_err(|_| ServiceError::Internal("label out of range".into()))?,
            unanimous: labels.iter().all(|&l| l == label),
            ..Default::default()
        })
    }
}

#[tonic::async_trait]
impl Privatizer for Proxy {
    async fn predict(&self, request: Request<PredictRequest>) -> Result<Response<PredictResponse>, Status> {
        Ok(Response::new(self.answer(request.into_inner()).await?))
    }

    type PredictStreamStream = tokio_stream::Empty<Result<PredictResponse, Status>>;

    async fn predict_stream(
        &self,
        _: Request<Streaming<PredictRequest>>,
    ) -> Result<Response<Self::PredictStreamStream>, Status> {
        Err(Status::unimplemented("the benchmark's fan-out proxy serves Predict only"))
    }

    async fn get_budget(&self, _: Request<GetBudgetRequest>) -> Result<Response<Budget>, Status> {
        Err(Status::unimplemented("the benchmark's fan-out proxy has no budgets"))
    }
}

/// Binds the proxy to a free loopback port for the teachers `settings`
/// names (which must be remote: the bench's own demo server), recording
/// its fan-out in `metrics` as the privatizer does; returns its address
/// and the future that serves until `shutdown` resolves.
///
/// # Errors
/// Demo teachers in the settings, an unusable teacher endpoint, or no
/// free port.
pub async fn start(
    settings: &Settings,
    metrics: &Metrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(SocketAddr, impl Future<Output = Result<(), tonic::transport::Error>> + Send + 'static)> {
    let TeacherSource::Remote(teachers) = &settings.model.teachers else {
        bail!("the proxy asks teachers that already run; the bench passes its own as remote teachers");
    };
    let ensemble = Ensemble::new(
        teachers.clone(),
        settings.model.call.clone(),
        settings.model.mode,
        settings.model.batching,
        &metrics.teachers,
        // Nothing waits for the proxy's answers: it stores nothing.
        Default::default(),
    )?;
    let input = InputSpec { shape: settings.model.input_shape.clone(), release_noisy: false, max_rows: 1 };
    let service = PrivatizerServer::new(Proxy { ensemble, input })
        .max_decoding_message_size(settings.max_message_bytes)
        .max_encoding_message_size(settings.max_message_bytes);
    let listener = TcpListener::bind("127.0.0.1:0").await.context("binding the proxy's listener")?;
    let addr = listener.local_addr()?;
    anyhow::ensure!(settings.tls.is_none(), "the proxy baseline runs plaintext on loopback");
    let server = pacpriv_service::net::builder(&settings.limits)
        .add_service(service)
        // Accepted exactly as the service accepts (TCP_NODELAY): the
        // baseline must not wait for delayed ACKs the privatizer does not.
        .serve_with_incoming_shutdown(pacpriv_service::net::incoming(listener), shutdown);
    Ok((addr, server))
}

#[cfg(test)]
mod test {
    use super::majority;

    #[test]
    fn majority_takes_the_most_frequent_and_the_smallest_on_ties() {
        assert_eq!(majority(&[3, 3, 1, 2], 10), 3);
        assert_eq!(majority(&[7, 2, 7, 2], 10), 2);
        assert_eq!(majority(&[9], 10), 9);
    }
}
