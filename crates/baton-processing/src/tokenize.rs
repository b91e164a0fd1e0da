//! Text to token ids: a Hugging Face `tokenizer.json` run with the
//! `tokenizers` crate, one text at a time on the calling thread, then
//! padded into the graph's INT64 inputs.

use baton_core::tensors::signature::{Signature, TensorSpec};
use baton_core::tensors::tensor::{DataType, Tensor, TensorData};
use tokenizers::utils::padding::{PaddingDirection, PaddingParams, PaddingStrategy};
use tokenizers::utils::truncation::TruncationParams;

use crate::error::{ProcessingError, TEXT_BATCH_TOO_LARGE, TEXT_NOT_UTF8, TEXT_TOO_LONG, TOKENIZER_FAILED};

/// Bytes of text tokenized for each token a version takes: far more than
/// any tokenizer's tokens average, so that the tokens kept are those of the
/// whole text.
pub const BYTES_PER_TOKEN: usize = 64;

/// The fewest bytes of a text tokenized, however few tokens a version takes.
pub const MIN_TEXT_BYTES: usize = 4096;

/// The most tokens one request's texts may take once padded (rows times
/// the padded length): one long text beside many empty ones pads them all.
pub const MAX_BATCH_TOKENS: usize = 32_768;

/// The token inputs a text graph may take, in the order they are produced.
pub const TOKEN_INPUTS: [&str; 3] = ["input_ids", "attention_mask", "token_type_ids"];

/// How a tokenizer is to be run, as a version declares it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenizerSpec {
    /// The `tokenizer.json` file, relative to the version.
    pub file: String,
    /// The BYTES input clients send their texts in.
    pub input: String,
    /// The most tokens a text may take; else the tokenizer.json's own.
    pub max_length: Option<usize>,
    /// Whether longer texts are cut to `max_length` (else refused); else
    /// whether the tokenizer.json truncates.
    pub truncation: Option<bool>,
    /// How a batch is padded; else as the tokenizer.json pads.
    pub padding: Option<Padding>,
}

/// How the rows of a batch are padded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding {
    /// To the longest text of the batch.
    Longest,
    /// To the maximum length, always.
    Fixed,
}

/// A loaded tokenizer, ready to turn texts into the graph's inputs.
pub struct TextTokenizer {
    tokenizer: tokenizers::Tokenizer,
    input: String,
    max_length: Option<usize>,
    truncate: bool,
    pad_to: Option<usize>,
    multiple_of: Option<usize>,
    pad_id: i64,
    pad_type_id: i64,
    pad_left: bool,
    /// Which of [`TOKEN_INPUTS`] the graph takes, in the graph's order.
    wanted: Vec<&'static str>,
}

/// The graph's inputs for one batch of texts, and the attention mask
/// (`[rows, sequence]`) that pooling reads afterwards.
pub struct Tokens {
    /// The graph's inputs.
    pub inputs: Vec<Tensor>,
    /// 1 for a token, 0 for padding, row-major.
    pub mask: Vec<i64>,
    /// Rows and tokens per row.
    pub shape: [usize; 2],
}

