//! The BERT-style encoder ([`baton_onnx::encoder`]) in tests: its
//! `model.toml`, batches of token ids, and what ONNX Runtime answers for
//! them when run directly, without baton. Also a model whose integer
//! input's valid values cannot be told from the model.

use baton_core::tensors::tensor::{DataType, Tensor, TensorData};
use baton_onnx::proto::elem;
use baton_onnx::writer::{Attr, Dim, GraphWriter};
use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;

pub use baton_onnx::encoder::{Encoder, INPUTS, OUTPUTS, TOKEN_TYPES};

/// `model.toml` for the encoder: its inputs and outputs declared, an empty
/// `[validation]` table (every check at its default), then `extra`.
pub fn encoder_toml(encoder: &Encoder, extra: &str) -> String {
    let h = encoder.hidden;
    let inputs: Vec<String> =
        INPUTS.iter().map(|n| format!("{{ name = \"{n}\", datatype = \"INT64\", shape = [-1, -1] }}")).collect();
    format!(
        "backend = \"onnx\"\n\
         inputs = [{}]\n\
         outputs = [{{ name = \"{}\", datatype = \"FP32\", shape = [-1, -1, {h}] }}, \
                    {{ name = \"{}\", datatype = \"FP32\", shape = [-1, {h}] }}]\n\
         [validation]\n\
         {extra}\n",
        inputs.join(", "),
        OUTPUTS[0],
        OUTPUTS[1]
    )
}

/// One batch of the encoder's inputs, `[batch, sequence]` each.
#[derive(Clone, Debug)]
pub struct Batch {
    /// Rows.
    pub batch: usize,
    /// Tokens per row.
    pub sequence: usize,
    /// Token ids, below the vocabulary's size.
    pub ids: Vec<i64>,
    /// 1 for a token, 0 for padding: row `r` has `r` padding tokens at its
    /// end (at most all but one).
    pub mask: Vec<i64>,
    /// 0 for the first half of each row, 1 for the rest.
    pub types: Vec<i64>,
}

impl Batch {
    /// A deterministic batch for `encoder` from `seed`, ids spread over the
    /// whole vocabulary.
    pub fn new(encoder: &Encoder, batch: usize, sequence: usize, seed: u64) -> Batch {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut ids = Vec::with_capacity(batch * sequence);
        for _ in 0..batch * sequence {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ids.push((state % encoder.vocab as u64) as i64);
        }
        let cell = |f: &dyn Fn(usize, usize) -> i64| -> Vec<i64> {
            (0..batch).flat_map(|r| (0..sequence).map(move |c| (r, c))).map(|(r, c)| f(r, c)).collect()
        };
        let mask = cell(&|r, c| i64::from(c + r.min(sequence - 1) < sequence));
        let types = cell(&|_, c| i64::from(c >= sequence / 2));
        Batch { batch, sequence, ids, mask, types }
    }

    /// The inputs as baton tensors, named as the graph's inputs.
    pub fn tensors(&self) -> Vec<Tensor> {
        let shape = vec![self.batch as i64, self.sequence as i64];
        INPUTS
            .iter()
            .zip([&self.ids, &self.mask, &self.types])
            .map(|(name, values)| Tensor {
                name: (*name).to_owned(),
                datatype: DataType::Int64,
                shape: shape.clone(),
                data: TensorData::Raw(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
            })
            .collect()
    }

    /// A KServe V2 JSON inference request carrying the batch.
    pub fn json(&self) -> serde_json::Value {
        let inputs: Vec<serde_json::Value> = INPUTS
            .iter()
            .zip([&self.ids, &self.mask, &self.types])
            .map(|(name, values)| {
                serde_json::json!({
                    "name": name, "datatype": "INT64", "shape": [self.batch, self.sequence], "data": values
                })
            })
            .collect();
        serde_json::json!({ "inputs": inputs })
    }
}

/// Runs `model` on `batch` in an ONNX Runtime session created here, with
/// the options baton's sessions get by default (all graph optimizations,
/// one thread per operator), and returns each output's shape and values.
/// Panics with ONNX Runtime's error if anything fails.
pub fn reference(model: &[u8], batch: &Batch) -> Vec<(String, Vec<i64>, Vec<f32>)> {
    let env = baton_onnx::environment().unwrap_or_else(|e| panic!("ONNX Runtime is needed for this test: {e}"));
    let mut session = Session::builder(env)
        .and_then(|b| Ok(b.with_optimization_level(GraphOptimizationLevel::All)?))
        .and_then(|b| Ok(b.with_intra_threads(1)?))
        .and_then(|mut b| b.commit_from_memory(model))
        .unwrap_or_else(|e| panic!("creating a session: {e}"));
    let shape = vec![batch.batch as i64, batch.sequence as i64];
    let value = |values: &Vec<i64>| {
        ort::value::Tensor::from_array((shape.clone(), values.clone())).unwrap_or_else(|e| panic!("an input: {e}"))
    };
    let inputs = ort::inputs![
        INPUTS[0] => value(&batch.ids),
        INPUTS[1] => value(&batch.mask),
        INPUTS[2] => value(&batch.types),
    ];
    let outputs = session.run(inputs).unwrap_or_else(|e| panic!("running the session: {e}"));
    OUTPUTS
        .iter()
        .map(|name| {
            let (shape, values) =
                outputs[*name].try_extract_tensor::<f32>().unwrap_or_else(|e| panic!("output {name}: {e}"));
            ((*name).to_owned(), shape.to_vec(), values.to_vec())
        })
        .collect()
}

/// `y = Gather(x, i, axis = 1)`, `x` FP32 `[batch, 4]`, `i` INT64 `[2]`:
/// `i` indexes a table that is itself an input, so the values it may take
/// cannot be told from the model, and warmup generates no inputs for it.
pub fn lookup_model() -> Vec<u8> {
    let mut g = GraphWriter::new("lookup");
    g.input("x", elem::FLOAT, &[Dim::Named("batch"), Dim::Fixed(4)]);
    g.input("i", elem::INT64, &[Dim::Fixed(2)]);
    g.node("Gather", &["x", "i"], &["y"], &[Attr::Int("axis", 1)]);
    g.output("y", elem::FLOAT, &[Dim::Named("batch"), Dim::Fixed(2)]);
    g.model(17)
}
