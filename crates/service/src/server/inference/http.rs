//! The Open Inference Protocol's HTTP/REST binding (KServe v2, as Triton
//! serves it) for every model of the server, on its own listener
//! (`server.http_listen`): what `tritonclient.http`, KServe's Python SDK
//! or `curl` call.
//!
//! - `GET /v2/health/live`, `GET /v2/health/ready` (503 while the teachers
//!   are not ready, or the server drains), `GET /v2` (server metadata);
//! - `GET /v2/models/{model}[/versions/{v}]` (metadata) and
//!   `…/ready`; `POST /v2/repository/index` (every model, version and
//!   state, as Triton's repository extension lists them);
//! - `POST /v2/models/{model}[/versions/{v}]/infer`: JSON tensors, or
//!   Triton's binary tensor extension (`Inference-Header-Content-Length`:
//!   the JSON header, then each input's raw bytes; an output asked for with
//!   `"binary_data": true` comes back the same way).
//!
//! An inference request is read into the gRPC `ModelInferRequest` and
//! takes exactly its path ([`Infer::parse`] → [`predict::handle`] →
//! [`Infer::respond`]): the same credential headers (`x-api-key` or
//! `Authorization: Bearer`), the same accounting, the same errors. An
//! error is the gRPC status mapped to its HTTP code (400, 401, 404, 412,
//! 429 — with `Retry-After` when rate limited — 503, …) with a JSON body
//! `{"error": message, "reason": REASON, "charged": bool, "metadata": {…}}`
//! carrying the status's `ErrorInfo`.

use super::model_infer::Infer;
use super::{InferenceService, metadata};
use crate::metrics::{Outcome, Rpc};
use crate::net::connection::Connection;
use crate::proto::inference::infer_parameter::ParameterChoice;
use crate::proto::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use crate::proto::inference::model_infer_response::InferOutputTensor;
use crate::proto::inference::{
    InferParameter, InferTensorContents, ModelInferRequest, ModelInferResponse, StatisticDuration,
};
use crate::server::status::{self, ServiceError};
use crate::server::{App, auth, predict};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Extension, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tonic::Code;
use tracing::Instrument;

/// The most the repository index's (optional) body may hold, bytes.
const INDEX_BODY: usize = 256;

/// Triton's binary tensor extension: the length of the JSON part of a body.
const HEADER_LENGTH: &str = "inference-header-content-length";

/// How an inference request's body is read: only once its credential is
/// known to name a principal, at most `max_bytes`
/// (`server.max_message_bytes`; 413), within `timeout`
/// (`server.request_timeout_ms`; 408).
#[derive(Clone, Copy)]
struct BodyLimits {
    max_bytes: usize,
    timeout: Duration,
}

/// The routes of `app`'s models; an inference body
/// is read only after its credential is checked, at most `max_bytes` of it
/// (larger ones are refused, 413, without being read when their
/// Content-Length says so) and within `timeout` (408).
pub fn router(app: Arc<App>, max_bytes: usize, timeout: Duration) -> Router {
    let service = Arc::new(InferenceService::new(app));
    Router::new()
        .route("/v2/health/live", get(|| async { Json(json!({ "live": true })) }))
        .route("/v2/health/ready", get(server_ready))
        .route("/v2", get(|| async { Json(server_metadata()) }))
        // Unauthenticated: its optional body is a few bytes, so no more
        // is read.
        .route("/v2/repository/index", post(repository_index))
        // Load and unload are the admin listener's (gRPC, admin token).
        .route("/v2/repository/models/{model}/load", post(not_here).layer(DefaultBodyLimit::max(INDEX_BODY)))
        .route("/v2/repository/models/{model}/unload", post(not_here).layer(DefaultBodyLimit::max(INDEX_BODY)))
        .route("/v2/models/{model}", get(model_metadata))
        .route("/v2/models/{model}/versions/{version}", get(model_metadata))
        .route("/v2/models/{model}/ready", get(model_ready))
        .route("/v2/models/stats", get(every_statistics))
        .route("/v2/models/{model}/stats", get(model_statistics))
        .route("/v2/models/{model}/versions/{version}/stats", get(model_statistics))
        .route("/v2/models/{model}/versions/{version}/ready", get(model_ready))
        .route("/v2/models/{model}/infer", post(infer))
        .route("/v2/models/{model}/versions/{version}/infer", post(infer))
        .layer(Extension(BodyLimits { max_bytes, timeout }))
        .with_state(service)
}

