//! What a version declares about its processing, read from its own files:
//! `processing.toml` when there is one, else a sentence-transformers
//! directory's `modules.json` and the configs it leads to
//! ([`crate::sentence`]), and `features.toml` for raw features
//! ([`crate::features`]); else nothing (the graph is served as it is).
//!
//! ```toml
//! [tokenizer]                  # texts in: a BYTES input of one text a row
//! file = "tokenizer.json"      # the default
//! input = "text"               # the default
//! max_length = 128             # default: the tokenizer.json's truncation
//! truncation = true            # false: longer texts are refused (text_too_long)
//! padding = "longest"          # or "fixed" (to max_length); default: the tokenizer.json's
//!
//! [output]                     # one output out, from one of the graph's
//! from = "last_hidden_state"   # default: the only output, or the first of rank 3 for pooling
//! name = "embedding"
//! steps = ["mean_pool", "l2_normalize"]   # also cls_pool, max_pool, sigmoid, softmax, top_k
//! # k = 5                      # top_k's count
//! # labels = "labels.txt"      # top_k's labels, one a line
//! ```

use baton_core::files::verified::Verified;
use serde::Deserialize;

use crate::error::ProcessingError;
use crate::features::{self, FeatureSpec};
use crate::post::{OutputSpec, Step};
use crate::tokenize::{Padding, TokenizerSpec};

/// The file a version declares its processing in.
pub const PROCESSING_FILE: &str = "processing.toml";

/// The default tokenizer file and client input.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
const TEXT_INPUT: &str = "text";

/// What runs before the graph: a version takes texts or raw features, and
/// one that declares both is refused.
#[derive(Clone, Debug, PartialEq)]
pub enum PreSpec {
    /// Texts to token ids.
    Tokenizer(TokenizerSpec),
    /// Raw named features to the graph's tensors (`features.toml`).
    Features(FeatureSpec),
}