impl TextTokenizer {
    /// Loads `json` (a tokenizer.json's bytes) as `spec` says, for a
    /// graph of signature `graph`: its inputs must be token inputs, and
    /// `input_ids` among them.
    pub fn load(json: &[u8], spec: &TokenizerSpec, graph: &Signature) -> Result<TextTokenizer, ProcessingError> {
        let invalid = |why: String| ProcessingError::invalid(format!("{}: {why}", spec.file));
        let mut tokenizer = tokenizers::Tokenizer::from_bytes(json).map_err(|e| invalid(e.to_string()))?;
        let declared_truncation = tokenizer.get_truncation().cloned();
        let declared_padding = tokenizer.get_padding().cloned();
        let fixed_by_graph = graph.input("input_ids").and_then(|s| s.shape.get(1)).filter(|d| **d > 0);
        let fixed_by_graph = fixed_by_graph.map(|d| *d as usize);
        // Every text must have a bound on its tokens: without one, a single
        // long text would be tokenized, padded and run whole.
        let max_length = spec.max_length.or(declared_truncation.as_ref().map(|t| t.max_length)).or(fixed_by_graph);
        let Some(max_length) = max_length else {
            return Err(invalid(
                "no bound on a text's tokens: set max_length in processing.toml's [tokenizer] (or truncation in \
                 tokenizer.json, or max_seq_length in sentence_bert_config.json)"
                    .into(),
            ));
        };
        if let Some(fixed) = fixed_by_graph.filter(|fixed| max_length > *fixed) {
            return Err(invalid(format!(
                "max_length {max_length} is longer than the {fixed} tokens the graph's input_ids take"
            )));
        }
        let max_length = Some(max_length);
        let truncate = spec.truncation.unwrap_or(declared_truncation.is_some());
        // Truncation is the tokenizer's own (it knows pairs and strides);
        // padding is done here, across the batch.
        let truncation = match (truncate, max_length) {
            (true, Some(max_length)) => {
                Some(TruncationParams { max_length, ..declared_truncation.unwrap_or_default() })
            }
            _ => None,
        };
        tokenizer.with_truncation(truncation).map_err(|e| invalid(e.to_string()))?;
        tokenizer.with_padding(None);
        let padding = declared_padding
            .unwrap_or_else(|| PaddingParams { strategy: PaddingStrategy::BatchLongest, ..PaddingParams::default() });
        let wanted = token_inputs(graph).map_err(invalid)?;
        let pad_to = match (spec.padding, &padding.strategy) {
            (Some(Padding::Fixed), _) => {
                Some(max_length.ok_or_else(|| invalid("fixed padding asks for a max_length".into()))?)
            }
            (Some(Padding::Longest), _) | (None, PaddingStrategy::BatchLongest) => None,
            (None, PaddingStrategy::Fixed(n)) => Some(*n),
        };
        // A graph of a fixed sequence length takes rows of that length.
        let pad_to = pad_to.or(fixed_by_graph);
        Ok(TextTokenizer {
            tokenizer,
            input: spec.input.clone(),
            max_length,
            truncate,
            pad_to,
            multiple_of: padding.pad_to_multiple_of,
            pad_id: i64::from(padding.pad_id),
            pad_type_id: i64::from(padding.pad_type_id),
            pad_left: matches!(padding.direction, PaddingDirection::Left),
            wanted,
        })
    }

    /// The input clients send: a batch of texts, BYTES `[batch]`.
    pub fn client_input(&self) -> TensorSpec {
        TensorSpec { name: self.input.clone(), datatype: DataType::Bytes, shape: vec![-1] }
    }

