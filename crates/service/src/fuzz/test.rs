//! The proptest fallback of the cargo-fuzz targets: arbitrary bytes, and
//! structured messages built to reach past decoding (shapes with huge,
//! zero and negative dimensions, datatypes right and wrong, typed contents
//! and raw bytes of sizes that fit and do not), each also sent as encoded
//! bytes through the byte-level entry points.
//! `PROPTEST_CASES=100000 cargo test --release --lib fuzz` for a longer run.

use super::*;
use crate::proto::inference::infer_parameter::ParameterChoice;
use crate::proto::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use crate::proto::inference::model_infer_response::InferOutputTensor;
use crate::proto::inference::{InferParameter, InferTensorContents};
use crate::proto::pacpriv::Tensor;
use proptest::collection::vec;
use proptest::prelude::*;

fn datatype() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec!["FP32", "FP64", "INT64", "INT32", "UINT8", "BYTES", "BOOL", "FP16", ""])
            .prop_map(str::to_owned),
        1 => "[A-Za-z0-9]{0,6}",
    ]
}

fn dim() -> impl Strategy<Value = i64> {
    prop_oneof![
        4 => prop::sample::select(vec![1i64, 64, 0, 2, 3, 10, 16]),
        1 => prop::sample::select(vec![-1i64, -64, i64::MAX, i64::MIN, 1 << 32, (1 << 62) + 1]),
        1 => any::<i64>(),
    ]
}

fn shape() -> impl Strategy<Value = Vec<i64>> {
    vec(dim(), 0..4)
}

fn f32s() -> impl Strategy<Value = Vec<f32>> {
    prop_oneof![
        vec(any::<f32>(), 0..3),
        vec(any::<f32>(), 64..65),
        vec(prop::sample::select(vec![0.0f32, 1.5, 16.0, f32::NAN, f32::INFINITY, -0.0]), 60..70),
    ]
}

fn f64s() -> impl Strategy<Value = Vec<f64>> {
    prop_oneof![vec(any::<f64>(), 0..3), vec(any::<f64>(), 64..65), vec(-1e3..1e3f64, 0..40)]
}

/// Raw bytes: empty, the size of 64 FP32 or FP64 values, or off by a few.
fn raw() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        2 => Just(Vec::new()),
        1 => vec(any::<u8>(), 256..257),
        1 => vec(any::<u8>(), 512..513),
        1 => vec(any::<u8>(), 0..600),
    ]
}

fn alpha() -> impl Strategy<Value = Option<f64>> {
    prop_oneof![Just(None), Just(Some(0.05)), any::<f64>().prop_map(Some), Just(Some(f64::NAN))]
}

fn predict_request() -> impl Strategy<Value = PredictRequest> {
    (datatype(), shape(), f32s(), f64s(), raw(), alpha(), "[a-z0-9-]{0,3}|.{120,140}").prop_map(
        |(datatype, shape, fp32, fp64, raw, alpha, query_id)| PredictRequest {
            query_id,
            input: Some(Tensor { datatype, shape, fp32_contents: fp32, fp64_contents: fp64, raw_contents: raw }),
            confidence_alpha: alpha,
            return_noisy: false,
            model: String::new(),
            model_version: String::new(),
        },
    )
}

fn contents() -> impl Strategy<Value = Option<InferTensorContents>> {
    prop_oneof![
        Just(None),
        f32s().prop_map(|v| Some(InferTensorContents { fp32_contents: v, ..Default::default() })),
        f64s().prop_map(|v| Some(InferTensorContents { fp64_contents: v, ..Default::default() })),
        vec(-3i64..20, 0..70).prop_map(|v| Some(InferTensorContents { int64_contents: v, ..Default::default() })),
        vec(any::<i32>(), 0..70).prop_map(|v| Some(InferTensorContents { int_contents: v, ..Default::default() })),
        vec(vec(any::<u8>(), 0..4), 0..4)
            .prop_map(|v| Some(InferTensorContents { bytes_contents: v, ..Default::default() })),
        (f32s(), f64s()).prop_map(|(a, b)| Some(InferTensorContents {
            fp32_contents: a,
            fp64_contents: b,
            ..Default::default()
        })),
    ]
}