/// A JSON body.
struct Json(Value);

impl IntoResponse for Json {
    fn into_response(self) -> Response {
        ([(header::CONTENT_TYPE, "application/json")], self.0.to_string()).into_response()
    }
}

/// `{model}` and the optional `{version}` of a path.
#[derive(Deserialize)]
struct ModelPath {
    model: String,
    #[serde(default)]
    version: String,
}

fn server_metadata() -> Value {
    let m = metadata::server();
    json!({ "name": m.name, "version": m.version, "extensions": m.extensions })
}

async fn server_ready(State(s): State<Arc<InferenceService>>) -> Response {
    let ready = s.ready();
    let code = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, Json(json!({ "ready": ready }))).into_response()
}

/// The index as Triton's HTTP binding returns it: a JSON array. The body
/// (`{"ready": true}` asks for the ready models only) is optional.
async fn repository_index(
    State(s): State<Arc<InferenceService>>,
    Extension(limits): Extension<BodyLimits>,
    body: Body,
) -> Response {
    #[derive(Deserialize, Default)]
    struct IndexRequest {
        #[serde(default)]
        ready: bool,
    }
    // Anyone may ask, so a body that never arrives must not hold the
    // connection past server.request_timeout_ms.
    let Ok(body) = tokio::time::timeout(limits.timeout, axum::body::to_bytes(body, INDEX_BODY)).await else {
        let message = "the request body did not arrive within server.request_timeout_ms";
        return (StatusCode::REQUEST_TIMEOUT, Json(json!({ "error": message }))).into_response();
    };
    // A body past INDEX_BODY bytes, or cut off, is no index request.
    let asked = match body {
        Ok(body) if body.iter().all(u8::is_ascii_whitespace) => Some(IndexRequest::default()),
        Ok(body) => serde_json::from_slice::<IndexRequest>(&body).ok(),
        Err(_) => None,
    };
    let Some(asked) = asked else {
        let message = "the repository index takes an empty body or {\"ready\": true|false}";
        return error(ServiceError::InvalidInput(message.into()).into());
    };
    let models: Vec<Value> = super::index(&s.app, asked.ready)
        .into_iter()
        .map(|m| json!({ "name": m.name, "version": m.version, "state": m.state, "reason": m.reason }))
        .collect();
    Json(Value::Array(models)).into_response()
}

/// Load and unload asked of the client listener: refused, saying where
/// they are served.
async fn not_here() -> Response {
    let message = super::LOAD_ON_ADMIN;
    (StatusCode::FORBIDDEN, Json(json!({ "error": message, "reason": status::reason::ADMIN_ONLY, "charged": false })))
        .into_response()
}

async fn model_metadata(State(s): State<Arc<InferenceService>>, Path(p): Path<ModelPath>) -> Response {
    let m = match s.names(&p.model, &p.version) {
        Ok(model) => s.metadata(&model),
        Err(e) => return error(e.into()),
    };
    let tensors = |ts: Vec<crate::proto::inference::model_metadata_response::TensorMetadata>| -> Vec<Value> {
        ts.into_iter().map(|t| json!({ "name": t.name, "datatype": t.datatype, "shape": t.shape })).collect()
    };
    Json(json!({
        "name": m.name,
        "versions": m.versions,
        "platform": m.platform,
        "inputs": tensors(m.inputs),
        "outputs": tensors(m.outputs),
    }))
    .into_response()
}