    /// Tokenizes a batch of texts (the client input, already checked
    /// against [`TextTokenizer::client_input`]).
    pub fn run(&self, inputs: &[Tensor]) -> Result<Tokens, ProcessingError> {
        let texts = inputs.iter().find(|t| t.name == self.input).map(|t| &t.data);
        let Some(TensorData::Bytes(texts)) = texts else {
            return Err(ProcessingError::new("invalid_input", format!("input '{}' must be BYTES text", self.input)));
        };
        let mut rows = Vec::with_capacity(texts.len());
        for (i, bytes) in texts.iter().enumerate() {
            let text = std::str::from_utf8(bytes).map_err(|e| {
                ProcessingError::new(TEXT_NOT_UTF8, format!("input '{}' text {i} is not valid UTF-8: {e}", self.input))
            })?;
            let text = self.bounded(i, text)?;
            let encoding = self
                .tokenizer
                .encode(text, true)
                .map_err(|e| ProcessingError::new(TOKENIZER_FAILED, format!("tokenizing text {i}: {e}")))?;
            if let (false, Some(most)) = (self.truncate, self.max_length)
                && encoding.len() > most
            {
                return Err(ProcessingError::new(
                    TEXT_TOO_LONG,
                    format!(
                        "input '{}' text {i} is {} tokens long; this version takes at most {most} and does not truncate",
                        self.input,
                        encoding.len()
                    ),
                ));
            }
            rows.push(encoding);
        }
        let longest = rows.iter().map(tokenizers::Encoding::len).max().unwrap_or(0);
        let mut sequence = self.pad_to.map_or(longest, |n| n.max(longest));
        if let Some(multiple) = self.multiple_of.filter(|m| *m > 0) {
            sequence = sequence.div_ceil(multiple) * multiple;
        }
        let count = rows.len() * sequence;
        if count > MAX_BATCH_TOKENS {
            return Err(ProcessingError::new(
                TEXT_BATCH_TOO_LARGE,
                format!(
                    "the batch pads to {} texts of {sequence} tokens, {count} in all, more than the \
                     {MAX_BATCH_TOKENS} one request may take: send fewer or shorter texts in each request",
                    rows.len()
                ),
            ));
        }
        let (mut ids, mut mask, mut types) =
            (Vec::with_capacity(count), Vec::with_capacity(count), Vec::with_capacity(count));
        for row in &rows {
            let pad = sequence - row.len();
            if self.pad_left {
                pad_row(&mut ids, &mut mask, &mut types, pad, self);
            }
            ids.extend(row.get_ids().iter().map(|&id| i64::from(id)));
            mask.extend(row.get_attention_mask().iter().map(|&m| i64::from(m)));
            types.extend(row.get_type_ids().iter().map(|&t| i64::from(t)));
            if !self.pad_left {
                pad_row(&mut ids, &mut mask, &mut types, pad, self);
            }
        }
        let shape = vec![rows.len() as i64, sequence as i64];
        let tensor = |name: &str, values: &[i64]| Tensor {
            name: name.to_owned(),
            datatype: DataType::Int64,
            shape: shape.clone(),
            data: TensorData::Raw(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        };
        let inputs = self
            .wanted
            .iter()
            .map(|name| match *name {
                "input_ids" => tensor(name, &ids),
                "attention_mask" => tensor(name, &mask),
                _ => tensor(name, &types),
            })
            .collect();
        Ok(Tokens { inputs, mask, shape: [rows.len(), sequence] })
    }
}

impl TextTokenizer {
    /// The most bytes of a text tokenized: [`BYTES_PER_TOKEN`] for each
    /// token the version takes, at least [`MIN_TEXT_BYTES`].
    fn max_text_bytes(&self) -> usize {
        self.max_length.unwrap_or(0).saturating_mul(BYTES_PER_TOKEN).max(MIN_TEXT_BYTES)
    }

    /// Text `i`, bounded before it is tokenized (the tokenizer would build
    /// the whole encoding first, at some 150 bytes of memory for each byte
    /// of text, and only then cut it): cut at a space or a character
    /// boundary when the version truncates, refused when it does not.
    fn bounded<'t>(&self, i: usize, text: &'t str) -> Result<&'t str, ProcessingError> {
        let most = self.max_text_bytes();
        if text.len() <= most {
            return Ok(text);
        }
        if !self.truncate {
            return Err(ProcessingError::new(
                TEXT_TOO_LONG,
                format!(
                    "input '{}' text {i} is {} bytes long; this version takes at most {most} bytes ({} tokens) \
                     and does not truncate",
                    self.input,
                    text.len(),
                    self.max_length.unwrap_or(0)
                ),
            ));
        }
        let mut end = most;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let cut = &text[..end];
        // At the last space, so that no word is cut in two.
        Ok(cut.rfind(char::is_whitespace).map_or(cut, |space| &cut[..space]))
    }
}

fn pad_row(ids: &mut Vec<i64>, mask: &mut Vec<i64>, types: &mut Vec<i64>, pad: usize, t: &TextTokenizer) {
    ids.extend(std::iter::repeat_n(t.pad_id, pad));
    mask.extend(std::iter::repeat_n(0, pad));
    types.extend(std::iter::repeat_n(t.pad_type_id, pad));
}

