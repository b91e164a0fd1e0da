//! Where a server of each kind looks for a model's versions, and what it
//! needs beside a baton version's files to load one.
//!
//! All three kinds read a version from `<repo>/<model>/<version>/`; they
//! differ in the files around it: baton reads `<model>/model.toml`,
//! MLServer a `model-settings.json` inside the version, Triton a
//! `<model>/config.pbtxt`. The agent stages a version in this form, so
//! that putting it into place is one rename.
//!
//! A version may bring these files itself (a Triton python-backend setup
//! publishes its `config.pbtxt` and `model.py`): what a version brings is
//! used as it is, and the agent writes only what is missing
//! ([`TargetLayout::model_files`]).

use std::path::Path;

use serde_json::{Value, json};

/// The file a baton version's ONNX model is in.
pub const MODEL_FILE: &str = "model.onnx";
/// The file a Triton python-backend version's model is in.
pub const PYTHON_FILE: &str = "model.py";
/// Triton's model configuration.
pub const TRITON_CONFIG: &str = "config.pbtxt";
/// MLServer's model settings.
pub const MLSERVER_SETTINGS: &str = "model-settings.json";
/// The MLServer runtime the benchmarks serve ONNX models with
/// (bench/mlserver_onnx/runtime.py, on MLServer's Python path).
pub const MLSERVER_RUNTIME: &str = "runtime.OnnxModel";

