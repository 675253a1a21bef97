//! The fan-out client: one `ModelInfer` per teacher, all in flight at once,
//! each with its own deadline and bounded retries.

use crate::metrics::{TeacherError, TeacherMetrics, TeacherSeries};
use crate::privacy::mechanism::{TeacherOutputs, argmax};
use crate::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use crate::proto::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use crate::proto::inference::{InferTensorContents, ModelInferRequest, ModelInferResponse, ModelReadyRequest};
use crate::tensor;
use ndarray::Array2;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tonic::transport::{Channel, Endpoint};

/// One teacher: where it is served and under which model name.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct TeacherSpec {
    /// gRPC endpoint URI, e.g. `http://127.0.0.1:8001`.
    pub endpoint: String,
    /// Model name on that server.
    pub model: String,
    /// Model version; empty means the server's default.
    #[serde(default)]
    pub version: String,
}

/// What to ask each teacher for and how long to wait.
#[derive(Clone, Debug)]
pub struct CallPolicy {
    /// Per-attempt deadline.
    pub deadline: Duration,
    /// Extra attempts after a failed one.
    pub retries: u32,
    /// Input tensor name.
    pub input_name: String,
    /// `"FP32"` or `"FP64"`: how features are sent.
    pub input_datatype: String,
    /// Output tensor to read; `None`: the first returned.
    pub output_name: Option<String>,
}

/// How teacher outputs are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputMode {
    /// A label: a single integer, or the argmax of a score vector.
    Label {
        /// Number of classes d.
        classes: usize,
    },
    /// A score vector of length `dim`.
    Vector {
        /// Output dimension d.
        dim: usize,
    },
}

/// Why a query could not be answered by all teachers.
#[derive(Debug, thiserror::Error)]
pub enum FanoutError {
    /// A teacher failed or was late on every attempt.
    #[error("teacher {model} at {endpoint} did not answer after {attempts} attempt(s): {reason}")]
    Unreachable {
        /// Its model name.
        model: String,
        /// Its endpoint.
        endpoint: String,
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        reason: String,
    },
    /// A teacher answered with something that is not a label or a score
    /// vector of the configured size.
    #[error("teacher {model} at {endpoint} returned an unusable output: {reason}")]
    BadOutput {
        /// Its model name.
        model: String,
        /// Its endpoint.
        endpoint: String,
        /// What was wrong.
        reason: String,
    },
    /// An endpoint in the configuration is not a valid URI.
    #[error("teacher endpoint {endpoint:?} is not a valid URI: {reason}")]
    Endpoint {
        /// The configured string.
        endpoint: String,
        /// Parser message.
        reason: String,
    },
}

struct Teacher {
    spec: TeacherSpec,
    client: GrpcInferenceServiceClient<Channel>,
    metrics: TeacherSeries,
}

/// The m teachers, in subset order.
pub struct Ensemble {
    teachers: Vec<Arc<Teacher>>,
    policy: Arc<CallPolicy>,
    mode: OutputMode,
}

impl Ensemble {
    /// Prepares lazy, persistent channels (one per distinct endpoint); no
    /// connection is made until the first query.
    ///
    /// # Errors
    /// [`FanoutError::Endpoint`] for an unparsable endpoint.
    pub fn new(
        specs: Vec<TeacherSpec>,
        policy: CallPolicy,
        mode: OutputMode,
        metrics: &TeacherMetrics,
    ) -> Result<Self, FanoutError> {
        let mut channels: HashMap<String, Channel> = HashMap::new();
        let mut teachers = Vec::with_capacity(specs.len());
        for spec in specs {
            let channel = match channels.get(&spec.endpoint) {
                Some(c) => c.clone(),
                None => {
                    let c = Endpoint::from_shared(spec.endpoint.clone())
                        .map_err(|e| FanoutError::Endpoint { endpoint: spec.endpoint.clone(), reason: e.to_string() })?
                        .connect_timeout(policy.deadline)
                        .tcp_nodelay(true)
                        .http2_keep_alive_interval(Duration::from_secs(30))
                        .keep_alive_while_idle(true)
                        .connect_lazy();
                    channels.insert(spec.endpoint.clone(), c.clone());
                    c
                }
            };
            let metrics = metrics.teacher(&spec.model);
            teachers.push(Arc::new(Teacher { spec, client: GrpcInferenceServiceClient::new(channel), metrics }));
        }
        Ok(Ensemble { teachers, policy: Arc::new(policy), mode })
    }

    /// m.
    pub fn len(&self) -> usize {
        self.teachers.len()
    }

    /// Whether there are no teachers (never, once configured).
    pub fn is_empty(&self) -> bool {
        self.teachers.is_empty()
    }

