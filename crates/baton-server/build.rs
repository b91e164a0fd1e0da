//! Compiles the gRPC definitions in `proto/` with pure-Rust tools (protox
//! parses them, tonic-prost-build generates the code), so building baton
//! needs no system `protoc`.
//!
//! Two outputs: `$OUT_DIR/server/` holds the messages and the services'
//! server side, which the binary includes; `$OUT_DIR/client/` holds the
//! messages and the client side, which the black-box tests include.

use std::path::PathBuf;

const PROTOS: [&str; 3] = ["grpc_service.proto", "model_config.proto", "baton_management.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for proto in PROTOS {
        println!("cargo:rerun-if-changed=proto/{proto}");
    }
    let descriptors = protox::compile(PROTOS, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    for (side, server) in [("server", true), ("client", false)] {
        let dir = out.join(side);
        std::fs::create_dir_all(&dir)?;
        tonic_prost_build::configure()
            .build_server(server)
            .build_client(!server)
            .build_transport(false)
            .emit_rerun_if_changed(false)
            .out_dir(&dir)
            .compile_fds(descriptors.clone())?;
    }
    Ok(())
}
