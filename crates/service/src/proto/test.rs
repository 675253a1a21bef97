//! The generated messages must match the public spec's field numbers: these
//! bytes are what a spec-conformant peer puts on the wire.
use super::inference::{ModelInferRequest, ModelInferResponse, model_infer_request::InferInputTensor};
use prost::Message;

#[test]
fn infer_request_field_numbers_match_the_spec() -> Result<(), prost::DecodeError> {
    let req = ModelInferRequest {
        model_name: "m".into(),
        inputs: vec![InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![1, 2],
            ..Default::default()
        }],
        raw_input_contents: vec![vec![0, 0, 128, 63, 0, 0, 0, 64]],
        ..Default::default()
    };
    let bytes = req.encode_to_vec();
    // field 1 (model_name, length-delimited): tag 0x0a
    assert_eq!(&bytes[..3], &[0x0a, 1, b'm']);
    // field 5 (inputs) has tag 0x2a, field 7 (raw_input_contents) tag 0x3a
    assert!(bytes.contains(&0x2a));
    let raw_at = bytes.iter().rposition(|&b| b == 0x3a).expect("raw contents present");
    assert_eq!(bytes[raw_at + 1], 8);
    assert_eq!(ModelInferRequest::decode(bytes.as_slice())?, req);
    Ok(())
}

#[test]
fn infer_response_decodes_raw_output_contents_at_field_6() -> Result<(), prost::DecodeError> {
    // Hand-assembled: model_name="t" (field 1), raw_output_contents=[1,2] (field 6).
    let wire = [0x0a, 1, b't', 0x32, 2, 1, 2];
    let resp = ModelInferResponse::decode(&wire[..])?;
    assert_eq!(resp.model_name, "t");
    assert_eq!(resp.raw_output_contents, vec![vec![1u8, 2]]);
    Ok(())
}