    /// How many teachers do not report their model ready (Open Inference
    /// Protocol `ModelReady`, one attempt each within the deadline).
    pub async fn not_ready(&self) -> usize {
        let mut probes = JoinSet::new();
        for teacher in &self.teachers {
            let (teacher, deadline) = (Arc::clone(teacher), self.policy.deadline);
            probes.spawn(async move {
                let req = ModelReadyRequest { name: teacher.spec.model.clone(), version: teacher.spec.version.clone() };
                let mut client = teacher.client.clone();
                matches!(tokio::time::timeout(deadline, client.model_ready(req)).await, Ok(Ok(r)) if r.get_ref().ready)
            });
        }
        probes.join_all().await.into_iter().filter(|ready| !ready).count()
    }

    /// Asks every teacher about one example (`features`, already validated)
    /// and returns their outputs in subset order.
    ///
    /// # Errors
    /// The first teacher that failed all its attempts or answered with an
    /// unusable output; the remaining calls are cancelled.
    pub async fn query(&self, features: &[f64]) -> Result<TeacherOutputs, FanoutError> {
        let features: Arc<[f64]> = features.into();
        let mut calls = JoinSet::new();
        for (i, teacher) in self.teachers.iter().enumerate() {
            let (teacher, policy, features) = (Arc::clone(teacher), Arc::clone(&self.policy), Arc::clone(&features));
            let mode = self.mode;
            calls.spawn(async move { (i, teacher.ask(&features, &policy, mode).await) });
        }
        let mut values: Vec<Option<Vec<f64>>> = vec![None; self.teachers.len()];
        while let Some(joined) = calls.join_next().await {
            // A panicked call task is a teacher that did not answer.
            let (i, result) = joined.map_err(|e| FanoutError::Unreachable {
                model: "?".into(),
                endpoint: "?".into(),
                attempts: 0,
                reason: e.to_string(),
            })?;
            values[i] = Some(result?);
        }
        let values: Vec<Vec<f64>> = values.into_iter().flatten().collect();
        Ok(match self.mode {
            OutputMode::Label { classes } => TeacherOutputs::Labels {
                labels: values.iter().map(|v| v.first().copied().unwrap_or_default() as usize).collect(),
                classes,
            },
            OutputMode::Vector { dim } => {
                let flat: Vec<f64> = values.into_iter().flatten().collect();
                let rows = flat.len() / dim.max(1);
                TeacherOutputs::Vectors(Array2::from_shape_vec((rows, dim), flat).map_err(|e| {
                    FanoutError::BadOutput { model: "ensemble".into(), endpoint: String::new(), reason: e.to_string() }
                })?)
            }
        })
    }
}

impl Teacher {
    /// One teacher's answer: `[label]` in label mode, the score vector in
    /// vector mode.
    async fn ask(&self, features: &[f64], policy: &CallPolicy, mode: OutputMode) -> Result<Vec<f64>, FanoutError> {
        let request = self.request(features, policy);
        let mut last = String::new();
        let attempts = policy.retries.saturating_add(1);
        for attempt in 0..attempts {
            if attempt > 0 {
                // Short, growing pause: enough for a restarting teacher,
                // small against the deadline.
                tokio::time::sleep(Duration::from_millis(10u64 << attempt.min(6))).await;
            }
            let mut req = tonic::Request::new(request.clone());
            req.set_timeout(policy.deadline);
            let mut client = self.client.clone();
            let started = std::time::Instant::now();
            match tokio::time::timeout(policy.deadline, client.model_infer(req)).await {
                Ok(Ok(response)) => {
                    let read = self.read(response.into_inner(), policy, mode);
                    match &read {
                        Ok(_) => self.metrics.call(started.elapsed().as_secs_f64()),
                        Err(_) => self.metrics.error(TeacherError::Malformed),
                    }
                    return read;
                }
                Ok(Err(status)) => {
                    self.metrics.error(if status.code() == tonic::Code::DeadlineExceeded {
                        TeacherError::Timeout
                    } else {
                        TeacherError::Unavailable
                    });
                    last = format!("{}: {}", status.code(), status.message());
                }
                Err(_) => {
                    self.metrics.error(TeacherError::Timeout);
                    last = format!("no answer within {} ms", policy.deadline.as_millis());
                }
            }
        }
        Err(FanoutError::Unreachable {
            model: self.spec.model.clone(),
            endpoint: self.spec.endpoint.clone(),
            attempts,
            reason: last,
        })
    }

