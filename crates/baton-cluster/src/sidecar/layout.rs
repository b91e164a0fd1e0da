//! Where a server of each kind looks for a model's versions, and what it
//! needs beside a baton version's files to load one.
//!
//! All three kinds read a version from `<repo>/<model>/<version>/`; they
//! differ in the files around it: baton reads `<model>/model.toml`,
//! MLServer a `model-settings.json` inside the version, Triton a
//! `<model>/config.pbtxt`. The agent stages a version in this form, so
//! that putting it into place is one rename.

use std::path::Path;

use serde_json::{Value, json};

/// The file a baton version's ONNX model is in.
pub const MODEL_FILE: &str = "model.onnx";
/// The MLServer runtime the benchmarks serve ONNX models with
/// (bench/mlserver_onnx/runtime.py, on MLServer's Python path).
pub const MLSERVER_RUNTIME: &str = "runtime.OnnxModel";

/// The kind of server the agent speaks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetLayout {
    /// Another baton (without cluster mode): `<model>/model.toml`, and the
    /// version directory as published, MANIFEST included.
    Baton,
    /// MLServer: each version directory holds a `model-settings.json`
    /// naming the model, its version and the ONNX runtime.
    Mlserver,
    /// Triton: `<model>/config.pbtxt` for the ONNX Runtime backend, and
    /// `<model>/<version>/model.onnx`.
    Triton,
}

impl TargetLayout {
    /// The kind named `baton`, `mlserver` or `triton`.
    pub fn parse(name: &str) -> Result<TargetLayout, String> {
        match name {
            "baton" => Ok(TargetLayout::Baton),
            "mlserver" => Ok(TargetLayout::Mlserver),
            "triton" => Ok(TargetLayout::Triton),
            other => Err(format!("unknown target kind '{other}': use baton, mlserver or triton")),
        }
    }

    /// The kind's name.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetLayout::Baton => "baton",
            TargetLayout::Mlserver => "mlserver",
            TargetLayout::Triton => "triton",
        }
    }

    /// Adds to a staged version directory `dir`, already verified, what
    /// the server needs inside it.
    pub fn finish_version(self, dir: &Path, model: &str, version: u64) -> std::io::Result<()> {
        match self {
            TargetLayout::Baton | TargetLayout::Triton => Ok(()),
            TargetLayout::Mlserver => {
                let settings = mlserver_settings(model, version);
                let text = serde_json::to_vec_pretty(&settings).map_err(std::io::Error::other)?;
                std::fs::write(dir.join("model-settings.json"), text)
            }
        }
    }

    /// Writes what the server needs in `model_dir`, the model's directory in
    /// its repository, beside the versions: baton's `model.toml` from the
    /// source model directory, Triton's `config.pbtxt` unless one is there.
    /// Each is written to a temporary name and renamed.
    pub fn finish_model(self, model_dir: &Path, source_model_dir: &Path, model: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(model_dir)?;
        match self {
            TargetLayout::Mlserver => Ok(()),
            TargetLayout::Baton => {
                let text = std::fs::read(source_model_dir.join("model.toml"))?;
                replace_file(&model_dir.join("model.toml"), &text)
            }
            TargetLayout::Triton => {
                let config = model_dir.join("config.pbtxt");
                if config.exists() {
                    return Ok(());
                }
                replace_file(&config, triton_config(model).as_bytes())
            }
        }
    }

    /// The body of the load call for `version`: baton is told the version;
    /// MLServer and Triton load what is in place.
    pub fn load_body(self, version: u64) -> Value {
        match self {
            TargetLayout::Baton => json!({ "parameters": { "version": version } }),
            TargetLayout::Mlserver | TargetLayout::Triton => json!({}),
        }
    }
}

/// MLServer's `model-settings.json` for a baton version: the model file is
/// named relative to the settings file, so the directory can move.
pub fn mlserver_settings(model: &str, version: u64) -> Value {
    json!({
        "name": model,
        "implementation": MLSERVER_RUNTIME,
        "parameters": {
            "uri": format!("./{MODEL_FILE}"),
            "version": version.to_string(),
        },
    })
}

/// A Triton model configuration that leaves inputs and outputs to the
/// ONNX Runtime backend's auto-complete and serves the newest version in
/// place (the agent keeps one there).
fn triton_config(model: &str) -> String {
    format!("name: \"{model}\"\nbackend: \"onnxruntime\"\nversion_policy: {{ latest: {{ num_versions: 1 }} }}\n")
}

/// Writes `bytes` to `path` through a temporary name and a rename.
fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("baton-tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mlserver_settings_name_the_runtime_the_version_and_a_relative_file() {
        let dir = tempfile::tempdir().unwrap();
        TargetLayout::Mlserver.finish_version(dir.path(), "ranker", 3).unwrap();
        let text = std::fs::read(dir.path().join("model-settings.json")).unwrap();
        let settings: Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(settings["name"], "ranker");
        assert_eq!(settings["implementation"], MLSERVER_RUNTIME);
        assert_eq!(settings["parameters"]["version"], "3");
        assert_eq!(settings["parameters"]["uri"], "./model.onnx");
        TargetLayout::Baton.finish_version(dir.path(), "ranker", 3).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "baton needs nothing beside its files");
    }

    #[test]
    fn model_files_follow_the_kind() {
        let source = tempfile::tempdir().unwrap();
        std::fs::write(source.path().join("model.toml"), "backend = \"onnx\"\n").unwrap();
        let target = tempfile::tempdir().unwrap();
        let model_dir = target.path().join("m");
        TargetLayout::Baton.finish_model(&model_dir, source.path(), "m").unwrap();
        assert_eq!(std::fs::read_to_string(model_dir.join("model.toml")).unwrap(), "backend = \"onnx\"\n");
        TargetLayout::Triton.finish_model(&model_dir, source.path(), "m").unwrap();
        let config = std::fs::read_to_string(model_dir.join("config.pbtxt")).unwrap();
        assert!(config.contains("backend: \"onnxruntime\"") && config.contains("name: \"m\""), "{config}");
        std::fs::write(model_dir.join("config.pbtxt"), "mine").unwrap();
        TargetLayout::Triton.finish_model(&model_dir, source.path(), "m").unwrap();
        assert_eq!(std::fs::read_to_string(model_dir.join("config.pbtxt")).unwrap(), "mine", "an operator's is kept");
        assert_eq!(TargetLayout::Baton.load_body(2)["parameters"]["version"], 2);
        assert_eq!(TargetLayout::Mlserver.load_body(2), json!({}));
        assert_eq!(TargetLayout::parse("mlserver"), Ok(TargetLayout::Mlserver));
        assert!(TargetLayout::parse("tfserving").is_err());
    }
}
