//! Model repositories on disk for tests: `model.toml`, version directories
//! with generated ONNX models, warmup and golden samples, and a MANIFEST
//! written last —
//! plus every kind of damage the load transaction must refuse.

use std::path::{Path, PathBuf};

use baton_core::files::manifest;

use crate::onnx::{Mlp, OnnxOptions, encode_mlp};

/// A model repository, in a temporary directory removed on drop, or in a
/// directory the caller owns.
pub struct TestRepo {
    dir: Dir,
}

enum Dir {
    Temp(tempfile::TempDir),
    Kept(PathBuf),
}

/// `model.toml` for an MLP with the default tensor names.
pub fn mlp_toml(mlp: &Mlp, extra: &str) -> String {
    format!(
        "backend = \"onnx\"\n\
         inputs = [{{ name = \"input\", datatype = \"FP32\", shape = [-1, {}] }}]\n\
         outputs = [{{ name = \"output\", datatype = \"FP32\", shape = [-1, {}] }}]\n\
         {extra}\n",
        mlp.input_width(),
        mlp.output_width()
    )
}

/// Damage done to a published version, each caught by a different stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Damage {
    /// `model.onnx` cut to half its size after the manifest was written.
    Truncate,
    /// One byte of `model.onnx` changed, size unchanged.
    FlipByte,
    /// No MANIFEST at all.
    RemoveManifest,
    /// MANIFEST cut before its closing line.
    CutManifest,
}

impl Default for TestRepo {
    fn default() -> Self {
        Self::new()
    }
}

impl TestRepo {
    /// An empty repository.
    pub fn new() -> TestRepo {
        let dir = tempfile::Builder::new().prefix("baton-repo-").tempdir().expect("creating a temp dir");
        TestRepo { dir: Dir::Temp(dir) }
    }

    /// A repository in an existing directory, which stays when this is dropped.
    pub fn at(root: &Path) -> TestRepo {
        TestRepo { dir: Dir::Kept(root.to_owned()) }
    }

    /// The repository root.
    pub fn root(&self) -> &Path {
        match &self.dir {
            Dir::Temp(dir) => dir.path(),
            Dir::Kept(path) => path,
        }
    }

    /// Writes `model.toml` for a model.
    pub fn add_model(&self, name: &str, toml: &str) {
        let dir = self.root().join(name);
        std::fs::create_dir_all(&dir).expect("creating the model dir");
        std::fs::write(dir.join("model.toml"), toml).expect("writing model.toml");
    }

    /// The directory of a version.
    pub fn version_dir(&self, name: &str, version: u64) -> PathBuf {
        self.root().join(name).join(version.to_string())
    }

    /// Writes files into a version directory without a manifest.
    pub fn write_files(&self, name: &str, version: u64, files: &[(&str, &[u8])]) -> PathBuf {
        let dir = self.version_dir(name, version);
        for (path, bytes) in files {
            let file = dir.join(path);
            std::fs::create_dir_all(file.parent().expect("a parent")).expect("creating dirs");
            std::fs::write(file, bytes).expect("writing a version file");
        }
        dir
    }

    /// Writes the manifest of a version, last, as `baton package` does.
    pub fn seal(&self, name: &str, version: u64) {
        manifest::write(&self.version_dir(name, version)).expect("writing MANIFEST");
    }

    /// Publishes an MLP as a complete version.
    pub fn publish_mlp(&self, name: &str, version: u64, mlp: &Mlp) -> PathBuf {
        self.publish_mlp_with(name, version, mlp, &OnnxOptions::default(), &[])
    }

    /// Publishes an MLP with encoding options and extra files (e.g. warmup
    /// samples), then seals it.
    pub fn publish_mlp_with(
        &self,
        name: &str,
        version: u64,
        mlp: &Mlp,
        opts: &OnnxOptions,
        extra: &[(&str, &[u8])],
    ) -> PathBuf {
        let (model, external) = encode_mlp(mlp, opts);
        let mut files: Vec<(&str, &[u8])> = vec![("model.onnx", &model)];
        if let (Some(location), Some(bytes)) = (opts.external_data.as_deref(), external.as_deref()) {
            files.push((location, bytes));
        }
        files.extend_from_slice(extra);
        let dir = self.write_files(name, version, &files);
        self.seal(name, version);
        dir
    }

    /// Publishes a version that answers as `mlp` does with `rows` rows of
    /// work for every row asked for ([`baton_onnx::costly::encode_costly`]);
    /// then seals it.
    pub fn publish_costly(&self, name: &str, version: u64, mlp: &Mlp, rows: usize) -> PathBuf {
        let model = baton_onnx::costly::encode_costly(mlp, rows);
        let dir = self.write_files(name, version, &[("model.onnx", &model)]);
        self.seal(name, version);
        dir
    }