    fn request(&self, features: &[f64], policy: &CallPolicy) -> ModelInferRequest {
        let contents = if policy.input_datatype == "FP64" {
            InferTensorContents { fp64_contents: features.to_vec(), ..Default::default() }
        } else {
            InferTensorContents { fp32_contents: features.iter().map(|&v| v as f32).collect(), ..Default::default() }
        };
        ModelInferRequest {
            model_name: self.spec.model.clone(),
            model_version: self.spec.version.clone(),
            inputs: vec![InferInputTensor {
                name: policy.input_name.clone(),
                datatype: policy.input_datatype.clone(),
                shape: vec![1, features.len() as i64],
                contents: Some(contents),
                ..Default::default()
            }],
            outputs: policy
                .output_name
                .iter()
                .map(|name| InferRequestedOutputTensor { name: name.clone(), ..Default::default() })
                .collect(),
            ..Default::default()
        }
    }

    fn read(
        &self,
        response: ModelInferResponse,
        policy: &CallPolicy,
        mode: OutputMode,
    ) -> Result<Vec<f64>, FanoutError> {
        read_output(response, policy.output_name.as_deref(), mode).map_err(|reason| FanoutError::BadOutput {
            model: self.spec.model.clone(),
            endpoint: self.spec.endpoint.clone(),
            reason,
        })
    }
}

/// The output tensor `name` (or the first) of a teacher's response, from
/// typed contents or raw bytes, as `[label]` in label mode or the score
/// vector in vector mode.
fn read_output(response: ModelInferResponse, name: Option<&str>, mode: OutputMode) -> Result<Vec<f64>, String> {
    let position = match name {
        Some(name) => response.outputs.iter().position(|o| o.name == name),
        None => (!response.outputs.is_empty()).then_some(0),
    };
    let Some(pos) = position else {
        return Err(format!("no output named {name:?} among {} output(s)", response.outputs.len()));
    };
    let output = &response.outputs[pos];
    // Raw outputs, when used, come one per output tensor in order.
    let raw = response.raw_output_contents.get(pos).map(Vec::as_slice);
    let values = tensor::decode_numbers(&output.datatype, output.contents.as_ref(), raw).map_err(|e| e.to_string())?;
    match mode {
        OutputMode::Label { classes } => match values.as_slice() {
            [label] if label.fract() == 0.0 && *label >= 0.0 && (*label as usize) < classes => Ok(vec![*label]),
            [label] => Err(format!("label {label} is not a class index below {classes}")),
            scores if scores.len() == classes => Ok(vec![argmax(scores.iter().copied()) as f64]),
            other => Err(format!("expected one label or {classes} scores, got {} values", other.len())),
        },
        OutputMode::Vector { dim } if values.len() == dim => Ok(values),
        OutputMode::Vector { dim } => Err(format!("expected {dim} scores, got {}", values.len())),
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::proto::inference::model_infer_response::InferOutputTensor;

    fn raw_response(outputs: &[(&str, &str, Vec<u8>)]) -> ModelInferResponse {
        ModelInferResponse {
            outputs: outputs
                .iter()
                .map(|(name, datatype, _)| InferOutputTensor {
                    name: (*name).into(),
                    datatype: (*datatype).into(),
                    ..Default::default()
                })
                .collect(),
            raw_output_contents: outputs.iter().map(|(_, _, raw)| raw.clone()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn raw_outputs_are_read_by_name_as_label_or_scores() -> Result<(), String> {
        let scores: Vec<u8> = [0.1f32, 0.7, 0.2].iter().flat_map(|v| v.to_le_bytes()).collect();
        let label: Vec<u8> = 2i64.to_le_bytes().to_vec();
        let r = || raw_response(&[("label", "INT64", label.clone()), ("probabilities", "FP32", scores.clone())]);
        let three = OutputMode::Label { classes: 3 };
        assert_eq!(read_output(r(), None, three)?, vec![2.0]);
        assert_eq!(read_output(r(), Some("probabilities"), three)?, vec![1.0], "argmax of the scores");
        let v = read_output(r(), Some("probabilities"), OutputMode::Vector { dim: 3 })?;
        assert_eq!(v, vec![f64::from(0.1f32), f64::from(0.7f32), f64::from(0.2f32)]);
        Ok(())
    }

    #[test]
    fn unusable_outputs_are_errors() {
        let label = |v: i64| raw_response(&[("label", "INT64", v.to_le_bytes().to_vec())]);
        assert!(read_output(label(3), None, OutputMode::Label { classes: 3 }).is_err());
        assert!(read_output(label(-1), None, OutputMode::Label { classes: 3 }).is_err());
        assert!(read_output(label(1), Some("scores"), OutputMode::Label { classes: 3 }).is_err());
        assert!(read_output(label(1), None, OutputMode::Vector { dim: 3 }).is_err());
        let nan = raw_response(&[("s", "FP64", [f64::NAN, 0.0].iter().flat_map(|v| v.to_le_bytes()).collect())]);
        assert!(read_output(nan, None, OutputMode::Vector { dim: 2 }).is_err());
    }
}