/// A version's processing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Declaration {
    /// Before the graph, if anything.
    pub pre: Option<PreSpec>,
    /// After the graph, if anything.
    pub output: Option<OutputSpec>,
    /// Every file of the version the processing reads (also the files a
    /// tokenizer is made from beside tokenizer.json), relative to it: what
    /// a processing update may change.
    pub files: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tokenizer: Option<TokenizerTable>,
    output: Option<OutputTable>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizerTable {
    file: Option<String>,
    input: Option<String>,
    max_length: Option<usize>,
    truncation: Option<bool>,
    padding: Option<PaddingName>,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum PaddingName {
    Longest,
    Fixed,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OutputTable {
    from: Option<String>,
    name: String,
    #[serde(default)]
    steps: Vec<Step>,
    k: Option<usize>,
    labels: Option<String>,
}

/// Files a tokenizer is made from besides tokenizer.json: they belong to
/// the processing when the version has them.
const TOKENIZER_SIDE_FILES: [&str; 6] = [
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "merges.txt",
    "added_tokens.json",
    "sentencepiece.bpe.model",
];

impl Declaration {
    /// Reads the version's declaration, or `None` when it declares no
    /// processing.
    pub fn read(version: &Verified) -> Result<Option<Declaration>, ProcessingError> {
        let mut declaration = if let Some(text) = read_text(version, PROCESSING_FILE)? {
            Some(Declaration::parse(&text)?)
        } else {
            crate::sentence::read(version)?
        };
        if let Some(text) = read_text(version, features::FILE)? {
            let spec = FeatureSpec::parse(&text)?;
            let declared = declaration.get_or_insert_with(Declaration::default);
            if declared.pre.is_some() {
                return Err(ProcessingError::invalid(format!(
                    "the version declares both a tokenizer and {}: it takes texts or features, not both",
                    features::FILE
                )));
            }
            declared.pre = Some(PreSpec::Features(spec));
            declared.files.push(features::FILE.to_owned());
        }
        Ok(declaration.map(|mut d| {
            d.files.extend(TOKENIZER_SIDE_FILES.iter().filter(|f| version.file(f).is_some()).map(|f| (*f).to_owned()));
            d.files.sort();
            d.files.dedup();
            d
        }))
    }

    /// Parses a `processing.toml`.
    pub fn parse(text: &str) -> Result<Declaration, ProcessingError> {
        let file: File =
            toml::from_str(text).map_err(|e| ProcessingError::invalid(format!("{PROCESSING_FILE}: {e}")))?;
        let mut files = vec![PROCESSING_FILE.to_owned()];
        let pre = file.tokenizer.map(|t| {
            let spec = TokenizerSpec {
                file: t.file.unwrap_or_else(|| TOKENIZER_FILE.into()),
                input: t.input.unwrap_or_else(|| TEXT_INPUT.into()),
                max_length: t.max_length,
                truncation: t.truncation,
                padding: t.padding.map(|p| match p {
                    PaddingName::Longest => Padding::Longest,
                    PaddingName::Fixed => Padding::Fixed,
                }),
            };
            files.push(spec.file.clone());
            PreSpec::Tokenizer(spec)
        });
        let output = file.output.map(|o| {
            files.extend(o.labels.clone());
            OutputSpec { from: o.from, name: o.name, steps: o.steps, k: o.k, labels: o.labels }
        });
        if pre.is_none() && output.is_none() {
            return Err(ProcessingError::invalid(format!(
                "{PROCESSING_FILE} declares neither [tokenizer] nor [output]"
            )));
        }
        Ok(Declaration { pre, output, files })
    }

    /// A tokenizer for the text input `TEXT_INPUT` from `file`.
    pub(crate) fn tokenizer(file: &str, max_length: Option<usize>) -> TokenizerSpec {
        TokenizerSpec { file: file.into(), input: TEXT_INPUT.into(), max_length, ..TokenizerSpec::default() }
    }
}

/// The bytes of one of the version's verified files, `None` when the
/// version has no such file.
pub fn read_file(version: &Verified, path: &str) -> Result<Option<Vec<u8>>, ProcessingError> {
    let Some(file) = version.file(path) else { return Ok(None) };
    let bytes = file.read_all().map_err(|e| ProcessingError::invalid(format!("reading {path}: {e}")))?;
    file.unchanged().map_err(|e| ProcessingError::new(e.kind(), format!("{path}: {e}")))?;
    Ok(Some(bytes))
}

/// [`read_file`] as UTF-8 text.
pub fn read_text(version: &Verified, path: &str) -> Result<Option<String>, ProcessingError> {
    read_file(version, path)?
        .map(|bytes| String::from_utf8(bytes).map_err(|_| ProcessingError::invalid(format!("{path} is not UTF-8"))))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_processing_file_names_what_it_reads() {
        let text = "[tokenizer]\nmax_length = 8\ntruncation = false\npadding = \"fixed\"\n\
                    [output]\nname = \"label\"\nsteps = [\"softmax\", \"top_k\"]\nk = 2\nlabels = \"labels.txt\"\n";
        let d = Declaration::parse(text).unwrap();
        let Some(PreSpec::Tokenizer(t)) = &d.pre else { panic!("a tokenizer: {d:?}") };
        assert_eq!(
            (t.file.as_str(), t.input.as_str(), t.max_length, t.truncation),
            ("tokenizer.json", "text", Some(8), Some(false))
        );
        assert_eq!(t.padding, Some(Padding::Fixed));
        assert_eq!(d.output.as_ref().map(|o| o.steps.clone()), Some(vec![Step::Softmax, Step::TopK]));
        assert_eq!(d.files, vec!["processing.toml", "tokenizer.json", "labels.txt"]);
    }

    #[test]
    fn an_unknown_step_or_key_is_refused() {
        for text in ["[output]\nname = \"y\"\nsteps = [\"tanh\"]\n", "[tokenizer]\nmax_len = 3\n", ""] {
            assert_eq!(
                Declaration::parse(text).err().map(|e| e.kind),
                Some(crate::error::PROCESSING_INVALID),
                "{text}"
            );
        }
    }
}