fn model_infer_request() -> impl Strategy<Value = ModelInferRequest> {
    let input = (datatype(), shape(), contents()).prop_map(|(datatype, shape, contents)| InferInputTensor {
        name: "input-0".into(),
        datatype,
        shape,
        contents,
        ..Default::default()
    });
    let parameter = prop_oneof![
        any::<f64>().prop_map(ParameterChoice::DoubleParam),
        ".{0,8}".prop_map(ParameterChoice::StringParam),
        any::<i64>().prop_map(ParameterChoice::Int64Param),
    ];
    let outputs = vec(prop::sample::select(vec!["label", "noisy", "scores", ""]), 0..3);
    (vec(input, 0..3), vec(raw(), 0..3), proptest::option::of(parameter), outputs).prop_map(
        |(inputs, raw_input_contents, alpha, outputs)| ModelInferRequest {
            model_name: "private".into(),
            inputs,
            raw_input_contents,
            parameters: alpha
                .map(|p| ("confidence_alpha".to_owned(), InferParameter { parameter_choice: Some(p) }))
                .into_iter()
                .collect(),
            outputs: outputs
                .into_iter()
                .map(|name| InferRequestedOutputTensor { name: name.into(), ..Default::default() })
                .collect(),
            ..Default::default()
        },
    )
}

fn teacher_response() -> impl Strategy<Value = ModelInferResponse> {
    let name = prop::sample::select(vec!["label", "probabilities", "other"]);
    let output = (name, datatype(), shape(), contents()).prop_map(|(name, datatype, shape, contents)| {
        InferOutputTensor { name: name.into(), datatype, shape, contents, ..Default::default() }
    });
    (vec(output, 0..3), vec(raw(), 0..3)).prop_map(|(outputs, raw_output_contents)| ModelInferResponse {
        outputs,
        raw_output_contents,
        ..Default::default()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(data in vec(any::<u8>(), 0..1200)) {
        super::predict_request(&data);
        super::model_infer_request(&data);
        super::teacher_response(&data);
    }

    #[test]
    fn client_requests_are_refused_or_exactly_one_finite_example(req in predict_request()) {
        super::predict_request(&req.encode_to_vec());
        check_predict(req);
    }

    #[test]
    fn inference_requests_are_refused_or_exactly_one_finite_example(req in model_infer_request()) {
        super::model_infer_request(&req.encode_to_vec());
        check_model_infer(req);
    }

    #[test]
    fn teacher_replies_are_refused_or_exactly_the_expected_outputs(reply in teacher_response()) {
        super::teacher_response(&reply.encode_to_vec());
        check_teacher_response(&reply);
    }
}

/// The generators do reach acceptance: a fuzzer that only ever sees
/// refusals checks nothing about what is accepted.
#[test]
fn well_formed_inputs_are_accepted() {
    let good = PredictRequest {
        input: Some(Tensor {
            datatype: "FP32".into(),
            shape: vec![1, 64],
            fp32_contents: vec![1.0; 64],
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(InputSpec { shape: vec![FEATURES], release_noisy: true, max_rows: 64 }.parse(good).is_ok());
    let reply = ModelInferResponse {
        outputs: vec![InferOutputTensor {
            name: "label".into(),
            datatype: "INT64".into(),
            shape: vec![3],
            contents: Some(InferTensorContents { int64_contents: vec![0, 9, 4], ..Default::default() }),
            ..Default::default()
        }],
        ..Default::default()
    };
    assert_eq!(read_output(reply, None, OutputMode::Label { classes: 10 }, 3), Ok(vec![0.0, 9.0, 4.0]));
}
