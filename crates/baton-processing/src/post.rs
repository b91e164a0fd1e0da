//! After the graph: pooling over tokens, normalization and scores, steps
//! applied in turn to one FP32 output of the graph.

use baton_core::tensors::signature::{Signature, TensorSpec};
use baton_core::tensors::tensor::{DataType, Tensor, TensorData};
use serde::Deserialize;

use crate::error::{OUTPUT_MISMATCH, ProcessingError};

/// The graph outputs pooling reads by default, by preference: what a
/// Hugging Face export and a sentence-transformers export name them.
const TOKEN_OUTPUTS: [&str; 2] = ["last_hidden_state", "token_embeddings"];

/// One step after the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// `[batch, sequence, hidden]` to `[batch, hidden]`: the mean of the
    /// tokens the attention mask keeps.
    MeanPool,
    /// `[batch, sequence, hidden]` to `[batch, hidden]`: the first token.
    ClsPool,
    /// `[batch, sequence, hidden]` to `[batch, hidden]`: the largest value
    /// of each feature over the tokens the attention mask keeps.
    MaxPool,
    /// Each row divided by its Euclidean norm (at least 1e-12).
    L2Normalize,
    /// `1 / (1 + e^-x)`, element by element.
    Sigmoid,
    /// Softmax over the last axis.
    Softmax,
    /// The `k` largest values of the last axis, with their labels: must
    /// be the last step.
    TopK,
}

impl Step {
    fn pools(self) -> bool {
        matches!(self, Step::MeanPool | Step::ClsPool | Step::MaxPool)
    }
}

/// What happens to the graph's outputs, as a version declares it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutputSpec {
    /// The graph output the steps read; else the graph's only output or,
    /// for pooling, `last_hidden_state`, `token_embeddings` or its first
    /// output of rank 3.
    pub from: Option<String>,
    /// The output clients receive.
    pub name: String,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// How many values `top_k` keeps.
    pub k: Option<usize>,
    /// A labels file, one label a line, for `top_k`.
    pub labels: Option<String>,
}

/// The steps, checked against the graph, ready to run.
pub struct Post {
    from: String,
    name: String,
    steps: Vec<Step>,
    top_k: Option<(usize, Option<Vec<String>>)>,
    outputs: Vec<TensorSpec>,
}

impl Post {
    /// Checks `spec` against the graph's signature; `labels` is the labels
    /// file's text when the spec names one; `masked` whether a tokenizer
    /// makes the attention mask pooling reads.
    pub fn load(
        spec: &OutputSpec,
        graph: &Signature,
        labels: Option<&str>,
        masked: bool,
    ) -> Result<Post, ProcessingError> {
        let invalid = |why: String| ProcessingError::invalid(format!("[output]: {why}"));
        let pools = spec.steps.first().is_some_and(|s| s.pools());
        let from = match &spec.from {
            Some(name) => graph.output(name).ok_or_else(|| invalid(format!("the graph has no output '{name}'")))?,
            None if pools => TOKEN_OUTPUTS
                .iter()
                .find_map(|name| graph.output(name))
                .or_else(|| graph.outputs.iter().find(|o| o.shape.len() == 3))
                .ok_or_else(|| invalid("pooling asks for a graph output of rank 3".into()))?,
            None => match graph.outputs.as_slice() {
                [only] => only,
                _ => return Err(invalid("the graph has several outputs: say which with 'from'".into())),
            },
        };
        if from.datatype != DataType::Fp32 {
            return Err(invalid(format!("the graph's output '{}' is {}, not FP32", from.name, from.datatype)));
        }
        let mut shape = from.shape.clone();
        for (i, step) in spec.steps.iter().enumerate() {
            if step.pools() {
                if i != 0 || shape.len() != 3 {
                    return Err(invalid(format!("{step:?} comes first, on an output of rank 3")));
                }
                if !masked && *step != Step::ClsPool {
                    return Err(invalid(format!("{step:?} reads the attention mask a [tokenizer] makes")));
                }
                shape.remove(1);
            }
            if *step == Step::TopK && i + 1 != spec.steps.len() {
                return Err(invalid("top_k must be the last step".into()));
            }
        }
        let top_k = if spec.steps.contains(&Step::TopK) {
            let k = spec.k.filter(|k| *k > 0).ok_or_else(|| invalid("top_k asks for k, at least 1".into()))?;
            if let Some(&width) = shape.last()
                && width > 0
                && k > width as usize
            {
                return Err(invalid(format!("top_k asks for {k} of {width} classes")));
            }
            let labels: Option<Vec<String>> = labels.map(|text| text.lines().map(str::to_owned).collect());
            if let (Some(labels), Some(&width)) = (&labels, shape.last())
                && width > 0
                && labels.len() < width as usize
            {
                return Err(invalid(format!("{} labels for {width} classes", labels.len())));
            }
            *shape.last_mut().ok_or_else(|| invalid("top_k on a scalar".into()))? = k as i64;
            Some((k, labels))
        } else {
            None
        };
        let mut outputs = vec![TensorSpec { name: spec.name.clone(), datatype: DataType::Fp32, shape: shape.clone() }];
        if let Some((_, labels)) = &top_k {
            let (suffix, datatype) =
                if labels.is_some() { ("labels", DataType::Bytes) } else { ("indices", DataType::Int64) };
            outputs.push(TensorSpec { name: format!("{}_{suffix}", spec.name), datatype, shape });
        }
        Ok(Post { from: from.name.clone(), name: spec.name.clone(), steps: spec.steps.clone(), top_k, outputs })
    }

