//! `ModelInfer` on the private model: n examples in (n queries), their
//! private labels out, the session's account in the response parameters.
//!
//! Wire contract (what `ModelMetadata` advertises):
//! - one input tensor, any name, FP32 or FP64, shape `[n, …]` or the bare
//!   example shape (n = 1), in `contents` or `raw_input_contents`;
//! - request parameter `confidence_alpha` (double, or a string holding one)
//!   asks for the confidence flag;
//! - outputs `label` (INT64, `[n]`), `mi_charged` (FP64, `[n]`: each row's
//!   charge, 0 for a cached row) and, when requested and the operator
//!   allows it, `noisy` (FP64, `[n, d]`, the published releases); no
//!   requested outputs means `label`;
//! - the answer comes back in the form the request used: raw contents for
//!   a raw request (tritonclient's default), typed contents otherwise.
//!
//! Response parameters: `mi_charged` (the request's total), `unanimous`,
//! `cached` (this exact example was answered before: the same answer
//! again, free) and `confident` (when asked) — of every row — and the
//! account after this request — `budget_spent`,
//! `budget_limit`, `budget_remaining`, `budget_per_query`, `mia_bound`
//! (doubles), `budget_answered`, `budget_charged` (int64), `principal`,
//! `budget_scope`, `budget_policy` (strings).

use crate::proto::inference::infer_parameter::ParameterChoice;
use crate::proto::inference::model_infer_request::InferInputTensor;
use crate::proto::inference::model_infer_response::InferOutputTensor;
use crate::proto::inference::{InferParameter, InferTensorContents, ModelInferRequest, ModelInferResponse};
use crate::proto::pacpriv::{PredictRequest, PredictResponse, RowAnswer, Tensor};
use crate::server::status::ServiceError;
use std::collections::HashMap;

/// The label output's name.
pub const LABEL: &str = "label";
/// The published noisy vector's output name.
pub const NOISY: &str = "noisy";
/// Each row's charge's output name.
pub const MI_CHARGED: &str = "mi_charged";
/// The request parameter asking for the confidence flag.
pub const CONFIDENCE_ALPHA: &str = "confidence_alpha";

/// One output the caller will get back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    Label,
    Noisy,
    Charged,
}

/// How to answer a parsed `ModelInfer` request.
#[derive(Debug)]
pub struct Infer {
    /// The request's id, echoed.
    id: String,
    /// In the order requested.
    outputs: Vec<Output>,
    /// Answer in `raw_output_contents`.
    raw: bool,
}

impl Infer {
    /// Reads `request` (model name already checked) as a client-API
    /// prediction request; the example itself is validated by
    /// [`crate::server::input::InputSpec::parse`] like any other.
    ///
    /// # Errors
    /// [`ServiceError::InvalidInput`] saying what to change.
    pub fn parse(request: ModelInferRequest) -> Result<(PredictRequest, Infer), ServiceError> {
        let bad = ServiceError::InvalidInput;
        let ModelInferRequest { model_name, model_version, id, parameters, inputs, outputs, mut raw_input_contents } =
            request;
        let [input]: [InferInputTensor; 1] = inputs.try_into().map_err(|inputs: Vec<InferInputTensor>| {
            bad(format!(
                "the private model takes exactly one input tensor (one example, FP32 or FP64); got {}",
                inputs.len()
            ))
        })?;
        let raw = match raw_input_contents.len() {
            0 => None,
            1 => raw_input_contents.pop(),
            n => return Err(bad(format!("one input tensor but {n} raw_input_contents entries"))),
        };
        let contents = input.contents.unwrap_or_default();
        if raw.is_some() && contents != InferTensorContents::default() {
            return Err(bad(format!("input {:?} has both contents and raw_input_contents; send one", input.name)));
        }
        let confidence_alpha = match parameters.get(CONFIDENCE_ALPHA).and_then(|p| p.parameter_choice.as_ref()) {
            None => None,
            Some(ParameterChoice::DoubleParam(a)) => Some(*a),
            Some(ParameterChoice::StringParam(s)) => Some(
                s.trim()
                    .parse::<f64>()
                    .map_err(|_| bad(format!("parameter {CONFIDENCE_ALPHA} must be a number in (0, 1), got {s:?}")))?,
            ),
            Some(_) => return Err(bad(format!("parameter {CONFIDENCE_ALPHA} must be a double in (0, 1)"))),
        };
        let mut wanted = Vec::with_capacity(3);
        for o in &outputs {
            let output = match o.name.as_str() {
                LABEL => Output::Label,
                NOISY => Output::Noisy,
                MI_CHARGED => Output::Charged,
                other => {
                    return Err(bad(format!(
                        "requested output {other:?} does not exist: the private model has {LABEL:?}, \
                         {MI_CHARGED:?} and {NOISY:?}"
                    )));
                }
            };
            if wanted.contains(&output) {
                return Err(bad(format!("output {:?} is requested twice", o.name)));
            }
            wanted.push(output);
        }
        if wanted.is_empty() {
            wanted.push(Output::Label);
        }
        let raw_request = raw.is_some();
        let predict = PredictRequest {
            query_id: id.clone(),
            input: Some(Tensor {
                datatype: input.datatype,
                shape: input.shape,
                fp32_contents: contents.fp32_contents,
                fp64_contents: contents.fp64_contents,
                raw_contents: raw.unwrap_or_default(),
            }),
            confidence_alpha,
            return_noisy: wanted.contains(&Output::Noisy),
            model: model_name,
            model_version,
        };
        Ok((predict, Infer { id, outputs: wanted, raw: raw_request }))
    }