async fn model_ready(State(s): State<Arc<InferenceService>>, Path(p): Path<ModelPath>) -> Response {
    let ready = match s.names(&p.model, &p.version) {
        Ok(model) => s.model_ready(&model),
        Err(e) => return error(e.into()),
    };
    let code = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, Json(json!({ "name": p.model, "ready": ready }))).into_response()
}

/// The caller the credential in `headers` names, as gRPC's check finds
/// it; presented on `connection` (whose lookups of unknown keys it counts
/// against, and which it marks authenticated). A refusal of a `query` is
/// counted as that query's outcome.
async fn caller(
    app: &App,
    connection: Option<&Arc<Connection>>,
    headers: &HeaderMap,
    query: bool,
) -> Result<crate::session::Caller, tonic::Status> {
    let mut extensions = tonic::Extensions::default();
    if let Some(connection) = connection {
        extensions.insert(Arc::clone(connection));
    }
    let credentials =
        tonic::Request::from_parts(tonic::metadata::MetadataMap::from_headers(headers.clone()), extensions, ());
    let caller = if query {
        auth::querier(app, &credentials).await?
    } else {
        auth::authenticate(&app.sessions, &credentials, app.principal_from_cert).await?
    };
    if let Some(connection) = connection {
        connection.authenticate(caller.principal());
    }
    Ok(caller)
}

/// Triton's statistics extension over HTTP: one model's (every version)
/// or one version's, for a principal.
async fn model_statistics(
    State(s): State<Arc<InferenceService>>,
    Path(p): Path<ModelPath>,
    connection: Option<Extension<Arc<Connection>>>,
    headers: HeaderMap,
) -> Response {
    statistics(&s, connection.map(|Extension(c)| c), &headers, &p.model, &p.version).await
}

/// Every model's statistics, for a principal.
async fn every_statistics(
    State(s): State<Arc<InferenceService>>,
    connection: Option<Extension<Arc<Connection>>>,
    headers: HeaderMap,
) -> Response {
    statistics(&s, connection.map(|Extension(c)| c), &headers, "", "").await
}

/// The statistics of `name` at `version` (empty: every one) in Triton's
/// JSON, if `headers` name a principal.
async fn statistics(
    s: &InferenceService,
    connection: Option<Arc<Connection>>,
    headers: &HeaderMap,
    name: &str,
    version: &str,
) -> Response {
    if let Err(status) = caller(&s.app, connection.as_ref(), headers, false).await {
        return error(status);
    }
    let stats = match super::statistics(&s.app, name, version) {
        Ok(stats) => stats,
        Err(e) => return error(e.into()),
    };
    let duration = |d: Option<StatisticDuration>| {
        let d = d.unwrap_or_default();
        json!({ "count": d.count, "ns": d.ns })
    };
    let models: Vec<Value> = stats
        .into_iter()
        .map(|m| {
            let i = m.inference_stats.unwrap_or_default();
            json!({
                "name": m.name,
                "version": m.version,
                "last_inference": m.last_inference,
                "inference_count": m.inference_count,
                "execution_count": m.execution_count,
                "inference_stats": {
                    "success": duration(i.success),
                    "fail": duration(i.fail),
                    "queue": duration(i.queue),
                    "compute_input": duration(i.compute_input),
                    "compute_infer": duration(i.compute_infer),
                    "compute_output": duration(i.compute_output),
                },
                "batch_stats": [],
            })
        })
        .collect();
    Json(json!({ "model_stats": models })).into_response()
}

async fn infer(
    State(s): State<Arc<InferenceService>>,
    Extension(limits): Extension<BodyLimits>,
    Path(p): Path<ModelPath>,
    connection: Option<Extension<Arc<Connection>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let span = crate::server::rpc_span(Rpc::HttpInfer, &crate::trace::Headers(&headers));
    let connection = connection.map(|Extension(c)| c);
    infer_traced(s, limits, p, connection, headers, body).instrument(span).await
}

