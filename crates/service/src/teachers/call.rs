//! One served model and one batched `ModelInfer` call to it: the request
//! for n examples (input shape `[n, f]`), the deadline and bounded retries,
//! and reading the answer back as `n × k` outputs — k = 1 for a per-teacher
//! model, k = m for a stacked one that answers for the whole ensemble.
//!
//! # Invariants
//! - A reply is used only if it holds exactly `n × k` labels (or
//!   `n × k × d` scores): a model that answers for a different number of
//!   examples or teachers is an error, never truncated or padded.

use super::connection::Headers;
use super::{FanoutError, OutputMode, TeacherSpec};
use crate::metrics::{TeacherError, TeacherSeries};
use crate::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use crate::proto::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use crate::proto::inference::{InferTensorContents, ModelInferRequest, ModelInferResponse, ModelReadyRequest};
use crate::tensor;
use pacpriv_privacy::mechanism::argmax;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

/// What to ask each teacher for and how long to wait.
#[derive(Clone, Debug, PartialEq)]
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

/// A model on a (shared) channel.
pub(super) struct Model {
    pub(super) spec: TeacherSpec,
    client: GrpcInferenceServiceClient<Channel>,
    /// Sent with every call (e.g. the endpoint's bearer token).
    headers: Headers,
    metrics: TeacherSeries,
}

impl Model {
    pub(super) fn new(spec: TeacherSpec, channel: Channel, headers: Headers, metrics: TeacherSeries) -> Self {
        Model { spec, client: GrpcInferenceServiceClient::new(channel), headers, metrics }
    }

    /// `ModelReady`, one attempt within `deadline`.
    pub(super) async fn ready(&self, deadline: Duration) -> bool {
        let mut req = tonic::Request::new(ModelReadyRequest {
            name: self.spec.model.clone(),
            version: self.spec.version.clone(),
        });
        self.headers.apply(req.metadata_mut());
        let mut client = self.client.clone();
        matches!(tokio::time::timeout(deadline, client.model_ready(req)).await, Ok(Ok(r)) if r.get_ref().ready)
    }

