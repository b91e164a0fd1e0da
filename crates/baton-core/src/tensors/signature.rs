//! What a model takes and returns: names, datatypes and shapes, with `-1` for
//! a dimension that varies (usually the batch).

use serde::{Deserialize, Serialize};

use crate::tensors::tensor::{DataType, Tensor};

/// What a request says about one input before its data is decoded: enough
/// to check it against the model before any memory is spent on its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputShape<'a> {
    /// Input name.
    pub name: &'a str,
    /// Element datatype.
    pub datatype: DataType,
    /// Concrete dimensions.
    pub shape: &'a [i64],
}

impl<'a> InputShape<'a> {
    /// The name, datatype and shape of a decoded tensor.
    pub fn of(tensor: &'a Tensor) -> InputShape<'a> {
        InputShape { name: &tensor.name, datatype: tensor.datatype, shape: &tensor.shape }
    }
}

/// Names listed in a message: the first [`NAMES_LISTED`], quoted, then how
/// many more; `none` for none.
pub fn names(all: &[String]) -> String {
    if all.is_empty() {
        return "none".to_owned();
    }
    let quote = |n: &String| match n.char_indices().nth(NAME_CHARS) {
        Some((cut, _)) => format!("'{}…'", &n[..cut]),
        None => format!("'{n}'"),
    };
    let mut text: Vec<String> = all.iter().take(NAMES_LISTED).map(quote).collect();
    if all.len() > NAMES_LISTED {
        text.push(format!("and {} more", all.len() - NAMES_LISTED));
    }
    text.join(", ")
}

/// The most names a message lists.
pub const NAMES_LISTED: usize = 20;

/// The most characters of one name a message quotes.
const NAME_CHARS: usize = 64;

/// Why a request's inputs do not fit a model. Each message names the input
/// and says what was expected and what came.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// An input the model takes is not in the request.
    #[error("missing input '{name}': the model takes {}; the request sent {}", names(.expected), names(.sent))]
    Missing {
        /// The model's input.
        name: String,
        /// The model's inputs, in model order.
        expected: Vec<String>,
        /// The request's inputs, in request order.
        sent: Vec<String>,
    },
    /// The request names an input twice.
    #[error("input '{name}' given more than once")]
    Duplicate {
        /// The input.
        name: String,
    },
    /// The model takes no input of that name.
    #[error("unexpected input '{name}'; the model takes {expected:?}")]
    Unexpected {
        /// The request's input.
        name: String,
        /// The model's inputs, in model order.
        expected: Vec<String>,
    },
    /// The input's datatype is not the model's.
    #[error("input '{name}': expected datatype {expected}, got {got}")]
    Datatype {
        /// The input.
        name: String,
        /// The model's datatype.
        expected: DataType,
        /// The request's.
        got: DataType,
    },
    /// The input's shape does not fit the model's (rank or a fixed size).
    #[error("input '{name}': expected shape {expected:?}, got {got:?}")]
    Shape {
        /// The input.
        name: String,
        /// The model's shape, `-1` where any size is accepted.
        expected: Vec<i64>,
        /// The request's.
        got: Vec<i64>,
    },
    /// Two inputs of a request to a batching model disagree on the batch
    /// size (the first dimension).
    #[error(
        "input '{name}': batch size {batch} differs from input '{first}' (batch size {first_batch}); \
         every input of a request carries the same batch"
    )]
    BatchMismatch {
        /// The input that disagrees with the first.
        name: String,
        /// Its batch size.
        batch: i64,
        /// The request's first input.
        first: String,
        /// Its batch size.
        first_batch: i64,
    },
    /// The batch is larger than the model's `max_batch_size`.
    #[error("input '{name}': batch size {batch} exceeds the model's max_batch_size {max}")]
    BatchTooLarge {
        /// The request's first input.
        name: String,
        /// The request's batch size.
        batch: i64,
        /// The model's limit.
        max: usize,
    },
    /// A decoded tensor's data disagrees with its own shape and datatype.
    #[error("{0}")]
    Inconsistent(String),
}