    /// The outputs clients receive.
    pub fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }

    /// Runs the steps on the graph's outputs; `mask` is the tokenizer's
    /// attention mask, `[batch, sequence]`, when there is one.
    pub fn run(&self, outputs: Vec<Tensor>, mask: Option<&[i64]>) -> Result<Vec<Tensor>, ProcessingError> {
        let mismatch = |why: String| ProcessingError::new(OUTPUT_MISMATCH, why);
        let output = outputs
            .into_iter()
            .find(|t| t.name == self.from)
            .ok_or_else(|| mismatch(format!("the graph did not answer its output '{}'", self.from)))?;
        let mut values = output.to_f32().ok_or_else(|| mismatch(format!("output '{}' is not FP32", self.from)))?;
        let mut shape: Vec<usize> = output.shape.iter().map(|d| *d as usize).collect();
        for step in &self.steps {
            match step {
                Step::MeanPool | Step::MaxPool | Step::ClsPool => {
                    let [batch, sequence, hidden] = shape[..] else {
                        return Err(mismatch(format!("output '{}' is not of rank 3", self.from)));
                    };
                    let ones = vec![1; batch * sequence];
                    let mask = if *step == Step::ClsPool { &ones[..] } else { mask.unwrap_or(&ones) };
                    if mask.len() != batch * sequence {
                        return Err(mismatch(format!("output '{}' has {sequence} tokens a row", self.from)));
                    }
                    values = pool(*step, &values, mask, [batch, sequence, hidden]);
                    shape = vec![batch, hidden];
                }
                Step::L2Normalize => rows(&mut values, &shape, |row| {
                    let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
                    row.iter_mut().for_each(|v| *v /= norm);
                }),
                Step::Sigmoid => values.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp())),
                Step::Softmax => rows(&mut values, &shape, softmax),
                Step::TopK => return self.top_k(&values, &shape),
            }
        }
        let shape = shape.iter().map(|d| *d as i64).collect();
        Ok(vec![Tensor::from_f32(self.name.clone(), shape, &values)])
    }

    fn top_k(&self, values: &[f32], shape: &[usize]) -> Result<Vec<Tensor>, ProcessingError> {
        let Some((k, labels)) = &self.top_k else { return Ok(Vec::new()) };
        let width = shape.last().copied().unwrap_or(0);
        // A graph whose width the signature leaves open answers its classes
        // only now: more of them than labels is the version's fault, not an
        // empty label for a client.
        if let Some(labels) = labels
            && width > labels.len()
        {
            return Err(ProcessingError::new(
                crate::error::OUTPUT_MISMATCH,
                format!("output '{}' has {width} classes and the labels file {} labels", self.from, labels.len()),
            ));
        }
        let k = (*k).min(width);
        let (mut scores, mut picked) = (Vec::new(), Vec::new());
        for row in values.chunks(width.max(1)) {
            let mut order: Vec<usize> = (0..row.len()).collect();
            // Largest first; equal scores keep the lower index first.
            order.sort_by(|a, b| row[*b].total_cmp(&row[*a]).then(a.cmp(b)));
            for &i in &order[..k] {
                scores.push(row[i]);
                picked.push(i);
            }
        }
        let mut out_shape: Vec<i64> = shape.iter().map(|d| *d as i64).collect();
        if let Some(last) = out_shape.last_mut() {
            *last = k as i64;
        }
        let second = match labels {
            Some(labels) => Tensor {
                name: format!("{}_labels", self.name),
                datatype: DataType::Bytes,
                shape: out_shape.clone(),
                data: TensorData::Bytes(
                    picked.iter().map(|i| labels.get(*i).cloned().unwrap_or_default().into_bytes()).collect(),
                ),
            },
            None => Tensor {
                name: format!("{}_indices", self.name),
                datatype: DataType::Int64,
                shape: out_shape.clone(),
                data: TensorData::Raw(picked.iter().flat_map(|i| (*i as i64).to_le_bytes()).collect()),
            },
        };
        Ok(vec![Tensor::from_f32(self.name.clone(), out_shape, &scores), second])
    }
}

