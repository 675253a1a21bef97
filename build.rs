//! Compiles the wire protocols in `proto/` at build time (needs `protoc`,
//! Debian package `protobuf-compiler`, or `PROTOC` pointing at one), and
//! writes their descriptor set for gRPC server reflection.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure().compile_protos(&["proto/inference.proto"], &["proto"])?;
    // Only the client API is served on the client port, so only it goes in
    // the descriptor set that reflection advertises.
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("pacpriv_descriptor.bin"))
        .compile_protos(&["proto/pacpriv/v1/privatizer.proto"], &["proto"])?;
    Ok(())
}
