//! Compiles the store's record schema (`proto/pacpriv/store/v1/records.proto`)
//! at build time (needs `protoc`, Debian package `protobuf-compiler`, or
//! `PROTOC` pointing at one): messages only, no service.

/// The repository's `proto/`, where the service's wire protocols are too.
const PROTO: &str = "../../proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed={PROTO}/pacpriv/store");
    // Maps as BTreeMap: a record's bytes do not depend on a hash seed.
    prost_build::Config::new()
        .btree_map(["."])
        .compile_protos(&[format!("{PROTO}/pacpriv/store/v1/records.proto")], &[PROTO])?;
    Ok(())
}
