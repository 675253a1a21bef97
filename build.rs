//! Compiles the wire protocols in `proto/` at build time (needs `protoc`,
//! Debian package `protobuf-compiler`, or `PROTOC` pointing at one).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure().compile_protos(&["proto/inference.proto"], &["proto"])?;
    Ok(())
}
