//! Compiles the wire protocols in the repository's `proto/` at build time
//! (needs `protoc`, Debian package `protobuf-compiler`, or `PROTOC` pointing
//! at one), and writes their descriptor set for gRPC server reflection.

/// The repository's `proto/`, where clients and the Python package find
/// the same files.
const PROTO: &str = "../../proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO}");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let at = |file: &str| format!("{PROTO}/{file}");
    // Default stubs (UNIMPLEMENTED): a teacher server, or the admin
    // listener's repository service, implements only what it serves.
    tonic_prost_build::configure()
        .generate_default_stubs(true)
        .file_descriptor_set_path(out.join("inference_descriptor.bin"))
        .compile_protos(&[at("inference.proto")], &[PROTO.to_owned()])?;
    // One package, so one call (prost writes one file per package). Each
    // listener's reflection names only the services it serves.
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("pacpriv_descriptor.bin"))
        .compile_protos(&[at("pacpriv/v1/privatizer.proto"), at("pacpriv/v1/admin.proto")], &[PROTO.to_owned()])?;
    Ok(())
}
