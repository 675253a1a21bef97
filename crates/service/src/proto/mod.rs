//! Wire protocols, generated from `proto/` by `build.rs`.

/// Open Inference Protocol (KServe v2 / Triton / MLServer) messages and
/// service, used to talk to teacher models.
#[allow(missing_docs, clippy::all)]
pub mod inference {
    tonic::include_proto!("inference");
}

/// The pacpriv client API (`proto/pacpriv/v1/privatizer.proto`) and admin
/// API (`proto/pacpriv/v1/admin.proto`).
#[allow(missing_docs, clippy::all)]
pub mod pacpriv {
    tonic::include_proto!("pacpriv.v1");
}

/// Encoded descriptors of the client and admin APIs, for gRPC server
/// reflection (each listener names only the services it serves).
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("pacpriv_descriptor");

/// The encoded descriptor of the Open Inference Protocol's service, for
/// reflection on the listeners that serve it.
pub const INFERENCE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("inference_descriptor");

#[cfg(test)]
mod test;
