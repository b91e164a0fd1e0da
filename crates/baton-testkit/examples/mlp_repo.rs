//! Writes a model repository holding one MLP with several versions.
//!
//! `cargo run -p baton-testkit --example mlp_repo -- DIR NAME SIZES VERSIONS [MODEL_TOML_EXTRA]`
//!
//! e.g. `mlp_repo /tmp/repo mlp 256,1024,512,1 3 'max_batch_size = 64'` writes
//! `/tmp/repo/mlp/{model.toml,1,2,3}`, each version with its own seeded
//! weights and a MANIFEST.

use baton_onnx::mlp::Mlp;
use baton_testkit::repo::{TestRepo, mlp_toml};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, name, sizes, versions, rest @ ..] = args.as_slice() else {
        eprintln!("usage: mlp_repo DIR NAME SIZES(comma-separated) VERSIONS [MODEL_TOML_EXTRA]");
        std::process::exit(2);
    };
    let sizes: Vec<usize> = sizes.split(',').map(|s| s.trim().parse().expect("a layer size")).collect();
    let versions: u64 = versions.parse().expect("a number of versions");
    std::fs::create_dir_all(dir).expect("creating the repository");
    let repo = TestRepo::at(std::path::Path::new(dir));
    let extra = rest.first().map(String::as_str).unwrap_or("");
    for version in 1..=versions {
        let mlp = Mlp::new(&sizes, version);
        if version == 1 {
            repo.add_model(name, &mlp_toml(&mlp, extra));
        }
        repo.publish_mlp(name, version, &mlp);
    }
    println!("{}", repo.root().join(name).display());
}