/// A file of a model's directory: its name, and its bytes, or `None` to
/// keep the one in place.
pub type ModelFile = (&'static str, Option<Vec<u8>>);

/// The kind of server the agent speaks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetLayout {
    /// Another baton (without cluster mode): `<model>/model.toml`, and the
    /// version directory as published, MANIFEST included.
    Baton,
    /// MLServer: each version directory holds a `model-settings.json`
    /// naming the model, its version and its runtime.
    Mlserver,
    /// Triton: `<model>/config.pbtxt` (the version's own, or one the agent
    /// writes for the ONNX Runtime or the python backend), and the
    /// version's files in `<model>/<version>/`.
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

    /// Names the version in `dir` `name` for the server, in the file the
    /// server reads it from: MLServer's settings (the version's own, with
    /// its `name` set, or ours). The other kinds take the name from the
    /// model's directory.
    pub fn name_version(self, dir: &Path, name: &str, version: u64) -> std::io::Result<()> {
        match self {
            TargetLayout::Baton | TargetLayout::Triton => Ok(()),
            TargetLayout::Mlserver => {
                let path = dir.join(MLSERVER_SETTINGS);
                let settings = match std::fs::read(&path) {
                    Ok(bytes) => {
                        let mut own: Value = serde_json::from_slice(&bytes).map_err(|e| {
                            std::io::Error::other(format!("the version's {MLSERVER_SETTINGS} is not JSON: {e}"))
                        })?;
                        let Some(fields) = own.as_object_mut() else {
                            return Err(std::io::Error::other(format!(
                                "the version's {MLSERVER_SETTINGS} is not a JSON object"
                            )));
                        };
                        fields.insert("name".into(), json!(name));
                        // The agent asks for the version by number.
                        let parameters = fields.entry("parameters").or_insert_with(|| json!({}));
                        if let Some(parameters) = parameters.as_object_mut() {
                            parameters.entry("version").or_insert_with(|| json!(version.to_string()));
                        }
                        own
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => mlserver_settings(name, version),
                    Err(e) => return Err(e),
                };
                let text = serde_json::to_vec_pretty(&settings).map_err(std::io::Error::other)?;
                replace_file(&path, &text)
            }
        }
    }

    /// What the server needs in a model's directory, beside the version in
    /// `version_dir` (staged, verified): each file's name and bytes, or
    /// `None` when `model_dir` holds it already and it is to be kept.
    ///
    /// - baton: `model.toml` from the source model directory.
    /// - Triton: the version's own `config.pbtxt` when it brings one;
    ///   else the one in place (an operator's); else the source model
    ///   directory's; else one the agent writes: for the ONNX Runtime
    ///   backend when the version has `model.onnx`, for the python backend
    ///   when it has `model.py` (its `auto_complete_config` then declares
    ///   the inputs and outputs). `model` names the model in the
    ///   configuration the agent writes. A configuration whose top-level
    ///   `name` is another model's is refused: Triton refuses to load a
    ///   model whose configuration names another than its directory.
    /// - MLServer: nothing.
    pub fn model_files(
        self,
        version_dir: &Path,
        model_dir: &Path,
        source_model_dir: &Path,
        model: &str,
    ) -> std::io::Result<Vec<ModelFile>> {
        match self {
            TargetLayout::Mlserver => Ok(Vec::new()),
            TargetLayout::Baton => Ok(vec![("model.toml", Some(std::fs::read(source_model_dir.join("model.toml"))?))]),
            TargetLayout::Triton => {
                if let Some(own) = read_if_there(&version_dir.join(TRITON_CONFIG))? {
                    check_name(&own, model, "the version's")?;
                    return Ok(vec![(TRITON_CONFIG, Some(own))]);
                }
                if let Some(in_place) = read_if_there(&model_dir.join(TRITON_CONFIG))? {
                    check_name(&in_place, model, "the target repository's")?;
                    return Ok(vec![(TRITON_CONFIG, None)]);
                }
                if let Some(published) = read_if_there(&source_model_dir.join(TRITON_CONFIG))? {
                    check_name(&published, model, "the source model directory's")?;
                    return Ok(vec![(TRITON_CONFIG, Some(published))]);
                }
                let backend = if version_dir.join(MODEL_FILE).is_file() {
                    "onnxruntime"
                } else if version_dir.join(PYTHON_FILE).is_file() {
                    "python"
                } else {
                    return Err(std::io::Error::other(format!(
                        "the version has no {TRITON_CONFIG}, {MODEL_FILE} or {PYTHON_FILE}: the agent cannot tell \
                         Triton how to serve it"
                    )));
                };
                Ok(vec![(TRITON_CONFIG, Some(triton_config(model, backend).into_bytes()))])
            }
        }
    }

    /// Writes [`TargetLayout::model_files`] into `model_dir`, each through a
    /// temporary name and a rename; keeps what is to be kept.
    pub fn finish_model(
        self,
        version_dir: &Path,
        model_dir: &Path,
        source_model_dir: &Path,
        model: &str,
    ) -> std::io::Result<()> {
        std::fs::create_dir_all(model_dir)?;
        for (name, bytes) in self.model_files(version_dir, model_dir, source_model_dir, model)? {
            if let Some(bytes) = bytes {
                replace_file(&model_dir.join(name), &bytes)?;
            }
        }
        Ok(())
    }

    /// Writes the model files of a probe of the version in `version_dir`
    /// into `probe_dir`: those the model would have (`model_dir` is its
    /// directory in the repository), with Triton's configuration naming
    /// no model, so that the server names it after `probe_dir`.
    pub fn finish_probe(
        self,
        version_dir: &Path,
        probe_dir: &Path,
        model_dir: &Path,
        source_model_dir: &Path,
        model: &str,
    ) -> std::io::Result<()> {
        std::fs::create_dir_all(probe_dir)?;
        for (name, bytes) in self.model_files(version_dir, model_dir, source_model_dir, model)? {
            let bytes = match bytes {
                Some(bytes) => bytes,
                None => std::fs::read(model_dir.join(name))?,
            };
            let bytes =
                if name == TRITON_CONFIG { without_name(&String::from_utf8_lossy(&bytes)).into_bytes() } else { bytes };
            replace_file(&probe_dir.join(name), &bytes)?;
        }
        Ok(())
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

fn read_if_there(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Refuses a Triton configuration (`whose` says which) whose top-level
/// `name` is not `model`.
fn check_name(config: &[u8], model: &str, whose: &str) -> std::io::Result<()> {
    match top_level_name(&String::from_utf8_lossy(config)) {
        Some(name) if name != model => Err(std::io::Error::other(format!(
            "{whose} {TRITON_CONFIG} names model \"{name}\", not \"{model}\": Triton would refuse to load it \
             from the model's directory (name it \"{model}\", or leave the name out)"
        ))),
        _ => Ok(()),
    }
}

/// The value of a Triton model configuration's top-level `name` field, if
/// it has one (a nested one, such as an input's, is not it).
pub fn top_level_name(config: &str) -> Option<String> {
    let (start, end) = *name_fields(config).first()?;
    let field = &config[start + 4..end];
    let value = field.trim_start().strip_prefix(':')?.trim();
    let quote = value.chars().next()?;
    Some(value.strip_prefix(quote)?.strip_suffix(quote)?.to_owned())
}

/// A Triton model configuration without its top-level `name` field (a
/// nested one, such as an input's, stays): Triton then names the model
/// after its directory. Comments and strings are skipped over.
pub fn without_name(config: &str) -> String {
    let mut out = String::with_capacity(config.len());
    let mut kept = 0;
    for (start, end) in name_fields(config) {
        out.push_str(&config[kept..start]);
        kept = end;
    }
    out.push_str(&config[kept.min(config.len())..]);
    out
}

/// Where each top-level `name: "…"` field of a Triton configuration starts
/// and ends; comments and strings are skipped over.
fn name_fields(config: &str) -> Vec<(usize, usize)> {
    let bytes = config.as_bytes();
    let mut fields = Vec::new();
    let (mut depth, mut i) = (0i32, 0usize);
    while i < bytes.len() {
        match bytes[i] {
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            quote @ (b'"' | b'\'') => {
                i += 1;
                while i < bytes.len() && bytes[i] != quote {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'{' | b'[' | b'<' => depth += 1,
            b'}' | b']' | b'>' => depth -= 1,
            b'n' if depth == 0 && (i == 0 || !is_ident(bytes[i - 1])) && config[i..].starts_with("name") => {
                if let Some(end) = name_field_end(bytes, i + 4) {
                    fields.push((i, end));
                    i = end;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    fields
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Where a `name: "…"` field that starts at `i` (just past `name`) ends.
fn name_field_end(bytes: &[u8], mut i: usize) -> Option<usize> {
    let skip = |i: &mut usize| {
        while *i < bytes.len() && bytes[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    skip(&mut i);
    if bytes.get(i) != Some(&b':') {
        return None;
    }
    i += 1;
    skip(&mut i);
    let quote = *bytes.get(i).filter(|q| **q == b'"' || **q == b'\'')?;
    i += 1;
    while i < bytes.len() && bytes[i] != quote {
        i += if bytes[i] == b'\\' { 2 } else { 1 };
    }
    (i < bytes.len()).then_some(i + 1)
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
/// backend's auto-complete (the ONNX Runtime backend reads them from the
/// model; the python backend from the model's `auto_complete_config`) and
/// serves the newest version in place (the agent keeps one there).
fn triton_config(model: &str, backend: &str) -> String {
    format!("name: \"{model}\"\nbackend: \"{backend}\"\nversion_policy: {{ latest: {{ num_versions: 1 }} }}\n")
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
        TargetLayout::Mlserver.name_version(dir.path(), "ranker", 3).unwrap();
        let text = std::fs::read(dir.path().join(MLSERVER_SETTINGS)).unwrap();
        let settings: Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(settings["name"], "ranker");
        assert_eq!(settings["implementation"], MLSERVER_RUNTIME);
        assert_eq!(settings["parameters"]["version"], "3");
        assert_eq!(settings["parameters"]["uri"], "./model.onnx");
        // Renamed for a probe, then back: only the name changes.
        TargetLayout::Mlserver.name_version(dir.path(), "ranker.baton-probe", 3).unwrap();
        let probe: Value = serde_json::from_slice(&std::fs::read(dir.path().join(MLSERVER_SETTINGS)).unwrap()).unwrap();
        assert_eq!(probe["name"], "ranker.baton-probe");
        assert_eq!(probe["implementation"], MLSERVER_RUNTIME);
        TargetLayout::Baton.name_version(dir.path(), "ranker", 3).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "baton needs nothing beside its files");
    }

    #[test]
    fn settings_a_version_brings_are_kept_but_for_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let own = json!({ "name": "x", "implementation": "mlserver_sklearn.SKLearnModel", "parameters": { "version": "v7" } });
        std::fs::write(dir.path().join(MLSERVER_SETTINGS), own.to_string()).unwrap();
        TargetLayout::Mlserver.name_version(dir.path(), "ranker", 3).unwrap();
        let settings: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(MLSERVER_SETTINGS)).unwrap()).unwrap();
        assert_eq!(settings["name"], "ranker");
        assert_eq!(settings["implementation"], "mlserver_sklearn.SKLearnModel");
        assert_eq!(settings["parameters"]["version"], "v7");
        let bare = json!({ "implementation": "mlserver_sklearn.SKLearnModel" });
        std::fs::write(dir.path().join(MLSERVER_SETTINGS), bare.to_string()).unwrap();
        TargetLayout::Mlserver.name_version(dir.path(), "ranker", 3).unwrap();
        let settings: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(MLSERVER_SETTINGS)).unwrap()).unwrap();
        assert_eq!(settings["parameters"]["version"], "3", "the version the agent asks for");
    }

    #[test]
    fn model_files_follow_the_kind() {
        let source = tempfile::tempdir().unwrap();
        std::fs::write(source.path().join("model.toml"), "backend = \"onnx\"\n").unwrap();
        let version = tempfile::tempdir().unwrap();
        std::fs::write(version.path().join(MODEL_FILE), b"onnx").unwrap();
        let target = tempfile::tempdir().unwrap();
        let model_dir = target.path().join("m");
        let (v, s) = (version.path(), source.path());
        TargetLayout::Baton.finish_model(v, &model_dir, s, "m").unwrap();
        assert_eq!(std::fs::read_to_string(model_dir.join("model.toml")).unwrap(), "backend = \"onnx\"\n");
        TargetLayout::Triton.finish_model(v, &model_dir, s, "m").unwrap();
        let config = std::fs::read_to_string(model_dir.join(TRITON_CONFIG)).unwrap();
        assert!(config.contains("backend: \"onnxruntime\"") && config.contains("name: \"m\""), "{config}");
        std::fs::write(model_dir.join(TRITON_CONFIG), "mine").unwrap();
        TargetLayout::Triton.finish_model(v, &model_dir, s, "m").unwrap();
        assert_eq!(std::fs::read_to_string(model_dir.join(TRITON_CONFIG)).unwrap(), "mine", "an operator's is kept");
        assert_eq!(TargetLayout::Baton.load_body(2)["parameters"]["version"], 2);
        assert_eq!(TargetLayout::Mlserver.load_body(2), json!({}));
        assert_eq!(TargetLayout::parse("mlserver"), Ok(TargetLayout::Mlserver));
        assert!(TargetLayout::parse("tfserving").is_err());
    }

    #[test]
    fn a_python_backend_version_brings_its_configuration_or_gets_a_python_one() {
        let source = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        let model_dir = target.path().join("m");
        let version = tempfile::tempdir().unwrap();
        std::fs::write(version.path().join(PYTHON_FILE), b"class TritonPythonModel: pass\n").unwrap();
        TargetLayout::Triton.finish_model(version.path(), &model_dir, source.path(), "m").unwrap();
        let config = std::fs::read_to_string(model_dir.join(TRITON_CONFIG)).unwrap();
        assert!(config.contains("backend: \"python\""), "{config}");
        // A version that brings its configuration: used, even over one in place.
        let own = "name: \"m\"\nbackend: \"python\"\nmax_batch_size: 4\n";
        std::fs::write(version.path().join(TRITON_CONFIG), own).unwrap();
        TargetLayout::Triton.finish_model(version.path(), &model_dir, source.path(), "m").unwrap();
        assert_eq!(std::fs::read_to_string(model_dir.join(TRITON_CONFIG)).unwrap(), own);
        // Its probe names no model: Triton names it after the probe's directory.
        let probe = target.path().join("m.baton-probe");
        TargetLayout::Triton.finish_probe(version.path(), &probe, &model_dir, source.path(), "m").unwrap();
        assert_eq!(
            std::fs::read_to_string(probe.join(TRITON_CONFIG)).unwrap(),
            "\nbackend: \"python\"\nmax_batch_size: 4\n"
        );
        // Nothing Triton can serve: refused, saying why.
        let empty = tempfile::tempdir().unwrap();
        let other = target.path().join("n");
        let refused = TargetLayout::Triton.finish_model(empty.path(), &other, source.path(), "n").unwrap_err();
        assert!(refused.to_string().contains("cannot tell Triton"), "{refused}");
    }

    #[test]
    fn only_the_top_level_name_leaves_a_triton_configuration() {
        let config = "name: \"m\" # the model\nbackend: \"python\"\ninput [ { name: \"input\" dims: [ 8 ] } ]\n\
                      parameters { key: \"name\" value: { string_value: \"name: 'x'\" } }\nmodel_name_extra: 1\n";
        let stripped = without_name(config);
        assert_eq!(
            stripped,
            " # the model\nbackend: \"python\"\ninput [ { name: \"input\" dims: [ 8 ] } ]\n\
             parameters { key: \"name\" value: { string_value: \"name: 'x'\" } }\nmodel_name_extra: 1\n"
        );
        assert_eq!(without_name("backend: \"python\"\n"), "backend: \"python\"\n", "nothing to remove");
        assert_eq!(without_name("name:'m' backend:'python'"), " backend:'python'");
    }
}
