//! A fault-injecting teacher proxy: a real Open Inference Protocol server
//! on a loopback port that forwards every call to real teachers (a
//! `pacpriv teachers` process) and, on the way back, can
//!
//! - **slow** a model down (a delay before forwarding, set at run time), and
//! - **corrupt** a reply: a query whose third feature is a
//!   [`Corruption::marker`] gets that corruption in every reply that
//!   carries it (or only the replies of one model), on every attempt — so the fault is certain, not a race
//!   with retries, and a test knows exactly which queries must fail.
//!
//! It also counts the `ModelInfer` calls each model received.

use pacpriv_service::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use pacpriv_service::proto::inference::grpc_inference_service_server::{
    GrpcInferenceService, GrpcInferenceServiceServer,
};
use pacpriv_service::proto::inference::model_infer_response::InferOutputTensor;
use pacpriv_service::proto::inference::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// The feature a corruption marker goes in (features 0 and 1 belong to
/// [`super::distinct`]).
pub const MARKER_FEATURE: usize = 2;

/// What a corrupted reply gets wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Corruption {
    /// The labels' declared shape disagrees with their count.
    Shape,
    /// A datatype that is not a number (BYTES).
    Datatype,
    /// Scores instead of labels, NaN for the marked example.
    NanScores,
    /// A label outside the d classes for the marked example.
    ClassCount,
}

impl Corruption {
    /// Every kind.
    pub const ALL: [Corruption; 4] =
        [Corruption::Shape, Corruption::Datatype, Corruption::NanScores, Corruption::ClassCount];

    /// The value of feature [`MARKER_FEATURE`] that asks for this
    /// corruption (far outside the digits' 0–16, never sent otherwise).
    pub fn marker(self) -> f32 {
        1000.0 + Self::ALL.iter().position(|c| *c == self).unwrap_or(0) as f32
    }

    fn of(row: &[f32]) -> Option<Corruption> {
        let v = *row.get(MARKER_FEATURE)?;
        Self::ALL.into_iter().find(|c| c.marker() == v)
    }

    /// Rewrites `reply` (a demo teacher's: `label` INT64 `[n]`, then
    /// `probabilities` FP32 `[n, d]`) for a batch whose example `row` is
    /// marked.
    fn apply(self, reply: &mut ModelInferResponse, row: usize) {
        let Some(probabilities) = reply.outputs.get(1).cloned() else { return };
        let Some(label) = reply.outputs.first_mut() else { return };
        let n = label.shape.first().copied().unwrap_or(0);
        match self {
            Corruption::Shape => label.shape = vec![n, 2],
            Corruption::Datatype => {
                let labels = label.contents.take().map(|c| c.int64_contents).unwrap_or_default();
                label.datatype = "BYTES".into();
                label.contents = Some(InferTensorContents {
                    bytes_contents: labels.iter().map(|l| l.to_string().into_bytes()).collect(),
                    ..Default::default()
                });
            }
            Corruption::NanScores => {
                let mut scores: InferOutputTensor = probabilities;
                let d = scores.shape.get(1).copied().unwrap_or(0) as usize;
                if let Some(c) = scores.contents.as_mut() {
                    for v in c.fp32_contents.iter_mut().skip(row * d).take(d) {
                        *v = f32::NAN;
                    }
                }
                *label = scores;
            }
            Corruption::ClassCount => {
                let d = probabilities.shape.get(1).copied().unwrap_or(0);
                if let Some(l) = label.contents.as_mut().and_then(|c| c.int64_contents.get_mut(row)) {
                    *l = d;
                }
            }
        }
        reply.outputs.truncate(1);
    }
}

#[derive(Default)]
struct State {
    /// Model name → delay added before forwarding.
    slow: Mutex<HashMap<String, Duration>>,
    /// Model name → `ModelInfer` calls received.
    calls: Mutex<HashMap<String, u64>>,
    /// The `traceparent` of every `ModelInfer` call (and its `tracestate`,
    /// if any), by model.
    traceparents: Mutex<HashMap<String, Vec<String>>>,
    /// Replies corrupted, by kind.
    corrupted: Mutex<HashMap<Corruption, u64>>,
    /// The one model whose marked replies are corrupted; `None`: every
    /// model's.
    corrupting: Mutex<Option<String>>,
}

