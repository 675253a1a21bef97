//! Fuzzing entry points for everything that parses bytes a peer chose:
//! client requests (`pacpriv.v1.PredictRequest`), Open Inference Protocol
//! requests (`ModelInferRequest`, the front-end) and teacher replies
//! (`ModelInferResponse`, the fan-out). Each takes arbitrary bytes, decodes
//! the protobuf message, runs it through the code a real request or reply
//! takes, and checks what that code promises.
//!
//! Two drivers call these: the cargo-fuzz targets in `fuzz/` (libFuzzer,
//! coverage-guided, nightly; docs/assurance/reliability.md has the command and
//! figures) and the proptest fallback in [`test`], which `cargo test` runs
//! in CI with structured generators (huge and negative dimensions, wrong
//! datatypes, raw contents of the wrong size, NaN).
//!
//! # Invariants checked
//! - Nothing panics, whatever the bytes.
//! - A request either fails with a message, or yields exactly one example
//!   of the configured shape, every value finite, α in (0, 1).
//! - A teacher reply is either refused, or read as exactly the expected
//!   number of labels (integers below d) or finite scores.

use crate::proto::inference::{ModelInferRequest, ModelInferResponse};
use crate::proto::pacpriv::PredictRequest;
use crate::server::inference::model_infer::Infer;
use crate::server::input::InputSpec;
use crate::teachers::OutputMode;
use crate::teachers::call::read_output;
use pacpriv_privacy::confidence;
use prost::Message;

/// Features of the fuzzed model's one example.
pub const FEATURES: usize = 64;

/// Bytes as a client's `PredictRequest`.
pub fn predict_request(data: &[u8]) {
    if let Ok(request) = PredictRequest::decode(data) {
        check_predict(request);
    }
}

/// Bytes as an Open Inference Protocol `ModelInferRequest`.
pub fn model_infer_request(data: &[u8]) {
    if let Ok(request) = ModelInferRequest::decode(data) {
        check_model_infer(request);
    }
}

/// Bytes as a teacher's `ModelInferResponse`.
pub fn teacher_response(data: &[u8]) {
    if let Ok(response) = ModelInferResponse::decode(data) {
        check_teacher_response(&response);
    }
}

/// Validates `request` as the service would, and checks the result.
///
/// # Panics
/// When validation accepts something it promises to refuse.
pub fn check_predict(request: PredictRequest) {
    let spec = InputSpec { shape: vec![FEATURES], release_noisy: true, max_rows: 64 };
    match spec.parse(request) {
        Ok(q) => {
            assert!((1..=64).contains(&q.rows.len()), "one example or a batch within the limit");
            for row in &q.rows {
                assert_eq!(row.features.len(), FEATURES, "examples of the configured shape");
                assert!(row.features.iter().all(|v| v.is_finite()), "only finite values");
            }
            assert!(q.alpha.is_none_or(|a| confidence::threshold(a).is_ok()), "α in (0, 1)");
            assert!(!q.query_id.is_empty() && q.query_id.len() <= 128);
        }
        Err(e) => assert!(!e.to_string().is_empty(), "an error says what to change"),
    }
}

/// Reads `request` as the front-end would, then validates its example.
///
/// # Panics
/// As [`check_predict`].
pub fn check_model_infer(request: ModelInferRequest) {
    match Infer::parse(request) {
        Ok((predict, _)) => check_predict(predict),
        Err(e) => assert!(!e.to_string().is_empty(), "an error says what to change"),
    }
}

/// Reads `response` as the fan-out would, for several batch sizes, modes
/// and output names, and checks every accepted reading.
///
/// # Panics
/// When a reading is accepted that does not hold the promised values.
pub fn check_teacher_response(response: &ModelInferResponse) {
    let modes = [OutputMode::Label { classes: 10 }, OutputMode::Label { classes: 2 }, OutputMode::Vector { dim: 10 }];
    for mode in modes {
        for cells in [1, 3, 16] {
            for name in [None, Some("label"), Some("probabilities")] {
                let Ok(values) = read_output(response.clone(), name, mode, cells) else { continue };
                match mode {
                    OutputMode::Label { classes } => {
                        assert_eq!(values.len(), cells, "one label per cell");
                        assert!(values.iter().all(|&l| l.fract() == 0.0 && l >= 0.0 && (l as usize) < classes));
                    }
                    OutputMode::Vector { dim } => {
                        assert_eq!(values.len(), cells * dim, "d scores per cell");
                        assert!(values.iter().all(|v| v.is_finite()));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod test;
