//! Wire protocols, generated from `proto/` by `build.rs`.

/// Open Inference Protocol (KServe v2 / Triton / MLServer) messages and
/// service, used to talk to teacher models.
#[allow(missing_docs, clippy::all)]
pub mod inference {
    tonic::include_proto!("inference");
}

#[cfg(test)]
mod test;