/// A row's softmax. Infinite scores take the whole mass, shared among
/// them; a row of -inf alone spreads it evenly (rather than answer NaN).
fn softmax(row: &mut [f32]) {
    let top = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if top.is_infinite() {
        // +inf: the infinite scores share it; -inf everywhere: all share it.
        let winners = row.iter().filter(|v| **v == top).count().max(1) as f32;
        row.iter_mut().for_each(|v| *v = if *v == top { 1.0 / winners } else { 0.0 });
        return;
    }
    row.iter_mut().for_each(|v| *v = (*v - top).exp());
    let sum: f32 = row.iter().sum();
    row.iter_mut().for_each(|v| *v /= sum);
}

/// Runs `f` on each row along the last axis.
fn rows(values: &mut [f32], shape: &[usize], f: impl Fn(&mut [f32])) {
    let width = shape.last().copied().unwrap_or(1).max(1);
    values.chunks_mut(width).for_each(f);
}

/// Pools `[batch, sequence, hidden]` into `[batch, hidden]` over the tokens
/// `mask` keeps, as sentence-transformers does: the mean divides by the
/// kept tokens (at least 1e-9), the max sees padding as -1e9.
fn pool(step: Step, values: &[f32], mask: &[i64], [batch, sequence, hidden]: [usize; 3]) -> Vec<f32> {
    let mut out = vec![0.0f32; batch * hidden];
    for b in 0..batch {
        let row = &mut out[b * hidden..(b + 1) * hidden];
        let token = |s: usize| &values[(b * sequence + s) * hidden..(b * sequence + s + 1) * hidden];
        match step {
            Step::ClsPool if sequence > 0 => row.copy_from_slice(token(0)),
            Step::MaxPool => {
                row.fill(f32::NEG_INFINITY);
                for s in 0..sequence {
                    let kept = mask[b * sequence + s] != 0;
                    for (o, v) in row.iter_mut().zip(token(s)) {
                        *o = o.max(if kept { *v } else { -1e9 });
                    }
                }
            }
            _ => {
                let mut kept = 0.0f32;
                for s in 0..sequence {
                    let m = mask[b * sequence + s] as f32;
                    kept += m;
                    for (o, v) in row.iter_mut().zip(token(s)) {
                        *o += v * m;
                    }
                }
                row.iter_mut().for_each(|o| *o /= kept.max(1e-9));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(shape: Vec<i64>) -> Signature {
        Signature {
            inputs: Vec::new(),
            outputs: vec![TensorSpec { name: "y".into(), datatype: DataType::Fp32, shape }],
        }
    }

    fn spec(steps: &[Step]) -> OutputSpec {
        OutputSpec { name: "out".into(), steps: steps.to_vec(), k: Some(2), ..OutputSpec::default() }
    }

    #[test]
    fn mean_pooling_skips_padding_and_normalizing_makes_unit_rows() {
        let post =
            Post::load(&spec(&[Step::MeanPool, Step::L2Normalize]), &graph(vec![-1, -1, 2]), None, true).unwrap();
        // One row of three tokens, the last one padding.
        let y = Tensor::from_f32("y", vec![1, 3, 2], &[1.0, 2.0, 3.0, 6.0, 100.0, 100.0]);
        let out = post.run(vec![y], Some(&[1, 1, 0])).unwrap();
        let v = out[0].to_f32().unwrap();
        let norm = (2.0f32 * 2.0 + 4.0 * 4.0).sqrt();
        assert_eq!(out[0].shape, vec![1, 2]);
        assert!((v[0] - 2.0 / norm).abs() < 1e-6 && (v[1] - 4.0 / norm).abs() < 1e-6, "{v:?}");
    }

    #[test]
    fn softmax_then_top_k_names_the_labels_of_the_largest() {
        let post =
            Post::load(&spec(&[Step::Softmax, Step::TopK]), &graph(vec![-1, 3]), Some("cat\ndog\nbird\n"), false)
                .unwrap();
        let out = post.run(vec![Tensor::from_f32("y", vec![1, 3], &[0.0, 2.0, 1.0])], None).unwrap();
        assert_eq!(out[1].data, TensorData::Bytes(vec![b"dog".to_vec(), b"bird".to_vec()]));
        let scores = out[0].to_f32().unwrap();
        let sum = 1.0 + 2.0f32.exp() + 1.0f32.exp();
        assert!((scores[0] - 2.0f32.exp() / sum).abs() < 1e-6, "{scores:?}");
    }

    #[test]
    fn softmax_of_infinite_scores_is_never_nan() {
        let post = Post::load(&spec(&[Step::Softmax]), &graph(vec![-1, 3]), None, false).unwrap();
        let y = Tensor::from_f32(
            "y",
            vec![2, 3],
            &[f32::INFINITY, 0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY],
        );
        let out = post.run(vec![y], None).unwrap()[0].to_f32().unwrap();
        let third = 1.0 / 3.0;
        assert_eq!(out, vec![0.5, 0.0, 0.5, third, third, third]);
    }

    #[test]
    fn more_classes_than_labels_at_run_time_is_the_versions_error_not_an_empty_label() {
        let post = Post::load(&spec(&[Step::TopK]), &graph(vec![-1, -1]), Some("cat\ndog\n"), false).unwrap();
        let y = Tensor::from_f32("y", vec![1, 3], &[0.0, 1.0, 2.0]);
        let refused = post.run(vec![y], None).expect_err("refused");
        assert_eq!(refused.kind, crate::error::OUTPUT_MISMATCH, "{refused}");
    }

    #[test]
    fn sigmoid_maps_zero_to_a_half() {
        let post = Post::load(&spec(&[Step::Sigmoid]), &graph(vec![-1, 1]), None, false).unwrap();
        let out = post.run(vec![Tensor::from_f32("y", vec![2, 1], &[0.0, 40.0])], None).unwrap();
        assert_eq!(out[0].to_f32().unwrap(), vec![0.5, 1.0]);
    }

    #[test]
    fn steps_that_contradict_the_graph_are_refused_at_load() {
        let refused = |steps: &[Step], shape: Vec<i64>, masked: bool| {
            Post::load(&spec(steps), &graph(shape), None, masked).err().map(|e| e.kind)
        };
        assert_eq!(refused(&[Step::MeanPool], vec![-1, 4], true), Some(crate::error::PROCESSING_INVALID));
        assert_eq!(refused(&[Step::MeanPool], vec![-1, -1, 4], false), Some(crate::error::PROCESSING_INVALID));
        assert_eq!(refused(&[Step::TopK, Step::Sigmoid], vec![-1, 4], false), Some(crate::error::PROCESSING_INVALID));
        assert_eq!(refused(&[Step::Sigmoid], vec![-1, 4], false), None);
        // top_k's k of 2 from an output of one class.
        assert_eq!(refused(&[Step::TopK], vec![-1, 1], false), Some(crate::error::PROCESSING_INVALID));
    }
}
