//! A small BERT-style text encoder, written as ONNX the way PyTorch
//! exports one, for tests and demos of models whose files hold more than
//! weights: integer inputs used as indices, masks filled with
//! `finfo(float32).min` and `-inf`, `INT64_MAX` slice ends, shape
//! arithmetic.
//!
//! The graph, one transformer layer:
//!
//! - inputs `input_ids`, `attention_mask`, `token_type_ids`: INT64
//!   `[batch, sequence]`;
//! - embeddings: `Gather` of the token ids from a vocabulary table, of the
//!   token types from a two-row table, and of position ids (a `[1, P]`
//!   buffer sliced to the sequence's length, read with `Shape`) from a
//!   position table; summed and normalised (`LayerNormalization`);
//! - the extended attention mask `(1 - mask) * finfo(float32).min`, the
//!   mask first unsqueezed to `[batch, 1, 1, sequence]` and sliced with an
//!   `INT64_MAX` end, as `mask[:, None, None, :]` exports;
//! - a causal mask: a `[1, 1, P, P]` buffer of 0 and `-inf` sliced to the
//!   sequence's length and added to the attention scores;
//! - self-attention (two heads, reshaped with shapes built by `Concat`),
//!   `Softmax`, an output projection and a feed-forward block with an
//!   exact GELU, each followed by a residual `LayerNormalization`;
//! - outputs `last_hidden_state` FP32 `[batch, sequence, hidden]` and
//!   `pooler_output` FP32 `[batch, hidden]` (`tanh` of a dense layer over
//!   the first token).

use crate::mlp::SplitMix;
use crate::proto::elem;
use crate::writer::{Attr, Dim, GraphWriter};

/// The encoder's sizes; weights come from a seed.
#[derive(Clone, Copy, Debug)]
pub struct Encoder {
    /// Rows of the token table: `input_ids` must be below it.
    pub vocab: usize,
    /// Width of every hidden state.
    pub hidden: usize,
    /// Attention heads; must divide `hidden`.
    pub heads: usize,
    /// Width of the feed-forward block.
    pub ffn: usize,
    /// Longest sequence: rows of the position table.
    pub max_positions: usize,
    /// Seed of the weights.
    pub seed: u64,
}

/// Rows of the token type table: `token_type_ids` must be 0 or 1.
pub const TOKEN_TYPES: usize = 2;

/// The graph's inputs, in order.
pub const INPUTS: [&str; 3] = ["input_ids", "attention_mask", "token_type_ids"];

/// The graph's outputs, in order.
pub const OUTPUTS: [&str; 2] = ["last_hidden_state", "pooler_output"];

impl Encoder {
    /// The default sizes (vocabulary 1000, hidden 32, two heads,
    /// feed-forward 64, 16 positions): a file of about 170 KiB.
    pub fn new(seed: u64) -> Encoder {
        Encoder { vocab: 1000, hidden: 32, heads: 2, ffn: 64, max_positions: 16, seed }
    }

