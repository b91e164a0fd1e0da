//! Writes dense MLPs as ONNX models with a hand-written protobuf encoder,
//! plus a reference forward pass to check a backend's output against.
//!
//! baton uses it for its demo repository and its tests: every model they
//! serve is generated from a seed, never downloaded.

use crate::proto::elem;
use crate::writer::{Dim, GraphWriter};

/// A dense MLP: layer sizes e.g. `[256, 1024, 512, 1]`; ReLU between layers, none after the last.
#[derive(Clone, Debug)]
pub struct Mlp {
    /// Layer widths, input first; at least two entries.
    pub sizes: Vec<usize>,
    /// One layer per consecutive pair of sizes.
    pub layers: Vec<Layer>,
}

/// One fully connected layer.
#[derive(Clone, Debug)]
pub struct Layer {
    /// Row-major `[in, out]`.
    pub weight: Vec<f32>,
    /// `[out]`.
    pub bias: Vec<f32>,
}

/// splitmix64: a tiny deterministic PRNG.
pub(crate) struct SplitMix(pub(crate) u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub(crate) fn unit(&mut self) -> f32 {
        // 24 random bits give an exactly representable f32 in [0, 1).
        let u = (self.next_u64() >> 40) as f32 / (1u32 << 24) as f32;
        2.0 * u - 1.0
    }
}

impl Mlp {
    /// Deterministic weights from `seed`, uniform in ±1/sqrt(in); biases small and nonzero
    /// (magnitude in [0.01, 0.1)). Different seeds give different outputs.
    ///
    /// Panics if `sizes` has fewer than two entries or contains a zero.
    pub fn new(sizes: &[usize], seed: u64) -> Self {
        assert!(sizes.len() >= 2, "an MLP needs at least an input and an output size");
        assert!(sizes.iter().all(|&s| s > 0), "MLP sizes must be nonzero: {sizes:?}");
        let mut rng = SplitMix(seed ^ 0x6261_746f_6e2d_6d6c);
        let layers = sizes
            .windows(2)
            .map(|w| {
                let (inp, out) = (w[0], w[1]);
                let scale = 1.0 / (inp as f32).sqrt();
                let weight = (0..inp * out).map(|_| rng.unit() * scale).collect();
                let bias = (0..out)
                    .map(|_| {
                        let b = rng.unit();
                        b.signum() * (0.01 + 0.09 * b.abs())
                    })
                    .collect();
                Layer { weight, bias }
            })
            .collect();
        Mlp { sizes: sizes.to_vec(), layers }
    }

    /// Every weight as [`encode_mlp`] names it, with its dimensions and
    /// little-endian FP32 bytes, layer by layer.
    pub fn tensors(&self) -> Vec<(String, Vec<i64>, Vec<u8>)> {
        let le = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, layer)| {
                let (inp, out) = (self.sizes[i] as i64, self.sizes[i + 1] as i64);
                [
                    (format!("fc{i}.weight"), vec![inp, out], le(&layer.weight)),
                    (format!("fc{i}.bias"), vec![out], le(&layer.bias)),
                ]
            })
            .collect()
    }

    /// Input width.
    pub fn input_width(&self) -> usize {
        self.sizes[0]
    }

    /// Output width.
    pub fn output_width(&self) -> usize {
        self.sizes[self.sizes.len() - 1]
    }

    /// Reference forward pass in f32 (same op order as the graph: x·W + b, ReLU) for `batch`
    /// rows of input; returns `batch * out` values.
    ///
    /// Panics if `input.len() != batch * in`.
    pub fn forward(&self, input: &[f32], batch: usize) -> Vec<f32> {
        assert_eq!(input.len(), batch * self.input_width(), "input length");
        let mut x = input.to_vec();
        let last = self.layers.len() - 1;
        for (l, layer) in self.layers.iter().enumerate() {
            let (inp, out) = (self.sizes[l], self.sizes[l + 1]);
            let mut y = vec![0f32; batch * out];
            for (xr, yr) in x.chunks_exact(inp).zip(y.chunks_exact_mut(out)) {
                for (&xi, wr) in xr.iter().zip(layer.weight.chunks_exact(out)) {
                    for (acc, &w) in yr.iter_mut().zip(wr) {
                        *acc += xi * w;
                    }
                }
                for (acc, &b) in yr.iter_mut().zip(&layer.bias) {
                    *acc += b;
                    if l != last {
                        *acc = acc.max(0.0);
                    }
                }
            }
            x = y;
        }
        x
    }
}

