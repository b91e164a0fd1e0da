//! The validate stage (R8): the model's declared inputs and outputs against
//! `model.toml`, and every weight tensor read from the model file against the
//! model's validation policy.

use thiserror::Error;

use crate::backend::{Model, Weight, WeightsError};
use crate::spec::{ModelSpec, ValidationPolicy};
use crate::tensor::{DataType, f16_to_f32};

/// Why validation refused a candidate.
#[derive(Debug, Error)]
pub enum ValidateError {
    /// The model's inputs or outputs contradict `model.toml`.
    #[error("signature contradicts model.toml: {}", .0.join("; "))]
    Signature(Vec<String>),
    /// A weight tensor failed a check.
    #[error("tensor '{tensor}': {problem}")]
    Tensor {
        /// Stable kind of the check that failed.
        kind: &'static str,
        /// The tensor's name.
        tensor: String,
        /// What is wrong.
        problem: String,
    },
    /// A tensor declared in `model.toml` is not in the model.
    #[error("tensor '{0}' is declared in model.toml but not in the model")]
    MissingTensor(String),
    /// The weights could not be read.
    #[error("{0}")]
    Read(String),
}

impl ValidateError {
    /// Stable kind string.
    pub fn kind(&self) -> &'static str {
        match self {
            ValidateError::Signature(_) => "signature_mismatch",
            ValidateError::Tensor { kind, .. } => kind,
            ValidateError::MissingTensor(_) => "missing_tensor",
            ValidateError::Read(_) => "unreadable_weights",
        }
    }
}

/// What validation looked at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checked {
    /// Weight tensors checked.
    pub tensors: usize,
    /// Elements checked.
    pub elements: u64,
}

