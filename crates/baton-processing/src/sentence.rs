//! A sentence-transformers directory, as the library saves it, read as a
//! version's processing: `modules.json` lists the modules in order; the
//! Transformer module's directory holds `tokenizer.json` and
//! `sentence_bert_config.json` (`max_seq_length`); a Pooling module's
//! `config.json` says how tokens are pooled; a Normalize module divides by
//! the norm. The graph (`model.onnx`) is the Transformer module exported,
//! answering `last_hidden_state` (or `token_embeddings`). The client sends
//! texts as `text` and receives `sentence_embedding`, as the library names
//! them. Texts are cut to `max_seq_length` and a batch padded to its
//! longest text, as the library does.

use baton_core::files::verified::Verified;
use serde::Deserialize;

use crate::declaration::{Declaration, PreSpec, TOKENIZER_FILE, read_text};
use crate::error::ProcessingError;
use crate::post::{OutputSpec, Step};
use crate::tokenize::Padding;

/// The file that makes a version a sentence-transformers directory.
pub const MODULES_FILE: &str = "modules.json";

/// The output clients receive.
pub const OUTPUT: &str = "sentence_embedding";

#[derive(Deserialize)]
struct Module {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct BertConfig {
    max_seq_length: Option<usize>,
}

#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
}

/// The declaration a sentence-transformers directory makes, or `None`
/// when the version has no `modules.json`.
pub fn read(version: &Verified) -> Result<Option<Declaration>, ProcessingError> {
    let Some(text) = read_text(version, MODULES_FILE)? else { return Ok(None) };
    let invalid = |file: &str, why: String| ProcessingError::invalid(format!("{file}: {why}"));
    let modules: Vec<Module> = serde_json::from_str(&text).map_err(|e| invalid(MODULES_FILE, e.to_string()))?;
    let mut files = vec![MODULES_FILE.to_owned()];
    let mut pre = None;
    let mut steps = Vec::new();
    for module in &modules {
        let at = |name: &str| if module.path.is_empty() { name.to_owned() } else { format!("{}/{name}", module.path) };
        match module.kind.rsplit('.').next().unwrap_or_default() {
            "Transformer" => {
                let config = at("sentence_bert_config.json");
                let max_seq_length = match read_text(version, &config)? {
                    Some(text) => {
                        files.push(config.clone());
                        let parsed: BertConfig =
                            serde_json::from_str(&text).map_err(|e| invalid(&config, e.to_string()))?;
                        parsed.max_seq_length
                    }
                    None => None,
                };
                let tokenizer = at(TOKENIZER_FILE);
                if version.file(&tokenizer).is_none() {
                    return Err(invalid(&tokenizer, "missing: baton runs a fast tokenizer's tokenizer.json".into()));
                }
                files.push(tokenizer.clone());
                let mut spec = Declaration::tokenizer(&tokenizer, max_seq_length);
                // The library cuts to max_seq_length and pads a batch to its longest.
                spec.truncation = max_seq_length.map(|_| true);
                spec.padding = Some(Padding::Longest);
                pre = Some(PreSpec::Tokenizer(spec));
            }
            "Pooling" => {
                let config = at("config.json");
                let text = read_text(version, &config)?.ok_or_else(|| invalid(&config, "missing".into()))?;
                files.push(config.clone());
                let pooling: PoolingConfig =
                    serde_json::from_str(&text).map_err(|e| invalid(&config, e.to_string()))?;
                steps.push(pooling_step(&pooling).map_err(|why| invalid(&config, why))?);
            }
            "Normalize" => steps.push(Step::L2Normalize),
            other => {
                return Err(invalid(
                    MODULES_FILE,
                    format!("module '{other}' is not one baton runs (it runs Transformer, Pooling, Normalize)"),
                ));
            }
        }
    }
    if pre.is_none() {
        return Err(invalid(MODULES_FILE, "no Transformer module".into()));
    }
    let output =
        (!steps.is_empty()).then(|| OutputSpec { from: None, name: OUTPUT.into(), steps, k: None, labels: None });
    Ok(Some(Declaration { pre, output, files }))
}