/// Options for [`encode_mlp`].
#[derive(Clone, Debug)]
pub struct OnnxOptions {
    /// Graph input name (default `"input"`).
    pub input_name: String,
    /// Graph output name (default `"output"`).
    pub output_name: String,
    /// External data file name; when `Some`, every initializer is stored there with an
    /// offset and length instead of inline `raw_data`.
    pub external_data: Option<String>,
    /// Default-domain opset version (default 13).
    pub opset: i64,
}

impl Default for OnnxOptions {
    fn default() -> Self {
        OnnxOptions { input_name: "input".into(), output_name: "output".into(), external_data: None, opset: 13 }
    }
}

/// Writes `mlp` as `dir/model.onnx`, with its weights in `dir/<external>`
/// when given, and returns the model file's path.
#[cfg(test)]
pub(crate) fn write_model(dir: &std::path::Path, mlp: &Mlp, external: Option<&str>) -> std::path::PathBuf {
    let options = OnnxOptions { external_data: external.map(str::to_owned), ..OnnxOptions::default() };
    let (model, data) = encode_mlp(mlp, &options);
    let path = dir.join("model.onnx");
    std::fs::write(&path, model).unwrap();
    if let (Some(name), Some(data)) = (external, data) {
        std::fs::write(dir.join(name), data).unwrap();
    }
    path
}

/// Encodes the MLP as an ONNX ModelProto (ir_version 8, opset_import domain "" version
/// `opts.opset`): nodes MatMul -> Add -> Relu per hidden layer, MatMul -> Add for the
/// last; initializers named "fc{i}.weight" `[in,out]` and "fc{i}.bias" `[out]` as FLOAT
/// raw_data (or external data); graph input `[dim_param "batch", in]` FLOAT, output
/// `[dim_param "batch", out]` FLOAT.
/// Returns (model bytes, external data bytes if `opts.external_data` is set).
pub fn encode_mlp(mlp: &Mlp, opts: &OnnxOptions) -> (Vec<u8>, Option<Vec<u8>>) {
    let mut graph = GraphWriter::new("baton_mlp");
    let mut ext = opts.external_data.as_ref().map(|_| Vec::<u8>::new());
    let mut x = opts.input_name.clone();
    let last = mlp.layers.len() - 1;
    for (i, layer) in mlp.layers.iter().enumerate() {
        let (inp, out) = (mlp.sizes[i], mlp.sizes[i + 1]);
        let (w, b) = (format!("fc{i}.weight"), format!("fc{i}.bias"));
        let (mm, add) = (format!("fc{i}.matmul"), format!("fc{i}.add"));
        let y = if i == last { opts.output_name.clone() } else { add.clone() };
        graph.node("MatMul", &[&x, &w], &[&mm], &[]);
        x = graph.node("Add", &[&mm, &b], &[&y], &[]);
        if i != last {
            x = graph.node("Relu", &[&x], &[&format!("relu{i}")], &[]);
        }
        for (name, dims, values) in [(w, vec![inp, out], &layer.weight), (b, vec![out], &layer.bias)] {
            let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
            let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            match (&mut ext, &opts.external_data) {
                (Some(file), Some(location)) => {
                    graph.initializer_external(&name, elem::FLOAT, &dims, location, file.len(), data.len());
                    file.extend_from_slice(&data);
                }
                _ => graph.initializer(&name, elem::FLOAT, &dims, &data),
            }
        }
    }
    let batch = Dim::Named("batch");
    graph.input(&opts.input_name, elem::FLOAT, &[batch, Dim::Fixed(mlp.input_width() as i64)]);
    graph.output(&opts.output_name, elem::FLOAT, &[batch, Dim::Fixed(mlp.output_width() as i64)]);
    (graph.model(opts.opset), ext)
}

