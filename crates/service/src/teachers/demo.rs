//! The demo ensemble as an Open Inference Protocol server: every teacher is
//! a model `digits-NNN` with input `input-0` (FP32 or FP64, shape [n, 64])
//! and outputs `label` (INT64 `[n]`) and `probabilities` (FP32 `[n, 10]`), the
//! way MLServer serves a scikit-learn classifier. The model
//! `digits-ensemble` ([`STACKED_MODEL`]) answers for all m teachers at once:
//! `label` INT64 [n, m] and `probabilities` FP32 [n, m, 10], teachers in
//! subset order — the layout of an ensemble hosted as one model.

use super::TeacherSpec;
use crate::proto::inference::grpc_inference_service_server::GrpcInferenceService;
use crate::proto::inference::model_infer_response::InferOutputTensor;
use crate::proto::inference::model_metadata_response::TensorMetadata;
use crate::proto::inference::*;
use crate::tensor;
use pacpriv_demo::digits::{CLASSES, FEATURES};
use pacpriv_demo::{STACKED_MODEL, Teacher, model_name};
use std::collections::HashMap;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub use crate::proto::inference::grpc_inference_service_server::GrpcInferenceServiceServer;

/// The fan-out's view of `m` demo teachers served at `addr`.
pub fn specs(addr: std::net::SocketAddr, m: usize) -> Vec<TeacherSpec> {
    (0..m)
        .map(|i| TeacherSpec {
            endpoint: format!("http://{addr}"),
            model: model_name(i),
            version: String::new(),
            connection: Default::default(),
        })
        .collect()
}

/// The fan-out's view of the stacked model served at `addr`.
pub fn stacked_spec(addr: std::net::SocketAddr) -> TeacherSpec {
    TeacherSpec {
        endpoint: format!("http://{addr}"),
        model: STACKED_MODEL.into(),
        version: String::new(),
        connection: Default::default(),
    }
}

/// What a demo teacher server asks of its callers.
#[derive(Default)]
pub struct Guard {
    /// TLS, and client certificates when its configuration asks for them.
    pub tls: Option<Arc<crate::net::tls::ServerTls>>,
    /// The bearer token every call must carry.
    pub bearer: Option<String>,
}

/// Serves a set of trained teachers by name.
#[derive(Clone)]
pub struct DemoServer {
    teachers: Arc<Vec<Teacher>>,
    index: Arc<HashMap<String, usize>>,
}

impl DemoServer {
    /// Serves `teachers[i]` as [`model_name`]`(i)`.
    pub fn new(teachers: Vec<Teacher>) -> Self {
        let index = (0..teachers.len()).map(|i| (model_name(i), i)).collect();
        DemoServer { teachers: Arc::new(teachers), index: Arc::new(index) }
    }

