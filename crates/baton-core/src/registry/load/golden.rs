//! The golden set: a quality gate inside the validate stage. A version may
//! ship `golden/*.json` files, each a sample's inputs (the warmup sample
//! format) with the outputs the model must give for them. Every load runs
//! each one on the freshly loaded engine, before the version can get any
//! traffic, and refuses the version when an output is outside its
//! tolerance (`golden_mismatch`) or a file is unusable (`golden_invalid`).
//!
//! ```json
//! {
//!   "inputs":  [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [0.1, 0.2, 0.3, 0.4]}],
//!   "outputs": [{"name": "output", "datatype": "FP32", "shape": [1, 2], "data": [0.52, -1.3], "atol": 1e-4}],
//!   "rtol": 1e-3
//! }
//! ```
//!
//! A floating-point element passes when |got − expected| ≤ atol + rtol·|expected|
//! (defaults [`DEFAULT_ATOL`], [`DEFAULT_RTOL`]; `atol`, `rtol` and
//! `nan_equal` set at the top apply to every output, set on an output to
//! that one). An expected NaN (`null`) is matched by a NaN only with
//! `"nan_equal": true`; an infinity only by itself. `"top1": true` on an
//! output compares only which element of each row (the last dimension) is
//! largest. Integer, BOOL and BYTES outputs compare exactly.

use std::path::Path;

use serde::Deserialize;
use thiserror::Error;

use crate::registry::load::warmup::{SampleTensor, json_files};
use crate::run::backend::Model;
use crate::tensors::signature::Signature;
use crate::tensors::tensor::{DataType, Tensor, TensorData, f16_to_f32};
use crate::tensors::tensor_json::{NullFloats, tensor_from_json_with, tensor_to_json};

/// The absolute tolerance of a floating-point output the file leaves unset.
pub const DEFAULT_ATOL: f64 = 1e-5;
/// The relative tolerance of a floating-point output the file leaves unset.
pub const DEFAULT_RTOL: f64 = 1e-4;

/// Why the golden set refused a candidate.
#[derive(Debug, Error)]
pub enum GoldenError {
    /// A golden file cannot be used: bad JSON, or inputs or outputs that do
    /// not fit the model's signature.
    #[error("golden sample {file} is invalid: {reason}")]
    Invalid {
        /// The file, by its path in the version.
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// The model returned an error on a golden sample.
    #[error("golden sample {file}: the model failed on it: {message}")]
    Failed {
        /// The file.
        file: String,
        /// The engine's error.
        message: String,
    },
    /// An output is outside its tolerance.
    #[error("golden sample {file}: output '{output}' {detail}")]
    Mismatch {
        /// The file.
        file: String,
        /// The output.
        output: String,
        /// Where and by how much: the worst element, expected and got, the tolerance.
        detail: String,
    },
}

impl GoldenError {
    /// Stable kind string.
    pub fn kind(&self) -> &'static str {
        match self {
            GoldenError::Invalid { .. } => "golden_invalid",
            GoldenError::Failed { .. } => "golden_failed",
            GoldenError::Mismatch { .. } => "golden_mismatch",
        }
    }
}

/// One golden sample, parsed and checked against the signature.
#[derive(Clone, Debug)]
pub struct Golden {
    /// The file, by its path in the version (`golden/a.json`).
    pub name: String,
    /// Its inputs.
    pub inputs: Vec<Tensor>,
    /// The outputs the model must give, each with how it is compared.
    pub outputs: Vec<Expected>,
}

/// One expected output.
#[derive(Clone, Debug)]
pub struct Expected {
    /// The expected tensor.
    pub tensor: Tensor,
    /// How the model's output is compared with it.
    pub rule: Rule,
}

