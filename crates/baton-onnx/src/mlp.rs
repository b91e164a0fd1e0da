//! Writes dense MLPs as ONNX models with a hand-written protobuf encoder,
//! plus a reference forward pass to check a backend's output against.
//!
//! baton uses it for its demo repository and its tests: every model they
//! serve is generated from a seed, never downloaded.

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
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
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

/// A minimal protobuf encoder: enough of the wire format to write ONNX models.
mod pb {
    /// A message being encoded.
    #[derive(Default)]
    pub struct Msg(pub Vec<u8>);

    impl Msg {
        fn raw_varint(&mut self, mut v: u64) {
            while v >= 0x80 {
                self.0.push((v as u8) | 0x80);
                v >>= 7;
            }
            self.0.push(v as u8);
        }

        fn key(&mut self, field: u32, wire: u8) {
            self.raw_varint(u64::from(field) << 3 | u64::from(wire));
        }

        /// A varint field (int32/int64/enum; negatives take ten bytes, as protobuf does).
        pub fn int(&mut self, field: u32, v: i64) -> &mut Self {
            self.key(field, 0);
            self.raw_varint(v as u64);
            self
        }

        /// A length-delimited field.
        pub fn bytes(&mut self, field: u32, b: &[u8]) -> &mut Self {
            self.key(field, 2);
            self.raw_varint(b.len() as u64);
            self.0.extend_from_slice(b);
            self
        }

        /// A string field.
        pub fn str(&mut self, field: u32, s: &str) -> &mut Self {
            self.bytes(field, s.as_bytes())
        }

        /// An embedded message field.
        pub fn msg(&mut self, field: u32, m: &Msg) -> &mut Self {
            self.bytes(field, &m.0)
        }

        /// An embedded message field built by `f`.
        pub fn with(&mut self, field: u32, f: impl FnOnce(&mut Msg)) -> &mut Self {
            let mut m = Msg::default();
            f(&mut m);
            self.msg(field, &m)
        }
    }
}

use pb::Msg;

/// ValueInfoProto for a FLOAT tensor of shape `[batch, width]`.
fn value_info(name: &str, width: usize) -> Msg {
    typed_value_info(name, 1, width)
}

/// ValueInfoProto for a tensor of ONNX element type `elem_type` and shape `[batch, width]`.
fn typed_value_info(name: &str, elem_type: i64, width: usize) -> Msg {
    let mut vi = Msg::default();
    vi.str(1, name).with(2, |ty| {
        ty.with(1, |tensor| {
            tensor.int(1, elem_type).with(2, |shape| {
                shape.with(1, |d| {
                    d.str(2, "batch");
                });
                shape.with(1, |d| {
                    d.int(1, width as i64);
                });
            });
        });
    });
    vi
}

/// NodeProto.
fn node(op: &str, name: &str, inputs: &[&str], output: &str) -> Msg {
    let mut n = Msg::default();
    for i in inputs {
        n.str(1, i);
    }
    n.str(2, output).str(3, name).str(4, op);
    n
}

/// Encodes the MLP as an ONNX ModelProto (ir_version 8, opset_import domain "" version
/// `opts.opset`, producer_name "baton-testkit"): nodes MatMul -> Add -> Relu per hidden
/// layer, MatMul -> Add for the last; initializers named "fc{i}.weight" `[in,out]` and
/// "fc{i}.bias" `[out]` as FLOAT raw_data (or external data); graph input
/// `[dim_param "batch", in]` FLOAT, output `[dim_param "batch", out]` FLOAT.
/// Returns (model bytes, external data bytes if `opts.external_data` is set).
pub fn encode_mlp(mlp: &Mlp, opts: &OnnxOptions) -> (Vec<u8>, Option<Vec<u8>>) {
    let mut graph = Msg::default();
    let mut ext = opts.external_data.as_ref().map(|_| Vec::<u8>::new());
    let mut inits = Vec::new();
    let mut x = opts.input_name.clone();
    let last = mlp.layers.len() - 1;
    for (i, layer) in mlp.layers.iter().enumerate() {
        let (inp, out) = (mlp.sizes[i], mlp.sizes[i + 1]);
        let (w, b) = (format!("fc{i}.weight"), format!("fc{i}.bias"));
        let (mm, add) = (format!("fc{i}.matmul"), format!("fc{i}.add"));
        let y = if i == last { opts.output_name.clone() } else { add.clone() };
        graph.msg(1, &node("MatMul", &format!("fc{i}/MatMul"), &[&x, &w], &mm));
        graph.msg(1, &node("Add", &format!("fc{i}/Add"), &[&mm, &b], &y));
        x = y;
        if i != last {
            let relu = format!("relu{i}");
            graph.msg(1, &node("Relu", &format!("relu{i}/Relu"), &[&x], &relu));
            x = relu;
        }
        inits.push((w, vec![inp, out], &layer.weight));
        inits.push((b, vec![out], &layer.bias));
    }
    graph.str(2, "baton_mlp");
    for (name, dims, values) in inits {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut t = Msg::default();
        for d in dims {
            t.int(1, d as i64); // proto2 `repeated int64 dims`: unpacked
        }
        t.int(2, 1).str(8, &name);
        match (&mut ext, &opts.external_data) {
            (Some(file), Some(location)) => {
                let offset = file.len();
                file.extend_from_slice(&data);
                let entry = |t: &mut Msg, k: &str, v: &str| {
                    t.with(13, |e| {
                        e.str(1, k).str(2, v);
                    });
                };
                entry(&mut t, "location", location);
                entry(&mut t, "offset", &offset.to_string());
                entry(&mut t, "length", &data.len().to_string());
                t.int(14, 1);
            }
            _ => {
                t.bytes(9, &data);
            }
        }
        graph.msg(5, &t);
    }
    graph.msg(11, &value_info(&opts.input_name, mlp.input_width()));
    graph.msg(12, &value_info(&opts.output_name, mlp.output_width()));

    let mut model = Msg::default();
    model.int(1, 8).str(2, "baton-testkit").str(3, env!("CARGO_PKG_VERSION")).msg(7, &graph).with(8, |op| {
        op.str(1, "").int(2, opts.opset);
    });
    (model.0, ext)
}

/// Encodes `output = Identity(input)` for `[batch, width]` tensors of an
/// ONNX element type (see [`crate::proto::elem`]): a model with no weights
/// that returns its input, for carrying every datatype end to end.
pub fn encode_identity(elem_type: i32, width: usize) -> Vec<u8> {
    let mut graph = Msg::default();
    graph.msg(1, &node("Identity", "identity", &["input"], "output"));
    graph.str(2, "baton_identity");
    graph.msg(11, &typed_value_info("input", i64::from(elem_type), width));
    graph.msg(12, &typed_value_info("output", i64::from(elem_type), width));
    let mut model = Msg::default();
    model.int(1, 8).str(2, "baton").str(3, env!("CARGO_PKG_VERSION")).msg(7, &graph).with(8, |op| {
        op.str(1, "").int(2, 13);
    });
    model.0
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
