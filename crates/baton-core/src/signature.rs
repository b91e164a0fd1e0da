//! What a model takes and returns: names, datatypes and shapes, with `-1` for
//! a dimension that varies (usually the batch).

use serde::{Deserialize, Serialize};

use crate::tensor::{DataType, Tensor};

/// One input or output of a model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorSpec {
    /// Tensor name.
    pub name: String,
    /// Element datatype.
    pub datatype: DataType,
    /// Dimensions, `-1` where any size is accepted.
    pub shape: Vec<i64>,
}

impl TensorSpec {
    /// Whether a concrete shape fits this spec.
    pub fn accepts(&self, shape: &[i64]) -> bool {
        self.shape.len() == shape.len() && self.shape.iter().zip(shape).all(|(want, got)| *want < 0 || want == got)
    }
}

/// The inputs and outputs of a model.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    /// Inputs, in the model's order.
    pub inputs: Vec<TensorSpec>,
    /// Outputs, in the model's order.
    pub outputs: Vec<TensorSpec>,
}

impl Signature {
    /// The input spec with this name.
    pub fn input(&self, name: &str) -> Option<&TensorSpec> {
        self.inputs.iter().find(|s| s.name == name)
    }

    /// The output spec with this name.
    pub fn output(&self, name: &str) -> Option<&TensorSpec> {
        self.outputs.iter().find(|s| s.name == name)
    }

    /// Whether the model batches along the first dimension: it has inputs,
    /// and every input and output has a variable first dimension. Dynamic
    /// batching and Triton's `max_batch_size` convention both need this.
    pub fn is_batched(&self) -> bool {
        !self.inputs.is_empty()
            && self.inputs.iter().chain(&self.outputs).all(|s| s.shape.first().is_some_and(|&d| d < 0))
    }

    /// Checks request tensors against the inputs; the message says which
    /// tensor is wrong and what was expected.
    pub fn check_inputs(&self, inputs: &[Tensor]) -> Result<(), String> {
        for spec in &self.inputs {
            if !inputs.iter().any(|t| t.name == spec.name) {
                return Err(format!("missing input '{}'", spec.name));
            }
        }
        for (i, tensor) in inputs.iter().enumerate() {
            if inputs[..i].iter().any(|t| t.name == tensor.name) {
                return Err(format!("input '{}' given more than once", tensor.name));
            }
            let spec = self.input(&tensor.name).ok_or_else(|| {
                let names: Vec<&str> = self.inputs.iter().map(|s| s.name.as_str()).collect();
                format!("unexpected input '{}'; the model takes {:?}", tensor.name, names)
            })?;
            if spec.datatype != tensor.datatype {
                return Err(format!(
                    "input '{}': expected datatype {}, got {}",
                    tensor.name, spec.datatype, tensor.datatype
                ));
            }
            if !spec.accepts(&tensor.shape) {
                return Err(format!(
                    "input '{}': expected shape {:?}, got {:?}",
                    tensor.name, spec.shape, tensor.shape
                ));
            }
            tensor.check_consistent()?;
        }
        self.check_batch_agrees(inputs)
    }

    /// For a model that batches, every input must carry the same batch
    /// size: the engine would refuse the request anyway, and dynamic
    /// batching splits outputs by the first input's rows.
    fn check_batch_agrees(&self, inputs: &[Tensor]) -> Result<(), String> {
        if !self.is_batched() {
            return Ok(());
        }
        let mut rows = inputs.iter().filter_map(|t| t.shape.first().map(|r| (t, *r)));
        let Some((first, batch)) = rows.next() else { return Ok(()) };
        match rows.find(|(_, r)| *r != batch) {
            None => Ok(()),
            Some((other, r)) => Err(format!(
                "inputs disagree on the batch size: '{}' has {batch} rows, '{}' has {r}",
                first.name, other.name
            )),
        }
    }