    /// The model's outputs for `input` (a batch built by [`input`]):
    /// `cells` labels in label mode, `cells × d` scores in vector mode,
    /// where a cell is one (example, teacher) pair, row-major.
    pub(super) async fn ask(
        &self,
        input: &InferInputTensor,
        cells: usize,
        policy: &CallPolicy,
        mode: OutputMode,
    ) -> Result<Vec<f64>, FanoutError> {
        let request = self.request(input, policy);
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
            self.headers.apply(req.metadata_mut());
            crate::trace::inject(req.metadata_mut());
            let mut client = self.client.clone();
            let started = Instant::now();
            match tokio::time::timeout(policy.deadline, client.model_infer(req)).await {
                Ok(Ok(response)) => {
                    let read = read_output(response.into_inner(), policy.output_name.as_deref(), mode, cells).map_err(
                        |reason| FanoutError::BadOutput {
                            model: self.spec.model.clone(),
                            endpoint: self.spec.endpoint.clone(),
                            reason,
                        },
                    );
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

    fn request(&self, input: &InferInputTensor, policy: &CallPolicy) -> ModelInferRequest {
        ModelInferRequest {
            model_name: self.spec.model.clone(),
            model_version: self.spec.version.clone(),
            inputs: vec![input.clone()],
            outputs: policy
                .output_name
                .iter()
                .map(|name| InferRequestedOutputTensor { name: name.clone(), ..Default::default() })
                .collect(),
            ..Default::default()
        }
    }
}

/// The input tensor of a batch: the `rows` examples of `features`
/// (row-major, `rows × f`) as shape `[rows, f]` in the configured datatype.
/// Built once per batch and shared by every model's request.
pub(super) fn input(features: &[f64], rows: usize, policy: &CallPolicy) -> InferInputTensor {
    let contents = if policy.input_datatype == "FP64" {
        InferTensorContents { fp64_contents: features.to_vec(), ..Default::default() }
    } else {
        InferTensorContents { fp32_contents: features.iter().map(|&v| v as f32).collect(), ..Default::default() }
    };
    let per_row = features.len() / rows.max(1);
    InferInputTensor {
        name: policy.input_name.clone(),
        datatype: policy.input_datatype.clone(),
        shape: vec![rows as i64, per_row as i64],
        contents: Some(contents),
        ..Default::default()
    }
}

/// The output tensor `name` (or the first) of a reply, from typed contents
/// or raw bytes, as `cells` labels (label mode: given as labels or as d
/// scores each, of which the argmax is taken) or `cells × d` scores (vector
/// mode), where a cell is one (example, teacher) pair.
pub(crate) fn read_output(
    response: ModelInferResponse,
    name: Option<&str>,
    mode: OutputMode,
    cells: usize,
) -> Result<Vec<f64>, String> {
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
    // The declared shape must hold exactly the values sent: a reply whose
    // shape and contents disagree is not trusted to be what it seems.
    let declared = output.shape.iter().try_fold(1usize, |n, &d| usize::try_from(d).ok().and_then(|d| n.checked_mul(d)));
    if declared != Some(values.len()) {
        return Err(format!("output shape {:?} does not hold the {} values sent", output.shape, values.len()));
    }
    match mode {
        // classes ≥ 2 (settings), so `cells` labels and `cells × classes`
        // scores are never the same count.
        OutputMode::Label { classes } if values.len() == cells => values
            .iter()
            .map(|&label| {
                if label.fract() == 0.0 && label >= 0.0 && (label as usize) < classes {
                    Ok(label)
                } else {
                    Err(format!("label {label} is not a class index below {classes}"))
                }
            })
            .collect(),
        OutputMode::Label { classes } if values.len() == cells * classes => {
            Ok(values.chunks(classes).map(|scores| argmax(scores.iter().copied()) as f64).collect())
        }
        OutputMode::Label { classes } => {
            Err(format!("expected {cells} label(s) or {cells} × {classes} scores, got {} values", values.len()))
        }
        OutputMode::Vector { dim } if values.len() == cells * dim => Ok(values),
        OutputMode::Vector { dim } => Err(format!("expected {cells} × {dim} scores, got {} values", values.len())),
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::proto::inference::model_infer_response::InferOutputTensor;

    /// A reply with raw outputs (name, datatype, shape, bytes).
    fn raw_response(outputs: &[(&str, &str, &[i64], Vec<u8>)]) -> ModelInferResponse {
        ModelInferResponse {
            outputs: outputs
                .iter()
                .map(|(name, datatype, shape, _)| InferOutputTensor {
                    name: (*name).into(),
                    datatype: (*datatype).into(),
                    shape: shape.to_vec(),
                    ..Default::default()
                })
                .collect(),
            raw_output_contents: outputs.iter().map(|(_, _, _, raw)| raw.clone()).collect(),
            ..Default::default()
        }
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn raw_outputs_are_read_by_name_as_label_or_scores() -> Result<(), String> {
        let scores = f32_bytes(&[0.1, 0.7, 0.2]);
        let label: Vec<u8> = 2i64.to_le_bytes().to_vec();
        let r = || {
            raw_response(&[("label", "INT64", &[1], label.clone()), ("probabilities", "FP32", &[1, 3], scores.clone())])
        };
        let three = OutputMode::Label { classes: 3 };
        assert_eq!(read_output(r(), None, three, 1)?, vec![2.0]);
        assert_eq!(read_output(r(), Some("probabilities"), three, 1)?, vec![1.0], "argmax of the scores");
        let v = read_output(r(), Some("probabilities"), OutputMode::Vector { dim: 3 }, 1)?;
        assert_eq!(v, vec![f64::from(0.1f32), f64::from(0.7f32), f64::from(0.2f32)]);
        Ok(())
    }

    #[test]
    fn a_batch_is_read_row_by_row() -> Result<(), String> {
        // Two examples, three classes: argmax per row, not over the batch.
        let scores = f32_bytes(&[0.1, 0.7, 0.2, 0.6, 0.3, 0.1]);
        let labels: Vec<u8> = [2i64, 0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let r = || {
            raw_response(&[
                ("label", "INT64", &[2], labels.clone()),
                ("probabilities", "FP32", &[2, 3], scores.clone()),
            ])
        };
        let three = OutputMode::Label { classes: 3 };
        assert_eq!(read_output(r(), None, three, 2)?, vec![2.0, 0.0]);
        assert_eq!(read_output(r(), Some("probabilities"), three, 2)?, vec![1.0, 0.0]);
        assert_eq!(read_output(r(), Some("probabilities"), OutputMode::Vector { dim: 3 }, 2)?.len(), 6);
        // A reply for a different number of examples is refused, not cut.
        assert!(read_output(r(), None, three, 3).is_err());
        assert!(read_output(r(), Some("probabilities"), OutputMode::Vector { dim: 3 }, 1).is_err());
        Ok(())
    }

    #[test]
    fn unusable_outputs_are_errors() {
        let label = |v: i64| raw_response(&[("label", "INT64", &[1], v.to_le_bytes().to_vec())]);
        assert!(read_output(label(3), None, OutputMode::Label { classes: 3 }, 1).is_err());
        assert!(read_output(label(-1), None, OutputMode::Label { classes: 3 }, 1).is_err());
        assert!(read_output(label(1), Some("scores"), OutputMode::Label { classes: 3 }, 1).is_err());
        assert!(read_output(label(1), None, OutputMode::Vector { dim: 3 }, 1).is_err());
        let nan =
            raw_response(&[("s", "FP64", &[1, 2], [f64::NAN, 0.0].iter().flat_map(|v| v.to_le_bytes()).collect())]);
        assert!(read_output(nan, None, OutputMode::Vector { dim: 2 }, 1).is_err());
        // NaN among scores read as a label (argmax) is refused too.
        let nan = raw_response(&[("s", "FP32", &[1, 3], f32_bytes(&[0.2, f32::NAN, 0.1]))]);
        assert!(read_output(nan, None, OutputMode::Label { classes: 3 }, 1).is_err());
    }

    #[test]
    fn a_shape_that_disagrees_with_the_values_is_refused() {
        let labels =
            |shape: &[i64]| raw_response(&[("label", "INT64", shape, [1i64, 2].map(i64::to_le_bytes).concat())]);
        let three = OutputMode::Label { classes: 3 };
        assert_eq!(read_output(labels(&[2]), None, three, 2), Ok(vec![1.0, 2.0]));
        for shape in [&[][..], &[1], &[2, 3], &[-2], &[-1, -2], &[i64::MAX, i64::MAX]] {
            let e = read_output(labels(shape), None, three, 2).expect_err("shape and values disagree");
            assert!(e.contains("does not hold the 2 values"), "{shape:?}: {e}");
        }
    }
}