/// How an output is compared.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rule {
    /// Floating point: every element within `atol + rtol·|expected|`.
    Close {
        /// Absolute tolerance.
        atol: f64,
        /// Relative tolerance, times |expected|.
        rtol: f64,
        /// Whether a NaN got matches a NaN expected.
        nan_equal: bool,
    },
    /// Only the largest element of each row (the last dimension) must match.
    Top1,
    /// Every element equal: integers, BOOL, BYTES.
    Exact,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GoldenFile {
    inputs: Vec<SampleTensor>,
    outputs: Vec<ExpectedTensor>,
    atol: Option<f64>,
    rtol: Option<f64>,
    nan_equal: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpectedTensor {
    name: String,
    datatype: DataType,
    shape: Vec<i64>,
    data: serde_json::Value,
    atol: Option<f64>,
    rtol: Option<f64>,
    nan_equal: Option<bool>,
    #[serde(default)]
    top1: bool,
}

/// Runs every golden sample the version in `dir` ships on `model`;
/// returns how many ran. None shipped passes.
pub fn check(dir: &Path, model: &dyn Model) -> Result<usize, GoldenError> {
    let files = json_files(dir, "golden");
    for (file, text) in &files {
        let text = text.as_ref().map_err(|e| GoldenError::Invalid { file: file.clone(), reason: e.to_string() })?;
        let golden = parse(file.clone(), text, model.signature())?;
        run(model, &golden)?;
    }
    Ok(files.len())
}

/// Runs one golden sample on the model's first instance and compares.
pub fn run(model: &dyn Model, golden: &Golden) -> Result<(), GoldenError> {
    let outputs = model
        .infer_on(0, &golden.inputs)
        .map_err(|e| GoldenError::Failed { file: golden.name.clone(), message: e.message })?;
    for expected in &golden.outputs {
        let name = &expected.tensor.name;
        let mismatch =
            |detail: String| GoldenError::Mismatch { file: golden.name.clone(), output: name.clone(), detail };
        let got = outputs.iter().find(|o| &o.name == name).ok_or_else(|| mismatch("is missing".into()))?;
        compare(expected, got).map_err(mismatch)?;
    }
    Ok(())
}

/// Parses the text of a golden file named `file`, checking its inputs and
/// expected outputs against `signature`.
pub fn parse(file: String, text: &str, signature: &Signature) -> Result<Golden, GoldenError> {
    let invalid = |reason: String| GoldenError::Invalid { file: file.clone(), reason };
    let parsed: GoldenFile = serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?;
    let inputs =
        parsed.inputs.into_iter().map(SampleTensor::into_tensor).collect::<Result<Vec<_>, _>>().map_err(invalid)?;
    signature.check_inputs(&inputs).map_err(invalid)?;
    if parsed.outputs.is_empty() {
        return Err(invalid("it names no outputs to compare".into()));
    }
    let defaults = (parsed.atol, parsed.rtol, parsed.nan_equal);
    let mut outputs: Vec<Expected> = Vec::with_capacity(parsed.outputs.len());
    for out in parsed.outputs {
        if outputs.iter().any(|o| o.tensor.name == out.name) {
            return Err(invalid(format!("output '{}' is listed twice", out.name)));
        }
        outputs.push(expected(out, defaults, signature).map_err(invalid)?);
    }
    Ok(Golden { name: file, inputs, outputs })
}

/// One expected output, checked against the signature, with its rule.
fn expected(
    out: ExpectedTensor,
    (atol, rtol, nan_equal): (Option<f64>, Option<f64>, Option<bool>),
    signature: &Signature,
) -> Result<Expected, String> {
    let name = &out.name;
    let Some(spec) = signature.output(name) else {
        let known: Vec<&str> = signature.outputs.iter().map(|o| o.name.as_str()).collect();
        return Err(format!("output '{name}' is not an output of the model (it has {known:?})"));
    };
    if out.datatype != spec.datatype || !spec.accepts(&out.shape) {
        return Err(format!(
            "output '{name}' is {} {:?}, the model's is {} {:?}",
            out.datatype, out.shape, spec.datatype, spec.shape
        ));
    }
    let tolerance_set = out.atol.is_some() || out.rtol.is_some() || out.nan_equal.is_some();
    // `null` is NaN, as baton writes NaN in its answers.
    let tensor = tensor_from_json_with(name, out.datatype, out.shape, &out.data, NullFloats::AsNan)?;
    let rule = if out.top1 {
        if tolerance_set {
            return Err(format!("output '{name}' is compared by top1; atol, rtol and nan_equal do not apply"));
        }
        let values =
            numbers(&tensor).ok_or_else(|| format!("output '{name}' is {}: top1 needs numbers", out.datatype))?;
        if tensor.shape.last().is_none_or(|&width| width < 1) {
            return Err(format!(
                "output '{name}' has shape {:?}: top1 needs rows of at least one element",
                tensor.shape
            ));
        }
        if values.iter().any(|v| v.is_nan()) {
            return Err(format!("output '{name}' is compared by top1 and expects a NaN score"));
        }
        Rule::Top1
    } else if out.datatype.is_float() {
        let atol = out.atol.or(atol).unwrap_or(DEFAULT_ATOL);
        let rtol = out.rtol.or(rtol).unwrap_or(DEFAULT_RTOL);
        if !(atol.is_finite() && atol >= 0.0 && rtol.is_finite() && rtol >= 0.0) {
            return Err(format!("output '{name}': atol {atol} and rtol {rtol} must be finite and not negative"));
        }
        Rule::Close { atol, rtol, nan_equal: out.nan_equal.or(nan_equal).unwrap_or(false) }
    } else if tolerance_set {
        return Err(format!(
            "output '{name}' is {}, compared exactly; atol, rtol and nan_equal do not apply",
            out.datatype
        ));
    } else {
        Rule::Exact
    };
    Ok(Expected { tensor, rule })
}

/// Compares an output with what is expected; the error says where the
/// worst element is, what was expected and got, and the tolerance.
pub fn compare(expected: &Expected, got: &Tensor) -> Result<(), String> {
    let want = &expected.tensor;
    if got.datatype != want.datatype || got.shape != want.shape {
        return Err(format!("is {} {:?}, expected {} {:?}", got.datatype, got.shape, want.datatype, want.shape));
    }
    got.check_consistent()?;
    match expected.rule {
        Rule::Close { atol, rtol, nan_equal } => close(want, got, atol, rtol, nan_equal),
        Rule::Top1 => top1(want, got),
        Rule::Exact => exact(want, got),
    }
}

fn close(want: &Tensor, got: &Tensor, atol: f64, rtol: f64, nan_equal: bool) -> Result<(), String> {
    let (Some(e), Some(g)) = (numbers(want), numbers(got)) else {
        return Err(format!("is {}, which has no numeric elements", got.datatype));
    };
    let mut worst: Option<(usize, f64)> = None;
    let mut outside = 0usize;
    for (i, (&e, &g)) in e.iter().zip(&g).enumerate() {
        let excess = if e.is_nan() || g.is_nan() {
            if nan_equal && e.is_nan() && g.is_nan() {
                continue;
            }
            f64::INFINITY
        } else if e == g {
            continue;
        } else if e.is_infinite() || g.is_infinite() {
            f64::INFINITY
        } else {
            (g - e).abs() - (atol + rtol * e.abs())
        };
        if excess > 0.0 {
            outside += 1;
            if worst.is_none_or(|(_, w)| excess > w) {
                worst = Some((i, excess));
            }
        }
    }
    let Some((i, _)) = worst else {
        return Ok(());
    };
    let nan = if e[i].is_nan() && g[i].is_nan() { "; a NaN matches a NaN only with nan_equal" } else { "" };
    Err(format!(
        "element {i} {} is {}, expected {}: outside atol {atol} + rtol {rtol}·|expected| ({outside} of {} elements \
         outside{nan})",
        at(&want.shape, i),
        show(g[i], got.datatype),
        show(e[i], want.datatype),
        e.len(),
    ))
}

fn top1(want: &Tensor, got: &Tensor) -> Result<(), String> {
    let (Some(e), Some(g)) = (numbers(want), numbers(got)) else {
        return Err(format!("is {}, which has no numeric elements", got.datatype));
    };
    let width = want.shape.last().map_or(1, |&w| w.max(1) as usize);
    let mut first: Option<(usize, usize, usize)> = None;
    let mut differ = 0usize;
    for (row, (e, g)) in e.chunks_exact(width).zip(g.chunks_exact(width)).enumerate() {
        let best = e.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let top = argmax(g);
        // A tie among the expected scores accepts any of the tied classes.
        if g.iter().any(|v| v.is_nan()) || e[top] != best {
            differ += 1;
            first.get_or_insert((row, top, argmax(e)));
        }
    }
    let Some((row, top, want_top)) = first else {
        return Ok(());
    };
    Err(format!(
        "row {row} has class {top} on top (element {} {}, score {}), expected class {want_top} (score {}) \
         (top1: {differ} of {} rows differ)",
        row * width + top,
        at(&want.shape, row * width + top),
        show(g[row * width + top], got.datatype),
        show(e[row * width + want_top], want.datatype),
        e.len() / width,
    ))
}

fn exact(want: &Tensor, got: &Tensor) -> Result<(), String> {
    let differ: Vec<usize> = match (&want.data, &got.data) {
        (TensorData::Raw(e), TensorData::Raw(g)) => {
            let size = want.datatype.size().unwrap_or(1);
            e.chunks_exact(size)
                .zip(g.chunks_exact(size))
                .enumerate()
                .filter(|(_, (e, g))| e != g)
                .map(|(i, _)| i)
                .collect()
        }
        (TensorData::Bytes(e), TensorData::Bytes(g)) => {
            e.iter().zip(g).enumerate().filter(|(_, (e, g))| e != g).map(|(i, _)| i).collect()
        }
        _ => return Err(format!("holds data that does not match its datatype {}", got.datatype)),
    };
    let Some(&i) = differ.first() else {
        return Ok(());
    };
    let value = |t: &Tensor| tensor_to_json(t).get(i).map_or_else(String::new, ToString::to_string);
    Err(format!(
        "element {i} {} is {}, expected {} (compared exactly; {} of {} elements differ)",
        at(&want.shape, i),
        value(got),
        value(want),
        differ.len(),
        match &want.data {
            TensorData::Raw(bytes) => bytes.len() / want.datatype.size().unwrap_or(1),
            TensorData::Bytes(items) => items.len(),
        }
    ))
}

/// The index of the first largest element, NaN aside.
fn argmax(row: &[f64]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if row[best].is_nan() || v > row[best] {
            best = i;
        }
    }
    best
}

