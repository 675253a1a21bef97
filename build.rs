//! Compiles the wire protocols in `proto/` at build time (needs `protoc`,
//! Debian package `protobuf-compiler`, or `PROTOC` pointing at one), and
//! writes their descriptor set for gRPC server reflection.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure().compile_protos(&["proto/inference.proto"], &["proto"])?;
    // One package, so one call (prost writes one file per package). Each
    // listener's reflection names only the services it serves.
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("pacpriv_descriptor.bin"))
        .compile_protos(&["proto/pacpriv/v1/privatizer.proto", "proto/pacpriv/v1/admin.proto"], &["proto"])?;
    // The store's record schema: messages only, no service, no reflection.
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .compile_protos(&["proto/pacpriv/store/v1/records.proto"], &["proto"])?;
    Ok(())
}