    /// Publishes a weights-only version: `weights`' tensors as
    /// `weights.safetensors` and the graph of `graph`'s model as
    /// `graph.onnx`, as `baton package --graph-from` writes it, plus
    /// `extra` files; then seals it.
    pub fn publish_weights(
        &self,
        name: &str,
        version: u64,
        graph: &Mlp,
        weights: &[u8],
        extra: &[(&str, &[u8])],
    ) -> PathBuf {
        let dir = self.version_dir(name, version);
        std::fs::create_dir_all(&dir).expect("creating the version directory");
        let weights_path = dir.join(baton_onnx::safetensors::WEIGHTS_FILE);
        std::fs::write(&weights_path, weights).expect("writing the weights");
        let (model, _) = encode_mlp(graph, &OnnxOptions::default());
        let file = std::fs::File::open(&weights_path).expect("opening the weights");
        let rewritten = baton_onnx::graph_for_weights(&model, &file).expect("the weights fit the graph");
        let mut files: Vec<(&str, &[u8])> = vec![(baton_onnx::GRAPH_FILE, &rewritten)];
        files.extend_from_slice(extra);
        self.write_files(name, version, &files);
        self.seal(name, version);
        dir
    }

    /// Damages a sealed version.
    pub fn damage(&self, name: &str, version: u64, damage: Damage) {
        damage_dir(&self.version_dir(name, version), damage);
    }

    /// Publishes an MLP as a sealed version that is damaged, built in a
    /// staging directory and moved into the repository with one rename, so
    /// a watcher polling the repository never sees it intact.
    pub fn publish_damaged(&self, name: &str, version: u64, mlp: &Mlp, damage: Damage) -> PathBuf {
        let staging = self.root().join(".staging").join(format!("{name}-{version}"));
        std::fs::create_dir_all(&staging).expect("creating the staging dir");
        let (model, _) = encode_mlp(mlp, &OnnxOptions::default());
        std::fs::write(staging.join("model.onnx"), model).expect("writing model.onnx");
        manifest::write(&staging).expect("writing MANIFEST");
        damage_dir(&staging, damage);
        let dir = self.version_dir(name, version);
        std::fs::rename(&staging, &dir).expect("moving the version into the repository");
        dir
    }

    /// Removes a version's directory, as an operator deleting it would.
    pub fn remove_version(&self, name: &str, version: u64) {
        std::fs::remove_dir_all(self.version_dir(name, version)).expect("removing a version directory");
    }
}

/// Applies `damage` to the sealed version in `dir`.
fn damage_dir(dir: &Path, damage: Damage) {
    let model = dir.join("model.onnx");
    let manifest = dir.join(manifest::MANIFEST);
    match damage {
        Damage::Truncate => {
            let bytes = std::fs::read(&model).expect("reading model");
            std::fs::write(&model, &bytes[..bytes.len() / 2]).expect("truncating");
        }
        Damage::FlipByte => {
            let mut bytes = std::fs::read(&model).expect("reading model");
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x5a;
            std::fs::write(&model, bytes).expect("rewriting");
        }
        Damage::RemoveManifest => std::fs::remove_file(&manifest).expect("removing MANIFEST"),
        Damage::CutManifest => {
            let text = std::fs::read_to_string(&manifest).expect("reading MANIFEST");
            let cut = text.rfind("end ").expect("a sealed manifest");
            std::fs::write(&manifest, &text[..cut]).expect("cutting MANIFEST");
        }
    }
}

/// A KServe V2 JSON request body with one FP32 input, as warmup samples use.
pub fn sample_json(name: &str, batch: usize, width: usize, values: &[f32]) -> Vec<u8> {
    serde_json::json!({
        "inputs": [{ "name": name, "datatype": "FP32", "shape": [batch, width], "data": values }]
    })
    .to_string()
    .into_bytes()
}

/// A golden sample file for an MLP with the default tensor names: `batch`
/// rows of `input` and, as the expected `output`, what `mlp` computes for
/// them ([`Mlp::forward`]), with the default tolerances. Given the weights
/// of the version it ships with, the version passes; given other weights,
/// it is refused as `golden_mismatch`.
pub fn golden_json(mlp: &Mlp, input: &[f32], batch: usize) -> Vec<u8> {
    let expected = mlp.forward(input, batch);
    serde_json::json!({
        "inputs": [{ "name": "input", "datatype": "FP32", "shape": [batch, mlp.input_width()], "data": input }],
        "outputs": [{ "name": "output", "datatype": "FP32", "shape": [batch, mlp.output_width()], "data": expected }],
    })
    .to_string()
    .into_bytes()
}