fn pooling_step(config: &PoolingConfig) -> Result<Step, String> {
    let modes = [
        (config.pooling_mode_mean_tokens, Some(Step::MeanPool), "mean_tokens"),
        (config.pooling_mode_cls_token, Some(Step::ClsPool), "cls_token"),
        (config.pooling_mode_max_tokens, Some(Step::MaxPool), "max_tokens"),
        (config.pooling_mode_mean_sqrt_len_tokens, None, "mean_sqrt_len_tokens"),
        (config.pooling_mode_weightedmean_tokens, None, "weightedmean_tokens"),
        (config.pooling_mode_lasttoken, None, "lasttoken"),
    ];
    let on: Vec<_> = modes.iter().filter(|(on, _, _)| *on).collect();
    match on.as_slice() {
        [(_, Some(step), _)] => Ok(*step),
        [(_, None, name)] => Err(format!("pooling mode {name} is not one baton runs (mean, cls, max)")),
        [] => Err("no pooling mode is on".into()),
        _ => Err("several pooling modes at once (concatenated) are not run by baton".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::declaration::Declaration;

    /// A sentence-transformers directory of these files, verified.
    fn verified(files: &[(&str, &str)]) -> (tempfile::TempDir, Verified) {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        baton_core::files::manifest::write(dir.path()).unwrap();
        let version = baton_core::files::manifest::verify(dir.path()).unwrap();
        (dir, version)
    }

    const MODULES: &str = r#"[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]"#;

    #[test]
    fn a_directory_says_its_truncation_pooling_and_normalization() {
        let (_dir, version) = verified(&[
            ("modules.json", MODULES),
            ("sentence_bert_config.json", r#"{"max_seq_length": 256, "do_lower_case": false}"#),
            ("1_Pooling/config.json", r#"{"word_embedding_dimension": 384, "pooling_mode_cls_token": true}"#),
            ("tokenizer.json", "{}"),
            ("vocab.txt", "a\n"),
        ]);
        let d = Declaration::read(&version).unwrap().expect("a declaration");
        let Some(PreSpec::Tokenizer(t)) = &d.pre else { panic!("a tokenizer: {d:?}") };
        assert_eq!((t.max_length, t.truncation, t.padding), (Some(256), Some(true), Some(Padding::Longest)));
        let output = d.output.expect("an output");
        assert_eq!((output.name.as_str(), output.steps), (OUTPUT, vec![Step::ClsPool, Step::L2Normalize]));
        let files =
            ["1_Pooling/config.json", "modules.json", "sentence_bert_config.json", "tokenizer.json", "vocab.txt"];
        assert_eq!(d.files, files);
    }

    #[test]
    fn modules_and_pooling_modes_baton_does_not_run_are_refused_naming_them() {
        let dense = MODULES.replace("models.Normalize", "models.Dense");
        let sqrt = r#"{"pooling_mode_mean_sqrt_len_tokens": true}"#;
        for (modules, pooling, needle) in [
            (dense.as_str(), r#"{"pooling_mode_mean_tokens": true}"#, "Dense"),
            (MODULES, sqrt, "mean_sqrt_len_tokens"),
            (MODULES, r#"{"pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": true}"#, "several"),
        ] {
            let (_dir, version) =
                verified(&[("modules.json", modules), ("1_Pooling/config.json", pooling), ("tokenizer.json", "{}")]);
            let refused = Declaration::read(&version).expect_err("refused");
            assert_eq!(refused.kind, crate::error::PROCESSING_INVALID);
            assert!(refused.message.contains(needle), "{refused}");
        }
    }

    #[test]
    fn a_version_without_modules_or_processing_declares_nothing() {
        let (_dir, version) = verified(&[("model.onnx", "graph")]);
        assert_eq!(Declaration::read(&version).unwrap(), None);
    }
}
