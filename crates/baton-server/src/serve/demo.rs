//! The demo repository `baton serve` uses when given none: a small ranking
//! MLP that baton generates itself, so a newcomer can send an inference
//! within a minute of cloning — and a second version, staged but not yet
//! published, to try a swap with.

use std::path::{Path, PathBuf};

use anyhow::Context;
use baton_onnx::mlp::{Mlp, OnnxOptions, encode_mlp};

/// The demo model's name.
pub const MODEL: &str = "ranker";
/// Its layer sizes: 8 features in, one score out.
pub const SIZES: [usize; 4] = [8, 32, 16, 1];

const MODEL_TOML: &str = r#"# The demo ranker: 8 features in, one score out.
backend = "onnx"
max_batch_size = 64
inputs = [{ name = "input", datatype = "FP32", shape = [-1, 8] }]
outputs = [{ name = "output", datatype = "FP32", shape = [-1, 1] }]

[policy]
keep_previous = 1
drain_timeout_ms = 30000

[warmup]
batch_sizes = [1, 8, 32, 64]
"#;

fn write_version(dir: &Path, seed: u64) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir.join("warmup")).with_context(|| format!("creating {}", dir.display()))?;
    let (model, _) = encode_mlp(&Mlp::new(&SIZES, seed), &OnnxOptions::default());
    std::fs::write(dir.join("model.onnx"), model)?;
    let sample = serde_json::json!({
        "inputs": [{ "name": "input", "datatype": "FP32", "shape": [1, 8], "data": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8] }]
    });
    std::fs::write(dir.join("warmup/sample.json"), sample.to_string())?;
    Ok(())
}

/// Makes sure `base/models` holds the demo repository with version 1
/// published, and `base/next/2` holds version 2's files, not yet published.
/// Returns the repository root.
pub fn prepare(base: &Path) -> anyhow::Result<PathBuf> {
    let models = base.join("models");
    let model_dir = models.join(MODEL);
    if !model_dir.join("model.toml").exists() {
        std::fs::create_dir_all(&model_dir).with_context(|| format!("creating {}", model_dir.display()))?;
        std::fs::write(model_dir.join("model.toml"), MODEL_TOML)?;
    }
    let v1 = model_dir.join("1");
    if !baton_core::files::manifest::is_complete(&v1) {
        write_version(&v1, 1)?;
        baton_core::files::manifest::write(&v1)?;
    }
    let next = base.join("next").join("2");
    if !next.join("model.onnx").exists() {
        write_version(&next, 2)?;
    }
    Ok(models)
}