async fn infer_traced(
    s: Arc<InferenceService>,
    limits: BodyLimits,
    p: ModelPath,
    connection: Option<Arc<Connection>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let app = &s.app;
    // The same credential check as gRPC's, before a byte of the body is
    // read: an unknown client cannot make the server buffer (or wait for)
    // anything.
    let handle = match caller(app, connection.as_ref(), &headers, true).await {
        Ok(h) => h,
        Err(status) => return error(status),
    };
    let body = match read_body(&headers, body, limits).await {
        Ok(body) => body,
        Err((code, message)) => {
            app.metrics.service.query(Outcome::Invalid);
            let body = json!({ "error": message, "reason": status::reason::INVALID_INPUT, "charged": false });
            return (code, Json(body)).into_response();
        }
    };
    // The model and version travel in the request (from the path) and
    // are resolved where the query is asked (`predict::ask`).
    let parsed = read_request(&headers, &body, &p)
        .and_then(|(request, binary)| Infer::parse(request).map(|(predict, infer)| (predict, infer, binary)));
    let (request, infer, binary) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            app.metrics.service.query(status::outcome(&e));
            return error(e.into());
        }
    };
    match predict::handle(app, &handle, request, Rpc::HttpInfer).await {
        Ok(answer) => write_response(&infer.respond(answer), &binary),
        Err(e) => error(e.into()),
    }
}

/// The whole body within `limits`: one whose Content-Length is over the
/// limit is refused unread; one that grows past it, or does not arrive in
/// time, is refused where it stands.
async fn read_body(headers: &HeaderMap, body: Body, limits: BodyLimits) -> Result<Bytes, (StatusCode, String)> {
    let too_large = || {
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body is larger than server.max_message_bytes ({} bytes): send fewer rows per request",
                limits.max_bytes
            ),
        )
    };
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_bytes as u64) {
        return Err(too_large());
    }
    match tokio::time::timeout(limits.timeout, axum::body::to_bytes(body, limits.max_bytes)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(e)) if std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>()) => {
            Err(too_large())
        }
        Ok(Err(e)) => Err((StatusCode::BAD_REQUEST, format!("the request body could not be read ({e})"))),
        Err(_) => Err((
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request body did not arrive within server.request_timeout_ms ({} ms); nothing was charged",
                limits.timeout.as_millis()
            ),
        )),
    }
}

/// A KServe v2 inference request body (the JSON part).
#[derive(Deserialize)]
struct RequestJson {
    #[serde(default)]
    id: String,
    #[serde(default)]
    parameters: Map<String, Value>,
    inputs: Vec<InputJson>,
    #[serde(default)]
    outputs: Vec<OutputJson>,
}

#[derive(Deserialize)]
struct InputJson {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Map<String, Value>,
    data: Option<Value>,
}

#[derive(Deserialize)]
struct OutputJson {
    name: String,
    #[serde(default)]
    parameters: Map<String, Value>,
}

/// Which outputs go back as binary: all, or those named.
struct Binary {
    all: bool,
    named: Vec<String>,
}

impl Binary {
    fn wants(&self, name: &str) -> bool {
        self.all || self.named.iter().any(|n| n == name)
    }
}

