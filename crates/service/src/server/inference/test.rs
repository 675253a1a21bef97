use super::model_infer::{CONFIDENCE_ALPHA, Infer, LABEL, MI_CHARGED, NOISY};
use crate::proto::inference::infer_parameter::ParameterChoice;
use crate::proto::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use crate::proto::inference::{InferParameter, InferTensorContents, ModelInferRequest};
use crate::proto::pacpriv::{Budget, PredictResponse, RowAnswer};
use crate::server::status::ServiceError;

fn request(raw: bool, outputs: &[&str]) -> ModelInferRequest {
    let pixels: Vec<f32> = (0..64).map(|i| (i % 17) as f32).collect();
    let (contents, raw_input_contents) = if raw {
        (None, vec![pixels.iter().flat_map(|v| v.to_le_bytes()).collect()])
    } else {
        (Some(InferTensorContents { fp32_contents: pixels, ..Default::default() }), vec![])
    };
    ModelInferRequest {
        model_name: "private".into(),
        id: "q1".into(),
        inputs: vec![InferInputTensor {
            name: "whatever".into(),
            datatype: "FP32".into(),
            shape: vec![1, 64],
            contents,
            ..Default::default()
        }],
        outputs: outputs
            .iter()
            .map(|&name| InferRequestedOutputTensor { name: name.into(), ..Default::default() })
            .collect(),
        raw_input_contents,
        ..Default::default()
    }
}

fn answer() -> PredictResponse {
    PredictResponse {
        query_id: "q1".into(),
        label: 7,
        unanimous: false,
        mi_charged: 0.25,
        budget: Some(Budget { principal: "alice".into(), spent: 0.5, answered: 2, ..Default::default() }),
        confident: Some(true),
        noisy: noisy(),
        cached: false,
        rows: vec![RowAnswer {
            label: 7,
            unanimous: false,
            mi_charged: 0.25,
            confident: Some(true),
            noisy: noisy(),
            cached: false,
        }],
        model: "private".into(),
        model_version: "1".into(),
    }
}

fn noisy() -> Vec<f64> {
    (0..10).map(|i| if i == 7 { 1.5 } else { -0.125 }).collect()
}

fn invalid(r: ModelInferRequest) -> String {
    match Infer::parse(r) {
        Err(ServiceError::InvalidInput(msg)) => msg,
        other => panic!("expected InvalidInput, got {:?}", other.map(|(p, _)| p)),
    }
}

#[test]
fn a_raw_request_becomes_the_same_predict_request_as_a_typed_one() {
    let (raw, _) = Infer::parse(request(true, &[])).expect("valid");
    let (typed, _) = Infer::parse(request(false, &[])).expect("valid");
    let decode = |p: &crate::proto::pacpriv::PredictRequest| {
        let t = p.input.clone().expect("input");
        let contents = InferTensorContents { fp32_contents: t.fp32_contents, ..Default::default() };
        let raw = (!t.raw_contents.is_empty()).then_some(t.raw_contents);
        crate::tensor::decode_floats(&t.datatype, &t.shape, Some(&contents), raw.as_deref()).expect("decodes")
    };
    assert_eq!(decode(&raw), decode(&typed));
    assert_eq!(raw.query_id, "q1");
    assert!(!raw.return_noisy && raw.confidence_alpha.is_none());
}

#[test]
fn outputs_come_back_in_the_requested_order_and_the_requests_encoding() {
    let (_, infer) = Infer::parse(request(true, &[NOISY, LABEL])).expect("valid");
    let r = infer.respond(answer());
    let names: Vec<&str> = r.outputs.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, [NOISY, LABEL]);
    assert!(r.outputs.iter().all(|o| o.contents.is_none()), "raw request, raw reply");
    assert_eq!(r.raw_output_contents[1], 7i64.to_le_bytes());
    assert_eq!(r.raw_output_contents[0].len(), 10 * 8);
    assert_eq!(r.outputs[0].shape, [1, 10]);
    assert_eq!((r.id.as_str(), r.model_name.as_str(), r.model_version.as_str()), ("q1", "private", "1"));

    let (_, infer) = Infer::parse(request(false, &[])).expect("valid");
    let r = infer.respond(answer());
    assert!(r.raw_output_contents.is_empty(), "typed request, typed reply");
    assert_eq!(r.outputs.len(), 1, "label only by default");
    assert_eq!(r.outputs[0].contents.as_ref().map(|c| c.int64_contents.clone()), Some(vec![7]));
    let param = |name: &str| r.parameters.get(name).and_then(|p| p.parameter_choice.clone());
    assert_eq!(param("mi_charged"), Some(ParameterChoice::DoubleParam(0.25)));
    assert_eq!(param("confident"), Some(ParameterChoice::BoolParam(true)));
    assert_eq!(param("budget_spent"), Some(ParameterChoice::DoubleParam(0.5)));
    assert_eq!(param("budget_answered"), Some(ParameterChoice::Int64Param(2)));
    assert_eq!(param("principal"), Some(ParameterChoice::StringParam("alice".into())));
}