    /// Serves over the Open Inference Protocol on `listener` until
    /// `shutdown` resolves.
    ///
    /// # Errors
    /// The transport failed.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        self.serve_with(listener, Guard::default(), shutdown).await
    }

    /// As [`DemoServer::serve`], behind `guard`: TLS (and client
    /// certificates) and a bearer token every call must carry — an
    /// inference server deployed the way `teachers.remote`'s connection
    /// settings expect (`pacpriv teachers --tls-cert …`).
    ///
    /// # Errors
    /// The transport failed.
    pub async fn serve_with(
        self,
        listener: tokio::net::TcpListener,
        guard: Guard,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        let token = guard.bearer.map(|t| format!("Bearer {t}"));
        let check = move |request: Request<()>| -> Result<Request<()>, Status> {
            match &token {
                Some(want) => {
                    let got = request.metadata().get("authorization").and_then(|v| v.to_str().ok());
                    if got.is_some_and(|g| subtle::ConstantTimeEq::ct_eq(g.as_bytes(), want.as_bytes()).into()) {
                        Ok(request)
                    } else {
                        Err(Status::unauthenticated("this teacher server wants `authorization: Bearer <token>`"))
                    }
                }
                None => Ok(request),
            }
        };
        // grpc.health.v1 too (SERVING once listening; no credentials: it
        // says nothing about the models), for container and Kubernetes probes.
        let (_, health) = tonic_health::server::health_reporter();
        let router = tonic::transport::Server::builder()
            .add_service(health)
            .add_service(GrpcInferenceServiceServer::with_interceptor(self, check));
        match guard.tls {
            None => router.serve_with_incoming_shutdown(crate::net::incoming(listener), shutdown).await,
            Some(tls) => {
                let stop = tokio_util::sync::CancellationToken::new();
                let _stop_on_exit = stop.clone().drop_guard();
                let h2 = crate::net::tls::Alpn::H2;
                let slots = crate::net::guard::Slots::new(1024, 1024);
                let connections =
                    crate::net::tls_incoming(listener, tls, h2, stop, slots, crate::net::guard::Watch::Nothing);
                router.serve_with_incoming_shutdown(connections, shutdown).await
            }
        }
    }

    /// The teachers a model name stands for: one, or all (stacked).
    fn teachers(&self, name: &str, version: &str) -> Result<Vec<&Teacher>, Status> {
        if !(version.is_empty() || version == "1") {
            return Err(Status::not_found(format!("model {name} has only version 1, not {version:?}")));
        }
        if name == STACKED_MODEL {
            return Ok(self.teachers.iter().collect());
        }
        self.index.get(name).and_then(|&i| self.teachers.get(i)).map(|t| vec![t]).ok_or_else(|| {
            Status::not_found(format!(
                "no model named {name:?}; models are digits-000 … {} and {STACKED_MODEL}",
                model_name(self.teachers.len().saturating_sub(1))
            ))
        })
    }

    /// Whether `name` is the stacked model: its outputs carry a teacher
    /// dimension.
    fn stacked(name: &str) -> bool {
        name == STACKED_MODEL
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for DemoServer {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> Result<Response<ServerReadyResponse>, Status> {
        Ok(Response::new(ServerReadyResponse { ready: true }))
    }

    async fn model_ready(&self, req: Request<ModelReadyRequest>) -> Result<Response<ModelReadyResponse>, Status> {
        let r = req.get_ref();
        Ok(Response::new(ModelReadyResponse { ready: self.teachers(&r.name, &r.version).is_ok() }))
    }

    async fn repository_index(
        &self,
        _: Request<RepositoryIndexRequest>,
    ) -> Result<Response<RepositoryIndexResponse>, Status> {
        let names = (0..self.teachers.len()).map(model_name).chain([STACKED_MODEL.to_owned()]);
        let models = names
            .map(|name| repository_index_response::ModelIndex {
                name,
                version: String::new(),
                state: "READY".into(),
                reason: String::new(),
            })
            .collect();
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: "pacpriv-demo-teachers".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: vec![],
        }))
    }

    async fn model_metadata(
        &self,
        req: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let r = req.get_ref();
        let m = self.teachers(&r.name, &r.version)?.len() as i64;
        // A per-teacher model's outputs have no teacher dimension.
        let teachers: Vec<i64> = if Self::stacked(&r.name) { vec![m] } else { vec![] };
        let meta = |name: &str, datatype: &str, shape: Vec<i64>| TensorMetadata {
            name: name.into(),
            datatype: datatype.into(),
            shape,
        };
        Ok(Response::new(ModelMetadataResponse {
            name: r.name.clone(),
            versions: vec!["1".into()],
            platform: "linfa-logistic".into(),
            inputs: vec![meta("input-0", "FP32", vec![-1, FEATURES as i64])],
            outputs: vec![
                meta("label", "INT64", [&[-1][..], &teachers].concat()),
                meta("probabilities", "FP32", [&[-1][..], &teachers, &[CLASSES as i64]].concat()),
            ],
        }))
    }

    async fn model_infer(&self, req: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
        let r = req.into_inner();
        let teachers = self.teachers(&r.model_name, &r.model_version)?;
        let [input] = r.inputs.as_slice() else {
            return Err(Status::invalid_argument(format!("expected exactly one input tensor, got {}", r.inputs.len())));
        };
        let rows = match input.shape.as_slice() {
            [n, f] if *f == FEATURES as i64 && *n >= 0 => *n,
            [f] if *f == FEATURES as i64 => 1,
            other => {
                return Err(Status::invalid_argument(format!("input shape must be [n, {FEATURES}], got {other:?}")));
            }
        };
        let raw = r.raw_input_contents.first().map(Vec::as_slice);
        let pixels = tensor::decode_floats(&input.datatype, &[rows, FEATURES as i64], input.contents.as_ref(), raw)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        // probs[t][i]: teacher t's probabilities for example i.
        let probs: Vec<Vec<[f64; CLASSES]>> = teachers.iter().map(|t| t.predict_proba(&pixels)).collect();
        let m = teachers.len();
        // Row-major [n, m]: example i's teachers side by side.
        let cells = || (0..rows as usize).flat_map(|i| probs.iter().map(move |p| &p[i]));
        let labels: Vec<i64> = cells().map(|p| pacpriv_privacy::mechanism::argmax(p.iter().copied()) as i64).collect();
        let teacher_dim: Vec<i64> = if Self::stacked(&r.model_name) { vec![m as i64] } else { vec![] };
        let all = [
            InferOutputTensor {
                name: "label".into(),
                datatype: "INT64".into(),
                shape: [&[rows][..], &teacher_dim].concat(),
                contents: Some(InferTensorContents { int64_contents: labels, ..Default::default() }),
                ..Default::default()
            },
            InferOutputTensor {
                name: "probabilities".into(),
                datatype: "FP32".into(),
                shape: [&[rows][..], &teacher_dim, &[CLASSES as i64]].concat(),
                contents: Some(InferTensorContents {
                    fp32_contents: cells().flatten().map(|&v| v as f32).collect(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ];
        let outputs = if r.outputs.is_empty() {
            all.to_vec()
        } else {
            r.outputs
                .iter()
                .map(|want| {
                    all.iter().find(|o| o.name == want.name).cloned().ok_or_else(|| {
                        Status::invalid_argument(format!(
                            "no output named {:?}; outputs are label, probabilities",
                            want.name
                        ))
                    })
                })
                .collect::<Result<_, _>>()?
        };
        Ok(Response::new(ModelInferResponse {
            model_name: r.model_name,
            model_version: "1".into(),
            id: r.id,
            outputs,
            ..Default::default()
        }))
    }
}