/// The body as the gRPC request it stands for, and which outputs to send
/// back as binary.
fn read_request(
    headers: &HeaderMap,
    body: &[u8],
    path: &ModelPath,
) -> Result<(ModelInferRequest, Binary), ServiceError> {
    let bad = ServiceError::InvalidInput;
    let (json_part, mut binary) = match headers.get(HEADER_LENGTH) {
        Some(v) => {
            let n =
                v.to_str().ok().and_then(|s| s.trim().parse::<usize>().ok()).filter(|&n| n <= body.len()).ok_or_else(
                    || bad(format!("header {HEADER_LENGTH} must be a length within the body's {} bytes", body.len())),
                )?;
            body.split_at(n)
        }
        None => (body, &[][..]),
    };
    let request: RequestJson = serde_json::from_slice(json_part)
        .map_err(|e| bad(format!("the body is not a KServe v2 inference request ({e})")))?;
    let mut raw_input_contents = Vec::new();
    let mut inputs = Vec::with_capacity(request.inputs.len());
    for input in request.inputs {
        let mut tensor = InferInputTensor {
            name: input.name.clone(),
            datatype: input.datatype.clone(),
            shape: input.shape,
            ..Default::default()
        };
        match (input.parameters.get("binary_data_size"), input.data) {
            (Some(size), None) => {
                let size = size
                    .as_u64()
                    .and_then(|s| usize::try_from(s).ok())
                    .filter(|&s| s <= binary.len())
                    .ok_or_else(|| bad(format!("input {:?}: binary_data_size is beyond the body", input.name)))?;
                let (bytes, rest) = binary.split_at(size);
                raw_input_contents.push(bytes.to_vec());
                binary = rest;
            }
            (None, Some(data)) => tensor.contents = Some(contents(&input.name, &input.datatype, &data)?),
            (Some(_), Some(_)) => {
                return Err(bad(format!("input {:?} has both data and binary_data_size", input.name)));
            }
            (None, None) => return Err(bad(format!("input {:?} has no data", input.name))),
        }
        inputs.push(tensor);
    }
    if !binary.is_empty() {
        return Err(bad(format!("{} bytes of binary data follow the inputs that use none", binary.len())));
    }
    let flag = |p: &Map<String, Value>, key: &str| p.get(key).and_then(Value::as_bool).unwrap_or(false);
    let binary = Binary {
        all: flag(&request.parameters, "binary_data_output"),
        named: request.outputs.iter().filter(|o| flag(&o.parameters, "binary_data")).map(|o| o.name.clone()).collect(),
    };
    let parameters = request
        .parameters
        .into_iter()
        .filter_map(|(k, v)| parameter(&v).map(|p| (k, InferParameter { parameter_choice: Some(p) })))
        .collect();
    let outputs = request
        .outputs
        .into_iter()
        .map(|o| InferRequestedOutputTensor { name: o.name, ..Default::default() })
        .collect();
    let request = ModelInferRequest {
        model_name: path.model.clone(),
        model_version: path.version.clone(),
        id: request.id,
        parameters,
        inputs,
        outputs,
        raw_input_contents,
    };
    Ok((request, binary))
}

/// A JSON parameter value as the gRPC one (null and nested values are
/// left out: no parameter the model reads takes them).
fn parameter(v: &Value) -> Option<ParameterChoice> {
    match v {
        Value::Bool(b) => Some(ParameterChoice::BoolParam(*b)),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Some(ParameterChoice::Int64Param(i)),
            None => n.as_f64().map(ParameterChoice::DoubleParam),
        },
        Value::String(s) => Some(ParameterChoice::StringParam(s.clone())),
        _ => None,
    }
}

/// `data` (a flat or nested array of numbers, row-major) as typed contents.
fn contents(name: &str, datatype: &str, data: &Value) -> Result<InferTensorContents, ServiceError> {
    fn flatten(v: &Value, out: &mut Vec<f64>) -> bool {
        match v {
            Value::Array(items) => items.iter().all(|i| flatten(i, out)),
            Value::Number(n) => n.as_f64().map(|x| out.push(x)).is_some(),
            _ => false,
        }
    }
    let mut values = Vec::new();
    if !flatten(data, &mut values) {
        return Err(ServiceError::InvalidInput(format!("input {name:?}: data must be an array of numbers")));
    }
    Ok(match datatype {
        // Out of f32's range becomes ±inf, which validation refuses.
        "FP32" => {
            InferTensorContents { fp32_contents: values.iter().map(|&v| v as f32).collect(), ..Default::default() }
        }
        _ => InferTensorContents { fp64_contents: values, ..Default::default() },
    })
}