/// The MLP's weights as a safetensors file, named as [`encode_mlp`] names
/// its initializers: a weights-only version of the same graph.
pub fn mlp_safetensors(mlp: &Mlp) -> Vec<u8> {
    let tensors = mlp.tensors();
    let borrowed: Vec<_> =
        tensors.iter().map(|(n, d, b)| (n.as_str(), elem::FLOAT, d.as_slice(), b.as_slice())).collect();
    crate::safetensors::encode(&borrowed).expect("FLOAT has a safetensors dtype")
}

/// Encodes `output = Identity(input)` for `[batch, width]` tensors of an
/// ONNX element type (see [`crate::proto::elem`]): a model with no weights
/// that returns its input, for carrying every datatype end to end.
pub fn encode_identity(elem_type: i32, width: usize) -> Vec<u8> {
    let mut graph = GraphWriter::new("baton_identity");
    graph.node("Identity", &["input"], &["output"], &[]);
    let dims = [Dim::Named("batch"), Dim::Fixed(width as i64)];
    graph.input("input", elem_type, &dims);
    graph.output("output", elem_type, &dims);
    graph.model(13)
}

/// Deterministic input batch of `width * batch` values in [-1, 1] from a seed.
pub fn sample_input(width: usize, batch: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix(seed ^ 0x696e_7075_7473_2121);
    (0..width * batch).map(|_| rng.unit()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_matches_hand_computation() {
        let mlp = Mlp {
            sizes: vec![2, 2, 1],
            layers: vec![
                Layer { weight: vec![1.0, -1.0, 2.0, 0.5], bias: vec![0.5, -3.0] },
                Layer { weight: vec![2.0, 10.0], bias: vec![0.25] },
            ],
        };
        // Row [1, 1]: hidden = relu([3.5, -3.5]) = [3.5, 0]; out = 7.25.
        // Row [-1, 0]: hidden = relu([-0.5, -2]) = [0, 0]; out = 0.25.
        assert_eq!(mlp.forward(&[1.0, 1.0, -1.0, 0.0], 2), vec![7.25, 0.25]);
    }

    #[test]
    fn weights_are_deterministic_scaled_and_seed_dependent() {
        let a = Mlp::new(&[16, 8, 3], 1);
        assert_eq!(a.layers[0].weight, Mlp::new(&[16, 8, 3], 1).layers[0].weight);
        assert_eq!(a.layers.len(), 2);
        assert_eq!((a.layers[0].weight.len(), a.layers[1].bias.len()), (128, 3));
        assert!(a.layers[0].weight.iter().all(|w| w.abs() <= 0.25));
        assert!(a.layers.iter().flat_map(|l| &l.bias).all(|b| (0.01..0.1).contains(&b.abs())));
        let x = sample_input(16, 4, 9);
        assert!(x.iter().all(|v| (-1.0..=1.0).contains(v)));
        assert_eq!(x, sample_input(16, 4, 9));
        assert_ne!(x, sample_input(16, 4, 10));
        assert_ne!(a.forward(&x, 4), Mlp::new(&[16, 8, 3], 2).forward(&x, 4));
    }

    #[test]
    fn external_data_holds_every_weight_in_order() {
        let mlp = Mlp::new(&[3, 4, 2], 5);
        let opts = OnnxOptions { external_data: Some("w.bin".into()), ..Default::default() };
        let (model, ext) = encode_mlp(&mlp, &opts);
        let ext = ext.unwrap();
        let want: Vec<u8> =
            mlp.layers.iter().flat_map(|l| l.weight.iter().chain(&l.bias)).flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(ext, want);
        assert!(model.windows(5).any(|w| w == b"w.bin"));
        let (inline, none) = encode_mlp(&mlp, &OnnxOptions::default());
        assert!(none.is_none() && inline.len() > ext.len());
    }
}