/// The elements of a numeric tensor as `f64`; `None` for BOOL and BYTES.
fn numbers(t: &Tensor) -> Option<Vec<f64>> {
    let TensorData::Raw(bytes) = &t.data else {
        return None;
    };
    let size = t.datatype.size()?;
    let decode: fn(&[u8]) -> f64 = match t.datatype {
        DataType::Fp16 => |b| f64::from(f16_to_f32(u16::from_le_bytes([b[0], b[1]]))),
        DataType::Fp32 => |b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DataType::Fp64 => |b| f64::from_le_bytes(b.try_into().unwrap_or_default()),
        DataType::Uint8 => |b| f64::from(b[0]),
        DataType::Int8 => |b| f64::from(b[0] as i8),
        DataType::Uint16 => |b| f64::from(u16::from_le_bytes([b[0], b[1]])),
        DataType::Int16 => |b| f64::from(i16::from_le_bytes([b[0], b[1]])),
        DataType::Uint32 => |b| f64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DataType::Int32 => |b| f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DataType::Uint64 => |b| u64::from_le_bytes(b.try_into().unwrap_or_default()) as f64,
        DataType::Int64 => |b| i64::from_le_bytes(b.try_into().unwrap_or_default()) as f64,
        DataType::Bool | DataType::Bytes => return None,
    };
    Some(bytes.chunks_exact(size).map(decode).collect())
}