/// The gRPC response as KServe v2 JSON, with the outputs `binary` names
/// appended as raw bytes after it.
fn write_response(response: &ModelInferResponse, binary: &Binary) -> Response {
    let mut tail = Vec::new();
    let outputs: Vec<Value> = response
        .outputs
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let bytes = output_bytes(o, response.raw_output_contents.get(i));
            let mut out = json!({ "name": o.name, "datatype": o.datatype, "shape": o.shape });
            if binary.wants(&o.name) {
                out["parameters"] = json!({ "binary_data_size": bytes.len() });
                tail.extend_from_slice(&bytes);
            } else {
                out["data"] = output_values(&o.datatype, &bytes);
            }
            out
        })
        .collect();
    let parameters: Map<String, Value> =
        response.parameters.iter().map(|(k, p)| (k.clone(), parameter_json(p))).collect();
    let head = json!({
        "model_name": response.model_name,
        "model_version": response.model_version,
        "id": response.id,
        "parameters": parameters,
        "outputs": outputs,
    });
    if tail.is_empty() {
        return Json(head).into_response();
    }
    let head = head.to_string();
    let length = head.len();
    let mut body = head.into_bytes();
    body.extend_from_slice(&tail);
    let mut r = ([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response();
    r.headers_mut().insert(HEADER_LENGTH, HeaderValue::from(length));
    r
}

/// An output's little-endian bytes (raw, or its typed contents encoded).
fn output_bytes(o: &InferOutputTensor, raw: Option<&Vec<u8>>) -> Vec<u8> {
    if let Some(raw) = raw {
        return raw.clone();
    }
    let c = o.contents.clone().unwrap_or_default();
    match o.datatype.as_str() {
        "INT64" => c.int64_contents.iter().flat_map(|v| v.to_le_bytes()).collect(),
        _ => c.fp64_contents.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// Little-endian `bytes` of `datatype` (INT64 or FP64, what the model
/// answers) as a JSON array.
fn output_values(datatype: &str, bytes: &[u8]) -> Value {
    let words = bytes.chunks_exact(8).filter_map(|w| <[u8; 8]>::try_from(w).ok());
    match datatype {
        "INT64" => words.map(|w| json!(i64::from_le_bytes(w))).collect(),
        _ => words.map(|w| json!(f64::from_le_bytes(w))).collect(),
    }
}

fn parameter_json(p: &InferParameter) -> Value {
    match &p.parameter_choice {
        Some(ParameterChoice::BoolParam(b)) => json!(b),
        Some(ParameterChoice::Int64Param(i)) => json!(i),
        Some(ParameterChoice::StringParam(s)) => json!(s),
        Some(ParameterChoice::DoubleParam(d)) => json!(d),
        Some(ParameterChoice::Uint64Param(u)) => json!(u),
        None => Value::Null,
    }
}

/// A gRPC status as its HTTP response: the code mapped as the gRPC-HTTP
/// mapping does, the message and the `ErrorInfo` (reason, `charged`,
/// metadata) as JSON, and `Retry-After` (whole seconds, rounded up) when
/// the status carries a retry delay.
pub fn error(status: tonic::Status) -> Response {
    use tonic_types::StatusExt;
    let code = match status.code() {
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::FailedPrecondition => StatusCode::PRECONDITION_FAILED,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Ok | Code::Cancelled | Code::Unknown | Code::Internal | Code::DataLoss => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    };
    let details = status.get_error_details();
    let info = details.error_info();
    let metadata: HashMap<String, String> = info.map(|i| i.metadata.clone()).unwrap_or_default();
    let body = json!({
        "error": status.message(),
        "reason": info.map(|i| i.reason.clone()),
        "charged": metadata.get("charged").is_some_and(|c| c == "true"),
        "metadata": metadata,
    });
    let mut response = (code, Json(body)).into_response();
    if let Some(delay) = details.retry_info().and_then(|r| r.retry_delay) {
        let seconds = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    }
    response
}