/// Which token inputs the graph takes, in its order: only those of
/// [`TOKEN_INPUTS`], each INT64 `[batch, sequence]`, `input_ids` among them.
fn token_inputs(graph: &Signature) -> Result<Vec<&'static str>, String> {
    let mut wanted = Vec::new();
    for spec in &graph.inputs {
        let Some(name) = TOKEN_INPUTS.iter().find(|n| **n == spec.name) else {
            return Err(format!(
                "the graph takes input '{}', which a tokenizer does not make (it makes {})",
                spec.name,
                TOKEN_INPUTS.join(", ")
            ));
        };
        if spec.datatype != DataType::Int64 || spec.shape.len() != 2 {
            return Err(format!(
                "the graph's input '{}' is {} {:?}; a tokenizer makes INT64 [batch, sequence]",
                spec.name, spec.datatype, spec.shape
            ));
        }
        wanted.push(*name);
    }
    if !wanted.contains(&"input_ids") {
        return Err("the graph takes no input_ids".into());
    }
    Ok(wanted)
}

#[cfg(test)]
mod tests {
    use baton_testkit::text::word_level;

    use super::*;

    fn graph(inputs: &[&str]) -> Signature {
        let spec = |name: &&str| TensorSpec { name: (*name).into(), datatype: DataType::Int64, shape: vec![-1, -1] };
        Signature { inputs: inputs.iter().map(spec).collect(), outputs: Vec::new() }
    }

    fn texts(texts: &[&[u8]]) -> Vec<Tensor> {
        vec![Tensor {
            name: "text".into(),
            datatype: DataType::Bytes,
            shape: vec![texts.len() as i64],
            data: TensorData::Bytes(texts.iter().map(|t| t.to_vec()).collect()),
        }]
    }

    fn ints(t: &Tensor) -> Vec<i64> {
        let TensorData::Raw(bytes) = &t.data else { panic!("raw") };
        bytes.chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()
    }

    fn spec() -> TokenizerSpec {
        TokenizerSpec { file: "tokenizer.json".into(), input: "text".into(), ..TokenizerSpec::default() }
    }

    #[test]
    fn a_batch_is_padded_to_its_longest_text_with_only_the_inputs_the_graph_takes() {
        let json = word_level(&["cat", "sat", "mat"], Some(8));
        let t = TextTokenizer::load(&json, &spec(), &graph(&["attention_mask", "input_ids"])).unwrap();
        let tokens = t.run(&texts(&[b"cat sat", b"mat dog cat"])).unwrap();
        assert_eq!(tokens.inputs.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["attention_mask", "input_ids"]);
        assert_eq!(tokens.inputs[1].shape, vec![2, 3]);
        assert_eq!(ints(&tokens.inputs[1]), vec![2, 3, 0, 4, 1, 2]);
        assert_eq!(ints(&tokens.inputs[0]), vec![1, 1, 0, 1, 1, 1]);
    }

    #[test]
    fn truncation_cuts_and_no_truncation_refuses_a_longer_text() {
        let json = word_level(&["a"], Some(2));
        let cut = TextTokenizer::load(&json, &spec(), &graph(&["input_ids"])).unwrap();
        assert_eq!(cut.run(&texts(&[b"a a a a"])).unwrap().shape, [1, 2]);
        let strict = TokenizerSpec { truncation: Some(false), ..spec() };
        let strict = TextTokenizer::load(&json, &strict, &graph(&["input_ids"])).unwrap();
        assert_eq!(strict.run(&texts(&[b"a a"])).unwrap().shape, [1, 2]);
        let refused = strict.run(&texts(&[b"a a a"])).err().unwrap();
        assert_eq!(refused.kind, TEXT_TOO_LONG, "{refused}");
        assert!(refused.message.contains("3 tokens") && refused.message.contains("at most 2"), "{refused}");
    }

