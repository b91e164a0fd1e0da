//! Compiles the gRPC definitions in `proto/` with pure-Rust tools (protox
//! parses them, tonic-prost-build generates the code), so building baton
//! needs no system `protoc`. One output holds the messages and both sides
//! of each service: the server uses one, the drill and the tests the other.

use std::path::PathBuf;

const PROTOS: [&str; 3] = ["grpc_service.proto", "model_config.proto", "baton_management.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed=proto/{proto}");
    }
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        .emit_rerun_if_changed(false)
        // prost's codec, with inference requests checked on the wire first.
        .codec_path("crate::grpc::codec::Codec")
        .out_dir(&out)
        .compile_fds(descriptors)?;
    Ok(())
}