/// Runs every configured check; stops at the first failure.
pub fn validate(model: &dyn Model, spec: &ModelSpec) -> Result<Checked, ValidateError> {
    let contradictions = model.signature().contradictions(&spec.declared_signature());
    if !contradictions.is_empty() {
        return Err(ValidateError::Signature(contradictions));
    }
    let policy = &spec.validation;
    let mut checked = Checked::default();
    let mut seen = Vec::new();
    let mut failure: Option<ValidateError> = None;
    let outcome = model.visit_weights(&mut |w: &Weight<'_>| {
        checked.tensors += 1;
        seen.push(w.name.to_owned());
        match check_tensor(w, spec) {
            Ok(elements) => {
                checked.elements += elements;
                Ok(())
            }
            Err(e) => {
                let message = e.to_string();
                failure = Some(e);
                Err(message)
            }
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    match outcome {
        Ok(()) => {}
        Err(WeightsError::Read(m) | WeightsError::Refused(m)) => {
            return Err(ValidateError::Read(m));
        }
    }
    if let Some(missing) = policy.tensors.iter().find(|d| !seen.contains(&d.name)) {
        return Err(ValidateError::MissingTensor(missing.name.clone()));
    }
    Ok(checked)
}

fn refuse(kind: &'static str, tensor: &str, problem: String) -> ValidateError {
    ValidateError::Tensor { kind, tensor: tensor.to_owned(), problem }
}

/// Checks one tensor; returns how many elements it has.
fn check_tensor(w: &Weight<'_>, spec: &ModelSpec) -> Result<u64, ValidateError> {
    let policy = &spec.validation;
    if let Some(declared) = policy.tensors.iter().find(|d| d.name == w.name)
        && (w.datatype != Some(declared.datatype) || !declared.accepts(w.shape))
    {
        let got = w.datatype.map_or("an unsupported type", DataType::as_str);
        return Err(refuse(
            "declared_mismatch",
            w.name,
            format!(
                "model.toml declares {} {:?}, the model has {} {:?}",
                declared.datatype, declared.shape, got, w.shape
            ),
        ));
    }
    let Some(datatype) = w.datatype else {
        return Ok(0);
    };
    let Some(size) = datatype.size() else {
        return Ok(0);
    };
    let count = w.data.len() / size;
    let rank_two = w.shape.len() >= 2;
    let zero_matters = policy.zero_tensors && rank_two && count > 0;
    // Most weights are FP32 and pass: one branch-free pass decides that,
    // and only a tensor it flags goes through `scan`, which names the element.
    if datatype == DataType::Fp32 && fp32_passes(w.data, policy, zero_matters) {
        return Ok(count as u64);
    }
    scan(w, datatype, size, policy, zero_matters)?;
    Ok(count as u64)
}

/// Checks every element of `w` in order and names the first that fails.
fn scan(
    w: &Weight<'_>,
    datatype: DataType,
    size: usize,
    policy: &ValidationPolicy,
    zero_matters: bool,
) -> Result<(), ValidateError> {
    let mut all_zero = true;
    for (index, chunk) in w.data.chunks_exact(size).enumerate() {
        let value = decode(datatype, chunk);
        if value != 0.0 {
            all_zero = false;
        }
        if value.is_nan() {
            if policy.nan {
                return Err(refuse("nan", w.name, format!("element {index} is NaN")));
            }
            continue;
        }
        if value.is_infinite() {
            if policy.inf {
                return Err(refuse("inf", w.name, format!("element {index} is {value}")));
            }
            continue;
        }
        if policy.magnitude && value.abs() > policy.max_abs {
            return Err(refuse(
                "magnitude",
                w.name,
                format!("element {index} is {value}, beyond the bound ±{}", policy.max_abs),
            ));
        }
    }
    if zero_matters && all_zero {
        let count = w.data.len() / size;
        return Err(refuse(
            "all_zero",
            w.name,
            format!("all {count} elements of this rank-{} tensor are zero", w.shape.len()),
        ));
    }
    Ok(())
}

/// Whether every FP32 element of `data` passes `policy`, and, when
/// `zero_matters`, not all of them are zero. Never passes a tensor the
/// element loop would refuse: the bound is compared in f64, as there.
fn fp32_passes(data: &[u8], policy: &ValidationPolicy, zero_matters: bool) -> bool {
    let (mut nan, mut inf, mut over, mut nonzero) = (false, false, false, false);
    for chunk in data.chunks_exact(4) {
        let v = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        nan |= v.is_nan();
        inf |= v.is_infinite();
        over |= v.is_finite() && f64::from(v.abs()) > policy.max_abs;
        nonzero |= v != 0.0;
    }
    // As in the loop, the bound applies to finite elements only: NaN and
    // infinity have checks of their own.
    !(policy.nan && nan || policy.inf && inf || policy.magnitude && over || zero_matters && !nonzero)
}

fn decode(datatype: DataType, b: &[u8]) -> f64 {
    match datatype {
        DataType::Fp32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DataType::Fp64 => f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
        DataType::Fp16 => f64::from(f16_to_f32(u16::from_le_bytes([b[0], b[1]]))),
        DataType::Bool | DataType::Uint8 => f64::from(b[0]),
        DataType::Int8 => f64::from(b[0] as i8),
        DataType::Uint16 => f64::from(u16::from_le_bytes([b[0], b[1]])),
        DataType::Int16 => f64::from(i16::from_le_bytes([b[0], b[1]])),
        DataType::Uint32 => f64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DataType::Int32 => f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DataType::Uint64 => u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f64,
        DataType::Int64 => i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f64,
        DataType::Bytes => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signature::TensorSpec;

    fn weight<'a>(name: &'a str, shape: &'a [i64], bytes: &'a [u8]) -> Weight<'a> {
        Weight { name, datatype: Some(DataType::Fp32), shape, data: bytes }
    }

    fn bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn kind(values: &[f32], shape: &[i64], spec: &ModelSpec) -> Option<&'static str> {
        let data = bytes(values);
        check_tensor(&weight("w", shape, &data), spec).err().map(|e| e.kind())
    }

    #[test]
    fn each_check_fires_and_can_be_turned_off() {
        let on = ModelSpec::parse("").unwrap();
        assert_eq!(kind(&[1.0, f32::NAN], &[2], &on), Some("nan"));
        assert_eq!(kind(&[f32::INFINITY, 1.0], &[2], &on), Some("inf"));
        assert_eq!(kind(&[1.0, -2e6], &[2], &on), Some("magnitude"));
        assert_eq!(kind(&[0.0; 4], &[2, 2], &on), Some("all_zero"));
        assert_eq!(kind(&[0.0; 4], &[4], &on), None, "a zero bias vector is legitimate");
        assert_eq!(kind(&[0.5, -0.5], &[1, 2], &on), None);
        let off = ModelSpec::parse("[validation]\nnan = false\ninf = false\nmagnitude = false\nzero_tensors = false")
            .unwrap();
        assert_eq!(kind(&[f32::NAN, f32::INFINITY, 2e6], &[3], &off), None);
        assert_eq!(kind(&[0.0; 4], &[2, 2], &off), None);
        let tight = ModelSpec::parse("[validation]\nmax_abs = 0.25").unwrap();
        assert_eq!(kind(&[0.5], &[1], &tight), Some("magnitude"));
    }

    #[test]
    fn the_fp32_pass_agrees_with_the_element_loop() {
        let specials = [0.0, -0.0, 1.0, -3.5, 2e6, -2e6, 0.25, f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
        // Every pair of special values, in both orders, under every
        // combination of checks and two bounds.
        for bits in 0..32u32 {
            let on = |i: u32| bits & (1 << i) != 0;
            let max_abs = if on(4) { 0.5 } else { 1e6 };
            let toml = format!(
                "[validation]\nnan = {}\ninf = {}\nmagnitude = {}\nzero_tensors = {}\nmax_abs = {max_abs}",
                on(0),
                on(1),
                on(2),
                on(3)
            );
            let spec = ModelSpec::parse(&toml).unwrap();
            for a in specials {
                for b in specials {
                    let data = bytes(&[a, b, 0.0]);
                    let w = weight("w", &[1, 3], &data);
                    let zero_matters = spec.validation.zero_tensors;
                    assert_eq!(
                        fp32_passes(&data, &spec.validation, zero_matters),
                        scan(&w, DataType::Fp32, 4, &spec.validation, zero_matters).is_ok(),
                        "values [{a}, {b}, 0] under {toml:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn declared_tensors_must_match() {
        let mut spec = ModelSpec::parse("").unwrap();
        spec.validation.tensors.push(TensorSpec { name: "w".into(), datatype: DataType::Fp32, shape: vec![2, 2] });
        assert_eq!(kind(&[1.0; 4], &[2, 2], &spec), None);
        assert_eq!(kind(&[1.0; 6], &[2, 3], &spec), Some("declared_mismatch"));
    }
}