#[test]
fn the_noisy_output_and_confidence_alpha_map_to_the_client_api() {
    let mut r = request(true, &[LABEL, NOISY]);
    let alpha = |c| InferParameter { parameter_choice: Some(c) };
    r.parameters.insert(CONFIDENCE_ALPHA.into(), alpha(ParameterChoice::DoubleParam(0.05)));
    let (p, _) = Infer::parse(r.clone()).expect("valid");
    assert!(p.return_noisy);
    assert_eq!(p.confidence_alpha, Some(0.05));
    r.parameters.insert(CONFIDENCE_ALPHA.into(), alpha(ParameterChoice::StringParam("0.1".into())));
    assert_eq!(Infer::parse(r.clone()).expect("valid").0.confidence_alpha, Some(0.1));
    r.parameters.insert(CONFIDENCE_ALPHA.into(), alpha(ParameterChoice::StringParam("often".into())));
    assert!(invalid(r.clone()).contains(CONFIDENCE_ALPHA));
    r.parameters.insert(CONFIDENCE_ALPHA.into(), alpha(ParameterChoice::BoolParam(true)));
    assert!(invalid(r).contains(CONFIDENCE_ALPHA));
}

#[test]
fn malformed_requests_say_what_to_change() {
    let mut two = request(false, &[]);
    two.inputs.push(two.inputs[0].clone());
    assert!(invalid(two).contains("exactly one input tensor"));
    let mut none = request(false, &[]);
    none.inputs.clear();
    assert!(invalid(none).contains("got 0"));
    let mut both = request(true, &[]);
    both.inputs[0].contents = Some(InferTensorContents { fp32_contents: vec![0.0; 64], ..Default::default() });
    assert!(invalid(both).contains("both contents and raw_input_contents"));
    let mut extra_raw = request(true, &[]);
    extra_raw.raw_input_contents.push(vec![0; 4]);
    assert!(invalid(extra_raw).contains("raw_input_contents"));
    assert!(invalid(request(false, &["probabilities"])).contains("\"label\""));
    assert!(invalid(request(false, &[LABEL, LABEL])).contains("twice"));
}

/// `settings::largest_response`, which start-up holds against
/// `server.max_message_bytes` (issue 40 §3), bounds what either protocol
/// encodes for the largest values every field can take.
#[test]
fn the_largest_response_bound_holds_for_both_protocols() {
    use prost::Message;
    for (rows, d, noisy) in
        [(1, 2, false), (1, 10, true), (64, 10, true), (4096, 10, false), (7, 1000, true), (1, 32768, true)]
    {
        let row = RowAnswer {
            label: u32::MAX,
            unanimous: true,
            mi_charged: f64::MAX,
            confident: Some(true),
            noisy: if noisy { vec![f64::MAX; d] } else { vec![] },
            cached: true,
        };
        let budget = Budget {
            principal: "p".repeat(crate::session::registry::MAX_NAME_LEN),
            dataset: "d".repeat(64),
            spent: f64::MAX,
            limit: f64::MAX,
            remaining: f64::MAX,
            per_query: f64::MAX,
            mia_bound: f64::MAX,
            answered: u64::MAX,
            charged: u64::MAX,
            scope: "per_principal".into(),
            policy: "unanimous_only".into(),
        };
        let answer = PredictResponse {
            query_id: "q".repeat(128),
            label: row.label,
            unanimous: true,
            mi_charged: f64::MAX,
            budget: Some(budget),
            confident: Some(true),
            noisy: row.noisy.clone(),
            cached: true,
            rows: vec![row; rows],
            // The longest model name and version the settings accept.
            model: "m".repeat(64),
            model_version: "999999".into(),
        };
        let bound = crate::settings::largest_response(rows, d, noisy);
        assert!(answer.encoded_len() <= bound, "Predict, {rows} × {d}: {} > {bound}", answer.encoded_len());
        let wanted: &[&str] = if noisy { &[LABEL, NOISY, MI_CHARGED] } else { &[LABEL, MI_CHARGED] };
        for raw in [false, true] {
            let mut req = request(raw, wanted);
            req.id = "i".repeat(128);
            let (_, infer) = Infer::parse(req).expect("valid");
            let encoded = infer.respond(answer.clone()).encoded_len();
            assert!(encoded <= bound, "ModelInfer (raw {raw}), {rows} × {d}: {encoded} > {bound}");
        }
    }
}