/// A value as its datatype prints it: an FP32 element without the digits
/// widening to `f64` adds.
fn show(value: f64, datatype: DataType) -> String {
    match datatype {
        DataType::Fp16 | DataType::Fp32 => (value as f32).to_string(),
        _ => value.to_string(),
    }
}

/// Where flat element `index` is in a tensor of `shape`: `at [1, 2]`.
fn at(shape: &[i64], mut index: usize) -> String {
    let mut position = vec![0usize; shape.len()];
    for (p, &d) in position.iter_mut().zip(shape).rev() {
        let d = d.max(1) as usize;
        *p = index % d;
        index /= d;
    }
    format!("at {position:?}")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::tensors::signature::TensorSpec;

    fn signature() -> Signature {
        let spec =
            |name: &str, datatype, shape: &[i64]| TensorSpec { name: name.into(), datatype, shape: shape.to_vec() };
        Signature {
            inputs: vec![spec("x", DataType::Fp32, &[-1, 2])],
            outputs: vec![
                spec("scores", DataType::Fp32, &[-1, 3]),
                spec("ids", DataType::Int64, &[-1]),
                spec("flags", DataType::Bool, &[-1]),
                spec("labels", DataType::Bytes, &[-1]),
            ],
        }
    }

    /// A golden file with one input row and the given outputs and top-level keys.
    fn file(outputs: serde_json::Value, top: serde_json::Value) -> String {
        let mut body = json!({
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 1.0]}],
            "outputs": outputs,
        });
        body.as_object_mut().unwrap().extend(top.as_object().unwrap().clone());
        body.to_string()
    }

    fn scores(data: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
        let mut out = json!({"name": "scores", "datatype": "FP32", "shape": [2, 3], "data": data});
        out.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        json!([out])
    }

    fn parsed(text: &str) -> Result<Golden, GoldenError> {
        parse("golden/a.json".into(), text, &signature())
    }

    /// Compares the file's first expected output with `got`.
    fn verdict(text: &str, got: Tensor) -> Result<(), String> {
        compare(&parsed(text).unwrap().outputs[0], &got)
    }

    fn fp32(name: &str, shape: &[i64], values: &[f32]) -> Tensor {
        Tensor::from_f32(name, shape.to_vec(), values)
    }

    #[test]
    fn floats_pass_within_atol_plus_rtol_times_expected() {
        let text = file(scores(json!([[1, 100, 0], [0, 0, -2]]), json!({})), json!({}));
        assert_eq!(
            parsed(&text).unwrap().outputs[0].rule,
            Rule::Close { atol: DEFAULT_ATOL, rtol: DEFAULT_RTOL, nan_equal: false }
        );
        // 100 · 1e-4 + 1e-5 = 0.01001 of room at element 1.
        assert_eq!(verdict(&text, fp32("scores", &[2, 3], &[1.0, 100.009, 0.0, 0.0, 0.0, -2.0])), Ok(()));
        let e = verdict(&text, fp32("scores", &[2, 3], &[1.0, 100.02, 0.0, 0.0, 0.00002, -2.0])).unwrap_err();
        assert!(e.starts_with("element 1 at [0, 1] is 100.02, expected 100: outside atol 0.00001"), "{e}");
        assert!(e.contains("(2 of 6 elements outside"), "{e}");
        // The worst element is named, not the first.
        let e = verdict(&text, fp32("scores", &[2, 3], &[1.0, 100.02, 0.0, 0.0, 0.0, -3.0])).unwrap_err();
        assert!(e.starts_with("element 5 at [1, 2] is -3, expected -2"), "{e}");
    }

    #[test]
    fn tolerances_are_set_per_file_and_overridden_per_output() {
        let got = fp32("scores", &[2, 3], &[1.5, 0.0, 0.0, 0.0, 0.0, 0.0]);
        let data = json!([1, 0, 0, 0, 0, 0]);
        assert!(verdict(&file(scores(data.clone(), json!({})), json!({})), got.clone()).is_err());
        assert!(verdict(&file(scores(data.clone(), json!({})), json!({"atol": 0.5})), got.clone()).is_ok());
        assert!(verdict(&file(scores(data.clone(), json!({})), json!({"rtol": 0.5})), got.clone()).is_ok());
        let overridden = file(scores(data.clone(), json!({"atol": 0.1})), json!({"atol": 0.5}));
        let e = verdict(&overridden, got.clone()).unwrap_err();
        assert!(e.contains("outside atol 0.1 + rtol 0.0001·|expected|"), "{e}");
        let negative = file(scores(data, json!({"rtol": -1})), json!({}));
        assert_eq!(parsed(&negative).unwrap_err().kind(), "golden_invalid");
    }

    #[test]
    fn nan_matches_nan_only_when_the_file_says_so() {
        // An expected NaN is written `null`.
        let mut golden = parsed(&file(scores(json!([null, 0, 0, 0, 0, 0]), json!({})), json!({}))).unwrap();
        let equal = parsed(&file(scores(json!([null, 0, 0, 0, 0, 0]), json!({"nan_equal": true})), json!({})));
        assert_eq!(
            equal.unwrap().outputs[0].rule,
            Rule::Close { atol: DEFAULT_ATOL, rtol: DEFAULT_RTOL, nan_equal: true }
        );
        let nan_got = fp32("scores", &[2, 3], &[f32::NAN, 0.0, 0.0, 0.0, 0.0, 0.0]);
        let e = compare(&golden.outputs[0], &nan_got).unwrap_err();
        assert!(e.contains("element 0 at [0, 0] is NaN, expected NaN") && e.contains("only with nan_equal"), "{e}");
        golden.outputs[0].rule = Rule::Close { atol: 0.0, rtol: 0.0, nan_equal: true };
        assert_eq!(compare(&golden.outputs[0], &nan_got), Ok(()));
        let finite = fp32("scores", &[2, 3], &[1.0; 6]);
        assert!(compare(&golden.outputs[0], &finite).unwrap_err().starts_with("element 0 "));
        // A NaN got where a number is expected fails, with any tolerance.
        let text = file(scores(json!([0, 0, 0, 0, 0, 0]), json!({"atol": 1e30, "nan_equal": true})), json!({}));
        let e = verdict(&text, fp32("scores", &[2, 3], &[0.0, 0.0, 0.0, 0.0, f32::NAN, 0.0])).unwrap_err();
        assert!(e.starts_with("element 4 at [1, 1] is NaN, expected 0"), "{e}");
        // An infinity matches itself only.
        golden.outputs[0].tensor = fp32("scores", &[2, 3], &[f32::INFINITY, 0.0, 0.0, 0.0, 0.0, 0.0]);
        let inf = fp32("scores", &[2, 3], &[f32::INFINITY, 0.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(compare(&golden.outputs[0], &inf), Ok(()));
        golden.outputs[0].rule = Rule::Close { atol: 1e30, rtol: 1.0, nan_equal: true };
        assert!(compare(&golden.outputs[0], &finite).is_err());
    }

    #[test]
    fn top1_compares_only_the_best_class_of_each_row() {
        let text = file(scores(json!([[0.1, 0.7, 0.2], [0.5, 0.5, 0.0]]), json!({"top1": true})), json!({}));
        assert_eq!(parsed(&text).unwrap().outputs[0].rule, Rule::Top1);
        // Far from the scores, same winners; a tie expected accepts either.
        assert_eq!(verdict(&text, fp32("scores", &[2, 3], &[-5.0, 9.0, 1.0, 0.0, 3.0, -1.0])), Ok(()));
        assert_eq!(verdict(&text, fp32("scores", &[2, 3], &[-5.0, 9.0, 1.0, 3.0, 0.0, -1.0])), Ok(()));
        let e = verdict(&text, fp32("scores", &[2, 3], &[0.1, 0.7, 0.2, 0.0, 0.1, 0.9])).unwrap_err();
        assert!(e.starts_with("row 1 has class 2 on top (element 5 at [1, 2], score 0.9), expected class 0"), "{e}");
        assert!(e.contains("1 of 2 rows differ"), "{e}");
        assert!(verdict(&text, fp32("scores", &[2, 3], &[0.1, f32::NAN, 0.2, 0.5, 0.0, 0.0])).is_err());
        let with_tolerance = file(scores(json!([0, 1, 0, 0, 1, 0]), json!({"top1": true, "atol": 1})), json!({}));
        assert_eq!(parsed(&with_tolerance).unwrap_err().kind(), "golden_invalid");
    }

    #[test]
    fn integers_bool_and_bytes_compare_exactly() {
        let outputs = json!([
            {"name": "ids", "datatype": "INT64", "shape": [3], "data": [7, -1, 9007199254740993_i64]},
            {"name": "flags", "datatype": "BOOL", "shape": [2], "data": [true, false]},
            {"name": "labels", "datatype": "BYTES", "shape": [2], "data": ["cat", "dog"]},
        ]);
        let golden = parsed(&file(outputs, json!({"atol": 10}))).unwrap();
        assert!(golden.outputs.iter().all(|o| o.rule == Rule::Exact), "a file's tolerance leaves exact outputs exact");
        let ids = |values: &[i64]| Tensor {
            name: "ids".into(),
            datatype: DataType::Int64,
            shape: vec![3],
            data: TensorData::Raw(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
        };
        assert_eq!(compare(&golden.outputs[0], &ids(&[7, -1, 9007199254740993])), Ok(()));
        let e = compare(&golden.outputs[0], &ids(&[7, -1, 9007199254740992])).unwrap_err();
        assert!(e.starts_with("element 2 at [2] is 9007199254740992, expected 9007199254740993"), "{e}");
        let flags = Tensor {
            name: "flags".into(),
            datatype: DataType::Bool,
            shape: vec![2],
            data: TensorData::Raw(vec![1, 1]),
        };
        assert!(
            compare(&golden.outputs[1], &flags).unwrap_err().starts_with("element 1 at [1] is true, expected false")
        );
        let labels = |l: [&str; 2]| Tensor {
            name: "labels".into(),
            datatype: DataType::Bytes,
            shape: vec![2],
            data: TensorData::Bytes(l.iter().map(|s| s.as_bytes().to_vec()).collect()),
        };
        assert_eq!(compare(&golden.outputs[2], &labels(["cat", "dog"])), Ok(()));
        let e = compare(&golden.outputs[2], &labels(["cat", "cow"])).unwrap_err();
        assert!(e.starts_with("element 1 at [1] is \"cow\", expected \"dog\""), "{e}");
        let per_output = json!([{"name": "ids", "datatype": "INT64", "shape": [1], "data": [1], "atol": 1}]);
        assert_eq!(parsed(&file(per_output, json!({}))).unwrap_err().kind(), "golden_invalid");
    }

    #[test]
    fn a_different_shape_is_a_mismatch() {
        let text = file(scores(json!([0, 0, 0, 0, 0, 0]), json!({})), json!({}));
        let e = verdict(&text, fp32("scores", &[3, 2], &[0.0; 6])).unwrap_err();
        assert_eq!(e, "is FP32 [3, 2], expected FP32 [2, 3]");
    }

    #[test]
    fn unusable_files_are_invalid_and_say_why() {
        let invalid = |text: &str| match parsed(text) {
            Err(e @ GoldenError::Invalid { .. }) => e.to_string(),
            other => panic!("{other:?}"),
        };
        assert!(invalid("{").starts_with("golden sample golden/a.json is invalid: "));
        let unknown = json!([{"name": "score", "datatype": "FP32", "shape": [1, 3], "data": [0, 0, 0]}]);
        assert!(invalid(&file(unknown, json!({}))).contains("output 'score' is not an output of the model"));
        let wide = json!([{"name": "scores", "datatype": "FP32", "shape": [1, 4], "data": [0, 0, 0, 0]}]);
        assert!(
            invalid(&file(wide, json!({}))).contains("output 'scores' is FP32 [1, 4], the model's is FP32 [-1, 3]")
        );
        let typed = json!([{"name": "scores", "datatype": "FP64", "shape": [1, 3], "data": [0, 0, 0]}]);
        assert!(invalid(&file(typed, json!({}))).contains("is FP64 [1, 3], the model's is FP32"));
        let short = json!([{"name": "scores", "datatype": "FP32", "shape": [1, 3], "data": [0, 0]}]);
        assert!(invalid(&file(short, json!({}))).contains("needs 3 elements, got 2"));
        assert!(invalid(&file(json!([]), json!({}))).contains("names no outputs"));
        assert!(invalid(&file(scores(json!([0, 0, 0, 0, 0, 0]), json!({})), json!({"tol": 1}))).contains("tol"));
        let twice = json!([
            {"name": "ids", "datatype": "INT64", "shape": [1], "data": [1]},
            {"name": "ids", "datatype": "INT64", "shape": [1], "data": [1]},
        ]);
        assert!(invalid(&file(twice, json!({}))).contains("listed twice"));
        let bad_input = r#"{"inputs":[{"name":"y","datatype":"FP32","shape":[1,2],"data":[0,0]}],
            "outputs":[{"name":"ids","datatype":"INT64","shape":[1],"data":[1]}]}"#;
        assert!(
            invalid(bad_input).ends_with("is invalid: missing input 'x': the model takes 'x'; the request sent 'y'"),
            "{}",
            invalid(bad_input)
        );
    }
}