/// The running proxy; stops when dropped.
pub struct FaultyTeachers {
    /// `http://127.0.0.1:PORT`, for a teacher spec's endpoint.
    pub endpoint: String,
    state: Arc<State>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl FaultyTeachers {
    /// Serves on a free loopback port, forwarding to the teachers at
    /// `upstream` (`HOST:PORT`).
    pub async fn start(upstream: &str) -> FaultyTeachers {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{upstream}")).expect("upstream uri").connect_lazy();
        let state = Arc::new(State::default());
        let proxy = Proxy { upstream: GrpcInferenceServiceClient::new(channel), state: Arc::clone(&state) };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds loopback");
        let endpoint = format!("http://{}", listener.local_addr().expect("bound"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(GrpcInferenceServiceServer::new(proxy))
                .serve_with_incoming_shutdown(tonic::transport::server::TcpIncoming::from(listener), async {
                    let _ = stopped.await;
                }),
        );
        FaultyTeachers { endpoint, state, _stop: stop }
    }

    /// Delays every later call to `model` by `delay` (zero: none).
    pub fn slow(&self, model: &str, delay: Duration) {
        let mut slow = self.state.slow.lock().expect("slow");
        if delay.is_zero() {
            slow.remove(model);
        } else {
            slow.insert(model.to_owned(), delay);
        }
    }

    /// From now on, only `model`'s replies are corrupted.
    pub fn corrupt_only(&self, model: &str) {
        *self.state.corrupting.lock().expect("corrupting") = Some(model.to_owned());
    }

    /// `ModelInfer` calls received, by model.
    pub fn calls(&self) -> HashMap<String, u64> {
        self.state.calls.lock().expect("calls").clone()
    }

    /// The W3C `traceparent` each `ModelInfer` call carried, by model.
    pub fn traceparents(&self) -> HashMap<String, Vec<String>> {
        self.state.traceparents.lock().expect("traceparents").clone()
    }

    /// Replies corrupted so far, by kind.
    pub fn corrupted(&self) -> HashMap<Corruption, u64> {
        self.state.corrupted.lock().expect("corrupted").clone()
    }
}

/// Writes a `serve --config` file whose m teachers are the demo models
/// `digits-000` … at `endpoint(i)`.
pub fn write_config(path: &std::path::Path, m: usize, endpoint: impl Fn(usize) -> String) {
    let mut toml = String::from("[teachers]\nsource = \"remote\"\nremote = [\n");
    for i in 0..m {
        toml.push_str(&format!("  {{ endpoint = {:?}, model = \"digits-{i:03}\" }},\n", endpoint(i)));
    }
    toml.push_str("]\n");
    std::fs::write(path, toml).expect("config written");
}

struct Proxy {
    upstream: GrpcInferenceServiceClient<Channel>,
    state: Arc<State>,
}

impl Proxy {
    fn client(&self) -> GrpcInferenceServiceClient<Channel> {
        self.upstream.clone()
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for Proxy {
    async fn server_live(&self, r: Request<ServerLiveRequest>) -> Result<Response<ServerLiveResponse>, Status> {
        self.client().server_live(r.into_inner()).await
    }

    async fn server_ready(&self, r: Request<ServerReadyRequest>) -> Result<Response<ServerReadyResponse>, Status> {
        self.client().server_ready(r.into_inner()).await
    }

    async fn model_ready(&self, r: Request<ModelReadyRequest>) -> Result<Response<ModelReadyResponse>, Status> {
        self.client().model_ready(r.into_inner()).await
    }

    async fn server_metadata(
        &self,
        r: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        self.client().server_metadata(r.into_inner()).await
    }

    async fn model_metadata(
        &self,
        r: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        self.client().model_metadata(r.into_inner()).await
    }

    async fn repository_index(
        &self,
        r: Request<RepositoryIndexRequest>,
    ) -> Result<Response<RepositoryIndexResponse>, Status> {
        self.client().repository_index(r.into_inner()).await
    }

    async fn model_infer(&self, r: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
        let header = |name: &str| r.metadata().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        // A tracestate, when one is sent, is recorded after the traceparent.
        let traceparent = header("traceparent").map(|t| match header("tracestate") {
            Some(state) => format!("{t} tracestate={state}"),
            None => t,
        });
        let r = r.into_inner();
        if let Some(t) = traceparent {
            self.state.traceparents.lock().expect("traceparents").entry(r.model_name.clone()).or_default().push(t);
        }
        *self.state.calls.lock().expect("calls").entry(r.model_name.clone()).or_default() += 1;
        let delay = self.state.slow.lock().expect("slow").get(&r.model_name).copied();
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let marked = r.inputs.first().and_then(|input| {
            let features = input.shape.get(1).copied().unwrap_or(0) as usize;
            let values = &input.contents.as_ref()?.fp32_contents;
            values.chunks(features.max(1)).enumerate().find_map(|(row, v)| Some((row, Corruption::of(v)?)))
        });
        let corrupting = self.state.corrupting.lock().expect("corrupting").clone();
        let marked = marked.filter(|_| corrupting.is_none_or(|m| m == r.model_name));
        let mut reply = self.client().model_infer(r).await?;
        if let Some((row, corruption)) = marked {
            corruption.apply(reply.get_mut(), row);
            *self.state.corrupted.lock().expect("corrupted").entry(corruption).or_default() += 1;
        }
        Ok(reply)
    }
}