    /// Compares the signature a model file declares (`self`) with the one
    /// its `model.toml` declares, and lists every contradiction. A dimension
    /// fixed on one side and variable on the other is not a contradiction;
    /// two different fixed sizes, a different rank or datatype, or a missing
    /// or extra tensor are.
    pub fn contradictions(&self, declared: &Signature) -> Vec<String> {
        let mut out = Vec::new();
        for (kind, actual, wanted) in
            [("input", &self.inputs, &declared.inputs), ("output", &self.outputs, &declared.outputs)]
        {
            for want in wanted {
                match actual.iter().find(|a| a.name == want.name) {
                    None => {
                        out.push(format!("model.toml declares {kind} '{}' but the model has no such {kind}", want.name))
                    }
                    Some(have) => {
                        if have.datatype != want.datatype {
                            out.push(format!(
                                "{kind} '{}': model.toml says {}, the model says {}",
                                want.name, want.datatype, have.datatype
                            ));
                        }
                        let dims_clash = have.shape.len() != want.shape.len()
                            || have.shape.iter().zip(&want.shape).any(|(a, b)| *a >= 0 && *b >= 0 && a != b);
                        if dims_clash {
                            out.push(format!(
                                "{kind} '{}': model.toml says shape {:?}, the model says {:?}",
                                want.name, want.shape, have.shape
                            ));
                        }
                    }
                }
            }
            if !wanted.is_empty() {
                for have in actual {
                    if !wanted.iter().any(|w| w.name == have.name) {
                        out.push(format!("the model has {kind} '{}' that model.toml does not declare", have.name));
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, shape: &[i64]) -> TensorSpec {
        TensorSpec { name: name.into(), datatype: DataType::Fp32, shape: shape.to_vec() }
    }

    #[test]
    fn request_checks_name_dtype_shape_and_size() {
        let sig = Signature { inputs: vec![spec("x", &[-1, 3])], outputs: vec![spec("y", &[-1, 1])] };
        assert!(sig.check_inputs(&[Tensor::from_f32("x", vec![2, 3], &[0.0; 6])]).is_ok());
        let e = sig.check_inputs(&[Tensor::from_f32("x", vec![2, 4], &[0.0; 8])]).unwrap_err();
        assert!(e.contains("expected shape [-1, 3], got [2, 4]"), "{e}");
        let e = sig.check_inputs(&[Tensor::from_f32("z", vec![1, 3], &[0.0; 3])]).unwrap_err();
        assert!(e.contains("missing input 'x'"), "{e}");
        let e = sig.check_inputs(&[]).unwrap_err();
        assert!(e.contains("missing input 'x'"), "{e}");
        let mut wrong = Tensor::from_f32("x", vec![1, 3], &[0.0; 3]);
        wrong.datatype = DataType::Int32;
        let e = sig.check_inputs(&[wrong]).unwrap_err();
        assert!(e.contains("expected datatype FP32, got INT32"), "{e}");
        let e = sig.check_inputs(&[Tensor::from_f32("x", vec![2, 3], &[0.0; 5])]).unwrap_err();
        assert!(e.contains("needs 24 bytes, got 20"), "{e}");
    }

    #[test]
    fn inputs_of_a_batched_model_agree_on_the_batch() {
        let sig = Signature { inputs: vec![spec("a", &[-1, 2]), spec("b", &[-1, 1])], outputs: vec![spec("y", &[-1])] };
        let a = |rows: usize| Tensor::from_f32("a", vec![rows as i64, 2], &vec![0.0; rows * 2]);
        let b = |rows: usize| Tensor::from_f32("b", vec![rows as i64, 1], &vec![0.0; rows]);
        assert!(sig.check_inputs(&[a(3), b(3)]).is_ok());
        let e = sig.check_inputs(&[a(2), b(3)]).unwrap_err();
        assert!(e.contains("'a' has 2 rows, 'b' has 3"), "{e}");
        let fixed = Signature { inputs: vec![spec("a", &[2, 2]), spec("b", &[3, 1])], outputs: vec![] };
        assert!(fixed.check_inputs(&[a(2), b(3)]).is_ok(), "a model that does not batch has no batch to agree on");
    }

    #[test]
    fn contradictions_tolerate_dynamic_dims_but_not_clashes() {
        let model = Signature { inputs: vec![spec("x", &[-1, 3])], outputs: vec![spec("y", &[-1, 1])] };
        let same = Signature { inputs: vec![spec("x", &[8, 3])], outputs: vec![spec("y", &[-1, 1])] };
        assert!(model.contradictions(&same).is_empty());
        let renamed = Signature { inputs: vec![spec("z", &[-1, 3])], outputs: vec![spec("y", &[-1, 1])] };
        let found = model.contradictions(&renamed);
        assert_eq!(found.len(), 2, "{found:?}");
        let wider = Signature { inputs: vec![spec("x", &[-1, 4])], outputs: vec![] };
        assert_eq!(model.contradictions(&wider).len(), 1);
    }
}