    /// The `ModelInfer` response carrying `answer`.
    pub fn respond(self, answer: PredictResponse) -> ModelInferResponse {
        let mut outputs = Vec::with_capacity(self.outputs.len());
        let mut raw_output_contents = Vec::new();
        for output in &self.outputs {
            let rows = &answer.rows;
            let n = rows.len() as i64;
            let (name, datatype, shape, contents, bytes) = match output {
                Output::Label => {
                    let labels: Vec<i64> = rows.iter().map(|r| i64::from(r.label)).collect();
                    let bytes = labels.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let contents = InferTensorContents { int64_contents: labels, ..Default::default() };
                    (LABEL, "INT64", vec![n], contents, bytes)
                }
                Output::Charged => {
                    let charges: Vec<f64> = rows.iter().map(|r| r.mi_charged).collect();
                    let bytes = charges.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let contents = InferTensorContents { fp64_contents: charges, ..Default::default() };
                    (MI_CHARGED, "FP64", vec![n], contents, bytes)
                }
                Output::Noisy => {
                    let noisy: Vec<f64> = rows.iter().flat_map(|r| r.noisy.iter().copied()).collect();
                    let bytes = noisy.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let d = rows.first().map_or(0, |r| r.noisy.len() as i64);
                    let contents = InferTensorContents { fp64_contents: noisy, ..Default::default() };
                    (NOISY, "FP64", vec![n, d], contents, bytes)
                }
            };
            outputs.push(InferOutputTensor {
                name: name.to_owned(),
                datatype: datatype.to_owned(),
                shape,
                parameters: HashMap::new(),
                contents: (!self.raw).then_some(contents),
            });
            if self.raw {
                raw_output_contents.push(bytes);
            }
        }
        ModelInferResponse {
            model_name: answer.model.clone(),
            model_version: answer.model_version.clone(),
            id: if self.id.is_empty() { answer.query_id.clone() } else { self.id },
            parameters: parameters(&answer),
            outputs,
            raw_output_contents,
        }
    }
}

/// The answer's charge and the account after it, as response parameters.
fn parameters(answer: &PredictResponse) -> HashMap<String, InferParameter> {
    let param = |choice| InferParameter { parameter_choice: Some(choice) };
    let double = |v: f64| param(ParameterChoice::DoubleParam(v));
    let every = |f: fn(&RowAnswer) -> bool| param(ParameterChoice::BoolParam(answer.rows.iter().all(f)));
    let mut p = HashMap::from([
        ("mi_charged".to_owned(), double(answer.mi_charged)),
        ("unanimous".to_owned(), every(|r| r.unanimous)),
        ("cached".to_owned(), every(|r| r.cached)),
    ]);
    if answer.rows.iter().all(|r| r.confident.is_some()) && !answer.rows.is_empty() {
        p.insert("confident".to_owned(), every(|r| r.confident == Some(true)));
    }
    if let Some(b) = &answer.budget {
        let int = |v: u64| param(ParameterChoice::Int64Param(i64::try_from(v).unwrap_or(i64::MAX)));
        let string = |v: &str| param(ParameterChoice::StringParam(v.to_owned()));
        p.extend([
            ("budget_spent".to_owned(), double(b.spent)),
            ("budget_limit".to_owned(), double(b.limit)),
            ("budget_remaining".to_owned(), double(b.remaining)),
            ("budget_per_query".to_owned(), double(b.per_query)),
            ("mia_bound".to_owned(), double(b.mia_bound)),
            ("budget_answered".to_owned(), int(b.answered)),
            ("budget_charged".to_owned(), int(b.charged)),
            ("principal".to_owned(), string(&b.principal)),
            ("budget_scope".to_owned(), string(&b.scope)),
            ("budget_policy".to_owned(), string(&b.policy)),
        ]);
    }
    p
}