impl InputError {
    /// A stable, machine-readable name for the kind of failure:
    /// `batch_too_large`, `batch_mismatch`, else `invalid_input`.
    pub fn kind(&self) -> &'static str {
        match self {
            InputError::BatchTooLarge { .. } => "batch_too_large",
            InputError::BatchMismatch { .. } => "batch_mismatch",
            _ => "invalid_input",
        }
    }
}

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
    /// tensor is wrong and what was expected. The same checks as
    /// [`Signature::check_request`] without a batch limit, plus each
    /// tensor's data against its shape and datatype.
    pub fn check_inputs(&self, inputs: &[Tensor]) -> Result<(), String> {
        let shapes: Vec<InputShape<'_>> = inputs.iter().map(InputShape::of).collect();
        self.check(&shapes, 0, |i| inputs[i].check_consistent().map_err(InputError::Inconsistent))
            .map_err(|e| e.to_string())
    }

    /// Checks what a request says about its inputs, before any data is
    /// decoded: every input the model takes is there once, no other is,
    /// each has the model's datatype and a shape the model accepts; for a
    /// model that batches ([`Signature::is_batched`]), every input has the
    /// same batch size (first dimension), at most `max_batch_size` unless
    /// that is 0.
    pub fn check_request(&self, inputs: &[InputShape<'_>], max_batch_size: usize) -> Result<(), InputError> {
        self.check(inputs, max_batch_size, |_| Ok(()))
    }

    /// The one implementation behind [`Signature::check_inputs`] and
    /// [`Signature::check_request`]; `each` runs after an input's own
    /// checks, before the next input's.
    fn check(
        &self,
        inputs: &[InputShape<'_>],
        max_batch_size: usize,
        mut each: impl FnMut(usize) -> Result<(), InputError>,
    ) -> Result<(), InputError> {
        for spec in &self.inputs {
            if !inputs.iter().any(|t| t.name == spec.name) {
                return Err(InputError::Missing {
                    name: spec.name.clone(),
                    expected: self.inputs.iter().map(|s| s.name.clone()).collect(),
                    sent: inputs.iter().map(|t| t.name.to_owned()).collect(),
                });
            }
        }
        for (i, input) in inputs.iter().enumerate() {
            if inputs[..i].iter().any(|t| t.name == input.name) {
                return Err(InputError::Duplicate { name: input.name.to_owned() });
            }
            let spec = self.input(input.name).ok_or_else(|| InputError::Unexpected {
                name: input.name.to_owned(),
                expected: self.inputs.iter().map(|s| s.name.clone()).collect(),
            })?;
            if spec.datatype != input.datatype {
                return Err(InputError::Datatype {
                    name: input.name.to_owned(),
                    expected: spec.datatype,
                    got: input.datatype,
                });
            }
            if !spec.accepts(input.shape) {
                return Err(InputError::Shape {
                    name: input.name.to_owned(),
                    expected: spec.shape.clone(),
                    got: input.shape.to_vec(),
                });
            }
            each(i)?;
        }
        self.check_batch(inputs, max_batch_size)
    }

    /// The batch rules, for inputs that fit the signature otherwise.
    fn check_batch(&self, inputs: &[InputShape<'_>], max_batch_size: usize) -> Result<(), InputError> {
        if !self.is_batched() {
            return Ok(());
        }
        // Every input fits a spec with a variable first dimension, so each
        // has one.
        let batch_of = |input: &InputShape<'_>| input.shape.first().copied().unwrap_or(0);
        let Some(first) = inputs.first() else { return Ok(()) };
        let batch = batch_of(first);
        if let Some(other) = inputs.iter().find(|t| batch_of(t) != batch) {
            return Err(InputError::BatchMismatch {
                name: other.name.to_owned(),
                batch: batch_of(other),
                first: first.name.to_owned(),
                first_batch: batch,
            });
        }
        if max_batch_size > 0 && u64::try_from(batch).is_ok_and(|b| b > max_batch_size as u64) {
            return Err(InputError::BatchTooLarge { name: first.name.to_owned(), batch, max: max_batch_size });
        }
        Ok(())
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

    fn shape<'a>(name: &'a str, shape: &'a [i64]) -> InputShape<'a> {
        InputShape { name, datatype: DataType::Fp32, shape }
    }

    #[test]
    fn request_shapes_are_checked_before_data_with_the_same_messages() {
        let sig = Signature { inputs: vec![spec("x", &[-1, 3])], outputs: vec![spec("y", &[-1, 1])] };
        assert_eq!(sig.check_request(&[shape("x", &[1 << 40, 3])], 0), Ok(()), "0 sets no batch limit");
        let e = sig.check_request(&[shape("x", &[2, 4])], 8).unwrap_err();
        assert_eq!(
            (e.kind(), e.to_string().as_str()),
            ("invalid_input", "input 'x': expected shape [-1, 3], got [2, 4]")
        );
        let tensor_error = sig.check_inputs(&[Tensor::from_f32("x", vec![2, 4], &[0.0; 8])]).unwrap_err();
        assert_eq!(tensor_error, e.to_string());
        let e = sig.check_request(&[shape("x", &[1, 3]), shape("x", &[1, 3])], 8).unwrap_err();
        assert_eq!(e.to_string(), "input 'x' given more than once");
        let e = sig.check_request(&[shape("x", &[1, 3]), shape("z", &[1])], 8).unwrap_err();
        assert_eq!(e.to_string(), "unexpected input 'z'; the model takes [\"x\"]");
    }

    #[test]
    fn batches_must_agree_and_fit_the_limit() {
        let two = Signature { inputs: vec![spec("a", &[-1, 3]), spec("b", &[-1])], outputs: vec![spec("y", &[-1])] };
        assert_eq!(two.check_request(&[shape("a", &[4, 3]), shape("b", &[4])], 4), Ok(()));
        let e = two.check_request(&[shape("a", &[2, 3]), shape("b", &[3])], 4).unwrap_err();
        assert_eq!(e.kind(), "batch_mismatch");
        assert!(e.to_string().starts_with("input 'b': batch size 3 differs from input 'a' (batch size 2)"), "{e}");
        let disagreeing = [Tensor::from_f32("a", vec![2, 3], &[0.0; 6]), Tensor::from_f32("b", vec![3], &[0.0; 3])];
        assert_eq!(two.check_inputs(&disagreeing).unwrap_err(), e.to_string());
        let e = two.check_request(&[shape("a", &[5, 3]), shape("b", &[5])], 4).unwrap_err();
        assert_eq!(e.kind(), "batch_too_large");
        assert_eq!(e.to_string(), "input 'a': batch size 5 exceeds the model's max_batch_size 4");
        // A fixed first dimension somewhere means the model does not batch:
        // no agreement, no limit.
        let fixed = Signature { inputs: two.inputs.clone(), outputs: vec![spec("y", &[1])] };
        assert_eq!(fixed.check_request(&[shape("a", &[5, 3]), shape("b", &[7])], 4), Ok(()));
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
