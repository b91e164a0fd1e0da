//! Compiles the part of etcd's v3 API baton speaks (`proto/etcd.proto`)
//! with pure-Rust tools (protox parses it, tonic-prost-build generates the
//! client), so building baton needs no system `protoc`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/etcd.proto");
    let descriptors = protox::compile(["etcd.proto"], ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .out_dir(&out)
        .compile_fds(descriptors)?;
    Ok(())
}