    /// The ONNX model (opset 17).
    ///
    /// Panics if `heads` does not divide `hidden` or a size is zero.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_with(&mut |_, _| {})
    }

    /// The ONNX model, each FP32 initializer passed through `alter` (its
    /// name, its values) before it is written: to damage one on purpose.
    pub fn encode_with(&self, alter: &mut dyn FnMut(&str, &mut [f32])) -> Vec<u8> {
        assert!(self.heads > 0 && self.hidden.is_multiple_of(self.heads), "heads must divide hidden");
        assert!(self.vocab > 0 && self.ffn > 0 && self.max_positions > 0, "sizes must be nonzero");
        let rng = SplitMix(self.seed ^ 0x656e_636f_6465_7221);
        let mut w = Writer { g: GraphWriter::new("baton_encoder"), rng, alter };
        let (h, p) = (self.hidden as i64, self.max_positions as i64);
        let head_dim = h / self.heads as i64;

        let batch_seq = [Dim::Named("batch"), Dim::Named("sequence")];
        for input in INPUTS {
            w.g.input(input, elem::INT64, &batch_seq);
        }
        let axis = |w: &mut Writer, name: &str, a: i64| w.ints(name, &[1], &[a]);
        let (axis0, axis1) = (axis(&mut w, "axis0", 0), axis(&mut w, "axis1", 1));
        let (axis2, axis3) = (axis(&mut w, "axis2", 2), axis(&mut w, "axis3", 3));
        let zero_1d = w.ints("zero_1d", &[1], &[0]);

        // Sizes read from the inputs.
        let shape = w.g.node("Shape", &["input_ids"], &["ids_shape"], &[]);
        let (zero, one) = (w.ints("index0", &[], &[0]), w.ints("index1", &[], &[1]));
        let batch = w.g.node("Gather", &[&shape, &zero], &["batch"], &[Attr::Int("axis", 0)]);
        let seq = w.g.node("Gather", &[&shape, &one], &["sequence"], &[Attr::Int("axis", 0)]);
        let batch_1d = w.g.node("Unsqueeze", &[&batch, &axis0], &["batch_1d"], &[]);
        let seq_1d = w.g.node("Unsqueeze", &[&seq, &axis0], &["sequence_1d"], &[]);

        // Embeddings.
        let positions: Vec<i64> = (0..p).collect();
        w.g.initializer_i64("embeddings.position_ids", &[1, p], &positions);
        let pos_ids =
            w.g.node("Slice", &["embeddings.position_ids", &zero_1d, &seq_1d, &axis1], &["position_ids"], &[]);
        let words = w.table("embeddings.word_embeddings.weight", self.vocab, self.hidden);
        let types = w.table("embeddings.token_type_embeddings.weight", TOKEN_TYPES, self.hidden);
        let places = w.table("embeddings.position_embeddings.weight", self.max_positions, self.hidden);
        let word = w.g.node("Gather", &[&words, "input_ids"], &["word"], &[]);
        let kind = w.g.node("Gather", &[&types, "token_type_ids"], &["type"], &[]);
        let place = w.g.node("Gather", &[&places, &pos_ids], &["position"], &[]);
        let sum = w.g.node("Add", &[&word, &kind], &["word_type"], &[]);
        let sum = w.g.node("Add", &[&sum, &place], &["embedded"], &[]);
        let x = w.layer_norm("embeddings.LayerNorm", &sum, self.hidden);

        // (1 - mask[:, None, None, :]) * finfo(float32).min
        let int64_max = w.ints("slice_end", &[1], &[i64::MAX]);
        let m = w.g.node("Unsqueeze", &["attention_mask", &axis1], &["mask_b1s"], &[]);
        let m = w.g.node("Unsqueeze", &[&m, &axis2], &["mask_b11s"], &[]);
        let m = w.g.node("Slice", &[&m, &zero_1d, &int64_max, &axis3], &["mask_sliced"], &[]);
        let m = w.g.node("Cast", &[&m], &["mask_float"], &[Attr::Int("to", i64::from(elem::FLOAT))]);
        let one_f = w.float("one", 1.0);
        let inverted = w.g.node("Sub", &[&one_f, &m], &["mask_inverted"], &[]);
        w.f32s("fmin", &[], vec![f32::MIN]);
        let extended = w.g.node("Mul", &[&inverted, "fmin"], &["extended_attention_mask"], &[]);

        // A causal mask: -inf above the diagonal, sliced to [1, 1, S, S].
        let causal: Vec<f32> = (0..p * p).map(|i| if i % p > i / p { f32::NEG_INFINITY } else { 0.0 }).collect();
        w.f32s("causal_mask", &[1, 1, p, p], causal);
        let ends = w.g.node("Concat", &[&seq_1d, &seq_1d], &["causal_ends"], &[Attr::Int("axis", 0)]);
        let starts = w.ints("causal_starts", &[2], &[0, 0]);
        let axes = w.ints("causal_axes", &[2], &[2, 3]);
        let causal = w.g.node("Slice", &["causal_mask", &starts, &ends, &axes], &["causal"], &[]);

        // Self-attention.
        let prefix = "encoder.layer.0";
        let heads = w.ints("heads", &[1], &[self.heads as i64]);
        let head_width = w.ints("head_dim", &[1], &[head_dim]);
        let split = [&batch_1d[..], &seq_1d, &heads, &head_width];
        let split = w.g.node("Concat", &split, &["split_heads_shape"], &[Attr::Int("axis", 0)]);
        let project = |w: &mut Writer<'_>, name: &str, perm: &[i64]| {
            let y = w.dense(&format!("{prefix}.attention.self.{name}"), &x, self.hidden, self.hidden);
            let y = w.g.node("Reshape", &[&y, &split], &[&format!("{name}_heads")], &[]);
            w.g.node("Transpose", &[&y], &[&format!("{name}_t")], &[Attr::Ints("perm", perm)])
        };
        let q = project(&mut w, "query", &[0, 2, 1, 3]);
        let k = project(&mut w, "key", &[0, 2, 3, 1]);
        let v = project(&mut w, "value", &[0, 2, 1, 3]);
        let scores = w.g.node("MatMul", &[&q, &k], &["scores"], &[]);
        let scale = w.float("scale", (head_dim as f32).sqrt());
        let scores = w.g.node("Div", &[&scores, &scale], &["scores_scaled"], &[]);
        let scores = w.g.node("Add", &[&scores, &extended], &["scores_masked"], &[]);
        let scores = w.g.node("Add", &[&scores, &causal], &["scores_causal"], &[]);
        let probs = w.g.node("Softmax", &[&scores], &["probs"], &[Attr::Int("axis", -1)]);
        let context = w.g.node("MatMul", &[&probs, &v], &["context"], &[]);
        let context = w.g.node("Transpose", &[&context], &["context_t"], &[Attr::Ints("perm", &[0, 2, 1, 3])]);
        let width = w.ints("hidden", &[1], &[h]);
        let merged = w.g.node("Concat", &[&batch_1d, &seq_1d, &width], &["merge_heads_shape"], &[Attr::Int("axis", 0)]);
        let context = w.g.node("Reshape", &[&context, &merged], &["context_merged"], &[]);
        let attended = w.dense(&format!("{prefix}.attention.output.dense"), &context, self.hidden, self.hidden);
        let attended = w.g.node("Add", &[&attended, &x], &["attention_residual"], &[]);
        let x = w.layer_norm(&format!("{prefix}.attention.output.LayerNorm"), &attended, self.hidden);

        // Feed-forward with the exact GELU: x * 0.5 * (1 + erf(x / sqrt 2)).
        let up = w.dense(&format!("{prefix}.intermediate.dense"), &x, self.hidden, self.ffn);
        let sqrt2 = w.float("sqrt2", std::f32::consts::SQRT_2);
        let half = w.float("half", 0.5);
        let e = w.g.node("Div", &[&up, &sqrt2], &["gelu_div"], &[]);
        let e = w.g.node("Erf", &[&e], &["gelu_erf"], &[]);
        let e = w.g.node("Add", &[&e, &one_f], &["gelu_add"], &[]);
        let e = w.g.node("Mul", &[&up, &e], &["gelu_mul"], &[]);
        let gelu = w.g.node("Mul", &[&e, &half], &["gelu"], &[]);
        let down = w.dense(&format!("{prefix}.output.dense"), &gelu, self.ffn, self.hidden);
        let down = w.g.node("Add", &[&down, &x], &["output_residual"], &[]);
        w.layer_norm_into(&format!("{prefix}.output.LayerNorm"), &down, self.hidden, OUTPUTS[0]);

        // Pooler: tanh(dense(hidden[:, 0])).
        let first = w.g.node("Gather", &[OUTPUTS[0], &zero], &["first_token"], &[Attr::Int("axis", 1)]);
        let pooled = w.dense("pooler.dense", &first, self.hidden, self.hidden);
        w.g.node("Tanh", &[&pooled], &[OUTPUTS[1]], &[]);

        w.g.output(OUTPUTS[0], elem::FLOAT, &[batch_seq[0], batch_seq[1], Dim::Fixed(h)]);
        w.g.output(OUTPUTS[1], elem::FLOAT, &[batch_seq[0], Dim::Fixed(h)]);
        w.g.model(17)
    }
}