    #[test]
    fn text_that_is_not_utf8_is_refused_naming_it() {
        let t = TextTokenizer::load(&word_level(&["a"], Some(8)), &spec(), &graph(&["input_ids"])).unwrap();
        let refused = t.run(&texts(&[b"a", b"\xff\xfe"])).err().unwrap();
        assert_eq!(refused.kind, TEXT_NOT_UTF8);
        assert!(refused.message.contains("text 1"), "{refused}");
    }

    #[test]
    fn fixed_padding_pads_every_batch_to_the_maximum_length() {
        let fixed = TokenizerSpec { padding: Some(Padding::Fixed), max_length: Some(5), ..spec() };
        let t = TextTokenizer::load(&word_level(&["a"], None), &fixed, &graph(&["input_ids"])).unwrap();
        assert_eq!(t.run(&texts(&[b"a"])).unwrap().shape, [1, 5]);
    }

    #[test]
    fn a_graph_input_no_tokenizer_makes_is_refused_at_load() {
        let refused = TextTokenizer::load(&word_level(&["a"], None), &spec(), &graph(&["input_ids", "pixels"]));
        assert_eq!(refused.err().map(|e| e.kind), Some(crate::error::PROCESSING_INVALID));
    }

    #[test]
    fn a_version_with_no_bound_on_a_texts_tokens_is_refused_at_load() {
        let unbounded = TextTokenizer::load(&word_level(&["a"], None), &spec(), &graph(&["input_ids"]));
        let refused = unbounded.err().expect("refused");
        assert_eq!(refused.kind, crate::error::PROCESSING_INVALID);
        assert!(refused.message.contains("max_length"), "{refused}");
        // A graph of a fixed sequence length bounds it; a longer max_length
        // than it takes is refused.
        let mut fixed = graph(&["input_ids"]);
        fixed.inputs[0].shape = vec![-1, 4];
        let t = TextTokenizer::load(&word_level(&["a"], None), &spec(), &fixed).unwrap();
        assert_eq!(t.run(&texts(&[b"a"])).unwrap().shape, [1, 4]);
        let longer = TokenizerSpec { max_length: Some(8), ..spec() };
        assert!(TextTokenizer::load(&word_level(&["a"], None), &longer, &fixed).is_err());
    }

    #[test]
    fn a_text_far_longer_than_the_version_takes_is_cut_before_it_is_tokenized_or_refused() {
        let json = word_level(&["a", "b"], Some(4));
        let t = TextTokenizer::load(&json, &spec(), &graph(&["input_ids"])).unwrap();
        let huge = "b a ".repeat(2_500_000);
        let tokens = t.run(&texts(&[huge.as_bytes()])).unwrap();
        assert_eq!(tokens.shape, [1, 4]);
        let short = t.run(&texts(&[b"b a b a"])).unwrap();
        assert_eq!(ints(&tokens.inputs[0]), ints(&short.inputs[0]), "the first tokens are the whole text's");
        let strict = TokenizerSpec { truncation: Some(false), ..spec() };
        let strict = TextTokenizer::load(&json, &strict, &graph(&["input_ids"])).unwrap();
        let refused = strict.run(&texts(&[huge.as_bytes()])).err().unwrap();
        assert_eq!(refused.kind, TEXT_TOO_LONG, "{refused}");
        assert!(refused.message.contains("bytes"), "{refused}");
    }

    #[test]
    fn one_long_text_beside_many_empty_ones_is_refused_before_it_is_padded() {
        let json = word_level(&["a"], Some(256));
        let t = TextTokenizer::load(&json, &spec(), &graph(&["input_ids"])).unwrap();
        let long = "a ".repeat(256);
        let mut batch: Vec<&[u8]> = vec![long.as_bytes()];
        batch.extend(std::iter::repeat_n(&b""[..], 1023));
        let refused = t.run(&texts(&batch)).err().unwrap();
        assert_eq!(refused.kind, TEXT_BATCH_TOO_LARGE, "{refused}");
        assert!(refused.message.contains("1024 texts of 256 tokens"), "{refused}");
        assert!(t.run(&texts(&batch[..64])).is_ok(), "64 texts of 256 tokens fit");
    }
}
