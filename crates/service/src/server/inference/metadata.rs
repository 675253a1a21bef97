//! `ServerMetadata` and `ModelMetadata`: what a generic Open Inference
//! Protocol client needs to build a request for the private model.

use super::model_infer::{LABEL, MI_CHARGED, NOISY};
use crate::proto::inference::model_metadata_response::TensorMetadata;
use crate::proto::inference::{ModelMetadataResponse, ServerMetadataResponse};
use crate::server::models::Model;

/// The protocol extensions pacpriv serves, as Triton names them: the
/// model repository (its index here; load and unload on the admin
/// listener), statistics (for principals), Triton's binary tensor data
/// (HTTP) and request and response parameters.
pub const EXTENSIONS: [&str; 4] = ["model_repository", "statistics", "binary_tensor_data", "parameters"];

/// Name and version of this server, and the extensions it serves.
pub fn server() -> ServerMetadataResponse {
    ServerMetadataResponse {
        name: "pacpriv".to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        extensions: EXTENSIONS.map(str::to_owned).to_vec(),
    }
}

/// The private model `model`, one of `versions`: n examples of the configured shape in (FP32
/// advertised; FP64 accepted too; -1 is the batch dimension, as Triton
/// writes it), a label and a charge per example out, and the noisy
/// releases when the operator allows it.
pub fn model(model: &Model, versions: Vec<String>) -> ModelMetadataResponse {
    let tensor = |name: &str, datatype: &str, shape: Vec<i64>| TensorMetadata {
        name: name.to_owned(),
        datatype: datatype.to_owned(),
        shape,
    };
    let example = std::iter::once(-1).chain(model.input.shape.iter().map(|&d| d as i64)).collect();
    let d = model.ensemble.mode().dim();
    let mut outputs = vec![tensor(LABEL, "INT64", vec![-1]), tensor(MI_CHARGED, "FP64", vec![-1])];
    if model.input.release_noisy {
        outputs.push(tensor(NOISY, "FP64", vec![-1, d as i64]));
    }
    ModelMetadataResponse {
        name: model.name.clone(),
        versions,
        platform: "pacpriv".to_owned(),
        inputs: vec![tensor("input", "FP32", example)],
        outputs,
    }
}