/// The graph being written, the weights' random source and what alters
/// them.
struct Writer<'a> {
    g: GraphWriter,
    rng: SplitMix,
    alter: &'a mut dyn FnMut(&str, &mut [f32]),
}

impl Writer<'_> {
    /// An FP32 initializer, altered first.
    fn f32s(&mut self, name: &str, dims: &[i64], mut values: Vec<f32>) {
        (self.alter)(name, &mut values);
        self.g.initializer_f32(name, dims, &values);
    }

    /// A `Constant` node of INT64 values.
    fn ints(&mut self, name: &str, dims: &[i64], values: &[i64]) -> String {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.g.constant(name, elem::INT64, dims, &data)
    }

    /// A `Constant` node of one FP32 value.
    fn float(&mut self, name: &str, value: f32) -> String {
        self.g.constant(name, elem::FLOAT, &[], &value.to_le_bytes())
    }

    /// `n` values uniform in ±`scale`, plus `offset`.
    fn values(&mut self, n: usize, scale: f32, offset: f32) -> Vec<f32> {
        (0..n).map(|_| offset + self.rng.unit() * scale).collect()
    }

    /// An embedding table initializer.
    fn table(&mut self, name: &str, rows: usize, width: usize) -> String {
        let values = self.values(rows * width, 0.5, 0.0);
        self.f32s(name, &[rows as i64, width as i64], values);
        name.to_owned()
    }

    /// `x · W + b`, as PyTorch exports `nn.Linear` on a 3-D input.
    fn dense(&mut self, name: &str, x: &str, inputs: usize, outputs: usize) -> String {
        let (weight, bias) = (format!("{name}.weight"), format!("{name}.bias"));
        let values = self.values(inputs * outputs, 1.0 / (inputs as f32).sqrt(), 0.0);
        self.f32s(&weight, &[inputs as i64, outputs as i64], values);
        let values = self.values(outputs, 0.05, 0.0);
        self.f32s(&bias, &[outputs as i64], values);
        let product = self.g.node("MatMul", &[x, &weight], &[&format!("{name}.matmul")], &[]);
        self.g.node("Add", &[&bias, &product], &[&format!("{name}.out")], &[])
    }

    /// `LayerNormalization` over the last axis, with its weights.
    fn layer_norm(&mut self, name: &str, x: &str, width: usize) -> String {
        self.layer_norm_into(name, x, width, &format!("{name}.out"))
    }

    fn layer_norm_into(&mut self, name: &str, x: &str, width: usize, output: &str) -> String {
        let (scale, bias) = (format!("{name}.weight"), format!("{name}.bias"));
        let values = self.values(width, 0.1, 1.0);
        self.f32s(&scale, &[width as i64], values);
        let values = self.values(width, 0.05, 0.0);
        self.f32s(&bias, &[width as i64], values);
        let attrs = [Attr::Int("axis", -1), Attr::Float("epsilon", 1e-12)];
        self.g.node("LayerNormalization", &[x, &scale, &bias], &[output], &attrs)
    }
}
